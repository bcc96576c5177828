"""Small WARC files written with warcio's writer, for the ingest tests."""

from __future__ import annotations

import io
import json
from pathlib import Path

from PIL import Image
from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter


def png_bytes(w: int = 40, h: int = 30) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), (200, 30, 30)).save(buf, "PNG")
    return buf.getvalue()


def page_html(i: int) -> bytes:
    return (f'<html><head><title>p{i}</title><meta property="og:image" content="/og{i}.jpg"></head>'
            f'<body><p>Page {i} text.</p><img src="/img/a{i}.jpg" alt="a red bus {i}">'
            f'<img data-src="img/b{i}.png" title="title {i}"><img src="data:image/gif;base64,R0l">'
            f'</body></html>').encode() * 3


def response(writer: WARCWriter, url: str, body: bytes, content_type: str, status: str = "200 OK",
             extra: list[tuple[str, str]] | None = None) -> None:
    headers = StatusAndHeaders(status, [("Content-Type", content_type), *(extra or [])], protocol="HTTP/1.1")
    writer.write_record(writer.create_warc_record(url, "response", payload=io.BytesIO(body),
                                                  http_headers=headers))


def wat_record(writer: WARCWriter, page_url: str, links: list[dict], robots: str | None = None) -> None:
    headers = {"Content-Type": "text/html"}
    if robots:
        headers["X-Robots-Tag"] = robots
    doc = {"Envelope": {
        "WARC-Header-Metadata": {"WARC-Type": "response", "WARC-Target-URI": page_url},
        "Payload-Metadata": {"HTTP-Response-Metadata": {
            "Headers": headers,
            "HTML-Metadata": {"Links": links}}}}}
    writer.write_record(writer.create_warc_record(
        page_url, "metadata", payload=io.BytesIO(json.dumps(doc).encode()),
        warc_content_type="application/json"))


def write_site_warc(path: Path, n_pages: int = 4, *, gzip: bool = True) -> Path:
    """n_pages HTML pages, one PNG per page, a 404 page, a noai page and a noai image."""
    with open(path, "wb") as f:
        w = WARCWriter(f, gzip=gzip)
        for i in range(n_pages):
            response(w, f"http://ex.test/p{i}.html", page_html(i), "text/html; charset=utf-8")
            response(w, f"http://ex.test/img/b{i}.png", png_bytes(40 + i, 30), "image/png")
        response(w, "http://ex.test/missing.html", b"<html>gone</html>", "text/html", status="404 Not Found")
        response(w, "http://ex.test/private.html", page_html(99), "text/html", extra=[("X-Robots-Tag", "noai")])
        response(w, "http://ex.test/img/secret.png", png_bytes(), "image/png",
                 extra=[("X-Robots-Tag", "googlebot: noindex, noimageai")])
        response(w, "http://ex.test/style.css", b"body{}", "text/css")
    return path


import sys  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture
def factory():
    """This module: the WARC-writing helpers above."""
    return sys.modules[__name__]
