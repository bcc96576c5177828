"""Writing one part file: `PartWriter` streams a table's rows into one Parquet part that appears
atomically with its stats JSON (`stats_path`), row groups written inline or on a helper thread
(`BackgroundWrites`); `atomic_write_bytes` and `atomic_write_json` for the small files beside
them (markers, configs). `lait.parts.PartitionedWriter` keeps one `PartWriter` per table and
partition of a task."""

from __future__ import annotations

import json
import logging
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from lait import storage
from lait.arrow_rows import conform_table, row_bytes, table_of_rows, table_row_bytes, validate_rows, writer_options
from lait.errors import on_write_error
from lait.storage import Location

log = logging.getLogger(__name__)


def atomic_write_bytes(path: Location, data: bytes) -> None:
    """Write a file so that readers see either nothing or all of it."""
    storage.write_atomic(path, data)


def atomic_write_json(path: Location, obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=1, sort_keys=True, default=str) + "\n").encode())


def stats_path(part: Location) -> Location:
    return part.with_name(part.name[: -len(".parquet")] + ".stats.json")


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
