"""Where an image sits on its page, for stage 3: the chrome of a site, a teaser, or its content (issue 62).

Words learned from a few hundred pages do not carry to the next thousand sites; where a text
sits does. Every signal here is one of markup and addresses, none of a language's words:

**Chrome** (every text of the image is dropped): a logo, an author's avatar, a badge, an icon, a
button, a social link; the pictures of a page's footer or navigation.
- it, or an element around it, is named so by its own markup: a class or id token of
  NAME_TOKENS (`logo`, `avatar`, `author`, `badge`, `icon`, `social`, `share`, `ad`, ...);
- its address says so: an SVG drawing, a file name with a word of FILE_TOKENS (`/logo.png`,
  `avatar-48.jpg`, `loader.gif`), a folder of FOLDER_TOKENS (`/icons/`, `/pics/sym/loaders/`);
- it is declared, or asked of the image server (`?w=50&h=50`), at most TINY_PX on both sides
  (an aspect-ratio placeholder such as 16 x 9 is not a size);
- it links to a social network (SOCIAL_HOSTS), to an author's page (`/author/...`), or to
  another site (`registered_domain`: not the page's, nor its canonical's or og:url's, nor a
  photo library of PHOTO_SITES): an advertisement, a partner's or an award's badge, an app
  store's button, a sponsor's banner; its texts name that site, not a picture;
- it lies inside a `<footer>` or `<nav>` that is not part of an article.

**A teaser or a side box** (its own texts are kept when they describe it, dropped when they
repeat a link): the picture of another article, of a related or most-read list, of a sidebar.
- it lies inside a link to another page (not to the picture itself, nor to the page's own
  addresses: `own_urls`);
- an element around it has a class or id token of REGION_TOKENS (`related`, `teaser`,
  `sidebar`, `trending`, `menu`, ...), or it lies in a `<header>` or `<aside>` outside an article;
- it is declared small (both sides at most SMALL_PX).
Such an image's context sentences are the box's, not its picture's: dropped. Its alt, title or
figcaption is dropped when it is the text of a link of the page (the teaser's headline as the
alt of that article's thumbnail), or when its words are those of the address it links to
(`/news/royal/1924449/king-charles-speech-monotone-reason` and the alt "king charles speech
monotone reason"). An alt that says what the teaser's photo shows, unlike its headline, stays:
it is a caption of that photo.

An element that holds an article's paragraphs (`_holds_content`) is no evidence, nor is any
element above it: WordPress names a whole post `author-admin`, some pages wrap everything in a
`<nav>` or a `div.ad-free`.

Chosen on the development part of ../shared/data/html/fresh only (bench/captions/README.md):
400 labelled texts of 102 sites, where stage 3 kept 29.6 % junk before and 5.8 % with these
rules; the links to another site were added after, seen on the development part and on
unseen.json (trafilatura's pages) together: 4.8 % on the development part, with 86.6 % of the
caption-labelled texts (87.6 % before).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from urllib.parse import urldefrag, urljoin, urlsplit

from lxml import html as lxml_html

TINY_PX = 64  # icons, avatars, buttons
SMALL_PX = 150  # thumbnails
NAME_TOKENS = frozenset({
    "logo", "logos", "avatar", "avatars", "gravatar", "author", "authors", "byline", "badge", "badges", "icon",
    "icons", "sprite", "emoji", "profile", "social", "share", "sharing", "newsletter", "subscribe", "ad", "ads",
    "advert", "advertisement", "sponsor", "sponsored", "comment", "comments", "outbrain", "taboola",
})
REGION_TOKENS = frozenset({
    "related", "recommended", "recommendations", "teaser", "teasers", "trending", "popular", "mostread", "widget",
    "widgets", "sidebar", "promo", "more", "nav", "navbar", "navigation", "menu", "footer", "partner", "partners",
})
FILE_TOKENS = frozenset({"logo", "avatar", "gravatar", "icon", "sprite", "badge", "author", "profile", "emoji",
                         "loader", "loading", "spinner", "placeholder", "blank", "spacer", "pixel", "btn", "button",
                         "navbtn", "poweredby"})
# Folders of a site's interface pictures (`/images/header/`, `/pics/sym/loaders/`, `/icons/`).
FOLDER_TOKENS = frozenset({"logo", "logos", "icon", "icons", "sprite", "sprites", "avatar", "avatars", "badge",
                           "badges", "social", "buttons", "btn", "ui", "loader", "loaders",
                           "emoji", "emojis", "flags", "sym"})
AUTHOR_PATH_TOKENS = frozenset({"author", "authors", "autor", "autoren", "auteur", "autore", "autori", "profile",
                                "user", "users", "journalist", "redakteur"})
SOCIAL_HOSTS = frozenset({
    "facebook.com", "twitter.com", "x.com", "instagram.com", "youtube.com", "linkedin.com", "pinterest.com",
    "tiktok.com", "whatsapp.com", "wa.me", "t.me", "telegram.me", "reddit.com", "flipboard.com", "threads.net",
    "bsky.app", "xing.com", "vk.com", "snapchat.com", "tumblr.com", "mastodon.social",
})
# Sites a photo links to for its larger or licensed copy: a link there is no advertisement.
PHOTO_SITES = frozenset({
    "flickr.com", "staticflickr.com", "wikimedia.org", "wikipedia.org", "imgur.com", "500px.com", "unsplash.com",
    "pexels.com", "pixabay.com", "smugmug.com", "photobucket.com", "gettyimages.com", "istockphoto.com",
    "shutterstock.com", "alamy.com", "apimages.com", "google.com", "goo.gl", "bing.com", "openstreetmap.org",
})
# Second-level labels under which a country's sites register (example.co.uk, example.com.au).
_SECOND_LEVEL = frozenset({"co", "com", "net", "org", "ac", "gov", "edu", "ne", "or", "go", "gv", "gob", "nic"})
ASPECT_PLACEHOLDERS = frozenset({(16, 9), (9, 16), (4, 3), (3, 4), (3, 2), (2, 3), (1, 1), (21, 9)})
_NAMED = NAME_TOKENS | REGION_TOKENS
CHROME_TAGS = ("footer", "nav")
CONTENT_TAGS = ("article", "main")
MAX_DEPTH = 12  # ancestors whose names are read: figure > a > picture > img in a card in a list
_SPLIT = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z])(?=[A-Z])")
_IMAGE_FILE = re.compile(r"\.(jpe?g|png|gif|webp|avif|bmp|tiff?|svg)$", re.I)
_WORD = re.compile(r"\w+")


LONG_PARAGRAPH = 80  # characters: a paragraph of an article, not a teaser's line
CONTENT_PARAGRAPHS = 1  # an element holding this many long paragraphs holds the article: no evidence


def _holds_content(el: lxml_html.HtmlElement) -> bool:
    """Whether `el` holds an article's text (CONTENT_PARAGRAPHS paragraphs longer than
    LONG_PARAGRAPH characters): a class such as `post author-admin ad-free` or a `<nav>` around
    a whole page then says nothing about one of its pictures."""
    n = 0
    for p in el.iter("p"):
        if len(p.text_content()) > LONG_PARAGRAPH:
            n += 1
            if n >= CONTENT_PARAGRAPHS:
                return True
    return False


@functools.lru_cache(maxsize=8192)  # a page's cards repeat their class names image after image
def _tokens(value: str | None) -> frozenset[str]:
    return frozenset(t.lower() for t in _SPLIT.split(value or "") if t)


def _host(url: str) -> str:
    return (urlsplit(url).hostname or "").lower()


def registered_domain(host: str) -> str:
    """The site a host belongs to: its last two labels, or three under a country's second-level
    label (news.bbc.co.uk -> bbc.co.uk); "" for an address without a name (an IP)."""
    labels = host.lower().rstrip(".").split(".")
    if not host or labels[-1].isdigit():
        return ""
    if len(labels) >= 3 and len(labels[-1]) == 2 and labels[-2] in _SECOND_LEVEL:
        return ".".join(labels[-3:])
    return ".".join(labels[-2:])


def _px(value: str | None) -> int | None:
    m = re.match(r"\s*(\d+)(?:\.\d+)?\s*(px)?\s*$", value or "")
    return int(m.group(1)) if m else None


def _words(text: str) -> str:
    """A text as two places of a page repeat it: its words, lower-cased."""
    return " ".join(_WORD.findall(text.casefold()))


def link_texts(tree: lxml_html.HtmlElement) -> frozenset[str]:
    """`_words` of the text of every link of the page that has some (headlines of teasers,
    menu items): an image text equal to one of them is that link's, not a caption."""
    out = set()
    for a in tree.iter("a"):
        if a.get("href"):
            key = _words(a.text_content())
            if key:
                out.add(key)
    return frozenset(out)


