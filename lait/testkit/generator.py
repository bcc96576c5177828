"""A deterministic synthetic website that exercises what real pages do.

``generate_site(n_pages, seed)`` returns a :class:`Site` whose every route is computed
lazily from ``(seed, page index)``: pages are cheap to build and images render only when
requested, so 20,000-page sites cost almost nothing up front. ``Site.ground_truth()``
states, for every page and every image URL, what a correct pipeline keeps or rejects and why.

Ground-truth reason names (``images[url]["reason"]``), in order of precedence:

- ``crawl/robots``          only referenced from pages under the robots.txt-disallowed prefix
- ``crawl/noai_page``       only referenced from a page served with ``X-Robots-Tag: noai``
- ``crawl/status_404``      the image URL answers 404
- ``crawl/noai``            the image itself is served with ``X-Robots-Tag: noai``
- ``filter/min_side``       shorter side under 300 px (icons, thumbnails, srcset variants,
                            the lazy-load placeholder, the 1x1 tracking GIF)
- ``filter/aspect_ratio``   the wide banner (aspect ratio > 3)
- ``filter/uninformative``  the site logo (alt "logo", on every page)
- ``filter/duplicate_sha256``  same bytes as an earlier kept image (``duplicate_of``)
- ``filter/duplicate_phash``   a resized re-encode of an earlier kept image (``duplicate_of``)

Everything else has ``keep: true`` and ``reason: null``. Among duplicates the first one in
document order (home, about, categories, then articles by index) is the kept one.

Every third article declares a Creative Commons licence (``<link rel="license">``), the next
one a licence meta tag (``pages[path]["license"]`` says which). With hostile hosts attached
(`Site.attach_hostile`, `lait.testkit.hostile`), every fourth public article also shows two
images on hostile hosts; their ground truth names the reasons of their kind (``reasons``).
"""

from __future__ import annotations

import functools
import io
import json
import logging
import random
import re
import unicodedata
from dataclasses import dataclass, field, replace
from html import escape
from pathlib import Path

from PIL import Image, ImageDraw

from lait.testkit.scenes import Scene, describe, random_scene, render_scene

log = logging.getLogger(__name__)

DISALLOWED_PREFIX = "/private/"
NOAI_PAGE = 8           # article index served with X-Robots-Tag: noai
NOAI_IMAGE_PAGE = 6     # article whose first photo is served with X-Robots-Tag: noai
CATEGORIES = ("shapes", "colours", "patterns", "studio", "science")
PHOTO_SIZES = ((384, 320), (480, 360), (320, 400), (512, 384))
ICONS = ("share", "print", "mail", "rss")
HTML = "text/html; charset=utf-8"
CC_BY = "https://creativecommons.org/licenses/by/4.0/"
META_LICENSE = "CC BY-SA 4.0"
_ARTICLE_RE = re.compile(r"/(?:articles|de/artikel|fr/articles|private)/(\d{5})-[a-z0-9-]+\.html")


@dataclass(frozen=True)
class Response:
    """One HTTP answer of a site: status, content type, body bytes and extra headers."""

    status: int
    content_type: str
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ImageSpec:
    """Everything needed to render one image URL, and its own (page-independent) verdict."""

    url: str
    kind: str  # photo, variant, copy, near_copy, thumb, banner, social, missing, logo, ...
    width: int = 0
    height: int = 0
    format: str = "JPEG"
    scene: Scene | None = None
    seed: int = 0
    quality: int = 90
    render_size: tuple[int, int] | None = None  # render at this size, then resize (near copies)
    caption: str | None = None  # what the image shows (English)
    identity: str | None = None  # same identity = same picture (for duplicate grouping)
    status: int = 200
    noai: bool = False
    own_reason: str | None = None

    @property
    def content_key(self) -> tuple:
        """Equal keys mean byte-identical renders."""
        return (self.scene, self.width, self.height, self.seed, self.quality, self.render_size,
                self.format, self.kind if self.scene is None else "scene")


@dataclass(frozen=True)
class ImageRef:
    """One occurrence of an image URL on a page, with the caption that page offers for it."""

    url: str
    found_via: str  # img, srcset, data-src, picture, og
    alt: str | None = None
    true_caption: str | None = None
    caption_sources: tuple[str, ...] = ()
    candidates: tuple[str, ...] = ()
    junk_alt: bool = False  # the alt says nothing about the picture

    def to_json(self) -> dict:
        d = {"url": self.url, "found_via": self.found_via, "alt": self.alt,
             "true_caption": self.true_caption, "caption_sources": list(self.caption_sources)}
        if self.candidates:
            d["candidates"] = list(self.candidates)
        return d


