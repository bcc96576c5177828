"""`CrawlConfig`, its Scrapy settings, and `crawl(cfg)`: the `lait` spider in a subprocess.

Twisted's reactor runs once per process, so callers (`lait crawl`, `lait demo`, tests) never
start it themselves: `crawl(cfg)` writes the resolved config into the work directory and runs
``python -m crawler.run CONFIG.yaml`` (this module's `main`), which starts Scrapy with the
project settings (`crawler.settings`) and the `lait` spider. The same spider runs from the
repository root as ``scrapy crawl lait -a seeds=seeds.txt -a out=work/`` (any `CrawlConfig`
field can be given with `-a NAME=VALUE`, lists comma-separated, or `-a config=crawl.yaml`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lait.config import Config, ConfigError, setting

log = logging.getLogger(__name__)


@dataclass
class CrawlConfig(Config):
    """Settings of one crawl (`lait crawl`, `scrapy crawl lait -a NAME=VALUE`)."""

    section = "crawl"

    seeds: list[str] = setting([], "seed URLs, or files with one URL per line (# comments)",
                               metavar="URL_OR_FILE")
    out: str = setting("", "work directory that receives pages/ and images/ (created if missing)")
    allowed_domains: list[str] = setting([], "only follow links to these domains (and their "
                                         "subdomains); images may come from anywhere")
    same_site: bool = setting(True, "without --allowed-domains, follow links only to the seeds' hosts")
    max_depth: int = setting(0, "follow links at most this many hops from a seed (0: no limit)")
    max_pages: int = setting(0, "stop after this many pages (0: no limit)")
    fetch_images: bool = setting(True, "request the images pages show (the images/ table)")
    concurrency: int = setting(32, "concurrent requests in total")
    per_domain: int = setting(8, "concurrent requests per domain")
    autothrottle: bool = setting(True, "adapt the request rate to each server's latency")
    obey_robots: bool = setting(True, "obey robots.txt")
    download_timeout: float = setting(30.0, "seconds before a download is abandoned")
    max_page_bytes: int = setting(10 << 20, "larger pages are abandoned")
    max_image_bytes: int = setting(20 << 20, "larger images are abandoned")
    retries: int = setting(2, "retries of a failed download (timeouts, 5xx)")
    user_agent: str = setting("", "User-Agent header (default: lait's identifying one)")
    allow_loopback: bool = setting(False, "allow requests to loopback addresses (demo, tests)")
    allow_private: bool = setting(False, "allow requests to private, link-local and reserved addresses")
    redis_url: str = setting("", "share the frontier and duplicate filter through Redis "
                             "(scrapy-redis), e.g. redis://host:6379/0, so several crawler "
                             "processes share one crawl")
    redis_key: str = setting("lait", "prefix of the Redis keys of this crawl")
    idle_seconds: float = setting(0.0, "wait this long for new requests before closing when idle "
                                  "(default: 0, or 5 s with --redis-url)")
    jobdir: str = setting("", "Scrapy JOBDIR: queue and seen-requests state, for pause/resume")
    n_partitions: int = setting(0, "partitions of a new work directory (0: 16)")
    part_rows: int = setting(2000, "commit a part file after this many rows")
    part_seconds: float = setting(30.0, "commit open part files at least this often (seconds)")
    scrapy_settings: list[str] = setting([], "extra Scrapy settings as NAME=VALUE", metavar="NAME=VALUE")
    log_level: str = setting("INFO", "Scrapy's log level", choices=["DEBUG", "INFO", "WARNING", "ERROR"])

    def validate(self) -> None:
        if not self.seeds:
            raise ConfigError("at least one seed URL or seeds file is required (--seeds)")
        if not self.out:
            raise ConfigError("an output work directory is required (--out)")
        for name in ("max_depth", "max_pages", "n_partitions", "retries"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0")
        for name in ("concurrency", "per_domain", "part_rows", "max_page_bytes", "max_image_bytes"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1")
        for item in self.scrapy_settings:
            if "=" not in item:
                raise ConfigError(f"scrapy_settings: expected NAME=VALUE, got {item!r}")
        if self.redis_url and not self.redis_url.startswith(("redis://", "rediss://", "unix://")):
            raise ConfigError(f"redis_url must start with redis://, rediss:// or unix://, got {self.redis_url!r}")

    def seed_urls(self) -> list[str]:
        """The seed URLs: the URLs given, and the lines of the files given."""
        urls: list[str] = []
        for seed in self.seeds:
            if "://" in seed:
                urls.append(seed.strip())
                continue
            path = Path(seed)
            if not path.is_file():
                raise ConfigError(f"seed {seed!r} is neither a URL (scheme://...) nor a file")
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                line = line.split("#", 1)[0].strip()
                if not line:
                    continue
                if not line.startswith(("http://", "https://")):
                    raise ConfigError(f"{path}:{n}: not an http(s) URL: {line!r}")
                urls.append(line)
        if not urls:
            raise ConfigError("the seeds hold no URL")
        return urls


def scrapy_settings(cfg: CrawlConfig) -> dict[str, Any]:
    """The Scrapy settings a config implies (laid over `crawler.settings`)."""
    s: dict[str, Any] = {
        "LAIT_OUT": cfg.out,
        "LAIT_PARTITIONS": cfg.n_partitions or None,
        "LAIT_PART_ROWS": cfg.part_rows,
        "LAIT_PART_SECONDS": cfg.part_seconds,
        "LAIT_IMAGE_MAXSIZE": cfg.max_image_bytes,
        "LAIT_ALLOW_LOOPBACK": cfg.allow_loopback,
        "LAIT_ALLOW_PRIVATE": cfg.allow_private,
        "CONCURRENT_REQUESTS": cfg.concurrency,
        "CONCURRENT_REQUESTS_PER_DOMAIN": cfg.per_domain,
        "AUTOTHROTTLE_ENABLED": cfg.autothrottle,
        "ROBOTSTXT_OBEY": cfg.obey_robots,
        "DOWNLOAD_TIMEOUT": cfg.download_timeout,
        "DOWNLOAD_MAXSIZE": cfg.max_page_bytes,
        "RETRY_TIMES": cfg.retries,
        "LOG_LEVEL": cfg.log_level,
    }
    if cfg.user_agent:
        s["USER_AGENT"] = cfg.user_agent
    if cfg.jobdir:
        s["JOBDIR"] = cfg.jobdir
    if cfg.redis_url:
        s.update({
            "SCHEDULER": "scrapy_redis.scheduler.Scheduler",
            "DUPEFILTER_CLASS": "scrapy_redis.dupefilter.RFPDupeFilter",
            "REDIS_URL": cfg.redis_url,
            "SCHEDULER_PERSIST": True,
            "SCHEDULER_QUEUE_KEY": f"{cfg.redis_key}:requests",
            "SCHEDULER_DUPEFILTER_KEY": f"{cfg.redis_key}:dupefilter",
            "SCHEDULER_QUEUE_CLASS": "scrapy_redis.queue.PriorityQueue",
            # Requests travel through Redis as JSON, never pickle.
            "SCHEDULER_SERIALIZER": "lait.crawler.jsonqueue",
        })
    for item in cfg.scrapy_settings:
        name, value = item.split("=", 1)
        s[name.strip()] = value.strip()
    return s


# Finish reasons of a crawl that stopped where it was asked to: done, --max-pages, or one of
# Scrapy's CloseSpider limits a user set (CLOSESPIDER_TIMEOUT, _ITEMCOUNT, _PAGECOUNT).
SUCCESS_REASONS = frozenset({"finished", "max_pages", "closespider_timeout", "closespider_itemcount",
                             "closespider_pagecount"})


def crawl_succeeded(reason: str | None) -> bool:
    return reason in SUCCESS_REASONS


def crawl(cfg: CrawlConfig, *, timeout: float | None = None, quiet: bool = False) -> dict[str, Any]:
    """Run the crawl in a subprocess; returns its stats (Scrapy's and `crawl/*` counters).

    Raises RuntimeError when the crawler process fails.
    """
    from lait.commands import open_work_dir

    cfg.validate()
    cfg.seed_urls()  # fail here, not in the subprocess, on bad seeds
    work = open_work_dir(cfg.out, create=True, n_partitions=cfg.n_partitions or None)
    work.write_config("crawl", cfg.to_yaml())
    # The subprocess's config and stats are local files even when the work directory is remote
    # (as Scrapy's JOBDIR is); it inherits this environment, storage settings included.
    with tempfile.TemporaryDirectory(prefix="lait-crawl-") as tmp:
        config_path, stats_path = Path(tmp) / "crawl.yaml", Path(tmp) / "stats.json"
        config_path.write_text(cfg.to_yaml())
        cmd = [sys.executable, "-m", "lait.crawler.run", str(config_path), "--stats-json", str(stats_path)]
        env = dict(os.environ)
        repo = str(Path(__file__).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [repo, env.get("PYTHONPATH")]))
        log.info("crawling %d seed(s) into %s", len(cfg.seed_urls()), work.url)
        proc = subprocess.run(cmd, env=env, timeout=timeout,
                              stdout=subprocess.DEVNULL if quiet else None,
                              stderr=subprocess.DEVNULL if quiet else None)
        if proc.returncode != 0:
            raise RuntimeError(f"crawler process exited with status {proc.returncode}")
        text = stats_path.read_text() if stats_path.exists() else ""
        return json.loads(text) if text.strip() else {}


def main(argv: list[str] | None = None) -> int:
    """Entry point of the crawler subprocess: `python -m crawler.run CONFIG.yaml`."""
    parser = argparse.ArgumentParser(prog="python -m crawler.run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", help="CrawlConfig YAML")
    parser.add_argument("--stats-json", help="write the final crawl stats here")
    args = parser.parse_args(argv)
    os.environ.setdefault("SCRAPY_SETTINGS_MODULE", "lait.crawler.settings")
    from scrapy.crawler import CrawlerProcess
    from scrapy.utils.project import get_project_settings

    from lait.crawler.spiders.lait import LaitSpider

    try:
        cfg = CrawlConfig.from_dict(CrawlConfig.load_yaml(args.config), where=args.config)
        cfg.validate()
    except ConfigError as exc:
        print(f"crawler: {exc}", file=sys.stderr)
        return 2
    settings = get_project_settings()
    # The process-wide parts (logging, DNS resolver) read these before the spider applies them.
    settings.setdict(scrapy_settings(cfg), priority="spider")
    process = CrawlerProcess(settings)
    crawler = process.create_crawler(LaitSpider)
    # A dict: under `python -m`, this module's CrawlConfig is not the spider's class.
    process.crawl(crawler, config=cfg.to_dict(), stats_json=args.stats_json)
    process.start()
    reason = crawler.stats.get_value("finish_reason") if crawler.stats else None
    return 0 if crawl_succeeded(reason) else 1


if __name__ == "__main__":
    sys.exit(main())
