"""Issue 18: the W3C TDM Reservation Protocol: well-known file, response header, meta tag."""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from lait.crawler.tdmrep import parse_tdmrep, reserving_rule
from lait.pagereader import is_tdm_reserved, read_page, tdm_reservation
from lait.testkit.generator import Response
from lait.workdir import WorkDir

HTML = "text/html; charset=utf-8"
JPEG = b"\xff\xd8\xff\xe0" + b"\0" * 64


def test_tdmrep_rules_first_match_decides():
    rules = parse_tdmrep(b'[{"location": "/open/*", "tdm-reservation": 0},'
                         b' {"location": "/*.jpg$", "tdm-reservation": 1, "tdm-policy": "https://p.test/p"},'
                         b' {"location": "/news/", "tdm-reservation": 1}, {"location": 5}, "junk"]')
    assert len(rules) == 3
    assert reserving_rule(rules, "/open/a.jpg") is None  # the first matching rule says 0
    assert reserving_rule(rules, "/img/a.jpg").policy == "https://p.test/p"
    assert reserving_rule(rules, "/img/a.jpg?x=1") is None  # $ anchors the end
    assert reserving_rule(rules, "/news/today.html").location == "/news/"
    assert reserving_rule(rules, "/about.html") is None
    assert parse_tdmrep(b"{not json") == [] and parse_tdmrep(b'{"location": "/"}') == []


def test_header_and_meta():
    assert tdm_reservation("1") is True and tdm_reservation(" 0 ") is False
    assert tdm_reservation("yes") is None and tdm_reservation(None) is None
    assert is_tdm_reserved(None, True) and not is_tdm_reserved(False, True)  # the header decides
    assert not is_tdm_reserved(None, None)
    page = read_page(b'<html><head><meta name="tdm-reservation" content="1">'
                     b'<meta name="tdm-policy" content="https://p.test/policy.json"></head></html>',
                     "http://a.test/")
    assert page.tdm_reservation is True and page.tdm_policy == "https://p.test/policy.json"


class _Publisher:
    """Pages reserved by header, by meta or not at all; an image reserved by header; a tdmrep.json
    (when `well_known`) reserving /reserved/*."""

    def __init__(self, well_known: bool):
        self.well_known = well_known
        self.hits: list[str] = []
        self._lock = threading.Lock()

    def route(self, path, base_url=""):
        with self._lock:
            self.hits.append(path)
        if path == "/robots.txt":
            return Response(200, "text/plain", b"User-agent: *\nAllow: /\n")
        if path == "/.well-known/tdmrep.json":
            if not self.well_known:
                return Response(404, "text/plain", b"")
            return Response(200, "application/json",
                            b'[{"location": "/reserved/*", "tdm-reservation": 1}, {"location": "/", "tdm-reservation": 0}]')
        links = ('<a href="/by-header.html">h</a><a href="/by-meta.html">m</a>'
                 '<a href="/reserved/page.html">r</a>')
        if path == "/":
            return Response(200, HTML, (f'<html><body>{links}<img src="/img/free.jpg" alt="a">'
                                        '<img src="/img/header.jpg" alt="b"><img src="/reserved/c.jpg" alt="c">'
                                        '</body></html>').encode())
        if path == "/by-header.html":
            return Response(200, HTML, b'<html><body><a href="/after-header.html">next</a>'
                            b'<img src="/img/h.jpg" alt="h"></body></html>', {"tdm-reservation": "1"})
        if path == "/by-meta.html":
            return Response(200, HTML, b'<html><head><meta name="tdm-reservation" content="1"></head><body>'
                            b'<img src="/img/m.jpg" alt="m"></body></html>')
        if path in ("/after-header.html", "/reserved/page.html"):
            return Response(200, HTML, b"<html><body>ok</body></html>")
        if path == "/img/header.jpg":
            return Response(200, "image/jpeg", JPEG, {"tdm-reservation": "1"})
        if path.endswith(".jpg"):
            return Response(200, "image/jpeg", JPEG)
        return Response(404, "text/plain", b"")


def _crawl(tmp_path, site, **kw):
    from lait.crawler.config import CrawlConfig
    from lait.crawler.run import crawl
    from lait.testkit.server import SiteServer

    with SiteServer(site, cache_size=0) as srv:
        cfg = CrawlConfig(seeds=[srv.url + "/"], out=str(tmp_path / "w"), allow_loopback=True,
                          autothrottle=False, log_level="WARNING", n_partitions=2, **kw)
        crawl(cfg, timeout=120, quiet=True)
    work = WorkDir(tmp_path / "w")
    pages = {r["url"].split("/", 3)[3]: r for r in work.read("pages").to_pylist()}
    images = {r["image_url"].split("/", 3)[3]: r for r in work.read("images").to_pylist()}
    rejected = Counter((r["reason"], (r["image_url"] or r["page_url"]).split("/", 3)[3])
                       for r in work.read("rejected").to_pylist())
    return pages, images, rejected


@pytest.fixture(scope="module")
def reserved(tmp_path_factory):
    site = _Publisher(well_known=True)
    return site, *_crawl(tmp_path_factory.mktemp("tdm"), site)


def test_header_reserved_page_is_not_kept_but_its_links_are_followed(reserved):
    site, pages, images, _ = reserved
    assert pages["by-header.html"]["error"] == "tdm_reserved" and pages["by-header.html"]["html"] is None
    assert "after-header.html" in pages and "/img/h.jpg" not in site.hits


def test_meta_reserved_page_is_not_kept(reserved):
    site, pages, _, _ = reserved
    assert pages["by-meta.html"]["error"] == "tdm_reserved" and pages["by-meta.html"]["html"] is None
    assert "/img/m.jpg" not in site.hits


def test_header_reserved_image_is_not_kept(reserved):
    _, _, images, _ = reserved
    assert images["img/header.jpg"]["error"] == "tdm_reserved" and images["img/header.jpg"]["bytes"] is None
    assert images["img/free.jpg"]["error"] is None and images["img/free.jpg"]["bytes"]


def test_well_known_file_reserves_before_fetching(reserved):
    site, pages, images, rejected = reserved
    assert "/.well-known/tdmrep.json" in site.hits
    assert not [h for h in site.hits if h.startswith("/reserved/")]
    assert rejected == {("crawl/tdm_reserved", "reserved/c.jpg"): 1,
                        ("crawl/tdm_reserved", "reserved/page.html"): 1}
    assert "reserved/page.html" not in pages and "reserved/c.jpg" not in images


def test_tdmrep_off_fetches_everything(tmp_path):
    site = _Publisher(well_known=True)
    pages, images, rejected = _crawl(tmp_path, site, obey_tdmrep=False)
    assert not rejected and "/.well-known/tdmrep.json" not in site.hits
    assert pages["by-header.html"]["error"] is None and images["reserved/c.jpg"]["bytes"]
