"""The texts a page gives its images, for stage 3: alt, title, aria-label, figcaption and og.

Which images a page shows, their URLs and their positions come from the one page reader,
`lait.pagereader` (the crawler and the WARC ingest read pages through it too, so every
candidate's image URL joins an `images` row). This module adds the texts: per `<img>` its
`alt`, `title`, `aria-label` and the caption of its `<figure>` without the credits; for the
og:image the page's og:description and og:title.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field

from lxml import etree
from lxml import html as lxml_html

from lait.pagereader import BLOCK_TAGS, Resolver, base_url, image_elements

__all__ = ["BLOCK_TAGS", "PageImage", "find_images", "normalise_space", "og_owner", "site_names", "visible_text"]

_CREDIT = re.compile(r"\b(credit|copyright|byline|attribution|caption-source|photographer)\b", re.I)


@dataclass
class PageImage:
    """One image of a page (an `<img>`, or og:image) with its URLs and the texts that go with it."""

    urls: list[str]
    via: str  # img, picture, og
    position: int  # index among the page's images and paragraph-like elements (-1: og:image)
    texts: list[tuple[str, str]] = field(default_factory=list)  # (source, text)
    figure: object | None = None  # the <figure> it is in: two images of one figure are one picture
    element: object | None = None  # the <img> (None for og:image): where it sits (`lait.filters.image_place`)


def normalise_space(text: str | None) -> str:
    """Runs of whitespace as one space, none at the ends (str.split's whitespace is regex `\\s`)."""
    return " ".join(text.split()) if text else ""


# Elements whose content a reader never sees as text: code, styles, and the fallback of pages
# without scripts (lxml parses a <noscript> as markup). Their content never becomes a text.
UNSEEN_TAGS = ("script", "style", "noscript", "template")


def visible_text(el: lxml_html.HtmlElement, *, in_place: bool = False) -> str:
    """The text of an element as a reader sees it: `text_content()` without what lies inside
    `UNSEEN_TAGS` (nor comments, which are no text either).

    `in_place`: those elements are taken out of `el` itself rather than out of a copy, for a
    caller that reads nothing else of the tree afterwards (copying a whole page costs more than
    the rest)."""
    if next(el.iter(*UNSEEN_TAGS), None) is None:  # the common case, at C speed
        return el.text_content()
    if next(el.iterancestors(*UNSEEN_TAGS), None) is not None:  # all of it lies inside one
        return ""
    # The text without those elements (their tails stay: they are outside them). Both steps run
    # in C; an XPath that tests the ancestors of every text node took 2 to 3 times as long on
    # whole pages (`_Mender.page_text` in stage 3), where scripts are the rule.
    bare = el if in_place else copy.copy(el)
    etree.strip_elements(bare, *UNSEEN_TAGS, with_tail=False)
    return bare.text_content()


def _caption_text(figcaption: lxml_html.HtmlElement) -> str:
    """A figcaption's text without the parts marked as credits: class credit, copyright...,
    and `<small>`/`<cite>`, where pages put the photographer and agency."""
    parts: list[str] = []

    def walk(el: lxml_html.HtmlElement) -> None:
        # A comment, script or style inside the caption is not part of it; credits are left out.
        if not isinstance(el.tag, str) or el.tag in UNSEEN_TAGS or el.tag in ("small", "cite") or _CREDIT.search(
                el.get("class", "") + " " + el.get("itemprop", "")):
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
    """The caption of the `<figure>` nearest above the image: its own `<figcaption>`s, not those
    of figures nested in it (a figure inside another figure's caption area is another image)."""
    el = img.getparent()
    for _ in range(12):  # figure > a > picture > source > source > img, as libxml2 nests it
        if el is None:
            return ""
        if el.tag == "figure":
            caps = [_caption_text(c) for c in el.iter("figcaption") if _nearest_figure(c) is el]
            return " ".join(c for c in caps if c)
        el = el.getparent()
    return ""


def _nearest_figure(el: lxml_html.HtmlElement) -> lxml_html.HtmlElement | None:
    return next(el.iterancestors("figure"), None)


def find_images(tree: lxml_html.HtmlElement, page_url: str,
                elements: list[lxml_html.HtmlElement] | None = None) -> list[PageImage]:
    """The images of `lait.pagereader.image_elements`, in its order, with their texts.

    `elements`, when given, is `list(tree.iter("img", *BLOCK_TAGS))` already made by the caller.
    """
    return [PageImage(image.urls, image.how, image.position,
                      _og_texts(tree) if image.how == "og" else _img_texts(image.element),
                      None if image.how == "og" else _nearest_figure(image.element),
                      None if image.how == "og" else image.element)
            for image in image_elements(tree, page_url, elements)]


def _img_texts(el: lxml_html.HtmlElement) -> list[tuple[str, str]]:
    out = []
    for source, value in (("alt", el.get("alt")), ("title", el.get("title")),
                          ("aria", el.get("aria-label")), ("figcaption", _figcaption_of(el))):
        value = normalise_space(value)
        if value:
            out.append((source, value))
    return out


_OG_TEXT_PROPERTIES = ("og:description", "og:title")


def _og_texts(tree: lxml_html.HtmlElement) -> list[tuple[str, str]]:
    """The content of the first `<meta property="og:description">` that has one, then of the
    first og:title (each left out when blank)."""
    first: dict[str, str] = {}
    for el in tree.iter("meta"):
        prop = el.get("property")
        if prop in _OG_TEXT_PROPERTIES and prop not in first:
            content = el.get("content")
            if content is not None:
                first[prop] = content
    return [("og", text) for prop in _OG_TEXT_PROPERTIES if (text := normalise_space(first.get(prop)))]


_OG_IMAGE = ("og:image", "og:image:url", "og:image:secure_url")


def og_owner(tree: lxml_html.HtmlElement, page_url: str, og: PageImage) -> str:
    """The URL of the og image that the page's og texts describe: the first `og:image` (a page
    may list several, each another picture), else the first twitter:image."""
    resolve = Resolver(base_url(tree, page_url))
    for el in tree.iter("meta"):
        if (el.get("property") or el.get("name") or "").strip().lower() in _OG_IMAGE:
            url = resolve(el.get("content"))
            if url in og.urls:
                return url
    return og.urls[0]


_TITLE_SEPARATORS = re.compile(r"\s+(?:\||-|–|—|::|·|•|»)\s+")


def site_names(tree: lxml_html.HtmlElement) -> frozenset[str]:
    """The names the page gives its site (og:site_name, application-name, twitter:site, the
    last part of a `<title>` such as "Story - The Site"), lower-cased: a candidate that is only
    one of them names the site, not a picture."""
    names: set[str] = set()
    for el in tree.iter("meta"):
        key = (el.get("property") or el.get("name") or "").strip().lower()
        if key in ("og:site_name", "application-name", "twitter:site", "apple-mobile-web-app-title"):
            names.add(normalise_space(el.get("content")).lstrip("@"))
    title = next(tree.iter("title"), None)
    if title is not None:
        parts = _TITLE_SEPARATORS.split(normalise_space(visible_text(title)))
        if len(parts) >= 2 and len(parts[-1].split()) <= 5:
            names.add(parts[-1])
    return frozenset(n.casefold() for n in names if n)
