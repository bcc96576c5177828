"""Images on an HTML page, their absolute URLs and the texts the page gives them.

URLs are resolved exactly as the crawler resolves them (DESIGN.md, stage 1) so that stage 3's
candidates join the `images` rows: `urljoin` against `<base href>` (else the page URL), then
Scrapy's `safe_url_string`; per `<img>`: `src`, `data-src` and the largest `srcset` candidate;
per `<picture><source srcset>`: its largest candidate; and `og:image`. `image_urls` is the
crawler-side entry point; `find_images` also collects the texts (alt, title, aria, figcaption,
og) and each image's position in document order, for the context sentences.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from urllib.parse import urljoin

from lxml import html as lxml_html
from w3lib.url import safe_url_string

# The same attributes and properties as the crawler (crawler/extract.py), so every URL joins.
LAZY_SRC_ATTRS = ("data-src", "data-lazy-src", "data-original", "data-hi-res-src")
LAZY_SRCSET_ATTRS = ("data-srcset", "data-lazy-srcset")
OG_IMAGE_PROPERTIES = ("og:image", "og:image:url", "og:image:secure_url", "twitter:image",
                       "twitter:image:src")
_SRCSET_ITEM = re.compile(r"\s*(\S+?)(?:\s+([\d.]+)([wxh]))?\s*(?:,|$)")
_SKIP_SCHEMES = ("data:", "javascript:", "blob:", "about:", "mailto:")
_CREDIT = re.compile(r"\b(credit|copyright|byline|attribution|caption-source|photographer)\b", re.I)
_WS = re.compile(r"\s+")


# Paragraph-like elements: with <img>, what document positions count (see `find_images`).
BLOCK_TAGS = ("p", "li", "blockquote", "dd", "dt", "td", "th", "pre", "h1", "h2", "h3", "h4",
              "h5", "h6", "figcaption")


@dataclass
class PageImage:
    """One image element of a page (or og:image): its URLs and the texts that go with it."""

    urls: list[str]
    via: str  # img, picture, og
    position: int  # index among the page's images and paragraph-like elements (-1: og:image)
    texts: list[tuple[str, str]] = field(default_factory=list)  # (source, text)


def normalise_space(text: str | None) -> str:
    return _WS.sub(" ", text or "").strip()


def resolve_url(base: str, url: str | None) -> str | None:
    """The absolute URL a crawler requests for `url` found on a page with base URL `base`."""
    url = (url or "").strip()
    if not url or url.startswith("#") or url.lower().startswith(_SKIP_SCHEMES):
        return None
    return _resolve(base, url)


@lru_cache(maxsize=16384)  # src, data-src and srcset often repeat one URL; logos repeat per site
def _resolve(base: str, url: str) -> str | None:
    absolute = urljoin(base, url)
    if not absolute.lower().startswith(("http://", "https://")):
        return None
    return safe_url_string(absolute).split("#", 1)[0]


def largest_srcset(srcset: str | None) -> str | None:
    """The URL of the largest candidate of a `srcset` (by w, then x descriptor; bare = 1x)."""
    best, best_key = None, (-1, -1.0)
    for m in _SRCSET_ITEM.finditer(srcset or ""):
        url, value, unit = m.group(1), m.group(2), m.group(3)
        if not url:
            continue
        try:
            num = float(value) if value else 1.0
        except ValueError:
            continue
        key = (1, num) if unit == "w" else (0, num)
        if key > best_key:
            best, best_key = url, key
    return best


def page_base(tree: lxml_html.HtmlElement, page_url: str) -> str:
    for href in tree.xpath("//base/@href")[:1]:
        return urljoin(page_url, href.strip())
    return page_url


def _picture_of(el: lxml_html.HtmlElement) -> lxml_html.HtmlElement | None:
    """The enclosing `<picture>`: libxml2's HTML parser does not know `<source>` is void and
    nests the following siblings inside it, so look a few levels up, not just at the parent."""
    parent = el.getparent()
    for _ in range(8):
        if parent is None or parent.tag not in ("source", "picture"):
            return None
        if parent.tag == "picture":
            return parent
        parent = parent.getparent()
    return None


def _element_urls(el: lxml_html.HtmlElement, base: str) -> list[str]:
    raw = ([el.get("src"), largest_srcset(el.get("srcset"))] + [el.get(a) for a in LAZY_SRC_ATTRS]
           + [largest_srcset(el.get(a)) for a in LAZY_SRCSET_ATTRS])
    picture = _picture_of(el)
    if picture is not None:
        raw += [largest_srcset(s.get("srcset")) for s in picture.iter("source")]
    out: list[str] = []
    for u in raw:
        r = resolve_url(base, u)
        if r and r not in out:
            out.append(r)
    return out


def image_urls(tree: lxml_html.HtmlElement, page_url: str) -> list[str]:
    """Every image URL a crawler fetches for this page, in document order, without repeats."""
    seen: dict[str, None] = {}
    for img in find_images(tree, page_url, with_texts=False):
        seen.update(dict.fromkeys(img.urls))
    return list(seen)


def _caption_text(figcaption: lxml_html.HtmlElement) -> str:
    """A figcaption's text without the parts marked as credits: class credit, copyright...,
    and `<small>`/`<cite>`, where pages put the photographer and agency."""
    parts: list[str] = []

    def walk(el: lxml_html.HtmlElement) -> None:
        if isinstance(el.tag, str) and (el.tag in ("small", "cite") or _CREDIT.search(
                el.get("class", "") + " " + el.get("itemprop", ""))):
            parts.append(el.tail or "")
            return
        parts.append(el.text or "")
        for child in el:
            walk(child)
        parts.append(el.tail or "")

    parts.append(figcaption.text or "")
    for child in figcaption:
        walk(child)
    return normalise_space(" ".join(parts))


def _figcaption_of(img: lxml_html.HtmlElement) -> str:
    el = img.getparent()
    for _ in range(12):  # figure > a > picture > source > source > img, as libxml2 nests it
        if el is None:
            return ""
        if el.tag == "figure":
            caps = [_caption_text(c) for c in el.iter("figcaption")]
            return " ".join(c for c in caps if c)
        el = el.getparent()
    return ""


def find_images(tree: lxml_html.HtmlElement, page_url: str, *, with_texts: bool = True,
                elements: list[lxml_html.HtmlElement] | None = None) -> list[PageImage]:
    """Image elements (`<img>` with their `<picture>` sources) and og:image, in document order.

    Positions count images and `BLOCK_TAGS` elements only: iterating over those tags alone
    spares lxml building a Python proxy for every element of the page. `elements`, when given,
    is `list(tree.iter("img", *BLOCK_TAGS))` already made by the caller.
    """
    base = page_base(tree, page_url)
    out: list[PageImage] = []
    for pos, el in enumerate(tree.iter("img", *BLOCK_TAGS) if elements is None else elements):
        if el.tag != "img":
            continue
        urls = _element_urls(el, base)
        if not urls:
            continue
        img = PageImage(urls, "img" if _picture_of(el) is None else "picture", pos)
        if with_texts:
            for source, value in (("alt", el.get("alt")), ("title", el.get("title")),
                                  ("aria", el.get("aria-label")), ("figcaption", _figcaption_of(el))):
                value = normalise_space(value)
                if value:
                    img.texts.append((source, value))
        out.append(img)
    og_urls = [resolve_url(base, m.get("content")) for m in tree.iter("meta")
               if (m.get("property") or m.get("name") or "").strip().lower() in OG_IMAGE_PROPERTIES]
    og_urls = [u for u in dict.fromkeys(og_urls) if u]
    if og_urls:
        og = PageImage(og_urls, "og", -1)
        if with_texts:
            for prop in ("og:description", "og:title"):
                for value in tree.xpath(f"//meta[@property='{prop}']/@content")[:1]:
                    if normalise_space(value):
                        og.texts.append(("og", normalise_space(value)))
        out.append(og)
    return out
