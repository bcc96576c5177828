"""Stage 3's extraction pass, `ExtractStage` (pages/ -> page_texts/, by page URL): every page
parsed once (`lait.filters.html_pages`), its images with their texts (`read_page_texts`): alt,
title, aria, figcaption and og texts from the markup, and the main-content sentences nearest
to each image (trafilatura on the same tree) as `context`. Where each image sits decides first
(`lait.filters.image_place`); a text the page gives several images goes to one owner
(`lait.filters.page_texts`). `CleanStage` (`lait.filters.text_stage`) runs the pass first and
applies its rules to these rows."""

from __future__ import annotations

import bisect
import json
import logging
from dataclasses import dataclass, field
from typing import Any, Callable

from lait.filters.config import CleanConfig
from lait.filters.html_images import (
    PageImage,
    find_images,
    normalise_space,
    og_owner,
    site_names,
    visible_text,
)
from lait.filters.html_pages import PAGE_COLUMNS, PageRejected, page_language, parse_page, time_limit
from lait.filters.image_place import image_place, link_texts, own_urls
from lait.filters.page_texts import ImageTexts, SharedText, assign
from lait.filters.text_rules import repair, split_sentences, uncut
from lait.memory import release_free_memory
from lait.pagereader import figure_license
from lait.parts import PartContext
from lait.schemas import get_table
from lait.stage import Stage

log = logging.getLogger(__name__)

BIG_PAGE = 1 << 20  # bytes of HTML after which the heap is trimmed (see lait.memory)


def _blocks(elements: list[Any], images: list[PageImage], window: int) -> list[tuple[int, str]]:
    """(position, text) of the paragraph-like elements; positions as in `find_images`.

    Only the blocks within `window` positions of an image: `_context` never looks further, and
    the text of every block of a page (nested ones over and over) is the costly part."""
    near: set[int] = set()
    for img in images:
        if img.position >= 0:
            near.update(range(max(0, img.position - window), img.position + window + 1))
    out = []
    for pos in sorted(near):
        if pos < len(elements):
            el = elements[pos]
            if el.tag != "img":
                text = normalise_space(visible_text(el))  # no script, style or noscript text
                if text:
                    out.append((pos, text))
    return out


def _main_text(tree: Any) -> str:
    import trafilatura

    # Same defaults as `trafilatura.extract(html)`. trafilatura works on a copy of a tree it is
    # given (bare_extraction copies it), so ours stays as it is.
    text = trafilatura.extract(tree, output_format="txt", include_comments=False) or ""
    return normalise_space(text)


class _MainSentences:
    """The sentences of a block's text when it is main content (its first 60 characters are in
    trafilatura's text), else None; worked out once per text of a page (images side by side
    share their paragraphs)."""

    def __init__(self, main: str, split: Callable[[str], list[str]] = split_sentences):
        self.main = main
        self.split = split
        self._seen: dict[str, list[str] | None] = {}

    def __call__(self, text: str) -> list[str] | None:
        if text not in self._seen:
            self._seen[text] = self.split(text) if text[:60] in self.main else None
        return self._seen[text]


def _context(img: PageImage, blocks: list[tuple[int, str]], main: _MainSentences,
             cfg: CleanConfig) -> list[tuple[str, int]]:
    """The main-content sentences nearest to the image, each with its distance in positions:
    the end of the paragraph before it and the start of the one after it, within
    `context_window` positions."""
    if img.position < 0 or not main.main:
        return []
    i = bisect.bisect_left(blocks, (img.position, ""))
    out: list[tuple[str, int]] = []
    n = cfg.context_sentences
    for pos, text in reversed(blocks[max(0, i - cfg.context_window):i]):
        if img.position - pos <= cfg.context_window and (sentences := main(text)) is not None:
            out += [(s, img.position - pos) for s in sentences[-n:]]
            break
    for pos, text in blocks[i:i + cfg.context_window]:
        if pos - img.position <= cfg.context_window and (sentences := main(text)) is not None:
            out += [(s, pos - img.position) for s in sentences[:n]]
            break
    return out


@dataclass
class PageTexts:
    """The raw candidate texts of one page, before cleaning.

    `images`: (image_url, [(source, text)]) for every image URL of the page (some with no text);
    `shared`: texts the page gives several images, dropped for all but their owner
    (`lait.filters.page_texts`); `site_names`: what the page calls its site, lower-cased.
    """

    images: list[tuple[str, list[tuple[str, str]]]] = field(default_factory=list)
    shared: list[SharedText] = field(default_factory=list)
    site_names: frozenset[str] = frozenset()
    truncated: bool = False
    mended: int = 0  # cut texts made whole from the page's text (`uncut`)
    lang: str | None = None  # the language the page declares (`page_language`)
    image_licenses: dict[str, str] = field(default_factory=dict)  # image URL -> its figure's licence
    # What the count of a site's texts counts for the page (`lait.filters.site_texts`): each
    # image's own texts, and the first and last `context_sentences` sentences of every paragraph
    # within `context_window` of an image, main content or not, so a cheap superset of the
    # page's `context` texts: a byline or a footer line counts on every page that has it, also
    # where trafilatura does not call it main content.
    counted: frozenset[str] = frozenset()