@dataclass(frozen=True)
class PageSpec:
    """A built page: its HTML, what it references, and the images it owns (serves)."""

    path: str
    lang: str
    title: str
    html: str
    refs: tuple[ImageRef, ...]
    links: tuple[str, ...]
    owned: dict[str, ImageSpec]
    disallowed: bool = False
    noai: bool = False

    def to_json(self) -> dict:
        return {"status": 200, "lang": self.lang, "title": self.title,
                "disallowed": self.disallowed, "noai": self.noai,
                "links": list(self.links), "images": [r.to_json() for r in self.refs]}


# --------------------------------------------------------------------------------------
# Text: titles, filler paragraphs and caption sentences in three languages

_WORDS = {
    "en": {"adj": ["New", "Bright", "Quiet", "Bold", "Simple", "Curious", "Hidden", "Modern"],
           "thing": ["shapes", "colours", "patterns", "studio notes", "compositions", "forms"],
           "place": ["Lisbon", "Oslo", "the studio", "the gallery", "Kyoto", "the archive"],
           "title": "{adj} {thing} from {place}",
           "sentences": [
               "Our team spent {n} days in {place} looking at {thing}.",
               "Visitors often ask why {thing} look so different under morning light.",
               "The exhibition runs until the end of the month and admission is free.",
               "Several readers wrote in after last week's story about {thing}.",
               "We talked to {n} artists who work with {thing} every day.",
               "The results surprised even the people who planned the project.",
               "More pictures from {place} will follow in the coming weeks."],
           "context": "The photo above shows {caption}.",
           "gallery": "Also in this story", "related": "Related articles",
           "read": "Read more", "home": "Home", "about": "About", "cats": "Categories"},
    "de": {"adj": ["Neue", "Helle", "Stille", "Kühne", "Einfache", "Verborgene"],
           "thing": ["Formen", "Farben", "Muster", "Kompositionen"],
           "place": ["Berlin", "Hamburg", "dem Atelier", "der Galerie", "Wien"],
           "title": "{adj} {thing} aus {place}",
           "sentences": [
               "Unser Team war {n} Tage in {place} unterwegs.",
               "Besucher fragen oft, warum die {thing} am Morgen so anders wirken.",
               "Die Ausstellung läuft bis Ende des Monats, der Eintritt ist frei.",
               "Wir haben mit {n} Künstlerinnen und Künstlern gesprochen.",
               "Weitere Bilder aus {place} folgen in den nächsten Wochen."],
           "context": "Das Foto oben zeigt {caption}.",
           "gallery": "Mehr zum Thema", "related": "Weitere Artikel",
           "read": "Weiterlesen", "home": "Startseite", "about": "Über uns", "cats": "Rubriken"},
    "fr": {"adj": ["Nouvelles", "Belles", "Discrètes", "Audacieuses", "Simples"],
           "thing": ["formes", "couleurs", "motifs", "compositions"],
           "place": ["Paris", "Lyon", "l'atelier", "la galerie", "Marseille"],
           "title": "{adj} {thing} de {place}",
           "sentences": [
               "Notre équipe a passé {n} jours à {place}.",
               "Les visiteurs demandent souvent pourquoi les {thing} changent avec la lumière.",
               "L'exposition dure jusqu'à la fin du mois et l'entrée est gratuite.",
               "Nous avons rencontré {n} artistes qui travaillent chaque jour.",
               "D'autres images de {place} suivront dans les prochaines semaines."],
           "context": "La photo ci-dessus montre {caption}.",
           "gallery": "À voir aussi", "related": "Articles liés",
           "read": "Lire la suite", "home": "Accueil", "about": "À propos", "cats": "Rubriques"},
}
_CREDITS = ("Photo: Staff", "Photo: J. Rivera / Studio", "Image: Archive", "Foto: Redaktion")


def _junk_alt(rng: random.Random) -> str:
    """An alt text that says nothing about the picture, as real pages are full of."""
    return rng.choice((
        f"IMG_{rng.randint(1000, 9999)}.JPG", f"DSC{rng.randint(0, 99999):05d}.jpg",
        "image", "click here", "logo", "photo", "", "", "picture", "untitled",
    ))


def _caption_core(caption: str) -> str:
    """A caption without its "photo of" lead-in and with a lower-case first letter."""
    core = re.sub(r"^(photo of |photo : |Foto: )", "", caption)
    return core[0].lower() + core[1:]


def _slug(text: str) -> str:
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:48] or "page"


def _fill(template: str, rng: random.Random, words: dict) -> str:
    return template.format(n=rng.randint(2, 12), place=rng.choice(words["place"]),
                           thing=rng.choice(words["thing"]))


