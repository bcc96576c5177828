"""The work directory: its layout, partitioning, reading its parts, completion markers, the
config history, and `PartitionedWriter`, through which a task writes its parts (one part file
is written by `lait.writers.PartWriter`, its rows made into Arrow tables by `lait.arrow_rows`).

Layout of a work directory::

    WORK/lait.json                     # {"partitions": N}: fixed when the directory is created
    WORK/TABLE/pPPPPP-TAG.parquet      # one part of partition PPPPP, written by TAG
    WORK/TABLE/pPPPPP-TAG.stats.json   # its stats, written together with it
    WORK/_done/STAGE/pPPPPP.json       # a task of STAGE over input partition PPPPP finished
    WORK/_configs/COMMAND.yaml         # resolved config of the last run of COMMAND

A partition of a table is the union of its parts, read in file-name order, so several writers
(crawler processes, or stage tasks that re-partition) can add to the same partition. A writer
writes through one `PartitionedWriter` (one open part per table and partition, all under its
tag); the crawler's `RollingPartitionedWriter` commits its parts as they grow.

WORK is a local folder or an object storage URL such as `s3://bucket/prefix` (see
`lait.storage`): `WorkDir.root` is a `Path` or a `RemotePath`, and every file operation here
goes through `lait.storage`, which keeps local paths on plain os and pyarrow calls.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa
import yaml

from lait import storage

# Rows and Arrow tables, and the writing of one part, have modules of their own (lait.arrow_rows,
# lait.writers): what this module uses, and the names code outside lait may have imported from here.
from lait.arrow_rows import (  # noqa: F401
    INCOMPRESSIBLE_COLUMNS,
    _rows_of,
    binary_views,
    compression_of,
    conform_table,
    row_bytes,
    table_of_rows,
    table_row_bytes,
    validate_rows,
    writer_options,
)
from lait.errors import corrupt
from lait.reasons import check as check_reason
from lait.schemas import get_table
from lait.storage import Location, RemotePath
from lait.urls import is_http_url
from lait.writers import BackgroundWrites, PartWriter, atomic_write_bytes, atomic_write_json, helper_thread, stats_path

log = logging.getLogger(__name__)

DEFAULT_PARTITIONS = 16
META_FILE = "lait.json"
_PART_RE = re.compile(r"^p(\d{5})-(.+)\.parquet$")


def partition_of(key: str, n_partitions: int) -> int:
    """Stable partition of a key (an image or page URL): the same on every machine and run."""
    digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % n_partitions


def part_name(partition: int, tag: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", tag):
        raise ValueError(f"part tag must be [A-Za-z0-9_.-]+, got {tag!r}")
    return f"p{partition:05d}-{tag}.parquet"


def schema_problem(table: str, found: pa.Schema, columns: Iterable[str] | None = None) -> str | None:
    """Why the columns of a part of `table` (its file's schema, `found`) are not the table's, or
    None: a column the table requires that the part lacks, a column of another type, a column
    named twice. A nullable column it lacks was added to the table after the part was written,
    and reads as nulls. `columns`: only these (what a reader asked for)."""
    wanted = None if columns is None else set(columns)
    for f in get_table(table).schema:
        if wanted is not None and f.name not in wanted:
            continue
        at = found.get_all_field_indices(f.name)
        if not at:
            if f.nullable:
                continue
            return f"it has no column {f.name!r}, which the {table} table requires"
        if len(at) > 1:
            return f"it has {len(at)} columns named {f.name!r}"
        if not found.field(at[0]).type.equals(f.type):
            return f"its column {f.name!r} holds {found.field(at[0]).type}, not the {f.type} of the {table} table"
    return None


def open_part(table: str, path: Location, columns: Iterable[str] | None = None) -> storage.CheckedParquetFile:
    """A part of `table` opened to be read, page checksums verified (`storage.parquet_file`);
    a part whose columns are not the table's (`schema_problem`) raises `CorruptPart` naming the
    file and the column, rather than reading nulls or text where the table has numbers."""
    pf = storage.parquet_file(path)
    problem = schema_problem(table, pf.schema_arrow, columns)
    if problem:
        raise corrupt(path, problem)
    return pf


class WorkDir:
    """A work directory: the tables of DESIGN.md as folders of Parquet parts.

    `root` is a local folder or an object storage URL (`s3://bucket/prefix`); `url` is it as a
    string, which is what executors hand to workers (a WorkDir is cheap to rebuild and holds no
    connection). Listings are never cached: other processes add parts while this one runs.
    """

    def __init__(self, root: str | os.PathLike | RemotePath, *, n_partitions: int | None = None):
        self.root = storage.location(root)
        meta = self.root / META_FILE
        if storage.exists(meta):
            stored = json.loads(storage.read_text(meta))["partitions"]
            if n_partitions is not None and n_partitions != stored:
                raise ValueError(
                    f"{self.root} was created with {stored} partitions, not {n_partitions}; "
                    "use a new work directory to change the partition count"
                )
            self.n_partitions = int(stored)
        else:
            self.n_partitions = int(n_partitions or DEFAULT_PARTITIONS)

    @property
    def url(self) -> str:
        return str(self.root)

    @property
    def remote(self) -> bool:
        return isinstance(self.root, RemotePath)

    def __repr__(self) -> str:
        return f"WorkDir({self.url!r})"

    def exists(self) -> bool:
        """Whether the directory exists (remotely: whether any object lies under its prefix)."""
        return storage.is_dir(self.root)

    def is_initialized(self) -> bool:
        """Whether the directory holds `lait.json` (made by `init`, i.e. by a crawl or ingest)."""
        return storage.exists(self.root / META_FILE)

    def init(self) -> WorkDir:
        """Create the directory and fix its partition count."""
        storage.make_dirs(self.root)
        meta = self.root / META_FILE
        if not storage.exists(meta):
            try:
                atomic_write_json(meta, {"partitions": self.n_partitions})
            except FileNotFoundError:
                # A second lait that made the directory at the same time took its lock first and
                # swept the temporary files (`clean_temp`), ours among them, after writing its
                # own lait.json: the directory is made; its lock then says who holds it.
                if not storage.exists(meta):
                    raise
        return self

    # -- parts -----------------------------------------------------------------------------
    def table_dir(self, table: str) -> Location:
        return self.root / table

    def part_path(self, table: str, partition: int, tag: str) -> Location:
        return self.table_dir(table) / part_name(partition, tag)

    def writer(self, table: str, partition: int, tag: str, **kwargs: Any) -> PartWriter:
        return PartWriter(self.part_path(table, partition, tag), get_table(table).schema, **kwargs)

    def part_files(self, table: str, partition: int | None = None) -> list[Location]:
        out = []
        for p in storage.list_dir(self.table_dir(table)):
            m = _PART_RE.match(p.name)
            if m and (partition is None or int(m.group(1)) == partition):
                out.append(p)
        return sorted(out, key=lambda p: p.name)

    def partitions(self, table: str) -> list[int]:
        """Partitions of a table that hold at least one part."""
        return sorted({int(_PART_RE.match(p.name).group(1)) for p in self.part_files(table)})

    def read(self, table: str, partition: int | None = None, columns: list[str] | None = None) -> pa.Table:
        """A partition (or the whole table) as one Arrow table, in part-name order; a part whose
        columns are not the table's raises `CorruptPart` naming it (`open_part`)."""
        schema = get_table(table).schema
        files = self.part_files(table, partition)
        if columns is not None:
            schema = pa.schema([schema.field(c) for c in columns])
        if not files:
            return schema.empty_table()
        tables = []
        for f in files:
            open_part(table, f, columns)  # its columns checked against the table's first: one footer read
            tables.append(storage.read_table(f, columns=columns, schema=schema))
        return pa.concat_tables(tables)

    def iter_rows(self, table: str, partition: int | None = None, columns: list[str] | None = None,
                  batch_size: int = 256, *, views: bool = False,
                  read_ahead: bool | int | ThreadPoolExecutor = False) -> Iterator[dict[str, Any]]:
        """Rows as dicts, streamed batch by batch so a large partition never sits in memory.

        One row group is read at a time: `ParquetFile.iter_batches` reads ahead and holds most
        of a file (a 150 MB images_ok partition whole), so memory grew with partition size.

        With `views`, binary values are read-only memoryviews into the row group's Arrow buffers
        instead of bytes copies (a row group of media is 8 MiB copied once more); a view keeps
        its row group in memory for as long as it is held, and `PartWriter` accepts it as bytes.

        With `read_ahead`, the next row group is read on a helper thread while the caller works
        through this one (Arrow reads without the GIL): for a caller whose own work also runs
        without it (stage 2's decoding). Two row groups are then held instead of one.
        `read_ahead` may be a `helper_thread` to share, else the reader starts its own; an int
        N > 1 reads the next N row groups at once, on N threads of its own."""
        groups = ((pf, i) for f in self.part_files(table, partition)
                  for pf in (open_part(table, f, columns),) for i in range(pf.num_row_groups))
        if not read_ahead:
            for pf, i in groups:
                group = pf.read_row_group(i, columns=columns)
                yield from _rows_of(group, batch_size, views)
                del group
            return
        shared = isinstance(read_ahead, ThreadPoolExecutor)
        # An int: that many row groups read ahead at once, each on its own thread (a reader
        # that must keep up with a GPU: one thread checks and copies ~1.5 GB/s).
        depth = 1 if shared or read_ahead is True else max(1, int(read_ahead))
        reader = read_ahead if shared else (helper_thread("lait-read") if depth == 1 else
                                            ThreadPoolExecutor(depth, thread_name_prefix="lait-read"))
        try:
            pending: deque = deque()
            for nxt in groups:
                pending.append(reader.submit(nxt[0].read_row_group, nxt[1], columns=columns))
                if len(pending) > depth:
                    group = pending.popleft().result()
                    yield from _rows_of(group, batch_size, views)
                    del group
            while pending:
                group = pending.popleft().result()
                yield from _rows_of(group, batch_size, views)
                del group
        finally:
            for fut in pending:
                fut.cancel()
            if not shared:
                reader.shutdown(wait=True)

    def count(self, table: str, partition: int | None = None) -> int:
        return sum(storage.parquet_file(f).metadata.num_rows for f in self.part_files(table, partition))

    def part_sizes(self, table: str) -> list[tuple[str, int]]:
        """(file name, bytes) of every part of a table, in name order."""
        return [(p.name, storage.size(p)) for p in self.part_files(table)]

    def remove_parts(self, table: str, tag: str) -> int:
        """Remove every part of a table written under `tag`, with its stats and any temporary
        files a killed writer of that tag left; returns how many parts were removed."""
        n = 0
        for p in self.part_files(table):
            if _PART_RE.match(p.name).group(2) == tag:
                storage.remove(stats_path(p))
                storage.remove(p)
                n += 1
        if not self.remote:  # object storage has no temporary files: uploads are invisible
            d = self.table_dir(table)
            if d.is_dir():
                leftover = re.compile(rf"^\.tmp-[0-9a-f]{{32}}-p\d{{5}}-{re.escape(tag)}\.(parquet|stats\.json)$")
                for p in d.iterdir():
                    if leftover.match(p.name):
                        p.unlink(missing_ok=True)
        return n

    def clean_temp(self) -> None:
        """Remove temporary files left by writers that were killed (local only: remotely an
        unfinished upload is invisible, and the bucket's lifecycle rule expires it)."""
        if self.remote or not self.root.is_dir():
            return
        for p in self.root.rglob(".tmp-*"):
            p.unlink(missing_ok=True)

    # -- task markers ----------------------------------------------------------------------
    def marker_path(self, stage: str, partition: int) -> Location:
        return self.root / "_done" / stage / f"p{partition:05d}.json"

    def is_done(self, stage: str, partition: int) -> bool:
        return storage.exists(self.marker_path(stage, partition))

    def mark_done(self, stage: str, partition: int, stats: Mapping[str, Any]) -> None:
        atomic_write_json(self.marker_path(stage, partition), dict(stats))

    def done_partitions(self, stage: str) -> set[int]:
        """Partitions of a stage whose marker exists: one listing instead of a lookup each."""
        return {int(m.group(1)) for p in storage.list_dir(self.root / "_done" / stage)
                if (m := re.fullmatch(r"p(\d{5})\.json", p.name))}

    def clear_done(self, stage: str, partition: int | None = None) -> None:
        """Remove the marker of one task of a stage, or (no partition) every marker of it."""
        if partition is None:
            storage.remove_tree(self.root / "_done" / stage)
        else:
            storage.remove(self.marker_path(stage, partition))

    def markers(self, stage: str) -> dict[int, dict[str, Any]]:
        """Every completion marker of a stage by partition (stats and fingerprint)."""
        files = sorted((p for p in storage.list_dir(self.root / "_done" / stage)
                        if re.fullmatch(r"p\d{5}\.json", p.name)), key=lambda p: p.name)
        return {int(f.name[1:6]): json.loads(b) for f, b in zip(files, storage.read_many(files))}

    def done_stats(self, stage: str) -> list[dict[str, Any]]:
        return list(self.markers(stage).values())

    # -- configs ---------------------------------------------------------------------------
    def write_config(self, command: str, text: str, *, latest: bool = True,
                     redone: Mapping[str, Any] | None = None) -> Location:
        """Record a run's resolved settings: `_configs/history/TIME-COMMAND.yaml` always, with
        what the run redid and why; `_configs/COMMAND.yaml` (the settings the data was last
        built with) only when `latest`, i.e. when the run completed."""
        now = datetime.now(timezone.utc)
        entry = f"# {command} at {now.isoformat(timespec='seconds')}\n"
        if redone is not None:
            entry += "".join(f"# {line}\n" for line in yaml.safe_dump(dict(redone), sort_keys=False).splitlines())
        stamp = now.strftime("%Y%m%dT%H%M%S.%fZ")
        atomic_write_bytes(self.root / "_configs" / "history" / f"{stamp}-{command}.yaml", (entry + text).encode())
        path = self.root / "_configs" / f"{command}.yaml"
        if latest:
            atomic_write_bytes(path, text.encode())
        return path

    def config_history(self) -> list[Location]:
        """Every recorded run, oldest first."""
        return sorted(storage.list_dir(self.root / "_configs" / "history"), key=lambda p: p.name)


class PartitionedWriter:
    """Everything one writer adds to a work directory: one open `PartWriter` per (table,
    partition), made on first use, every part under the same tag.

    Every writer of lait's tables is one of these: a stage task (`lait.stage.PartContext`), an
    archive being ingested, the crawler (`RollingPartitionedWriter`), the build's global pass,
    the near-duplicate step. `reject` is the one way a row reaches `rejected/`: its reason
    must be registered in `lait.reasons`. `close` commits every open part and returns the rows
    written per table; `abort` discards the open ones. As a context manager it closes on
    success and aborts on an exception.
    """

    def __init__(self, work: WorkDir, tag: str, *, row_group_rows: int = 2048,
                 row_group_bytes: int = 8 << 20, extra_stats: Mapping[str, Any] | None = None):
        self.work = work
        self.tag = tag
        self._part_options = {"row_group_rows": row_group_rows, "row_group_bytes": row_group_bytes,
                              "extra_stats": extra_stats}
        self._open: dict[tuple[str, int], PartWriter] = {}
        self._committed: set[tuple[str, int]] = set()
        self.rows: Counter[str] = Counter()  # rows of the committed parts, per table
        self._background: BackgroundWrites | None = None

    def partition_of(self, key: str) -> int:
        """The partition of a key (an image or page URL) in this work directory."""
        return partition_of(key, self.work.n_partitions)

    def writer(self, table: str, partition: int) -> PartWriter:
        """The open part of (table, partition), made now if there is none."""
        w = self._open.get((table, partition))
        if w is None:
            tag = self._new_tag(table, partition)
            w = self._open[(table, partition)] = self.work.writer(table, partition, tag, **self._part_options)
            w.background = self._background
        return w

    @contextlib.contextmanager
    def writing_behind(self, executor: ThreadPoolExecutor | None = None) -> Iterator[None]:
        """Inside this block, row groups are written on a helper thread (`BackgroundWrites`;
        `executor`: a `helper_thread` to share) while the caller goes on; the parts' bytes are
        the same as when written inline. On leaving, every queued write is done (a failed one
        raises here, or at the next `flush` or `commit`)."""
        if self._background is not None:
            yield
            return
        bg = self._background = BackgroundWrites(executor)
        for w in self._open.values():
            w.background = bg
        ok = False
        try:
            yield
            ok = True
        finally:
            self._background = None
            for w in self._open.values():
                w.background = None
            bg.close(errors=ok)

    def _new_tag(self, table: str, partition: int) -> str:
        if (table, partition) in self._committed:  # a second part under the tag would replace it
            raise RuntimeError(f"{table} partition {partition} of {self.tag} is already committed")
        return self.tag

    def write(self, table: str, partition: int, row: Mapping[str, Any]) -> None:
        self.writer(table, partition).write(row)

    def write_table(self, table: str, partition: int, rows: pa.Table) -> None:
        """The rows of an Arrow table, as `write` of each (`PartWriter.write_table`)."""
        self.writer(table, partition).write_table(rows)

    def reject(self, reason: str, partition: int, *, image_url: str | None = None,
               page_url: str | None = None, text: str | None = None, detail: Any = None) -> str:
        """Write a dropped row into `rejected/` with its registered `stage/rule` reason.

        Its URL columns hold http(s) URLs only (`lait.urls.is_http_url`): a row dropped for a
        `javascript:` URL keeps that URL as text in its detail, where the report shows it as
        text, never in a column that is read as a link."""
        check_reason(reason)
        notes = []
        if image_url and not is_http_url(image_url):
            notes.append(f"image URL {image_url[:300]!r}")
            image_url = None
        if page_url and not is_http_url(page_url):
            notes.append(f"page URL {page_url[:300]!r}")
            page_url = None
        if notes:
            detail = "; ".join([*notes, *([] if detail is None else [str(detail)])])
        self.write("rejected", partition, {
            "reason": reason, "image_url": image_url, "page_url": page_url, "text": text,
            "detail": None if detail is None else str(detail)[:1000]})
        return reason

    @property
    def buffered_bytes(self) -> int:
        """Bytes waiting in the open parts' buffers."""
        return sum(w.buffered_bytes for w in self._open.values())

    def flush(self) -> None:
        """Write the buffered rows of every open part out now, as its last row group so far
        (the same row group `close` would write when no row follows)."""
        for key in sorted(self._open):
            self._open[key].flush()

    def commit(self, table: str, partition: int) -> dict[str, Any] | None:
        """Close the open part of (table, partition); its stats, or None when it had no row."""
        w = self._open.pop((table, partition))
        self._committed.add((table, partition))
        stats = w.close()
        if stats is not None:
            self.rows[table] += stats["rows"]
        return stats

    def close(self) -> dict[str, int]:
        """Commit every open part; returns the rows written per table (tables with rows only)."""
        for key in sorted(self._open):
            self.commit(*key)
        return dict(sorted(self.rows.items()))

    def abort(self) -> None:
        """Discard the open parts (committed ones stay)."""
        for w in self._open.values():
            if not w.closed:
                w.abort()
        self._open.clear()

    def __enter__(self) -> PartitionedWriter:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


class RollingPartitionedWriter(PartitionedWriter):
    """A `PartitionedWriter` for a long-running writer (the crawler): parts are committed as
    they go, so that what is committed survives a kill.

    Each part gets the next tag `TAG-00001`, `TAG-00002`, ...; a part is committed when it
    holds `part_rows` rows or `part_bytes` bytes, and every part is committed every
    `part_seconds` seconds. The open parts' buffers share a cap, `buffer_bytes`: past it, the
    fullest buffers are written out as (smaller) row groups until half of it remains.
    `on_event(name)` hears `parts_committed`, `buffer_flushes` and `all_committed` (every open
    part was committed: what was written before is durable).
    """

    def __init__(self, work: WorkDir, tag: str, *, part_rows: int, part_bytes: int, part_seconds: float,
                 buffer_bytes: int = 32 << 20, on_event: Callable[[str], None] | None = None, **part_options: Any):
        super().__init__(work, tag, **part_options)
        self.part_rows = part_rows
        self.part_bytes = part_bytes
        self.part_seconds = part_seconds
        self.buffer_bytes = buffer_bytes
        self.on_event = on_event
        self._seq = 0
        self._sizes: dict[tuple[str, int], list[int]] = {}  # rows and bytes of each open part
        self._buffered = 0  # an upper bound of the open parts' buffered bytes
        self._last_commit = time.monotonic()

    def _new_tag(self, table: str, partition: int) -> str:
        self._seq += 1
        self._sizes[(table, partition)] = [0, 0]
        return f"{self.tag}-{self._seq:05d}"

    def write(self, table: str, partition: int, row: Mapping[str, Any]) -> None:
        super().write(table, partition, row)
        size = row_bytes(row)
        sizes = self._sizes[(table, partition)]
        sizes[0] += 1
        sizes[1] += size
        if sizes[0] >= self.part_rows or sizes[1] >= self.part_bytes:
            self.commit(table, partition)
        else:
            self._buffered += size
            if self._buffered > self.buffer_bytes:
                self._flush_fullest()
        if time.monotonic() - self._last_commit >= self.part_seconds:
            self.commit_all()

    def _flush_fullest(self) -> None:
        """Bring the open parts' buffers together under half of `buffer_bytes`."""
        writers = sorted(self._open.values(), key=lambda w: w.buffered_bytes)
        total = sum(w.buffered_bytes for w in writers)
        while writers and total > self.buffer_bytes // 2:
            writer = writers.pop()
            total -= writer.buffered_bytes
            writer.flush()
            self._event("buffer_flushes")
        self._buffered = total

    def commit(self, table: str, partition: int) -> dict[str, Any] | None:
        self._sizes.pop((table, partition), None)
        path = self._open[(table, partition)].path
        stats = super().commit(table, partition)
        if stats:
            self._event("parts_committed")
            log.debug("committed %s (%d rows)", path.name, stats["rows"])
        return stats

    def commit_all(self) -> None:
        """Commit every open part, so that everything written so far is durable."""
        for key in list(self._open):
            self.commit(*key)
        self._buffered = 0
        self._last_commit = time.monotonic()
        self._event("all_committed")

    def close(self) -> dict[str, int]:
        self.commit_all()
        return dict(sorted(self.rows.items()))

    def _event(self, name: str) -> None:
        if self.on_event is not None:
            self.on_event(name)


def input_marker(work: WorkDir, stage: str, tag: str):
    """The completion marker of one input file (an archive, a URL list) that `stage` read."""
    return work.root / "_done" / stage / f"{tag}.json"


def input_done(work: WorkDir, stage: str, tag: str, fingerprint: dict) -> bool:
    """True when the marker of input `tag` exists and records `fingerprint` (the file unchanged)."""
    m = input_marker(work, stage, tag)
    if not storage.exists(m):
        return False
    try:
        done = json.loads(storage.read_text(m))
    except ValueError:
        return False
    return all(done.get(k) == v for k, v in fingerprint.items())
