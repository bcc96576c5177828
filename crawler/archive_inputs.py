"""Where `lait ingest-warc` reads archives from: local files, archive URLs, Common Crawl path lists.

- A local path is read in place.
- An archive URL (`s3://...`, `https://...`, any scheme fsspec knows; `lait.storage` holds the
  settings, as for work directories) is copied to a local temporary file by the worker that
  ingests it, streamed in 1 MiB blocks, and removed afterwards: the reader makes more than one
  pass over a file (FastWARC, then warcio after damage, then the gzip member check), and a
  sequential copy is what object storage and HTTP serve best.
- A Common Crawl path list (`warc.paths.gz`, `wat.paths.gz`, `wet.paths.gz`, or any name
  ending in `.paths` or `.paths.gz`, itself local or a URL) stands for the archives it lists:
  one path a line, relative to a base URL (`--base-url`, by default Common Crawl's
  https://data.commoncrawl.org/; `s3://commoncrawl/` reads the same bucket through S3).

The identity of a URL archive, for resuming, is its URL with the size and ETag the server
reports; of a local file, its absolute path with size and modification time.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lait import storage

DEFAULT_BASE_URL = "https://data.commoncrawl.org/"
COPY_BLOCK = 1 << 20


def is_url(item: str | os.PathLike) -> bool:
    return storage.is_remote_url(str(item)) if isinstance(item, str) else False


def is_path_list(item: str | os.PathLike) -> bool:
    name = str(item).rsplit("/", 1)[-1].lower()
    return name.endswith((".paths", ".paths.gz"))


def join_url(base: str, path: str) -> str:
    """`path` of a path list under `base` (a path that is a URL already stays as it is)."""
    if is_url(path):
        return path
    return base.rstrip("/") + "/" + path.lstrip("/")


def read_path_list(item: str, base_url: str = DEFAULT_BASE_URL) -> list[str]:
    """The archive URLs a Common Crawl path list names, in its order."""
    data = storage.read_bytes(storage.location(item))
    if str(item).lower().endswith(".gz"):
        data = gzip.decompress(data)
    lines = (line.strip() for line in data.decode("utf-8").splitlines())
    return [join_url(base_url, line) for line in lines if line and not line.startswith("#")]


def expand_archives(items: list[str], base_url: str = DEFAULT_BASE_URL) -> list[str]:
    """The archives `items` name: path lists replaced by what they list, the rest as given."""
    out: list[str] = []
    for item in items:
        out.extend(read_path_list(item, base_url) if is_path_list(item) else [str(item)])
    return out


def archive_name(item: str) -> str:
    return str(item).rstrip("/").rsplit("/", 1)[-1] if is_url(item) else Path(item).name


def identity(item: str) -> str:
    """What names an archive across runs: its URL, or its absolute local path."""
    return item if is_url(item) else str(Path(item).resolve())


def size(item: str) -> int:
    return storage.size(storage.location(item)) if is_url(item) else os.path.getsize(item)


def fingerprint(item: str) -> dict[str, Any]:
    """What a finished archive's marker holds, to tell a changed archive from the same one."""
    if not is_url(item):
        st = Path(item).stat()
        return {"path": identity(item), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    loc = storage.location(item)
    info = storage.filesystem(loc).info(loc.url)
    etag = next((v for k, v in info.items() if k.lower() in ("etag", "e_tag")), None)
    return {"path": item, "size": int(info.get("size") or 0), "etag": str(etag) if etag else None}


def _open_stream(item: str):
    """The archive's bytes in order: over HTTP one plain GET (no range requests, which not
    every server answers), elsewhere fsspec's reader."""
    loc = storage.location(item)
    if loc.protocol in ("http", "https"):
        return storage.filesystem(loc).open(loc.url, "rb", block_size=0)
    return storage.open_input(loc)


@contextlib.contextmanager
def local_file(item: str) -> Iterator[Path]:
    """A local path to read the archive from: itself, or a temporary copy of a URL's bytes."""
    if not is_url(item):
        yield Path(item)
        return
    fd, tmp = tempfile.mkstemp(prefix="lait-archive-", suffix="-" + archive_name(item)[-80:])
    try:
        with os.fdopen(fd, "wb") as dst, _open_stream(item) as src:
            shutil.copyfileobj(src, dst, COPY_BLOCK)
        yield Path(tmp)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
