"""Stage 3's document pass (`lait documents`, issue 63): pages/ -> doc_pages/ (by page URL).

An interleaved document is a page's main text in its paragraphs and the pictures of that text
where they stand (OBELICS keeps the DOM order; MMC4 places each picture among the sentences by
their similarity, which stage 5 does from the similarities of stage 4's document pass).

For each page this pass finds:

- **the main text**: what trafilatura takes as the page's main content (the same call as
  stage 3's `context` sentences), one paragraph per line of its text, repaired as stage 3
  repairs texts (ftfy) and split into sentences with stage 3's splitter. A sentence that the
  site puts on many of its pages (stage 3's count of site texts, `lait.filters.site_texts`) is
  boilerplate by the same rule as `clean/site_boilerplate` and leaves the document;
- **the pictures of the main text**: each paragraph is found again among the page's elements in
  document order, and the `<img>`s that lie between the first and the last of them are the
  document's, in that order, but for those where they sit says they are the site's chrome
  (`lait.filters.image_place`: logos, avatars, icons, tracking pixels). Each keeps every URL the
  page gives it (src, srcset, lazy attributes): stage 5 ships the one stage 2 kept.

A page whose main text is in a language the settings do not keep is rejected here as
`documents/language`; one with no main text as `documents/no_text`. Pages stage 3 itself
rejects (not HTML, unparsable, past the time limit) are skipped without a second reason: theirs
is already in `rejected/`. The rules that need the images stage 2 kept and stage 4's
similarities (too few words, no picture left, too many pictures, repeated paragraphs,
near-duplicate documents) are stage 5's (`lait.build.documents`).
"""

from __future__ import annotations

import logging
import re
from typing import Any

from lait.filters.config import CleanConfig
from lait.filters.html_images import UNSEEN_TAGS, find_images, normalise_space
from lait.filters.html_pages import PAGE_COLUMNS, PageRejected, parse_page, time_limit
from lait.filters.image_place import image_place, own_urls
from lait.filters.site_texts import SiteCounts, load_site_texts, site_of, step_digest, text_key
from lait.filters.text_rules import repair, split_sentences
from lait.pagereader import figure_license
from lait.parts import PartContext
from lait.stage import Stage

log = logging.getLogger(__name__)

KEY_CHARS = 30  # a paragraph is found again in the page by its first characters
# A picture this many characters of the page's text before the first paragraph still opens the
# document (the lead photo under a headline and byline); chosen on html/readability.
LEAD_CHARS = 400
_MARKS = re.compile(r"^(?:[-*>#|]\s*)+|\s*\|\s*")  # list, quote and heading marks; table cell bars


def main_paragraphs(tree: Any) -> list[str]:
    """The main content's paragraphs, as trafilatura's text gives them (one per line)."""
    import trafilatura

    # The call of stage 3's `_main_text`; trafilatura works on a copy of the tree.
    text = trafilatura.extract(tree, output_format="txt", include_comments=False) or ""
    return [p for p in (normalise_space(line) for line in text.split("\n")) if p]


def page_text(tree: Any) -> tuple[str, list[int]]:
    """The page's visible text in document order with no whitespace at all, and the offset in it
    of every `<img>` in document order (those inside `UNSEEN_TAGS` too: the page reader lists
    them). Without whitespace, trafilatura's joins of inline elements and line breaks compare."""
    pieces: list[str] = []
    offsets: list[int] = []
    size = 0

    def add(text: str | None) -> None:
        nonlocal size
        if text:
            piece = "".join(text.split())
            pieces.append(piece)
            size += len(piece)

    def walk(el: Any, seen: bool) -> None:
        tag = el.tag if isinstance(el.tag, str) else None
        if tag == "img":
            offsets.append(size)
        seen = seen and tag is not None and tag not in UNSEEN_TAGS
        if seen:
            add(el.text)
        for child in el:
            walk(child, seen)
            if seen:
                add(child.tail)

    walk(tree, True)
    return "".join(pieces), offsets


def _key(paragraph: str) -> str:
    """What a paragraph of trafilatura's text is found again by: its first `KEY_CHARS`
    characters without whitespace and without the marks trafilatura writes for lists, tables,
    quotes and headings."""
    return "".join(_MARKS.sub("", paragraph).split())[:KEY_CHARS]


def place_paragraphs(paragraphs: list[str], text: str) -> list[int | None]:
    """Each paragraph's offset in `page_text`'s text, in order: the first place at or after the
    last one found that holds its key; None where none does."""
    out: list[int | None] = []
    at = 0
    for p in paragraphs:
        key = _key(p)
        found = text.find(key, at) if key else -1
        if found < 0:
            out.append(None)
        else:
            out.append(found)
            at = found + len(key)
    return out