PAGE_TEXTS = get_table("page_texts")  # the extraction pass's table (`lait.schemas`)


def page_texts_json(found: PageTexts) -> str:
    """One page's `PageTexts` as the `found` column of `page_texts/` (JSON: texts, no objects),
    without `counted`, which has a column of its own (the site count reads nothing else)."""
    return json.dumps({"images": found.images,
                       "shared": [[s.image_url, s.source, s.text, s.detail, s.rule] for s in found.shared],
                       "site_names": sorted(found.site_names), "truncated": found.truncated,
                       "mended": found.mended, "lang": found.lang, "image_licenses": found.image_licenses},
                      ensure_ascii=False)


def page_texts_of(value: str) -> PageTexts:
    """`page_texts_json` read back (`counted` left empty: the rules do not read it)."""
    d = json.loads(value)
    return PageTexts([(u, [(src, t) for src, t in texts]) for u, texts in d["images"]],
                     [SharedText(*s) for s in d["shared"]], frozenset(d["site_names"]), d["truncated"],
                     d["mended"], d["lang"], d["image_licenses"])


def offered(found: PageTexts) -> set[str]:
    """Every text a page offers its images, owned or given up to another image of the page:
    what the caption judge's count of a site's texts in the partition counts."""
    return {t for _, texts in found.images for _, t in texts} | {s.text for s in found.shared}


class _Mender:
    """Cut texts of a page made whole from the page's own text (`lait.filters.text_rules.uncut`);
    the page's text is read once, and only for a text that looks cut. Reading it takes the
    scripts and styles out of the tree itself: nothing reads the tree after the mender."""

    def __init__(self, tree: Any, prepare: Callable[[str], list[str]]):
        self.tree = tree
        self.prepare = prepare
        self._text: str | None = None
        self.mended = 0

    def page_text(self) -> str:
        if self._text is None:
            self._text = normalise_space(visible_text(self.tree, in_place=True))
        return self._text

    def __call__(self, source: str, text: str) -> list[str]:
        """The candidate pieces of an image's own text (not `context`, which is the page's)."""
        out: list[str] = []
        for piece in self.prepare(text):
            whole = uncut(piece, self.page_text, mid_word=source == "og")
            if whole is None:
                out.append(piece)
            else:
                # As sentences: the page's context texts are sentences, and a sentence given to
                # two images must be one text to `lait.filters.page_texts` to have one owner.
                self.mended += 1
                out += [p for sentence in split_sentences(whole) for p in self.prepare(sentence)]
        return out


def read_page_texts(row: dict[str, Any], cfg: CleanConfig,
                    prepare: Callable[[str], list[str]] | None = None) -> PageTexts:
    """Every image of one page with its texts, each text given to the image it belongs to.

    `prepare` turns a raw text into the pieces that are candidates (repaired, long ones split
    into sentences; see `CleanStage.prepare`): a sentence of a long caption that is also the
    context of another image is one text for `lait.filters.page_texts`."""
    prepare = prepare or (lambda text: [text])
    tree, elements, truncated = parse_page(row, cfg)
    images = find_images(tree, row["url"], elements=elements)
    if not images:
        return PageTexts(truncated=truncated, lang=tree.get("lang"))
    names = site_names(tree)
    lang = page_language(tree, row.get("headers")) if cfg.languages != ["any"] else None
    og = next((img for img in images if img.via == "og"), None)
    og_url = og_owner(tree, row["url"], og) if og is not None else None
    want_context = "context" in cfg.sources
    blocks = _blocks(elements, images, cfg.context_window) if want_context else []
    # No paragraph near any image: `_context` has nothing to take, whatever the main text is.
    splits: dict[str, list[str]] = {}  # each block text split once, for the count and for the context

    def split(text: str) -> list[str]:
        if text not in splits:
            splits[text] = split_sentences(text)
        return splits[text]

    main = _MainSentences(_main_text(tree) if blocks else "", split)
    counted = {piece for img in images for src, t in img.texts if src in cfg.sources for piece in prepare(t)}
    for _, block in blocks:
        sentences = split(block)
        n = cfg.context_sentences
        counted.update(piece for sentence in sentences[:n] + sentences[-n:] for piece in prepare(sentence))
    licenses = {}  # read before the mender, which changes the tree
    for img in images:
        if img.figure is not None and (declared := figure_license(img.figure, tree, row["url"])):
            licenses.update(dict.fromkeys(img.urls, declared))
    found: list[ImageTexts] = []
    shared: list[SharedText] = []
    mend = _Mender(tree, prepare)
    placed = "image_place" not in cfg.rules_off and cfg.caption_judge != "none"
    links = link_texts(tree) if placed else frozenset()
    selves = own_urls(tree, row["url"]) if placed else frozenset()
    for img in images:
        texts = [(src, p, 0) for src, t in img.texts if src in cfg.sources for p in mend(src, t)]
        if want_context:
            texts += [("context", p, d) for s, d in _context(img, blocks, main, cfg) for p in prepare(s)]
        if placed and img.element is not None and texts:
            # Before the texts get their owners: an image of the chrome owns none of them.
            place = image_place(img.element, row["url"], img.urls, selves)
            kept = []
            for src, t, d in texts:
                why = place.drops(src, t, links)
                if why is None:
                    kept.append((src, t, d))
                else:
                    shared += [SharedText(u, src, t, why, "image_place") for u in img.urls]
            texts = kept
        if img is og and len(img.urls) > 1:
            # og texts describe the first og:image; the page's other og/twitter images are other pictures.
            others = [u for u in img.urls if u != og_url]
            if "page_text" in cfg.rules_off:  # every og image keeps the og texts
                found.append(ImageTexts(others, img.position, list(texts)))
            else:
                found.append(ImageTexts(others, img.position))
                shared += [SharedText(u, src, t, "og text of the page; it belongs to its first og:image")
                           for u in others for src, t, _ in texts]
            found.append(ImageTexts([og_url], img.position, texts))
        else:
            found.append(ImageTexts(img.urls, img.position, texts, img.figure))
    per_url, dropped = assign(found, one_owner="page_text" not in cfg.rules_off)
    return PageTexts(per_url, shared + dropped, names, truncated, mend.mended, lang, licenses, frozenset(counted))


