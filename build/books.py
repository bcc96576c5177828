"""img2dataset's bookkeeping for a build from URL lists (issue 30).

img2dataset's users join its output back to their lists: each shard's sidecar lists every input
row of the shard, the failed ones with a status and a message, and each sample carries the
list's `--save-additional-columns`. Here, for the rows of `url_list/` and the list rows that
`lait download` refused:

- which list row became which sample, and which did not and why: the decisive `rejected/` row
  of its image URL (the first image-wide stage that dropped it: stage 1, stage 2, stage 4,
  stage 5; stage 3 only when no later stage saw the image), as img2dataset's status
  (`failed_to_download` when no bytes were had, `failed_to_resize` for bytes that did not make
  a sample, as img2dataset files its own "image too small") with the reason's detail as the
  error message and lait's reason beside it;
- the list's extra columns, typed as the list had them (JSON and Parquet types; a CSV's are
  strings, as img2dataset keeps them), one Arrow type per column over the whole build;
- each row's position in the input, as img2dataset numbers it: lists in path order, each
  starting a new shard, rows in file order (`key_order: input`).
"""

from __future__ import annotations

import json
import logging
import math
import re
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from lait import storage
from lait.workdir import WorkDir

log = logging.getLogger(__name__)

SUCCESS, FAILED_TO_DOWNLOAD, FAILED_TO_RESIZE = "success", "failed_to_download", "failed_to_resize"

# Image-wide stages first, in the order they run; stage 3 rejects texts, and explains a picture
# only when nothing after it saw the image. `build` rejects of this very plan come from its sink.
STAGE_ORDER = ("download", "crawl", "ingest", "filter", "score", "build", "clean")
# Reasons under which no bytes were had: img2dataset's failed_to_download.
NO_BYTES = ("download/", "crawl/", "ingest/", "filter/status", "filter/download", "filter/noai",
            "filter/tdm_reserved", "filter/empty", "build/no_image")
# Types an extra column keeps in the sidecar; anything else (nested, mixed) is JSON text.
TYPES = {"bool": pa.bool_(), "int64": pa.int64(), "double": pa.float64(), "string": pa.string()}
_ROW_IN_DETAIL = re.compile(r"(?:^|; )(.+?) row (\d+): ")


@dataclass(slots=True)
class ListRow:
    """One row of a URL list as the build accounts for it."""

    list_file: str
    row: int  # 1-based, as `url_list/` numbers rows (no header, no blank line)
    image_url: str | None
    caption: str | None
    page_url: str | None
    extra: str | None  # the JSON object `url_list/` holds, parsed when asked for (`ListBook.extra_of`)
    position: int = -1  # 0-based over every list, img2dataset's numbering
    reason: str | None = None  # set for a row `lait download` refused
    detail: str | None = None


@dataclass
class ListBook:
    """Every row of the lists a work directory downloaded."""

    rows: list[ListRow]
    by_url: dict[str, ListRow]
    extra_types: list[tuple[str, str]] = field(default_factory=list)  # (column, TYPES key)

    def extra_of(self, url: str) -> dict[str, Any]:
        """The typed extra columns of the row that named `url` (every column, None when absent)."""
        row = self.by_url.get(url)
        values = json.loads(row.extra) if row is not None and row.extra else {}
        return {name: coerce(values.get(name), tp) for name, tp in self.extra_types}


def _kind(value: Any) -> type | None:
    return None if value is None else type(value)


def type_of(values: list[Any]) -> str:
    """One sidecar type for an extra column's values: bool, int64, double, or string."""
    return _type_of_kinds({_kind(v) for v in values})


def _type_of_kinds(kinds: set[type | None]) -> str:
    kinds = kinds - {None}
    if not kinds or kinds <= {str}:
        return "string"
    if kinds <= {bool}:
        return "bool"
    if kinds <= {int}:
        return "int64"
    if kinds <= {int, float}:
        return "double"
    return "string"


def coerce(value: Any, tp: str) -> Any:
    """`value` as a value of type `tp` (so that one column has one type in JSON and Arrow)."""
    if value is None:
        return None
    if tp == "double":
        return float(value)
    if tp == "string" and not isinstance(value, str):
        return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
    return value


def _list_sizes(work: WorkDir) -> dict[str, int]:
    """list file -> its rows, from `lait download`'s markers (bad rows counted)."""
    sizes = {}
    for p in storage.list_dir(work.root / "_done" / "download"):
        if not p.name.endswith(".json"):
            continue
        try:
            marker = json.loads(storage.read_text(p))
        except ValueError:
            continue
        if marker.get("path"):
            sizes[marker["path"]] = int((marker.get("report") or {}).get("rows") or 0)
    return sizes


def _download_rejects(work: WorkDir, files: list[str]) -> list[ListRow]:
    """The list rows `lait download` refused, with their row numbers (their detail starts with
    `NAME row N: `, NAME the list's file name)."""
    by_name: dict[str, str] = {}
    for f in files:
        by_name.setdefault(f.rsplit("/", 1)[-1], f)
    out = []
    for r in rejected_rows(work, columns=["reason", "image_url", "text", "detail"]):
        if not r["reason"].startswith("download/"):
            continue
        m = _ROW_IN_DETAIL.search(r["detail"] or "")
        if m is None or m.group(1) not in by_name:
            continue
        out.append(ListRow(by_name[m.group(1)], int(m.group(2)), r["image_url"], r["text"], None, None,
                           reason=r["reason"], detail=r["detail"]))
    return out


