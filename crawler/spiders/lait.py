"""The `lait` spider: follows links from seeds, records every page and every image it shows.

    scrapy crawl lait -a seeds=seeds.txt -a out=work/      # from the repository root
    lait crawl --seeds seeds.txt --out work/                # the same, from anywhere

What it writes (through `lait.crawler.pipelines.PartsPipeline`):

- ``pages/``: one row per fetched page, any status. ``error`` is None exactly when ``html``
  holds the page; otherwise it says why not, in the vocabulary of `lait.reasons` that
  ``ingest-warc`` writes too: ``http_404`` (any non-2xx), ``noai`` (an ``X-Robots-Tag`` or
  ``<meta name="robots">`` with ``noai``/``noimageai``: links are still followed, images not
  requested), ``tdm_reserved`` (a ``tdm-reservation: 1`` header or meta tag, handled as
  ``noai``), ``not_html``, ``download/<Error>`` (status 0: no response).
  ``license`` is the licence the page declares (`lait.pagereader.page_license`).
- ``images/``: one row per image URL, requested once however many pages show it; ``page_url``
  is the first page it was found on. ``bytes`` is None unless it is stored; ``error`` is
  ``http_N``, ``noai``, ``tdm_reserved``, ``not_image`` (content type), ``empty`` or
  ``download/<Error>``.
- ``rejected/``: requests that were never sent: ``crawl/robots`` and
  ``crawl/robots_unreachable`` (robots.txt, `lait.crawler.robots`), ``crawl/tdm_reserved``
  (the origin's tdmrep.json, `lait.crawler.tdmrep`), ``crawl/host_down`` (`lait.crawler.hosts`)
  and ``crawl/refused_<kind>`` (the host resolves to a loopback, private, link_local, metadata
  or reserved address; see `lait.crawler.middlewares`);
  and ``crawl/too_deep``, a stored page nested deeper than the page reader reads, whose images
  and links below were never seen.

Frontier: links found wait in a compact `lait.crawler.frontier.Frontier` (URLs, breadth-first), and
become Scrapy Requests only as Scrapy's scheduler runs low (`LaitSpider.top_up`), so a crawl
whose pages link to thousands of others does not hold thousands of Requests. With
``--redis-url`` the frontier is the shared Redis queue instead.

Resume: committed parts of the output are the checkpoint. On start, the spider reads the
pages and images already in the work directory, never requests them again, and rebuilds the
frontier from the stored HTML of those pages, so a crawl killed at any moment (SIGKILL
included) and restarted ends with every page exactly once. A stop (Ctrl-C, SIGTERM) cancels
the downloads in flight (`lait.crawler.hosts.HostAwareDownloader.interrupt`), puts their
requests back in the queue and closes at once. Scrapy's ``JOBDIR`` state is used as well
after such a clean stop; after a kill it is discarded, since it may name requests whose rows
were still in open parts.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import urlsplit

import scrapy
from scrapy import signals
from scrapy.exceptions import DontCloseSpider, IgnoreRequest

from lait.crawler.config import CrawlConfig, scrapy_settings
from lait.crawler.frontier import Frontier
from lait.crawler.hosts import CrawlInterrupted
from lait.crawler.items import ImageItem, PageItem, RejectedItem
from lait.crawler.middlewares import AddressRefused
from lait.crawler.pipelines import new_run_id
from lait.crawler.reasons import ERROR_TDM_RESERVED
from lait.pagereader import is_noai, is_tdm_reserved, read_page, robots_directives, tdm_reservation
from lait.reasons import http_error

log = logging.getLogger(__name__)

HTML_TYPES = ("text/html", "application/xhtml+xml")
IMAGE_PRIORITY = 10  # images of a parsed page go before more pages: rows stay close together
RUNNING_MARKER = "lait.running"
DEPTH_DETAIL = "nested deeper than 256 elements: the images and links below were not read"


def _header(response, name: str) -> str:
    values = response.headers.getlist(name)
    return ", ".join(v.decode("latin-1") for v in values)


def _tdm_header(response) -> bool | None:
    return tdm_reservation(_header(response, "tdm-reservation") or None)


# A Retry-After further away than this is taken as this (a server's misconfiguration must
# not park a retry pass for days).
MAX_RETRY_AFTER = 86400.0


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """Seconds a `Retry-After` value asks to wait (delay-seconds or an HTTP date), or None."""
    from email.utils import parsedate_to_datetime

    value = (value or "").strip()
    if not value:
        return None
    if value.isdigit():
        return min(float(value), MAX_RETRY_AFTER)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    now = time.time() if now is None else now
    return min(max(0.0, when.timestamp() - now), MAX_RETRY_AFTER)


def _headers_map(response) -> dict[str, str]:
    return {k.decode("latin-1"): ", ".join(v.decode("latin-1") for v in vs)
            for k, vs in response.headers.items()}


class LaitSpider(scrapy.Spider):
    """Stage 1 of LAIT: pages and their images into a lait work directory."""

    name = "lait"

    def __init__(self, config: CrawlConfig, stats_json: str | None = None, **kwargs):
        super().__init__(**kwargs)
        self.cfg = config
        self.stats_json = stats_json
        self.run_id = new_run_id()
        self.seeds = config.seed_urls()
        # In the form the requests name their hosts (IDNA), or the offsite filter drops a seed
        # `http://bücher.example/` (`lait.crawler.redirects.OffsiteMiddleware` says so in a row).
        self.allowed_domains = config.follow_domains()
        self.pages_seen = 0  # pages in the output: committed before this run, and written now
        self.done_pages: set[str] = set()
        self.done_images: set[str] = set()
        # Links wait here as URLs, not as Scrapy Requests (see crawler.frontier); with Redis the
        # shared frontier is Redis, and every link goes to Scrapy's (scrapy-redis) scheduler.
        self.frontier: Frontier | None = None if config.redis_url else Frontier()
        # Requests Scrapy's scheduler should hold before the frontier hands it more pages.
        self.low_water = 2 * config.concurrency
        self._idle_since: float | None = None
        idle = config.idle_seconds or (5.0 if config.redis_url else 0.0)
        self.idle_seconds = idle
        self.interrupted = False  # a stop was asked for: no more pages from the frontier

    @classmethod
    def from_crawler(cls, crawler, *args, config: CrawlConfig | dict | str | None = None,
                     stats_json: str | None = None, **kwargs):
        """Build the config from `-a` arguments (or a `config` object / YAML path) and apply it."""
        cfg = _config_from_args(config, kwargs)
        crawler.settings.setdict(scrapy_settings(cfg), priority="spider")
        _prepare_jobdir(crawler.settings.get("JOBDIR"))
        spider = cls(cfg, stats_json=stats_json)
        spider._set_crawler(crawler)
        crawler.signals.connect(spider._on_idle, signal=signals.spider_idle)
        return spider

    # -- start: seeds, plus the frontier rebuilt from the work directory -----------------------
    async def start(self):
        replay = self._load_done()
        for url in self.seeds:
            if url not in self.done_pages:
                yield self._page_request(url, depth=0, referer=None)
        for request in replay:
            yield request
        for request in self.top_up():
            yield request

    def _load_done(self) -> list:
        """Read what the work directory already holds; return the requests it still implies (and
        the rows of URLs it cannot request: Scrapy 2.13+ takes items from `start`)."""
        from lait import storage
        from lait.workdir import WorkDir

        work = WorkDir(self.cfg.out)
        if not storage.is_dir(work.table_dir("pages")):
            return []
        for row in work.iter_rows("images", columns=["image_url"]):
            self.done_images.add(row["image_url"])
        for row in work.iter_rows("rejected", columns=["reason", "page_url", "image_url"]):
            if row["reason"].startswith("crawl/") and row["reason"] != "crawl/too_deep":  # not sent
                if row["image_url"]:
                    self.done_images.add(row["image_url"])
                elif row["page_url"]:
                    self.done_pages.add(row["page_url"])
        stored: list[tuple[str, int, bytes | None, str | None, int]] = []
        for row in work.iter_rows("pages", columns=["url", "status", "html", "encoding", "depth"]):
            self.done_pages.add(row["url"])
            stored.append((row["url"], row["status"], row["html"], row["encoding"], row["depth"] or 0))
        self.pages_seen = len({u for u, *_ in stored})
        requests: list = []
        for url, status, html, encoding, depth in stored:
            if html is not None:
                links = read_page(html, url, encoding)
                requests.extend(self._follow(links, url, depth, noai=False))
            elif 200 <= status < 300:
                # Stored without HTML (noai): fetch again for its links only, write nothing.
                requests.append(self._page_request(url, depth=depth, referer=None,
                                                   dont_filter=True, replay=True))
        if stored:
            log.info("resuming: %d pages and %d images already in %s; %d requests rebuilt",
                     len(stored), len(self.done_images), self.cfg.out, len(requests))
            self.crawler.stats.set_value("crawl/resumed_pages", len(stored))
        return requests

    # -- requests ------------------------------------------------------------------------------
    def _page_request(self, url: str, depth: int, referer: str | None, dont_filter: bool = False,
                      replay: bool = False) -> scrapy.Request:
        meta = {"depth": depth, "lait_kind": "page", "lait_referer": referer}
        if replay:
            meta["lait_replay"] = True
        return scrapy.Request(url, callback=self.parse_page, errback=self.on_error, meta=meta,
                              dont_filter=dont_filter)

    def _image_request(self, url: str, page_url: str, depth: int, dont_filter: bool = False) -> scrapy.Request:
        meta = {"depth": depth, "lait_kind": "image", "lait_referer": page_url,
                "allow_offsite": True,  # images live on CDNs; same-site is about pages
                "download_maxsize": self.settings.getint("LAIT_IMAGE_MAXSIZE")}
        return scrapy.Request(url, callback=self.parse_image, errback=self.on_error, meta=meta,
                              priority=IMAGE_PRIORITY, dont_filter=dont_filter)

    def _allowed(self, url: str) -> bool:
        if not self.allowed_domains:
            return True
        host = (urlsplit(url).hostname or "").lower()
        return any(host == d or host.endswith("." + d) for d in self.allowed_domains)

    def _follow(self, page, url: str, depth: int, noai: bool):
        """Requests for a parsed page's links (within limits) and, unless noai, its images; a URL
        longer than Scrapy's URLLENGTH_LIMIT becomes a `crawl/url_too_long` row instead."""
        out = []
        limit = self.settings.getint("URLLENGTH_LIMIT") or 0
        if not noai and self.cfg.fetch_images:
            for img in page.images:
                if img in self.done_images:
                    continue
                if limit and len(img) > limit:
                    out.append(self._too_long("image", img, url, limit))
                else:
                    out.append(self._image_request(img, url, depth + 1))
        if "nofollow" in page.robots:
            return out
        if self.cfg.max_depth and depth >= self.cfg.max_depth:
            return out
        if self._max_pages_reached():
            return out
        for link in page.links:
            if link not in self.done_pages and self._allowed(link):
                if limit and len(link) > limit:
                    out.append(self._too_long("page", link, url, limit))
                elif self.frontier is None:
                    out.append(self._page_request(link, depth + 1, url))
                else:
                    self.frontier.add(link, depth + 1, url)
        return out

    def _too_long(self, kind: str, url: str, referer: str, limit: int) -> RejectedItem:
        self._count("url_too_long")
        return self._rejected("crawl/url_too_long", kind, url, referer, f"{len(url)} characters, over {limit}")

    def _max_pages_reached(self) -> bool:
        return bool(self.cfg.max_pages) and self.pages_seen >= self.cfg.max_pages

    def top_up(self) -> list[scrapy.Request]:
        """Page requests from the frontier, until Scrapy's scheduler holds `low_water` requests.

        Called after every response and error (the crawl's clock), at start and when the spider
        goes idle.
        """
        if not self.frontier or self._max_pages_reached() or self.interrupted:
            return []
        room = self.low_water - self._pages_waiting()
        out = []
        while room > 0 and self.frontier:
            url, depth, referer = self.frontier.pop()
            if url in self.done_pages:  # reached meanwhile through a redirect
                continue
            out.append(self._page_request(url, depth, referer))
            room -= 1
        return out

    def _pages_waiting(self) -> int:
        """Page requests in Scrapy's scheduler (with lait's `HostFairQueue`; else all requests).

        Images do not count: they pile up behind slow hosts, and the page host must not wait
        for them to drain."""
        scheduler = self.crawler.engine.scheduler if self.crawler.engine else None
        if scheduler is None:
            return 0
        queues = [q for q in (getattr(scheduler, "mqs", None), getattr(scheduler, "dqs", None)) if q is not None]
        if not queues or not all(hasattr(q, "waiting") for q in queues):
            return len(scheduler)
        return sum(q.waiting["page"] for q in queues)

    # -- callbacks -----------------------------------------------------------------------------
    def parse_page(self, response):
        yield from self._parse_page(response)
        yield from self.top_up()
        self._finished(response.request)

    def _parse_page(self, response):
        meta = response.meta
        depth = meta.get("depth", 0)
        replay = meta.get("lait_replay", False)
        if not replay:
            if response.url in self.done_pages:  # a redirect to a page already recorded
                self._count("page_duplicate")
                return
            if self._max_pages_reached():
                self._count("page_over_max_pages")
                return
            self.pages_seen += 1
            self.done_pages.add(response.url)
        status = response.status
        ctype = _header(response, "Content-Type")
        item = PageItem(url=response.url, status=status, headers=_headers_map(response),
                        content_type=ctype or None, depth=depth, referer=meta.get("lait_referer"))
        if not 200 <= status < 300:
            item.error = http_error(status)
            self._count("page_status_error")
            yield from self._emit(item, replay)
            return
        if not ctype.split(";")[0].strip().lower() in HTML_TYPES or not hasattr(response, "text"):
            item.error = "not_html"
            self._count("page_not_html")
            yield from self._emit(item, replay)
            return
        page = read_page(response.body, response.url, response.encoding)
        item.license = page.license
        noai = is_noai(robots_directives(_header(response, "X-Robots-Tag")) | page.robots)
        reserved = self.cfg.obey_tdmrep and is_tdm_reserved(_tdm_header(response), page.tdm_reservation)
        if noai:
            item.error = "noai"
            self._count("page_noai")
        elif reserved:
            item.error = ERROR_TDM_RESERVED
            self._count("page_tdm_reserved")
        else:
            item.html = response.body
            item.encoding = response.encoding
            self._count("page_ok")
        yield from self._emit(item, replay)
        if page.too_deep and not (noai or reserved):
            self._count("page_too_deep")
            yield from self._emit(RejectedItem("crawl/too_deep", page_url=response.url,
                                               detail=DEPTH_DETAIL), replay)
        yield from self._follow(page, response.url, depth, noai or reserved)

    def _emit(self, item: PageItem, replay: bool):
        if not replay:
            yield item

    def parse_image(self, response):
        status = response.status
        mime = _header(response, "Content-Type").split(";")[0].strip().lower() or None
        item = ImageItem(image_url=response.url, status=status, mime=mime,
                         page_url=response.meta.get("lait_referer"))
        if response.url != response.request.url:
            # Redirected: keep the URL the page referenced, the one stage 3 joins on.
            item.image_url = response.request.meta.get("redirect_urls", [response.request.url])[0]
        if not 200 <= status < 300:
            item.error = http_error(status)
            if status in (429, 503):  # `--retry-failed` waits at least this long (lait.crawler.retry)
                self._note_retry_after(_header(response, "Retry-After"))
        elif is_noai(robots_directives(_header(response, "X-Robots-Tag"))):
            item.error = "noai"
        elif self.cfg.obey_tdmrep and _tdm_header(response):
            item.error = ERROR_TDM_RESERVED
        elif not mime or not mime.startswith("image/"):
            item.error = "not_image"
        elif not response.body:
            item.error = "empty"
        else:
            item.bytes = response.body
        self._count("image_ok" if item.error is None else f"image_{item.error}")
        yield item
        yield from self.top_up()
        self._finished(response.request)

    def on_error(self, failure):
        """A request that got no response: refused, forbidden by robots.txt, or failed."""
        yield from self._on_error(failure)
        yield from self.top_up()
        self._finished(failure.request)

    def _finished(self, request) -> None:
        """A request's callback has run through: with a Redis frontier its lease learns it
        (`lait.crawler.lease`), and lets the request go once its rows are committed."""
        lease = getattr(self, "lease", None)
        if lease is not None and request is not None:
            lease.finished(request)

    def _on_error(self, failure):
        request = failure.request
        kind = request.meta.get("lait_kind", "page")
        referer = request.meta.get("lait_referer")
        exc = failure.value
        if isinstance(exc, CrawlInterrupted):
            # Cancelled by a stop: back in the queue (kept in JOBDIR), nothing recorded.
            self._count("interrupted")
            yield request.replace(dont_filter=True)
            return
        if isinstance(exc, IgnoreRequest):
            # A redirect's request is refused under the URL the page linked (the one a resume
            # must not request again); the detail names where it was sent.
            first = request.meta.get("redirect_urls", [request.url])[0]
            detail = str(exc) if first == request.url else f"redirected to {request.url}: {exc}"
        if isinstance(exc, AddressRefused):
            self._count(exc.reason)
            yield self._rejected(f"crawl/{exc.reason}", kind, first, referer, detail)
            return
        reason = getattr(exc, "reason", None)
        if isinstance(exc, IgnoreRequest) and isinstance(reason, str) and reason.startswith("crawl/"):
            # robots.txt, an unreachable robots.txt, TDMRep, a host marked down
            self._count(reason.split("/", 1)[1])
            yield self._rejected(reason, kind, first, referer, detail)
            return
        if isinstance(exc, IgnoreRequest):
            # Dropped inside Scrapy's own middlewares: still a row, with the rule that dropped it.
            rule = _ignored_rule(str(exc))
            self._count(rule.split("/", 1)[1])
            yield self._rejected(rule, kind, first, referer, detail)
            return
        error = f"download/{type(exc).__name__}"
        self._count(f"{kind}_download_error")
        log.info("%s %s failed: %s", kind, request.url, exc)
        if kind == "image":
            yield ImageItem(image_url=request.url, status=0, page_url=referer, error=error)
        elif not request.meta.get("lait_replay"):
            if self._max_pages_reached():
                return
            self.pages_seen += 1
            yield PageItem(url=request.url, status=0, depth=request.meta.get("depth", 0),
                           referer=referer, error=error)

    def _rejected(self, reason: str, kind: str, url: str, referer: str | None, detail: str):
        if kind == "image":
            return RejectedItem(reason, page_url=referer, image_url=url, detail=detail)
        return RejectedItem(reason, page_url=url, detail=(f"{detail}; linked from {referer}"
                                                          if referer else detail))

    def _note_retry_after(self, value: str | None) -> None:
        seconds = retry_after_seconds(value)
        if seconds is not None:
            self.crawler.stats.max_value("lait/retry_after_until", time.time() + seconds)

    def _count(self, event: str) -> None:
        self.crawler.stats.inc_value(f"crawl/{event}")

    # -- idle and close ------------------------------------------------------------------------
    def _on_idle(self, spider=None):
        """Feed the frontier's next pages, if any; with Redis, wait a little for other processes."""
        requests = self.top_up()
        if requests:
            for request in requests:
                self.crawler.engine.crawl(request)
            raise DontCloseSpider
        if self.idle_seconds <= 0:
            return
        lease = getattr(self, "lease", None)
        if lease is not None:
            lease.idle()
        if lease is not None and lease.others_hold_requests():
            # Another crawler's requests may still bring links, or come back to the queue when
            # its lease expires: the crawl is not over.
            self._idle_since = None
            raise DontCloseSpider
        now = time.monotonic()
        if self._idle_since is None:
            self._idle_since = now
        if now - self._idle_since < self.idle_seconds:
            raise DontCloseSpider
        self._idle_since = None

    def interrupt(self) -> None:
        """A stop was asked for: feed no more pages, cancel the downloads in flight."""
        self.interrupted = True
        downloader = self.crawler.engine.downloader if self.crawler.engine else None
        if hasattr(downloader, "interrupt"):
            downloader.interrupt()

    def stored_text(self) -> str:
        """What the work directory holds now, for the line a stopped crawl prints."""
        return f"{self.pages_seen} pages"

    def closed(self, reason):
        if reason == "shutdown":
            log.warning("crawl stopped: %s in %s; run the same command again to resume",
                        self.stored_text(), self.cfg.out)
        jobdir = self.settings.get("JOBDIR")
        if jobdir and reason != "disk_full":  # rows were lost: the next run rebuilds its state from the parts
            (Path(jobdir) / RUNNING_MARKER).unlink(missing_ok=True)
        if self.stats_json:
            stats = dict(self.crawler.stats.get_stats())
            stats["finish_reason"] = reason
            start = stats.get("start_time")
            if start is not None:  # Scrapy sets elapsed_time_seconds only after this signal
                stats["elapsed_time_seconds"] = (datetime.now(timezone.utc) - start).total_seconds()
            Path(self.stats_json).write_text(json.dumps(stats, default=str, indent=1, sort_keys=True))


