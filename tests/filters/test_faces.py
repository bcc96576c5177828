"""Issue 32, faces: found at stage 2 (`face_bboxes` in images_ok/), carried into each sample's
JSON in img2dataset's form, and blurred in the shards unless `--no-blur-faces`.

The end-to-end test runs stage 2 and stage 5 on real COCO photos of people (faces labelled in
bench/safety/face_labels.json) and runs the same detector again on the images inside the tars:
with blurring on it finds no face above the threshold; with it off it finds them again."""

from __future__ import annotations

import json
import sys
import tarfile

import numpy as np
import pytest

from lait.executor import LocalExecutor
from lait.faceblur import blur_faces, pixel_box
from lait.filters.image_stage import FilterConfig, ImageFilterStage
from lait.parts import WorkDir

# COCO photos with faces a person can see (bench/safety/face_labels.json labels 31 in them).
PHOTOS = ["000000084533", "000000214704", "000000370162", "000000000790", "000000227000", "000000442450",
          "000000535506", "000000037666"]


def test_blur_changes_only_the_widened_boxes():
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (100, 200, 3), dtype=np.uint8)
    out, n = blur_faces(pixels, [[0.25, 0.2, 0.5, 0.6], [1.0, 1.0, 1.0, 1.0]])
    assert n == 1 and pixel_box([0.25, 0.2, 0.5, 0.6], 200, 100) == (40, 12, 110, 68)
    changed = np.argwhere((out != pixels).any(axis=2))
    assert changed[:, 1].min() >= 40 and changed[:, 1].max() < 110
    assert changed[:, 0].min() >= 12 and changed[:, 0].max() < 68
    assert out[12:68, 40:110].std() < pixels[12:68, 40:110].std() / 3  # noise smoothed away
    assert blur_faces(pixels, [])[0] is pixels


@pytest.fixture(scope="module")
def photos(shared_data):
    pytest.importorskip("facenet_pytorch", reason="the face detector's package is not installed")
    paths = [shared_data / "photos" / "coco_train" / f"{p}.jpg" for p in PHOTOS]
    if not all(p.exists() for p in paths):
        pytest.skip("../shared/data/photos/coco_train is absent")
    return [p.read_bytes() for p in paths]


def _filtered_work(root, td, photos, **settings) -> WorkDir:
    work = WorkDir(root, n_partitions=2).init()
    td.write_table(work, "images", [td.image_row(f"http://site.test/{i}.jpg", b) for i, b in enumerate(photos)],
                   "image_url")
    cfg = FilterConfig(work=str(work.root), workers=1, progress=False, unsafe_model="none", **settings)
    cfg.validate()
    assert LocalExecutor(workers=1, show_progress=False).run(ImageFilterStage(cfg), work).ok
    return work


def shard_samples(work: WorkDir) -> dict[str, tuple[dict, bytes]]:
    out = {}
    for tar in sorted((work.root / "shards").glob("*.tar")):
        with tarfile.open(tar) as tf:
            members = {m.name: tf.extractfile(m).read() for m in tf.getmembers()}
        for name, data in members.items():
            if name.endswith(".json"):
                j = json.loads(data)
                out[j["url"]] = (j, members[name[:-5] + ".jpg"])
    return out


def run_build(work: WorkDir, td, **settings) -> dict[str, tuple[dict, bytes]]:
    from lait.build.config import BuildConfig
    from lait.build.pipeline import build
    from lait.testkit.build_data import _pair

    urls = work.read("images_ok", columns=["image_url"]).column(0).to_pylist()
    if not (work.root / "scored").exists():
        td.write_table(work, "scored", [_pair(u, "http://site.test/page.html", f"photo {u}", "alt", 0.5)
                                        for u in urls], "image_url")
    cfg = BuildConfig(work=str(work.root), workers=1, progress=False, samples_per_shard=4, **settings)
    cfg.validate()
    assert build(cfg).ok
    return shard_samples(work)


