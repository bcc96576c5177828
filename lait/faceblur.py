"""Faces blurred when shards are written, as DataComp blurred its pool (issue 32).

In the core: stage 5 blurs the faces its search found in each picture it ships, and searches the
blurred picture again, until the detector finds no face above its threshold in what it writes
(`lait.build.faces`); the report blurs thumbnails with it.

Boxes are `face_bboxes` ([x0, y0, x1, y1] normalised, img2dataset's form). Here each box is widened by a fifth of its size on every side, since detectors box the
face from brow to chin and leave forehead, hair and ears out, and the pixels inside are replaced
by a Gaussian blur strong enough that the detector finds no face there again (tested on real
photos: tests/filters/test_faces.py). The picture is blurred as it ships, after any resize,
where it was searched, so the boxes in the sample's JSON describe it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

MARGIN = 0.2  # of the box's width and height, added on each side


def pixel_box(box: Sequence[float], width: int, height: int) -> tuple[int, int, int, int] | None:
    """The widened box in whole pixels, clipped to the image; None when nothing is left."""
    x0, y0, x1, y1 = (float(v) for v in box)
    mx, my = (x1 - x0) * MARGIN, (y1 - y0) * MARGIN
    # Rounded first, so that float noise (0.55 * 200 = 110.00000000000001) adds no pixel.
    left, top = max(0, int(np.floor(round((x0 - mx) * width, 6)))), max(0, int(np.floor(round((y0 - my) * height, 6))))
    right = min(width, int(np.ceil(round((x1 + mx) * width, 6))))
    bottom = min(height, int(np.ceil(round((y1 + my) * height, 6))))
    return (left, top, right, bottom) if right > left and bottom > top else None


def blur_faces(pixels: np.ndarray, boxes: Sequence[Sequence[float]]) -> tuple[np.ndarray, int]:
    """(RGB pixels with every face box blurred, how many boxes were blurred). The input is not changed."""
    from PIL import Image, ImageFilter

    height, width = pixels.shape[:2]
    out = None
    blurred = 0
    for box in boxes:
        px = pixel_box(box, width, height)
        if px is None:
            continue
        if out is None:
            out = Image.fromarray(pixels, "RGB")
        left, top, right, bottom = px
        # A radius of a quarter of the face's side leaves its colours and no features.
        radius = max(2.0, max(right - left, bottom - top) / 4)
        out.paste(out.crop(px).filter(ImageFilter.GaussianBlur(radius)), (left, top))
        blurred += 1
    return (pixels if out is None else np.asarray(out, np.uint8)), blurred
