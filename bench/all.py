"""Every stage bench in one run: lait beside its peer, in alternating rounds, printed as one table.

Each bench (`bench/STAGE/*.py`) prepares its data once and yields pairs (`bench/pairs.py`): one
round of lait and one round of its peer, each a function returning a rate. Rounds alternate
which side goes first (peer, lait; lait, peer; ...) so that load from other processes on a
shared machine hits both sides alike. A round's ratio is taken from the two runs next to each
other; the table gives the median of the per-round ratios and their spread (min-max).

    .venv/bin/python bench/all.py [--rounds 3] [--only NAME[,NAME]] [--quick]

Progress goes to stderr; stdout is the table, then one line `ratio NAME X` per pair (X is `nan`
when the bench was skipped or failed). Exit status 1 when a bench failed; a ratio that misses
its target is reported, not an error.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import statistics
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# (bench file, the pairs it yields), in pipeline order.
BENCHES = [
    ("bench/crawl/bench_crawl.py", ("crawl", "crawl_images")),
    ("bench/download/bench_download.py", ("download",)),
    ("bench/filter/bench_filter.py", ("filter", "filter_gates")),
    ("bench/clean/bench_clean.py", ("clean", "clean_judge")),
    ("bench/score/bench_score.py", ("score",)),
    ("bench/score/bench_decode.py", ("decode",)),
    ("bench/build/bench_resize.py", ("resize",)),
    ("bench/build/bench_shards.py", ("build", "shards")),
]
NAMES = [name for _, names in BENCHES for name in names]


@dataclass
class Result:
    """The rounds of one pair, or why it has none."""

    name: str
    pair: object = None                # bench/pairs.py's Pair, once the bench is prepared
    lait: list[float] = field(default_factory=list)
    peer: list[float] = field(default_factory=list)
    ratios: list[float] = field(default_factory=list)
    error: str = ""                    # "skipped: ..." or "failed: ..."

    @property
    def ratio(self) -> float:
        return statistics.median(self.ratios) if self.ratios else math.nan


def load_bench(path: str):
    """Import a bench file as a module (bench/ is scripts, not a package)."""
    name = "lait_bench_" + Path(path).stem
    spec = importlib.util.spec_from_file_location(name, REPO / path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses defined in it look their module up
    spec.loader.exec_module(module)
    return module


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_bench(path: str, wanted: list[str], rounds: int, quick: bool) -> list[Result]:
    results = {name: Result(name) for name in wanted}
    try:
        module = load_bench(path)
        with module.pairs(quick=quick) as pairs:
            pairs = [p for p in pairs if p.name in results]
            for p in pairs:
                results[p.name].pair = p
            for r in range(rounds):
                for p in pairs:
                    res = results[p.name]
                    # Alternate who goes first, so that a slow spell does not always hit one side.
                    if r % 2 == 0:
                        peer, lait = p.peer_round(), p.lait_round()
                    else:
                        lait, peer = p.lait_round(), p.peer_round()
                    res.lait.append(lait)
                    res.peer.append(peer)
                    res.ratios.append(p.ratio(lait, peer))
                    log(f"[{p.name}] round {r + 1}/{rounds}: lait {lait:,.1f} {p.unit}, peer {peer:,.1f} {p.unit}, "
                        f"ratio {res.ratios[-1]:.2f}")
    except SystemExit as exc:  # a bench's data is absent (`sys.exit(message)`)
        for res in results.values():
            res.error = f"skipped: {exc.code}"
    except Exception as exc:
        traceback.print_exc()
        for res in results.values():
            res.error = f"failed: {type(exc).__name__}: {exc}"
    return list(results.values())


def figure(rate: float) -> str:
    return f"{rate:,.1f}" if rate < 100 else f"{rate:,.0f}"


def load_average() -> str:
    try:
        return " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def revision() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + (" (uncommitted changes)" if dirty else "")


def table(results: list[Result]) -> list[str]:
    head = ("stage", "lait", "peer", "ratio", "target", "met", "rounds", "spread (min-max)")
    rows = []
    for res in results:
        p = res.pair
        if res.error or not res.ratios:
            rows.append((res.name, "-", "-", "-", p.target_text if p else "-", "-", "0", res.error or "no rounds"))
            continue
        ratio = res.ratio
        rows.append((res.name, f"{figure(statistics.median(res.lait))} {p.unit}",
                     f"{figure(statistics.median(res.peer))} {p.unit}", f"{ratio:.2f}", p.target_text,
                     "yes" if p.meets(ratio) else "NO", str(len(res.ratios)),
                     f"{min(res.ratios):.2f}-{max(res.ratios):.2f}"))
    widths = [max(len(r[i]) for r in (head, *rows)) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in (head, *rows)]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="rounds of each side per pair (default 3)")
    ap.add_argument("--only", action="append", default=[], metavar="NAME",
                    help=f"run only these pairs (repeatable or comma-separated): {', '.join(NAMES)}")
    ap.add_argument("--quick", action="store_true",
                    help="small inputs (a smoke test of the benches, not figures to quote)")
    args = ap.parse_args(argv)
    only = [n for arg in args.only for n in arg.split(",") if n]
    unknown = sorted(set(only) - set(NAMES))
    if unknown:
        ap.error(f"unknown bench {', '.join(unknown)}; choose from {', '.join(NAMES)}")
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")

    started = datetime.now(timezone.utc)
    load_before = load_average()
    t0 = time.perf_counter()
    results: list[Result] = []
    for path, names in BENCHES:
        wanted = [n for n in names if not only or n in only]
        if wanted:
            log(f"== {path} ({', '.join(wanted)})")
            results += run_bench(path, wanted, args.rounds, args.quick)

    print(f"bench/all {started:%Y-%m-%d %H:%M} UTC, commit {revision()}, {args.rounds} round(s) per side"
          f"{', QUICK inputs' if args.quick else ''}, {os.cpu_count()} CPUs, "
          f"load average {load_before} before and {load_average()} after, {time.perf_counter() - t0:.0f} s")
    print("ratio: median over rounds of lait/peer (clean: lait's time/peer's time); spread: of the per-round ratios")
    print()
    for line in table(results):
        print(line)
    print()
    for res in results:
        if res.pair:
            print(f"  {res.name}: {res.pair.stage}  vs  {res.pair.peer}")
    print()
    for res in results:
        print(f"ratio {res.name} {res.ratio:.2f}" if res.ratios else f"ratio {res.name} nan")
    return 1 if any(res.error.startswith("failed") for res in results) else 0


if __name__ == "__main__":
    sys.exit(main())
