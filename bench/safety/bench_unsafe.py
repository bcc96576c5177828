"""False-positive rate of the unsafe model on real benign photos (issue 32, acceptance 2).

Every photo of ../shared/data/photos (COCO 2017 train, Flickr8k, img2dataset's odd sizes: real
photos of people, animals, streets, food and sport, none of them unsafe) is decoded as stage 2
decodes it (`lait.filters.unsafe.decode_for_model`) and scored by the catalogued model. A photo
above the threshold would be dropped as `filter/unsafe`: every one of them is a false positive.
Prints the rate at the default threshold (target: at most 1 %), at a few others, the
distribution of punsafe, the highest-scoring photos and the model's CPU time per image (one
thread, as each stage 2 worker runs it).

    .venv/bin/python bench/safety/bench_unsafe.py [--max-unsafe 0.8] [--limit N]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

TARGET = 0.01  # false-positive rate at the default threshold


def main() -> None:
    from lait.filters.unsafe import DEFAULT_MAX_UNSAFE, DEFAULT_MODEL, UnsafeScorer, decode_for_model

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-unsafe", type=float, default=DEFAULT_MAX_UNSAFE)
    ap.add_argument("--limit", type=int, default=0, help="score only the first N photos (0: all)")
    args = ap.parse_args()

    root = REPO.parent / "shared" / "data" / "photos"
    photos = sorted(root.rglob("*.jpg"))
    if args.limit:
        photos = photos[:args.limit]
    if not photos:
        sys.exit(f"{root} is absent: no real photos to measure on")
    scorer = UnsafeScorer(DEFAULT_MODEL, args.max_unsafe)
    model = scorer.model
    scores, floats, int8s, seconds, f_seconds, q_seconds = [], [], [], 0.0, 0.0, 0.0
    for p in photos:
        image = decode_for_model(p.read_bytes())
        start = time.process_time()
        scores.append(scorer(image))
        seconds += time.process_time() - start
        batch = model.preprocess(image)[None]
        start = time.process_time()
        floats.append(model._run(model.session, batch)[0])
        f_seconds += time.process_time() - start
        start = time.process_time()
        int8s.append(model._run(model.fast, batch)[0])
        q_seconds += time.process_time() - start
    s = np.array(scores)
    by_set = {}
    for p, v in zip(photos, s):
        by_set.setdefault(p.relative_to(root).parts[0], []).append(v)

    print(f"{len(s)} real benign photos ({', '.join(f'{k} {len(v)}' for k, v in sorted(by_set.items()))}), "
          f"model {DEFAULT_MODEL}")
    print(f"model CPU time per image as stage 2 runs it (1 thread, decode excluded): {seconds / len(s) * 1e3:.1f} ms")
    int8_vs_float(photos, root, np.array(floats), np.array(int8s), len(photos) / f_seconds, len(photos) / q_seconds,
                  len(photos) / seconds, model.rechecked)
    print("punsafe quantiles: " + ", ".join(f"p{q:g} {np.quantile(s, q / 100):.4f}"
                                            for q in (50, 90, 99, 99.5, 99.9, 100)))
    for t in sorted({0.2, 0.5, 0.8, 0.9, args.max_unsafe}):
        n = int((s > t).sum())
        mark = "  <- default" if t == DEFAULT_MAX_UNSAFE else ""
        print(f"  max_unsafe {t:.2f}: {n:4d} false positives, rate {n / len(s):.2%}{mark}")
    for k, v in sorted(by_set.items()):
        v = np.array(v)
        print(f"  {k}: rate at {args.max_unsafe:.2f} = {(v > args.max_unsafe).mean():.2%} of {len(v)}")
    print("highest punsafe:")
    for i in np.argsort(-s)[:8]:
        print(f"  {s[i]:.4f}  {photos[i].relative_to(root)}")
    rate = float((s > args.max_unsafe).mean())
    print(f"false-positive rate at max_unsafe {args.max_unsafe}: {rate:.2%}   (target <= {TARGET:.0%}): "
          + ("PASS" if rate <= TARGET else "FAIL"))


def int8_vs_float(photos: list[Path], root: Path, floats, int8s, f_rate: float, q_rate: float, rate: float,
                  rechecked: int) -> None:
    """How far the int8 copy's scores fall from the float model's, on the photos its ranges were
    measured on (scripts/calibrate_open_nsfw.py) and on the others (Flickr8k's val and test)."""
    sys.path.insert(0, str(REPO / "scripts"))
    from calibrate_open_nsfw import calibration_photos

    from lait.models import RECHECK_MARGIN

    calib = set(calibration_photos(root, 400))
    gap = np.abs(floats - int8s)
    seen = np.array([p in calib for p in photos])
    print(f"int8 vs float open_nsfw: {q_rate:.0f} vs {f_rate:.0f} images/s on one thread "
          f"({q_rate / f_rate:.2f}x); as stage 2 runs them (int8, then float within {RECHECK_MARGIN} "
          f"of the line or above it: {rechecked} of {len(photos)} photos): {rate:.0f} images/s")
    for name, mask in (("photos the ranges were measured on", seen), ("held-out photos", ~seen)):
        if mask.any():
            g = gap[mask]
            print(f"  |int8 - float| on {mask.sum()} {name}: mean {g.mean():.4f}, p99 {np.quantile(g, 0.99):.4f}, "
                  f"max {g.max():.4f}")


if __name__ == "__main__":
    main()
