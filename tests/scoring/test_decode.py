"""Stage 4's decoders: the CPU fast path, the device (nvJPEG) path run on the CPU, and the
streams that feed the model, checked against open_clip's own transform on real photos."""

from __future__ import annotations

import io
import os

import numpy as np
import pytest
import torch
from PIL import Image

from kit.scoring_data import jpeg
from lait.scoring.decode import (
    DeviceJpegDecoder,
    Geometry,
    ImageDecoder,
    decode_stream,
    decoder_pool,
    hybrid_stream,
    jpeg_size,
)

CFG = {"size": 224, "mode": "RGB", "mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5), "interpolation": "bicubic",
       "resize_mode": "shortest", "fill_color": 0}


def encode(img: Image.Image, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "JPEG", **kw)
    return buf.getvalue()


def odd_jpegs() -> dict[str, bytes]:
    """JPEGs that decoders treat differently: progressive, grey, CMYK, tiny, restart markers."""
    rng = np.random.default_rng(0)
    rgb = Image.fromarray(rng.integers(0, 255, (300, 420, 3), np.uint8))
    return {
        "progressive": encode(rgb, progressive=True, quality=85),
        "grey": encode(rgb.convert("L"), quality=85),
        "cmyk": encode(rgb.convert("CMYK"), quality=85),
        "tiny": encode(rgb.resize((40, 25)), quality=85),
        "tall": encode(rgb.resize((120, 700)), quality=85),
        "big": encode(rgb.resize((1900, 1300)), quality=80),
        "rotated": encode(rgb, quality=85, exif=_rotated()),  # every path ignores it, as Pillow's open
    }


def _rotated() -> Image.Exif:
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90
    return exif


