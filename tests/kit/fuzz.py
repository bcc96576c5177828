"""Fuzz targets: lait's hostile-input surfaces, each as one function of bytes that returns, or
raises only the error its module documents. Anything else escaping is a bug.

- `page_reader`: `lait.pagereader` on any bytes (a crawled page): never raises.
- `warc_reader`: an archive file through `WarcReader`, `parse_http` (`HttpError`) and
  `decode_body`, then through `ingest_file` end to end: damage is reported, never raised, and
  `ingest_file` must not report a failure of its own.
- `image_decode`: stage 2's path for one fetched image: kept, or `ImageRejected` with a
  registered `filter/` rule; never the catch-all `filter/error`.
- `config_loader`: a YAML file (or `--set` assignments) into every command's config: a config,
  or a `ConfigError`.

The hypothesis tests (`tests/**/test_fuzz_*.py`: bounded in the suite, long with `make fuzz`)
and the atheris harness (`scripts/fuzz.py`) call these same functions, starting from `seeds`
and mutating them with `mutate`.
"""

from __future__ import annotations

import io
import tempfile
from pathlib import Path
from typing import Any, Callable

PAGE_URL = "http://fuzz.test/dir/page.html"
ENCODINGS = (None, "utf-8", "latin-1", "gb18030", "shift_jis", "utf-16", "no-such-charset")


# -- mutations ---------------------------------------------------------------------------------

def mutate(data: bytes, ops: list[tuple[int, int, int]]) -> bytes:
    """`data` after a list of edits (kind, position, value), each position taken modulo the
    current length: 0 flips a byte, 1 inserts one, 2 deletes a run, 3 truncates, 4 repeats a
    run, 5 overwrites with a boundary value (0x00, 0xff, 0x7f, 0x80, '<', '\\n')."""
    buf = bytearray(data)
    for kind, pos, value in ops:
        n = len(buf)
        at = pos % (n + 1)
        kind %= 6
        if kind == 0 and n:
            buf[at % n] ^= (value % 255) + 1
        elif kind == 1:
            buf.insert(at, value % 256)
        elif kind == 2:
            del buf[at:at + 1 + value % 64]
        elif kind == 3:
            del buf[at:]
        elif kind == 4 and n:
            run = bytes(buf[at:at + 1 + value % 256])
            buf[at:at] = run * (1 + value % 4)
        elif kind == 5 and n:
            buf[at % n] = (0x00, 0xFF, 0x7F, 0x80, 0x3C, 0x0A)[value % 6]
    return bytes(buf)


# -- page reader -------------------------------------------------------------------------------

def page_reader(data: bytes, encoding: str | None = None) -> None:
    """Read a page as the crawl, the WARC ingest and stage 3 do; nothing may raise."""
    from lait.pagereader import image_elements, is_noai, parse_page, read_page, robots_directives
    from lait.urls import is_http_url

    read = read_page(data, PAGE_URL, encoding)
    for url in read.images + read.links:
        assert is_http_url(url), url
    tree, _ = parse_page(data, encoding)
    if tree is not None:
        for image in image_elements(tree, PAGE_URL):
            assert image.urls
    is_noai(robots_directives(data[:200].decode("latin-1")))


def page_seeds() -> list[bytes]:
    return [
        b'<html><head><base href="/x/"><meta property="og:image" content="og.jpg"><meta name="robots" '
        b'content="noai"></head><body><p>Text</p><img src="a.jpg" srcset="b.jpg 2x, c,d.jpg 300w" alt="A">'
        b'<picture><source srcset="e.webp"><img data-src="f.jpg"></picture><a href="../n.html">n</a>'
        b'<a rel="nofollow" href="/no">no</a><area href="//other.test/z"></body></html>',
        '<!doctype html><meta charset="gb2312"><img src="/猫.jpg" alt="一只猫">'.encode("gb18030") + b"\xff\xfe",
        b"<div>" * 300 + b'<img src="deep.jpg">',
        b'<?xml version="1.0" encoding="utf-8"?><html><img src="javascript:x"><img src="http://[::1">',
    ]


# -- WARC reader -------------------------------------------------------------------------------

