"""The pixel check of stage 5's duplicate grouping: two images with different bytes are one
picture only when their small colour thumbnails agree everywhere.

A 64-bit perceptual hash is a proposal, not evidence: it keeps the signs of 64 low DCT
coefficients of a grey 32x32 copy, so flat synthetic pictures (a shape on a plain or patterned
background) collide. On the demo web, distinct pictures sit 0 to 2 bits apart, as close as a
resized copy of one photo. Embeddings are no better evidence: a weak scorer crowds distinct
photos together. So the pixels decide: both images are decoded, box-shrunk to `SIDE` x `SIDE`
RGB, the second scaled to the first's mean brightness (a brightened copy is still the photo),
and no cell may differ by more than `max_diff` (mean over RGB, 0-255). The largest cell, not
the mean: a shape present in one picture only changes a few cells, which a mean over a plain
background dilutes to the level of JPEG noise.

Measured with 16 x 16 cells: resized, recompressed and brightened copies of real photos (80 COCO
and 1,500 Flickr8k photos; copies at 50-92 % size, JPEG quality 50-85, PNG, brightness x1.08)
differ by at most 20.9, those of the demo web by at most 10.4; distinct demo pictures by at least
27.8 whatever their phash distance (48.7 for those within 2 bits), distinct real photos with
phashes within 16 bits by at least 63.

Only the images of proposed pairs are decoded, their bytes read from `images_ok/` one row group
at a time.
"""

from __future__ import annotations

import io
import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from lait import storage
from lait.workdir import WorkDir

log = logging.getLogger(__name__)

SIDE = 16
MAX_GAIN = 2.0  # brightness scaled by more than this is not a copy of the same photo


def thumbnail(data: bytes) -> np.ndarray | None:
    """`SIDE` x `SIDE` x 3 uint8 box-filtered thumbnail (768 bytes), or None when the bytes do not decode."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as im:
            im.draft("RGB", (SIDE * 8, SIDE * 8))  # JPEG: decode at a reduced scale, enough for 16 px
            rgb = im.convert("RGB")
            return np.asarray(rgb.resize((SIDE, SIDE), Image.Resampling.BOX), np.uint8)
    except Exception:  # noqa: BLE001 - an undecodable image is no evidence of anything
        return None


def pixel_diff(a: np.ndarray, b: np.ndarray) -> float:
    """The largest difference of one thumbnail cell (mean over RGB, 0-255) after scaling `b` to
    `a`'s brightness: a shape that is in one picture and not in the other shows in its cells,
    where a mean over the whole picture would dilute it in a plain background."""
    a, b = a.astype(np.float32), b.astype(np.float32)
    ma, mb = float(a.mean()), float(b.mean())
    gain = 1.0 if ma < 1.0 or mb < 1.0 else min(max(ma / mb, 1 / MAX_GAIN), MAX_GAIN)
    return float(np.abs(a - np.clip(b * gain, 0, 255)).mean(axis=2).max())


def pixel_diffs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """`pixel_diff` of stacks of thumbnails at once (`a` and `b` broadcast over their leading axes)."""
    a, b = a.astype(np.float32), b.astype(np.float32)
    ma, mb = a.mean(axis=(-3, -2, -1), keepdims=True), b.mean(axis=(-3, -2, -1), keepdims=True)
    gain = np.where((ma < 1.0) | (mb < 1.0), 1.0, np.clip(ma / np.maximum(mb, 1.0), 1 / MAX_GAIN, MAX_GAIN))
    return np.abs(a - np.clip(b * gain, 0, 255)).mean(axis=-1).max(axis=(-2, -1))


def read_thumbnails(work: WorkDir, places: dict[int, tuple[str, int, int]],
                    decode: Callable[[bytes], np.ndarray | None] = thumbnail) -> dict[int, np.ndarray]:
    """Thumbnails (`decode` of the bytes) of the images at `places` (index -> (part file name,
    row group, row) in `images_ok/`), reading each row group's bytes once. Undecodable images
    are left out."""
    by_group: dict[tuple[str, int], list[tuple[int, int]]] = defaultdict(list)
    for i, (src, rg, row) in places.items():
        by_group[(src, rg)].append((row, i))
    folder = work.table_dir("images_ok")
    out: dict[int, np.ndarray] = {}
    for (src, rg), rows in sorted(by_group.items()):
        column = storage.parquet_file(folder / src).read_row_group(rg, columns=["bytes"]).column(0)
        for row, i in rows:
            t = decode(column[row].as_py() or b"")
            if t is not None:
                out[i] = t
    return out


class PixelCheck:
    """`lait.build.dedup.SamePicture` over `images_ok/`: `places[i]` is where image i's bytes
    lie (part file name, row group, row). An image that does not decode confirms nothing."""

    def __init__(self, work: WorkDir, places: Sequence[tuple[str, int, int]], max_diff: float):
        self.work, self.places, self.max_diff = work, places, max_diff
        self.thumbs: dict[int, np.ndarray] = {}
        self.confirmed = self.refused = 0

    def load(self, indices: Iterable[int]) -> None:
        self.thumbs.update(read_thumbnails(self.work, {i: self.places[i] for i in indices if i not in self.thumbs}))

    def same(self, a: int, b: int) -> bool:
        ta, tb = self.thumbs.get(a), self.thumbs.get(b)
        ok = ta is not None and tb is not None and pixel_diff(ta, tb) <= self.max_diff
        self.confirmed += ok
        self.refused += not ok
        return ok
