"""Links and image URLs of an HTML page: pure functions over (html bytes, page URL).

The crawler, the WARC ingest and stage 3 (candidate texts) must agree on which image URLs a page
shows and how each is spelled, or the tables do not join. They all call :func:`image_urls`
(or :func:`extract`), which resolves every URL the same way:

- against ``<base href>`` when the page has one (itself resolved against the page URL), else
  against the page URL; ``urljoin`` semantics, fragment dropped, unsafe characters
  percent-encoded (``w3lib.url.safe_url_string``);
- ``<img src>`` (``how="img"``), the largest ``srcset`` candidate (``"srcset"``), lazy-loading
  attributes ``data-src`` / ``data-srcset`` / ``data-lazy-src`` / ``data-original``
  / ``data-hi-res-src`` and the largest ``data-srcset`` candidate (``"data-src"``), the largest
  candidate of each ``<picture><source srcset>`` (``"picture"``) and ``og:image`` /
  ``twitter:image`` meta tags (``"og"``);
- only http(s) results; ``data:``, ``javascript:`` and empty values are skipped;
- each URL once per page, with the ``how`` of its first occurrence in document order.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from urllib.parse import urldefrag, urljoin, urlsplit

import lxml.html
from lxml import etree
from w3lib.url import safe_url_string

log = logging.getLogger(__name__)

LAZY_SRC_ATTRS = ("data-src", "data-lazy-src", "data-original", "data-hi-res-src")
LAZY_SRCSET_ATTRS = ("data-srcset", "data-lazy-srcset")
OG_IMAGE_PROPERTIES = ("og:image", "og:image:url", "og:image:secure_url", "twitter:image",
                       "twitter:image:src")
_DESCRIPTOR_RE = re.compile(r"^(\d+(?:\.\d+)?)([wx])$", re.I)


@dataclass
class PageLinks:
    """What one parse of a page yields: outgoing links, image URLs, and robots directives."""

    links: list[str] = field(default_factory=list)
    images: list[tuple[str, str]] = field(default_factory=list)  # (url, how)
    robots: set[str] = field(default_factory=set)  # tokens of <meta name="robots">, lower-case


def resolve(base: str, raw: str | None) -> str | None:
    """Absolute http(s) URL of `raw` against `base`, without fragment; None when unusable."""
    return Resolver(base)(raw)


def resolve_slow(base: str, raw: str | None) -> str | None:
    """The reference definition of :func:`resolve` (what its fast paths must equal)."""
    if not raw:
        return None
    raw = raw.strip()
    if not raw or raw.startswith(_SKIP_PREFIXES):
        return None
    try:
        url = urldefrag(urljoin(base, raw))[0]
        if urlsplit(url).scheme not in ("http", "https"):
            return None
        return safe_url_string(url)
    except ValueError:  # e.g. an invalid IPv6 literal in a hand-written href
        return None


_SKIP_PREFIXES = ("data:", "javascript:", "mailto:", "tel:", "#")
# URLs made only of these are already what safe_url_string returns.
_SAFE_URL_RE = re.compile(r"(?:[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=]|%[0-9A-Fa-f]{2})*")


class Resolver:
    """`resolve` against one base URL, with fast paths for the common shapes of references.

    A page has tens to hundreds of references, and `urljoin` + `safe_url_string` cost ~25 us
    each: absolute URLs and root-relative paths without dot segments skip them.
    """

    def __init__(self, base: str):
        self.base = base
        root = resolve_slow(base, "/")  # the normalised origin (lower-case host, IDNA) + "/"
        self.origin = root[:-1] if root and root.endswith("/") else None

    def __call__(self, raw: str | None) -> str | None:
        if not raw:
            return None
        raw = raw.strip()
        if not raw or raw.startswith(_SKIP_PREFIXES):
            return None
        url = None
        if "/." not in raw and "\\" not in raw:
            if raw.startswith(("http://", "https://")) and "/" in raw[8:] and raw.count("//") == 1:
                netloc = raw.split("/", 3)[2]
                if netloc == netloc.lower():
                    url = raw
            elif self.origin and raw[0] == "/" and not raw.startswith("//"):
                url = self.origin + raw
        if url is None or not _SAFE_URL_RE.fullmatch(url):
            return resolve_slow(self.base, raw)
        hash_at = url.find("#")
        if hash_at >= 0:
            url = url[:hash_at]
        return url


def parse_srcset(value: str | None) -> list[tuple[str, float]]:
    """Candidates of a srcset attribute as (url, size): width for `w`, density (1 = 1x) for `x`.

    URLs may contain commas (the HTML rule: a candidate URL runs to the next whitespace, and a
    comma ends it only when trailing), so this does not simply split on commas.
    """
    if not value:
        return []
    out: list[tuple[str, float]] = []
    i, n = 0, len(value)
    while i < n:
        while i < n and (value[i].isspace() or value[i] == ","):
            i += 1
        start = i
        while i < n and not value[i].isspace():
            i += 1
        url = value[start:i]
        descriptor = ""
        if url.endswith(","):
            url = url.rstrip(",")
        else:
            start = i
            while i < n and value[i] != ",":
                i += 1
            descriptor = value[start:i].strip()
        if not url:
            continue
        size = 1.0
        m = _DESCRIPTOR_RE.match(descriptor.split()[0]) if descriptor else None
        if m:
            size = float(m.group(1))
        out.append((url, size))
    return out


def largest_candidate(srcset: str | None) -> str | None:
    """URL of the largest srcset candidate (the first one among equals)."""
    cands = parse_srcset(srcset)
    if not cands:
        return None
    return max(cands, key=lambda c: c[1])[0]


def parse_html(html: bytes | str, encoding: str | None = None) -> etree._Element | None:
    """The lxml tree of a page, or None for an empty or unparsable document."""
    if not html:
        return None
    try:
        if isinstance(html, bytes):
            parser = lxml.html.HTMLParser(encoding=encoding) if encoding else None
            return lxml.html.document_fromstring(html, parser=parser)
        return lxml.html.document_fromstring(html)
    except (etree.ParserError, ValueError, LookupError) as exc:
        log.debug("unparsable page: %s", exc)
        return None


def base_url(tree: etree._Element, page_url: str) -> str:
    """The URL relative references resolve against: `<base href>` or the page URL."""
    for href in tree.xpath("//base/@href"):
        resolved = resolve_slow(page_url, href)
        if resolved:
            return resolved
    return page_url


def images_of(tree: etree._Element, base: str) -> list[tuple[str, str]]:
    """(url, how) of every image the tree shows, in document order, each URL once."""
    seen: dict[str, str] = {}
    resolve_ = Resolver(base)

    def add(raw: str | None, how: str) -> None:
        url = resolve_(raw)
        if url and url not in seen:
            seen[url] = how

    for el in tree.iter("img", "source", "meta"):
        tag = el.tag
        if tag == "meta":
            prop = (el.get("property") or el.get("name") or "").strip().lower()
            if prop in OG_IMAGE_PROPERTIES:
                add(el.get("content"), "og")
        elif tag == "img":
            add(el.get("src"), "img")
            add(largest_candidate(el.get("srcset")), "srcset")
            for attr in LAZY_SRC_ATTRS:
                add(el.get(attr), "data-src")
            for attr in LAZY_SRCSET_ATTRS:
                add(largest_candidate(el.get(attr)), "data-src")
        elif tag == "source":
            # libxml2 does not know <source> is void and nests siblings: look up, not at the parent.
            if next(el.iterancestors("picture"), None) is not None:
                add(largest_candidate(el.get("srcset") or el.get("data-srcset")), "picture")
    return list(seen.items())


def links_of(tree: etree._Element, base: str) -> list[str]:
    """Absolute http(s) targets of `<a href>` and `<area href>`, in order, each once."""
    out: dict[str, None] = {}
    resolve_ = Resolver(base)
    for el in tree.iter("a", "area"):
        if "nofollow" in (el.get("rel") or "").lower().split():
            continue
        url = resolve_(el.get("href"))
        if url:
            out[url] = None
    return list(out)


def robots_meta(tree: etree._Element) -> set[str]:
    """Directives of `<meta name="robots">` (and `name="lait"`), e.g. {"noai", "nofollow"}."""
    tokens: set[str] = set()
    for el in tree.iter("meta"):
        if (el.get("name") or "").strip().lower() in ("robots", "lait"):
            tokens.update(t.strip().lower() for t in (el.get("content") or "").split(",") if t.strip())
    return tokens


def extract(html: bytes | str, page_url: str, encoding: str | None = None) -> PageLinks:
    """Links, image URLs and robots directives of a page, from one parse."""
    tree = parse_html(html, encoding)
    if tree is None:
        return PageLinks()
    base = base_url(tree, page_url)
    return PageLinks(links_of(tree, base), images_of(tree, base), robots_meta(tree))


def image_urls(html: bytes | str, page_url: str, encoding: str | None = None) -> list[tuple[str, str]]:
    """(absolute image URL, how) for every image a page shows; see the module docstring."""
    tree = parse_html(html, encoding)
    if tree is None:
        return []
    return images_of(tree, base_url(tree, page_url))
