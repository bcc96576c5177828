"""Run by tests/build/test_resize_parity.py in img2dataset's own environment (img2dataset pins
old webdataset and pandas, so it never enters lait's): resize photos with img2dataset's
`Resizer` and save what it wrote, decoded to RGB arrays, in one .npz.

    python img2dataset_resizer.py SPEC.json   # {"photos", "modes", "image_size", "only_if_bigger", "out"}
"""

import io
import json
import sys

import cv2
import numpy as np
from img2dataset.resizer import Resizer


def main(spec_path: str) -> None:
    with open(spec_path) as f:
        spec = json.load(f)
    arrays = {}
    for mode in spec["modes"]:
        resizer = Resizer(image_size=spec["image_size"], resize_mode=mode,
                          resize_only_if_bigger=spec["only_if_bigger"], encode_format="png", encode_quality=1)
        for i, path in enumerate(spec["photos"]):
            with open(path, "rb") as f:
                img, _, _, _, _, err = resizer(io.BytesIO(f.read()))
            if err is not None:
                raise RuntimeError(f"{path}: {err}")
            bgr = cv2.imdecode(np.frombuffer(img, np.uint8), cv2.IMREAD_COLOR)
            arrays[f"{mode}/{i}"] = bgr[:, :, ::-1]
    np.savez(spec["out"], **arrays)


if __name__ == "__main__":
    main(sys.argv[1])
