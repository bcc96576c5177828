"""Documents beside pairs (issue 63): `lait documents` against `lait build` on one work directory.

Data: a work directory of the built-in local web, made once by `lait demo --pages 60`, or with
`--realweb` of the real-web mode (the 311 real pages of ../shared/data/html with real photos for
their pictures, run through stages 2-5 with the defaults and the demo scorer), both cached under
~/.cache/lait/bench-documents; `--work` gives another one. Each round runs, as a user would and in alternating order, `lait build WORK --force`
(stage 5: the plan, the shard pass with its face search) and `lait documents WORK --force`
(stage 3's document pass, stage 4's similarities, the document rules and writers), both with one
worker, each in its own process, timed on the wall clock and in CPU seconds of the process and
its children. Both reuse the faces/ cache of the build before them, as they do in use: the
first round warms it. The figure is documents' CPU time over the pair build's (median of the
rounds).

    .venv/bin/python bench/build/bench_documents.py [--rounds 3] [--work WORK]

Target (issue 63): documents cost at most 1.5x the pair build.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TARGET = 1.5
CACHE = Path(os.environ.get("LAIT_CACHE", Path.home() / ".cache" / "lait")) / "bench-documents"


def demo_work() -> Path:
    """The cached demo work directory, made on first use (about three minutes)."""
    out = CACHE / "demo"
    work = out / "work"
    if not (work / "shards" / "stats.json").exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "lait", "demo", "--out", str(out), "--pages", "60", "--port", "0",
                        "--no-progress", "--overwrite"], check=True, cwd=REPO)
    return work


def realweb_work() -> Path:
    """A cached work directory of the real-web mode (the real pages of ../shared/data/html with
    real photos for their pictures, `lait.testkit.realweb`), crawled and run through stages 2-5
    with the defaults and the demo scorer once (several minutes)."""
    sys.path.insert(0, str(REPO))
    from lait.app.run import run_pipeline
    from lait.crawler.config import CrawlConfig
    from lait.crawler.run import crawl
    from lait.testkit.realweb import RealWebSite, default_data_dir
    from lait.testkit.server import SiteServer

    work = CACHE / "realweb"
    if (work / "shards" / "stats.json").exists():
        return work
    import shutil

    shutil.rmtree(work, ignore_errors=True)
    with SiteServer(RealWebSite(default_data_dir()), port=0) as srv:
        crawl(CrawlConfig(seeds=[srv.url + "/"], out=str(work), allow_loopback=True, autothrottle=False,
                          concurrency=16, per_domain=16, log_level="WARNING", n_partitions=8, max_depth=1),
              quiet=True)
    sections = {"filter": {}, "clean": {}, "score": {"model": "demo"}, "build": {}}
    if not run_pipeline(str(work), sections, overrides={"workers": 1, "progress": False}, where="bench"):
        sys.exit("the real-web pipeline failed")
    return work


def timed(args: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the child and its children) of one command."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "lait", *args], capture_output=True, text=True, cwd=REPO)
    wall = time.perf_counter() - start
    if done.returncode:
        sys.exit(f"lait {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--work", help="a work directory that lait clean and lait score have run on")
    ap.add_argument("--realweb", action="store_true", help="the real-web mode's pages instead of the demo's web")
    ap.add_argument("--pairs-from", choices=["build", "clean"], default="build",
                    help="the pair side: lait build alone (the target's), or stages 3-5 (clean, score, build), "
                         "what the pairs cost from the same filtered crawl")
    args = ap.parse_args()
    work = Path(args.work) if args.work else realweb_work() if args.realweb else demo_work()
    common = ["--workers", "1", "--no-progress", "--force"]
    pairs = [[stage, str(work), *common] for stage in (("clean", "score", "build") if args.pairs_from == "clean"
                                                        else ("build",))]
    documents = ["documents", str(work), *common]

    def pair_side() -> tuple[float, float]:
        runs = [timed(cmd) for cmd in pairs]
        return sum(w for w, _ in runs), sum(c for _, c in runs)

    pair_side()  # the faces/ cache and the page cache warm, as in use
    rows: dict[str, list[tuple[float, float]]] = {"build": [], "documents": []}
    for r in range(args.rounds):
        order = [("build", pair_side), ("documents", lambda: timed(documents))]
        for name, run in order if r % 2 == 0 else order[::-1]:
            rows[name].append(run())
    print(f"pair side: lait {' + '.join(cmd[0] for cmd in pairs)}")
    for name, runs in rows.items():
        print(f"{name:10s} wall {statistics.median(w for w, _ in runs):6.2f} s   "
              f"CPU {statistics.median(c for _, c in runs):6.2f} s   ({len(runs)} rounds)")
    ratio = statistics.median(d[1] / b[1] for d, b in zip(rows["documents"], rows["build"]))
    wall = statistics.median(d[0] / b[0] for d, b in zip(rows["documents"], rows["build"]))
    ok = ratio <= TARGET
    print(f"ratio documents_vs_build {ratio:.2f}x CPU ({wall:.2f}x wall); target <= {TARGET:.2f}x: "
          f"{'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