def warc_reader(data: bytes, workdir: str | Path | None = None) -> None:
    """An archive of these bytes read record by record, each response split and decoded; then
    `ingest_file` on it (into `workdir`, a fresh temporary folder by default)."""
    from lait.crawler.warc import HttpError, WarcReader, decode_body, looks_like_archive, parse_http
    from lait.crawler.warc_ingest import ingest_file
    from lait.workdir import WorkDir

    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        path = Path(tmp) / "fuzz.warc.gz"
        path.write_bytes(data)
        looks_like_archive(path)
        reader = WarcReader(path, max_record_bytes=1 << 20)
        for rec in reader:
            if rec.block is not None and rec.type == "response":
                try:
                    resp = parse_http(rec.block)
                except HttpError:
                    continue
                decode_body(resp)
        for d in reader.damage:
            assert d.rule, d
        work = WorkDir(Path(tmp) / "work", n_partitions=2).init()
        report = ingest_file(path, work.url)
        assert report.failed is None, report.failed


def warc_seeds() -> list[bytes]:
    """Small archives: gzipped and plain, a page, an image, a WAT record, a chunked body."""
    import gzip
    import json

    from warcio.statusandheaders import StatusAndHeaders
    from warcio.warcwriter import WARCWriter

    def archive(gz: bool) -> bytes:
        buf = io.BytesIO()
        w = WARCWriter(buf, gzip=gz)
        for url, ctype, body, extra in [
            ("http://ex.test/p.html", "text/html", page_seeds()[0], []),
            ("http://ex.test/a.jpg", "image/jpeg", image_seeds()[0], []),
            ("http://ex.test/z.html", "text/html", gzip.compress(b"<html><img src=z.png></html>"),
             [("Content-Encoding", "gzip")]),
            ("http://ex.test/c.html", "text/html", b"5\r\n<html\r\n0\r\n\r\n", [("Transfer-Encoding", "chunked")]),
        ]:
            headers = StatusAndHeaders("200 OK", [("Content-Type", ctype), *extra], protocol="HTTP/1.1")
            w.write_record(w.create_warc_record(url, "response", payload=io.BytesIO(body), http_headers=headers))
        doc = {"Envelope": {"WARC-Header-Metadata": {"WARC-Type": "response", "WARC-Target-URI": "http://ex.test/w"},
                            "Payload-Metadata": {"HTTP-Response-Metadata": {"Headers": {}, "HTML-Metadata": {
                                "Links": [{"path": "IMG@/src", "url": "/w.jpg", "alt": "w"}]}}}}}
        w.write_record(w.create_warc_record("http://ex.test/w", "metadata", payload=io.BytesIO(json.dumps(doc).encode()),
                                            warc_content_type="application/json"))
        return buf.getvalue()

    return [archive(True), archive(False)]


# -- image decode ------------------------------------------------------------------------------

def image_decode(data: bytes, mime: str | None = "image/jpeg") -> str | None:
    """Stage 2 on one fetched image: None when kept, else its `filter/` rule. Raises only if the
    path lets an error other than `ImageRejected` through (the stage would record `filter/error`)."""
    from datetime import datetime, timezone

    from lait.filters.config import FilterConfig
    from lait.filters.image_decode import ImageRejected
    from lait.filters.image_stage import ImageFilterStage, NearDuplicateIndex
    from lait.reasons import REASONS
    from lait.rules import Drop

    cfg = FilterConfig(work=".", min_side=1, max_aspect=1000.0, max_pixels=4_000_000, animated="first_frame",
                       uninformative="flat")
    cfg.validate()
    stage = ImageFilterStage(cfg)
    row = {"image_url": "http://fuzz.test/i", "page_url": PAGE_URL, "bytes": data, "mime": mime, "status": 200,
           "fetched_at": datetime(2026, 1, 1, tzinfo=timezone.utc), "error": None}
    kept: dict[str, str] = {}
    near = NearDuplicateIndex(cfg.phash_distance, cfg.near_dup_max_diff)
    try:
        out = stage._one(row, stage.rules(kept, near, stage._classifier()), kept, near)
    except ImageRejected as rej:  # a decoder's
        out = Drop(rej.rule, rej.detail)
    if isinstance(out, Drop):
        assert f"filter/{out.rule}" in REASONS and out.rule != "error", out.rule
        return out.rule
    return None


