"""`crawl(cfg)`: the `lait` spider in a subprocess (settings: `lait.crawler.config.CrawlConfig`).

Twisted's reactor runs once per process, so callers (`lait crawl`, `lait demo`, tests) never
start it themselves: `crawl(cfg)` writes the resolved config into the work directory and runs
``python -m lait.crawler.run CONFIG.yaml`` (this module's `main`), which starts Scrapy with the
project settings (`lait.crawler.settings`) and the `lait` spider. The same spider runs from the
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
from pathlib import Path
from typing import Any

from lait.config import ConfigError
from lait.lock import child_env
from lait.crawler.config import CrawlConfig, scrapy_settings

log = logging.getLogger(__name__)


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
    from lait.drivers import open_work_dir
    from lait.lock import locked

    cfg.validate()
    cfg.seed_urls()  # fail here, not in the subprocess, on bad seeds
    work = open_work_dir(cfg.out, create=True, n_partitions=cfg.n_partitions or None)
    with locked(work, "lait crawl"):
        work.write_config("crawl", cfg.to_yaml())
        return _crawl_subprocess(cfg, work, timeout=timeout, quiet=quiet)


def _crawl_subprocess(cfg: CrawlConfig, work: Any, *, timeout: float | None, quiet: bool) -> dict[str, Any]:
    # The subprocess's config and stats are local files even when the work directory is remote
    # (as Scrapy's JOBDIR is); it inherits this environment, storage settings included, and the
    # right to write into the work directory whose lock this process holds.
    with tempfile.TemporaryDirectory(prefix="lait-crawl-") as tmp:
        config_path, stats_path = Path(tmp) / "crawl.yaml", Path(tmp) / "stats.json"
        config_path.write_text(cfg.to_yaml())
        cmd = [sys.executable, "-m", "lait.crawler.run", str(config_path), "--stats-json", str(stats_path)]
        env = child_env(work)
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
    """Entry point of the crawler subprocess: `python -m lait.crawler.run CONFIG.yaml`."""
    parser = argparse.ArgumentParser(prog="python -m lait.crawler.run", description=__doc__, allow_abbrev=False,
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
