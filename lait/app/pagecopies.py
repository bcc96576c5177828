"""Stored copies of the pages a report links to, written as files beside the report.

A report outlives the web it was built from: the demo's local web stops when the demo ends, and
a real page changes or disappears. `pages/` keeps every stored page's HTML, so the report links
to that copy, `REPORT_pages/<digest>.html` next to `REPORT.html`, and a page with no stored HTML
(refused by robots.txt, a 404, an opt-out) is shown as its URL in text, never as a link.

A copy is the page as served, with a Content-Security-Policy in front that lets nothing run or
load (the page is fetched content, opened from a local file), and rewritten so that it reads
offline:

- each `<img>` shows the image's stored bytes (a thumbnail inlined as a data URI, blurred when
  the unsafe model says so, as the report's own thumbnails), or a grey "not stored" box;
  `srcset`s, which would pick a web address over it, are dropped;
- each link to another page with a copy beside it opens that copy; every other link (a page
  not stored, another site) becomes plain text with its address as a tooltip, and in-page
  `#anchors` stay.

A page whose HTML cannot be parsed is copied as served (its images and links then go nowhere).
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from urllib.parse import urldefrag, urljoin

from lait import storage
from lait.workdir import WorkDir, partition_of

log = logging.getLogger(__name__)

CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"


def copy_name(url: str) -> str:
    return hashlib.sha256(url.encode("utf-8")).hexdigest()[:20] + ".html"


def _header(url: str, encoding: str | None) -> bytes:
    charset = encoding if encoding and encoding.isascii() and encoding.replace("-", "").isalnum() else "utf-8"
    original = url.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;")
    return (f'<meta charset="{charset}"><meta http-equiv="Content-Security-Policy" content="{CSP}">'
            f'<meta name="lait-stored-copy-of" content="{original}">\n').encode("ascii", "xmlcharrefreplace")


def write_page_copies(work_root: str | Path, urls: set[str], folder: Path) -> dict[str, str]:
    """Write the stored HTML of each of `urls` that `pages/` holds into `folder`, rewritten to
    read offline (module docstring); returns page URL -> the copy's path relative to the
    folder's parent (the report's folder). Only the partitions that hold the URLs are read."""
    work = WorkDir(work_root)
    if folder.is_dir():  # copies of an earlier report of this name
        for old in folder.glob("*.html"):
            if len(old.stem) == 20 and all(c in "0123456789abcdef" for c in old.stem):
                old.unlink()
    if not urls or not work.part_files("pages"):
        return {}
    stored = _stored_pages(work, urls)
    if not stored:
        return {}
    parsed = {url: _parse(body, encoding) for url, (body, encoding) in stored.items()}
    images = {src for url, doc in parsed.items() if doc is not None for src in _image_urls(doc, url)}
    from lait.app.examples import image_thumbnails

    thumbs = {u: uri for u, (uri, _) in image_thumbnails(work, images).items()}
    folder.mkdir(parents=True, exist_ok=True)
    out: dict[str, str] = {}
    for url, (body, encoding) in stored.items():
        name = copy_name(url)
        doc = parsed[url]
        if doc is None:
            (folder / name).write_bytes(_header(url, encoding) + body)
        else:
            _rewrite(doc, url, thumbs, {u: copy_name(u) for u in stored})
            (folder / name).write_bytes(b"<!DOCTYPE html>\n" + _header(url, "utf-8") + _serialise(doc))
        out[url] = f"{folder.name}/{name}"
    log.debug("report: %d stored page copies in %s (%d images inlined)", len(out), folder, len(thumbs))
    return out


def _stored_pages(work: WorkDir, urls: set[str]) -> dict[str, tuple[bytes, str | None]]:
    """page URL -> (its stored HTML, encoding), for the `urls` that `pages/` holds with a body."""
    wanted: dict[int, set[str]] = {}
    for url in urls:
        wanted.setdefault(partition_of(url, work.n_partitions), set()).add(url)
    out: dict[str, tuple[bytes, str | None]] = {}
    for partition, these in sorted(wanted.items()):
        for f in work.part_files("pages", partition):
            pf = storage.parquet_file(f)
            for group in range(pf.num_row_groups):
                names = pf.read_row_group(group, columns=["url"]).column(0).to_pylist()
                rows = [i for i, url in enumerate(names) if url in these and url not in out]
                if not rows:
                    continue
                t = pf.read_row_group(group, columns=["html", "encoding"])
                for i in rows:
                    body = t.column("html")[i].as_py()
                    if body:  # fetched, not stored (an error, an opt-out): shown as text
                        out[names[i]] = (body, t.column("encoding")[i].as_py())
    return out


def _parse(body: bytes, encoding: str | None):
    import lxml.html
    from lxml import etree

    try:
        parser = lxml.html.HTMLParser(encoding=encoding if encoding and encoding.isascii() else None)
        return lxml.html.document_fromstring(body, parser=parser)
    except (etree.LxmlError, ValueError, LookupError) as exc:
        log.debug("report: a stored page is copied as served: %r", exc)
        return None


def _base(doc, page_url: str) -> str:
    base = doc.find(".//base[@href]")
    return urljoin(page_url, base.get("href").strip()) if base is not None else page_url


def _image_urls(doc, page_url: str) -> set[str]:
    base = _base(doc, page_url)
    return {urljoin(base, img.get("src").strip()) for img in doc.iter("img") if (img.get("src") or "").strip()}


# What an image with no stored bytes shows: a grey box that says so (an image that fails to
# load would show the browser's broken-image icon).
NOT_STORED = ("data:image/svg+xml;charset=utf-8,"
              "%3Csvg xmlns='http://www.w3.org/2000/svg' width='120' height='80'%3E"
              "%3Crect width='120' height='80' fill='%23ddd'/%3E%3Ctext x='60' y='44' font-size='12' "
              "text-anchor='middle' fill='%23555' font-family='sans-serif'%3Enot stored%3C/text%3E%3C/svg%3E")


def _rewrite(doc, page_url: str, thumbs: dict[str, str], copies: dict[str, str]) -> None:
    base = _base(doc, page_url)
    for node in doc.iter("base"):
        node.drop_tree()
    for img in doc.iter("img"):
        src = (img.get("src") or "").strip()
        target = urljoin(base, src) if src else ""
        img.set("src", thumbs.get(target) or NOT_STORED)
        if target and target not in thumbs:
            img.set("title", f"not stored: {target}")
        for attr in ("srcset", "sizes", "loading"):
            img.attrib.pop(attr, None)
    for source in doc.iter("source"):  # <picture>'s alternatives would load from the web
        source.attrib.pop("srcset", None)
        source.attrib.pop("src", None)
    for a in doc.iter("a"):
        href = (a.get("href") or "").strip()
        if not href or href.startswith("#"):
            continue
        target, fragment = urldefrag(urljoin(base, href))
        if target == page_url and fragment:
            a.set("href", f"#{fragment}")
        elif target in copies:
            a.set("href", copies[target] + (f"#{fragment}" if fragment else ""))
        else:
            del a.attrib["href"]
            a.set("title", f"not stored: {urljoin(base, href)}")
    for form in doc.iter("form"):
        form.attrib.pop("action", None)


def _serialise(doc) -> bytes:
    import lxml.html

    return lxml.html.tostring(doc, encoding="utf-8", method="html")
