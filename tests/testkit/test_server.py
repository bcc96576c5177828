"""The loopback server speaks HTTP/1.1 correctly for the site's routes."""

from __future__ import annotations

import http.client
import io
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import pytest
from PIL import Image

from lait.testkit.generator import NOAI_IMAGE_PAGE, NOAI_PAGE, generate_site
from lait.testkit.server import SiteServer


@pytest.fixture(scope="module")
def server():
    with SiteServer(generate_site(40, seed=1), port=0) as srv:
        yield srv


def _conn(server) -> http.client.HTTPConnection:
    u = urlsplit(server.url)
    return http.client.HTTPConnection(u.hostname, u.port, timeout=10)


def test_url_is_loopback_with_real_port(server):
    assert server.url.startswith("http://127.0.0.1:") and server.port > 0


def test_keep_alive_get_head_and_404(server):
    conn = _conn(server)  # one connection for all requests: keep-alive must work
    conn.request("GET", "/robots.txt")
    r = conn.getresponse()
    body = r.read()
    assert r.status == 200 and b"Disallow: /private/" in body
    assert f"Sitemap: {server.url}/sitemap.xml".encode() in body
    assert int(r.headers["Content-Length"]) == len(body)

    conn.request("GET", "/img/00003/photo-0.jpg")
    r = conn.getresponse()
    img = r.read()
    assert r.headers["Content-Type"] == "image/jpeg"
    assert min(Image.open(io.BytesIO(img)).size) >= 300

    conn.request("HEAD", "/img/00003/photo-0.jpg")
    r = conn.getresponse()
    assert r.read() == b"" and int(r.headers["Content-Length"]) == len(img)

    conn.request("GET", "/does/not/exist.html")
    r = conn.getresponse()
    r.read()
    assert r.status == 404
    conn.close()


def test_noai_headers(server):
    site = server.site
    conn = _conn(server)
    for path, expected in ((site.article_path(NOAI_PAGE), "noai"),
                           (f"/img/{NOAI_IMAGE_PAGE:05d}/photo-0.jpg", "noai"),
                           (site.article_path(0), None)):
        conn.request("GET", path)
        r = conn.getresponse()
        r.read()
        assert r.status == 200 and r.headers.get("X-Robots-Tag") == expected, path
    conn.close()


def test_og_image_is_absolute_on_this_server(server):
    conn = _conn(server)
    conn.request("GET", server.site.article_path(1))  # index 1: an og:image page
    html = conn.getresponse().read().decode()
    assert f'property="og:image" content="{server.url}/img/00001/social.jpg"' in html


def test_concurrent_requests(server):
    paths = [f"/img/{i:05d}/photo-0.jpg" for i in range(20)] + ["/", "/sitemap.xml"]

    def fetch(path: str) -> int:
        conn = _conn(server)
        conn.request("GET", path)
        r = conn.getresponse()
        r.read()
        conn.close()
        return r.status

    with ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(fetch, paths))
    assert statuses.count(200) == len(paths)
