"""Stage 3, `lait clean`: sentence detection and cleaning, pages/ -> candidates/ (by image URL).

For each page of a partition: decode the bytes (declared charset, else a `<meta>` one, else
UTF-8 with replacement), parse once with lxml, collect every image with its alt, title, aria,
figcaption and og texts and its position in document order, then let trafilatura find the
main content on the same tree and take the main-content sentences nearest to each image as
`context` candidates. Where each image sits decides first (`lait.filters.image_place`, the
default `caption_judge: place`): every text of a logo, avatar, icon or menu picture, and the
texts of a teaser that repeat a link, are dropped as `clean/image_place` before the texts of
the page get their owners. Texts are repaired (ftfy), long ones split into sentences, and run
through the rules of `lait.filters.text_rules`, short ones with the page's declared language as
the language rule's prior; a text the site cut short is mended from the page or dropped
(`clean/cut`); texts offered to images on many pages of a site, counted over every page of the
work directory before the partitions run (`lait.filters.site_texts`), are dropped as
`clean/site_boilerplate`. With the learned judge on (`caption_judge: default` or a path of
weights), the texts that every rule kept then go, a
partition at a time, to the learned caption judge (`lait.filters.caption_judge`), which drops the
ones it reads as junk as `clean/not_caption`. Each (page, image) pair with at least one text goes to the
candidates partition of its image URL. A page that breaks the parser or runs past the time
limit is rejected with its reason; the partition goes on. The rows of URL lists (`url_list/`,
`lait download`) add their captions as candidates with source `list`, and the image links of
WAT files (`warc_links/` rows of source `wat`, `lait ingest-warc`) their alt and title texts
as `alt` and `title` candidates, under the same rules.
"""

from __future__ import annotations

import bisect
import codecs
import json
import logging
import re
import signal
import threading
from collections import Counter, defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator
from urllib.parse import urlsplit

from lait.filters.caption_judge import JUDGED_SOURCES

# CleanConfig lived here before filters/config.py: the names stay importable from this module.
from lait.filters.config import SOURCES, CleanConfig, skippable_rules  # noqa: F401
from lait.filters.html_images import (
    BLOCK_TAGS,
    PageImage,
    find_images,
    normalise_space,
    og_owner,
    site_names,
    visible_text,
)
from lait.filters.image_place import image_place, link_texts, own_urls
from lait.filters.page_texts import ImageTexts, SharedText, assign
from lait.filters.site_texts import SiteCounts, load_site_texts, site_of, site_texts_step, step_digest, text_key
from lait.filters.text_rules import TextRules, repair, split_sentences, text_filters, uncut
from lait.memory import release_free_memory
from lait.pagereader import figure_license, html_parser
from lait.parts import partition_of
from lait.reasons import fetch_rule
from lait.schemas import get_table
from lait.stage import PartContext, Rejected, Stage

log = logging.getLogger(__name__)

