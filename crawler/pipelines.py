"""Item pipeline: spider items into partitioned, rolling, atomic Parquet parts.

Each crawler process writes its own parts, tagged ``crawl-<run id>-<seq>``, so several
processes (a Redis-shared crawl, or a resumed one) can fill the same work directory. A part is
committed (closed, renamed into place with its stats) when it reaches ``LAIT_PART_ROWS`` rows or
``LAIT_PART_BYTES`` bytes, every ``LAIT_PART_SECONDS`` seconds, and when the spider closes.
Committed parts are the crawl's checkpoint: a process killed with SIGKILL loses only the rows of
its open parts, and a restarted crawl (see `lait.crawler.spiders.lait`) fetches those again.

Rows wait in their part's buffer until a row group fills (256 rows or 8 MiB). One part is open
per (table, partition), so without a shared limit the buffers could hold 8 MiB times twice the
partitions; ``LAIT_PART_BUFFER_BYTES`` caps them all together: past it, the fullest buffers are
written out as (smaller) row groups until half of it remains.
"""

from __future__ import annotations

import logging
import os
import time
import uuid

from lait.parts import PartWriter, WorkDir, partition_of

log = logging.getLogger(__name__)


def new_run_id() -> str:
    """A tag fragment unique to one crawler process: pid and random bits."""
    return f"{os.getpid()}-{uuid.uuid4().hex[:8]}"


class PartsPipeline:
    """Writes PageItem, ImageItem and RejectedItem rows into `LAIT_OUT` (a lait work dir)."""

    def __init__(self, out: str, n_partitions: int | None, part_rows: int, part_bytes: int,
                 part_seconds: float, stats=None, buffer_bytes: int = 32 << 20):
        if not out:
            raise ValueError("LAIT_OUT (the spider's `out` argument) is required")
        self.out = out
        self.n_partitions = n_partitions
        self.part_rows = part_rows
        self.part_bytes = part_bytes
        self.part_seconds = part_seconds
        self.buffer_bytes = buffer_bytes
        self._buffered = 0  # an upper bound of the open writers' buffered bytes
        self.stats = stats
        self.work: WorkDir | None = None
        self.run_id = new_run_id()
        self._seq = 0
        self._writers: dict[tuple[str, int], tuple[PartWriter, list[int]]] = {}
        self._last_commit = time.monotonic()
        self._pages_written: set[str] = set()

    @classmethod
    def from_crawler(cls, crawler):
        s = crawler.settings
        parts = s.get("LAIT_PARTITIONS")
        return cls(s.get("LAIT_OUT"), int(parts) if parts else None, s.getint("LAIT_PART_ROWS"),
                   s.getint("LAIT_PART_BYTES"), s.getfloat("LAIT_PART_SECONDS"), crawler.stats,
                   buffer_bytes=s.getint("LAIT_PART_BUFFER_BYTES", 32 << 20))

    def open_spider(self, spider=None):
        self.work = WorkDir(self.out, n_partitions=self.n_partitions).init()
        self.run_id = getattr(spider, "run_id", None) or self.run_id
        log.info("writing pages/ and images/ into %s (%d partitions, parts crawl-%s-*)",
                 self.out, self.work.n_partitions, self.run_id)

    def process_item(self, item, spider=None):
        if item.table == "pages":
            # One row per page per process, whatever the scheduler does (redirects, replays).
            if item.url in self._pages_written:
                self._inc("crawl/duplicate_page_dropped")
                return item
            self._pages_written.add(item.url)
        partition = partition_of(item.key(), self.work.n_partitions)
        writer, counts = self._writer(item.table, partition)
        row = item.row()
        writer.write(row)
        size = sum(len(v) for v in row.values() if isinstance(v, (bytes, str)))
        counts[0] += 1
        counts[1] += size
        self._inc(f"crawl/rows_{item.table}")
        if counts[0] >= self.part_rows or counts[1] >= self.part_bytes:
            self._commit(item.table, partition)
        else:
            self._buffered += size
            if self._buffered > self.buffer_bytes:
                self._flush_fullest()
        if time.monotonic() - self._last_commit >= self.part_seconds:
            self.commit_all()
        return item

    def _writer(self, table: str, partition: int) -> tuple[PartWriter, list[int]]:
        entry = self._writers.get((table, partition))
        if entry is None:
            self._seq += 1
            tag = f"crawl-{self.run_id}-{self._seq:05d}"
            # Small row groups: a crawler holds one open part per (table, partition).
            writer = self.work.writer(table, partition, tag, row_group_rows=256,
                                      row_group_bytes=8 << 20, extra_stats={"writer": "crawl"})
            entry = self._writers[(table, partition)] = (writer, [0, 0])
        return entry

    def _flush_fullest(self) -> None:
        """Bring the open writers' buffers together under half of `buffer_bytes`."""
        writers = sorted((w for w, _ in self._writers.values()), key=lambda w: w.buffered_bytes)
        total = sum(w.buffered_bytes for w in writers)
        while writers and total > self.buffer_bytes // 2:
            writer = writers.pop()
            total -= writer.buffered_bytes
            writer.flush()
            self._inc("crawl/buffer_flushes")
        self._buffered = total

    def _commit(self, table: str, partition: int) -> None:
        writer, _ = self._writers.pop((table, partition))
        stats = writer.close()
        if stats:
            self._inc("crawl/parts_committed")
            log.debug("committed %s (%d rows)", writer.path.name, stats["rows"])

    def commit_all(self) -> None:
        """Close every open part, so that everything written so far is durable."""
        for key in list(self._writers):
            self._commit(*key)
        self._buffered = 0
        self._last_commit = time.monotonic()

    def close_spider(self, spider=None):
        self.commit_all()

    def _inc(self, name: str) -> None:
        if self.stats is not None:
            self.stats.inc_value(name)
