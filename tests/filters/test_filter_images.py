"""Stage 2 (`lait filter`): every bad input gets its `filter/RULE`, good images survive intact."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from lait.executor import LocalExecutor
from lait.filters.config import FilterConfig
from lait.filters.image_stage import ImageFilterStage


def run_filter(work, **settings):
    cfg = FilterConfig(work=str(work.root), workers=1, progress=False, **settings)
    cfg.validate()
    report = LocalExecutor(workers=1, retries=0, show_progress=False).run(ImageFilterStage(cfg), work)
    assert report.ok, report.summary()
    return report


def kept_rows(work):
    return {r["image_url"]: r for r in work.iter_rows("images_ok")}


def png_with_size(width: int, height: int) -> bytes:
    """A tiny PNG whose header claims width x height (a decompression bomb's header)."""
    data = bytearray(_encode(Image.new("L", (8, 8)), "PNG"))
    ihdr = 8 + 8  # signature, then length + "IHDR"
    data[ihdr:ihdr + 8] = struct.pack(">II", width, height)
    crc = zlib.crc32(bytes(data[12:12 + 4 + 13])) & 0xFFFFFFFF
    data[ihdr + 13:ihdr + 17] = struct.pack(">I", crc)
    return bytes(data)


def _encode(img, fmt, **kw):
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


def animated_gif(td) -> bytes:
    frames = [td.photo(s, 400, 400).convert("P") for s in (1, 2, 3)]
    return _encode(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)


def cut_gif() -> bytes:
    from kit.fuzz import image_seeds

    gif = image_seeds()[2]  # two frames
    return gif[: len(gif) * 6 // 10]


def bad_inputs(td) -> dict[str, tuple[bytes | None, str, dict]]:
    """name -> (bytes, expected reason, extra row fields)."""
    good = td.encode(td.photo(7, 500, 400), quality=90)
    return {
        "truncated.jpg": (good[: len(good) // 2], "filter/truncated", {}),
        "zero.jpg": (b"", "filter/empty", {}),
        "page.jpg": (b"<!DOCTYPE html><html><body>Not found</body></html>", "filter/not_an_image", {}),
        "bomb.png": (png_with_size(40_000, 40_000), "filter/decompression_bomb", {"mime": "image/png"}),
        "pixel.gif": (_encode(Image.new("P", (1, 1)), "GIF"), "filter/min_side", {"mime": "image/gif"}),
        "anim.gif": (animated_gif(td), "filter/animated", {"mime": "image/gif"}),
        # cut inside its second frame: counting the frames fails (found by scripts/fuzz.py)
        "cut.gif": (cut_gif(), "filter/truncated", {"mime": "image/gif"}),
        "wide.jpg": (td.encode(td.photo(8, 6000, 300)), "filter/aspect_ratio", {}),
        "vector.svg": (b'<svg xmlns="http://www.w3.org/2000/svg" width="800" height="600">'
                       b'<rect width="800" height="600"/></svg>', "filter/svg", {"mime": "image/svg+xml"}),
        "garbage.jpg": (bytes(range(256)) * 40, "filter/not_an_image", {}),
        "gone.jpg": (None, "filter/status", {"status": 404}),
        "blank.png": (_encode(Image.new("RGB", (500, 500), (255, 255, 255)), "PNG"),
                      "filter/uninformative", {"mime": "image/png"}),
        "small.jpg": (td.encode(td.photo(9, 400, 250)), "filter/min_side", {}),
        "tiff.tif": (_encode(td.photo(10, 400, 400), "TIFF"), "filter/format", {"mime": "image/tiff"}),
    }


def test_every_bad_input_has_its_reason_and_nothing_else_is_lost(make_work, td):
    work = make_work(n_partitions=2)
    bad = bad_inputs(td)
    rows = [td.image_row(f"http://site.test/{name}", data, **extra) for name, (data, _, extra) in bad.items()]
    good = {f"http://site.test/good-{i}.jpg": td.encode(td.photo(100 + i), quality=88) for i in range(6)}
    rows += [td.image_row(url, data) for url, data in good.items()]
    td.write_table(work, "images", rows, "image_url")

    run_filter(work, formats=["JPEG", "PNG", "GIF", "WEBP"])

    rejected = td.rejected_by_url(work)
    expected = {f"http://site.test/{name}": reason for name, (_, reason, _) in bad.items()}
    assert rejected == expected
    kept = kept_rows(work)
    assert set(kept) == set(good)
    for url, row in kept.items():
        assert row["bytes"] == good[url]  # an upright RGB JPEG is stored as fetched
        assert (row["width"], row["height"], row["format"]) == (480, 360, "JPEG")
        assert len(row["sha256"]) == 64 and len(row["phash"]) == 16
    # the funnel adds up: every input row is either kept or rejected
    assert work.count("images_ok") + work.count("rejected") == len(rows)


def test_a_row_without_bytes_is_dropped_for_what_its_error_says(make_work, td):
    """The fetch's error (crawl and ingest write one vocabulary, lait.reasons) names the reason."""
    work = make_work(n_partitions=2)
    errors = {"noai": ("noai", 200), "404": ("http_404", 404), "html": ("not_image", 200),
              "timeout": ("download/TimeoutError", 0), "empty": ("empty", 200)}
    rows = [{**td.image_row(f"http://site.test/{name}.jpg", None, status=status), "error": error}
            for name, (error, status) in errors.items()]
    td.write_table(work, "images", rows, "image_url")
    run_filter(work)
    assert td.rejected_by_url(work) == {
        "http://site.test/noai.jpg": "filter/noai", "http://site.test/404.jpg": "filter/status",
        "http://site.test/html.jpg": "filter/not_image", "http://site.test/timeout.jpg": "filter/download",
        "http://site.test/empty.jpg": "filter/empty"}


def test_converted_modes_are_reencoded_as_rgb_jpeg(make_work, td):
    work = make_work()
    base = td.photo(3, 400, 320)
    cmyk = td.encode(base.convert("CMYK"), quality=95)
    grad = (np.linspace(0, 65535, 400, dtype=np.uint32)[None, :].repeat(320, 0)).astype(np.uint16)
    png16 = _encode(Image.fromarray(grad), "PNG")
    rgba = base.convert("RGBA")
    rgba.putalpha(Image.new("L", base.size, 0).point(lambda _: 0))  # fully transparent
    rgba.paste(base.crop((0, 0, 200, 320)), (0, 0))  # left half opaque photo
    palette = base.convert("P", palette=Image.Palette.ADAPTIVE, colors=256)
    rows = [td.image_row("http://s.test/cmyk.jpg", cmyk),
            td.image_row("http://s.test/16bit.png", png16, mime="image/png"),
            td.image_row("http://s.test/alpha.png", _encode(rgba, "PNG"), mime="image/png"),
            td.image_row("http://s.test/palette.png", _encode(palette, "PNG"), mime="image/png")]
    td.write_table(work, "images", rows, "image_url")
    run_filter(work, flat_max_colours=8, dedup=False)
    kept = kept_rows(work)
    assert set(kept) == {r["image_url"] for r in rows}, td.rejected_by_url(work)
    for url, row in kept.items():
        img = Image.open(io.BytesIO(row["bytes"]))
        assert (img.format, img.mode, img.size) == ("JPEG", "RGB", (400, 320)), url
    grey = np.asarray(Image.open(io.BytesIO(kept["http://s.test/16bit.png"]["bytes"])).convert("L"), np.int32)
    # 16-bit values are scaled to 8 bits, not clipped: the gradient spans black to white
    assert grey[:, :5].mean() < 10 and grey[:, -5:].mean() > 245 and 100 < grey[:, 200].mean() < 155
    alpha = np.asarray(Image.open(io.BytesIO(kept["http://s.test/alpha.png"]["bytes"])), np.int32)
    assert alpha[:, 250:].mean() > 250  # transparent pixels are composited over white
    assert kept["http://s.test/cmyk.jpg"]["format"] == "JPEG"
    cmyk_back = np.asarray(Image.open(io.BytesIO(kept["http://s.test/cmyk.jpg"]["bytes"])), np.int32)
    assert np.abs(cmyk_back - np.asarray(base, np.int32)).mean() < 12  # colours survive CMYK


def test_exif_orientation_is_applied(make_work, td):
    work = make_work()
    img = td.photo(4, 600, 400)
    exif = Image.Exif()
    exif[0x0112] = 6  # stored landscape, shown rotated 90 degrees clockwise
    data = td.encode(img, quality=90, exif=exif)
    td.write_table(work, "images", [td.image_row("http://s.test/rot.jpg", data)], "image_url")
    run_filter(work)
    (row,) = kept_rows(work).values()
    assert (row["width"], row["height"]) == (400, 600)
    stored = Image.open(io.BytesIO(row["bytes"]))
    assert stored.size == (400, 600) and row["bytes"] != data


def test_animated_first_frame_policy_keeps_frame_one(make_work, td):
    work = make_work()
    td.write_table(work, "images", [td.image_row("http://s.test/a.gif", animated_gif(td), mime="image/gif")],
                   "image_url")
    run_filter(work, animated="first_frame")
    (row,) = kept_rows(work).values()
    assert row["format"] == "GIF" and Image.open(io.BytesIO(row["bytes"])).format == "JPEG"


def test_duplicates_within_a_partition(make_work, td):
    work = make_work()
    original = td.photo(11, 480, 360)
    data = td.encode(original, quality=90)
    near = td.encode(original.resize((442, 331), Image.Resampling.BILINEAR), quality=72)
    other = td.encode(td.photo(12, 480, 360), quality=90)
    rows = [td.image_row("http://s.test/a.jpg", data), td.image_row("http://cdn.test/a.jpg", data),
            td.image_row("http://s.test/a-small.jpg", near), td.image_row("http://s.test/b.jpg", other)]
    td.write_table(work, "images", rows, "image_url")
    run_filter(work, dedup=True)
    assert set(kept_rows(work)) == {"http://s.test/a.jpg", "http://s.test/b.jpg"}
    assert td.rejected_by_url(work) == {"http://cdn.test/a.jpg": "filter/duplicate_sha256",
                                        "http://s.test/a-small.jpg": "filter/duplicate_phash"}


def test_phash_collision_of_different_simple_images_is_not_a_duplicate(make_work, td):
    """Two flat images that differ only in colour share a phash; the thumbnail check keeps both."""
    work = make_work()
    a, b = (td.photo(20, 400, 400), td.photo(20, 400, 400))
    b = Image.fromarray(255 - np.asarray(b)[:, :, ::-1])  # same structure, other colours
    rows = [td.image_row("http://s.test/a.jpg", td.encode(a)), td.image_row("http://s.test/b.jpg", td.encode(b))]
    td.write_table(work, "images", rows, "image_url")
    run_filter(work, phash_distance=64, dedup=True)  # every pair is a phash candidate
    assert len(kept_rows(work)) == 2


def test_large_jpeg_is_reencoded_and_rerun_is_identical(make_work, td):
    work = make_work()
    data = td.encode(td.photo(30, 800, 600), quality=100)
    td.write_table(work, "images", [td.image_row("http://s.test/big.jpg", data)], "image_url")
    run_filter(work, keep_jpeg_max_bytes=len(data) - 1)
    (row,) = kept_rows(work).values()
    assert row["bytes"] != data and Image.open(io.BytesIO(row["bytes"])).size == (800, 600)
    done = work.done_stats("filter")
    assert done[0]["counters"]["filter/reencoded"] == 1


def test_config_yaml_section_and_validation(tmp_path):
    from lait.config import ConfigError

    path = tmp_path / "p.yaml"
    path.write_text("filter:\n  min_side: 200\n  formats: [jpeg, png]\nclean:\n  min_words: 3\n")
    data = FilterConfig.load_yaml(path)
    cfg = FilterConfig.from_dict({**data, "work": "w"})
    cfg.validate()
    assert cfg.min_side == 200 and cfg.formats == ["JPEG", "PNG"]
    with pytest.raises(ConfigError):
        FilterConfig(work="w", max_aspect=0.5).validate()


def test_phash_matches_imagehash(td):
    import imagehash

    from lait.filters.image_stage import phash_of

    for seed in range(20):
        img = td.photo(seed, 300 + seed * 7, 240 + seed * 3)
        assert phash_of(img) == int(str(imagehash.phash(img)), 16)


def test_sha256_taken_ahead_on_a_thread_belongs_to_each_row(make_work, td, monkeypatch):
    """The digests are taken a batch ahead on a thread: every kept row's sha256 is that of its
    own bytes, and exact duplicates are found across batches, as when hashed inline."""
    import hashlib

    from lait.filters import image_stage

    monkeypatch.setattr(image_stage, "HASH_BATCH", 4)  # several batches out of a few rows
    photos = [td.encode(td.photo(40 + i, 320, 320), quality=85) for i in range(5)]
    rows = [td.image_row(f"http://s.test/{i}.jpg", photos[i % 5]) for i in range(13)]
    rows.insert(6, td.image_row("http://s.test/missing.jpg", None, status=404))
    rows.insert(9, td.image_row("http://s.test/empty.jpg", b""))
    for dedup in (False, True):
        work = make_work(name=f"dedup-{dedup}")
        td.write_table(work, "images", rows, "image_url")
        run_filter(work, dedup=dedup)
        kept = kept_rows(work)
        assert len(kept) == (5 if dedup else 13)
        for url, row in kept.items():
            assert row["sha256"] == hashlib.sha256(photos[int(url.rsplit("/", 1)[1][:-4]) % 5]).hexdigest()
        rejected = td.rejected_by_url(work)
        assert rejected.pop("http://s.test/missing.jpg") == "filter/status"
        assert rejected.pop("http://s.test/empty.jpg") == "filter/empty"
        assert rejected == ({f"http://s.test/{i}.jpg": "filter/duplicate_sha256" for i in range(5, 13)}
                            if dedup else {})


def test_sha256_ahead_yields_every_row_in_order():
    """`_with_sha256`: each row once, in order, with its digest; None where `_one` hashes (or
    rejects) the row itself: no bytes, too many bytes, a value hashlib refuses."""
    import hashlib

    from lait.filters.image_stage import HASH_BATCH, _with_sha256
    from lait.writers import helper_thread

    values = [bytes([i]) * (3000 + i) for i in range(2 * HASH_BATCH + 3)]
    values[1], values[2], values[HASH_BATCH + 1] = None, b"x" * 10_000, 7
    rows = [{"image_url": str(i), "bytes": v} for i, v in enumerate(values)]
    with helper_thread("test") as helper:
        got = list(_with_sha256(iter(rows), 9_999, helper))
        assert [r for r, _ in got] == rows
        assert [d for _, d in got] == [None if i in (1, 2, HASH_BATCH + 1) else hashlib.sha256(v).hexdigest()
                                       for i, v in enumerate(values)]
        assert list(_with_sha256(iter([]), 10, helper)) == []