def _ignored_rule(message: str) -> str:
    """The reason of a request Scrapy's middlewares dropped (IgnoreRequest), by its message."""
    if "during decompression" in message:  # HttpCompressionMiddleware: a gzip/deflate/br bomb
        rule = "crawl/decompression_bomb"
    elif message.startswith("redirect loop"):  # lait.crawler.redirects
        rule = "crawl/redirect_loop"
    elif "max redirections" in message:  # RedirectMiddleware: a loop, or a chain too long
        rule = "crawl/too_many_redirects"
    else:  # an offsite redirect, say: Scrapy's message says which
        rule = "crawl/ignored"
    return rule


def _config_from_args(config, kwargs: dict) -> CrawlConfig:
    """`config` is a CrawlConfig, a dict of its fields or a YAML path; `kwargs` override it."""
    if isinstance(config, CrawlConfig):
        data = config.to_dict()
    elif isinstance(config, dict):
        data = dict(config)
    else:
        data = CrawlConfig.load_yaml(config) if config else {}
    data.update(kwargs)
    cfg = CrawlConfig.from_dict(data, where="spider arguments")
    cfg.validate()
    return cfg


def _prepare_jobdir(jobdir: str | None) -> None:
    """Discard Scrapy's JOBDIR state left by a killed crawl (see the module docstring)."""
    if not jobdir:
        return
    root = Path(jobdir)
    root.mkdir(parents=True, exist_ok=True)
    marker = root / RUNNING_MARKER
    if marker.exists():
        log.warning("%s: the previous crawl did not stop cleanly; rebuilding its state from the "
                    "work directory", root)
        (root / "requests.seen").unlink(missing_ok=True)
        shutil.rmtree(root / "requests.queue", ignore_errors=True)
        (root / "spider.state").unlink(missing_ok=True)
    marker.write_text("")