def test_faces_are_stored_then_blurred_in_shards_and_none_is_found_again(tmp_path, td, photos):
    from lait.filters.faces import DEFAULT_MIN_FACE_SCORE, FaceFinder, decode_for_faces

    work = _filtered_work(tmp_path / "work", td, photos)
    ok = {r["image_url"]: r for r in work.read("images_ok", columns=["image_url", "face_bboxes", "face_scores",
                                                                      "bytes"]).to_pylist()}
    assert len(ok) == len(PHOTOS)
    assert all(r["face_bboxes"] for r in ok.values()), "every photo shows a face"
    assert sum(len(r["face_bboxes"]) for r in ok.values()) >= 20
    for r in ok.values():
        assert len(r["face_scores"]) == len(r["face_bboxes"])
        assert all(s >= DEFAULT_MIN_FACE_SCORE for s in r["face_scores"])
        for x0, y0, x1, y1 in r["face_bboxes"]:
            assert 0 <= x0 < x1 <= 1 and 0 <= y0 < y1 <= 1

    finder = FaceFinder(min_score=DEFAULT_MIN_FACE_SCORE)
    samples = run_build(work, td)
    assert samples.keys() == ok.keys()
    for url, (meta, jpg) in samples.items():
        assert np.allclose(meta["face_bboxes"], ok[url]["face_bboxes"], atol=1e-4)
        assert jpg != ok[url]["bytes"]  # re-encoded with its faces blurred
        left, _ = finder(decode_for_faces(jpg))
        assert left == [], f"{url}: faces above {DEFAULT_MIN_FACE_SCORE} left sharp at {left}"

    # The same tars built with --no-blur-faces: the images as stored, and the detector finds the
    # faces again (what the assertion above would catch if blurring did nothing).
    samples = run_build(work, td, blur_faces=False)  # a new setting: the shards are redone
    found = 0
    for url, (meta, jpg) in samples.items():
        assert jpg == ok[url]["bytes"] and meta["face_bboxes"]
        found += len(finder(decode_for_faces(jpg))[0])
    assert found >= 20


def test_face_model_none_stores_no_boxes(tmp_path, td, photos):
    work = _filtered_work(tmp_path / "work", td, photos[:2], face_model="none")
    rows = work.read("images_ok", columns=["face_bboxes", "face_scores"]).to_pylist()
    assert rows and all(r["face_bboxes"] is None and r["face_scores"] is None for r in rows)
    meta = run_build(work, td)
    assert all(m["face_bboxes"] == [] for m, _ in meta.values())


def test_missing_detector_is_a_config_error_naming_the_install_and_the_way_out(monkeypatch):
    from lait.models import ModelUnavailable

    monkeypatch.setitem(sys.modules, "facenet_pytorch", None)  # import fails as if not installed
    with pytest.raises(ModelUnavailable, match=r"pip install --no-deps facenet-pytorch==2\.6\.0.*--face-model none"):
        FilterConfig(work="w", unsafe_model="none").validate()
    FilterConfig(work="w", unsafe_model="none", face_model="none").validate()
    with pytest.raises(Exception, match="min_face_score"):
        FilterConfig(work="w", unsafe_model="none", face_model="none", min_face_score=1.5).validate()


def test_fast_mtcnn_gives_the_package_detectors_boxes_and_scores(photos, shared_data):
    """lait.mtcnn runs facenet-pytorch's cascade and weights faster (issue 47): on real photos,
    the crowds above and Flickr8k's 224 px ones, every face and non-face probability it reports
    is the package's own, box for box, down to float rounding."""
    import torch
    from facenet_pytorch import MTCNN

    from lait.filters.faces import MIN_FACE_PX, decode_for_faces
    from lait.mtcnn import THRESHOLDS, FastMTCNN

    flickr = sorted((shared_data / "photos" / "flickr8k").rglob("*.jpg"))[:40:4]
    images = [decode_for_faces(b) for b in photos[:4]] + [decode_for_faces(p.read_bytes()) for p in flickr]
    ref = MTCNN(keep_all=True, device="cpu", min_face_size=MIN_FACE_PX, thresholds=list(THRESHOLDS))
    # The crowds give R-Net 500 to 800 candidates: several chunks of lait.mtcnn.CHUNK, where the
    # package scores them in one call.
    fast = FastMTCNN(MIN_FACE_PX)
    n_faces = 0
    for image in images:
        with torch.inference_mode():
            boxes, probs = ref.detect(image)
        want = sorted(zip([list(b) for b in boxes], probs, strict=True), key=lambda d: -d[1]) if boxes is not None else []
        got = sorted(fast.detect(image), key=lambda d: -d[1])
        assert len(got) == len(want)
        for (gb, gp), (wb, wp) in zip(got, want, strict=True):
            assert gp == pytest.approx(wp, abs=1e-4) and gb == pytest.approx(wb, abs=1e-2)
        n_faces += sum(p >= 0.8 for _, p in want)
    assert n_faces >= 20  # the comparison covered real faces, not only empty pictures
