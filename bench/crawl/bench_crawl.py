"""Benchmark: parsed pages per second of the `lait` spider vs a bare link-following spider.

Both crawl the same built-in local web (served from this process on loopback), one after the
other, alternating, with the same overrides (concurrency 16, AutoThrottle off so the server's
latency, not the throttle, sets the pace); otherwise the bare spider runs stock Scrapy settings
(bare_spider.py) and the lait spider lait's own. The lait spider does its full page work:
link and image URL extraction, robots/noai checks, address guard, rows into Parquet parts.
A second pair adds downloading every image the pages show: the lait spider with its image
fetcher beside the same bare spider with Scrapy's `ImagesPipeline` (what a Scrapy user picks for
it: each page's `<img>` URLs and alts as an item, the images fetched, checked, converted and
stored by the pipeline). Both count pages per second over the whole crawl, images included.

    .venv/bin/python bench/crawl/bench_crawl.py [--pages 300] [--repeats 2]

Prints the figures (median over repeats) and their ratios; targets: pages only >= 0.9 (issue
23), with images >= 1.0 (issue 35). `pairs()` yields both pairs for `bench/all.py`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from pairs import Pair  # noqa: E402

TARGET = 0.9  # lait spider pages/s / bare Scrapy's
IMAGES_TARGET = 1.0  # lait spider with images / bare Scrapy with ImagesPipeline

SHARED = {"CONCURRENT_REQUESTS": 16, "CONCURRENT_REQUESTS_PER_DOMAIN": 16,
          "AUTOTHROTTLE_ENABLED": False, "LOG_LEVEL": "WARNING", "LAIT_ALLOW_LOOPBACK": True}


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def run_bare(seed: str, tmp: Path, images: bool = False) -> tuple[float, int]:
    stats_path = tmp / "bare.json"
    store = Path(tempfile.mkdtemp(dir=tmp))  # a fresh store: ImagesPipeline skips what it holds
    subprocess.run([sys.executable, str(REPO / "bench" / "crawl" / "bare_spider.py"),
                    *(["--images", str(store)] if images else []), seed,
                    str(stats_path)] + [f"{k}={v}" for k, v in SHARED.items()],
                   env=_env(), check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    stats = json.loads(stats_path.read_text())
    if images:
        assert stats.get("file_count", 0) > 0, "ImagesPipeline stored no image"
    return stats["bench/parsed_pages"] / stats["elapsed_time_seconds"], stats["bench/parsed_pages"]


def run_lait(seed: str, tmp: Path, images: bool) -> tuple[float, int]:
    from lait.crawler.config import CrawlConfig
    from lait.crawler.run import crawl

    out = Path(tempfile.mkdtemp(dir=tmp))
    cfg = CrawlConfig(seeds=[seed], out=str(out), allow_loopback=True, autothrottle=False,
                      concurrency=SHARED["CONCURRENT_REQUESTS"],
                      per_domain=SHARED["CONCURRENT_REQUESTS_PER_DOMAIN"], fetch_images=images,
                      log_level="WARNING")
    stats = crawl(cfg, quiet=True)
    pages = stats.get("crawl/rows_pages", 0)  # every page response, as the bare spider counts
    return pages / stats["elapsed_time_seconds"], pages


@contextmanager
def local_web(pages: int):
    """The generated site served on loopback, its cache warmed by one lait crawl with images; yields
    (seed URL, scratch directory)."""
    from lait.testkit.generator import generate_site
    from lait.testkit.server import SiteServer

    site = generate_site(pages, seed=0)
    with SiteServer(site, cache_size=1 << 16) as srv, tempfile.TemporaryDirectory() as tmp:
        seed = srv.url + "/"
        run_lait(seed, Path(tmp), images=True)  # warm the server's cache: pages and images render once
        yield seed, Path(tmp)


@contextmanager
def pairs(quick: bool = False, pages: int | None = None):
    """The lait spider (pages only) beside the bare Scrapy spider on the same local web."""
    n = pages or (30 if quick else 300)
    with local_web(n) as (seed, tmp):
        yield [Pair("crawl", f"lait crawl, pages only, local web of {n} articles",
                    "bare Scrapy spider, stock settings, LinkExtractor", "pages/s", TARGET,
                    lambda: run_lait(seed, tmp, images=False)[0], lambda: run_bare(seed, tmp)[0]),
               Pair("crawl_images", f"lait crawl with image downloads, local web of {n} articles",
                    "bare Scrapy spider + ImagesPipeline", "pages/s", IMAGES_TARGET,
                    lambda: run_lait(seed, tmp, images=True)[0], lambda: run_bare(seed, tmp, images=True)[0])]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pages", type=int, default=300, help="articles of the generated site")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)

    results: dict[str, list[float]] = {"bare": [], "lait": [], "bare+ImagesPipeline": [], "lait+images": []}
    counts: dict[str, int] = {}
    with local_web(args.pages) as (seed, tmp):
        for _ in range(args.repeats):
            for name, fn in (("bare", lambda: run_bare(seed, tmp)),
                             ("lait", lambda: run_lait(seed, tmp, images=False)),
                             ("bare+ImagesPipeline", lambda: run_bare(seed, tmp, images=True)),
                             ("lait+images", lambda: run_lait(seed, tmp, images=True))):
                rate, n = fn()
                results[name].append(rate)
                counts[name] = n
    med = {k: statistics.median(v) for k, v in results.items()}
    print(f"local web: {args.pages} articles, {args.repeats} repeats, medians; "
          f"concurrency {SHARED['CONCURRENT_REQUESTS']}, AutoThrottle off")
    print(f"bare Scrapy spider (LinkExtractor, follow only): {med['bare']:7.1f} pages/s ({counts['bare']} pages)")
    print(f"lait spider (pages, links, image URLs, Parquet): {med['lait']:7.1f} pages/s ({counts['lait']} pages)")
    print(f"bare spider + Scrapy ImagesPipeline:             {med['bare+ImagesPipeline']:7.1f} pages/s "
          f"({counts['bare+ImagesPipeline']} pages)")
    print(f"lait spider + image downloads:                   {med['lait+images']:7.1f} pages/s ({counts['lait+images']} pages)")
    print(f"ratio lait / bare: {med['lait'] / med['bare']:.2f} (target >= {TARGET}); "
          f"with images, lait / bare + ImagesPipeline: {med['lait+images'] / med['bare+ImagesPipeline']:.2f} "
          f"(target >= {IMAGES_TARGET}); lait with images / bare without: {med['lait+images'] / med['bare']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