def read_document(row: dict[str, Any], cfg: CleanConfig, boilerplate: SiteCounts | None = None
                  ) -> dict[str, Any]:
    """One page as a doc_pages/ row (without the language, which `DocumentStage` adds);
    PageRejected where stage 3 cannot read the page."""
    url = row["url"]
    tree, elements, _ = parse_page(row, cfg)
    paragraphs = main_paragraphs(tree)
    text, img_offsets = page_text(tree)
    positions = place_paragraphs(paragraphs, text)
    at = dict(zip((pos for pos, el in enumerate(elements) if el.tag == "img"), img_offsets))
    site = site_of(url)
    kept: list[tuple[int | None, list[str]]] = []
    dropped = 0
    for p, pos in zip(paragraphs, positions):
        sentences = []
        for s in split_sentences(repair(p)):
            if boilerplate is not None and (site, text_key(s)) in boilerplate:
                dropped += 1
            else:
                sentences.append(s)
        if sentences:
            kept.append((pos, sentences))
    placed = [(pos, s) for pos, s in kept if pos is not None]
    images: list[dict[str, Any]] = []
    if placed:  # from a little before the first paragraph found (a lead picture) to the end of the last
        first = placed[0][0] - LEAD_CHARS
        last = placed[-1][0] + sum(len("".join(x.split())) for x in placed[-1][1])
        selves = own_urls(tree, url)
        seen: set[str] = set()
        for img in find_images(tree, url, elements):
            offset = at.get(img.position)
            if img.via == "og" or offset is None or not first <= offset <= last or not img.urls or img.urls[0] in seen:
                continue
            if image_place(img.element, url, img.urls, selves).chrome:
                continue
            seen.add(img.urls[0])
            after = sum(1 for pos, _ in kept if pos is not None and pos < offset)
            alt = next((t for src, t in img.texts if src == "alt"), None)
            declared = figure_license(img.figure, tree, url) if img.figure is not None else None
            images.append({"urls": list(img.urls), "after": after, "alt": alt, "license": declared})
    title = tree.findtext(".//title")
    return {"page_url": url, "license": row.get("license"), "lang": None,
            "title": normalise_space(title) or None, "paragraphs": [s for _, s in kept],
            "images": images, "boilerplate": dropped}


class DocumentStage(Stage):
    """Stage 3's document pass over one partition of pages/ (see the module's docstring). It
    reads stage 3's count of site texts, so `lait clean` must have run; its settings are stage
    3's (the page limits, the languages kept)."""

    name = "clean_documents"
    input_table = "pages"
    output_tables = ("doc_pages",)
    # 2: each image's own licence (`license`: its figure's rel="license" link); 3: pictures that
    # link to another site are chrome (image_place)
    version = 3
    SETTINGS = ("max_page_bytes", "page_timeout", "languages", "rules_off")

    def __init__(self, cfg: CleanConfig):
        self.cfg = cfg
        self._counts: tuple[str, SiteCounts] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_counts": None}

    def settings(self) -> dict[str, Any]:
        out = self.cfg.output_settings()
        return {k: out[k] for k in self.SETTINGS if k in out}

    def global_inputs(self, work) -> dict[str, Any]:
        """Every partition reads stage 3's count of site texts."""
        return {"site_texts": step_digest(work)}

    def _boilerplate(self, work) -> SiteCounts | None:
        if "site_boilerplate" in self.cfg.rules_off:
            return None
        digest = step_digest(work)
        if digest is None:
            raise RuntimeError("stage 3's count of site texts is missing: run `lait clean` before the documents")
        if self._counts is None or self._counts[0] != digest:
            self._counts = (digest, load_site_texts(work))
        return self._counts[1]

    def process(self, ctx: PartContext) -> None:
        from lait.filters.langid import detect

        cfg = self.cfg
        boilerplate = self._boilerplate(ctx.work)
        for row in ctx.work.iter_rows("pages", ctx.partition, columns=PAGE_COLUMNS, batch_size=16):
            if row.get("error") is not None or row.get("status") != 200 or not row.get("html"):
                ctx.count("documents/pages_skipped")
                continue
            url = row["url"]
            ctx.count("documents/pages_in")
            try:
                with time_limit(cfg.page_timeout):
                    doc = read_document(row, cfg, boilerplate)
            except PageRejected:  # stage 3 recorded why
                ctx.count("documents/pages_skipped")
                continue
            except (RecursionError, MemoryError, Exception) as exc:  # one page must not fail the part
                log.warning("documents: %s: %r", url, exc)
                ctx.reject("documents/error", page_url=url, detail=f"{type(exc).__name__}: {exc}")
                continue
            if not doc["paragraphs"]:
                ctx.reject("documents/no_text", page_url=url, detail="no main text (trafilatura)")
                continue
            text = " ".join(s for p in doc["paragraphs"] for s in p)
            lang, _ = detect(text[:2000])
            doc["lang"] = lang
            if cfg.languages != ["any"] and lang not in cfg.languages:
                ctx.reject("documents/language", page_url=url, detail=f"main text in {lang or 'no known language'}")
                continue
            ctx.count("documents/documents")
            ctx.count("documents/images", len(doc["images"]))
            ctx.write("doc_pages", doc)
