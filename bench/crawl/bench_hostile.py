"""Benchmark: what hostile hosts cost a crawl, measured side by side (issue 18).

1. The real-web mode (real pages of ../shared/data, their images served locally) crawled twice,
   alternating: with a share of its image hosts hostile (`lait.testkit.hostile`: a name that
   does not resolve, a refused port, a server that never answers, one that trickles bytes, a
   robots.txt and a tdmrep.json that refuse lait) and without. Target: the hostile crawl takes
   at most 1.3x the clean one plus one download timeout, and stores every page.
2. A one-page crawl (max depth 0) of a page showing 100 images, all on one host: healthy, or
   each kind of unreachable host. Target: at most 2x the healthy crawl plus one download timeout.

    .venv/bin/python bench/crawl/bench_hostile.py [--pages 120] [--timeout 5] [--repeats 2]

Prints every time, the bounds and the ratios (medians over repeats).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def crawl_once(seed: str, out: Path, timeout: float, resolve: list[str], **kw) -> tuple[float, dict]:
    from lait.crawler.config import CrawlConfig
    from lait.crawler.run import crawl

    cfg = CrawlConfig(seeds=[seed], out=str(out), allow_loopback=True, autothrottle=False,
                      download_timeout=timeout, resolve=resolve, log_level="ERROR", **kw)
    start = time.perf_counter()
    stats = crawl(cfg, quiet=True)
    return time.perf_counter() - start, stats


def real_web(pages: int, timeout: float, repeats: int, tmp: Path) -> None:
    from lait.testkit.hostile import HostileHosts
    from lait.testkit.realweb import RealWebSite
    from lait.testkit.server import SiteServer
    from lait.workdir import WorkDir

    times: dict[str, list[float]] = {"clean": [], "hostile": []}
    with HostileHosts() as hosts:
        clean, hostile = RealWebSite(max_pages=pages), RealWebSite(max_pages=pages)
        hostile.attach_hostile(hosts)
        truth = hostile.ground_truth()
        n_hostile = sum(1 for v in truth["images"].values() if v.get("hostile"))
        with SiteServer(clean, cache_size=1 << 16) as a, SiteServer(hostile, cache_size=1 << 16) as b:
            for name, srv in (("clean", a), ("hostile", b)):  # warm: every image renders once
                crawl_once(srv.url + "/", tmp / f"warm-{name}", timeout, hosts.crawl_resolve())
            for r in range(repeats):
                for name, srv in (("clean", a), ("hostile", b)):
                    out = tmp / f"{name}-{r}"
                    seconds, stats = crawl_once(srv.url + "/", out, timeout, hosts.crawl_resolve())
                    stored = WorkDir(out).count("pages")
                    times[name].append(seconds)
                    print(f"  real web {name:8s} run {r}: {seconds:6.1f} s, {stored} pages, "
                          f"{stats.get('crawl/rows_images', 0)} image rows, "
                          f"{stats.get('crawl/rows_rejected', 0)} rejected", flush=True)
    c, h = statistics.median(times["clean"]), statistics.median(times["hostile"])
    print(f"real web, {len(truth['pages']) - 1} real pages, {len(truth['images'])} image "
          f"URLs, {n_hostile} on hostile hosts; download timeout {timeout:g} s")
    print(f"  clean {c:.1f} s, hostile {h:.1f} s: ratio {h / c:.2f}; bound 1.3 x clean + timeout = "
          f"{1.3 * c + timeout:.1f} s -> {'OK' if h <= 1.3 * c + timeout else 'OVER'}")


def one_page(timeout: float, repeats: int, tmp: Path) -> None:
    from lait.testkit.hostile import HostileGallery, HostileHosts
    from lait.testkit.server import SiteServer

    times: dict[str, list[float]] = {}
    with HostileHosts() as hosts:
        for r in range(repeats):
            for kind in ("healthy", "blackhole", "refused", "nxdomain", "trickle"):
                site = HostileGallery(100, None if kind == "healthy" else hosts.base_url(kind),
                                      "robots" if kind == "healthy" else kind)
                with SiteServer(site) as srv:
                    seconds, _ = crawl_once(srv.url + "/", tmp / f"page-{kind}-{r}", timeout,
                                            hosts.crawl_resolve(), max_depth=0)
                times.setdefault(kind, []).append(seconds)
    healthy = statistics.median(times["healthy"])
    print(f"one page, 100 images on one host; download timeout {timeout:g} s")
    print(f"  healthy host: {healthy:.1f} s; bound 2 x healthy + timeout = {2 * healthy + timeout:.1f} s")
    for kind, ts in times.items():
        if kind != "healthy":
            m = statistics.median(ts)
            print(f"  {kind:9s} host: {m:.1f} s, ratio {m / healthy:.2f} -> "
                  f"{'OK' if m <= 2 * healthy + timeout else 'OVER'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pages", type=int, default=120, help="real pages served (0: all 311)")
    parser.add_argument("--timeout", type=float, default=5.0, help="download timeout of the crawls")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--skip-real-web", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        one_page(args.timeout, args.repeats, Path(tmp))
        if not args.skip_real_web:
            real_web(args.pages or None, args.timeout, args.repeats, Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
