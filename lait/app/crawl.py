"""`lait crawl`: stage 1 with the Scrapy `lait` spider (see `lait.crawler.spiders.lait`)."""

from __future__ import annotations

import json
import sys

from lait.app.commands import add_config_command
from lait.reasons import fetch_errors_help, reasons_help

EPILOG = f"""\
examples:
  lait crawl --seeds seeds.txt --out work/
  lait crawl --seeds https://example.org/ --out work/ --max-pages 10000 --max-depth 3
  lait crawl --seeds seeds.txt --out work/ --redis-url redis://10.0.0.5:6379/0   # on each machine
  scrapy crawl lait -a seeds=seeds.txt -a out=work/                              # the same spider

Polite by default: robots.txt of every host a request goes to, image hosts included (RFC 9309:
lait's token is `lait`; an unreachable robots.txt disallows all), the W3C TDM Reservation
Protocol, X-Robots-Tag noai/noimageai, AutoThrottle, 8 requests per host, 30 s and 10 MB
limits, an identifying user agent. A host that fails --host-down-after times in a row (DNS,
refused, timeout) is marked down and its other requests are not sent. Requests to loopback,
private, link-local and cloud-metadata addresses are refused after DNS resolution (recorded in
rejected/ as crawl/refused_<kind>) unless --allow-loopback / --allow-private.
--retry-failed then fetches again the images that failed for a transient reason (timeouts,
refused connections, 408, 429, 5xx, hosts marked down), after --retry-delay and any Retry-After.
Ctrl-C (or SIGTERM) stops cleanly: what was fetched is kept and the command exits 130 (143
for SIGTERM), so a script tells an interrupted crawl from a finished one. A crawl into a work
directory that already holds pages resumes it: pages and images already there are not fetched
again, even after the crawler was killed.

{fetch_errors_help()}

{reasons_help(["crawl"])}
"""


def run(cfg) -> int:
    from lait.crawler.run import crawl, crawl_stopped, crawl_succeeded, stopped_status

    stats = crawl(cfg)
    if cfg.retry_failed and crawl_succeeded(stats.get("finish_reason")):
        stats = _retry_failed(cfg, stats)
    summary = {k: v for k, v in sorted(stats.items())
               if k.startswith("crawl/") or k in ("finish_reason", "elapsed_time_seconds")}
    print(json.dumps(summary, indent=1), file=sys.stderr)
    reason = stats.get("finish_reason")
    if crawl_stopped(reason):
        return stopped_status(stats)
    return 0 if crawl_succeeded(reason) else 1


def _retry_failed(cfg, stats: dict) -> dict:
    """--retry-failed: passes over the crawl's images that failed for a transient reason,
    fetched again by the image fetcher through `retry_queue/` (`lait.crawler.retry`)."""
    from lait.crawler.config import ImageFetchConfig
    from lait.crawler.retry import retry_passes
    from lait.crawler.run import fetch_images
    from lait.drivers import open_work_dir
    from lait.lock import locked

    work = open_work_dir(cfg.out)
    fetch = ImageFetchConfig(**cfg.fetch_settings(), tables=["retry_queue"])
    fetch.out = work.url
    with locked(work, "lait crawl"):
        return retry_passes(work, [], lambda: fetch_images(fetch), stats, passes=cfg.retry_passes,
                            delay=cfg.retry_delay, max_wait=cfg.retry_max_wait, queue=True,
                            report=lambda line: print(f"lait crawl: {line}", file=sys.stderr))


def register(sub) -> None:
    """Add `lait crawl` to the `lait` command."""
    from lait.crawler.config import CrawlConfig

    add_config_command(sub, "crawl", CrawlConfig, run,
                       help="stage 1: crawl pages and their images (Scrapy)",
                       description="Crawl web pages from seeds with the Scrapy `lait` spider and "
                                   "write the pages/ and images/ tables into a work directory.",
                       epilog=EPILOG)
