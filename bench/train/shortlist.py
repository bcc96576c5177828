"""Shortlist evaluation (faiss top-k by embedding, then ITM re-ranking) beside full ITM scoring.

    python bench/train/shortlist.py --checkpoint ft/checkpoints/stage-0-ft.pt --shards test/ [--k 10]
    python bench/train/shortlist.py            # trains a small model on generated scenes first

Prints both modes' seconds and recalls, the speed-up, and the R@1 differences.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def train_small(tmp: Path) -> tuple[str, str]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "train"))
    from test_learning import learn  # the learning test's recipe: pretrain + finetune on scenes

    learn(tmp)
    return str(tmp / "ft" / "checkpoints" / "stage-0-ft.pt"), str(tmp / "test")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint")
    ap.add_argument("--shards")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--limit", type=int)
    ap.add_argument("--device", default="auto")
    args = ap.parse_args()

    from lait.train.config import EvalConfig
    from lait.train.evaluate import run_eval

    ckpt, shards = args.checkpoint, args.shards
    if not ckpt:
        ckpt, shards = train_small(Path(tempfile.mkdtemp(prefix="lait-bench-shortlist-")))
    full = run_eval(EvalConfig(checkpoint=ckpt, shards=shards, mode="full", limit=args.limit, device=args.device))
    short = run_eval(EvalConfig(checkpoint=ckpt, shards=shards, mode="shortlist", shortlist_k=args.k, limit=args.limit, device=args.device))
    for r in (full, short):
        print(f"{r['mode']:13s} {r['seconds']:7.2f} s  pairs {r['itm_pairs_scored']:7d}  "
              + "  ".join(f"{k} {r[k]:.3f}" for k in ("i2t_r1", "i2t_r5", "i2t_r10", "t2i_r1", "t2i_r5", "t2i_r10", "rsum")))
    print(f"speed-up shortlist/full {full['seconds'] / short['seconds']:.2f}x; "
          f"R@1 difference (shortlist - full): i2t {short['i2t_r1'] - full['i2t_r1']:+.3f}, t2i {short['t2i_r1'] - full['t2i_r1']:+.3f}")
    print(json.dumps({"full": full, "shortlist": short}))


if __name__ == "__main__":
    main()
