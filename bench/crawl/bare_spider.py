"""The baselines of `bench/crawl`: a bare Scrapy spider that only follows links (LinkExtractor),
and, with `--images`, the same spider as a Scrapy user collects images with it: every page's
image URLs as an item, downloaded and stored by Scrapy's own `ImagesPipeline` (which checks,
converts to RGB JPEG and writes each one under IMAGES_STORE). The image URLs are the ones lait's
page reader finds (`lait.pagereader.read_page`: src, lazy-loading attributes, srcset, picture,
og:image), so that both sides fetch the same images: a spider reading `img::attr(src)` alone
fetched 410 images of a 150-article web where lait's fetched 668.

Run by `bench_crawl.py` in its own process with Scrapy's stock settings (its own scheduler,
queue, downloader and robots.txt middleware, none of lait's) and the same overrides as the lait
spider: ``python bench/crawl/bare_spider.py [--images STORE] URL STATS_JSON NAME=VALUE...``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from urllib.parse import urlsplit

import scrapy
from scrapy.linkextractors import LinkExtractor


class BareSpider(scrapy.Spider):
    """Follows every same-site link and does nothing else."""

    name = "bare"

    def __init__(self, seed: str, images: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.seed = seed
        self.images = images
        self.allowed_domains = [urlsplit(seed).hostname]
        self.links = LinkExtractor()  # the offsite middleware keeps it on the site
        self.parsed = 0

    async def start(self):
        yield scrapy.Request(self.seed)

    def parse(self, response):
        if not hasattr(response, "text"):
            return
        self.parsed += 1
        if self.images:
            from lait.pagereader import read_page

            urls = read_page(response.body, response.url, response.encoding).images
            if urls:
                yield {"page_url": response.url, "image_urls": urls}
        for link in self.links.extract_links(response):
            yield response.follow(link.url)

    def closed(self, reason):
        self.crawler.stats.set_value("bench/parsed_pages", self.parsed)


def main(argv: list[str]) -> int:
    store = None
    if argv[0] == "--images":
        store, argv = argv[1], argv[2:]
    seed, stats_path, *overrides = argv
    from scrapy.crawler import CrawlerProcess
    from scrapy.settings import Settings

    os.environ.pop("SCRAPY_SETTINGS_MODULE", None)
    settings = Settings()  # stock Scrapy: the peer, not lait's project settings
    settings.setdict({"ROBOTSTXT_OBEY": True, "TELNETCONSOLE_ENABLED": False}, priority="project")
    settings.setdict(dict(o.split("=", 1) for o in overrides), priority="cmdline")
    if store:
        settings.set("ITEM_PIPELINES", {"scrapy.pipelines.images.ImagesPipeline": 1}, priority="cmdline")
        settings.set("IMAGES_STORE", store, priority="cmdline")
    else:
        settings.set("ITEM_PIPELINES", {}, priority="cmdline")  # it yields no items
    process = CrawlerProcess(settings)
    crawler = process.create_crawler(BareSpider)
    process.crawl(crawler, seed=seed, images=bool(store))
    process.start()
    Path(stats_path).write_text(json.dumps(crawler.stats.get_stats(), default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
