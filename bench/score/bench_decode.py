"""Stage 4's CPU decoder beside the one it replaced, in one process, alternating rounds.

    python bench/score/bench_decode.py [--rounds 5] [--copies 3]

Data: the 640 px COCO photos of ../shared/data/photos/coco_train (each decoded `--copies` times).
Both sides make ViT-B-32's 224 px input on one core (one OpenCV and one torch thread):

- lait now: `ImageDecoder(fast_decode=True)`: OpenCV decode (DCT-scaled only while still twice
  the input), the eval transform's antialiased bicubic resize by torch's uint8 kernel, crop,
  the planes interleaved by OpenCV;
- before (main at 9aefb50): Pillow's `draft` to twice the input, then open_clip's eval
  transform (torchvision on Pillow), as `ImageDecoder.decode_one` did.

Prints images per CPU-second of each, their ratio (target >= 2.0, issue 46), and how close the
two outputs are (mean absolute pixel difference; both are open_clip's transform up to filters).
`pairs()` yields the same for `bench/all.py` (row `decode`).
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from contextlib import contextmanager  # noqa: E402

from pairs import Pair  # noqa: E402

from lait.scoring.decode import ImageDecoder  # noqa: E402

TARGET = 2.0
CFG = {"size": 224, "mode": "RGB", "mean": (0.48145466, 0.4578275, 0.40821073),
       "std": (0.26862954, 0.26130258, 0.27577711), "interpolation": "bicubic", "resize_mode": "shortest",
       "fill_color": 0}


class PreviousDecoder(ImageDecoder):
    """The decoder as it was before issue 46: Pillow, draft to twice the input, open_clip's transform."""

    def decode_one(self, data: bytes) -> np.ndarray:
        from PIL import Image

        img = Image.open(io.BytesIO(data))
        if img.format == "JPEG":
            img.draft("RGB", (2 * self.geometry.width, 2 * self.geometry.height))
        img.load()
        return np.asarray(self._pil_transform()(img.convert("RGB")), dtype=np.uint8)


def rate(decoder: ImageDecoder, data: list[bytes]) -> float:
    start = time.process_time()
    for d in data:
        decoder.decode_one(d)
    return len(data) / (time.process_time() - start)


def photos_or_exit(copies: int) -> list[bytes]:
    photos = REPO.parent / "shared" / "data" / "photos" / "coco_train"
    if not photos.is_dir():
        sys.exit(f"skipped: {photos} is not present (a fresh clone has no ../shared)")
    return [p.read_bytes() for p in sorted(photos.glob("*.jpg"))] * copies


def one_thread() -> None:
    import cv2
    import torch

    cv2.setNumThreads(1)
    torch.set_num_threads(1)


@contextmanager
def pairs(quick: bool = False):
    """lait's CPU decoder beside the one it replaced, one core each (both in this process)."""
    one_thread()
    data = photos_or_exit(1)[: 16 if quick else None]
    now, before = ImageDecoder(CFG), PreviousDecoder(CFG)
    rate(now, data[:4]), rate(before, data[:4])
    yield [Pair("decode", f"stage 4's CPU decoder to 224 px, one core, {len(data)} COCO photos",
                "the decoder before issue 46 (Pillow draft + open_clip's transform)", "img/CPU-s", TARGET,
                lambda: rate(now, data), lambda: rate(before, data))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--copies", type=int, default=3)
    args = ap.parse_args()
    data = photos_or_exit(args.copies)
    one_thread()
    now, before = ImageDecoder(CFG), PreviousDecoder(CFG)
    rate(now, data[:8]), rate(before, data[:8])  # warm-up: imports, the transform
    ours, theirs = [], []
    for _ in range(args.rounds):
        ours.append(rate(now, data))
        theirs.append(rate(before, data))
    diff = np.mean([np.abs(now.decode_one(d).astype(int) - before.decode_one(d).astype(int)).mean()
                    for d in data[: len(data) // args.copies]])
    a, b = statistics.median(ours), statistics.median(theirs)
    print(f"{len(data)} decodes of {len(data) // args.copies} photos a round, one core, {args.rounds} rounds")
    print(f"lait now  (OpenCV + torch uint8 resize): {a:7.1f} img per CPU-s  rounds {[round(x) for x in ours]}")
    print(f"before    (Pillow draft + open_clip):    {b:7.1f} img per CPU-s  rounds {[round(x) for x in theirs]}")
    print(f"ratio now / before: {a / b:.2f}  (target >= {TARGET})   mean |pixel difference| {diff:.3f} levels")


if __name__ == "__main__":
    main()
