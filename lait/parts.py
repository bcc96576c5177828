"""Parquet parts in a work directory: partitioning, atomic writing, reading, completion markers.

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
import functools
import hashlib
import io
import json
import logging
import os
import re
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime, timezone
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import yaml

from lait import storage
from lait.errors import corrupt, on_write_error
from lait.reasons import check as check_reason
from lait.schemas import get_table
from lait.storage import Location, RemotePath
from lait.urls import is_http_url

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


def atomic_write_bytes(path: Location, data: bytes) -> None:
    """Write a file so that readers see either nothing or all of it."""
    storage.write_atomic(path, data)


def atomic_write_json(path: Location, obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=1, sort_keys=True, default=str) + "\n").encode())


def validate_rows(rows: Iterable[Mapping[str, Any]], schema: pa.Schema) -> list[Mapping[str, Any]]:
    """Check rows against a schema: no unknown columns, no missing required values."""
    names = set(schema.names)
    required = [f.name for f in schema if not f.nullable]
    out = []
    for row in rows:
        extra = row.keys() - names
        if extra:
            raise ValueError(f"unknown columns {sorted(extra)} for schema with {schema.names}")
        missing = [n for n in required if row.get(n) is None]
        if missing:
            raise ValueError(f"missing required columns {missing} in row {_short(row)}")
        out.append(row)
    return out


def row_bytes(row: Mapping[str, Any]) -> int:
    """Bytes of a row's str and bytes values (a memoryview counts as bytes): what buffer limits count."""
    return sum(v.nbytes if type(v) is memoryview else len(v) for v in row.values()
               if isinstance(v, (bytes, str, memoryview)))


def _short(row: Mapping[str, Any]) -> str:
    return "{" + ", ".join(f"{k}={str(v)[:60]!r}" for k, v in row.items()) + "}"


def table_of_rows(rows: list[Mapping[str, Any]], schema: pa.Schema) -> pa.Table:
    """`pa.Table.from_pylist(rows, schema=schema)`, with binary columns built in one piece.

    Arrow's builder grows a binary column by doubling, copying the media bytes of a row group
    (8 MiB) several times into freshly mapped memory; here each binary column is one
    `b"".join` of its values wrapped as the array's data buffer, which is the same array.
    Binary values may also be memoryviews (`WorkDir.iter_rows(views=True)`)."""
    columns = [_binary_array([row.get(f.name) for row in rows]) if f.type == pa.binary() else None
               for f in schema]
    if all(c is None for c in columns):
        return pa.Table.from_pylist(rows, schema=schema)
    arrays = [c if c is not None else pa.array([row.get(f.name) for row in rows], type=f.type)
              for f, c in zip(schema, columns)]
    return pa.Table.from_arrays(arrays, schema=schema)


def conform_table(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """`table` with exactly `schema`'s columns, in its order and types (a missing column is
    null); a ValueError for an unknown column, a null in a required one or a failed cast, as
    `validate_rows` and the row path give."""
    extra = set(table.column_names) - set(schema.names)
    if extra:
        raise ValueError(f"unknown columns {sorted(extra)} for schema with {schema.names}")
    columns = []
    for f in schema:
        if f.name not in table.column_names:
            col = pa.nulls(table.num_rows, f.type)
        else:
            col = table.column(f.name)
            if col.type != f.type:
                try:
                    col = col.cast(f.type)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                    raise ValueError(f"column {f.name}: {exc}") from exc
        if not f.nullable and col.null_count:
            raise ValueError(f"missing required columns [{f.name!r}] in {col.null_count} rows")
        columns.append(col)
    return pa.Table.from_arrays(columns, schema=schema)


def table_row_bytes(table: pa.Table) -> np.ndarray:
    """`row_bytes` of every row of a table, as it counts them: characters of its top-level
    strings, bytes of its top-level binaries."""
    total = np.zeros(table.num_rows, np.int64)
    for col in table.columns:
        if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
            total += pc.fill_null(pc.utf8_length(col), 0).to_numpy()
        elif pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type):
            total += pc.fill_null(pc.binary_length(col), 0).to_numpy()
    return total


