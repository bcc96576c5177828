"""How a local web's pool looks against its ground truth: its wrong pairs, and how well the pool's
scores rank them below the true ones (issue 34: can a score cut remove them at all?).

    .venv/bin/python bench/curation/pool_truth.py demo/work [--ground-truth demo/ground_truth.json] [--fraction 0.3]

Reads WORK/pool/ (every picture `lait build` kept, with its caption and score) and the ground
truth (`lait demo`'s, beside WORK by default). Prints the pool's size and wrong pairs (a caption
that neither is nor carries a true caption of its picture, as `lait.testkit.groundtruth` counts
them), the mean score of each kind, the AUC (the chance that a true pair outscores a wrong
one, ties counting half), the wrong pairs the score's top FRACTION holds and those a random
FRACTION is expected to hold, and the wrong captions by kind (a page sentence: more than four
words; else a junk alt) and source. A measurement, not a speed benchmark: nothing is timed.
"""

from __future__ import annotations

import argparse
import json
import math
from collections import Counter
from pathlib import Path

import numpy as np


def pool_rows(work: Path) -> list[dict]:
    import pyarrow.parquet as pq

    rows: list[dict] = []
    for part in sorted((work / "pool").glob("*.parquet")):
        rows += pq.read_table(part, columns=["image_url", "caption", "source", "score"]).to_pylist()
    return rows


def wrong_flags(rows: list[dict], truth: dict) -> np.ndarray:
    from lait.testkit.groundtruth import _norm, _path, true_captions

    caps = true_captions(truth, english=False)
    return np.array([not any(c in _norm(r["caption"]) for c in caps.get(_path(r["image_url"]), ())) for r in rows])


def auc(true_scores: np.ndarray, wrong_scores: np.ndarray) -> float:
    """P(a true pair's score > a wrong pair's), ties counting half (Mann-Whitney)."""
    if not len(true_scores) or not len(wrong_scores):
        return float("nan")
    diff = true_scores[:, None] - wrong_scores[None, :]
    return float(((diff > 0).sum() + 0.5 * (diff == 0).sum()) / diff.size)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("work", type=Path)
    parser.add_argument("--ground-truth", type=Path, default=None)
    parser.add_argument("--fraction", type=float, default=0.3)
    args = parser.parse_args(argv)
    truth_path = args.ground_truth or args.work.resolve().parent / "ground_truth.json"
    truth = json.loads(truth_path.read_text())
    rows = pool_rows(args.work)
    if not rows:
        print(f"{args.work}: the pool is empty")
        return 1
    wrong = wrong_flags(rows, truth)
    scores = np.array([r["score"] for r in rows], np.float64)
    # The score's top fraction as `top_fraction` ranks it: score descending, then URL.
    order = sorted(range(len(rows)), key=lambda i: (-scores[i], rows[i]["image_url"]))
    k = math.ceil(args.fraction * len(rows))
    print(f"pool {len(rows)} pictures, {int(wrong.sum())} wrong pairs ({wrong.mean():.1%})")
    if wrong.any() and not wrong.all():
        print(f"mean score: true {scores[~wrong].mean():.3f}, wrong {scores[wrong].mean():.3f}; "
              f"AUC (true above wrong) {auc(scores[~wrong], scores[wrong]):.4f}")
    print(f"top {args.fraction:.0%} by score: {k} pictures, {int(wrong[order[:k]].sum())} wrong; "
          f"a random {args.fraction:.0%}: {k * wrong.mean():.1f} wrong expected")
    kinds = Counter(("page sentence" if len(r["caption"].split()) > 4 else "junk alt") + f" ({r['source']})"
                    for r, w in zip(rows, wrong) if w)
    print("wrong captions: " + ", ".join(f"{n} {kind}" for kind, n in kinds.most_common()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