# The columns of pages/ this stage reads (not the times and crawl depth; the headers for Content-Language).
PAGE_COLUMNS = ["url", "status", "content_type", "html", "encoding", "error", "license", "headers"]
BIG_PAGE = 1 << 20  # bytes of HTML after which the heap is trimmed (see lait.memory)
_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([\w.:-]+)""", re.I)
_XML_DECL = re.compile(r"^\s*<\?xml[^>]*\?>")
_CONTROL_BYTES = bytes([*range(9), *range(14, 32)])  # control bytes other than \t \n \v \f \r


class PageRejected(Rejected):
    """A page stage 3 cannot read; `rule` is the `clean/RULE` name."""


class PageTimeout(PageRejected):
    pass


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise PageTimeout after `seconds` (SIGALRM; only in a process's main thread, else no limit)."""
    if seconds <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(signum: int, frame: Any) -> None:
        raise PageTimeout("timeout", f"over {seconds:g} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def decode_page(row: dict[str, Any], max_bytes: int) -> tuple[str, bool, bytes | None]:
    """(text, truncated, utf8) of a page's bytes; PageRejected for what is not HTML.

    `utf8` is the (cut) bytes themselves when they are exactly the UTF-8 of `text`, which spares
    encoding it again for the parser (see `_markup`); else None.
    A row stored without HTML is dropped for what its `error` says (`noai`, `status`,
    `not_html`, `download`: `lait.reasons.fetch_rule`), any other status than 200 as `status`.
    """
    body: bytes = row.get("html") or b""
    error = row.get("error")
    fetched = fetch_rule(error, "pages")
    if fetched is not None or row.get("status") != 200:
        raise PageRejected(fetched or "status", f"HTTP {row.get('status')}" + (f" ({error})" if error else ""))
    if not body.strip():
        raise PageRejected("empty", "no content")
    ctype = (row.get("content_type") or "").lower()
    if ctype and not any(t in ctype for t in ("html", "xml", "text/plain")):
        raise PageRejected("not_html", f"content type {ctype}")
    head = body[:4096]
    if head.count(b"\x00") > 8 or len(head) - len(head.translate(None, _CONTROL_BYTES)) > len(head) // 10:
        raise PageRejected("not_html", "binary content")
    truncated = len(body) > max_bytes
    body = body[:max_bytes]
    m = re.search(r"charset=([\w.:-]+)", ctype) or _META_CHARSET.search(head)
    enc = m.group(1) if m else row.get("encoding") or "utf-8"
    enc = enc.decode("ascii", "replace") if isinstance(enc, bytes) else enc
    try:
        text = body.decode(enc, errors="replace")
    except LookupError:  # an unknown charset name
        enc = "utf-8"
        text = body.decode(enc, errors="replace")
    decoded = _XML_DECL.sub("", text, count=1)
    # No replacement character: nothing was replaced, the bytes are the text's UTF-8.
    same = len(decoded) == len(text) and "\ufffd" not in text and codecs.lookup(enc).name == "utf-8"
    return decoded, truncated, body if same else None


def _markup(text: str, utf8: bytes | None = None) -> tuple[str | bytes, str | None]:
    """What the parser reads for a decoded page, and in which encoding: its UTF-8 bytes (`utf8`
    when the page came as those), which libxml2 reads faster than the UCS-2/UCS-4 buffer of a
    str with non-Latin-1 characters and into the same tree. A text lxml refuses as a str (it
    opens with an XML declaration naming an encoding) or cannot be encoded (lone surrogates)
    goes as the str, to meet the same fate."""
    if not text.startswith("<?xml"):
        if utf8 is not None:
            return utf8, "utf-8"
        try:
            return text.encode("utf-8"), "utf-8"
        except UnicodeEncodeError:
            pass
    return text, None


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


def parse_page(row: dict[str, Any], cfg: CleanConfig) -> tuple[Any, list[Any], bool]:
    """(tree, images and paragraph-like elements in document order, truncated) of one page;
    PageRejected for a page that is not HTML or that the parser cannot read whole."""
    from lxml import etree
    from lxml import html as lxml_html

    text, truncated, utf8 = decode_page(row, cfg.max_page_bytes)
    markup, encoding = _markup(text, utf8)
    # No table of id attributes (nothing here looks elements up by id): libxml2 fills it while
    # parsing and again in each of trafilatura's copies of the tree, whose own parser skips it too.
    parser = html_parser(recover=True, huge_tree=False, encoding=encoding, collect_ids=False)
    try:
        tree = lxml_html.document_fromstring(markup, parser=parser)
    except (etree.ParserError, ValueError) as exc:
        raise PageRejected("unparsable", str(exc)) from None
    for err in parser.error_log:
        # libxml2 drops whatever lies deeper than 256 elements: say so rather than lose it quietly.
        if "Excessive depth" in err.message:
            raise PageRejected("too_deep", err.message)
    return tree, list(tree.iter("img", *BLOCK_TAGS)), truncated  # one pass for images and blocks


def page_language(tree: Any, headers: Any) -> str | None:
    """The language a page declares, as the language model spells it: `<html lang>` (or
    `xml:lang`), else a `<meta http-equiv="Content-Language">`, else its Content-Language
    header; None when it declares none the model knows. Short texts take it as their prior
    (`lait.filters.langid.detect`)."""
    from lait.filters.langid import declared

    code = declared(tree.get("lang") or tree.get("{http://www.w3.org/XML/1998/namespace}lang"))
    if code is not None:
        return code
    for meta in tree.iter("meta"):
        if (meta.get("http-equiv") or "").strip().lower() == "content-language":
            return declared(meta.get("content"))
    pairs = headers.items() if isinstance(headers, dict) else headers or ()
    return next((declared(v) for k, v in pairs if k.lower() == "content-language"), None)


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


LANGUAGE_COLUMNS = ("language", "lang", "LANGUAGE", "Language")  # as LAION's multilingual lists name it
LIST_PRIOR_MIN_WORDS = 4  # captions this long vote for their list's language
LIST_PRIOR_SHARE = 0.5  # the list's language is the one at least this share of them are in


def _row_language(row: dict[str, Any]) -> str | None:
    """The language a list row names in a kept column (`--save-additional-columns language`)."""
    if not row.get("extra"):
        return None
    import json

    try:
        extra = json.loads(row["extra"])
    except ValueError:
        return None
    from lait.filters.langid import declared

    value = next((extra[c] for c in LANGUAGE_COLUMNS if isinstance(extra.get(c), str)), None)
    return declared(value)


def list_languages(rows: list[dict[str, Any]]) -> dict[str, str]:
    """list_file -> the language of the list: the one most of its captions of at least
    `LIST_PRIOR_MIN_WORDS` words are in (at least `LIST_PRIOR_SHARE` of them), counted over the
    rows at hand (a partition's rows are a sample of every list, drawn by the image URL's hash).
    A short caption of the list takes it as its prior, as a page's text takes the page's."""
    from lait.filters.langid import detect

    votes: dict[str, Counter[str]] = defaultdict(Counter)
    for row in rows:
        caption = row.get("caption") or ""
        if len(caption.split()) >= LIST_PRIOR_MIN_WORDS:
            code = detect(caption)[0]
            if code is not None:
                votes[row["list_file"]][code] += 1
    out = {}
    for name, counter in votes.items():
        code, n = counter.most_common(1)[0]
        if n >= LIST_PRIOR_SHARE * sum(counter.values()):
            out[name] = code
    return out


def _fetched_images(ctx: PartContext) -> set[str]:
    """Image URLs of the partition with bytes in `images/` (fetched, no error)."""
    return {r["image_url"] for r in ctx.work.iter_rows("images", ctx.partition, columns=["image_url", "error"],
                                                        batch_size=8192) if r["error"] is None}


class ExtractStage(Stage):
    """The first pass of stage 3 over one partition of `pages/`: every page parsed once, its
    images with their texts (`read_page_texts`), as one row of `page_texts/` (same partition);
    a page stage 3 cannot read is rejected here with its `clean/` reason. `CleanStage` runs it
    first (`Stage.before`): its count of each site's texts over every page, and its rules, read
    these rows instead of parsing the pages a second time."""

    name = "clean_pages"
    input_table = "pages"
    output_tables = ("page_texts",)
    version = 2  # 2: texts of images in the site's chrome dropped as clean/image_place (issue 62)
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


class CleanStage(Stage):
    """Stage 3 of LAIT over one partition of `page_texts/` (its `ExtractStage` pass, run first),
    URL lists and WAT links; output re-partitioned by image URL."""

    name = "clean"
    input_table = "page_texts"
    # URL lists (`lait download`): each row's caption; WAT image links (`lait ingest-warc`):
    # their alt and title texts. Both are partitioned by image URL already. And `images/`, so
    # that a list row whose image was never fetched gives no candidate (nor rejects).
    extra_inputs = ("url_list", "warc_links", "images")
    output_tables = ("candidates",)
    version = 7  # 2: junk rules, page texts with one owner, language ID over all languages; 3: WAT links,
    # list rows only with their image fetched; 4: site texts counted over the whole pool; 5: the caption
    # judge; 6: the judge on static MiniLM token vectors, texts of any length, its threshold chosen in
    # training; 7: pages read from the extraction pass (ExtractStage), which also records what the site count counts

    def __init__(self, cfg: CleanConfig):
        self.cfg = cfg
        self._rules: TextRules | None = None
        self._extract = ExtractStage(cfg)
        self._repeated: tuple[str, SiteCounts] | None = None
        self._judge: Any = None
        # Set to a list, the judge is not asked: page texts the rules keep are written, and each
        # goes to the list as (page_url, image_url, JudgeInput, whether the judge would read it)
        # (bench/captions/train_judge.py).
        self.judge_sink: list | None = None

    def __getstate__(self) -> dict[str, Any]:  # sent to worker processes without the caches
        return {**self.__dict__, "_rules": None, "_repeated": None, "_judge": None}

    def before(self) -> list[Stage]:
        """The pages, parsed once by the extraction pass."""
        return [self._extract]

    def global_steps(self, work, *, force: bool = False, report=None) -> None:
        """Count each site's texts over every page of the pool (`lait.filters.site_texts`)."""
        site_texts_step(work, self.cfg, force=force, report=report)

    def global_inputs(self, work) -> dict[str, Any]:
        """Every partition reads the site counts: a new count redoes them all."""
        return {"site_texts": step_digest(work)}

    def _site_texts(self, work) -> SiteCounts:
        """The repeated texts of every site, read once per worker and count."""
        digest = step_digest(work)
        if digest is None:
            raise RuntimeError("stage 3's count of site texts is missing: run stage 3 through an executor "
                               "(lait clean, lait run), which counts them first")
        if self._repeated is None or self._repeated[0] != digest:
            self._repeated = (digest, load_site_texts(work))
        return self._repeated[1]

    def judge(self) -> Any:
        """The caption judge of the settings (loaded once per process), or None when off."""
        if self.cfg.caption_judge in ("none", "place"):
            return None
        if self._judge is None:
            from lait.filters.caption_judge import WEIGHTS, CaptionJudge

            path = WEIGHTS if self.cfg.caption_judge == "default" else self.cfg.caption_judge
            self._judge = CaptionJudge.load(path)
            if self._judge.encoder_name != "minilm-static":  # a transformer: torch's threads
                import os

                import torch

                # MiniLM's share of the cores: local workers side by side must not each take them all.
                n = max(1, (os.cpu_count() or 1) // max(1, self.cfg.workers or os.cpu_count() or 1))
                if torch.get_num_threads() != n:
                    torch.set_num_threads(n)
        return self._judge

    def partitions(self, work) -> list[int]:
        """Partitions with pages, list rows or archived links (a work directory of `lait download`,
        or of `lait ingest-warc` of WAT files, has no pages)."""
        return sorted(set(work.partitions("page_texts")) | set(work.partitions("url_list"))
                      | set(work.partitions("warc_links")))

    def prepare(self, text: str) -> list[str]:
        """A raw text as candidates (`ExtractStage.prepare`): list captions and WAT texts."""
        return self._extract.prepare(text)

    def process(self, ctx: PartContext) -> None:
        cfg = self.cfg
        if self._rules is None:  # once per stage object: verdicts cached across its partitions
            applied = text_filters(min_words=cfg.min_words, max_words=cfg.max_words,
                                   min_letter_share=cfg.min_letter_share, languages=cfg.languages)
            self._rules = TextRules([r for r in applied if r.name not in cfg.rules_off])
        rules = self._rules
        repeated = self._site_texts(ctx.work) if "site_boilerplate" not in cfg.rules_off else None
        judged = self.judge_sink is not None or self.judge() is not None
        pages: list[tuple[str, str | None, PageTexts]] = []
        site_pages: Counter[str] = Counter()
        site_counts: dict[str, Counter[str]] = defaultdict(Counter)
        for row in ctx.work.iter_rows("page_texts", ctx.partition, batch_size=256):
            url = row["page_url"]
            found = page_texts_of(row["found"])
            if judged:  # the judge's features need the partition's counts: pages wait for them
                host = urlsplit(url).netloc.lower()
                site_pages[host] += 1
                site_counts[host].update(offered(found))
                pages.append((url, row["license"], found))
            else:
                self._emit_page(ctx, url, row["license"], found, rules, repeated, None)
        pending: list[_Pending] | None = [] if judged else None
        for url, license_, found in pages:
            host = urlsplit(url).netloc.lower()
            self._emit_page(ctx, url, license_, found, rules, repeated, (site_counts[host], site_pages[host], pending))
        if pending:
            self._judge_pending(ctx, pending)
        if "list" in cfg.sources:
            self._list_captions(ctx, rules)
        self._wat_links(ctx, rules)

    def _emit_page(self, ctx: PartContext, url: str, license_: str | None, found: PageTexts, rules: TextRules,
                   repeated: SiteCounts | None, judge_ctx: tuple[Counter[str], int, list[_Pending]] | None) -> None:
        """The texts of one page's images through the rules; with `judge_ctx` (the partition's
        counts of the page's site, its pages there, the pending rows), each row waits for the judge."""
        site = site_of(url)
        for s in found.shared:  # given to another image of the page, or dropped for where its image sits
            ctx.reject("image_place" if s.rule == "image_place" else "page_text", image_url=s.image_url,
                       page_url=url, text=s.text, detail=f"{s.source} text {s.detail}")
        last = max(1, len(found.images) - 1)
        for i, (image_url, raw) in enumerate(found.images):
            where = None
            if judge_ctx is not None:
                counts, n_pages, pending = judge_ctx
                where = _Where(i / last, counts, n_pages, found.lang, pending)
            self._emit(ctx, url, image_url, raw, rules, site, repeated, found.site_names, license_,
                       found.lang, found.image_licenses.get(image_url), where)

    def _wat_links(self, ctx: PartContext, rules: TextRules) -> None:
        """The alt and title texts of each WAT image link (`warc_links/` rows of source `wat`) as
        `alt` and `title` candidates of the image, with the page as the WAT names it, as LAION
        read WAT files: no page is fetched. A link that an archived page of the same work
        directory also has (a row of source `html`) is left to that page, which gives the same
        texts and more. Site boilerplate does not apply: a partition holds no site's pages."""
        wanted = [src for src in ("alt", "title") if src in self.cfg.sources]
        if not wanted:
            return
        from_pages: set[tuple[str, str]] = set()
        wat: dict[tuple[str, str], list[tuple[str, str]]] = {}
        langs: dict[tuple[str, str], str | None] = {}  # the page's <html lang>, as the WAT has it
        for row in ctx.work.iter_rows("warc_links", ctx.partition,
                                      columns=["page_url", "image_url", "alt", "title", "source", "page_lang"]):
            key = (row["page_url"], row["image_url"])
            if row["source"] != "wat":
                from_pages.add(key)
                continue
            if key not in wat and self.cfg.languages != ["any"]:
                from lait.filters.langid import declared

                langs[key] = declared(row["page_lang"])
            texts = wat.setdefault(key, [])
            for src in wanted:  # one image may be linked twice from a page, with other texts
                if row[src] and (src, row[src]) not in texts:
                    texts.append((src, row[src]))
        for (page_url, image_url), texts in wat.items():
            if (page_url, image_url) in from_pages:
                continue
            ctx.count("wat_links_in")
            raw = [(src, piece) for src, text in texts for piece in self.prepare(text)]
            self._emit(ctx, page_url, image_url, raw, rules, prior=langs.get((page_url, image_url)))

    def _list_captions(self, ctx: PartContext, rules: TextRules) -> None:
        """Each URL list row's caption as a `list` candidate of its image (the same rules as
        every text; site boilerplate does not apply: a list is no site). A row without a page
        column has the page URL '' (candidates need one). A row whose image has no bytes (never
        fetched: refused by a rule, an unreachable host, a failed download) is left out: it can
        never be a sample, and stage 1 already recorded why. A caption's language prior is the
        list's (`list_languages`)."""
        fetched = _fetched_images(ctx)
        rows = list(ctx.work.iter_rows("url_list", ctx.partition,
                                       columns=["image_url", "caption", "page_url", "extra", "list_file"]))
        langs = list_languages(rows) if self.cfg.languages != ["any"] else {}
        for row in rows:
            ctx.count("list_rows_in")
            if row["image_url"] not in fetched:
                ctx.count("list_rows_not_fetched")
                continue
            raw = [("list", piece) for piece in self.prepare(row["caption"])] if row["caption"] else []
            prior = _row_language(row) or langs.get(row["list_file"])
            self._emit(ctx, row["page_url"] or "", row["image_url"], raw, rules, prior=prior)

    def _emit(self, ctx: PartContext, page_url: str, image_url: str, raw: list[tuple[str, str]],
              rules: TextRules, site: str = "", repeated: SiteCounts | None = None,
              names: frozenset[str] = frozenset(), license_: str | None = None, prior: str | None = None,
              image_license: str | None = None, where: _Where | None = None) -> None:
        seen: set[str] = set()
        texts: list[dict[str, Any]] = []
        # Texts an image also has from an unjudged source (an alt that is also its figcaption): the
        # judge leaves them alone, as it would the figcaption that the duplicate check folded away.
        unjudged: set[str] = set()
        for source, text in raw:
            if where is not None and source not in JUDGED_SOURCES:
                unjudged.add(text)
            count = repeated.get((site, text_key(text))) if repeated else None
            if count is not None:
                ctx.reject("site_boilerplate", image_url=image_url, page_url=page_url, text=text,
                           detail=f"{source} text on {count[0]} of the {count[1]} pages of {site}")
                continue
            if text.casefold() in names and "boilerplate" not in self.cfg.rules_off:
                ctx.reject("boilerplate", image_url=image_url, page_url=page_url, text=text,
                           detail=f"{source} text is the site's name")
                continue
            if text in seen:
                continue
            verdict = rules.judge(text, prior)
            if verdict.rule is not None:
                ctx.reject(verdict.rule, image_url=image_url, page_url=page_url, text=text, detail=verdict.detail)
                continue
            seen.add(text)
            texts.append({"text": text, "source": source, "lang": verdict.lang})
        if not texts:
            ctx.reject("no_text", image_url=image_url, page_url=page_url, detail="no candidate text left")
            return
        row = {"page_url": page_url, "image_url": image_url, "texts": texts, "license": license_,
               "image_license": image_license}
        if where is not None:  # written once the judge has read the partition's texts
            where.pending.append(_Pending(row, where, frozenset(unjudged)))
            return
        self._write(ctx, row)

    @staticmethod
    def _write(ctx: PartContext, row: dict[str, Any]) -> None:
        ctx.write("candidates", row, partition=partition_of(row["image_url"], ctx.work.n_partitions))

    def _judge_pending(self, ctx: PartContext, pending: list[_Pending]) -> None:
        """Ask the caption judge about every text of the partition's pending rows at once (one
        batch of embeddings), drop those it reads as junk, and write the rest."""
        from lait.filters.caption_judge import JudgeInput, judged
        from lait.filters.langid import detect

        # With languages 'any' no rule ran language ID: the judge reads the language all the same.
        inputs = [JudgeInput(t["text"], t["source"], p.where.position, p.where.counts[t["text"]],
                             p.where.site_pages, t["lang"] or detect(t["text"])[0], p.where.page_lang)
                  for p in pending for t in p.row["texts"]]
        asked = [judged(x) and t["text"] not in p.unjudged for x, (p, t) in
                 zip(inputs, ((p, t) for p in pending for t in p.row["texts"]))]
        if self.judge_sink is not None:
            k = 0
            for p in pending:
                for _ in p.row["texts"]:
                    self.judge_sink.append((p.row["page_url"], p.row["image_url"], inputs[k], asked[k]))
                    k += 1
                self._write(ctx, p.row)
            return
        probs = iter(self.judge().p_junk([x for x, a in zip(inputs, asked) if a]))
        asked_of = iter(asked)
        threshold = self.cfg.caption_judge_threshold or self.judge().threshold
        for p in pending:
            kept = []
            for t in p.row["texts"]:
                if not next(asked_of):
                    kept.append(t)
                    continue
                prob = float(next(probs))
                if prob >= threshold:
                    ctx.reject("not_caption", image_url=p.row["image_url"], page_url=p.row["page_url"],
                               text=t["text"], detail=f"{t['source']} text: p(junk) {prob:.3f} >= {threshold:g}")
                else:
                    kept.append(t)
            if kept:
                self._write(ctx, {**p.row, "texts": kept})
            else:
                ctx.reject("no_text", image_url=p.row["image_url"], page_url=p.row["page_url"],
                           detail="no candidate text left")


@dataclass
class _Where:
    """What the caption judge knows of an image's place: its rank on the page (0 to 1), the
    site's text counts and pages in the partition, the page's language, and where rows wait."""

    position: float
    counts: Counter[str]
    site_pages: int
    page_lang: str | None
    pending: list[_Pending]


@dataclass
class _Pending:
    row: dict[str, Any]
    where: _Where
    unjudged: frozenset[str] = frozenset()  # its texts that the image also has from an unjudged source
