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
import warnings
from dataclasses import dataclass, field

from PIL import Image, UnidentifiedImageError

# DRAFT_SIZE, NEAREST_SIDE, Preview and to_rgb keep their stage-2 names here for its other modules.
from lait.imagehash import (  # noqa: F401
    DRAFT_SIZE,
    NEAREST_SIDE,
    Preview,
    exif_orientation,
    reduced_preview,
    to_rgb,
    upright,
)
from lait.rules import Rejected

# What Pillow raises on damaged data; KeyError: a TIFF whose size tags are missing (fuzzing).
_DECODE_ERRORS = (OSError, ValueError, SyntaxError, EOFError, IndexError, TypeError, KeyError,
                  MemoryError, Image.DecompressionBombError)


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
    orientation = exif_orientation(img)
    if orientation in (5, 6, 7, 8):
        w, h = h, w
    try:  # counting a GIF's frames reads through them all: a cut one fails here, not in a rule
        frames = int(getattr(img, "n_frames", 1) or 1)
    except _DECODE_ERRORS as exc:
        rule = "truncated" if isinstance(exc, (EOFError, IndexError)) or "truncated" in str(exc).lower() else "corrupt"
        raise ImageRejected(rule, f"counting frames: {type(exc).__name__}: {exc}") from None
    return ImageHeader(img, img.format or "UNKNOWN", w, h, img.mode, frames, orientation, data)


def _load(img: Image.Image) -> None:
    try:
        img.load()
    except _DECODE_ERRORS as exc:
        msg = f"{type(exc).__name__}: {exc}"
        rule = "truncated" if "truncated" in str(exc).lower() or isinstance(exc, EOFError) else "corrupt"
        raise ImageRejected(rule, msg) from None


def decode_small(header: ImageHeader) -> Preview:
    """Decode the first frame for hashing: reduced-scale where the codec can (JPEG draft); the
    decode is `lait.imagehash`'s, so that stage 5 hashes other images the same way."""
    return reduced_preview(header.image, header.orientation, load=_load)


def decode_for_pdq(header: ImageHeader) -> Image.Image:
    """The upright RGB picture at about the 512 px PDQ hashes at (JPEG: a reduced-scale decode
    of at least that), from a decoder of its own: the header's was drafted smaller."""
    img = Image.open(io.BytesIO(header.data))
    if img.format == "JPEG":
        img.draft("RGB", (512, 512))
    _load(img)
    return upright(to_rgb(img), header.orientation)


def encode_for_storage(header: ImageHeader, *, keep_max_bytes: int, quality: int) -> tuple[bytes | memoryview, bool]:
    """(bytes to store, re-encoded?) - the original JPEG when it is usable as is, else a JPEG."""
    if (header.format == "JPEG" and header.mode in ("RGB", "L") and header.orientation == 1
            and len(header.data) <= keep_max_bytes):
        return header.data, False
    img = Image.open(io.BytesIO(header.data))  # a fresh decoder: the header one was drafted
    _load(img)
    img = upright(to_rgb(img), header.orientation)
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=quality, subsampling=0 if quality >= 90 else 2)
    return buf.getvalue(), True
