"""Retrain the caption judge of stage 3 and write its weights (`filters/caption_judge.npz`).

Training rows: the `tune` half of labelled.json (the shared pages) and all of unseen.json
(trafilatura's evaluation pages, see README.md), each read as stage 3 reads it (`judge_data`:
stage 3 of this checkout with languages 'any', rules only). Never the held-out half. The
target is `junk` against `describes` and `page`; the embedding is `minilm-static` (MiniLM
distilled to static token vectors, `lait.models`).

The threshold is chosen on the training rows only: each gets its probability from a judge
trained without its site group (`INNER_FOLDS` groups by site), and the threshold is the
highest at which at most 4 % of the rows kept are junk (`caption_judge.choose_threshold`). The
same rule picks each fold's threshold in `bench_captions.py`, where the fold judged is never
among the rows. Deterministic: the same rows give the same weights and threshold.

    python bench/captions/train_judge.py [--unseen-pages /work/unseen-pages] [--out filters/caption_judge.npz]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
L2 = 300.0  # chosen by the leave-site-out figures of bench_captions.py (see README.md)
INNER_FOLDS = 5  # site groups of the out-of-fold probabilities the threshold is chosen on


def training_rows(data: Path, unseen_pages: Path) -> list[dict]:
    from judge_data import collect, labelled, rows_with_inputs, unseen

    shared = collect(data, languages=("any",))
    other = collect(data, pages_dir=unseen_pages, languages=("any",))
    a, missed_a = rows_with_inputs(labelled("tune"), shared)
    b, missed_b = rows_with_inputs(unseen(), other)
    print(f"training rows: {len(a)} of labelled.json tune ({missed_a} no longer candidates), "
          f"{len(b)} of unseen.json ({missed_b} not found)")
    return a + b


def site_fold(row: dict, folds: int) -> int:
    """The site group of a labelled row: all rows of a site are in one group."""
    import hashlib

    from judge_data import site_of_row

    return int(hashlib.sha1(site_of_row(row).encode()).hexdigest()[:8], 16) % folds


def features(rows: list[dict]):
    from lait.filters.caption_judge import ENCODER, feature_matrix
    from lait.models import load_sentence_encoder

    return feature_matrix([r["input"] for r in rows], load_sentence_encoder(ENCODER))


def fit_rows(rows: list[dict], l2: float = L2, x=None):
    """The judge trained on `rows` (features `x` when given), its threshold chosen on the rows'
    out-of-fold probabilities (leave-site-out over INNER_FOLDS groups)."""
    import numpy as np

    from lait.filters.caption_judge import choose_threshold, fit

    x = features(rows) if x is None else x
    y = np.asarray([r["label"] == "junk" for r in rows], np.float64)
    group = np.asarray([site_fold(r, INNER_FOLDS) for r in rows])
    p = np.zeros(len(rows))
    for k in range(INNER_FOLDS):
        test = group == k
        if test.any() and not test.all():
            p[test] = fit(x[~test], y[~test], l2=l2).p_junk_of_matrix(x[test])
    judge = fit(x, y, l2=l2)
    judge.threshold = choose_threshold(p, y == 1, np.asarray([r["asked"] for r in rows]))
    return judge


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
    print(f"wrote {args.out}: {len(rows)} rows, {sum(r['label'] == 'junk' for r in rows)} junk, l2 {args.l2:g}, "
          f"encoder {judge.encoder_name}, threshold {judge.threshold:g}")


if __name__ == "__main__":
    main()