def _paragraph(rng: random.Random, words: dict) -> str:
    sents = rng.sample(words["sentences"], rng.randint(2, 3))
    return " ".join(_fill(s, rng, words) for s in sents)


# --------------------------------------------------------------------------------------
# Image encoding


def _encode(spec: ImageSpec) -> bytes:
    buf = io.BytesIO()
    if spec.scene is not None:
        if spec.render_size is not None:
            # A re-encoded resize of the original: perceptually equal, different bytes.
            img = render_scene(spec.scene, *spec.render_size, seed=spec.seed)
            img = img.resize((spec.width, spec.height), Image.BILINEAR)
        else:
            img = render_scene(spec.scene, spec.width, spec.height, seed=spec.seed)
        img.save(buf, "JPEG", quality=spec.quality)
    elif spec.kind == "logo":
        img = Image.new("RGB", (spec.width, spec.height), (250, 250, 250))
        d = ImageDraw.Draw(img)
        d.ellipse((40, 40, spec.width - 40, spec.height - 40), fill=(200, 30, 60))
        d.rectangle((110, 110, spec.width - 110, spec.height - 110), fill=(250, 250, 250))
        d.text((20, 10), "Shapes Daily", fill=(20, 20, 20))
        img.save(buf, "PNG")
    elif spec.kind == "icon":
        img = Image.new("RGBA", (spec.width, spec.height), (0, 0, 0, 0))
        ImageDraw.Draw(img).ellipse((2, 2, spec.width - 3, spec.height - 3), fill=(60, 60, 60, 255))
        img.save(buf, "PNG")
    else:  # pixel, placeholder
        Image.new("L", (spec.width, spec.height), 220).save(buf, "GIF")
    return buf.getvalue()


# --------------------------------------------------------------------------------------
# The site


@dataclass
class _ArticleDraft:
    """An article while it is built: its random stream, markup so far, references and images."""

    i: int
    rng: random.Random
    lang: str
    base: str  # /img/NNNNN, where the article's own images live
    image_seed: int
    parts: list[str] = field(default_factory=list)
    refs: list[ImageRef] = field(default_factory=list)
    owned: dict[str, ImageSpec] = field(default_factory=dict)
    head_extra: str = ""

    @property
    def words(self) -> dict:
        return _WORDS[self.lang]

    def own_scene(self, url: str, kind: str, w: int, h: int, scene: Scene, caption: str, identity: str,
                  reason: str | None = None, **kw) -> ImageSpec:
        """Serve a rendered scene at ``url`` from this article."""
        spec = ImageSpec(url, kind, w, h, scene=scene, seed=self.image_seed, caption=caption,
                         identity=identity, own_reason=reason, **kw)
        self.owned[url] = spec
        return spec


