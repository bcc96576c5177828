"""Issue 18: robots.txt for every host a request goes to, image hosts included (RFC 9309)."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from lait.crawler.robots import MAX_BYTES, ROBOTS_REASON, parse_robots, verdict_for_status
from lait.testkit.generator import Response
from lait.workdir import WorkDir

HTML = "text/html; charset=utf-8"
JPEG = b"\xff\xd8\xff\xe0" + b"\0" * 64


def test_lait_group_first_then_star():
    rules = parse_robots(b"User-agent: *\nDisallow: /private\n\nUser-agent: lait\nDisallow: /img/\n")
    assert not rules.can_fetch("http://a.test/img/x.jpg", "lait")
    assert rules.can_fetch("http://a.test/private/x", "lait")  # lait's group replaces *
    assert not rules.can_fetch("http://a.test/private/x", "otherbot")
    other = parse_robots(b"User-agent: laitbot\nDisallow: /\n")  # another bot's token
    assert other.can_fetch("http://a.test/x", "lait")


def test_only_the_first_500_kib_are_read():
    head = b"User-agent: *\nDisallow: /private\n"
    tail = b"Disallow: /late\n"
    body = head + b"# " + b"x" * (MAX_BYTES + 10) + b"\n" + tail
    rules = parse_robots(body)
    assert not rules.can_fetch("http://a.test/private/x", "lait")
    assert rules.can_fetch("http://a.test/late", "lait")


@pytest.mark.parametrize("status,allows_all,unreachable", [
    (200, False, False), (301, True, False), (401, True, False), (403, True, False), (404, True, False),
    (429, True, False), (500, False, True), (503, False, True)])
def test_status_verdicts(status, allows_all, unreachable):
    verdict, _ = verdict_for_status(status, b"User-agent: *\nDisallow: /\n")
    assert (verdict.unreachable is not None) == unreachable
    assert (verdict.rules is None and verdict.unreachable is None) == allows_all


class _Host:
    """A host with pages and images whose robots.txt answers as `robots` says; counts hits."""

    def __init__(self, robots, image_base: str = "", delay_public: float = 0.0):
        self.robots = robots  # callable(n) -> Response, n = robots.txt requests so far
        self.image_base = image_base
        self.delay_public = delay_public
        self.hits: list[str] = []
        self._lock = threading.Lock()

    def route(self, path, base_url=""):
        path = path.split("?", 1)[0]
        with self._lock:
            self.hits.append(path)
            n = self.hits.count("/robots.txt")
        if path == "/robots.txt":
            return self.robots(n)
        if path == "/.well-known/tdmrep.json":
            return Response(404, "text/plain", b"")
        base = self.image_base
        if path == "/":
            return Response(200, HTML, (f'<html><body><img src="{base}/img/home.jpg" alt="home">'
                                        '<a href="/public.html">public</a> <a href="/private/x.html">x</a>'
                                        '</body></html>').encode())
        if path in ("/public.html", "/private/x.html"):
            if path == "/public.html":
                time.sleep(self.delay_public)
            name = path.strip("/").replace("/", "-").replace(".html", "")
            return Response(200, HTML, f'<html><body><img src="{base}/img/{name}.jpg" alt="p"></body></html>'
                            .encode())
        if path.startswith("/img/"):
            return Response(200, "image/jpeg", JPEG)
        return Response(404, "text/plain", b"")


def _text(body: bytes, status: int = 200):
    return lambda n: Response(status, "text/plain", body)


def _crawl(tmp_path, page_host: _Host, image_host: _Host | None = None, quiet: bool = True, **kw):
    from lait.crawler.config import CrawlConfig
    from lait.crawler.run import crawl
    from lait.testkit.server import SiteServer

    with SiteServer(image_host or page_host, host="127.0.0.2", cache_size=0) as img_srv:
        page_host.image_base = img_srv.url if image_host is not None else ""
        with SiteServer(page_host, cache_size=0) as srv:
            settings = dict(allow_loopback=True, autothrottle=False, download_timeout=2,
                            log_level="WARNING", n_partitions=2)
            cfg = CrawlConfig(seeds=[srv.url + "/"], out=str(tmp_path / "w"), **{**settings, **kw})
            stats = crawl(cfg, timeout=120, quiet=quiet)
    work = WorkDir(tmp_path / "w")
    pages = {r["url"].split("/", 3)[3]: r for r in work.read("pages").to_pylist()}
    images = {r["image_url"].split("/", 3)[3]: r for r in work.read("images").to_pylist()}
    rejected = Counter(r["reason"] for r in work.read("rejected").to_pylist())
    return stats, pages, images, rejected


def test_robots_txt_of_an_image_host_is_read_and_obeyed(tmp_path):
    """Acceptance 3: a second loopback host that disallows its images to lait."""
    images = _Host(_text(b"User-agent: *\nAllow: /\n\nUser-agent: lait\nDisallow: /img/\n"))
    pages = _Host(_text(b"User-agent: *\nAllow: /\n"))
    _, fetched_pages, fetched_images, rejected = _crawl(tmp_path, pages, images)
    assert "/robots.txt" in images.hits  # not dropped by the offsite filter
    assert not [h for h in images.hits if h.startswith("/img/")]
    assert fetched_images == {} and rejected == {ROBOTS_REASON: 3}
    assert {"", "public.html", "private/x.html"} <= set(fetched_pages)


def test_oversize_robots_txt_is_read_up_to_500_kib(tmp_path):
    big = b"User-agent: *\nDisallow: /private\n" + (b"# padding padding padding\n" * 540_000)  # 13.7 MB
    assert len(big) > 13_000_000
    host = _Host(_text(big))
    _, pages, images, rejected = _crawl(tmp_path, host)
    assert "private/x.html" not in pages and "img/private-x.jpg" not in images
    assert {"", "public.html"} <= set(pages) and "img/public.jpg" in images
    assert rejected == {ROBOTS_REASON: 1}


@pytest.mark.parametrize("case", ["5xx", "timeout"])
def test_unreachable_robots_txt_disallows_everything(case, tmp_path):
    def robots(n):
        if case == "timeout":
            time.sleep(4)  # beyond the 2 s download timeout
        return Response(503, "text/plain", b"busy")

    host = _Host(robots)
    stats, pages, images, rejected = _crawl(tmp_path, host)
    assert pages == {} and images == {}
    assert rejected == {"crawl/robots_unreachable": 1}  # the seed
    assert host.hits == ["/robots.txt"]  # asked once, nothing else fetched
    assert stats["finish_reason"] == "finished"


def test_unreachable_robots_txt_of_an_image_host_is_asked_again_later(tmp_path):
    images = _Host(lambda n: Response(503, "text/plain", b"") if n == 1 else
                   Response(200, "text/plain", b"User-agent: *\nAllow: /\n"))
    pages = _Host(_text(b"User-agent: *\nAllow: /\n"), delay_public=1.0)
    _, _, fetched, rejected = _crawl(tmp_path, pages, images, retry_unreachable_after=0.0)
    assert rejected["crawl/robots_unreachable"] >= 1  # the home page's image, while robots.txt failed
    assert "img/public.jpg" in fetched  # found later: robots.txt was asked again and allowed it
    assert images.hits.count("/robots.txt") >= 2


def test_robots_txt_404_allows_everything(tmp_path):
    host = _Host(_text(b"not found", status=404))
    _, pages, images, rejected = _crawl(tmp_path, host)
    assert {"", "public.html", "private/x.html"} <= set(pages)
    assert {"img/home.jpg", "img/public.jpg", "img/private-x.jpg"} <= set(images)
    assert not rejected


def test_a_host_never_connected_to_is_unreachable_not_its_robots_txt():
    from scrapy.exceptions import DownloadTimeoutError
    from twisted.internet.error import ConnectionRefusedError, DNSLookupError

    from lait.crawler.robots import HostUnreachable, RobotsUnreachable, is_no_connection, verdict_for_status

    assert is_no_connection(ConnectionRefusedError()) and is_no_connection(DNSLookupError())
    assert not is_no_connection(DownloadTimeoutError()) and not is_no_connection(ValueError())
    assert not verdict_for_status(503, b"")[0].no_connection  # an answer: the host is there
    assert HostUnreachable.reason == "crawl/host_unreachable" and issubclass(HostUnreachable, RobotsUnreachable)
