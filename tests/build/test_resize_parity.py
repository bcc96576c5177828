"""lait's resizer against img2dataset's on the same real photos, pixel by pixel.

img2dataset lives in its own virtual environment (it pins old webdataset and pandas), built
from PyPI on first use by tests/build/conftest.py (`img2dataset_python`); the tests skip when it
cannot be built. tests/build/img2dataset_resizer.py runs img2dataset's own `Resizer` there.

Both sides write PNG (lossless), so the comparison sees the resized pixels themselves. Measured
with img2dataset 1.47.0 (OpenCV 4.14, albumentations 1.4.24) on the 87 photos of
../shared/data/photos: since lait resizes with OpenCV too (issue 35), every pixel of every mode
equals img2dataset's, shrinking to 256 and enlarging to 400 (with lait's own numpy resampler
before, keep_ratio/center_crop differed by 1 on 0.2 % of pixels and enlarging on 4-5 %). The
tests allow 1 level: the decoders (Pillow's and OpenCV's libjpeg builds) may differ elsewhere. The same
comparison on the shards of `lait demo` and of the real-web mode is in
tests/build/test_shards_ecosystem.py.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from lait.build.resize import ImageOptions, prepare

MODES = ["keep_ratio", "center_crop", "border", "keep_ratio_largest"]


def max_difference(photos: list[Path], size: int, only_if_bigger: bool, ref: dict[str, np.ndarray]) -> dict:
    worst = {}
    for mode in MODES:
        opts = ImageOptions(mode, size, only_if_bigger, "png", 1)
        diffs = []
        for i, path in enumerate(photos):
            raw = path.read_bytes()
            with Image.open(io.BytesIO(raw)) as im:
                w, h = im.size
            out = prepare(raw, "JPEG", w, h, opts)
            mine = np.asarray(Image.open(io.BytesIO(out.data)).convert("RGB"), np.int16)
            other = ref[f"{mode}/{i}"].astype(np.int16)
            assert mine.shape == other.shape, (path.name, mode, mine.shape, other.shape)
            diffs.append(int(np.abs(mine - other).max()))
        worst[mode] = max(diffs)
    return worst


@pytest.mark.slow
def test_shrinking_matches_img2dataset(img2dataset_resize, shared_data):
    photos = sorted((shared_data / "photos").glob("*/*.jpg"))
    ref = img2dataset_resize(photos, MODES, 256, False)
    worst = max_difference(photos, 256, False, ref)
    print("max pixel difference, shrinking to 256:", worst)
    assert max(worst.values()) <= 1, worst


@pytest.mark.slow
def test_enlarging_and_only_if_bigger_match_img2dataset(img2dataset_resize, shared_data):
    photos = sorted((shared_data / "photos" / "misc").glob("*.jpg"))  # 123 to 535 px: some enlarge
    ref = img2dataset_resize(photos, MODES, 400, False)
    worst = max_difference(photos, 400, False, ref)
    print("max pixel difference, to 400 (enlarging the small ones):", worst)
    assert max(worst.values()) <= 1, worst
    ref = img2dataset_resize(photos, MODES, 400, True)
    assert max(max_difference(photos, 400, True, ref).values()) <= 1
