"""Where an image sits (`lait.filters.image_place`, issue 62): a picture that links to another site
is the site's chrome (an advertisement, a badge, an app store's button); a photo that links to its
photo library, to its own site or to the site the page says it is, is not."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from lxml import html as lxml_html

from lait.filters.image_place import image_place, own_urls, registered_domain

PAGE = "https://news.example.co.uk/2024/05/story.html"
REPO = Path(__file__).resolve().parents[2]


def place(body: str, head: str = "", url: str = PAGE):
    tree = lxml_html.fromstring(f"<html><head>{head}</head><body><article><p>{'Words of the story. ' * 8}</p>"
                                f"{body}</article></body></html>")
    img = next(tree.iter("img"))
    return image_place(img, url, None, own_urls(tree, url))


@pytest.mark.parametrize("host, site", [
    ("news.example.co.uk", "example.co.uk"), ("www.Example.com", "example.com"), ("a.b.example.com.au", "example.com.au"),
    ("cdn.example.de", "example.de"), ("127.0.0.1", ""), ("localhost", "localhost"),
])
def test_registered_domain(host, site):
    assert registered_domain(host) == site


@pytest.mark.parametrize("href", [
    "https://www.sponsor-shop.de/deal?id=3",  # an advertisement
    "https://itunes.apple.com/app/id1234",  # an app store's button
    "https://statcounter.com/",  # a counter's badge
])
def test_a_picture_that_links_to_another_site_is_chrome(href):
    p = place(f"<a href='{href}'><img src='/img/a.jpg' alt='A sunny beach with palm trees'></a>")
    assert p.chrome and "another site" in p.chrome
    assert p.drops("alt", "A sunny beach with palm trees", frozenset())


@pytest.mark.parametrize("href, head", [
    ("https://www.flickr.com/photos/someone/123", ""),  # its photo library
    ("https://commons.wikimedia.org/wiki/File:Beach.jpg", ""),
    ("https://video.example.co.uk/clip/9", ""),  # another host of the page's own site
    ("https://www.theguardian.com/world/2024/other", "<link rel='canonical' href='https://www.theguardian.com/x'>"),
    ("/2024/05/other.html", ""),  # another article of the site: a teaser, not chrome
])
def test_a_photo_that_links_to_its_library_or_its_own_site_is_not_chrome(href, head):
    p = place(f"<a href='{href}'><img src='/img/a.jpg' alt='A sunny beach with palm trees'></a>", head)
    assert p.chrome is None
    assert p.drops("alt", "A sunny beach with palm trees", frozenset()) is None


def test_on_the_fresh_development_pages_the_new_signals_drop_junk_and_no_caption(shared_data):
    """On the labelled texts of the fresh pages' development part (bench/captions/fresh_dev.json,
    real pages), every own text of a picture that links to another site is labelled junk, and
    there are some."""
    import sys

    from lait.filters.config import CleanConfig
    from lait.filters.html_images import find_images
    from lait.filters.html_pages import parse_page

    sys.path.insert(0, str(REPO / "bench" / "captions"))
    from fresh_pages import fresh_index

    if not (shared_data / "html" / "fresh").is_dir():
        pytest.skip("../shared/data/html/fresh is absent")
    rows = json.loads((REPO / "bench" / "captions" / "fresh_dev.json").read_text())["rows"]
    wanted = {(r["page_id"], u): r["label"] for r in rows if r["sources"][0] in ("alt", "title") for u in r["images"]}
    pages = {p["id"]: p for p in fresh_index(shared_data) if p["split"] == "dev"}
    cfg = CleanConfig(work="unused", languages=["any"])
    labels = []
    for page_id in sorted({k[0] for k in wanted}):
        p = pages[page_id]
        row = {"url": p["url"], "status": 200, "html": gzip.decompress(Path(p["path"]).read_bytes()),
               "headers": {"Content-Type": "text/html; charset=utf-8"}, "encoding": None}
        tree, elements, _ = parse_page(row, cfg)
        selves = own_urls(tree, p["url"])
        for img in find_images(tree, p["url"], elements=elements):
            if img.element is None:
                continue
            why = image_place(img.element, p["url"], img.urls, selves).chrome or ""
            if "another site" in why:
                labels += [wanted[(page_id, u)] for u in img.urls if (page_id, u) in wanted]
    assert labels and set(labels) == {"junk"}, labels
