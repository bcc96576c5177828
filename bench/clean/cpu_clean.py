"""CPU seconds of stage 3 beside trafilatura alone on the 311 real pages, for a loaded machine.

The same work as `bench_clean.py` (its `CleanBench`), timed with `time.process_time` instead of
the wall clock: other processes on a shared machine then cost each side much less than they
do in wall time (they still share caches and cores, so the absolute figures are higher than on
a quiet machine). Rounds alternate the order of the three runs. This is not the acceptance
figure (that is `bench/all.py --only clean,clean_judge`); it compares two versions of stage 3
measured on the same loaded machine, run one after the other:

    PYTHONPATH=CHECKOUT .venv/bin/python bench/clean/cpu_clean.py CHECKOUT [ROUNDS]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    code = Path(sys.argv[1]).resolve()
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    sys.path.insert(0, str(code / "bench" / "clean"))
    import bench_clean as bc

    import lait

    if not str(lait.__file__).startswith(str(code)):
        sys.exit(f"lait comes from {lait.__file__}, not {code}: set PYTHONPATH={code}")
    pages = bc.load_pages()
    bc.load_langid()
    bc.load_judge()
    b = bc.CleanBench(Path(tempfile.mkdtemp(prefix="bench-clean-cpu-")), pages)
    b.stage_rate("none")  # warm-up
    runs = {"trafilatura": b.trafilatura_rate, "clean": lambda: b.stage_rate("none"),
            "clean_judge": lambda: b.stage_rate("default")}
    cpu: dict[str, list[float]] = {k: [] for k in runs}
    for r in range(rounds):
        for name in (list(runs) if r % 2 == 0 else list(reversed(runs))):
            t0 = time.process_time()
            runs[name]()
            cpu[name].append(time.process_time() - t0)
    med = {k: statistics.median(v) for k, v in cpu.items()}
    for k, v in cpu.items():
        print(f"{k:12s} {med[k]:6.2f} CPU s (rounds: {', '.join(f'{x:.2f}' for x in v)})"
              + ("" if k == "trafilatura" else f"   {med[k] / med['trafilatura']:.3f}x trafilatura's"))


if __name__ == "__main__":
    main()