def _binary_array(values: list[Any]) -> pa.Array | None:
    """A binary array of bytes/memoryview/None values built from one joined buffer, or None
    when the values are anything else (Arrow's own conversion handles those, and its errors)."""
    if not all(v is None or type(v) is bytes or type(v) is memoryview for v in values):
        return None
    present = [v for v in values if v is not None]
    data = b"".join(present)
    if len(data) > 2**31 - 1:  # 32-bit offsets: Arrow's conversion says what to do
        return None
    offsets = np.zeros(len(values) + 1, np.int32)
    np.cumsum([0 if v is None else v.nbytes if type(v) is memoryview else len(v) for v in values],
              out=offsets[1:])
    nulls = len(values) - len(present)
    validity = None
    if nulls:
        validity = pa.py_buffer(np.packbits(np.array([v is not None for v in values]), bitorder="little"))
    return pa.Array.from_buffers(pa.binary(), len(values), [validity, pa.py_buffer(offsets), pa.py_buffer(data)],
                                 null_count=nulls)


# Columns that hold already-compressed media (JPEG, PNG, WebP bytes): zstd cannot shrink them
# and would cost time on every write and read, so they are stored as they are.
INCOMPRESSIBLE_COLUMNS = frozenset({"bytes"})


@functools.lru_cache(maxsize=64)
def compression_of(schema: pa.Schema) -> dict[str, str]:
    """Per-column Parquet codecs: zstd everywhere but the media columns."""
    buf = io.BytesIO()
    pq.ParquetWriter(buf, schema).close()  # the leaf column paths, as Parquet names them
    paths = [c.path for c in pq.ParquetFile(io.BytesIO(buf.getvalue())).schema]
    return {p: "none" if p.split(".")[0] in INCOMPRESSIBLE_COLUMNS else "zstd" for p in paths}


def writer_options(schema: pa.Schema) -> dict[str, Any]:
    """The `pq.ParquetWriter` options of every part: zstd, dictionaries and min/max statistics,
    but none of the three on media bytes (all wasted on JPEGs)."""
    codecs = compression_of(schema)
    plain = [c for c, codec in codecs.items() if codec != "none"]
    return {"compression": codecs, "use_dictionary": plain, "write_statistics": plain,
            "write_page_checksum": True}  # every reader verifies them (`storage.CheckedParquetFile`)


def _rows_with_views(batch: pa.RecordBatch) -> list[dict[str, Any]]:
    """`batch.to_pylist()`, but binary columns as memoryviews into the batch's buffers."""
    columns = [binary_views(col) if col.type == pa.binary() else col.to_pylist() for col in batch.columns]
    names = batch.schema.names
    return [dict(zip(names, values)) for values in zip(*columns)] if columns else [{} for _ in range(batch.num_rows)]


def _rows_of(group: pa.Table, batch_size: int, views: bool) -> Iterator[dict[str, Any]]:
    for batch in group.to_batches(max_chunksize=batch_size):
        yield from (_rows_with_views(batch) if views else batch.to_pylist())


def binary_views(array: pa.Array) -> list[memoryview | None]:
    """The values of a binary array as read-only memoryviews into its data buffer (None for a
    null): no copy, and none of the cost of an Arrow scalar per value."""
    _, offsets, data = array.buffers()
    ends = np.frombuffer(offsets, np.int32, count=len(array) + 1, offset=4 * array.offset).tolist()
    view = memoryview(data if data is not None else b"").cast("B").toreadonly()
    valid = array.is_valid().to_pylist() if array.null_count else None
    return [view[ends[i]:ends[i + 1]] if valid is None or valid[i] else None for i in range(len(array))]