def rejected_rows(work: WorkDir, columns: list[str]):
    """The rows of `rejected/` but those the build's plan and shard passes write (this build's)."""
    for p in work.part_files("rejected"):
        tag = p.name.split("-", 1)[1].rsplit(".", 1)[0]
        if tag == "build-plan" or tag.startswith("build_shards"):
            continue
        yield from storage.read_table(p, columns=columns).to_pylist()


def load_book(work: WorkDir, samples_per_shard: int) -> ListBook | None:
    """The work directory's list rows with their positions and extra types; None without lists."""
    if not work.part_files("url_list"):
        return None
    # The extra columns stay JSON text per row (a parsed dict per row would double the plan's
    # heap on a large list); their values are only looked at here, once, for their types.
    rows, seen = [], {}
    for r in work.iter_rows("url_list", columns=["image_url", "caption", "page_url", "extra", "list_file", "row"],
                            batch_size=8192):
        rows.append(ListRow(r["list_file"], r["row"], r["image_url"], r["caption"], r["page_url"], r["extra"]))
        for name, value in (json.loads(r["extra"]) if r["extra"] else {}).items():
            seen.setdefault(name, set()).add(_kind(value))
    sizes = _list_sizes(work)
    files = sorted({r.list_file for r in rows} | set(sizes))
    rows += _download_rejects(work, files)
    # img2dataset: each input file starts a new shard (`start_shard_id` goes on after the last one's).
    offsets, start = {}, 0
    for f in files:
        offsets[f] = start
        n = max([sizes.get(f, 0)] + [r.row for r in rows if r.list_file == f])
        start += math.ceil(n / samples_per_shard) * samples_per_shard
    for r in rows:
        r.position = offsets[r.list_file] + r.row - 1
    rows.sort(key=lambda r: r.position)
    types = [(name, _type_of_kinds(kinds)) for name, kinds in seen.items()]
    return ListBook(rows, {r.image_url: r for r in rows if r.reason is None}, types)


def input_key(position: int, samples_per_shard: int) -> tuple[int, str]:
    """(shard, key) of the row at `position`, as img2dataset's `compute_key` forms it: the shard
    number (5 digits), then the row's index in the shard in ceil(log10(samples_per_shard)) digits."""
    oom = math.ceil(math.log10(samples_per_shard))
    shard, index = divmod(position, samples_per_shard)
    return shard, f"{shard * 10 ** oom + index:0{5 + oom}d}"


def status_of(reason: str | None) -> str:
    """img2dataset's status of a row lait dropped for `reason`."""
    if reason is None or reason.startswith(NO_BYTES):
        return FAILED_TO_DOWNLOAD
    return FAILED_TO_RESIZE


def decisive(reasons: list[tuple[str, str | None]]) -> tuple[str, str | None] | None:
    """Of an image URL's (reason, detail) rows, the one that explains why it is no sample."""
    if not reasons:
        return None
    rank = {s: i for i, s in enumerate(STAGE_ORDER)}

    def key(item: tuple[int, tuple[str, str | None]]):
        i, (reason, _) = item
        stage = reason.split("/", 1)[0]
        # among stage 3's, a text rule says more than `no_text` ("no candidate text left")
        return rank.get(stage, len(rank)), reason == "clean/no_text", i

    return min(enumerate(reasons), key=key)[1]


def failures(work: WorkDir, book: ListBook, samples: set[str],
             build_rejects: dict[str, tuple[str, str | None]]) -> list[dict[str, Any]]:
    """A row per list row that is no sample (position order): its URL, caption, page, extra
    columns, img2dataset status, error message and lait's reason. `samples`: the image URLs that
    became samples; `build_rejects`: this plan's own first reject per URL."""
    wanted = {r.image_url for r in book.rows if r.reason is None and r.image_url not in samples}
    found: dict[str, list[tuple[str, str | None]]] = {}
    for r in rejected_rows(work, columns=["reason", "image_url", "detail"]):
        if r["image_url"] in wanted and not r["reason"].startswith("download/"):
            found.setdefault(r["image_url"], []).append((r["reason"], r["detail"]))
    for url, rej in build_rejects.items():
        if url in wanted:
            found.setdefault(url, []).append(rej)
    out = []
    for r in book.rows:
        if r.reason is None and r.image_url in samples:
            continue
        reason, detail = (r.reason, r.detail) if r.reason else (decisive(found.get(r.image_url, [])) or (None, None))
        message = detail or (reason if reason else "not fetched: no outcome recorded for this URL")
        out.append({"position": r.position, "image_url": r.image_url, "caption": r.caption,
                    "page_url": r.page_url, "status": status_of(reason), "error_message": message[:500],
                    "reason": reason, "list_file": r.list_file, "row": r.row,
                    "extra": json.dumps(book.extra_of(r.image_url) if r.reason is None else
                                        {n: None for n, _ in book.extra_types}, ensure_ascii=False)})
    return out