def image_seeds() -> list[bytes]:
    """One small image per format stage 2 meets: JPEG (with EXIF rotation), PNG with alpha,
    palette GIF (animated), WebP, 16-bit TIFF, BMP, CMYK JPEG."""
    from PIL import Image

    out = []
    base = Image.new("RGB", (48, 32))
    base.putdata([((x * 5) % 256, (y * 8) % 256, (x * y) % 256) for y in range(32) for x in range(48)])

    def save(img: Image.Image, fmt: str, **kw: Any) -> bytes:
        buf = io.BytesIO()
        img.save(buf, fmt, **kw)
        return buf.getvalue()

    exif = Image.Exif()
    exif[0x0112] = 6
    out.append(save(base, "JPEG", quality=80, exif=exif.tobytes()))
    out.append(save(base.convert("RGBA"), "PNG"))
    frames = [base.convert("P"), base.rotate(90, expand=False).convert("P")]
    out.append(save(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=50, loop=0))
    out.append(save(base, "WEBP", quality=70))
    import numpy as np

    wide = (np.asarray(base.convert("L"), dtype=np.uint16) * 257).astype(np.uint16)  # the whole 16-bit range
    out.append(save(Image.frombytes("I;16", base.size, wide.astype("<u2").tobytes()), "TIFF"))
    out.append(save(base, "BMP"))
    out.append(save(base.convert("CMYK"), "JPEG"))
    return out


# -- config loader -----------------------------------------------------------------------------

def config_classes() -> list[type]:
    """The config dataclasses of the stages' and the trainer's commands (the app layer's few
    settings resolve the same way, through the same `lait.config`)."""
    from lait.build.config import BuildConfig
    from lait.crawler.config import CrawlConfig
    from lait.filters.config import CleanConfig, FilterConfig
    from lait.scoring.config import ScoreConfig
    from lait.train.config import EvalConfig, FinetuneConfig, PretrainConfig

    return [PretrainConfig, FinetuneConfig, EvalConfig, FilterConfig, CleanConfig, ScoreConfig, BuildConfig,
            CrawlConfig]


def config_loader(text: bytes, overrides: list[str] = (), classes: list[type] | None = None,
                  workdir: str | Path | None = None) -> None:
    """A YAML file of these bytes as `--config` of every command, then `--set` `overrides`:
    each ends as a validated config or a ConfigError."""
    import argparse

    from lait.config import ConfigError

    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        path = Path(tmp) / "config.yaml"
        path.write_bytes(text)
        for cls in classes or config_classes():
            args = argparse.Namespace(config=str(path), set_overrides=list(overrides))
            try:
                cfg = cls.from_args(args)
            except ConfigError as exc:
                assert "\n" not in str(exc), str(exc)  # one line
                continue
            cfg.to_yaml()  # a config that loaded can be written back as the resolved config


def config_paths(cls: type, prefix: str = "") -> list[str]:
    """Every dotted setting path of a config class, nested ones included (list items 0 and 1):
    where a `--set` lands on a real setting."""
    import dataclasses
    import typing

    out = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        path = prefix + f.name
        out.append(path)
        tp = hints[f.name]
        inner = [a for a in typing.get_args(tp) or (tp,) if dataclasses.is_dataclass(a)]
        inner += [b for a in typing.get_args(tp) for b in typing.get_args(a) if dataclasses.is_dataclass(b)]
        for sub in inner:
            is_list = typing.get_origin(tp) is list or any(typing.get_origin(a) is list for a in typing.get_args(tp))
            for p in ([f"{path}.0.", f"{path}.1."] if is_list else [f"{path}."]):
                out += config_paths(sub, p)
    return list(dict.fromkeys(out))


def config_seeds() -> list[bytes]:
    from lait.train.model import CONFIG_DIR

    example = (CONFIG_DIR / "pretrain-example.yaml").read_bytes()
    return [example, b"filter: {min_side: 300, max_aspect: 3.0}\nclean: {languages: [en]}\n"
                     b"build: {samples_per_shard: 10000, min_score: 0.28}\n",
            b"stages:\n  - {shards: d/, optim: {lr: 1e-4, betas: [0.9, 0.99]}, tasks: {moc: 0}}\n"
            b"data: {regions: {source: patches, patch_grid: [2, 2]}}\nseeds: [http://a.test/]\nout: w\n"]


TARGETS: dict[str, tuple[Callable[..., Any], Callable[[], list[bytes]]]] = {
    "page_reader": (page_reader, page_seeds),
    "warc_reader": (warc_reader, warc_seeds),
    "image_decode": (image_decode, image_seeds),
    "config_loader": (config_loader, config_seeds),
}