@dataclass(frozen=True)
class Place:
    """Where one image sits: `chrome` (why every text of it is dropped) or `region` (why it is a
    teaser or a side box), or neither; `target`: the page it links to, if any."""

    chrome: str | None = None
    region: str | None = None
    target: str | None = None

    def drops(self, source: str, text: str, links: frozenset[str]) -> str | None:
        """Why the text of `source` offered to this image is dropped, or None. `links`: the
        page's `link_texts`."""
        if self.chrome:
            return self.chrome
        if not self.region:
            return None
        if source == "context":
            return f"a sentence near an image {self.region}"
        key = _words(text)
        if key in links or (len(key) > 15 and any(key in k for k in links)):
            return f"the text of a link of the page, on an image {self.region}"
        if self.target:
            words = set(key.split())
            slug = set(re.findall(r"[a-z0-9]+", urlsplit(self.target).path.lower()))
            if len(words) >= 2 and len(words & slug) >= 0.8 * len(words):
                return f"the words of the address it links to, on an image {self.region}"
        return None


def own_urls(tree: lxml_html.HtmlElement, page_url: str) -> frozenset[str]:
    """The addresses the page gives itself (its URL, `<link rel=canonical>`, og:url), without
    fragments: a link to one of them is no link to another page."""
    out = {urldefrag(page_url)[0]}
    for el in tree.iter("link", "meta"):
        if (el.tag == "link" and "canonical" in (el.get("rel") or "").lower().split()) or \
                (el.tag == "meta" and (el.get("property") or "").lower() == "og:url"):
            value = (el.get("href") if el.tag == "link" else el.get("content")) or ""
            if value.strip():
                out.add(urldefrag(urljoin(page_url, value.strip()))[0])
    return frozenset(out)


