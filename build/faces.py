"""Faces searched where they ship: stage 5 searches each picture it writes into a shard (issue 61).

A face only has to be blurred in the picture that ships, at the size it ships. So the search
runs in the shard pass of `lait build` and `lait select` (every shard a task of the executor),
on the picture as the shard will hold it: after `--resize-mode` / `--image-size`, its long side
brought down to at most FACE_SIDE for the search. The faces found above `min_face_score` are
blurred there (`lait.faceblur`) and written into KEY.json and the sidecar as `face_bboxes`
([x0, y0, x1, y1] normalised to the shipped picture). A picture the plan drops, the duplicate
of one kept, or one of a text nobody kept is never searched.

Each search is kept in `faces/` by the digest of the stored bytes and the search's key
(detector, its version here, threshold, search size and the resize that made the picture):
a rebuild, a second `lait select` or the report reuse it and search only pictures never searched
with that key. The table is a cache: its parts are written once, named by their content, and
never change a shard's bytes (a cached search gives the boxes the search would give), so it is
no input of the build's fingerprint; a part lost or removed only costs its searches again.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lait.parts import PartitionedWriter
from lait.workdir import WorkDir, partition_of

TABLE = "faces"
STAGE = "build_faces"  # what the cache's parts say wrote them
DEFAULT_FACE_MODEL = "mtcnn-faces"
DEFAULT_MIN_FACE_SCORE = 0.8
# The detector sees the shipped picture with its long side at most this. On the 84 hand-labelled
# photos (bench/safety/bench_faces.py), a search side of 480 already lost faces (recall 0.902 at
# 12 px faces), 400 and 320 more (0.893, 0.804); 640 is what the photos are.
FACE_SIDE = 640
MIN_FACE_PX = 12  # MTCNN's smallest face (its P-Net's window)
# The smallest face searched for: this share of the searched picture's long side (20 px at 640),
# never under MIN_FACE_PX. Measured at 640 px: 12 px faces gave precision 0.920, recall 0.920 at
# 88 ms a photo; 1/32 (20 px) 0.981 / 0.911 at 43 ms; 24 px lost faces (recall 0.875).
MIN_FACE_SHARE = 32
MAX_ROUNDS = 3  # searches of one picture: the faces found are blurred before the next
SEARCH_VERSION = 1  # bump when a change of code here changes what a search finds


def min_face_px(long_side: int) -> int:
    """The smallest face searched for in a picture whose long side is `long_side` pixels."""
    return max(MIN_FACE_PX, round(long_side / MIN_FACE_SHARE))


def check_face_model(name: str) -> None:
    """`ModelUnavailable` naming the extra, and the way to run without faces, when the detector's
    package is missing: a picture nobody searched is never shipped as one without faces."""
    from lait.models import ModelUnavailable, entry

    try:
        entry(name).check()
    except ModelUnavailable as exc:
        raise ModelUnavailable(f"{exc} (or --face-model none: no faces searched, nothing blurred)") from None


def search_picture(pixels: np.ndarray) -> Any:
    """The RGB picture the detector sees of shipped pixels (RGB, H x W x 3): itself, or brought
    down to FACE_SIDE on its long side."""
    from PIL import Image

    return _bounded(Image.fromarray(np.ascontiguousarray(pixels), "RGB"))


def _bounded(img: Any) -> Any:
    """The picture with its long side brought down to FACE_SIDE (in place), when above it."""
    from PIL import Image

    if max(img.size) > FACE_SIDE:
        img.thumbnail((FACE_SIDE, FACE_SIDE), Image.Resampling.BILINEAR)
    return img


def decode_for_search(data: bytes | memoryview) -> Any:
    """The stored picture (upright: stage 2 stores images upright) as the detector sees it, its
    long side at most FACE_SIDE; a JPEG is decoded at a reduced scale."""
    from PIL import Image

    from lait.imagehash import to_rgb

    img = Image.open(io.BytesIO(data))
    if img.format in ("JPEG", "MPO"):
        img.draft("RGB", (FACE_SIDE, FACE_SIDE))
    img.load()
    return _bounded(to_rgb(img))


class FaceFinder:
    """The catalogued detector of `name` (loaded once per process by `lait.models`), as stage 5
    runs it on a picture: boxes scored at least `min_score`, searched again after blurring."""

    def __init__(self, name: str = DEFAULT_FACE_MODEL, min_score: float = DEFAULT_MIN_FACE_SCORE):
        self.name, self.min_score = name, min_score

    def detector(self, long_side: int) -> Any:
        from lait.models import load_face_detector

        return load_face_detector(self.name, 1, min_face_px(long_side))

    def __call__(self, image: Any, ship: Any = None) -> tuple[list[list[float]], list[float]]:
        """(normalised boxes clipped to the picture, their scores) of the faces above min_score.

        The faces found are blurred as the shard will hold them and the picture is searched
        again: in a crowd, a face half hidden by its neighbours can score under the threshold
        until they are blurred, then over it (a real COCO photo: 0.75, then 0.97). What ships is
        then what the detector passes as faceless, up to MAX_ROUNDS searches. A search that
        found faces but left no near miss (a box the detector reported under min_score) ends it:
        on the hand-labelled photos, skipping those searches lost no face and saved a quarter of
        the time (bench/safety/bench_faces.py, issue 47).

        `ship` (RGB pixels -> RGB pixels): the blurred picture as it will be read back from the
        shard (encoded and decoded again); the searches after the first see that, since a lossy
        encode moves a near miss's score by a few hundredths, over the threshold as often as
        under it."""
        from PIL import Image

        from lait.faceblur import blur_faces

        w, h = image.size
        detector = self.detector(max(w, h))
        pixels = np.asarray(image.convert("RGB"), np.uint8)
        boxes: list[list[float]] = []
        scores: list[float] = []
        for _ in range(MAX_ROUNDS):
            found = near = 0
            seen = image if not boxes else Image.fromarray(ship(pixels) if ship is not None else pixels)
            for (x0, y0, x1, y1), score in detector.detect(seen):
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


def search_key(model: str, min_score: float, geometry: str) -> str:
    """What a search's result depends on besides the picture's bytes: the detector, this
    module's version of the search, the threshold, the search size and smallest face, and
    `geometry` (how the shipped picture is made from the stored one: `ImageOptions.geometry`)."""
    return f"{model}/v{SEARCH_VERSION}/score{min_score:g}/side{FACE_SIDE}/min1of{MIN_FACE_SHARE}/{geometry}"


class FaceCache:
    """The searches of one key in a work directory's `faces/`: those of a shard's pictures read
    at once (`load`), the new ones added (`add`) and written as parts named by their content
    (`write`), partitioned by the stored bytes' digest."""

    def __init__(self, work: WorkDir, key: str):
        self.work, self.key = work, key
        self._new: dict[str, tuple[list[list[float]], list[float]]] = {}

    def load(self, digests: Iterable[str]) -> dict[str, tuple[list[list[float]], list[float]]]:
        """digest -> (boxes, scores) of each of `digests` searched before with this key."""
        wanted = sorted({d for d in digests if d})
        if not wanted:
            return {}
        n = self.work.n_partitions
        by_part: dict[int, list[str]] = {}
        for d in wanted:
            by_part.setdefault(partition_of(d, n), []).append(d)
        found: dict[str, tuple[list[list[float]], list[float]]] = {}
        for partition, digests_here in sorted(by_part.items()):
            if not self.work.part_files(TABLE, partition):
                continue
            table = self.work.read(TABLE, partition)
            mask = pc.and_(pc.equal(table.column("key"), self.key),
                           pc.is_in(table.column("sha256"), value_set=pa.array(digests_here, pa.string())))
            hits = table.filter(mask)
            for sha, boxes, scores in zip(hits.column("sha256").to_pylist(), hits.column("face_bboxes").to_pylist(),
                                          hits.column("face_scores").to_pylist()):
                # Stored as float32: rounded back to the 4 decimals a search gives, so that a
                # reused search writes the KEY.json bytes the search itself wrote.
                found.setdefault(sha, ([[round(float(v), 4) for v in b] for b in boxes or ()],
                                       [round(float(s), 4) for s in scores or ()]))
        return found

    def add(self, digest: str, boxes: list[list[float]], scores: list[float]) -> None:
        self._new[digest] = (boxes, scores)

    def write(self) -> int:
        """The searches added since the last write, as parts of `faces/`; returns how many.

        The parts' tag is a digest of their key and pictures: a task that is redone after it
        wrote them finds them, searches nothing and writes nothing; two commands that search
        the same pictures at once write the same part twice, each atomically."""
        if not self._new:
            return 0
        new, self._new = self._new, {}
        tag = "faces-" + hashlib.blake2b("\n".join([self.key, *sorted(new)]).encode(), digest_size=10).hexdigest()
        with PartitionedWriter(self.work, tag, extra_stats={"stage": STAGE}) as out:
            for digest in sorted(new):
                boxes, scores = new[digest]
                out.write(TABLE, partition_of(digest, self.work.n_partitions),
                          {"sha256": digest, "key": self.key, "face_bboxes": boxes, "face_scores": scores})
        return len(new)
