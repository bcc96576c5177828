"""Which image a text of a page belongs to, when the page gives it to several.

A page gives one text to several of its images in a few ways: a headline used as the alt of
every picture, a paragraph that sits between the pictures of a gallery (the context of each),
og texts with several `og:image` tags. Such a text is about the page; kept on all those images
it would become the caption of pictures it does not describe. It stays with one image, its
owner, and is dropped for the others as `clean/page_text`:

- an og text belongs to the og image (the first `og:image`, see `og_owner`);
- otherwise the image whose own markup carries it wins (figcaption, then alt, title, aria),
  then the image nearest to the paragraph it was taken from, then the first in the page.

Images that share a URL (a `<noscript>` copy, the same picture twice) or a `<figure>` (a lazy
placeholder and its real image) are one image here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Lower is a stronger claim on a text.
SOURCE_RANK = {"og": 0, "figcaption": 1, "alt": 2, "title": 3, "aria": 4, "context": 5}


@dataclass
class ImageTexts:
    """One image of a page with its raw texts: (source, text, distance), where distance is 0
    for the image's own texts and the number of positions to the paragraph for context."""

    urls: list[str]
    position: int  # document order (-1: og)
    texts: list[tuple[str, str, int]] = field(default_factory=list)
    figure: object | None = None  # images with the same figure (an lxml element) are one picture


@dataclass
class SharedText:
    """A text dropped for one image URL before cleaning: because another image of the page owns
    it (`page_text`), or because of where the image sits (`image_place`)."""

    image_url: str
    source: str
    text: str
    detail: str
    rule: str = "page_text"


_END_MARKS = ".!?…:;,'\"”’ "


def _key(text: str) -> str:
    """A text as pages repeat it: case, spacing and the marks it ends with aside ("A heron in
    the lake" as one image's alt and "A heron in the lake." as another's figcaption)."""
    return " ".join(text.casefold().split()).rstrip(_END_MARKS)


def _groups(images: list[ImageTexts]) -> list[int]:
    """Group id per image: images sharing a URL or a figure are one."""
    parent = list(range(len(images)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first: dict[object, int] = {}
    for i, img in enumerate(images):
        keys: list[object] = list(img.urls) + ([("figure", img.figure)] if img.figure is not None else [])
        for key in keys:
            j = first.setdefault(key, i)
            ri, rj = find(i), find(j)
            if ri != rj:
                parent[max(ri, rj)] = min(ri, rj)
    return [find(i) for i in range(len(images))]


def assign(images: list[ImageTexts], one_owner: bool = True) -> tuple[list[tuple[str, list[tuple[str, str]]]],
                                                                    list[SharedText]]:
    """([(image_url, [(source, text)])] for every URL of every image, in page order, and the
    texts dropped because another image owns them). With `one_owner` False every image keeps
    every text offered to it (stage 3's `rules_off: [page_text]`, a raw pool)."""
    group = _groups(images)
    claims: dict[str, dict[int, tuple[int, int, int]]] = {}  # text -> group -> best claim
    for i, img in enumerate(images):
        order = img.position if img.position >= 0 else len(images) + 1 << 20
        for source, text, dist in img.texts:
            claim = (SOURCE_RANK.get(source, len(SOURCE_RANK)), dist, order)
            by_group = claims.setdefault(_key(text), {})
            g = group[i]
            if g not in by_group or claim < by_group[g]:
                by_group[g] = claim
    owner = {k: min(by_group, key=by_group.__getitem__) for k, by_group in claims.items()
             if len(by_group) > 1 and one_owner}
    where = {g: img for g, img in zip(group, images)}  # one image of each group, for the detail
    per_url: dict[str, list[tuple[str, str]]] = {}
    shared: list[SharedText] = []
    for i, img in enumerate(images):
        g = group[i]
        for url in img.urls:
            per_url.setdefault(url, [])
        for source, text, _ in img.texts:
            k = _key(text)
            if k in owner and owner[k] != g:
                own = where[owner[k]]
                at = "the og image" if own.position < 0 else f"the image at position {own.position}"
                n = len(claims[k])
                shared.extend(SharedText(url, source, text, f"given to {n} images of the page; it belongs to {at}")
                              for url in img.urls)
                continue
            for url in img.urls:
                if (source, text) not in per_url[url]:
                    per_url[url].append((source, text))
    return list(per_url.items()), shared


def pictures(tree, page_url: str) -> dict[str, int]:
    """Image URL -> the picture it shows, as this module counts them (images sharing a URL or a
    `<figure>` are one picture; the og image is one): what "one image" means for page texts."""
    from lait.filters.html_images import find_images

    images = [ImageTexts(img.urls, img.position, figure=img.figure) for img in find_images(tree, page_url)]
    group = _groups(images)
    return {url: group[i] for i, img in enumerate(images) for url in img.urls}
