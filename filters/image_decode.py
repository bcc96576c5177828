"""Safe, fast image decoding for stage 2.

Fetched bytes are hostile: zero bytes, HTML error pages served as `image/jpeg`, SVG, truncated
JPEGs, decompression bombs, CMYK, 16-bit and palette images, EXIF rotations, animations.
`open_image` reads only the header (format, size, frames, orientation) so that size rules reject
most images without decoding a pixel; `decode_small` decodes at reduced scale (Pillow's JPEG
`draft`: 1/2 to 1/8 inside libjpeg) which is all hashing needs; `encode_for_storage` decodes
fully only for the images that must be re-encoded. Every failure is an `ImageRejected` naming
its `filter/RULE`.
"""

from __future__ import annotations

import io
import math
import warnings
from dataclasses import dataclass, field

import numpy as np
from PIL import Image, UnidentifiedImageError

from lait.stage import Rejected

# EXIF orientation -> the transpose that shows the image upright.
_ORIENT = {
    2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM, 5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE, 8: Image.Transpose.ROTATE_90,
}
# What Pillow raises on damaged data; KeyError: a TIFF whose size tags are missing (fuzzing).
_DECODE_ERRORS = (OSError, ValueError, SyntaxError, EOFError, IndexError, TypeError, KeyError,
                  MemoryError, Image.DecompressionBombError)
# Requested size for reduced-scale decoding: phash works on 32x32, so libjpeg may scale down
# as far as it can (1/8) while the result stays at least this large.
DRAFT_SIZE = (32, 32)
NEAREST_SIDE = 64


class ImageRejected(Rejected):
    """An image that cannot or must not be used; `rule` is the `filter/RULE` name."""


@dataclass
class ImageHeader:
    """What the header says, before any pixel is decoded. Sizes are as displayed (EXIF applied)."""

    image: Image.Image
    format: str
    width: int
    height: int
    mode: str
    frames: int
    orientation: int
    data: bytes | memoryview = field(repr=False)  # as read: stage 2 reads views of its row group

    @property
    def pixels(self) -> int:
        return self.width * self.height


def sniff(data: bytes | memoryview, mime: str | None = None) -> tuple[str, str] | None:
    """(rule, detail) for bytes that are plainly not a raster image, else None."""
    if not data:
        return "empty", "zero bytes"
    head = bytes(data[:1024]).lstrip().lower()
    mime = (mime or "").lower()
    if "svg" in mime or head.startswith(b"<svg") or (head.startswith(b"<?xml") and b"<svg" in head):
        return "svg", "SVG is a vector format"
    if head.startswith((b"<!doctype", b"<html", b"<head", b"<body", b"<?xml", b"{", b"[")) or \
            b"<html" in head[:256]:
        return "not_an_image", f"markup or text served as {mime or 'an image'}"
    return None


def open_image(data: bytes | memoryview, *, max_pixels: int) -> ImageHeader:
    """Open an image reading its header only; raises ImageRejected."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data))
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise ImageRejected("decompression_bomb", str(exc)) from None
    except UnidentifiedImageError:
        raise ImageRejected("not_an_image", "no image format recognised") from None
    except _DECODE_ERRORS as exc:
        raise ImageRejected("not_an_image", f"{type(exc).__name__}: {exc}") from None
    w, h = img.size
    if w <= 0 or h <= 0:
        raise ImageRejected("corrupt", f"size {w}x{h}")
    if w * h > max_pixels:
        raise ImageRejected("decompression_bomb", f"{w}x{h} = {w * h} pixels > {max_pixels}")
    orientation = 1
    # getexif() parses the whole block; most images have none, and the check is free.
    if img.format in ("JPEG", "MPO", "TIFF", "WEBP", "PNG") and (img.format == "TIFF" or "exif" in img.info):
        try:
            orientation = int(img.getexif().get(0x0112, 1) or 1)
        except _DECODE_ERRORS:
            orientation = 1  # unreadable EXIF: show as stored
    if orientation in (5, 6, 7, 8):
        w, h = h, w
    try:  # counting a GIF's frames reads through them all: a cut one fails here, not in a rule
        frames = int(getattr(img, "n_frames", 1) or 1)
    except _DECODE_ERRORS as exc:
        rule = "truncated" if isinstance(exc, (EOFError, IndexError)) or "truncated" in str(exc).lower() else "corrupt"
        raise ImageRejected(rule, f"counting frames: {type(exc).__name__}: {exc}") from None
    return ImageHeader(img, img.format or "UNKNOWN", w, h, img.mode, frames, orientation, data)


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


def _upright(img: Image.Image, orientation: int) -> Image.Image:
    op = _ORIENT.get(orientation)
    return img.transpose(op) if op is not None else img


def _load(img: Image.Image) -> None:
    try:
        img.load()
    except _DECODE_ERRORS as exc:
        msg = f"{type(exc).__name__}: {exc}"
        rule = "truncated" if "truncated" in str(exc).lower() or isinstance(exc, EOFError) else "corrupt"
        raise ImageRejected(rule, msg) from None


@dataclass
class Preview:
    """The first frame, small and upright: `image` (RGB, 32 to 256 px) for hashes and
    classifiers, `nearest` (64x64 nearest-neighbour samples of the decoded pixels) for colour
    statistics that averaging would blur."""

    image: Image.Image
    nearest: Image.Image


def decode_small(header: ImageHeader) -> Preview:
    """Decode the first frame for hashing: reduced-scale where the codec can (JPEG draft)."""
    img = header.image
    raw_w, raw_h = img.size
    if img.format in ("JPEG", "MPO"):
        img.draft("RGB", DRAFT_SIZE)
    _load(img)
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
    return Preview(_upright(img, header.orientation), _upright(nearest, header.orientation))


def encode_for_storage(header: ImageHeader, *, keep_max_bytes: int, quality: int) -> tuple[bytes | memoryview, bool]:
    """(bytes to store, re-encoded?) - the original JPEG when it is usable as is, else a JPEG."""
    if (header.format == "JPEG" and header.mode in ("RGB", "L") and header.orientation == 1
            and len(header.data) <= keep_max_bytes):
        return header.data, False
    img = Image.open(io.BytesIO(header.data))  # a fresh decoder: the header one was drafted
    _load(img)
    img = _upright(to_rgb(img), header.orientation)
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=quality, subsampling=0 if quality >= 90 else 2)
    return buf.getvalue(), True
