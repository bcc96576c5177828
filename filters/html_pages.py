"""Reading one page of `pages/` for stage 3: its bytes decoded (declared charset, else a
`<meta>` one, else UTF-8 with replacement), parsed once with lxml, the language it declares, and
the time limit a page runs under. A page that cannot be read is a `PageRejected` with its
`clean/RULE` (not HTML, unparsable, too deep, past the time limit)."""

from __future__ import annotations

import codecs
import re
import signal
import threading
from contextlib import contextmanager
from typing import Any, Iterator

from lait.filters.config import CleanConfig
from lait.filters.html_images import BLOCK_TAGS
from lait.pagereader import html_parser
from lait.reasons import fetch_rule
from lait.rules import Rejected

# The columns of pages/ this stage reads (not the times and crawl depth; the headers for Content-Language).
PAGE_COLUMNS = ["url", "status", "content_type", "html", "encoding", "error", "license", "headers"]
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
