"""Faces: stage 2 finds them, stage 5 blurs them (issue 32).

Each image that passes stage 2 is searched for faces by a catalogued detector (`lait.models`,
MTCNN by default: chosen on hand-labelled real photos, docs/safety.md). The boxes above
`min_face_score` are kept with the image in `images_ok/` as `face_bboxes`, img2dataset's form:
[x0, y0, x1, y1] normalised to the upright image's width and height, so they stay true whatever
size the shards are written at; their probabilities beside them as `face_scores`.
"""

from __future__ import annotations

import io

from PIL import Image

DEFAULT_FACE_MODEL = "mtcnn-faces"
DEFAULT_MIN_FACE_SCORE = 0.8
# The detector sees the image with its long side at most this: a face of 12 px there (MTCNN's
# smallest search here) is 2 % of the side; searching a 4,000 px photo at full size costs ~40x more.
FACE_SIDE = 640
MIN_FACE_PX = 12
MAX_ROUNDS = 3  # searches of one picture: the faces found are blurred before the next


def decode_for_faces(data: bytes | memoryview, orientation: int = 1) -> Image.Image:
    """The upright RGB picture with its long side at most FACE_SIDE (JPEG: reduced-scale decode)."""
    from lait.imagehash import to_rgb, upright

    img = Image.open(io.BytesIO(data))
    if img.format in ("JPEG", "MPO"):
        img.draft("RGB", (FACE_SIDE, FACE_SIDE))
    img.load()
    img = upright(to_rgb(img), orientation)
    if max(img.size) > FACE_SIDE:
        img.thumbnail((FACE_SIDE, FACE_SIDE), Image.Resampling.BILINEAR)
    return img


def check_face_model(name: str) -> None:
    """`ModelUnavailable` naming the extra, and the way to run without faces, when the detector's
    package is missing: an image nobody searched is never shipped as one without faces."""
    from lait.models import ModelUnavailable, entry

    try:
        entry(name).check()
    except ModelUnavailable as exc:
        raise ModelUnavailable(f"{exc} (or --face-model none: no face_bboxes, nothing blurred)") from None


class FaceFinder:
    """The catalogued detector of `name`, loaded once per process (`lait.models` caches it)."""

    def __init__(self, name: str = DEFAULT_FACE_MODEL, min_score: float = DEFAULT_MIN_FACE_SCORE):
        from lait.models import load_face_detector

        self.name, self.min_score = name, min_score
        self.detector = load_face_detector(name, 1, MIN_FACE_PX)

    def __call__(self, image: Image.Image) -> tuple[list[list[float]], list[float]]:
        """(normalised boxes clipped to the image, their scores) of the faces above min_score.

        The faces found are blurred as stage 5 will blur them and the picture is searched again:
        in a crowd, a face half hidden by its neighbours can score under the threshold until
        they are blurred, then over it (a real COCO photo: 0.75, then 0.97). What stage 5 writes
        is then what the detector passes as faceless, up to MAX_ROUNDS searches. A search that
        found faces but left no near miss (a box the detector reported under min_score) ends it:
        on the hand-labelled photos, skipping those searches lost no face (recall 0.920 either
        way), dropped one false one and saved a quarter of the time (bench/safety/bench_faces.py,
        issue 47)."""
        import numpy as np

        from lait.faceblur import blur_faces

        w, h = image.size
        pixels = np.asarray(image.convert("RGB"), np.uint8)
        boxes: list[list[float]] = []
        scores: list[float] = []
        for _ in range(MAX_ROUNDS):
            found = near = 0
            for (x0, y0, x1, y1), score in self.detector.detect(Image.fromarray(pixels) if boxes else image):
                if score < self.min_score:
                    near += 1
                    continue
                box = [min(max(x0 / w, 0.0), 1.0), min(max(y0 / h, 0.0), 1.0),
                       min(max(x1 / w, 0.0), 1.0), min(max(y1 / h, 0.0), 1.0)]
                if box[2] > box[0] and box[3] > box[1]:
                    boxes.append([round(v, 4) for v in box])
                    scores.append(round(score, 4))
                    found += 1
            if not found or not near:
                break
            pixels, _ = blur_faces(pixels, boxes)
        return boxes, scores