def helper_thread(name: str) -> ThreadPoolExecutor:
    """A one-thread executor for work a task hands off while it goes on (`writing_behind`,
    `iter_rows(read_ahead=...)`): one such thread runs what is queued on it in order. A task
    that hands off several kinds of work shares one: each thread that allocates gets its own
    glibc arena, which keeps up to its trim threshold of free memory (stage 2 with a thread each
    for reading, hashing and writing peaked 35-45 MiB higher than with one)."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)


class BackgroundWrites:
    """Finished row groups written on a helper thread while the caller goes on with the next rows.

    Arrow encodes a row group and hands it to the file without the GIL, so the thread runs
    beside the caller's own native work (a stage 2 task decoding JPEGs: writing 300 MB of
    images took 0.4-0.5 s of its 4 s). The caller builds each row group's Arrow table itself,
    then queues its write; the executor has one thread, which runs what is queued in order, so
    every part file gets the same row groups, in the same order, as when written inline. At
    most `depth` writes wait at a time (the queue holds row groups, 8 MiB each). The first
    write that failed raises its error from the next `submit` or `wait`. `executor`: a
    `helper_thread` to share (it is left running), else one of its own."""

    def __init__(self, executor: ThreadPoolExecutor | None = None, depth: int = 1):
        self.depth = depth
        self._own = executor is None
        self._pool = helper_thread("lait-write") if executor is None else executor
        self._pending: deque[Future] = deque()

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        while len(self._pending) >= self.depth:
            self._pending.popleft().result()
        self._pending.append(self._pool.submit(fn, *args))

    def wait(self, *, errors: bool = True) -> None:
        """Return once every queued write is done (all of them, also after one failed); raises
        the first one's error unless `errors=False` (the caller is failing with its own)."""
        first: BaseException | None = None
        while self._pending:
            exc = self._pending.popleft().exception()
            first = first or exc
        if first is not None and errors:
            raise first

    def close(self, *, errors: bool = True) -> None:
        """Wait for the queued writes (`wait`) and stop the thread if it is its own."""
        try:
            self.wait(errors=errors)
        finally:
            if self._own:
                self._pool.shutdown(wait=True)


