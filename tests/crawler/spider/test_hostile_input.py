"""Issue 21: inputs the crawl used to drop without a row now end in a table with their reason.

Decompression bombs (gzip and deflate, pages and images), a redirect loop, a URL longer than
Scrapy's limit, and an image URL that a page also links as a page."""

from __future__ import annotations

import gzip
import threading
import zlib

import pytest

from lait.testkit.generator import Response
from lait.workdir import WorkDir

HTML = "text/html; charset=utf-8"
JPEG = b"\xff\xd8\xff\xe0" + b"\0" * 64
BOMB = 4 << 20  # decompresses to 4 MiB; the crawl below allows 1 MiB
LONG = "/long/" + "x" * 2100 + ".html"


class _Hostile:
    def __init__(self):
        self.hits: list[str] = []
        self._lock = threading.Lock()
        self.gzip_bomb = gzip.compress(b"<html>" + b" " * BOMB)
        self.deflate_bomb = zlib.compress(b"<html>" + b" " * BOMB)

    def route(self, path, base_url=""):
        with self._lock:
            self.hits.append(path)
        if path == "/robots.txt":
            return Response(200, "text/plain", b"User-agent: *\nAllow: /\n")
        if path == "/":
            return Response(200, HTML, (
                '<html><body><a href="/bomb-gzip.html">g</a><a href="/bomb-deflate.html">d</a>'
                f'<a href="/loop-a.html">loop</a><a href="/chain/0.html">chain</a><a href="{LONG}">long</a>'
                '<a href="/pic.jpg">the photo, full size</a><img src="/pic.jpg" alt="a photo">'
                '<img src="/bomb.jpg" alt="a bomb"></body></html>').encode())
        if path == "/bomb-gzip.html":
            return Response(200, HTML, self.gzip_bomb, {"Content-Encoding": "gzip"})
        if path == "/bomb-deflate.html":
            return Response(200, HTML, self.deflate_bomb, {"Content-Encoding": "deflate"})
        if path == "/bomb.jpg":
            return Response(200, "image/jpeg", self.gzip_bomb, {"Content-Encoding": "gzip"})
        if path == "/loop-a.html":
            return Response(302, HTML, b"", {"Location": "/loop-b.html"})
        if path == "/loop-b.html":
            return Response(302, HTML, b"", {"Location": "/loop-a.html"})
        if path.startswith("/chain/"):  # /chain/0 -> /chain/1 -> ... never ending, never looping
            n = int(path.rsplit("/", 1)[1].split(".")[0])
            return Response(302, HTML, b"", {"Location": f"/chain/{n + 1}.html"})
        if path == "/pic.jpg":
            return Response(200, "image/jpeg", JPEG)
        return Response(404, "text/plain", b"")


@pytest.fixture(scope="module")
def crawled(tmp_path_factory):
    from lait.crawler.run import crawl
    from lait.testkit.server import SiteServer
    from tests.crawler.spider.conftest import crawl_config

    out = tmp_path_factory.mktemp("hostile") / "w"
    site = _Hostile()
    with SiteServer(site) as srv:
        cfg = crawl_config(out, [srv.url + "/"], max_page_bytes=1 << 20, max_image_bytes=1 << 20,
                           retries=0, download_timeout=10.0)
        stats = crawl(cfg, timeout=300, quiet=True)
    return WorkDir(out), srv.url, site, stats


def _rejected(work):
    return {(r["reason"], r["image_url"] or r["page_url"]) for r in work.read("rejected").to_pylist()}


@pytest.mark.parametrize("path", ["/bomb-gzip.html", "/bomb-deflate.html"])
def test_page_decompression_bombs_are_rejected_with_a_reason(crawled, path):
    work, base, _, stats = crawled
    assert ("crawl/decompression_bomb", base + path) in _rejected(work)
    assert base + path not in {p["url"] for p in work.read("pages", columns=["url"]).to_pylist()}
    assert stats["crawl/decompression_bomb"] == 3


