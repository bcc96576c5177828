"""lait's resizer against img2dataset's on the same real photos, pixel by pixel.

img2dataset lives in its own virtual environment (it pins old webdataset and pandas). The test
looks for its Python in $LAIT_IMG2DATASET_PYTHON, else /tmp/i2d/bin/python, and skips without
it; make one with

    python3 -m venv /tmp/i2d && /tmp/i2d/bin/pip install img2dataset

Both sides write PNG (lossless), so the comparison sees the resized pixels themselves. Measured
with img2dataset 1.47.0 (OpenCV 4.14, albumentations 1.4.24) on the 87 photos of
../shared/data/photos: every pixel within 1 of img2dataset's. Shrinking to 256, border and
keep_ratio_largest give identical pixels and keep_ratio/center_crop differ by 1 on 0.2 % of
them; enlarging to 800 (Lanczos-4; OpenCV computes it in fixed point) on 4-5 %.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from lait.build.resize import ImageOptions, prepare

HERE = Path(__file__).parent
MODES = ["keep_ratio", "center_crop", "border", "keep_ratio_largest"]


@pytest.fixture(scope="module")
def img2dataset_python() -> str:
    python = os.environ.get("LAIT_IMG2DATASET_PYTHON", "/tmp/i2d/bin/python")
    if not Path(python).is_file():
        pytest.skip(f"no img2dataset environment at {python} (set LAIT_IMG2DATASET_PYTHON)")
    probe = subprocess.run([python, "-c", "import img2dataset.resizer"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"{python} cannot import img2dataset")
    return python


def theirs(python: str, photos: list[Path], size: int, only_if_bigger: bool, tmp: Path) -> dict[str, np.ndarray]:
    spec = {"photos": [str(p) for p in photos], "modes": MODES, "image_size": size,
            "only_if_bigger": only_if_bigger, "out": str(tmp / "img2dataset.npz")}
    (tmp / "spec.json").write_text(json.dumps(spec))
    env = {**os.environ, "NO_ALBUMENTATIONS_UPDATE": "1"}
    subprocess.run([python, str(HERE / "img2dataset_resizer.py"), str(tmp / "spec.json")], check=True,
                   env=env, timeout=300)
    with np.load(spec["out"]) as z:
        return {k: z[k] for k in z.files}


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
def test_shrinking_matches_img2dataset(img2dataset_python, shared_data, tmp_path):
    photos = sorted((shared_data / "photos").glob("*/*.jpg"))
    ref = theirs(img2dataset_python, photos, 256, False, tmp_path)
    worst = max_difference(photos, 256, False, ref)
    print("max pixel difference, shrinking to 256:", worst)
    assert max(worst.values()) <= 1, worst


@pytest.mark.slow
def test_enlarging_and_only_if_bigger_match_img2dataset(img2dataset_python, shared_data, tmp_path):
    photos = sorted((shared_data / "photos" / "misc").glob("*.jpg"))  # 123 to 535 px: some enlarge
    ref = theirs(img2dataset_python, photos, 400, False, tmp_path)
    worst = max_difference(photos, 400, False, ref)
    print("max pixel difference, to 400 (enlarging the small ones):", worst)
    assert max(worst.values()) <= 1, worst
    ref = theirs(img2dataset_python, photos, 400, True, tmp_path)
    assert max(max_difference(photos, 400, True, ref).values()) <= 1