class PartWriter:
    """Streams rows of one table into one part file, which appears atomically on `close`.

    Rows go out in row groups: locally to a hidden temporary file that `close` renames into
    place, remotely as an upload to the final key that `close` completes; the stats JSON is
    written just before. A writer that is never closed (crash, kill) leaves only a hidden
    temporary file, which readers ignore and `WorkDir.clean_temp` removes, or an unfinished
    upload, which no reader can see.
    """

    # Row groups are the unit every reader holds in memory (media tables: ~8 MiB of images),
    # so they are capped by bytes as well as rows: a partition that grows 10x then gets more
    # row groups, not bigger ones, and a worker's memory stays the same (bench/scale).
    def __init__(self, path: Location, schema: pa.Schema, *, row_group_rows: int = 2048,
                 row_group_bytes: int = 8 << 20, extra_stats: Mapping[str, Any] | None = None):
        self.path = path
        self.schema = schema
        self.row_group_rows = row_group_rows
        self.row_group_bytes = row_group_bytes
        self.extra_stats = dict(extra_stats or {})
        self.rows = 0
        self._buffer: list[Mapping[str, Any]] = []
        self._tables: list[pa.Table] = []  # rows written by `write_table`, ahead of `_buffer`
        self._table_rows = 0
        self._buffer_bytes = 0
        self._writer: pq.ParquetWriter | None = None
        self._out: storage.LocalOutput | storage.RemoteOutput | None = None
        self.closed = False
        # Set by `PartitionedWriter.writing_behind`: row groups are written on its thread.
        self.background: BackgroundWrites | None = None

    def write(self, row: Mapping[str, Any]) -> None:
        self._buffer.append(row)
        self._buffer_bytes += row_bytes(row)
        if len(self._buffer) + self._table_rows >= self.row_group_rows or self._buffer_bytes >= self.row_group_bytes:
            self._flush()

    def write_many(self, rows: Iterable[Mapping[str, Any]]) -> None:
        for row in rows:
            self.write(row)

    def write_table(self, table: pa.Table) -> None:
        """Append the rows of an Arrow table: the same row groups, and so the same file, as
        `write` of its rows one by one (a stage that works by column writes its result without
        a dict per row). A column the table lacks is null; a column the schema does not know,
        a null in a required column or a value that does not convert is a ValueError."""
        table = conform_table(table, self.schema)
        if self._buffer:  # rows written before these come first in the row group
            self._tables.append(table_of_rows(validate_rows(self._buffer, self.schema), self.schema))
            self._table_rows += len(self._buffer)
            self._buffer = []
        sizes = table_row_bytes(table)
        start, n = 0, table.num_rows
        while start < n:
            # `write` flushes after the row that brings the buffer to its row or byte limit.
            room = self.row_group_rows - self._table_rows
            cum = np.cumsum(sizes[start:start + room]) + self._buffer_bytes
            take = min(room, int(np.searchsorted(cum, self.row_group_bytes, side="left")) + 1, len(cum))
            self._tables.append(table.slice(start, take))
            self._table_rows += take
            self._buffer_bytes = int(cum[take - 1])
            start += take
            if self._table_rows >= self.row_group_rows or self._buffer_bytes >= self.row_group_bytes:
                self._flush()

    @property
    def buffered_bytes(self) -> int:
        """Bytes of str/bytes values in rows not yet written out as a row group."""
        return self._buffer_bytes

    def flush(self) -> None:
        """Write the buffered rows out now, as a (smaller) row group (written once this returns,
        also when row groups are written behind)."""
        self._flush()
        if self.background is not None:
            self.background.wait()

    def _flush(self) -> None:
        if not self._buffer and not self._tables:
            return
        tables = self._tables
        if self._buffer:
            tables.append(table_of_rows(validate_rows(self._buffer, self.schema), self.schema))
        table = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
        if self._writer is None:
            self._out = storage.open_output(self.path)
            try:
                self._writer = pq.ParquetWriter(self._out.sink, self.schema, **writer_options(self.schema))
            except Exception as exc:
                raise on_write_error(exc, self.path) from exc
        if self.background is not None:
            self.background.submit(self._write_group, table)
        else:
            self._write_group(table)
        self.rows += table.num_rows
        self._buffer = []
        self._tables = []
        self._table_rows = 0
        self._buffer_bytes = 0

    def _write_group(self, table: pa.Table) -> None:
        try:
            self._writer.write_table(table)
        except Exception as exc:  # pyarrow's "Error writing bytes to file" names no file
            raise on_write_error(exc, self.path) from exc

    def close(self) -> dict[str, Any] | None:
        """Finish the part. Returns its stats, or None when no row was written (no file)."""
        if self.closed:
            raise RuntimeError(f"{self.path} already closed")
        self.closed = True
        self.flush()
        if self._writer is None:
            return None
        try:
            self._writer.close()
            stats = {"rows": self.rows, "bytes": self._out.size(), **self.extra_stats}
        except Exception as exc:
            raise on_write_error(exc, self.path) from exc
        atomic_write_json(stats_path(self.path), stats)
        self._out.commit()
        return stats

    def abort(self) -> None:
        self.closed = True
        if self.background is not None:  # no write may still run into the file closed below
            self.background.wait(errors=False)  # the part is discarded: its writes' errors are moot
        if self._writer is not None:
            try:
                self._writer.close()
            except Exception as exc:  # the part is discarded anyway; the error that led here matters
                log.debug("closing aborted part %s: %r", self.path, exc)
            finally:
                self._out.discard()


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


def stats_path(part: Location) -> Location:
    return part.with_name(part.name[: -len(".parquet")] + ".stats.json")


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
            atomic_write_json(meta, {"partitions": self.n_partitions})
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
