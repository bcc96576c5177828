"""Stored copies of the pages a report links to, written as files beside the report.

A report outlives the web it was built from: the demo's local web stops when the demo ends, and
a real page changes or disappears. `pages/` keeps every stored page's HTML, so the report links
to that copy, `REPORT_pages/<digest>.html` next to `REPORT.html`, and a page with no stored HTML
(refused by robots.txt, a 404, an opt-out) is shown as its URL in text, never as a link.

A copy is the page's bytes as served, with two lines put in front: its charset, and a
Content-Security-Policy that lets nothing run or load (the page is fetched content, opened
from a local file).
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

from lait import storage
from lait.parts import WorkDir, partition_of

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
    """Write the stored HTML of each of `urls` that `pages/` holds into `folder`; returns
    page URL -> the copy's path relative to the folder's parent (the report's folder). Only
    the partitions that hold the URLs are read."""
    work = WorkDir(work_root)
    if folder.is_dir():  # copies of an earlier report of this name
        for old in folder.glob("*.html"):
            if len(old.stem) == 20 and all(c in "0123456789abcdef" for c in old.stem):
                old.unlink()
    if not urls or not work.part_files("pages"):
        return {}
    wanted: dict[int, set[str]] = {}
    for url in urls:
        wanted.setdefault(partition_of(url, work.n_partitions), set()).add(url)
    out: dict[str, str] = {}
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
                    if not body:  # fetched, not stored (an error, an opt-out): shown as text
                        continue
                    folder.mkdir(parents=True, exist_ok=True)
                    name = copy_name(names[i])
                    (folder / name).write_bytes(_header(names[i], t.column("encoding")[i].as_py()) + body)
                    out[names[i]] = f"{folder.name}/{name}"
    log.debug("report: %d stored page copies in %s", len(out), folder)
    return out
