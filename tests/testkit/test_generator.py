"""The synthetic site: deterministic, fully linked, and true to its ground truth."""

from __future__ import annotations

import io
import json
from collections import Counter, deque

import imagehash
import lxml.html
import pytest
from PIL import Image

from lait.testkit.generator import NOAI_IMAGE_PAGE, NOAI_PAGE, generate_site


@pytest.fixture(scope="module")
def site():
    return generate_site(40, seed=7)


@pytest.fixture(scope="module")
def truth(site):
    return site.ground_truth()


def test_same_seed_same_site_other_seed_differs():
    a, b, c = generate_site(30, 1), generate_site(30, 1), generate_site(30, 2)
    assert json.dumps(a.ground_truth()) == json.dumps(b.ground_truth())
    path = a.article_path(5)
    assert a.route(path).body == b.route(path).body
    assert a.route("/img/00005/photo-0.jpg").body == b.route("/img/00005/photo-0.jpg").body
    assert a.ground_truth()["images"] != c.ground_truth()["images"]


def test_every_page_is_reachable_by_links_from_home(site, truth):
    seen, queue = {"/"}, deque(["/"])
    while queue:
        resp = site.route(queue.popleft())
        if resp.status != 200 or not resp.content_type.startswith("text/html"):
            continue
        for href in lxml.html.fromstring(resp.body).xpath("//a/@href"):
            href = href.split("#")[0]
            if href.startswith("/") and href not in seen:
                seen.add(href)
                queue.append(href)
    assert set(truth["pages"]) <= seen
    assert set(truth["broken_links"]) <= seen


def test_every_image_is_served_as_stated(site, truth):
    assert truth["images"], "no images"
    for url, info in truth["images"].items():
        resp = site.route(url)
        assert resp.status == info["status"], url
        if info["status"] != 200:
            continue
        img = Image.open(io.BytesIO(resp.body))
        assert img.size == (info["width"], info["height"]), url
        assert img.format == info["format"], url
        if info["keep"]:
            assert min(img.size) >= 300 and max(img.size) / min(img.size) <= 3, url
            assert info["true_caption"], url


def test_reasons_cover_every_awkward_case(truth):
    reasons = Counter(i["reason"] for i in truth["images"].values())
    for r in ("filter/min_side", "filter/aspect_ratio", "filter/uninformative",
              "filter/duplicate_sha256", "filter/duplicate_phash", "crawl/robots",
              "crawl/noai", "crawl/noai_page", "crawl/status_404", None):
        assert reasons[r] > 0, r
    assert truth["images"]["/static/logo.png"]["reason"] == "filter/uninformative"
    assert truth["images"]["/t/pixel.gif"]["width"] == 1


def test_duplicates_really_are_duplicates(site, truth):
    dups = {u: i for u, i in truth["images"].items() if i["duplicate_of"]}
    assert dups
    for url, info in dups.items():
        a, b = site.route(url).body, site.route(info["duplicate_of"]).body
        if info["reason"] == "filter/duplicate_sha256":
            assert a == b
        else:
            assert a != b
            ha = imagehash.phash(Image.open(io.BytesIO(a)))
            hb = imagehash.phash(Image.open(io.BytesIO(b)))
            assert ha - hb <= 6, (url, ha - hb)


def test_true_caption_always_reachable_on_the_page(site, truth):
    """A content image with a junk alt still has its caption somewhere in the page text."""
    via = Counter()
    for path, page in truth["pages"].items():
        html = site.route(path, "http://h").body.decode()
        text = lxml.html.fromstring(html)
        for ref in page["images"]:
            if ref["true_caption"] is None:
                continue
            via[ref["found_via"]] += 1
            for src in ref["caption_sources"]:
                via[src] += 1
            if ref["alt"] != ref["true_caption"]:
                assert ref["caption_sources"] != ["alt"]
            if "og" in ref["caption_sources"]:
                assert text.xpath("//meta[@property='og:description']/@content") == [
                    ref["true_caption"]]
            else:
                attrs = text.xpath("//img/@alt | //img/@title")
                assert ref["true_caption"] in text.text_content() or ref["true_caption"] in attrs
    for key in ("img", "srcset", "data-src", "picture", "og", "alt", "title", "figcaption",
                "context"):
        assert via[key] > 0, key
    junk = truth["junk_texts"]
    assert any(t.startswith("IMG_") for t in junk) and any(t.startswith("DSC") for t in junk)
    assert "logo" in junk


def test_robots_noai_and_404(site, truth):
    robots = site.route("/robots.txt").body.decode()
    assert "User-agent: *" in robots and "Disallow: /private/" in robots
    private = [p for p, i in truth["pages"].items() if i["disallowed"]]
    assert private and all(p.startswith("/private/") for p in private)
    noai_page = site.article_path(NOAI_PAGE)
    assert truth["pages"][noai_page]["noai"]
    assert site.route(noai_page).headers.get("X-Robots-Tag") == "noai"
    assert "X-Robots-Tag" not in site.route(site.article_path(NOAI_PAGE + 1)).headers
    noai_img = f"/img/{NOAI_IMAGE_PAGE:05d}/photo-0.jpg"
    assert truth["images"][noai_img]["reason"] == "crawl/noai"
    assert site.route(noai_img).headers.get("X-Robots-Tag") == "noai"
    for url in truth["broken_links"] + ["/nope", "/img/00099/photo-0.jpg", "/articles/x.html"]:
        assert site.route(url).status == 404


def test_sitemap_and_languages(site, truth):
    xml = site.route("/sitemap.xml", "http://127.0.0.1:1").body
    locs = lxml.etree.fromstring(xml).xpath("//*[local-name()='loc']/text()")
    public = {p for p, i in truth["pages"].items() if not i["disallowed"]}
    assert {loc.removeprefix("http://127.0.0.1:1") for loc in locs} == public
    langs = Counter(p["lang"] for p in truth["pages"].values())
    assert langs["de"] and langs["fr"]
    de_page = next(p for p, i in truth["pages"].items() if i["lang"] == "de")
    html = site.route(de_page).body.decode()
    assert '<html lang="de">' in html and "Hintergrund" in html


def test_large_site_generates_and_serves_lazily():
    big = generate_site(20_000, seed=3)
    for i in (0, 4_321, 12_345, 19_999):
        path = big.article_path(i)
        assert big.route(path).status == 200
        assert big.route(f"/img/{i:05d}/photo-0.jpg").status == 200
    assert big.route("/").body.count(b"<li><a href=") > 19_000
    assert big.route("/sitemap.xml").status == 200


def test_write_ground_truth(tmp_path, site):
    path = site.write_ground_truth(tmp_path / "gt" / "truth.json")
    data = json.loads(path.read_text())
    assert data["n_pages"] == 40 and data["disallowed_prefix"] == "/private/"
