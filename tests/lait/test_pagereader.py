"""The one page reader (`lait.pagereader`), and every consumer agreeing with it on real pages.

The unit cases are the places where the crawler, stage 3, the WARC ingest and the real-web
site used to give different answers for the same HTML; each is checked through the entry
point every consumer really calls.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest
from lxml import etree
from lxml import html as lxml_html
from scrapy.http import HtmlResponse

from lait.crawler.warc_links import html_image_links
from lait.filters.config import SOURCES, CleanConfig
from lait.filters.extract_stage import page_candidates
from lait.filters.html_images import find_images
from lait.pagereader import (
    BLOCK_TAGS,
    Resolver,
    html_parser,
    image_attributes,
    image_elements,
    is_noai,
    largest_candidate,
    meta_robots,
    parse_html,
    read_page,
    resolve_slow,
    robots_directives,
    split_srcset,
)

PAGE = "https://news.example.org/2024/story.html"
# Stage 3 without the context sentences: the same images, without running trafilatura.
CLEAN = CleanConfig(work="unused", sources=[s for s in SOURCES if s != "context"], languages=["any"])


def crawler_urls(html: bytes, url: str = PAGE) -> set[str]:
    """What the spider requests: `read_page` on the response, as `LaitSpider._parse_page` calls it."""
    response = HtmlResponse(url, body=html, headers={"Content-Type": "text/html"})
    return set(read_page(response.body, response.url, response.encoding).images)


def stage3_urls(html: bytes, url: str = PAGE, encoding: str | None = None) -> set[str]:
    row = {"url": url, "html": html, "status": 200, "content_type": "text/html", "encoding": encoding}
    found, _ = page_candidates(row, CLEAN)
    return {image_url for image_url, _ in found}


def warc_urls(html: bytes, url: str = PAGE, encoding: str | None = None) -> set[str]:
    return {link.image_url for link in html_image_links(html, url, encoding)}


def all_agree_on(html: bytes, url: str = PAGE) -> set[str]:
    """The image URL set every consumer finds; fails when two of them differ."""
    got = {"crawler": crawler_urls(html, url), "stage 3": stage3_urls(html, url), "warc": warc_urls(html, url)}
    assert got["crawler"] == got["stage 3"] == got["warc"], got
    return got["crawler"]


def page(body: str, head: str = "") -> bytes:
    return f"<!DOCTYPE html><html><head>{head}</head><body>{body}</body></html>".encode()


# -- the divergences of issue 16 ------------------------------------------------------------------

def test_picture_source_with_data_srcset_is_an_image_with_the_img_texts():
    html = page('<figure><picture><source data-srcset="/lazy/wide.jpg 1600w, /lazy/narrow.jpg 800w" '
                'srcset="data:image/gif;base64,R0lGOD"><img src="/ph.gif" alt="A lighthouse at dusk">'
                "</picture><figcaption>The old lighthouse.</figcaption></figure>")
    assert all_agree_on(html) == {"https://news.example.org/ph.gif", "https://news.example.org/lazy/wide.jpg"}
    (img,) = find_images(lxml_html.document_fromstring(html), PAGE)
    assert img.via == "picture" and img.urls[-1] == "https://news.example.org/lazy/wide.jpg"
    assert ("alt", "A lighthouse at dusk") in img.texts and ("figcaption", "The old lighthouse.") in img.texts
    links = html_image_links(html, PAGE)
    assert {(link.image_url, link.alt) for link in links} == {
        ("https://news.example.org/ph.gif", "A lighthouse at dusk"),
        ("https://news.example.org/lazy/wide.jpg", "A lighthouse at dusk")}


def test_srcset_urls_may_contain_commas():
    html = page('<img srcset="/img/big.jpg?crop=3,4 800w, /img/small.jpg?crop=1,1 100w">')
    assert all_agree_on(html) == {"https://news.example.org/img/big.jpg?crop=3,4"}
    assert split_srcset("a.jpg?x=1,2 1x,b.jpg 2x, c.jpg,") == [("a.jpg?x=1,2", "1x"), ("b.jpg", "2x"), ("c.jpg", "")]
    assert largest_candidate("https://cdn.test/w_1,h_2/a.jpg 300w, https://cdn.test/w_3,h_4/a.jpg 900w") == \
        "https://cdn.test/w_3,h_4/a.jpg"


def test_lazy_attributes():
    html = page('<img src="/ph.gif" data-lazy-srcset="/l/a.jpg 300w, /l/b.jpg 900w">'
                '<img data-lazy="/l/c.jpg"><img data-hi-res-src="/l/d.jpg" data-low-res-src="/l/low.jpg">'
                '<img data-original="/l/e.jpg"><img data-url="/l/not-read.jpg">')
    assert all_agree_on(html) == {f"https://news.example.org/{p}" for p in
                                  ("ph.gif", "l/b.jpg", "l/c.jpg", "l/d.jpg", "l/e.jpg")}


def test_twitter_image_and_og_image_are_one_image_after_the_others():
    html = page('<img src="/a.jpg">', '<meta name="twitter:image" content="/tw.jpg">'
                '<meta property="og:image:secure_url" content="https://cdn.example.org/og.jpg">'
                '<meta property="og:description" content="A harbour at dawn.">')
    assert all_agree_on(html) == {"https://news.example.org/a.jpg", "https://news.example.org/tw.jpg",
                                  "https://cdn.example.org/og.jpg"}
    images = image_elements(parse_html(html), PAGE)
    assert [(i.how, i.position) for i in images] == [("img", 0), ("og", -1)]
    assert images[1].urls == ["https://news.example.org/tw.jpg", "https://cdn.example.org/og.jpg"]
    assert find_images(lxml_html.document_fromstring(html), PAGE)[1].texts == [("og", "A harbour at dawn.")]


@pytest.mark.parametrize("base, expected", [
    ("/static/", "https://news.example.org/static/x y.jpg"),
    ("//cdn.example.org/a b/#top", "https://cdn.example.org/a b/x y.jpg"),
    ("HTTP://Other.Example.org/dir/page.html", "http://other.example.org/dir/x y.jpg"),
    ("javascript:void(0)", "https://news.example.org/2024/x y.jpg"),  # unusable: the page URL
])
def test_base_href_is_resolved_against_the_page_and_made_safe(base, expected):
    html = page('<img src="x y.jpg"><a href="x y.html">next</a>', f'<base href="{base}">')
    expected = expected.replace(" ", "%20")
    assert all_agree_on(html) == {expected}
    assert read_page(html, PAGE).links == [expected.replace(".jpg", ".html")]


def test_skipped_schemes():
    refs = ["data:image/png;base64,iVBOR", "javascript:void(0)", "JavaScript:x()", "mailto:a@b.org", "tel:+331",
            "blob:https://news.example.org/1f2e", "about:blank", "#top", "file:///C:/x.jpg", "ftp://x/y.jpg", "", " "]
    html = page("".join(f'<img src="{r}"><a href="{r}">x</a>' for r in refs) + '<img srcset="data:x 1x">')
    assert all_agree_on(html) == set()
    assert read_page(html, PAGE).links == []


def test_links_skip_nofollow():
    html = page('<a href="/a">a</a><a rel="NoFollow noopener" href="/b">b</a><a rel="nofollow" href="/c">c</a>'
                '<area href="/map"><a href="/a#again">a</a>')
    assert read_page(html, PAGE).links == ["https://news.example.org/a", "https://news.example.org/map"]


@pytest.mark.parametrize("value, directives", [
    ("noai", {"noai"}),
    ("NoIndex, NoImageAI", {"noindex", "noimageai"}),
    ("lait: noai", {"noai"}),
    ("otherbot: noindex, noai", {"noindex", "noai"}),
    ("noindex; noai", {"noindex", "noai"}),
    ("max-image-preview:none, nofollow", {"max-image-preview:none", "nofollow"}),
    ("noairline", {"noairline"}),
    (None, set()),
])
def test_robots_directives_of_a_header_or_a_meta_tag(value, directives):
    assert robots_directives(value) == directives
    assert is_noai(robots_directives(value)) is bool({"noai", "noimageai"} & directives)


def test_noai_in_robots_meta_tags():
    html = page("", '<meta name="Robots" content="index, NoImageAI"><meta name="lait" content="nofollow">'
                    '<meta name="googlebot" content="noai">')
    assert meta_robots(parse_html(html)) == {"index", "noimageai", "nofollow"}
    assert is_noai(read_page(html, PAGE).robots)
    assert not is_noai(read_page(page("", '<meta name="robots" content="noindex">'), PAGE).robots)


# -- libxml2's nesting ----------------------------------------------------------------------------

def test_sources_nested_by_libxml2_still_belong_to_their_picture():
    sources = "".join(f'<source media="(min-width: {i}px)" srcset="/p/{i}.jpg">' for i in range(20))
    html = page(f'<picture>{sources}<img src="/p/fallback.jpg" alt="deep"></picture>')
    img = next(parse_html(html).iter("img"))
    assert len(list(img.iterancestors("source"))) == 20  # libxml2 nests each <source> in the previous one
    (image,) = image_elements(parse_html(html), PAGE)
    assert image.how == "picture" and len(image.urls) == 21


def test_an_unclosed_picture_does_not_adopt_the_images_after_it():
    html = page('<picture><source srcset="/p/a.jpg"><img src="/p/b.jpg"><p>Text.</p><p><img src="/c.jpg">')
    images = image_elements(parse_html(html), PAGE)
    assert [(i.how, i.urls) for i in images] == [
        ("picture", ["https://news.example.org/p/b.jpg", "https://news.example.org/p/a.jpg"]),
        ("img", ["https://news.example.org/c.jpg"])]


def test_a_picture_without_img_is_no_image():
    assert all_agree_on(page('<picture><source srcset="/p/a.jpg"></picture>')) == set()


def test_what_lies_deeper_than_libxml2_reads_is_not_read():
    """libxml2 stops at 256 levels of nesting: the reader sees what comes before (the crawler
    fetches it, the WARC ingest records it), nothing after, and says so (the crawl and the ingest
    record crawl/too_deep, ingest/too_deep); stage 3 rejects such a page as clean/too_deep rather
    than give texts to half a page."""
    html = page('<img src="/before.jpg">' + "<div>" * 300 + '<img src="/deep.jpg">' + "</div>" * 300
                + '<img src="/after.jpg"><a href="/next">n</a>')
    assert read_page(html, PAGE).images == ["https://news.example.org/before.jpg"]
    assert read_page(html, PAGE).links == []
    assert read_page(html, PAGE).too_deep and not read_page(page('<img src="/a.jpg">'), PAGE).too_deep
    assert warc_urls(html) == {"https://news.example.org/before.jpg"}
    from lait.filters.html_pages import PageRejected

    with pytest.raises(PageRejected, match="too_deep"):
        stage3_urls(html)


def test_positions_count_images_and_paragraph_like_elements():
    html = page('<h1>T</h1><p>a</p><div><img src="/1.jpg"></div><ul><li>x</li></ul><img src="data:,">'
                '<figure><img src="/2.jpg"><figcaption>c</figcaption></figure>')
    tree = parse_html(html)
    assert [(i.urls[0].rsplit("/", 1)[1], i.position) for i in image_elements(tree, PAGE)] == [("1.jpg", 2),
                                                                                              ("2.jpg", 5)]
    assert image_elements(tree, PAGE, list(tree.iter("img", *BLOCK_TAGS)))[1].position == 5


def test_a_stray_byte_in_the_declared_encoding_does_not_hide_the_page():
    body = '<img src="/猫.jpg" alt="一只猫">'.encode("gb18030") + b"\xff\xff" + b'<img src="/b.jpg">'
    html = b'<html><head><meta charset="gb2312"></head><body>' + body + b"</body></html>"
    urls = {"https://news.example.org/%E7%8C%AB.jpg", "https://news.example.org/b.jpg"}
    assert set(read_page(html, PAGE, "gb18030").images) == urls
    assert warc_urls(html, PAGE, "gb18030") == urls == stage3_urls(html, PAGE, "gb18030")


def test_the_real_web_site_rewrites_what_the_reader_reads():
    html = page('<img data-url="/x.jpg" data-src="/y.jpg"><video><source src="/v.mp4"></video>'
                '<picture><source data-srcset="/p.jpg 1x"><img></picture>', '<meta name="twitter:image" content="/t.jpg">')
    tree = parse_html(html)
    attrs = {el.tag: {a for a, _ in image_attributes(el)} for el in tree.iter("img", "source", "meta") if
             image_attributes(el)}
    assert "data-src" in attrs["img"] and "data-url" not in attrs["img"]
    assert attrs["source"] == {"srcset", "data-srcset", "data-lazy-srcset"}  # the picture's, not the video's
    assert attrs["meta"] == {"content"}


@pytest.mark.parametrize("base", ["http://Ex.com:80/a/b/c.html?q=1", "https://x.org", "http://127.0.0.1:8000/p/"])
def test_fast_resolver_equals_the_reference(base):
    refs = ["http://Example.COM/x", "/x#frag", "/x y", "/a/./b", "//cdn.x/y.jpg", "x.jpg", "../x.jpg", "?q=2",
            "http://a/b?c='d'", "/x[1]", "/x?", "/x?#f", "http://a/b/?", "/\u00fc.jpg", "/x%zz", "http://[::1]/x",
            "http://a/b;", "/b;?q", "https://a/b;", "/p;x/y"]  # urljoin drops empty params after a same scheme
    resolver = Resolver(base)
    assert [resolver(r) for r in refs] == [resolve_slow(base, r) for r in refs]


def test_a_list_url_is_resolved_as_the_reference_does():
    from lait.crawler.url_list import normalise_url

    urls = ["http://Example.COM/x", "http://a/b;", "http://a/b;?q", "http://a/b?", "http://a/b#f", "http://a/b c",
            "https://a/\u00fc.jpg", "http://a/./b", "http://a:80/b", "http://[::1]/x", "https://a/b?c='d'"]
    assert [normalise_url(u)[0] for u in urls] == [resolve_slow(u, u) for u in urls]


def _same_tree(html: bytes | str) -> None:
    ours = lxml_html.document_fromstring(html, parser=html_parser())
    theirs = lxml_html.document_fromstring(html, parser=lxml_html.HTMLParser())
    assert etree.tostring(ours) == etree.tostring(theirs)
    assert [type(el) for el in ours.iter()] == [type(el) for el in theirs.iter()]


def test_html_parser_makes_lxml_html_trees_with_the_special_classes():
    """html_parser looks classes up in C: the same elements as lxml.html's parser, forms,
    inputs, labels, selects, text areas, comments and the rest."""
    _same_tree("<html><body><!-- c --><FORM action='/s'><Label>Name <input name=q></label>"
               "<select><option>a</select><textarea>t</textarea></form><p>x<?pi y?></p></body></html>")
    tree = lxml_html.document_fromstring("<form><input name=q value=1></form>", parser=html_parser())
    assert dict(tree.forms[0].fields) == {"q": "1"}


# -- real pages -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def real_web(shared_data):
    from lait.testkit.realweb import RealWebSite

    site = RealWebSite(shared_data)
    return site, site.ground_truth()


def test_every_consumer_finds_the_same_images_on_every_real_page(real_web):
    """The crawler, stage 3, the WARC ingest and the real-web site, through their own entry
    points, on the 311 real pages: the same image URL set on every page."""
    site, truth = real_web
    local = "http://127.0.0.1:8000"
    pages = images = 0
    disagree: list[tuple[str, dict[str, set[str]]]] = []
    for path in site.page_paths()[1:]:
        raw, url = site.original(path)
        response = HtmlResponse(url, body=raw, headers={"Content-Type": "text/html"})
        got = {"crawler": set(read_page(response.body, response.url, response.encoding).images),
               "stage 3": stage3_urls(raw, url, response.encoding),
               "warc": warc_urls(raw, url, response.encoding)}
        refs = truth["pages"][path]["images"]
        if truth["pages"][path]["parse_ok"]:
            got["real web"] = {ref["original_url"] for ref in refs if ref["original_url"]}
            served = read_page(site.route(path, local).body, local + path).images
            # What the served page shows is exactly the substitutes (and planted photos): every
            # URL the reader reads was rewritten, and nothing else became an image.
            assert {urlsplit(u).path for u in served} == {ref["url"] for ref in refs}, path
            assert all(u.startswith(local + "/photos/") for u in served), path
        if any(urls != got["crawler"] for urls in got.values()):
            disagree.append((path, {k: v ^ got["crawler"] for k, v in got.items()}))
        pages += 1
        images += len(got["crawler"])
    assert pages >= 300 and images > 5000
    assert not disagree, disagree[:3]


def test_html_parser_makes_the_same_trees_on_every_real_page(real_web):
    site, _ = real_web
    for path in site.page_paths()[1:]:
        _same_tree(site.original(path)[0])


def test_fast_resolver_equals_the_reference_on_every_reference_of_the_real_pages(real_web):
    site, _ = real_web
    base = "https://Example.org:443/a/b/page.html?x=1"
    resolver = Resolver(base)
    refs: set[str] = set()
    for path in site.page_paths()[1:]:
        tree = parse_html(site.original(path)[0])
        for el in tree.iter("a", "area", "img", "source", "meta", "link"):
            for attr, value in el.attrib.items():
                if attr in ("href", "src", "content") or attr.startswith("data-"):
                    refs.add(value)
                elif "srcset" in attr:
                    refs.update(u for u, _ in split_srcset(value))
    assert len(refs) > 40_000
    wrong = [(r, resolver(r), resolve_slow(base, r)) for r in refs if resolver(r) != resolve_slow(base, r)]
    assert not wrong, wrong[:5]


# -- licences (issue 18) ------------------------------------------------------------------------

@pytest.mark.parametrize("head,body,expected", [
    ('<link rel="license" href="//creativecommons.org/licenses/by/4.0/">', "",
     "http://creativecommons.org/licenses/by/4.0/"),
    # A Creative Commons rel=license goes before another rel=license.
    ('<link rel="license" href="/terms.html">', '<a rel="license" href="https://creativecommons.org/licenses/by-sa/3.0/">cc</a>',
     "https://creativecommons.org/licenses/by-sa/3.0/"),
    ('<link rel="license" href="/terms.html">', "", "http://site.test/terms.html"),
    ('<meta name="dcterms.license" content="CC BY-SA 4.0">', "", "CC BY-SA 4.0"),
    ('<meta name="rights" content="All rights reserved.">',
     '<a href="https://creativecommons.org/licenses/by/2.0/">some photo</a>', "All rights reserved."),
    ("", '<a href="https://creativecommons.org/publicdomain/zero/1.0/">CC0</a>',
     "https://creativecommons.org/publicdomain/zero/1.0/"),
    ("", '<a href="https://creativecommons.org/about/">about CC</a><a rel="license" href="#">x</a>', None),
    # A figure's licence is its image's (figure_license), not the page's.
    ('<meta name="license" content="CC BY 4.0">', '<figure><img src="a.jpg"><figcaption>x <a rel="license" '
     'href="https://creativecommons.org/licenses/by-sa/2.0/">cc</a></figcaption></figure>', "CC BY 4.0"),
    ("", '<figure><img src="a.jpg"><a href="https://creativecommons.org/licenses/by/2.0/">cc</a></figure>', None),
])
def test_declared_licence(head, body, expected):
    html = f"<html><head>{head}</head><body>{body}</body></html>"
    assert read_page(html, "http://site.test/page.html").license == expected


def test_wikipedia_pages_declare_cc_by_sa(shared_data):
    from lait.pagereader import page_license

    for name in ("wikipedia", "wikipedia-2", "wikipedia-3"):
        raw = (shared_data / "html" / "readability" / name / "source.html").read_bytes()
        tree = parse_html(raw)
        assert "creativecommons.org/licenses/by-sa/3.0/" in page_license(tree, "https://en.wikipedia.org/wiki/X")
