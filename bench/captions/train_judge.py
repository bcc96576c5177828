"""Retrain the caption judge of stage 3 and write its weights (`filters/caption_judge.npz`).

Training rows: the `tune` half of labelled.json (the shared pages) and all of unseen.json
(trafilatura's evaluation pages, see README.md), each read as stage 3 reads it (`judge_data`:
stage 3 of this checkout with languages 'any', rules only). Never the held-out half. The
target is `junk` against `describes` and `page`. Deterministic: the same rows give the same
weights (full-batch gradient descent from zeros; MiniLM on the CPU).

    python bench/captions/train_judge.py [--unseen-pages /work/unseen-pages] [--out filters/caption_judge.npz]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
L2 = 300.0  # chosen among 3 to 1000 by the leave-site-out figures of bench_captions.py (see README.md)


def training_rows(data: Path, unseen_pages: Path) -> list[dict]:
    from judge_data import collect, labelled, rows_with_inputs, unseen

    shared = collect(data, languages=("any",))
    other = collect(data, pages_dir=unseen_pages, languages=("any",))
    a, missed_a = rows_with_inputs(labelled("tune"), shared)
    b, missed_b = rows_with_inputs(unseen(), other)
    print(f"training rows: {len(a)} of labelled.json tune ({missed_a} no longer candidates), "
          f"{len(b)} of unseen.json ({missed_b} not found)")
    return a + b


def fit_rows(rows: list[dict], l2: float = L2):
    import numpy as np

    from lait.filters.caption_judge import feature_matrix, fit
    from lait.models import load_sentence_encoder

    x = feature_matrix([r["input"] for r in rows], load_sentence_encoder("all-minilm-l6-v2"))
    y = np.asarray([r["label"] == "junk" for r in rows], np.float64)
    return fit(x, y, l2=l2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--unseen-pages", default="/work/unseen-pages", help="directory unseen_pages.py wrote")
    ap.add_argument("--out", default=str(REPO / "filters" / "caption_judge.npz"))
    ap.add_argument("--l2", type=float, default=L2)
    args = ap.parse_args()
    data = REPO.parent / "shared" / "data"
    if not (data / "html").is_dir() or not (Path(args.unseen_pages) / "index.json").is_file():
        sys.exit("need ../shared/data and the unseen pages (see README.md)")
    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(HERE))
    rows = training_rows(data, Path(args.unseen_pages))
    judge = fit_rows(rows, args.l2)
    judge.save(args.out, l2=args.l2, rows=len(rows), junk=sum(r["label"] == "junk" for r in rows))
    print(f"wrote {args.out}: {len(rows)} rows, {sum(r['label'] == 'junk' for r in rows)} junk, l2 {args.l2:g}")


if __name__ == "__main__":
    main()
