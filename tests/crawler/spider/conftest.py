"""Fixtures of the spider tests: the built-in local web on loopback, and crawls in subprocesses."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def local_web():
    """A 40-article generated site served on loopback: (site, base URL)."""
    from lait.testkit.generator import generate_site
    from lait.testkit.server import SiteServer

    site = generate_site(40, seed=3)
    with SiteServer(site) as srv:
        yield site, srv.url


def crawl_config(out, seeds, **kw):
    from lait.crawler.config import CrawlConfig

    defaults = dict(allow_loopback=True, log_level="WARNING", autothrottle=False,
                    n_partitions=4, part_seconds=2.0)
    defaults.update(kw)
    return CrawlConfig(seeds=list(seeds), out=str(out), **defaults)


def config_file(cfg, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(cfg.to_yaml())
    return path


def crawler_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def crawler_cmd(config: Path, stats: Path | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "lait.crawler.run", str(config)]
    return cmd + (["--stats-json", str(stats)] if stats else [])


def read_stats(path: Path) -> dict:
    return json.loads(path.read_text())


@pytest.fixture(scope="session")
def helpers():
    """The helpers above (test modules cannot import conftest under --import-mode=importlib)."""
    from types import SimpleNamespace

    return SimpleNamespace(crawl_config=crawl_config, config_file=config_file,
                           crawler_env=crawler_env, crawler_cmd=crawler_cmd, read_stats=read_stats)
