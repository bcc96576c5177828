"""WAT files for archived pages, in Common Crawl's format, for tests of `lait ingest-warc`.

Common Crawl publishes a WAT file beside each WARC file: one `metadata` record (JSON) per
record of the WARC, written by ia-web-commons. The shared capture in ../shared/data holds only
the request record's WAT, so tests make the response record's WAT here from the WARC itself,
with the structure Common Crawl's WAT records have (the real records in ../shared/data and
Common Crawl's documentation of the format): `Container` (the WARC file, offset, gzip member),
`Envelope` → `WARC-Header-Metadata`, `Payload-Metadata` → `HTTP-Response-Metadata` →
`Response-Message`, `Headers`, `HTML-Metadata` → `Head` (`Title`, `Metas`, `Link`, `Scripts`)
and `Links`: one object per link, `path` naming the element and attribute (`A@/href`,
`IMG@/src`, ...), `url` as written in the page (not resolved), and the element's texts (`alt`
and `title` of an `<img>`; `text` of an `<a>`). The `<html lang>` is a meta named `HTML@/lang`,
as ia-web-commons writes it. Each record is its own gzip member, as in Common Crawl's files.
"""

from __future__ import annotations

import hashlib
import io
import json
import uuid
from base64 import b32encode
from pathlib import Path

from lxml import html as lxml_html
from warcio.archiveiterator import ArchiveIterator
from warcio.warcwriter import WARCWriter


def _sha1(data: bytes) -> str:
    return "sha1:" + b32encode(hashlib.sha1(data).digest()).decode()


def _attrs(el, names: tuple[str, ...]) -> dict[str, str]:
    return {n: el.get(n) for n in names if el.get(n) is not None}


def html_metadata(body: bytes) -> dict:
    """`HTML-Metadata` of a page as ia-web-commons extracts it (the parts lait reads and their
    usual neighbours: title, metas, links of the head, scripts, and the body's links)."""
    tree = lxml_html.fromstring(body)
    head: dict = {}
    title = tree.findtext(".//title")
    if title is not None:
        head["Title"] = " ".join(title.split())
    metas = [_attrs(m, ("name", "rel", "content", "http-equiv", "property")) for m in tree.iter("meta")]
    for attr in ("lang", "xml:lang"):
        if tree.get(attr):
            metas.append({"name": f"HTML@/{attr}", "content": tree.get(attr)})
    if metas:
        head["Metas"] = [m for m in metas if m]
    links = [{"path": "LINK@/href", "url": el.get("href"), **_attrs(el, ("rel", "type"))}
             for el in tree.iter("link") if el.get("href") is not None]
    if links:
        head["Link"] = links
    scripts = [{"path": "SCRIPT@/src", "url": el.get("src"), **_attrs(el, ("type",))}
               for el in tree.iter("script") if el.get("src") is not None]
    if scripts:
        head["Scripts"] = scripts
    base = tree.find(".//base")
    if base is not None and base.get("href"):
        head["Base"] = base.get("href")
    body_links = []
    for el in tree.iter("a", "img"):
        if el.tag == "a" and el.get("href") is not None:
            text = " ".join(el.text_content().split())[:128]
            body_links.append({"path": "A@/href", "url": el.get("href"),
                               **_attrs(el, ("target", "alt", "title", "rel", "hreflang", "type")),
                               **({"text": text} if text else {})})
        elif el.tag == "img" and el.get("src") is not None:
            body_links.append({"path": "IMG@/src", "url": el.get("src"), **_attrs(el, ("alt", "title"))})
    return {"Head": head, "Links": body_links}


def _response_envelope(record) -> dict:
    http = record.http_headers
    body = record.content_stream().read()
    headers = {k: v for k, v in http.headers}
    meta = {
        "Response-Message": {"Version": http.protocol, "Status": http.get_statuscode(),
                             "Reason": http.statusline.partition(" ")[2]},
        "Headers-Length": str(len(http.to_bytes())),
        "Headers": headers,
        "Entity-Length": str(len(body)),
        "Entity-Digest": _sha1(body),
        "Entity-Trailing-Slop-Length": "0",
    }
    ctype = (http.get_header("Content-Type") or "").lower()
    if "html" in ctype:
        meta["HTML-Metadata"] = html_metadata(body)
    return {"Actual-Content-Type": "application/http; msgtype=response", "HTTP-Response-Metadata": meta,
            "Actual-Content-Length": record.rec_headers.get_header("Content-Length"), "Trailing-Slop-Length": "4"}


def write_wat(warc: str | Path, out: str | Path, *, only_types: tuple[str, ...] = ("response",)) -> Path:
    """A WAT file (gzip) for the records of `warc` whose type is in `only_types`."""
    out = Path(out)
    with open(warc, "rb") as src, open(out, "wb") as dst:
        writer = WARCWriter(dst, gzip=True)
        info = writer.create_warcinfo_record(out.name, {"Software-Info": "kit.wat",
                                                        "format": "WARC File Format 1.0"})
        writer.write_record(info)
        for record in ArchiveIterator(src):
            if record.rec_type not in only_types:
                continue
            rec_headers = dict(record.rec_headers.headers)
            envelope = {
                "Format": "WARC",
                "WARC-Header-Length": str(len(record.rec_headers.to_bytes())),
                "WARC-Header-Metadata": rec_headers,
                "Payload-Metadata": (_response_envelope(record) if record.rec_type == "response"
                                     else {"Actual-Content-Type": rec_headers.get("Content-Type", "")}),
            }
            doc = {"Container": {"Filename": Path(warc).name, "Compressed": True},
                   "Envelope": envelope}
            payload = json.dumps(doc, ensure_ascii=False).encode()
            writer.write_record(writer.create_warc_record(
                rec_headers.get("WARC-Target-URI"), "metadata", payload=io.BytesIO(payload),
                warc_content_type="application/json",
                warc_headers_dict={"WARC-Refers-To": rec_headers.get("WARC-Record-ID", f"<urn:uuid:{uuid.uuid4()}>")}))
    return out
