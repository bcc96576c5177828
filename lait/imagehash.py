"""The perceptual hash of an image, one function for every stage that compares them.

Stage 2 hashes every kept image into `images_ok.phash`; stage 5 hashes the images of an
evaluation set to find their copies in the training pool (`lait.build.decon`). Two hashes are
comparable only when both went through the same decode and the same arithmetic, so both live
here: `reduced_preview` (the first frame, decoded at reduced scale where the codec can, upright,
RGB) and `phash_of` (imagehash.phash's 64 bits).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

# EXIF orientation -> the transpose that shows the image upright.
ORIENT = {
    2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM, 5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE, 8: Image.Transpose.ROTATE_90,
}
# Requested size for reduced-scale decoding: phash works on 32x32, so libjpeg may scale down
# as far as it can (1/8) while the result stays at least this large.
DRAFT_SIZE = (32, 32)
NEAREST_SIDE = 64


def exif_orientation(img: Image.Image) -> int:
    """The EXIF orientation tag (1: as stored); an unreadable block counts as none."""
    # getexif() parses the whole block; most images have none, and the check is free.
    if img.format in ("JPEG", "MPO", "TIFF", "WEBP", "PNG") and (img.format == "TIFF" or "exif" in img.info):
        try:
            return int(img.getexif().get(0x0112, 1) or 1)
        except Exception:  # noqa: BLE001 - a damaged EXIF block: show the image as stored
            return 1
    return 1


def to_rgb(img: Image.Image) -> Image.Image:
    """RGB for any mode: alpha over white, palette expanded, CMYK converted, 16-bit scaled."""
    if img.mode == "RGB":
        return img
    if img.mode in ("I;16", "I;16B", "I;16L", "I;16N", "I"):
        arr = np.asarray(img.convert("I"), dtype=np.int64) if img.mode != "I" else np.asarray(img, np.int64)
        top = 65535 if img.mode.startswith("I;16") or arr.max(initial=0) > 255 else 255
        return Image.fromarray((np.clip(arr, 0, top) * 255 // top).astype(np.uint8), "L").convert("RGB")
    if img.mode == "F":
        arr = np.nan_to_num(np.asarray(img, np.float32))
        lo, hi = float(arr.min(initial=0)), float(arr.max(initial=1))
        arr = (arr - lo) * (255.0 / (hi - lo or 1.0))
        return Image.fromarray(arr.astype(np.uint8), "L").convert("RGB")
    if img.mode in ("RGBA", "LA", "PA", "RGBa", "La") or (img.mode == "P" and "transparency" in img.info):
        rgba = img.convert("RGBA")
        bg = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(bg, rgba).convert("RGB")
    return img.convert("RGB")


def upright(img: Image.Image, orientation: int) -> Image.Image:
    op = ORIENT.get(orientation)
    return img.transpose(op) if op is not None else img


@dataclass
class Preview:
    """The first frame, small and upright: `image` (RGB, 32 to 256 px) for hashes and
    classifiers, `nearest` (64x64 nearest-neighbour samples of the decoded pixels) for colour
    statistics that averaging would blur."""

    image: Image.Image
    nearest: Image.Image


def reduced_preview(img: Image.Image, orientation: int,
                    load: Callable[[Image.Image], None] = Image.Image.load) -> Preview:
    """Decode `img` (opened, not loaded) for hashing: reduced-scale where the codec can (JPEG
    draft). `load` decodes the pixels (stage 2 passes one that names its rejection)."""
    raw_w, raw_h = img.size
    if img.format in ("JPEG", "MPO"):
        img.draft("RGB", DRAFT_SIZE)
    load(img)
    img = to_rgb(img)
    nearest = img.resize((NEAREST_SIDE, NEAREST_SIDE), Image.Resampling.NEAREST)
    if max(img.size) > 256:
        # Formats without reduced-scale decoding: shrink before hashing, cheaply.
        factor = min(8, max(1, min(img.size) // DRAFT_SIZE[0]))
        img = img.reduce(factor) if factor > 1 else img
    scale = 1 << max(0, round(math.log2(raw_w / img.size[0])))
    if scale > 1 and (img.size[0] * scale != raw_w or img.size[1] * scale != raw_h):
        # A reduced decode rounds its size up; the last row/column covers a partial block.
        # Dropping it keeps the geometry of two resizes of one picture aligned for hashing.
        img = img.crop((0, 0, max(1, raw_w // scale), max(1, raw_h // scale)))
    return Preview(upright(img, orientation), upright(nearest, orientation))


def _dct_rows(n: int = 32, keep: int = 8) -> np.ndarray:
    k = np.arange(keep)[:, None]
    x = np.arange(n)[None, :]
    return 2.0 * np.cos(np.pi * k * (2 * x + 1) / (2 * n))  # scipy's unnormalised DCT-II rows


_DCT8 = _dct_rows()


def phash_of(image: Any) -> int:
    """imagehash.phash's 64 bits (grey 32x32 Lanczos, 2-D DCT-II, low 8x8 above their median),
    with the 8 needed DCT rows as one small matrix product instead of scipy's full transform."""
    pixels = np.asarray(image.convert("L").resize((32, 32), Image.Resampling.LANCZOS), np.float64)
    low = (_DCT8 @ pixels @ _DCT8.T).reshape(-1)
    # np.median of 64 values is the mean of the middle two; sorting 64 floats is ~20x cheaper
    # than np.median's general machinery, and (a + b) / 2 is the same float np.median returns.
    middle = np.sort(low)[31:33]
    bits = low > (middle[0] + middle[1]) / 2
    return int.from_bytes(np.packbits(bits).tobytes(), "big")
