"""A Scrapy extension for `crawl_timeline.py`: what the crawler process holds, every few seconds.

Enabled with ``-s EXTENSIONS={"crawl_probe.CrawlProbe": 900}`` and this folder on PYTHONPATH; it
appends one JSON line per tick to ``$LAIT_CRAWL_PROBE``: seconds since open, the process's RSS
and anonymous memory (MiB), requests in Scrapy's scheduler, fingerprints in its duplicate
filter, links in lait's frontier, pages recorded and images fetched.
"""

from __future__ import annotations

import json
import os
import time

from scrapy import signals
from twisted.internet import task


def _status_mib(path: str, field: str) -> int | None:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1]) // 1024
    except OSError:
        return None
    return None


class CrawlProbe:
    def __init__(self, crawler, every: float):
        self.crawler = crawler
        self.every = every
        self.out = open(os.environ["LAIT_CRAWL_PROBE"], "w")
        self.t0 = time.monotonic()
        self.loop: task.LoopingCall | None = None
        self.spider = None
        crawler.signals.connect(self.opened, signals.spider_opened)
        crawler.signals.connect(self.closed, signals.spider_closed)

    @classmethod
    def from_crawler(cls, crawler):
        return cls(crawler, crawler.settings.getfloat("LAIT_PROBE_SECONDS", 2.0))

    def opened(self, spider):
        self.spider = spider
        self.loop = task.LoopingCall(self.tick)
        self.loop.start(self.every)

    def tick(self):
        row = {"t": round(time.monotonic() - self.t0, 1),
               "rss": _status_mib("/proc/self/status", "VmRSS:"),
               "anon": _status_mib("/proc/self/smaps_rollup", "Anonymous:")}
        scheduler = getattr(self.crawler.engine, "scheduler", None)
        if scheduler is not None:
            row["scheduler"] = len(scheduler)
            fps = getattr(getattr(scheduler, "df", None), "_fingerprints", None)
            row["seen"] = len(fps) if fps is not None else None
        frontier = getattr(self.spider, "frontier", None)
        row["frontier"] = len(frontier) if frontier is not None else None
        row["pages"] = getattr(self.spider, "pages_seen", None)
        row["images"] = self.crawler.stats.get_value("crawl/rows_images", 0)
        self.out.write(json.dumps(row) + "\n")
        self.out.flush()

    def closed(self, spider, reason):
        self.tick()
        if self.loop is not None and self.loop.running:
            self.loop.stop()
        self.out.close()
