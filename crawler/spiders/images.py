"""The `lait-images` spider: the images a work directory references and does not hold yet.

`lait download` (rows of a URL list, in `url_list/`) and `lait ingest-warc` (the references of
archived pages, in `warc_links/`) name images without fetching them; this spider fetches them
with the crawl's fetcher, unchanged: the same downloader middlewares (host down, address
guard, robots.txt of every host, TDMRep), the same host shares, limits and DNS cache, and the
same image callback and error handling as the `lait` spider, whose methods it inherits. What
it writes is what a crawl writes for images:

- ``images/``: one row per image URL, with the page that referenced it (``page_url``: the
  list's page column, or the archived page) and its status (``error`` in the vocabulary of
  `lait.reasons`: ``http_404``, ``not_image``, ``noai``, ``download/<Error>``, ...);
- ``rejected/``: requests never sent (``crawl/robots``, ``crawl/host_down``,
  ``crawl/refused_<kind>``, ...).

Resume: an image with a row in ``images/`` or a ``crawl/`` reject is done; a rerun fetches
the others. The tables are read one partition at a time (every table here is partitioned by
image URL), so the set of done URLs held at once is one partition's.

Progress: every `PROGRESS_SECONDS` one line says how many of the pending images are done.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import scrapy
from scrapy import signals

from lait.crawler.config import ImageFetchConfig, host_share, scrapy_settings
from lait.crawler.pipelines import new_run_id
from lait.crawler.spiders.lait import LaitSpider
from lait.crawler.units import pending_images

log = logging.getLogger(__name__)

PROGRESS_SECONDS = 10.0


class ImageSpider(LaitSpider):
    """Fetches the images of `url_list/` or `warc_links/` that `images/` does not hold.

    It is a `LaitSpider` without pages: no seeds, no frontier; `parse_image`, `on_error` and
    the closing of the crawl are the `lait` spider's own."""

    name = "lait-images"
    # A callback yields one item: Scrapy's default of 100 starts 100 asyncio tasks per response.
    custom_settings = {"CONCURRENT_ITEMS": 4}

    def __init__(self, config: ImageFetchConfig, stats_json: str | None = None, **kwargs):
        scrapy.Spider.__init__(self, **kwargs)  # not LaitSpider's: no seeds, no frontier
        self.cfg = config
        self.stats_json = stats_json
        self.run_id = new_run_id()
        self.seeds: list[str] = []
        self.allowed_domains: list[str] = []
        self.pages_seen = 0
        self.done_pages: set[str] = set()
        self.done_images: set[str] = set()
        self.frontier = None
        self.low_water = 0
        self._idle_since: float | None = None
        self.idle_seconds = 0.0
        self.interrupted = False
        self.pending = 0  # images to fetch in this run
        self._last_progress = 0.0

    @classmethod
    def from_crawler(cls, crawler, *args, config: ImageFetchConfig | dict | None = None,
                     stats_json: str | None = None, **kwargs):
        data = config.to_dict() if isinstance(config, ImageFetchConfig) else dict(config or {})
        data.update(kwargs)
        cfg = ImageFetchConfig.from_dict(data, where="spider arguments")
        cfg.validate()
        crawler.settings.setdict(scrapy_settings(cfg), priority="spider")
        spider = cls(cfg, stats_json=stats_json)
        spider._set_crawler(crawler)
        crawler.signals.connect(spider._on_idle, signal=signals.spider_idle)
        crawler.signals.connect(spider._on_item, signal=signals.item_scraped)
        return spider

    async def start(self):
        from lait.workdir import WorkDir

        work = WorkDir(self.cfg.out)
        self.pending = sum(1 for _ in self._pending(work))
        self.crawler.stats.set_value("crawl/images_pending", self.pending)
        log.info("%d images to fetch (referenced in %s, not in images/ yet)", self.pending,
                 " and ".join(f"{t}/" for t in self.cfg.tables))
        self._last_progress = time.monotonic()
        for url, page_url in self._pending(work):
            yield self._image_request(url, page_url, depth=0, dont_filter=True)

    def _pending(self, work) -> Iterator[tuple[str, str | None]]:
        """(image URL, referring page) of every image referenced and not done, with a `share`
        of the hosts only theirs."""
        for url, page_url in pending_images(work, self.cfg.tables):
            if self.cfg.owns(url):
                yield url, page_url

    def stored_text(self) -> str:
        stats = self.crawler.stats
        done = stats.get_value("crawl/rows_images", 0) + stats.get_value("crawl/rows_rejected", 0)
        return f"{done} of {self.pending} images"

    def top_up(self) -> list[scrapy.Request]:
        return []  # no pages, no frontier: the start requests are all there is

    def _on_item(self, item, response=None, spider=None) -> None:
        now = time.monotonic()
        if now - self._last_progress < PROGRESS_SECONDS:
            return
        self._last_progress = now
        stats = self.crawler.stats
        done = stats.get_value("crawl/rows_images", 0) + stats.get_value("crawl/rows_rejected", 0)
        elapsed = max(1e-9, (time.time() - stats.get_value("start_time").timestamp()))
        log.info("%s done (%.0f/s)", self.stored_text(), done / elapsed)
