"""SemDeDup and MetaCLIP balancing at 10k, 100k and 1M items: time and peak memory, and how
the time grows against n log n (issue 34, acceptance 3).

    .venv/bin/python bench/curation/bench_curation.py [--sizes 10000,100000,1000000] [--dim 128]

Synthetic inputs, made before the clock starts: for SemDeDup (eps 0.07, clusters of at most
1,000, two passes as the shipped recipe), unit vectors (dim 128) of which 30 % are near-copies
(cosine about 0.995) of others; for balancing, captions naming 1 or 2 of the
1,000 shipped ImageNet class names (Zipf-distributed, 10 % naming none). Each measurement runs
in a process of its own; its peak memory is the rise of the process's peak RSS (VmHWM, reset
after the inputs are made) over its RSS then: what the step itself adds. The growth column
compares each size's time with the previous size's, against n log n's ratio. Sizes below 1M
run --repeats times and print their fastest run (a shared machine's load varies several-fold);
CPU s is the process's CPU time (all its threads), which other processes' load moves less.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]


def rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS (Linux)


def semdedup_inputs(n: int, dim: int, rng: np.random.Generator) -> np.ndarray:
    n_copies = int(0.3 * n)
    base = rng.standard_normal((n - n_copies, dim), dtype=np.float32)
    base /= np.linalg.norm(base, axis=1, keepdims=True)
    src = rng.integers(0, len(base), n_copies)
    copies = base[src] + rng.standard_normal((n_copies, dim), dtype=np.float32) * np.float32(0.1 / math.sqrt(dim))
    return np.concatenate([base, copies]).astype(np.float16)  # as image_embs/ holds them


def caption_inputs(n: int, rng: np.random.Generator) -> tuple[list[str], list[str], list[str]]:
    from lait.build.curate import RECIPE_DIR
    from lait.build.metaclip import read_metadata

    entries = read_metadata((RECIPE_DIR / "imagenet1k-classes.txt").read_text())
    weights = 1.0 / np.arange(1, len(entries) + 1) ** 1.1
    weights /= weights.sum()
    first = rng.choice(len(entries), n, p=weights)
    second = rng.choice(len(entries), n, p=weights)
    kind = rng.random(n)
    captions = [f"a photo of the {entries[a]}, seen at dusk" if k < 0.6 else
                f"{entries[a]} and {entries[b]} on a table." if k < 0.9 else "a nice view of the hills"
                for a, b, k in zip(first, second, kind)]
    uids = [f"{x:032x}" for x in rng.integers(0, 2**62, n)]
    return entries, captions, uids


def measure(what: str, n: int, dim: int) -> dict:
    """One measurement, in this process."""
    sys.path.insert(0, str(ROOT))
    rng = np.random.default_rng(0)
    if what == "semdedup":
        from lait.build.semdedup import semdedup

        emb = semdedup_inputs(n, dim, rng)
        semdedup(semdedup_inputs(20000, dim, rng), 0.07, cluster_size=1000)  # BLAS threads start (seconds)
        reset_peak()
        before = rss_kib("VmRSS")
        t0, c0 = time.perf_counter(), time.process_time()
        res = semdedup(emb, 0.07, cluster_size=1000, passes=2)  # as the shipped recipe
        seconds = time.perf_counter() - t0
        unique = n - int(0.3 * n)
        extra = {"kept": int(res.keep.sum()), "clusters": res.n_clusters,
                 "planted copies kept": f"{(res.keep.sum() - unique) / (n - unique):.2%}"}
    else:
        from lait.build.metaclip import Matcher, balance, match_all, uid_keys

        entries, captions, uids = caption_inputs(n, rng)
        warm = caption_inputs(1000, rng)
        balance(1000, uid_keys(warm[2]), *match_all(Matcher(entries), warm[1]), len(entries), 1000)
        reset_peak()
        before = rss_kib("VmRSS")
        t0, c0 = time.perf_counter(), time.process_time()
        pairs, ids = match_all(Matcher(entries), captions)
        t_match = time.perf_counter() - t0
        b = balance(n, uid_keys(uids), pairs, ids, len(entries), 1000)
        seconds = time.perf_counter() - t0
        extra = {"kept": int(b.keep.sum()), "match_s": round(t_match, 2), "entries_over_t": int((b.counts > 1000).sum())}
    cpu = time.process_time() - c0
    peak = rss_kib("VmHWM")
    return {"what": what, "n": n, "seconds": seconds, "cpu": cpu, "peak_mib": (peak - before) / 1024, "rss_mib": peak / 1024,
            **extra}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10000,100000,1000000")
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3, help="runs per size below 1M; the fastest is printed")
    ap.add_argument("--one", nargs=2, metavar=("WHAT", "N"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(measure(args.one[0], int(args.one[1]), args.dim)))
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"bench/curation {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, dim {args.dim}, "
          f"load average {' '.join(f'{x:.1f}' for x in __import__('os').getloadavg())}")
    print(f"{'step':<10} {'n':>9} {'time s':>8} {'CPU s':>8} {'peak MiB':>9} {'RSS MiB':>8} {'growth':>7} "
          f"{'CPU gr.':>7} {'n log n':>8}  notes")
    for what in ("semdedup", "balance"):
        prev = None
        for n in sizes:
            runs = []
            for _ in range(args.repeats if n < 1_000_000 else 1):  # 1M: minutes a run
                out = subprocess.run([sys.executable, __file__, "--dim", str(args.dim), "--one", what, str(n)],
                                     capture_output=True, text=True, check=True)
                runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
            r = min(runs, key=lambda x: x["seconds"])  # the least disturbed by the machine's other work
            r["runs"] = len(runs)
            growth = cpu_growth = nlogn = ""
            if prev is not None:
                growth = f"{r['seconds'] / prev['seconds']:.1f}x"
                cpu_growth = f"{r['cpu'] / prev['cpu']:.1f}x"
                nlogn = f"{n * math.log(n) / (prev['n'] * math.log(prev['n'])):.1f}x"
            notes = ", ".join(f"{k} {v}" for k, v in r.items()
                              if k not in ("what", "n", "seconds", "cpu", "peak_mib", "rss_mib"))
            print(f"{what:<10} {n:>9,} {r['seconds']:>8.2f} {r['cpu']:>8.2f} {r['peak_mib']:>9.0f} "
                  f"{r['rss_mib']:>8.0f} {growth:>7} {cpu_growth:>7} {nlogn:>8}  {notes}", flush=True)
            prev = r


if __name__ == "__main__":
    main()
