"""Images into shards with img2dataset's options (build/resize.py): sizes, modes, formats, and
the default that copies JPEGs as fetched."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image

from kit import build_data as data  # noqa: E402
from lait.build.config import BuildConfig
from lait.build.pipeline import build
from lait.build.resize import ImageOptions, encode, exif_json, prepare, resample, target_size
from lait.config import ConfigError


def decode(b: bytes) -> Image.Image:
    im = Image.open(io.BytesIO(b))
    im.load()
    return im


@pytest.mark.parametrize("mode, size, only, wh, want", [
    ("keep_ratio", 256, False, (640, 427), (384, 256)),       # smaller side to 256, 383.6 rounds up
    ("keep_ratio", 256, False, (300, 500), (256, 427)),
    ("keep_ratio", 256, True, (300, 200), None),              # smaller side not above 256: kept
    ("keep_ratio", 256, False, (300, 200), (384, 256)),       # ... unless enlarging is allowed
    ("keep_ratio_largest", 256, False, (640, 427), (256, 171)),
    ("border", 100, False, (250, 100), (100, 40)),
    ("no", 256, False, (640, 427), None),
])
def test_target_size_rounds_as_img2dataset(mode, size, only, wh, want):
    assert target_size(*wh, ImageOptions(mode, size, only)) == want


def test_default_copies_jpegs_and_reencodes_the_rest():
    jpeg = data.photo(1)
    same = prepare(jpeg, "JPEG", 400, 320, ImageOptions())
    assert same.data == jpeg and not same.reencoded and same.ext == "jpg"
    png = prepare(data.photo(2, fmt="PNG"), "PNG", 400, 320, ImageOptions())
    assert png.reencoded and decode(png.data).format == "JPEG" and (png.width, png.height) == (400, 320)


@pytest.mark.parametrize("mode", ["center_crop", "border"])
def test_square_modes_give_image_size_squares(mode):
    out = prepare(data.photo(3, (400, 240)), "JPEG", 400, 240, ImageOptions(mode, 128, encode_format="png",
                                                                             encode_quality=1))
    im = decode(out.data)
    assert im.format == "PNG" and im.size == (128, 128) == (out.width, out.height)
    assert (out.original_width, out.original_height) == (400, 240)
    px = np.asarray(im.convert("RGB"))
    if mode == "border":  # 400x240 -> 128x77, centred: white rows above and below
        assert (px[:25] == 255).all() and (px[-26:] == 255).all() and not (px[64] == 255).all()


def test_area_resampling_averages_the_covered_pixels():
    px = np.zeros((4, 6, 3), np.uint8)
    px[:, :3] = 200  # left half bright
    out = resample(px, 3, 2)
    assert out.shape == (2, 3, 3)
    assert out[:, 0].tolist() == [[200] * 3] * 2 and out[:, 2].tolist() == [[0] * 3] * 2
    assert out[0, 1, 0] == 100  # the middle output pixel covers one bright and one dark column


def test_webp_and_transparency_on_white():
    rgba = Image.new("RGBA", (300, 300), (0, 0, 255, 0))
    buf = io.BytesIO()
    rgba.save(buf, "PNG")
    out = prepare(buf.getvalue(), "PNG", 300, 300, ImageOptions("keep_ratio", 150, encode_format="webp"))
    im = decode(out.data)
    assert out.ext == "webp" and im.format == "WEBP" and im.size == (150, 150)
    assert np.asarray(im.convert("RGB")).min() > 240  # fully transparent blue shows as white


@pytest.mark.parametrize("fmt, pil, qualities", [("jpg", "JPEG", (1, 30, 95, 100)), ("webp", "WEBP", (1, 80, 95, 100))])
def test_opencv_encoder_gives_pillows_bytes(fmt, pil, qualities):
    # JPEG and WebP are encoded by OpenCV (faster, and no channel swap for pixels it decoded); the
    # module promises Pillow's bytes, so that the encoder change left every shard as it was.
    rgb = np.asarray(decode(data.photo(3)).convert("RGB").resize((301, 199)))
    for quality in qualities:
        opts = ImageOptions("keep_ratio", 256, encode_format=fmt, encode_quality=quality)
        buf = io.BytesIO()
        Image.fromarray(rgb).save(buf, pil, quality=quality)
        assert encode(rgb, opts) == buf.getvalue(), quality
        assert encode(np.ascontiguousarray(rgb[..., ::-1]), opts, bgr=True) == buf.getvalue(), quality


def test_resizing_keeps_opencv_on_one_thread():
    # One core per shard worker, as img2dataset: OpenCV's own pool in every worker process would
    # oversubscribe the cores the workers already fill (and makes "1 core" benches unfair).
    import cv2

    cv2.setNumThreads(2)
    try:
        prepare(data.photo(1), "JPEG", 400, 320, ImageOptions())  # copied: OpenCV not involved
        assert cv2.getNumThreads() == 2
        prepare(data.photo(1), "JPEG", 400, 320, ImageOptions("keep_ratio", 32))
        assert cv2.getNumThreads() == 1
    finally:
        cv2.setNumThreads(1)


def test_options_are_checked():
    for bad in (dict(resize_mode="stretch"), dict(encode_format="gif"), dict(encode_format="png", encode_quality=95),
                dict(encode_quality=0), dict(image_size=0)):
        with pytest.raises(ConfigError):
            BuildConfig(work="w", **bad).validate()


def test_exif_of_a_photo_and_of_none():
    im = Image.new("RGB", (64, 64))
    exif = Image.Exif()
    exif[0x010F] = "Lait Camera"  # Make
    buf = io.BytesIO()
    im.save(buf, "JPEG", exif=exif)
    assert json.loads(exif_json(buf.getvalue())) == {"Image Make": "Lait Camera"}
    assert exif_json(data.photo(1)) == "{}"


def test_center_crop_build_batches_with_plain_webdataset(tmp_path):
    """Mixed sizes (the fixture has 400x320, 400x400 and others) batch once resized."""
    wds = pytest.importorskip("webdataset")
    data.make_work(tmp_path)
    cfg = BuildConfig(work=str(tmp_path), workers=1, progress=False, samples_per_shard=16,
                      resize_mode="center_crop", image_size=96)
    assert build(cfg).ok
    tars = sorted(str(p) for p in (tmp_path / "shards").glob("*.tar"))
    ds = wds.WebDataset(tars, shardshuffle=False).decode("rgb8").to_tuple("jpg", "json").batched(8)
    n = 0
    for images, metas in ds:
        assert images.shape[1:] == (96, 96, 3)
        assert all((m["width"], m["height"]) == (96, 96) for m in metas)
        assert any(m["original_width"] != 96 for m in metas)
        n += len(metas)
    assert n == sum(json.loads((tmp_path / "shards" / "sizes.json").read_text()).values())
