"""The baseline of `bench/crawl`: a bare Scrapy spider that only follows links (LinkExtractor).

Run by `bench_crawl.py` in its own process with Scrapy's stock settings (its own scheduler,
queue, downloader and robots.txt middleware, none of lait's) and the same overrides as the lait
spider: ``python bench/crawl/bare_spider.py URL STATS_JSON NAME=VALUE...``.
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

    def __init__(self, seed: str, **kwargs):
        super().__init__(**kwargs)
        self.seed = seed
        self.allowed_domains = [urlsplit(seed).hostname]
        self.links = LinkExtractor()  # the offsite middleware keeps it on the site
        self.parsed = 0

    async def start(self):
        yield scrapy.Request(self.seed)

    def parse(self, response):
        if not hasattr(response, "text"):
            return
        self.parsed += 1
        for link in self.links.extract_links(response):
            yield response.follow(link.url)

    def closed(self, reason):
        self.crawler.stats.set_value("bench/parsed_pages", self.parsed)


def main(argv: list[str]) -> int:
    seed, stats_path, *overrides = argv
    from scrapy.crawler import CrawlerProcess
    from scrapy.settings import Settings

    os.environ.pop("SCRAPY_SETTINGS_MODULE", None)
    settings = Settings()  # stock Scrapy: the peer, not lait's project settings
    settings.setdict({"ROBOTSTXT_OBEY": True, "TELNETCONSOLE_ENABLED": False}, priority="project")
    settings.setdict(dict(o.split("=", 1) for o in overrides), priority="cmdline")
    settings.set("ITEM_PIPELINES", {}, priority="cmdline")  # it yields no items
    process = CrawlerProcess(settings)
    crawler = process.create_crawler(BareSpider)
    process.crawl(crawler, seed=seed)
    process.start()
    Path(stats_path).write_text(json.dumps(crawler.stats.get_stats(), default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