class Site:
    """A synthetic site of ``n_pages`` articles plus home, about, category and robots routes.

    All routes are pure functions of ``(seed, path)``; page specs are built on demand and
    kept in a small LRU cache, so the object is cheap for 20,000 pages and thread-safe.
    """

    name = "Shapes Daily"

    def __init__(self, n_pages: int = 200, seed: int = 0) -> None:
        if n_pages < 1:
            raise ValueError("n_pages must be at least 1")
        self.n_pages = n_pages
        self.seed = seed
        self.article = functools.lru_cache(maxsize=2048)(self._build_article)
        # Titles and paths are needed for every link to a page: memoise them (small strings).
        self.title = functools.lru_cache(maxsize=65536)(self._title)
        self.article_path = functools.lru_cache(maxsize=65536)(self._article_path)
        self._static = self._static_images()
        self._categories: dict[str, PageSpec] = {}
        self.hostile = None  # lait.testkit.hostile.HostileHosts, once attached

    # ----- page roles: fixed by index so that every feature exists from ~20 pages on
    def _rng(self, i: int, what: str) -> random.Random:
        # An integer seed is much cheaper than a string one (no sha512).
        return random.Random((self.seed * 4_000_037 + i) * 8 + ("title", "body").index(what))

    def lang(self, i: int) -> str:
        """Language of article ``i``: mostly English, every tenth German / French."""
        return {3: "de", 7: "fr"}.get(i % 10, "en")

    def is_private(self, i: int) -> bool:
        return i % 25 == 12

    def _title(self, i: int) -> str:
        """Headline of article ``i`` (ends with the index, so titles are unique)."""
        words = _WORDS[self.lang(i)]
        rng = self._rng(i, "title")
        return words["title"].format(adj=rng.choice(words["adj"]), thing=rng.choice(words["thing"]),
                                     place=rng.choice(words["place"])) + f" ({i})"

    def category(self, i: int) -> str:
        return CATEGORIES[i % len(CATEGORIES)]

    def _article_path(self, i: int) -> str:
        """Server-relative URL of article ``i`` (language- and robots-dependent prefix)."""
        slug = _slug(self.title(i))
        if self.is_private(i):
            return f"{DISALLOWED_PREFIX}{i:05d}-{slug}.html"
        prefix = {"en": "/articles", "de": "/de/artikel", "fr": "/fr/articles"}[self.lang(i)]
        return f"{prefix}/{i:05d}-{slug}.html"

    def public_articles(self) -> list[int]:
        return [i for i in range(self.n_pages) if not self.is_private(i)]

    def page_paths(self) -> list[str]:
        """Every HTML page of the site, in document order (home first)."""
        return (["/", "/about.html"] + [f"/category/{c}.html" for c in CATEGORIES]
                + [self.article_path(i) for i in range(self.n_pages)])

    # ----- images shared by every page
    def _static_images(self) -> dict[str, ImageSpec]:
        specs = [ImageSpec("/static/logo.png", "logo", 320, 320, "PNG",
                           own_reason="filter/uninformative"),
                 ImageSpec("/static/placeholder.gif", "placeholder", 16, 16, "GIF",
                           own_reason="filter/min_side"),
                 ImageSpec("/t/pixel.gif", "pixel", 1, 1, "GIF", own_reason="filter/min_side")]
        specs += [ImageSpec(f"/static/icons/{n}.png", "icon", 24, 24, "PNG",
                            own_reason="filter/min_side") for n in ICONS]
        return {s.url: s for s in specs}

    # ----- HTML chrome shared by every page
    def _chrome(self, lang: str, title: str, body: str, head_extra: str = "",
                description: str = "") -> str:
        words = _WORDS[lang]
        nav = "".join(f'<li><a href="/category/{c}.html">{c.title()}</a></li>' for c in CATEGORIES)
        icons = "".join(f'<a href="#{n}" class="share-{n}"><img src="/static/icons/{n}.png" '
                        f'alt="{n}" width="24" height="24"></a>' for n in ICONS)
        return (
            f'<!DOCTYPE html>\n<html lang="{lang}">\n<head>\n<meta charset="utf-8">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f"<title>{escape(title)} | {self.name}</title>\n"
            f'<meta name="description" content="{escape(description or title)}">\n'
            f'<meta property="og:site_name" content="{self.name}">\n{head_extra}'
            f'<link rel="stylesheet" href="/static/site.css">\n</head>\n<body>\n'
            f'<header class="site-header"><a href="/" class="brand"><img src="/static/logo.png" '
            f'alt="logo" width="64" height="64"></a>\n<nav aria-label="main"><ul>'
            f'<li><a href="/">{words["home"]}</a></li>{nav}'
            f'<li><a href="/about.html">{words["about"]}</a></li></ul></nav></header>\n'
            f"<main>\n{body}\n</main>\n"
            f'<footer><div class="share">{icons}</div><p>&copy; 2024 {self.name}. '
            f'<a href="/sitemap.xml">Sitemap</a> &middot; <a href="/about.html">Contact</a></p>'
            f'<img src="/t/pixel.gif" alt="" width="1" height="1" class="tracker"></footer>\n'
            f"</body>\n</html>\n")

    def _chrome_refs(self) -> list[ImageRef]:
        return ([ImageRef("/static/logo.png", "img", "logo", junk_alt=True)]
                + [ImageRef(f"/static/icons/{n}.png", "img", n, junk_alt=True) for n in ICONS]
                + [ImageRef("/t/pixel.gif", "img", "")])

    # ----- listing pages
    def _listing(self, path: str, heading: str, indices: list[int]) -> PageSpec:
        items = "\n".join(f'<li><a href="{self.article_path(i)}">{escape(self.title(i))}</a></li>'
                          for i in indices)
        body = f"<h1>{escape(heading)}</h1>\n<ul class=\"article-list\">\n{items}\n</ul>"
        links = tuple(self.article_path(i) for i in indices)
        return PageSpec(path, "en", heading, self._chrome("en", heading, body),
                        tuple(self._chrome_refs()), links, {})

    @functools.cached_property
    def home(self) -> PageSpec:
        return self._listing("/", f"{self.name}: all articles", self.public_articles())

    def category_page(self, name: str) -> PageSpec:
        if name not in self._categories:
            idx = [i for i in self.public_articles() if self.category(i) == name]
            self._categories[name] = self._listing(f"/category/{name}.html",
                                                   f"Category: {name}", idx)
        return self._categories[name]

    @functools.cached_property
    def about(self) -> PageSpec:
        body = ("<article><h1>About us</h1><p>Shapes Daily is a small magazine about shapes, "
                "colours and patterns. All pictures are our own.</p></article>")
        return PageSpec("/about.html", "en", "About us", self._chrome("en", "About us", body),
                        tuple(self._chrome_refs()), (), {})

    # ----- articles
    def _build_article(self, i: int) -> PageSpec:
        """Build article ``i`` (HTML, references, owned images) from its own random stream.

        Which features an article has is fixed by its index; the steps draw from the stream in
        this order, so changing the order changes every article."""
        rng = self._rng(i, "body")
        title = self.title(i)
        d = _ArticleDraft(i, rng, self.lang(i), f"/img/{i:05d}", self.seed * 100_003 + i)
        d.parts += [f"<h1>{escape(title)}</h1>",
                    f'<p class="byline">By Staff &middot; {self.category(i).title()}</p>']
        description = _fill(d.words["sentences"][0], rng, d.words)
        if i % 7 == 2:
            self._add_banner(d)
        if i % 6 == 1:
            self._add_social(d, title)
        for k in range(rng.choice((1, 2, 2, 3))):
            self._add_photo(d, k)
        if i % 20 == 9:
            self._add_exact_copy(d)
        if i % 20 == 14:
            self._add_near_copy(d)
        links, related = self._related(i, rng)
        if i % 15 == 11:
            self._add_broken_image(d)
        return self._finish_article(d, title, description, links, related)

    def _add_banner(self, d: _ArticleDraft) -> None:
        """A wide banner: aspect ratio > 3."""
        scene = random_scene(d.rng)
        cap = describe(scene, d.rng, d.lang)
        url = f"{d.base}/banner.jpg"
        d.own_scene(url, "banner", 1152, 320, scene, cap, f"{d.i}-banner", "filter/aspect_ratio")
        d.parts.append(f'<div class="banner"><img src="{url}" alt="{escape(cap)}" '
                       f'width="1152" height="320"></div>')
        d.refs.append(ImageRef(url, "img", cap, cap, ("alt",)))

    def _add_social(self, d: _ArticleDraft, title: str) -> None:
        """An image whose caption lives only in Open Graph tags."""
        scene = random_scene(d.rng)
        cap = describe(scene, d.rng, d.lang)
        url = f"{d.base}/social.jpg"
        d.own_scene(url, "social", 480, 360, scene, cap, f"{d.i}-social")
        d.head_extra = (f'<meta property="og:title" content="{escape(title)}">\n'
                        f'<meta property="og:image" content="{{base_url}}{url}">\n'
                        f'<meta property="og:description" content="{escape(cap)}">\n')
        d.refs.append(ImageRef(url, "og", None, cap, ("og",)))

    def _add_photo(self, d: _ArticleDraft, k: int) -> None:
        """A paragraph, then photo ``k`` with two smaller srcset variants, its caption placed
        in the alt, title, figcaption or surrounding text."""
        d.parts.append(f"<p>{_paragraph(d.rng, d.words)}</p>")
        scene = random_scene(d.rng)
        placement = d.rng.choice(("alt", "title", "figcaption", "context", "alt+figcaption"))
        cap = describe(scene, d.rng, d.lang)
        if placement == "context":  # it becomes part of a sentence: drop "photo of"
            cap = _caption_core(cap)
        w, h = d.rng.choice(PHOTO_SIZES)
        full = f"{d.base}/photo-{k}.jpg"
        noai = d.i == NOAI_IMAGE_PAGE and k == 0
        d.own_scene(full, "photo", w, h, scene, cap, f"{d.i}-{k}", "crawl/noai" if noai else None, noai=noai)
        variants = []
        for frac in (0.5, 0.75):
            vw, vh = int(w * frac), int(h * frac)
            url = f"{d.base}/photo-{k}-{vw}w.jpg"
            d.own_scene(url, "variant", vw, vh, scene, cap, f"{d.i}-{k}", "filter/min_side")
            variants.append((url, vw))
        html, photo_refs = self._figure(d.rng, d.lang, full, w, h, variants, cap, placement)
        d.parts.append(html)
        d.refs.extend(photo_refs)

    def _add_exact_copy(self, d: _ArticleDraft) -> None:
        """An exact duplicate: the first photo again under a CDN URL."""
        first = d.owned[f"{d.base}/photo-0.jpg"]
        url = f"/cdn/{d.i:05d}/photo-0.jpg"
        self._add_gallery_image(d, replace(first, url=url, kind="copy"))

    def _add_near_copy(self, d: _ArticleDraft) -> None:
        """A perceptual duplicate: the first photo resized and re-encoded."""
        first = d.owned[f"{d.base}/photo-0.jpg"]
        scale = max(0.92, 300 / min(first.width, first.height))
        self._add_gallery_image(d, replace(first, url=f"{d.base}/photo-0-resized.jpg", kind="near_copy",
                                           quality=72, width=round(first.width * scale),
                                           height=round(first.height * scale),
                                           render_size=(first.width, first.height)))

    @staticmethod
    def _add_gallery_image(d: _ArticleDraft, spec: ImageSpec) -> None:
        d.owned[spec.url] = spec
        cap = spec.caption or ""
        d.parts.append(f'<aside class="gallery"><h2>{d.words["gallery"]}</h2><img src="{spec.url}" '
                       f'alt="{escape(cap)}"></aside>')
        d.refs.append(ImageRef(spec.url, "img", cap, cap, ("alt",)))

    @staticmethod
    def _add_broken_image(d: _ArticleDraft) -> None:
        """An image URL that answers 404."""
        url = f"{d.base}/missing-0.jpg"
        d.owned[url] = ImageSpec(url, "missing", status=404, own_reason="crawl/status_404")
        d.parts.append(f'<p><img src="{url}" alt="chart"></p>')
        d.refs.append(ImageRef(url, "img", "chart"))

    def _finish_article(self, d: _ArticleDraft, title: str, description: str, links: tuple[str, ...],
                        related: str) -> PageSpec:
        """The related list's thumbnail, a closing paragraph, this page's own thumbnail, the page."""
        nxt = (d.i + 1) % self.n_pages
        d.refs.append(ImageRef(f"/img/{nxt:05d}/thumb.jpg", "img", self.title(nxt)))
        d.parts.append(f"<p>{_paragraph(d.rng, d.words)}</p>")
        body = ('<article class="post">\n' + "\n".join(d.parts) + "\n</article>\n"
                f'<aside class="related"><h2>{d.words["related"]}</h2><ul>{related}</ul></aside>')
        # This page's own thumbnail (shown on the previous page) shows its first photo.
        first = d.owned[f"{d.base}/photo-0.jpg"]
        d.owned[f"{d.base}/thumb.jpg"] = replace(first, url=f"{d.base}/thumb.jpg", kind="thumb",
                                                 width=160, height=120, noai=False,
                                                 own_reason="filter/min_side")
        return PageSpec(self.article_path(d.i), d.lang, title,
                        self._chrome(d.lang, title, body, d.head_extra, description),
                        tuple(self._chrome_refs() + d.refs), links, d.owned,
                        disallowed=self.is_private(d.i), noai=d.i == NOAI_PAGE)

    def _figure(self, rng: random.Random, lang: str, full: str, w: int, h: int,
                variants: list[tuple[str, int]], cap: str,
                placement: str) -> tuple[str, list[ImageRef]]:
        """Markup for one photo: how it is embedded (varied) and where its caption is."""
        found_via = rng.choice(("img", "srcset", "data-src", "picture"))
        alt = cap if placement.startswith("alt") else _junk_alt(rng)
        sources = tuple(placement.split("+"))
        title_attr = f' title="{escape(cap)}"' if placement == "title" else ""
        attrs = f'alt="{escape(alt)}"{title_attr}'
        mid = variants[-1][0]
        srcset = ", ".join(f"{u} {vw}w" for u, vw in variants) + f", {full} {w}w"
        refs: list[ImageRef] = []
        junk = alt != cap
        if found_via == "img":
            img = f'<img src="{full}" {attrs} width="{w}" height="{h}">'
        elif found_via == "srcset":
            img = (f'<img src="{mid}" srcset="{srcset}" sizes="(max-width: 600px) 100vw, 600px" '
                   f"{attrs}>")
            refs.append(ImageRef(mid, "img", alt, cap, sources, junk_alt=junk))
        elif found_via == "data-src":
            img = (f'<img src="/static/placeholder.gif" data-src="{full}" class="lazy" {attrs} '
                   f'width="{w}" height="{h}">')
            refs.append(ImageRef("/static/placeholder.gif", "img", alt, junk_alt=junk))
        else:
            img = (f'<picture><source media="(min-width: 800px)" srcset="{full}">'
                   f'<source srcset="{mid}"><img src="{mid}" {attrs}></picture>')
            refs.append(ImageRef(mid, "img", alt, cap, sources, junk_alt=junk))
        cands = {"srcset": tuple(u for u, _ in variants) + (full,), "picture": (mid, full)}.get(
            found_via, ())
        refs.insert(0, ImageRef(full, found_via, alt, cap, sources, cands, junk))
        credit = rng.choice(_CREDITS)
        if "figcaption" in sources:
            html = f"<figure>{img}<figcaption>{escape(cap)} <small>{credit}</small></figcaption></figure>"
        else:
            html = f'<figure>{img}<small class="credit">{credit}</small></figure>'
        if placement == "context":
            html += "\n<p>" + escape(_WORDS[lang]["context"].format(caption=cap)) + "</p>"
        return html, refs

    def _related(self, i: int, rng: random.Random) -> tuple[tuple[str, ...], str]:
        """Related links: the next article (so links reach every page) plus random ones."""
        nxt = (i + 1) % self.n_pages
        others = [rng.randrange(self.n_pages) for _ in range(3)]
        items = [f'<li><a href="{self.article_path(nxt)}"><img src="/img/{nxt:05d}/thumb.jpg" '
                 f'alt="{escape(self.title(nxt))}" width="160" height="120"> '
                 f"{escape(self.title(nxt))}</a></li>"]
        links = [self.article_path(nxt)]
        for j in others:
            items.append(f'<li><a href="{self.article_path(j)}">{escape(self.title(j))}</a></li>')
            links.append(self.article_path(j))
        if i % 15 == 11:
            broken = f"/articles/{i:05d}-removed.html"
            items.append(f'<li><a href="{broken}">{_WORDS[self.lang(i)]["read"]}</a></li>')
            links.append(broken)
        return tuple(links), "".join(items)

    # ----- what is laid over the built pages: declared licences, images on hostile hosts
    def attach_hostile(self, hosts) -> None:
        """Show images on `hosts` (a started `lait.testkit.hostile.HostileHosts`) from now on."""
        self.hostile = hosts

    def _article_index(self, path: str) -> int | None:
        m = _ARTICLE_RE.fullmatch(path)
        if m and int(m.group(1)) < self.n_pages and self.article_path(int(m.group(1))) == path:
            return int(m.group(1))
        return None

    def declared_license(self, path: str) -> str | None:
        """The licence the page at `path` declares, as a crawler reads it."""
        i = self._article_index(path)
        if i is None or i % 3 == 2:
            return None
        return CC_BY if i % 3 == 0 else META_LICENSE

    def hostile_images(self, path: str) -> list[tuple[str, str]]:
        """(kind, image path) of the hostile images the page at `path` shows."""
        i = self._article_index(path)
        if self.hostile is None or i is None or i % 4 != 1 or self.is_private(i) or i == NOAI_PAGE:
            return []
        kinds = self.hostile.kinds()
        return [(kind, self.hostile.image_path(kind, f"{i:05d}-{k}"))
                for k, kind in enumerate((kinds[(i // 4) % len(kinds)], kinds[(i // 4 + 3) % len(kinds)]))]

    def _decorate(self, path: str, html: str) -> str:
        license_ = self.declared_license(path)
        if license_ == CC_BY:
            html = html.replace("</head>", f'<link rel="license" href="{CC_BY}">\n</head>', 1)
        elif license_ is not None:
            html = html.replace("</head>", f'<meta name="dcterms.license" content="{license_}">\n</head>', 1)
        hostile = self.hostile_images(path)
        if hostile:
            figures = "".join(f'<figure><img src="{self.hostile.base_url(kind)}{url}" alt="photo from '
                              f'a partner site" width="320" height="320"></figure>' for kind, url in hostile)
            html = html.replace("</main>", f'<aside class="partners">{figures}</aside>\n</main>', 1)
        return html

    # ----- routing
    def page(self, path: str) -> PageSpec | None:
        """The page served at ``path``, or None."""
        if path in ("/", "/index.html"):
            return self.home
        if path == "/about.html":
            return self.about
        m = re.fullmatch(r"/category/([a-z]+)\.html", path)
        if m and m.group(1) in CATEGORIES:
            return self.category_page(m.group(1))
        m = re.fullmatch(r"/(?:articles|de/artikel|fr/articles|private)/(\d{5})-[a-z0-9-]+\.html",
                         path)
        if m and int(m.group(1)) < self.n_pages and self.article_path(int(m.group(1))) == path:
            return self.article(int(m.group(1)))
        return None

    def image(self, path: str) -> ImageSpec | None:
        """The image spec served at ``path``, or None."""
        if path in self._static:
            return self._static[path]
        m = re.fullmatch(r"/(?:img|cdn)/(\d{5})/[a-z0-9-]+\.jpg", path)
        if m and int(m.group(1)) < self.n_pages:
            return self.article(int(m.group(1))).owned.get(path)
        return None

    def route(self, path: str, base_url: str = "") -> Response:
        """Answer a GET for ``path`` (query string ignored); ``base_url`` makes URLs absolute."""
        path = path.split("?", 1)[0].split("#", 1)[0] or "/"
        if path == "/robots.txt":
            body = (f"User-agent: *\nDisallow: {DISALLOWED_PREFIX}\n\n"
                    f"Sitemap: {base_url}/sitemap.xml\n")
            return Response(200, "text/plain; charset=utf-8", body.encode())
        if path == "/sitemap.xml":
            return Response(200, "application/xml", self.sitemap(base_url).encode())
        if path == "/static/site.css":
            return Response(200, "text/css", b"body{font-family:sans-serif;max-width:60em}\n")
        page = self.page(path)
        if page is not None:
            headers = {"X-Robots-Tag": "noai"} if page.noai else {}
            html = self._decorate(path, page.html.replace("{base_url}", base_url))
            return Response(200, HTML, html.encode(), headers)
        spec = self.image(path)
        if spec is not None and spec.status == 200:
            mime = {"JPEG": "image/jpeg", "PNG": "image/png", "GIF": "image/gif"}[spec.format]
            headers = {"X-Robots-Tag": "noai"} if spec.noai else {}
            return Response(200, mime, _encode(spec), headers)
        return Response(404, HTML, b"<!DOCTYPE html><title>404 Not Found</title><h1>Not Found</h1>")

    def sitemap(self, base_url: str = "") -> str:
        """sitemap.xml listing every public page (robots-disallowed pages are left out)."""
        urls = [p for p in self.page_paths() if not p.startswith(DISALLOWED_PREFIX)]
        body = "".join(f"<url><loc>{base_url}{escape(p)}</loc></url>\n" for p in urls)
        return ('<?xml version="1.0" encoding="UTF-8"?>\n'
                '<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">\n'
                f"{body}</urlset>\n")

    # ----- ground truth
    def ground_truth(self) -> dict:
        """What a correct pipeline keeps or rejects, and why (see the module docstring)."""
        pages: dict[str, dict] = {}
        referers: dict[str, list[PageSpec]] = {}
        specs: dict[str, ImageSpec] = dict(self._static)
        order: list[str] = []
        broken: set[str] = set()
        junk: set[str] = set()
        for path in self.page_paths():
            page = self.page(path)
            assert page is not None
            pages[path] = page.to_json()
            specs.update(page.owned)
            for ref in page.refs:
                # srcset candidates are served too: a crawler that fetches them all sees them.
                for url in (ref.url, *ref.candidates):
                    if url not in referers:
                        referers[url] = []
                        order.append(url)
                    if not referers[url] or referers[url][-1] is not page:
                        referers[url].append(page)
                if ref.junk_alt and ref.alt:
                    junk.add(ref.alt)
            broken.update(u for u in page.links if u.endswith("-removed.html"))
        # Thumbnails are owned by the page they show, which the loop above built.
        images: dict[str, dict] = {}
        kept_by_identity: dict[str, str] = {}
        for url in order:
            spec = specs[url]
            pgs = referers[url]
            if all(p.disallowed for p in pgs):
                reason = "crawl/robots"
            elif all(p.disallowed or p.noai for p in pgs):
                reason = "crawl/noai_page"
            else:
                reason = spec.own_reason
            dup_of = None
            if reason is None and spec.identity is not None:
                first = kept_by_identity.setdefault(spec.identity, url)
                if first != url:
                    dup_of = first
                    same = specs[first].content_key == spec.content_key
                    reason = "filter/duplicate_sha256" if same else "filter/duplicate_phash"
            images[url] = {
                "status": spec.status, "width": spec.width or None, "height": spec.height or None,
                "format": spec.format if spec.status == 200 else None,
                "keep": reason is None, "reason": reason, "true_caption": spec.caption,
                "duplicate_of": dup_of, "noai": spec.noai}
        for path, entry in pages.items():
            entry["license"] = self.declared_license(path)
            for kind, url in self.hostile_images(path):
                entry["images"].append({"url": url, "found_via": "img", "alt": "photo from a partner site",
                                        "true_caption": None, "caption_sources": [], "hostile": kind})
                images[url] = self.hostile.image_truth(url)
        return {"seed": self.seed, "n_pages": self.n_pages, "disallowed_prefix": DISALLOWED_PREFIX,
                "noai_page": self.article_path(NOAI_PAGE) if NOAI_PAGE < self.n_pages else None,
                "pages": pages, "images": images, "junk_texts": sorted(junk),
                "broken_links": sorted(broken)}

    def write_ground_truth(self, path: str | Path) -> Path:
        """Write :meth:`ground_truth` as JSON to ``path`` and return it."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.ground_truth(), ensure_ascii=False, indent=1))
        return path


def generate_site(n_pages: int = 200, seed: int = 0) -> Site:
    """A deterministic synthetic site of ``n_pages`` articles (nothing rendered up front)."""
    return Site(n_pages, seed)