def test_an_image_decompression_bomb_is_rejected_with_a_reason(crawled):
    work, base, _, _ = crawled
    assert ("crawl/decompression_bomb", base + "/bomb.jpg") in _rejected(work)
    assert base + "/bomb.jpg" not in {r["image_url"] for r in work.read("images", columns=["image_url"]).to_pylist()}


def test_a_redirect_loop_is_rejected_with_a_reason(crawled):
    work, base, site, _ = crawled
    assert ("crawl/redirect_loop", base + "/loop-a.html") in _rejected(work)
    assert "/loop-b.html" in site.hits  # followed once, refused when it pointed back


def test_a_redirect_chain_over_the_limit_is_rejected_with_a_reason(crawled):
    work, base, site, _ = crawled
    assert ("crawl/too_many_redirects", base + "/chain/0.html") in _rejected(work)
    assert "/chain/5.html" in site.hits and "/chain/6.html" not in site.hits  # the limit is 5


def test_a_url_over_the_length_limit_is_rejected_unrequested(crawled):
    work, base, site, _ = crawled
    assert ("crawl/url_too_long", base + LONG) in _rejected(work)
    assert LONG not in site.hits


def test_an_image_also_linked_as_a_page_is_fetched_as_both(crawled):
    """The page request and the image request of one URL are two requests: the image is in
    images/ with its bytes, the page request a pages/ row saying it is not HTML."""
    work, base, _, _ = crawled
    images = {r["image_url"]: r for r in work.read("images").to_pylist()}
    assert images[base + "/pic.jpg"]["bytes"] == JPEG and images[base + "/pic.jpg"]["error"] is None
    pages = {p["url"]: p for p in work.read("pages", columns=["url", "error"]).to_pylist()}
    assert pages[base + "/pic.jpg"]["error"] == "not_html"


def test_every_url_of_the_page_ends_in_a_table(crawled):
    work, base, _, _ = crawled
    seen = {p["url"] for p in work.read("pages", columns=["url"]).to_pylist()}
    seen |= {r["image_url"] for r in work.read("images", columns=["image_url"]).to_pylist()}
    seen |= {url for _, url in _rejected(work)}
    expected = {base + p for p in ("/", "/bomb-gzip.html", "/bomb-deflate.html", "/loop-a.html", "/chain/0.html", LONG,
                                   "/pic.jpg", "/bomb.jpg")}
    assert expected <= seen, expected - seen


class _UnicodeHostSite:
    """A site under a Unicode name: its index links to one more page."""

    def route(self, path, base_url=""):
        if path == "/robots.txt":
            return Response(200, "text/plain", b"User-agent: *\nAllow: /\n")
        if path == "/":
            return Response(200, HTML, '<html><body><a href="/zwei.html">zwei</a></body></html>'.encode())
        if path == "/zwei.html":
            return Response(200, HTML, b"<html><body>zwei</body></html>")
        return Response(404, "text/plain", b"")


def test_a_seed_with_a_unicode_host_is_crawled(tmp_path):
    """Issue 51: `http://bücher.test/` was dropped by Scrapy's offsite filter (its allowed domain
    was the Unicode name, its request the IDNA one) with no row, exit 0. The seed, the same-site
    rule and --resolve now all use the IDNA name, and the site is crawled."""
    import subprocess
    import sys

    from lait.testkit.server import SiteServer
    from tests.crawler.spider.conftest import crawler_env

    out = tmp_path / "w"
    with SiteServer(_UnicodeHostSite()) as srv:
        proc = subprocess.run(
            [sys.executable, "-m", "lait", "crawl", "--seeds", f"http://bücher.test:{srv.port}/", "--out", str(out),
             "--allow-loopback", "--resolve", "Bücher.test:*:127.0.0.1", "--no-autothrottle", "--log-level", "WARNING"],
            env=crawler_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    work = WorkDir(out)
    base = f"http://xn--bcher-kva.test:{srv.port}"
    pages = {(p["url"], p["status"]) for p in work.read("pages", columns=["url", "status"]).to_pylist()}
    assert pages == {(base + "/", 200), (base + "/zwei.html", 200)}
    assert work.count("rejected") == 0