def _address_says(url: str, w: int | None, h: int | None) -> str | None:
    """Why an image's address (with its declared size) makes it chrome, or None."""
    address = urlsplit(url)
    if not (w and h):  # a size the address asks the image server for (`?w=50&h=50`)
        asked = dict(re.findall(r"(?:^|&)(w|h|width|height)=(\d+)", address.query))
        w, h = w or _px(asked.get("w") or asked.get("width")), h or _px(asked.get("h") or asked.get("height"))
    if w and h and max(w, h) <= TINY_PX and (w, h) not in ASPECT_PLACEHOLDERS:
        return f"declared {w} x {h} px"
    folder, _, name = address.path.rpartition("/")
    if name.lower().endswith(".svg"):
        return f"an SVG drawing ({name[:60]!r}): an icon or a logo, no photo"
    hit = _tokens(name.rsplit(".", 1)[0]) & FILE_TOKENS
    if hit:
        return f"its file {name[:60]!r} names a {sorted(hit)[0]}"
    hit = set(re.split(r"[^a-z0-9]+", folder.lower())) & FOLDER_TOKENS
    if hit:
        return f"its folder {folder[-60:]!r} holds {sorted(hit)[0]} pictures"
    return None


@functools.lru_cache(maxsize=64)  # the same few addresses for every image of a page
def _sites(urls: frozenset[str]) -> frozenset[str]:
    return frozenset(registered_domain(_host(u)) for u in urls)


def image_place(img: lxml_html.HtmlElement, page_url: str, srcs: list[str] | None = None,
                selves: frozenset[str] = frozenset()) -> Place:
    """Where the `<img>` sits (see the module's docstring). `srcs`: the image's URLs (default
    its `src`); its address makes it chrome only when every one of them does (a lazy page's
    `src` is a `loading.gif` placeholder for the photo in `data-src`). `selves`: the page's
    `own_urls`."""
    w, h = _px(img.get("width")), _px(img.get("height"))
    said = [_address_says(u, w, h) for u in (srcs or [img.get("src") or ""])]
    if all(said):
        return Place(said[0])
    selves = selves | {urldefrag(page_url)[0]}
    region = target = None
    if w and h and max(w, h) <= SMALL_PX and (w, h) not in ASPECT_PLACEHOLDERS:
        region = f"declared {w} x {h} px"
    el: lxml_html.HtmlElement | None = img
    for _ in range(MAX_DEPTH):
        if el is None or not isinstance(el.tag, str) or el.tag in ("body", "html"):
            break
        names = _tokens(el.get("class")) | _tokens(el.get("id"))
        if (names & _NAMED or el.tag in CHROME_TAGS) and _holds_content(el):
            break  # the article's container and every one above it
        if names & NAME_TOKENS:
            return Place(f"inside <{el.tag}> named {sorted(names & NAME_TOKENS)[0]!r}")
        if not region and names & REGION_TOKENS:
            region = f"inside <{el.tag}> named {sorted(names & REGION_TOKENS)[0]!r}"
        if el.tag == "a" and el is not img and target is None:
            href = el.get("href")
            if href and not href.startswith(("#", "javascript:", "mailto:")):
                url = urldefrag(urljoin(page_url, href))[0]
                parts = urlsplit(url)
                if url not in selves and not _IMAGE_FILE.search(parts.path):
                    host = parts.netloc.lower().split(":")[0].removeprefix("www.")
                    if host in SOCIAL_HOSTS or any(host.endswith("." + s) for s in SOCIAL_HOSTS):
                        return Place(f"linking to {host}")
                    if _tokens(parts.path) & AUTHOR_PATH_TOKENS:
                        return Place("linking to an author's page")
                    site = registered_domain(host)
                    if site and site not in PHOTO_SITES and site not in _sites(selves):
                        return Place(f"linking to another site ({host[:60]})")
                    target = url
                    region = region or "linking to another page"
        el = el.getparent()
    for el in img.iterancestors(*CHROME_TAGS, "header", "aside"):
        if next(el.iterancestors(*CONTENT_TAGS), None) is None and not _holds_content(el):
            if el.tag in CHROME_TAGS:
                return Place(f"inside a <{el.tag}>")
            region = region or f"inside a <{el.tag}>"
    return Place(None, region, target)