def real_photos(shared_data, n: int = 40) -> list[tuple[str, bytes]]:
    coco = sorted((shared_data / "photos" / "coco_train").glob("*.jpg"))[: n // 2]
    flickr = sorted((shared_data / "photos" / "flickr8k" / "images").glob("*.jpg"))[: n // 2]
    misc = sorted((shared_data / "photos" / "misc").iterdir())
    return [(p.name, p.read_bytes()) for p in coco + flickr + misc if p.is_file()]


def test_jpeg_size_reads_the_frame_header_as_pillow_does(shared_data):
    items = real_photos(shared_data) + list(odd_jpegs().items())
    jpegs = [(k, d) for k, d in items if d[:3] == b"\xff\xd8\xff"]
    assert len(jpegs) >= 40
    for key, data in jpegs:
        assert jpeg_size(data) == Image.open(io.BytesIO(data)).size, key
    assert jpeg_size(b"\xff\xd8\xff\xe0 truncated") is None
    assert jpeg_size(b"\x89PNG\r\n\x1a\n") is None


def test_geometry_places_images_as_the_eval_transform():
    g = Geometry.of(CFG)
    assert g.fast and g.resized(640, 480) == (298, 224) and g.resized(480, 640) == (224, 298)
    assert g.crop(298, 224) == (37, 0)
    # DCT scaling only while the scaled image is still twice the resize target.
    assert g.reduction(640, 480) == 1 and g.reduction(1900, 1300) == 2 and g.reduction(4000, 3000) == 4
    assert not Geometry.of({**CFG, "resize_mode": "longest"}).fast
    assert Geometry.of({**CFG, "resize_mode": "squash", "size": (224, 160)}).resized(640, 480) == (160, 224)


def _features(pixels) -> np.ndarray:
    """Image embeddings from the packaged ImageNet CNN (real weights): how a model sees the pixels."""
    from lait.models import load_image_classifier

    clf = load_image_classifier("efficientnet-lite0", "cpu")
    x = pixels.float() if isinstance(pixels, torch.Tensor) else torch.from_numpy(pixels).permute(0, 3, 1, 2).float()
    with torch.no_grad():
        f = clf.feature_map(clf.normalise(x / 255.0)).mean((2, 3))
    return torch.nn.functional.normalize(f, dim=-1).numpy()


def test_fast_and_device_paths_agree_with_open_clips_transform_on_real_photos(shared_data):
    """The CPU fast path (OpenCV decode, the eval transform's filter) and the device path (run here
    on the CPU: full decode, float antialiased resize) give embeddings within a stated tolerance
    of open_clip's Pillow transform (docs/performance.md); the odd JPEGs decode on every path."""
    items = real_photos(shared_data) + list(odd_jpegs().items())
    exact = ImageDecoder(CFG, fast_decode=False)(items)
    fast = ImageDecoder(CFG)(items)
    device = DeviceJpegDecoder(ImageDecoder(CFG), "cpu")(items)
    keys = [k for k, _ in items]
    assert exact.keys == fast.keys == device.keys == keys and not (exact.errors or fast.errors or device.errors)
    assert fast.pixels.shape == (len(items), 224, 224, 3) and device.pixels.shape == (len(items), 3, 224, 224)
    e, f, d = _features(exact.pixels), _features(fast.pixels), _features(device.pixels)
    fast_cos, dev_cos = (e * f).sum(1), (e * d).sum(1)
    assert fast_cos.min() > 0.999 and dev_cos.min() > 0.998 and dev_cos.mean() > 0.9995, (fast_cos, dev_cos)
    # Not the same pixels by accident of a no-op: the fast path decoded the big one at 1/2 scale.
    big = keys.index("big")
    assert np.abs(exact.pixels[big].astype(int) - fast.pixels[big].astype(int)).mean() < 2.0


def test_broken_images_are_errors_and_the_rest_decodes_on_both_paths():
    good = {f"g{i}": jpeg(i) for i in range(5)}
    png = io.BytesIO()
    Image.new("RGBA", (90, 70), (10, 200, 30, 128)).save(png, "PNG")
    items = list(good.items()) + [("png", png.getvalue()), ("cut", jpeg(9)[:200]),
                                  ("junk", b"\xff\xd8\xff not really a jpeg"), ("empty", b"")]
    for decoder in (ImageDecoder(CFG), DeviceJpegDecoder(ImageDecoder(CFG), "cpu")):
        out = decoder(items)
        assert out.keys == [*good, "png"] or out.keys == [*good, "png", "cut"]
        assert {k for k, _ in out.errors} >= {"junk", "empty"}
        assert all(msg for _, msg in out.errors)


def test_streams_keep_input_order_and_use_both_lanes(shared_data):
    """Chunks much smaller than a batch, decoded ahead in a pool (and, in the hybrid stream, by
    the device lane too), come back as whole batches in input order."""
    photos = real_photos(shared_data, 20)
    items = [(f"{i:03d}-{k}", d) for i, (k, d) in enumerate(photos * 3)] + [("bad", b"\xff\xd8\xffxx")]
    cpu = ImageDecoder(CFG)
    inline = list(decode_stream(cpu, items, batch_size=16, workers=0))
    pool = decoder_pool(2)
    try:
        pooled = list(decode_stream(cpu, items, batch_size=16, workers=2, pool=pool, chunk=4))
        hybrid = hybrid_stream(DeviceJpegDecoder(cpu, "cpu"), cpu, items, 16, pool, chunk=4)
        mixed = list(hybrid)
    finally:
        pool.shutdown()
    keys = [k for k, _ in items if k != "bad"]
    for batches in (inline, pooled, mixed):
        assert [k for b in batches for k in b.keys] == keys
        assert [len(b.keys) for b in batches[:-1]] == [16] * (len(batches) - 1)
        assert [k for b in batches for k, _ in b.errors] == ["bad"]
    assert hybrid.lanes["device"] > 0 and hybrid.lanes["cpu"] > 0, hybrid.lanes
    np.testing.assert_array_equal(np.concatenate([b.pixels for b in pooled]),
                                  np.concatenate([b.pixels for b in inline]))
    mixed_px = torch.cat([torch.as_tensor(b.pixels) if isinstance(b.pixels, torch.Tensor)
                          else torch.from_numpy(b.pixels).permute(0, 3, 1, 2) for b in mixed])
    ref = torch.from_numpy(np.concatenate([b.pixels for b in inline])).permute(0, 3, 1, 2)
    assert (mixed_px.int() - ref.int()).abs().float().mean() < 1.0


def test_decode_workers_run_one_thread_each():
    """The pool's processes are the parallelism: OpenCV and torch in each run on one thread
    (a forked torch that opened its thread pool would also hang)."""
    pool = decoder_pool(2)
    try:
        threads = {pool.submit(_threads).result() for _ in range(4)}
    finally:
        pool.shutdown()
    assert threads == {(1, 1)}
    assert os.cpu_count()


def _threads():
    import cv2

    return cv2.getNumThreads(), torch.get_num_threads()


@pytest.mark.parametrize("mode", ["shortest", "squash"])
def test_fast_path_sizes_follow_the_config(mode):
    cfg = {**CFG, "resize_mode": mode, "size": 64 if mode == "shortest" else (48, 80)}
    out = ImageDecoder(cfg)([("a", jpeg(1, (300, 200)))])
    assert out.pixels.shape == ((1, 64, 64, 3) if mode == "shortest" else (1, 48, 80, 3))
    exact = ImageDecoder(cfg, fast_decode=False)([("a", jpeg(1, (300, 200)))])
    assert np.abs(out.pixels.astype(int) - exact.pixels.astype(int)).mean() < 1.5
