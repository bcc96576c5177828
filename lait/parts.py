"""What a task writes through: `PartContext` (a stage task's output parts, rejects and counters)
over a `PartitionedWriter` (one open part per table and partition, all under the writer's tag;
the crawler's `RollingPartitionedWriter` commits its parts as they grow). One part file is
written by `lait.writers.PartWriter`, its rows made into Arrow tables by `lait.arrow_rows`; the
work directory it writes into is `lait.workdir.WorkDir`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa

from lait.arrow_rows import row_bytes
from lait.reasons import check as check_reason
from lait.urls import is_http_url
from lait.workdir import WorkDir, partition_of
from lait.writers import BackgroundWrites, PartWriter

log = logging.getLogger(__name__)


def task_tag(stage: str, partition: int) -> str:
    """Tag of the parts a stage task writes: rerunning the task replaces exactly these."""
    return f"{stage}{partition:05d}"


class PartContext:
    """What a stage task writes to: output parts per (table, partition), rejects, counters."""

    def __init__(self, work: WorkDir, stage: str, partition: int, fingerprint: str | None = None):
        self.work = work
        self.stage = stage
        self.partition = partition
        self.tag = task_tag(stage, partition)
        self.counters: Counter[str] = Counter()
        self.files: dict[str, dict[str, Any]] = {}
        # Every part carries the digest of the task that wrote it: what its readers fingerprint.
        self.parts = PartitionedWriter(work, self.tag, extra_stats={
            "stage": stage, "input_partition": partition, "fingerprint": fingerprint})

    def output(self, table: str, partition: int | None = None) -> PartWriter:
        """Writer for `table`, in this task's partition unless another is given (re-partitioning)."""
        return self.parts.writer(table, self.partition if partition is None else partition)

    def write(self, table: str, row: Mapping[str, Any], partition: int | None = None) -> None:
        self.output(table, partition).write(row)
        self.counters[f"{self.stage}/out_{table}"] += 1

    def write_table(self, table: str, rows: pa.Table, partition: int | None = None) -> None:
        """The rows of an Arrow table, as `write` of each: same part, same counter."""
        self.output(table, partition).write_table(rows)
        self.counters[f"{self.stage}/out_{table}"] += rows.num_rows

    def reject(self, rule: str, *, image_url: str | None = None, page_url: str | None = None,
               text: str | None = None, detail: str | None = None) -> None:
        """Record a dropped row with the reason `STAGE/RULE` (or `rule` itself when it holds a
        slash); ValueError when the reason is not registered in `lait.reasons`."""
        reason = rule if "/" in rule else f"{self.stage}/{rule}"
        self.parts.reject(reason, self.partition, image_url=image_url, page_url=page_url, text=text,
                          detail=detail)
        self.counters[reason] += 1

    def flush(self) -> None:
        """Write the rows buffered so far out now (a stage that changed the memory settings for
        its work writes its last row groups under them)."""
        self.parts.flush()

    def writing_behind(self, executor: ThreadPoolExecutor | None = None) -> contextlib.AbstractContextManager[None]:
        """A block inside which output row groups are written on a helper thread while the task
        goes on (`PartitionedWriter.writing_behind`; `executor`: a `lait.writers.helper_thread`
        to share): for a task whose own work also runs without the GIL (stage 2's decoding).
        The parts' bytes are the same."""
        return self.parts.writing_behind(executor)

    def record_file(self, name: str, size: int, sha256: str, mtime_ns: int | None = None) -> None:
        """A file this task wrote besides its parts (a shard's tar), by its name in the stage's
        output folder: its size, modification time (local files) and digest go into the task's
        marker, so that a rerun and `lait status` notice any change (`file_change`) and `lait
        verify` reads every byte back."""
        self.files[name] = {"bytes": int(size), "sha256": sha256}
        if mtime_ns is not None:
            self.files[name]["mtime_ns"] = int(mtime_ns)

    def count(self, name: str, n: int = 1) -> None:
        self.counters[name if "/" in name else f"{self.stage}/{name}"] += n

    def close(self) -> dict[str, Any]:
        """Finish every output part; returns the task's stats."""
        outputs = self.parts.close()
        stats = {"stage": self.stage, "partition": self.partition, "outputs": outputs,
                 "counters": dict(sorted(self.counters.items()))}
        if self.files:
            stats["files"] = dict(sorted(self.files.items()))
        return stats

    def abort(self) -> None:
        self.parts.abort()


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
