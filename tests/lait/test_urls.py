"""The one http(s) rule (`lait.urls.is_http_url`) and what it keeps out of `rejected/`'s URL columns."""

from __future__ import annotations

import pytest

from lait.pagereader import read_page, resolve
from lait.parts import PartitionedWriter
from lait.urls import is_http_url
from lait.workdir import WorkDir

HOSTILE = ["javascript:alert(1)", "JaVaScRiPt:alert(document.title='pwned')", " javascript:alert(1)",
           "java\tscript:alert(1)", "\x01javascript:alert(1)", "javascript://example.org/%0Aalert(1)",
           "data:text/html,<script>alert(1)</script>", "DATA:image/png;base64,AAAA", "vbscript:msgbox(1)",
           "VBScript:msgbox(1)", "file:///etc/passwd", "ftp://example.org/a.jpg", "blob:https://example.org/x",
           "//example.org/x.jpg", "/x.jpg", "x.jpg", "http:///nohost.jpg", "http://@/x", "http://[::1/x",
           "http://example.org/a b.jpg", "http://example.org/\nx", " http://example.org/x", "", None, 42]


@pytest.mark.parametrize("url", ["http://example.org/", "https://example.org/a.jpg?x=1", "HTTP://Example.org/x",
                                 "https://[::1]:8080/x", "http://127.0.0.1:8000/p"])
def test_http_urls_pass(url):
    assert is_http_url(url)


@pytest.mark.parametrize("url", HOSTILE)
def test_everything_else_is_refused(url):
    assert not is_http_url(url)


def _by_urlsplit(url: str) -> bool:
    """The rule's definition without its shortcut for plain hosts."""
    from urllib.parse import urlsplit

    from lait.urls import _HTTP_URL_RE, _URL_CONTROLS_RE

    if not _HTTP_URL_RE.match(url) or _URL_CONTROLS_RE.search(url):
        return False
    try:
        parts = urlsplit(url)
        return parts.scheme.lower() in ("http", "https") and bool(parts.hostname)
    except ValueError:
        return False


def test_the_shortcut_for_plain_hosts_answers_as_urlsplit_does():
    import random

    rng = random.Random(0)
    pieces = ["http://", "https://", "HTTPS://", "a", "B", "0", ".", "-", "_", ":", "80", "/", "?", "#", "@",
              "[", "]", "::1", "\\", "%41", "x.jpg", "user:pw@", ":99999", "", "é"]
    urls = [rng.choice(pieces[:3]) + "".join(rng.choice(pieces) for _ in range(rng.randint(0, 6)))
            for _ in range(20000)]
    urls += ["http://a", "http://a:", "http://a:80", "http://a:8x/", "http://.", "http://-/x", "http://a_b/?q#f",
             "http://a.b:80?q", "http://a.b#f", "http://:80/", "http://a@b/", "http://[::1]/", "http://a\\b"]
    wrong = [u for u in urls if is_http_url(u) != _by_urlsplit(u)]
    assert not wrong, wrong[:10]


def test_the_page_reader_takes_no_other_scheme_from_a_page():
    page = "https://news.example.org/story.html"
    html = ('<html><head><meta property="og:image" content="JaVaScRiPt:alert(1)"></head><body>'
            '<img src="vbscript:msgbox(1)" srcset="data:image/png;base64,AAAA 2x, javascript:alert(2) 3x">'
            '<img src="  java&#9;script:alert(3)"><img src="file:///etc/passwd"><img src="/ok.jpg">'
            '<a href="JAVASCRIPT:alert(4)">x</a><a href="data:text/html,x">y</a><a href="/next">z</a>'
            '</body></html>')
    read = read_page(html, page)
    assert read.images == ["https://news.example.org/ok.jpg"]
    assert read.links == ["https://news.example.org/next"]
    # A page whose own URL or <base> is hostile resolves nothing against it.
    assert resolve("javascript:alert(1)", "x.jpg") is None
    assert read_page('<base href="javascript:alert(1)//"><img src="x.jpg">', page).images == \
        ["https://news.example.org/x.jpg"]


def test_rejected_rows_keep_other_urls_as_text_only(tmp_path):
    work = WorkDir(tmp_path / "w", n_partitions=2).init()
    parts = PartitionedWriter(work, "t")
    parts.reject("download/bad_url", 0, image_url="JaVaScRiPt:alert(1)", page_url="vbscript:x", detail="row 3")
    parts.reject("download/bad_url", 0, image_url="http://ok.test/a.jpg", page_url="", detail="row 4")
    parts.close()
    rows = work.read("rejected").to_pylist()
    assert [(r["image_url"], r["page_url"]) for r in rows] == [(None, None), ("http://ok.test/a.jpg", "")]
    assert rows[0]["detail"] == "image URL 'JaVaScRiPt:alert(1)'; page URL 'vbscript:x'; row 3"
