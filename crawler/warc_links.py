"""Image references with their texts, from archived HTML and from WAT metadata.

Common Crawl rarely captures the images themselves, so what an archive gives stage 3 is the
page (`pages/`) and the references it makes to images, with alt and title texts. Those go to
the `warc_links` table, partitioned by image URL like `images/` and `candidates/`, so a later
image fetch or a join with `images/` happens inside one partition.

`warc_links` columns: page_url, image_url (absolute), alt, title, source ("html": a URL of an
image of an archived page, as `lait.pagereader` reads it; "wat": a WAT `Links` entry),
fetched_at (capture time of the page), warc_file (the archive's file name), and for WAT links
page_title and page_lang (the page's <title> and <html lang>, as the WAT record gives them).
Stage 3 makes the alt and title texts of WAT links candidates (sources `alt`, `title`): a WAT
file alone gives samples, as LAION-5B was built, without fetching any page.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass

from lait.pagereader import image_elements, parse_html, resolve

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ImageLink:
    """One reference from a page to an image, with the texts the page gives it."""

    image_url: str
    alt: str | None
    title: str | None
    source: str


def _clean(text: str | None) -> str | None:
    if text is None:
        return None
    text = " ".join(text.split())
    return text or None


def html_image_links(html: bytes, page_url: str, encoding: str | None = None) -> list[ImageLink]:
    """Every URL of every image of an archived page, with the `alt` and `title` of its `<img>`."""
    tree = parse_html(html, encoding)
    return [] if tree is None else image_links(tree, page_url)


def image_links(tree, page_url: str) -> list[ImageLink]:
    """`html_image_links` of a parsed page: the images of `lait.pagereader.image_elements`, so
    a reference joins the crawler's `images/` rows and stage 3's candidates for the same
    image, whichever way the page arrived. og:image references have no texts here."""
    out: list[ImageLink] = []
    for image in image_elements(tree, page_url):
        el = image.element
        alt, title = (None, None) if image.how == "og" else (_clean(el.get("alt")), _clean(el.get("title")))
        out += [ImageLink(url, alt, title, "html") for url in image.urls]
    return out


@dataclass
class WatPage:
    """What a WAT metadata record says about one captured page: its URL, opt-outs (the
    `X-Robots-Tag` and `tdm-reservation` headers, the robots and tdm-reservation meta tags),
    title, declared language and image links."""

    url: str
    x_robots_tag: str | None
    links: list[ImageLink]
    title: str | None = None
    lang: str | None = None
    robots_meta: str | None = None
    tdm_header: str | None = None
    tdm_meta: str | None = None


def wat_image_links(block: bytes, target_url: str | None = None) -> WatPage | None:
    """Image links of a WAT JSON record; None for WAT records that describe no HTML response.

    Image links are the `Links` entries whose path starts with `IMG@` (`IMG@/src`,
    `IMG@/data-src`, ...); their `alt` and `title` are kept.
    """
    env = json.loads(block).get("Envelope") or {}
    url = (env.get("WARC-Header-Metadata") or {}).get("WARC-Target-URI") or target_url
    resp = (env.get("Payload-Metadata") or {}).get("HTTP-Response-Metadata")
    if not url or not isinstance(resp, dict):
        return None
    headers = resp.get("Headers") or {}
    robots = next((v for k, v in headers.items() if k.lower() == "x-robots-tag"), None)
    tdm_header = next((v for k, v in headers.items() if k.lower() == "tdm-reservation"), None)
    html_meta = resp.get("HTML-Metadata") or {}
    head = html_meta.get("Head") or {}
    base = head.get("Base") or url
    # Metas: one object per <meta> (name/property/http-equiv, content); the WAT writer adds
    # the <html lang> as {"name": "HTML@/lang", "content": ...}.
    metas: dict[str, str] = {}
    for m in head.get("Metas") or []:
        if isinstance(m, dict) and isinstance(m.get("content"), str):
            key = str(m.get("name") or m.get("property") or m.get("http-equiv") or "").lower()
            if key and key not in metas:
                metas[key] = m["content"]
    title = head.get("Title")
    links = []
    for link in html_meta.get("Links") or []:
        if not isinstance(link, dict) or not str(link.get("path", "")).upper().startswith("IMG@"):
            continue
        image_url = resolve(base, link.get("url"))
        if image_url:
            links.append(ImageLink(image_url, _clean(link.get("alt")), _clean(link.get("title")), "wat"))
    return WatPage(url, robots if isinstance(robots, str) else None, links,
                   title=_clean(title) if isinstance(title, str) else None,
                   lang=_clean(metas.get("html@/lang") or metas.get("html@/xml:lang")),
                   robots_meta=metas.get("robots"),
                   tdm_header=tdm_header if isinstance(tdm_header, str) else None,
                   tdm_meta=metas.get("tdm-reservation"))


def iter_link_rows(page_url: str, links: list[ImageLink], fetched_at, warc_file: str, *,
                   page_title: str | None = None, page_lang: str | None = None) -> Iterator[dict]:
    """`warc_links` rows, one per distinct (image URL, alt, title) of the page."""
    seen = set()
    for link in links:
        key = (link.image_url, link.alt, link.title)
        if key in seen:
            continue
        seen.add(key)
        yield {"page_url": page_url, "image_url": link.image_url, "alt": link.alt, "title": link.title,
               "source": link.source, "fetched_at": fetched_at, "warc_file": warc_file,
               "page_title": page_title, "page_lang": page_lang}
