"""The cost of checking fingerprints beside the work it saves: `lait filter` on 1,024 partitions.

A work directory of 1,024 partitions holding N real photos (../shared/data/photos, each copy
made distinct by a JPEG comment) is filtered once, timed; then the fingerprint check of a
rerun (`lait.fingerprint.plan_run`: every marker and every input part's stats read, every
partition compared) is timed on its own, and a whole rerun that redoes nothing. Medians of R
rounds; target: the check costs under 2 % of the filter run.

    .venv/bin/python bench/fingerprint/bench_check.py [--partitions 1024] [--n 4096] [--rounds 3]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "filters"))
sys.path.insert(0, str(REPO / "bench" / "filter"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--partitions", type=int, default=1024)
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()

    import conftest as td  # tests/filters helpers: rows and table writing
    from bench_filter import load_images

    from lait.executor import LocalExecutor
    from lait.filters.config import FilterConfig
    from lait.filters.image_stage import ImageFilterStage
    from lait.fingerprint import plan_run
    from lait.workdir import WorkDir

    images = load_images(args.n)
    tmp = Path(tempfile.mkdtemp(prefix="bench-fingerprint-"))
    try:
        src = WorkDir(tmp / "src", n_partitions=args.partitions).init()
        td.write_table(src, "images", [td.image_row(f"http://bench.test/{i}.jpg", b) for i, b in enumerate(images)],
                       "image_url")
        parts = len(src.partitions("images"))
        print(f"{len(images)} images in {parts} partitions, {args.workers} workers")
        figures: dict[str, list[float]] = {"filter run": [], "fingerprint check": [], "rerun, nothing to do": []}
        for _ in range(args.rounds):
            root = tmp / "work"
            shutil.rmtree(root, ignore_errors=True)
            shutil.copytree(src.root, root)
            work = WorkDir(root)
            stage = ImageFilterStage(FilterConfig(work=str(root), progress=False))
            executor = LocalExecutor(workers=args.workers, show_progress=False)
            start = time.perf_counter()
            report = executor.run(stage, work)
            figures["filter run"].append(time.perf_counter() - start)
            assert report.ok and len(report.done) == parts, report.summary()
            start = time.perf_counter()
            plan = plan_run(stage, work)
            figures["fingerprint check"].append(time.perf_counter() - start)
            assert not plan.pending and len(plan.current) == parts
            start = time.perf_counter()
            again = executor.run(stage, work)
            figures["rerun, nothing to do"].append(time.perf_counter() - start)
            assert not again.done and len(again.skipped) == parts
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in figures.items()}
    for k, v in med.items():
        print(f"{k:24s} {v:8.3f} s   (rounds: {', '.join(f'{x:.3f}' for x in figures[k])})")
    ratio = med["fingerprint check"] / med["filter run"]
    print(f"check / filter run = {100 * ratio:.2f} %   (target < 2 %)")
    print(f"ratio fingerprint_check {ratio:.4f}")


if __name__ == "__main__":
    main()
