"""Face detectors on hand-labelled real photos (issue 32, acceptance 1).

bench/safety/face_labels.json holds the faces labelled by hand on photos of
../shared/data/photos (docs/safety.md says how). Each catalogued face detector runs on every
labelled photo, decoded as stage 5 decodes a picture it ships as stored to search it
(`lait.build.faces.decode_for_search`), with one thread, as a build worker runs it. A detection matches an unmatched label when their IoU is at
least 0.3 (greedy, best score first); an unmatched detection over an "ignore" region (a face too
small or too hidden to call) counts neither way; other unmatched detections are false positives.
Prints precision and recall at several score thresholds and the CPU time per image.

    .venv/bin/python bench/safety/bench_faces.py [--models mtcnn-faces,haar-faces]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

IOU = 0.3
THRESHOLDS = {"mtcnn-faces": [0.5, 0.8, 0.9, 0.95, 0.99], "haar-faces": [1, 3, 5, 8, 12]}


def iou(a: list[float], b: list[float]) -> float:
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    if w <= 0 or h <= 0:
        return 0.0
    inter = w * h
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def score_image(dets: list[tuple[list[float], float]], faces: list[list[float]],
                ignore: list[list[float]], threshold: float) -> tuple[int, int, int]:
    """(true positives, false positives, missed faces) of one photo at `threshold`."""
    free = list(range(len(faces)))
    tp = fp = 0
    for box, _ in sorted((d for d in dets if d[1] >= threshold), key=lambda d: -d[1]):
        best = max(free, key=lambda i: iou(box, faces[i]), default=None)
        if best is not None and iou(box, faces[best]) >= IOU:
            free.remove(best)
            tp += 1
        elif not any(iou(box, g) >= IOU or iou(box, g) > 0 and _inside(box, g) for g in ignore + faces):
            fp += 1
    return tp, fp, len(free)


def _inside(box: list[float], region: list[float]) -> bool:
    cx, cy = (box[0] + box[2]) / 2, (box[1] + box[3]) / 2
    return region[0] <= cx <= region[2] and region[1] <= cy <= region[3]


def main() -> None:
    from lait.build.faces import DEFAULT_FACE_MODEL, FACE_SIDE, min_face_px
    from lait.build.faces import decode_for_search as decode_for_faces
    from lait.models import load_face_detector

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="mtcnn-faces,haar-faces")
    args = ap.parse_args()
    root = REPO.parent / "shared" / "data" / "photos"
    if not root.is_dir():
        sys.exit(f"{root} is absent: no real photos to measure on")
    labels = json.loads((Path(__file__).parent / "face_labels.json").read_text())["images"]
    images = []
    for rel, lab in sorted(labels.items()):
        img = decode_for_faces((root / rel).read_bytes())
        s = img.size[0] / _width(root / rel)  # labels are in the file's pixels, detections in the decoded image's
        scale = [[v * s for v in b] for b in lab["faces"]], [[v * s for v in b] for b in lab["ignore"]]
        images.append((rel, img, *scale))
    n_faces = sum(len(f) for _, _, f, _ in images)
    print(f"{len(images)} real photos with {n_faces} faces labelled by hand (IoU >= {IOU} to match)")
    for name in args.models.split(","):
        det = load_face_detector(name, 1, min_face_px(FACE_SIDE))
        det.detect(images[0][1])  # warm-up, not timed
        found, cpu = [], 0.0
        for _, img, _, _ in images:
            start = time.process_time()
            found.append(det.detect(img))
            cpu += time.process_time() - start
        print(f"\n{name}: CPU time per image {cpu / len(images) * 1e3:.1f} ms (1 thread, decode excluded)")
        for t in THRESHOLDS.get(name, [0.5]):
            tp = fp = fn = 0
            for dets, (_, _, faces, ignore) in zip(found, images, strict=True):
                a, b, c = score_image(dets, faces, ignore, t)
                tp, fp, fn = tp + a, fp + b, fn + c
            prec = tp / (tp + fp) if tp + fp else 1.0
            print(f"  score >= {t:<5g} precision {prec:.3f} recall {tp / n_faces:.3f} "
                  f"(found {tp}, false {fp}, missed {fn})")
        if name == DEFAULT_FACE_MODEL:
            stage_two(images, n_faces)


def stage_two(images: list, n_faces: int) -> None:
    """The default detector as the build runs it on a picture it ships as stored (`lait build`'s
    defaults: no resize, JPEG): its threshold and smallest face, the search repeated after
    blurring on the blurred picture as the shard's reader gets it back (JPEG at quality 95)."""
    from lait.build.faces import DEFAULT_MIN_FACE_SCORE, FACE_SIDE, FaceFinder, min_face_px
    from lait.build.resize import ImageOptions, read_back

    finder = FaceFinder(min_score=DEFAULT_MIN_FACE_SCORE)
    opts = ImageOptions()
    tp = fp = fn = 0
    cpu = 0.0
    for _, img, faces, ignore in images:
        start = time.process_time()
        boxes, scores = finder(img, lambda rgb: read_back(rgb, opts))
        cpu += time.process_time() - start
        w, h = img.size
        dets = [([b[0] * w, b[1] * h, b[2] * w, b[3] * h], s) for b, s in zip(boxes, scores, strict=True)]
        a, b, c = score_image(dets, faces, ignore, 0.0)
        tp, fp, fn = tp + a, fp + b, fn + c
    print(f"  as the build runs it (score >= {DEFAULT_MIN_FACE_SCORE}, faces from {min_face_px(FACE_SIDE)} px at "
          f"{FACE_SIDE} px, searched again after blurring): precision {tp / max(1, tp + fp):.3f} recall "
          f"{tp / n_faces:.3f} (found {tp}, false {fp}, missed {fn}), CPU time per image {cpu / len(images) * 1e3:.1f} ms")


def _width(path: Path) -> int:
    from PIL import Image

    with Image.open(path) as im:
        return im.size[0]


if __name__ == "__main__":
    main()
