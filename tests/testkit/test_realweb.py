"""Real-web mode: real pages, every image made local, planted photo-caption figures."""

from __future__ import annotations

import io
from urllib.parse import urlsplit

import lxml.html
import pytest
from PIL import Image

from lait.testkit.realweb import RealWebSite
from lait.testkit.server import SiteServer


@pytest.fixture(scope="module")
def site(shared_data):
    return RealWebSite(shared_data)


@pytest.fixture(scope="module")
def truth(site):
    return site.ground_truth()


def _on_host(url: str) -> bool:
    """Whether a reference stays on the serving host (or is no web URL at all: data:, file:)."""
    parts = urlsplit(url.strip())
    return parts.scheme not in ("", "http", "https") or (not parts.scheme and not parts.netloc)


def test_all_pages_listed_and_served(site, truth):
    paths = [p for p in truth["pages"] if p != "/"]
    assert len(paths) >= 300  # 130 readability + 181 benchmark pages
    index = lxml.html.fromstring(site.route("/").body)
    assert set(index.xpath("//a/@href")) == set(paths)
    sitemap = site.route("/sitemap.xml").body.decode()
    assert all(p in sitemap for p in paths[:50])
    assert any(truth["pages"][p]["source"] == "aeb" for p in paths)
    assert any(p.startswith("/readability/") for p in paths)


def test_no_image_points_off_host(site, truth):
    for path, page in truth["pages"].items():
        if path == "/" or not page["parse_ok"]:
            continue
        doc = lxml.html.fromstring(site.route(path).body)
        for el in doc.iter("img", "source"):
            if el.tag == "source" and next(el.iterancestors("picture"), None) is None:
                continue  # <audio>/<video> media, not images
            for attr in ("src", "data-src", "data-lazy-src", "data-original"):
                if el.get(attr):
                    assert _on_host(el.get(attr)), (path, attr, el.get(attr))
            for attr in ("srcset", "data-srcset"):
                for cand in (el.get(attr) or "").split(", "):
                    url = (cand.split() or [""])[0]
                    assert _on_host(url), (path, attr, cand)
        for content in doc.xpath("//meta[@property='og:image']/@content"):
            assert _on_host(content), (path, content)


def test_planted_figures_present_and_served(site, truth):
    planted = 0
    for path, page in truth["pages"].items():
        if path == "/":
            continue
        refs = [r for r in page["images"] if r["true_caption"]]
        assert refs, path
        html = site.route(path).body.decode("utf-8")
        doc = lxml.html.fromstring(html)
        captions = doc.xpath("//figure[@class='lait-planted']/figcaption/text()")
        for ref in refs:
            assert ref["true_caption"] in captions, path
            info = truth["images"][ref["url"]]
            assert info["keep"] and ref["true_caption"] in info["true_captions"]
            planted += 1
    assert planted >= 300
    url = next(u for u, i in truth["images"].items() if i["true_captions"])
    img = Image.open(io.BytesIO(site.route(url).body))
    assert img.size == (truth["images"][url]["width"], truth["images"][url]["height"])


def test_substituted_images_served_with_stated_size(site, truth):
    subs = [u for u, i in truth["images"].items() if i["substituted"]]
    assert len(subs) > 100
    for url in subs[::50]:
        resp = site.route(url)
        assert resp.status == 200 and resp.content_type == "image/jpeg"
        img = Image.open(io.BytesIO(resp.body))
        assert img.size == (truth["images"][url]["width"], truth["images"][url]["height"])


def test_served_over_http(site):
    import urllib.request

    with SiteServer(site) as srv:
        page = site.page_paths()[1]
        body = urllib.request.urlopen(srv.url + page, timeout=30).read()
        assert b"lait-planted" in body


def test_another_page_directory_is_served_with_local_images(shared_data, tmp_path):
    """`pages_dir`: the real-web mode over other pages (bench/captions/unseen_pages.py's layout)."""
    import json

    (tmp_path / "pages").mkdir()
    (tmp_path / "pages" / "abc123.html").write_text(
        '<html lang="de"><body><p>' + "Ein langer Absatz über den Hafen und seine Boote. " * 3 +
        '</p><img src="https://cdn.example.org/boot.jpg" alt="Ein Boot im Hafen"></body></html>')
    (tmp_path / "index.json").write_text(json.dumps(
        [{"id": "abc123", "url": "https://example.org/hafen", "site": "example.org", "file": "pages/abc123.html"}]))
    site = RealWebSite(shared_data, pages_dir=tmp_path)
    assert site.page_paths() == ["/", "/example.org/abc123.html"]
    body = site.route("/example.org/abc123.html").body.decode()
    assert "cdn.example.org" not in body and "/photos/r/" in body and "lait-planted" in body
    truth = site.ground_truth()["pages"]["/example.org/abc123.html"]
    assert truth["original_url"] == "https://example.org/hafen" and truth["lang"] == "de"
    with pytest.raises(FileNotFoundError, match="index.json"):
        RealWebSite(shared_data, pages_dir=tmp_path / "pages")
