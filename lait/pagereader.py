"""The one page reader: which images a page shows, where its links go, what its robots say.

The crawler (what to fetch), the WARC ingest (`warc_links`), stage 3 (which images get texts)
and the real-web test site (which URLs to rewrite) all read pages through this module, so an
image URL is spelled the same way in every table and the tables join.

Images. An image is an ``<img>`` element, with all the URLs it may load:

- ``src``, the largest ``srcset`` candidate, and the lazy-loading attributes that scripts
  copy into ``src``/``srcset`` (`LAZY_SRC_ATTRS`, `LAZY_SRCSET_ATTRS`: the ones the real
  pages of ``../shared/data`` use), each lazy srcset by its largest candidate;
- inside a ``<picture>``, the largest candidate of each of its ``<source>`` elements'
  ``srcset`` and lazy srcsets (``how="picture"``). A ``<picture>`` without an ``<img>``
  shows nothing in a browser and is no image here;
- ``og:image`` and ``twitter:image`` meta tags (`META_IMAGE_NAMES`): the page's preview,
  listed after the ``<img>`` elements as one image (``how="og"``, position -1).

URLs. Every reference is resolved against ``<base href>`` (itself resolved against the page
URL) or else the page URL: ``urljoin`` semantics, fragment dropped, unsafe characters
percent-encoded (``w3lib.url.safe_url_string``); only http(s) results are kept, as
`is_http_url` (the one rule for that) says (``data:``, ``javascript:``, ``mailto:``, ``tel:``,
``blob:``, ``about:``, ``#...`` never).
A srcset is parsed as the HTML standard says, so URLs may contain commas.

Links: ``<a href>`` and ``<area href>`` without ``rel="nofollow"``.

Robots: `robots_directives` reads an ``X-Robots-Tag`` value or a ``<meta name="robots">``
(or ``name="lait"``) content the same way; ``botname: noai`` counts as ``noai``, and
`is_noai` says whether ``noai``/``noimageai`` is among them.

TDMRep (the W3C TDM Reservation Protocol): `tdm_reservation` reads a ``tdm-reservation``
header value or ``<meta name="tdm-reservation">`` content (``1`` reserves, ``0`` does not);
`is_tdm_reserved` lets the header decide when it is present, the meta tag otherwise.

Licence: `page_license` is the licence a page declares: a ``rel="license"`` link (``<link>``,
``<a>`` or ``<area>``; a Creative Commons one first), else a licence meta tag (`LICENSE_META_NAMES`),
else a link to a Creative Commons licence or public-domain deed anywhere on the page; links
inside a ``<figure>`` are that figure's image's own licence (`figure_license`), not the page's.

Parsing is libxml2's (lxml), with its limits: a page nested deeper than 256 elements stops the
parser there, so whatever follows is not read at all. `parse_page` and `PageRead.too_deep` say
so, and the crawl and the WARC ingest record such a page in ``rejected/`` (``crawl/too_deep``,
``ingest/too_deep``: the images and links below were never seen); stage 3 rejects it as
``clean/too_deep``. lxml's ``huge_tree`` would read to 2048 levels, but it also lifts libxml2's
other limits, which a hostile page should meet. And libxml2 does not know ``<source>`` is void,
so it nests the following siblings inside it: the ``<img>`` of a ``<picture>`` is found below
its sources.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from urllib.parse import urldefrag, urljoin, urlsplit

import lxml.html
from lxml import etree
from w3lib.url import safe_url_string

from lait.urls import is_http_url

log = logging.getLogger(__name__)

# Lazy-loading attributes that a page's scripts turn into `src`, by use on the 311 real pages
# of ../shared/data (pages using each): data-src 67, data-original 7, data-lazy-src 7,
# data-normal 5, data-lazy 2, data-hi-res-src 2, data-high-res-src 2. Attributes of one site
# only (datasrc, original, CNN's data-src-<size>) are left out.
LAZY_SRC_ATTRS = ("data-src", "data-lazy-src", "data-lazy", "data-original", "data-normal",
                  "data-hi-res-src", "data-high-res-src")
# ... and into `srcset`: data-srcset 23 pages on <img> and 11 on <source>, data-lazy-srcset 7.
LAZY_SRCSET_ATTRS = ("data-srcset", "data-lazy-srcset")
SRC_ATTRS = ("src",) + LAZY_SRC_ATTRS
SRCSET_ATTRS = ("srcset",) + LAZY_SRCSET_ATTRS
META_IMAGE_NAMES = frozenset({"og:image", "og:image:url", "og:image:secure_url", "twitter:image",
                              "twitter:image:src"})
# Paragraph-like elements: with <img>, what image positions count (see `image_elements`).
BLOCK_TAGS = ("p", "li", "blockquote", "dd", "dt", "td", "th", "pre", "h1", "h2", "h3", "h4",
              "h5", "h6", "figcaption")
NOAI_DIRECTIVES = frozenset({"noai", "noimageai"})
ROBOTS_META_NAMES = ("robots", "lait")
TDM_RESERVATION = "tdm-reservation"
TDM_POLICY = "tdm-policy"
# Meta names that carry a licence or rights statement (Dublin Core, and the bare forms).
LICENSE_META_NAMES = ("license", "dcterms.license", "dc.license", "rights", "dcterms.rights",
                      "dc.rights")
CC_HOSTS = ("creativecommons.org", "www.creativecommons.org")


# -- URLs ---------------------------------------------------------------------------------------

_SKIP_PREFIXES = ("data:", "javascript:", "mailto:", "tel:", "blob:", "about:", "#")
# URLs made only of these are already what safe_url_string returns (it escapes [ ] outside
# the host and ' in the query, so those take the slow path).
_SAFE_URL_RE = re.compile(r"(?:[A-Za-z0-9\-._~:/?#@!$&()*+,;=]|%[0-9A-Fa-f]{2})*")


def resolve_slow(base: str, raw: str | None) -> str | None:
    """The definition of URL resolution (what `Resolver`'s fast paths must equal)."""
    if not raw:
        return None
    raw = raw.strip()
    if not raw or raw[:11].lower().startswith(_SKIP_PREFIXES):
        return None
    try:
        url = safe_url_string(urldefrag(urljoin(base, raw))[0])
        return url if is_http_url(url) else None
    except ValueError:  # e.g. an invalid IPv6 literal in a hand-written href
        return None


def resolve(base: str, raw: str | None) -> str | None:
    """Absolute http(s) URL of `raw` against `base`, without fragment; None when unusable."""
    return Resolver(base)(raw)


def fast_absolute(raw: str) -> str | None:
    """`resolve_slow(base, raw)` for a stripped absolute http(s) URL that needs no escaping nor
    normalising, whatever the base (an absolute URL ignores it); None where only the slow path
    can tell (it may still be a good URL)."""
    if "/." in raw or "\\" in raw or not raw.startswith(("http://", "https://")):
        return None
    if "/" not in raw[8:] or raw.count("//") != 1:
        return None
    netloc = raw.split("/", 3)[2]
    if netloc != netloc.lower() or not is_http_url(raw):  # a host, as the slow path wants
        return None
    return _as_is(raw)


def _as_is(url: str) -> str | None:
    """`url` without its fragment where the slow path would return it so; else None."""
    if ";" in url or not _SAFE_URL_RE.fullmatch(url):  # urljoin may drop empty ;params
        return None
    hash_at = url.find("#")
    if hash_at >= 0:
        url = url[:hash_at]
    if url.endswith("?"):  # urljoin drops an empty query
        return None
    return url


class Resolver:
    """`resolve_slow` against one base URL, with fast paths for the common shapes of references.

    A page has tens to hundreds of references, and `urljoin` + `safe_url_string` cost ~25 us
    each: absolute URLs and root-relative paths without dot segments skip them, and the others
    are resolved once per page (src and srcset often repeat a URL).
    """

    def __init__(self, base: str):
        self.base = base
        root = resolve_slow(base, "/")  # the normalised origin (lower-case host, IDNA) + "/"
        self.origin = root[:-1] if root and root.endswith("/") else None
        self._slow: dict[str, str | None] = {}

    def __call__(self, raw: str | None) -> str | None:
        if not raw:
            return None
        raw = raw.strip()
        if not raw or raw[:11].lower().startswith(_SKIP_PREFIXES):
            return None
        url = None
        if raw.startswith(("http://", "https://")):
            url = fast_absolute(raw)
        elif self.origin and raw[0] == "/" and not raw.startswith("//") and "/." not in raw and "\\" not in raw:
            url = _as_is(self.origin + raw)
        return self._resolve_slow(raw) if url is None else url

    def _resolve_slow(self, raw: str) -> str | None:
        if raw not in self._slow:
            self._slow[raw] = resolve_slow(self.base, raw)
        return self._slow[raw]


def split_srcset(value: str | None) -> list[tuple[str, str]]:
    """(url, descriptor) of each candidate of a srcset, as the HTML standard splits them.

    A candidate URL runs to the next whitespace and may contain commas; a comma ends it only
    when trailing. Its descriptor runs to the next comma.
    """
    if not value:
        return []
    out: list[tuple[str, str]] = []
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
        if url:
            out.append((url, descriptor))
    return out


_DESCRIPTOR_RE = re.compile(r"^(\d+(?:\.\d+)?|\.\d+)([wx])$", re.I)


def parse_srcset(value: str | None) -> list[tuple[str, float]]:
    """Candidates of a srcset as (url, size): width for `w`, density for `x` (bare = 1x)."""
    out = []
    for url, descriptor in split_srcset(value):
        m = _DESCRIPTOR_RE.match(descriptor.split()[0]) if descriptor else None
        out.append((url, float(m.group(1)) if m else 1.0))
    return out


def largest_candidate(srcset: str | None) -> str | None:
    """URL of the largest srcset candidate (the first one among equals)."""
    if not srcset:
        return None
    if "," not in srcset and " " not in srcset.strip():
        return srcset.strip() or None  # a single bare URL, the common lazy-loading shape
    cands = parse_srcset(srcset)
    return max(cands, key=lambda c: c[1])[0] if cands else None


# -- the page -----------------------------------------------------------------------------------

# The element classes of lxml.html (HtmlElement, FormElement for <form>, ...), looked up in C:
# lxml.html's own parser calls a Python method for every element it hands out, which costs a
# third more per element, in this reader and in trafilatura working on the same tree.
_HTML_CLASSES = etree.ElementNamespaceClassLookup(etree.ElementDefaultClassLookup(
    element=lxml.html.HtmlElement, comment=lxml.html.HtmlComment, pi=lxml.html.HtmlProcessingInstruction,
    entity=lxml.html.HtmlEntity))
_HTML_CLASSES.get_namespace(None).update({
    "form": lxml.html.FormElement, "input": lxml.html.InputElement, "select": lxml.html.SelectElement,
    "textarea": lxml.html.TextareaElement, "label": lxml.html.LabelElement})


def html_parser(**options) -> etree.HTMLParser:
    """A new HTML parser (`etree.HTMLParser` options) whose trees are made of the classes
    `lxml.html.HTMLParser` gives, the same tree for the same page."""
    parser = etree.HTMLParser(**options)
    parser.set_element_class_lookup(_HTML_CLASSES)
    return parser


def parse_html(html: bytes | str, encoding: str | None = None) -> etree._Element | None:
    """The lxml tree of a page, or None for an empty or unparsable document.

    An `encoding` lxml does not know is ignored (lxml guesses from the bytes instead). libxml2
    stops at the first byte that is invalid in the page's encoding, and a real page with one
    stray byte would show nothing: such a page is decoded here with replacement characters,
    as stage 3 and browsers do, and parsed again.
    """
    return parse_page(html, encoding)[0]


def parse_page(html: bytes | str, encoding: str | None = None) -> tuple[etree._Element | None, bool]:
    """`parse_html`, and whether the page nests deeper than libxml2 reads: what lies below that
    depth, and after it, is not in the tree."""
    if not html:
        return None, False
    try:
        if isinstance(html, bytes):
            try:
                parser = html_parser(encoding=encoding)
                tree = lxml.html.document_fromstring(html, parser=parser)
            except LookupError:
                parser = html_parser()
                tree = lxml.html.document_fromstring(html, parser=parser)
            if any(e.type_name == "ERR_INVALID_ENCODING" for e in parser.error_log.filter_from_fatals()):
                text = _decode(html, encoding or _declared_charset(html))
                parser = html_parser()
                tree = lxml.html.document_fromstring(_XML_DECL.sub("", text, count=1), parser=parser)
        else:
            parser = html_parser()
            tree = lxml.html.document_fromstring(html, parser=parser)
        return tree, any("Excessive depth" in e.message for e in parser.error_log)
    except (etree.ParserError, ValueError) as exc:
        log.debug("unparsable page: %s", exc)
        return None, False


_XML_DECL = re.compile(r"^\s*<\?xml[^>]*\?>")
_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([\w.:-]+)""", re.I)


def _declared_charset(html: bytes) -> str:
    m = _META_CHARSET.search(html[:4096])
    return m.group(1).decode("ascii") if m else "utf-8"


def _decode(html: bytes, encoding: str) -> str:
    try:
        return html.decode(encoding, errors="replace")
    except LookupError:
        return html.decode("utf-8", errors="replace")


def base_url(tree: etree._Element, page_url: str) -> str:
    """The URL relative references resolve against: `<base href>` or the page URL."""
    for el in tree.iter("base"):
        resolved = resolve_slow(page_url, el.get("href"))
        if resolved:
            return resolved
    return page_url


@dataclass(slots=True)
class ImageElement:
    """One image of a page: its element, every URL it may load, and where it stands.

    `how` is "img", "picture" (an `<img>` inside a `<picture>`) or "og" (the page's og:image
    and twitter:image tags together; `element` is the first of them). `position` is the index
    of the `<img>` among the page's `img` and `BLOCK_TAGS` elements in document order, -1 for og.
    """

    element: etree._Element
    urls: list[str]
    how: str
    position: int


def picture_of(img: etree._Element) -> etree._Element | None:
    """The `<picture>` an `<img>` belongs to: its parent, or (as libxml2 nests `<source>`) the
    parent of the `<source>` elements above it; None when there is none."""
    parent = img.getparent()
    while parent is not None and parent.tag == "source":
        parent = parent.getparent()
    return parent if parent is not None and parent.tag == "picture" else None


def _picture_sources(picture: etree._Element) -> list[etree._Element]:
    """The `<source>` elements of a `<picture>`: children, and children of those (libxml2)."""
    out: list[etree._Element] = []
    stack = [picture]
    while stack:
        for child in stack.pop():
            if child.tag == "source":
                out.append(child)
                stack.append(child)
    return out


def image_attributes(el: etree._Element) -> tuple[tuple[str, bool], ...]:
    """(attribute, is a srcset) of `el` that carry the image URLs this reader reads.

    What a page rewriter must rewrite for every image URL of the page to change: `<img>`
    URL and srcset attributes, the srcsets of a `<source>` inside a `<picture>`, and the
    content of an image meta tag; nothing for other elements.
    """
    tag = el.tag
    if tag == "img":
        return _IMG_ATTRIBUTES
    if tag == "source":
        return _SOURCE_ATTRIBUTES if next(el.iterancestors("picture"), None) is not None else ()
    if tag == "meta" and _meta_name(el) in META_IMAGE_NAMES:
        return (("content", False),)
    return ()


_IMG_ATTRIBUTES = tuple((a, False) for a in SRC_ATTRS) + tuple((a, True) for a in SRCSET_ATTRS)
_SOURCE_ATTRIBUTES = tuple((a, True) for a in SRCSET_ATTRS)


def _meta_name(el: etree._Element) -> str:
    return (el.get("property") or el.get("name") or "").strip().lower()


def _add(out: list[str], url: str | None) -> None:
    if url and url not in out:
        out.append(url)


def img_urls(img: etree._Element, resolve_: Resolver) -> tuple[list[str], bool]:
    """(URLs, inside a picture) of one `<img>`: its own attributes, then its picture's sources."""
    out: list[str] = []
    get = img.get
    # Most of these attributes are absent (nine in ten on the real pages): skip them before
    # resolving, which would answer None for them anyway.
    value = get("src")
    if value:
        _add(out, resolve_(value))
    value = get("srcset")
    if value:
        _add(out, resolve_(largest_candidate(value)))
    for attr in LAZY_SRC_ATTRS:
        value = get(attr)
        if value:
            _add(out, resolve_(value))
    for attr in LAZY_SRCSET_ATTRS:
        value = get(attr)
        if value:
            _add(out, resolve_(largest_candidate(value)))
    picture = picture_of(img)
    if picture is not None:
        for source in _picture_sources(picture):
            for attr in SRCSET_ATTRS:
                value = source.get(attr)
                if value:
                    _add(out, resolve_(largest_candidate(value)))
    return out, picture is not None


def og_image(tree: etree._Element, resolve_: Resolver) -> ImageElement | None:
    """The page's og:image / twitter:image tags as one image, or None when it has none."""
    first, urls = None, []
    for el in tree.iter("meta"):
        if _meta_name(el) in META_IMAGE_NAMES:
            url = resolve_(el.get("content"))
            if url:
                first = el if first is None else first
                _add(urls, url)
    return ImageElement(first, urls, "og", -1) if urls else None


def image_elements(tree: etree._Element, page_url: str,
                   elements: list[etree._Element] | None = None) -> list[ImageElement]:
    """Every image of the page with at least one URL: `<img>` elements in document order, then og.

    Positions count `img` and `BLOCK_TAGS` elements only: iterating over those tags alone
    spares lxml building a Python proxy for every element of the page. `elements`, when given,
    is `list(tree.iter("img", *BLOCK_TAGS))` already made by the caller.
    """
    resolve_ = Resolver(base_url(tree, page_url))
    out: list[ImageElement] = []
    for pos, el in enumerate(tree.iter("img", *BLOCK_TAGS) if elements is None else elements):
        if el.tag == "img":
            urls, in_picture = img_urls(el, resolve_)
            if urls:
                out.append(ImageElement(el, urls, "picture" if in_picture else "img", pos))
    og = og_image(tree, resolve_)
    if og is not None:
        out.append(og)
    return out


def _image_urls(tree: etree._Element, resolve_: Resolver) -> list[str]:
    # The URLs of `image_elements` in the same order, without positions: over `img` alone.
    seen: dict[str, None] = {}
    for el in tree.iter("img"):
        seen.update(dict.fromkeys(img_urls(el, resolve_)[0]))
    og = og_image(tree, resolve_)
    if og is not None:
        seen.update(dict.fromkeys(og.urls))
    return list(seen)


def image_urls(tree: etree._Element, page_url: str) -> list[str]:
    """Every image URL of the page, each once, in the order of `image_elements`."""
    return _image_urls(tree, Resolver(base_url(tree, page_url)))


def links(tree: etree._Element, page_url: str) -> list[str]:
    """Absolute http(s) targets of `<a href>` and `<area href>` without rel=nofollow, each once."""
    return _links(tree, Resolver(base_url(tree, page_url)))


def _links(tree: etree._Element, resolve_: Resolver) -> list[str]:
    out: dict[str, None] = {}
    for el in tree.iter("a", "area"):
        rel = el.get("rel")
        if rel and "nofollow" in rel.lower().split():
            continue
        url = resolve_(el.get("href"))
        if url:
            out[url] = None
    return list(out)


# -- robots -------------------------------------------------------------------------------------

# Directives whose value follows a colon: `max-image-preview:none` is not a bot named
# max-image-preview saying `none`.
_VALUED_DIRECTIVES = ("max-snippet", "max-image-preview", "max-video-preview", "unavailable_after")
_DIRECTIVE_SPLIT = re.compile(r"[,;]")


def robots_directives(value: str | None) -> set[str]:
    """Lower-case directives of an X-Robots-Tag value or a robots meta content.

    Comma- (or semicolon-, or space-) separated; `botname: noai` counts as `noai` for any bot
    name, since an opt-out addressed to anyone is one we honour.
    """
    tokens: set[str] = set()
    for part in _DIRECTIVE_SPLIT.split((value or "").lower()):
        part = part.strip()
        name, colon, rest = part.partition(":")
        if colon and name.strip() in _VALUED_DIRECTIVES:
            tokens.add(name.strip() + ":" + rest.strip())
            continue
        tokens.update((rest if colon else part).split())
    return tokens


def meta_robots(tree: etree._Element) -> set[str]:
    """Directives of the page's `<meta name="robots">` and `<meta name="lait">` tags."""
    return _read_meta(tree)[0]


def page_meta(tree: etree._Element) -> tuple[set[str], bool | None, str | None]:
    """Robots directives, TDMRep reservation and TDMRep policy of a parsed page's meta tags
    (what `read_tree` reads of them, without the links and images)."""
    return _read_meta(tree)


def _read_meta(tree: etree._Element) -> tuple[set[str], bool | None, str | None]:
    """Robots directives, TDMRep reservation and TDMRep policy of the page's meta tags."""
    robots: set[str] = set()
    reservation = policy = None
    for el in tree.iter("meta"):
        name = (el.get("name") or "").strip().lower()
        if name in ROBOTS_META_NAMES:
            robots |= robots_directives(el.get("content"))
        elif name == TDM_RESERVATION:
            reservation = tdm_reservation(el.get("content"))
        elif name == TDM_POLICY:
            policy = (el.get("content") or "").strip() or None
    return robots, reservation, policy


def is_noai(directives: set[str]) -> bool:
    """Whether robots directives forbid AI use: `noai` or `noimageai` among them."""
    return not NOAI_DIRECTIVES.isdisjoint(directives)


# -- opt-outs and licence ------------------------------------------------------------------------

def tdm_reservation(value: str | None) -> bool | None:
    """A ``tdm-reservation`` header value or meta content: True (1), False (0), None (absent,
    or anything else)."""
    if value is None:
        return None
    value = value.strip()
    return True if value == "1" else False if value == "0" else None


def is_tdm_reserved(header: bool | None, meta: bool | None) -> bool:
    """Whether TDM rights are reserved: the header decides when present, else the meta tag."""
    return bool(header if header is not None else meta)


def _is_cc_license(url: str) -> bool:
    parts = urlsplit(url)
    return parts.hostname in CC_HOSTS and parts.path.startswith(("/licenses/", "/publicdomain/"))


def page_license(tree: etree._Element, page_url: str) -> str | None:
    """The licence a page declares (see the module docstring), or None."""
    return _page_license(tree, Resolver(base_url(tree, page_url)), page_url)


def figure_license(figure: etree._Element, tree: etree._Element, page_url: str) -> str | None:
    """The licence a page declares for the image of one `<figure>`: a ``rel="license"`` link
    (or a link to a Creative Commons licence) inside the figure, which applies to that image
    alone, not to the page; or None."""
    if next(figure.iter("a", "link", "area"), None) is None:  # the common figure: no link at all
        return None
    return _page_license(figure, Resolver(base_url(tree, page_url)), page_url, figures=True)


def _in_figure(el: etree._Element) -> bool:
    return next(el.iterancestors("figure"), None) is not None


def _page_license(tree: etree._Element, resolve_: Resolver, page_url: str, figures: bool = False) -> str | None:
    """The licence `tree` declares (see the module docstring). `figures`: whether links inside a
    `<figure>` count; for a page they do not, as each is its figure's own (`figure_license`)."""
    declared: list[str] = []
    cc_links: list[str] = []
    for el in tree.iter("link", "a", "area"):
        href = el.get("href")
        if not href:
            continue
        rel = (el.get("rel") or "").lower().split()
        if ("license" in rel or (el.tag == "a" and "creativecommons.org" in href)) and not figures \
                and _in_figure(el):
            continue
        if "license" in rel:
            url = resolve_(href)
            if url and url != page_url:
                declared.append(url)
        elif el.tag == "a" and "creativecommons.org" in href:
            url = resolve_(href)
            if url and _is_cc_license(url):
                cc_links.append(url)
    if declared:
        return next((u for u in declared if _is_cc_license(u)), declared[0])
    for el in tree.iter("meta"):
        if _meta_name(el) in LICENSE_META_NAMES:
            content = (el.get("content") or "").strip()
            if content:
                return content
    return cc_links[0] if cc_links else None


# -- one read of a page -------------------------------------------------------------------------

@dataclass
class PageRead:
    """What one parse of a page yields: outgoing links, image URLs, robots meta directives,
    its TDMRep meta (reservation and policy) and the licence it declares."""

    links: list[str] = field(default_factory=list)
    images: list[str] = field(default_factory=list)
    robots: set[str] = field(default_factory=set)
    tdm_reservation: bool | None = None
    tdm_policy: str | None = None
    license: str | None = None
    too_deep: bool = False  # nested deeper than libxml2 reads: images and links below were not read


def read_tree(tree: etree._Element, page_url: str) -> PageRead:
    """Links, image URLs, robots and TDMRep meta and the licence of a parsed page."""
    resolve_ = Resolver(base_url(tree, page_url))
    robots, reservation, policy = _read_meta(tree)
    return PageRead(_links(tree, resolve_), _image_urls(tree, resolve_), robots, reservation, policy,
                    _page_license(tree, resolve_, page_url))


def read_page(html: bytes | str, page_url: str, encoding: str | None = None) -> PageRead:
    """Links, image URLs, robots and TDMRep meta and the licence of a page, from one parse."""
    tree, too_deep = parse_page(html, encoding)
    if tree is None:
        return PageRead()
    read = read_tree(tree, page_url)
    read.too_deep = too_deep
    return read
