"""Issue 61, faces searched where they ship: stage 2 searches no face; stage 5 searches every
picture it writes into a shard, at the size it ships, blurs the faces found, lists them in
KEY.json in img2dataset's form, and keeps each search in `faces/`, so that a rebuild, a
selection or a recipe searches only pictures it never searched with the same settings.

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
from lait.filters.config import FilterConfig
from lait.filters.image_stage import ImageFilterStage
from lait.workdir import WorkDir

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


def _filtered_work(root, td, photos) -> WorkDir:
    """Stage 2 with its defaults (the unsafe model aside) on the photos; each gets one text,
    photo i scored 0.1 * (i + 1), so that a score threshold lets a chosen few ship."""
    from kit.build_data import _pair

    work = WorkDir(root, n_partitions=2).init()
    td.write_table(work, "images", [td.image_row(f"http://site.test/{i}.jpg", b) for i, b in enumerate(photos)],
                   "image_url")
    cfg = FilterConfig(work=str(work.root), workers=1, progress=False, unsafe_model="none")
    cfg.validate()
    assert LocalExecutor(workers=1, show_progress=False).run(ImageFilterStage(cfg), work).ok
    td.write_table(work, "scored", [_pair(f"http://site.test/{i}.jpg", "http://site.test/page.html", f"photo {i}", "alt",
                                  round(0.1 * (i + 1), 2)) for i in range(len(photos))], "image_url")
    return work


def tar_samples(folder) -> dict[str, tuple[dict, bytes]]:
    out = {}
    for tar in sorted(folder.glob("*.tar")):
        with tarfile.open(tar) as tf:
            members = {m.name: tf.extractfile(m).read() for m in tf.getmembers()}
        for name, data in members.items():
            if name.endswith(".json"):
                j = json.loads(data)
                out[j["url"]] = (j, members[name[:-5] + ".jpg"])
    return out


def run_build(work: WorkDir, **settings):
    from lait.build.config import BuildConfig
    from lait.build.pipeline import build

    cfg = BuildConfig(work=str(work.root), workers=1, progress=False, samples_per_shard=4,
                      use_embedding_dups=False, **settings)
    cfg.validate()
    result = build(cfg)
    assert result.ok
    return result, tar_samples(work.root / "shards")


def run_select(work: WorkDir, out, **settings):
    from lait.build.config import SelectConfig
    from lait.build.select import select

    cfg = SelectConfig(work=str(work.root), out=str(out), workers=1, progress=False, samples_per_shard=4, **settings)
    cfg.validate()
    result = select(cfg)
    assert result.ok
    return result, tar_samples(out)


def searches(result) -> tuple[int, int]:
    """(pictures searched now, searches reused) of a build's or a selection's shard pass."""
    counters = result.stats["counters"]
    return counters.get("build/faces_searched", 0), counters.get("build/faces_reused", 0)


def sharp_faces(jpg: bytes, threshold: float) -> list:
    from lait.build.faces import FaceFinder, decode_for_search

    return FaceFinder(min_score=threshold)(decode_for_search(jpg))[0]


def test_every_shipped_picture_is_searched_once_blurred_and_its_search_reused(tmp_path, td, photos):
    from lait.build.faces import DEFAULT_MIN_FACE_SCORE

    work = _filtered_work(tmp_path / "work", td, photos)
    ok = {r["image_url"]: r for r in work.read("images_ok", columns=["image_url", "sha256", "face_bboxes",
                                                                      "bytes"]).to_pylist()}
    assert len(ok) == len(PHOTOS)
    assert all(r["face_bboxes"] is None for r in ok.values()), "stage 2 searches no face"

    # Only the four best-scored photos can ship: only they are searched.
    result, samples = run_build(work, min_score=0.45)
    assert len(samples) == result.stats["samples"] == 4
    assert searches(result) == (4, 0)
    cached = work.read("faces").to_pylist()
    assert sorted(r["sha256"] for r in cached) == sorted(ok[u]["sha256"] for u in samples)
    assert sum(len(m["face_bboxes"]) for m, _ in samples.values()) >= 6
    for url, (meta, jpg) in samples.items():
        assert meta["face_bboxes"], f"{url} shows a face"
        for x0, y0, x1, y1 in meta["face_bboxes"]:
            assert 0 <= x0 < x1 <= 1 and 0 <= y0 < y1 <= 1
        assert jpg != ok[url]["bytes"]  # re-encoded with its faces blurred
        left = sharp_faces(jpg, DEFAULT_MIN_FACE_SCORE)
        assert left == [], f"{url}: faces above {DEFAULT_MIN_FACE_SCORE} left sharp at {left}"
    first = {u: m["face_bboxes"] for u, (m, _) in samples.items()}

    # A looser threshold: the four new pictures are searched, the four others reused, and the
    # build's summary says so.
    result, samples = run_build(work, min_score=0.0)
    assert len(samples) == 8 and searches(result) == (4, 4)
    assert "faces searched in 8 of 8 samples as they were written (4 now, 4 reused" in result.summary()
    assert all(samples[u][0]["face_bboxes"] == boxes for u, boxes in first.items())
    assert all(sharp_faces(jpg, DEFAULT_MIN_FACE_SCORE) == [] for _, jpg in samples.values())

    # The report counts the search per shipped sample (`lait stats`).
    from lait.app.report import gather

    faces = gather(work.root).faces
    with_faces = sum(1 for m, _ in samples.values() if m["face_bboxes"])
    n_faces = sum(len(m["face_bboxes"]) for m, _ in samples.values())
    assert (faces["searched"], faces["searched_now"], faces["reused"], faces["samples"]) == (8, 4, 4, 8)
    assert (faces["samples_with_faces"], faces["faces_in_samples"], faces["blurred"]) == (with_faces, n_faces, n_faces)

    # A selection and a recipe from the pool: every picture they write was searched before.
    result, chosen = run_select(work, tmp_path / "select", min_score=0.25)
    assert len(chosen) == result.stats["samples"] == 6 and searches(result) == (0, 6)
    assert "select: faces searched in 6 of 6 samples" in result.summary()
    assert all(chosen[u][1] == samples[u][1] for u in chosen)  # the same blurred bytes
    result, chosen = run_select(work, tmp_path / "recipe", recipe=["random-30"])
    assert 0 < len(chosen) == result.stats["samples"] and searches(result) == (0, len(chosen))

    # Shipped at 256 px: searched again at that size, blurred there, boxes of the shipped picture.
    result, small = run_build(work, min_score=0.0, resize_mode="keep_ratio", image_size=256)
    assert searches(result) == (8, 0)
    for url, (meta, jpg) in small.items():
        assert min(meta["width"], meta["height"]) == 256 and meta["face_bboxes"], url
        assert sharp_faces(jpg, DEFAULT_MIN_FACE_SCORE) == [], url
    # Another threshold is another search; sharp shards reuse the default one, and the detector
    # finds the faces again in them (what the checks above would catch if blurring did nothing).
    result, _ = run_build(work, min_score=0.0, min_face_score=0.9)
    assert searches(result) == (8, 0)
    result, sharp = run_build(work, min_score=0.0, blur_faces=False)
    assert searches(result) == (0, 8)
    found = 0
    for url, (meta, jpg) in sharp.items():
        assert jpg == ok[url]["bytes"] and meta["face_bboxes"] == samples[url][0]["face_bboxes"]
        found += len(sharp_faces(jpg, DEFAULT_MIN_FACE_SCORE))
    assert found >= 20


def test_face_model_none_searches_nothing(tmp_path, td, photos):
    work = _filtered_work(tmp_path / "work", td, photos[:2])
    result, samples = run_build(work, face_model="none")
    assert len(samples) == 2 and searches(result) == (0, 0)
    assert all(m["face_bboxes"] == [] for m, _ in samples.values())
    assert not work.part_files("faces")


def test_missing_detector_is_a_config_error_naming_the_install_and_the_way_out(monkeypatch):
    from lait.build.config import BuildConfig
    from lait.config import ConfigError
    from lait.models import ModelUnavailable

    monkeypatch.setitem(sys.modules, "facenet_pytorch", None)  # import fails as if not installed
    with pytest.raises(ModelUnavailable, match=r"pip install --no-deps facenet-pytorch==2\.6\.0.*--face-model none"):
        BuildConfig(work="w").validate()
    BuildConfig(work="w", face_model="none").validate()
    with pytest.raises(ConfigError, match="min_face_score"):
        BuildConfig(work="w", face_model="none", min_face_score=1.5).validate()
    # The settings stage 2 had say where they went.
    with pytest.raises(ConfigError, match="face_model is a setting of `build` now"):
        FilterConfig.from_dict({"work": "w", "face_model": "none"})


def test_fast_mtcnn_gives_the_package_detectors_boxes_and_scores(photos, shared_data):
    """lait.mtcnn runs facenet-pytorch's cascade and weights faster (issue 47): on real photos,
    the crowds above and Flickr8k's 224 px ones, every face and non-face probability it reports
    is the package's own, box for box, down to float rounding."""
    import torch
    from facenet_pytorch import MTCNN

    from lait.build.faces import MIN_FACE_PX
    from lait.build.faces import decode_for_search as decode_for_faces
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