def page_candidates(row: dict[str, Any], cfg: CleanConfig) -> tuple[list[tuple[str, list[tuple[str, str]]]], bool]:
    """([(image_url, [(source, raw text)])], truncated) of one page, before cleaning."""
    texts = read_page_texts(row, cfg)
    return texts.images, texts.truncated


class ExtractStage(Stage):
    """The first pass of stage 3 over one partition of `pages/`: every page parsed once, its
    images with their texts (`read_page_texts`), as one row of `page_texts/` (same partition);
    a page stage 3 cannot read is rejected here with its `clean/` reason. `CleanStage` runs it
    first (`Stage.before`): its count of each site's texts over every page, and its rules, read
    these rows instead of parsing the pages a second time."""

    name = "clean_pages"
    input_table = "pages"
    output_tables = ("page_texts",)
    # 2: texts of images in the site's chrome dropped as clean/image_place (issue 62); 3: also of
    # images that link to another site
    version = 3
    # What `read_page_texts` and `ExtractStage.prepare` read; the rules' settings are CleanStage's
    # (`rules_off` too, but for `page_text`, which `read_page_texts` applies; absent while empty).
    SETTINGS = ("sources", "max_words", "context_sentences", "context_window", "max_page_bytes", "page_timeout",
                "rules_off", "caption_judge")

    def __init__(self, cfg: CleanConfig):
        self.cfg = cfg
        self._repaired: dict[str, list[str]] = {}

    def __getstate__(self) -> dict[str, Any]:  # sent to worker processes without the cache
        return {**self.__dict__, "_repaired": {}}

    def settings(self) -> dict[str, Any]:
        out = self.cfg.output_settings()
        # Of the languages kept, only whether the page's own language is read (not with 'any').
        return {**{k: out[k] for k in self.SETTINGS if k in out}, "page_language": self.cfg.languages != ["any"]}

    def prepare(self, text: str) -> list[str]:
        """A raw text as candidates: repaired (ftfy), and split into sentences when longer than
        `max_words` words."""
        pieces = self._repaired.get(text)
        if pieces is None:  # one text often goes with several image URLs (srcset) and pages
            if len(self._repaired) > 100_000:
                self._repaired.clear()
            fixed = repair(text)
            pieces = self._repaired[text] = ([fixed] if len(fixed.split()) <= self.cfg.max_words
                                             else split_sentences(fixed))
        return pieces

    def process(self, ctx: PartContext) -> None:
        cfg = self.cfg
        big = False
        for row in ctx.work.iter_rows("pages", ctx.partition, columns=PAGE_COLUMNS, batch_size=16):
            if big:  # the last page's parse tree, many small blocks, left the heap at its peak
                release_free_memory()
            big = len(row.get("html") or b"") >= BIG_PAGE
            ctx.count("clean/pages_in")
            url = row["url"]
            try:
                with time_limit(cfg.page_timeout):
                    found = read_page_texts(row, cfg, self.prepare)
            except PageRejected as rej:
                ctx.reject(f"clean/{rej.rule}", page_url=url, detail=rej.detail)
                continue
            except (RecursionError, MemoryError, Exception) as exc:  # one page must not fail the part
                log.warning("clean: %s: %r", url, exc)
                ctx.reject("clean/error", page_url=url, detail=f"{type(exc).__name__}: {exc}")
                continue
            if found.truncated:
                ctx.count("clean/truncated_pages")
            if found.mended:
                ctx.count("clean/cut_texts_mended", found.mended)
            ctx.write("page_texts", {"page_url": url, "license": row.get("license"),
                                     "found": page_texts_json(found), "counted": sorted(found.counted)})
