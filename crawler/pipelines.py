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
written out as (smaller) row groups until half of it remains. All of this is the core's
`lait.parts.RollingPartitionedWriter`; refused requests go to `rejected/` through its `reject`.
"""

from __future__ import annotations

import logging
import os
import uuid

from lait import errors
from lait.lock import locked
from lait.parts import RollingPartitionedWriter
from lait.workdir import WorkDir

# The finish reason of a crawl stopped by a full disk (its stats' `lait/stop` says where).
STOP_REASON = "disk_full"

log = logging.getLogger(__name__)


def new_run_id() -> str:
    """A tag fragment unique to one crawler process: pid and random bits."""
    return f"{os.getpid()}-{uuid.uuid4().hex[:8]}"


class PartsPipeline:
    """Writes PageItem, ImageItem and RejectedItem rows into `LAIT_OUT` (a lait work dir)."""

    def __init__(self, out: str, n_partitions: int | None, part_rows: int, part_bytes: int,
                 part_seconds: float, stats=None, buffer_bytes: int = 32 << 20, redis_url: str | None = None):
        if not out:
            raise ValueError("LAIT_OUT (the spider's `out` argument) is required")
        self.out = out
        self.redis_url = redis_url
        self.n_partitions = n_partitions
        self.part_rows = part_rows
        self.part_bytes = part_bytes
        self.part_seconds = part_seconds
        self.buffer_bytes = buffer_bytes
        self.stats = stats
        self.work: WorkDir | None = None
        self.run_id = new_run_id()
        self.parts: RollingPartitionedWriter | None = None
        self._pages_written: set[str] = set()
        self.crawler = None
        self.spider = None
        self.stopped = False  # a full disk: nothing more is written, the crawl is closing

    @classmethod
    def from_crawler(cls, crawler):
        s = crawler.settings
        parts = s.get("LAIT_PARTITIONS")
        pipe = cls(s.get("LAIT_OUT"), int(parts) if parts else None, s.getint("LAIT_PART_ROWS"),
                   s.getint("LAIT_PART_BYTES"), s.getfloat("LAIT_PART_SECONDS"), crawler.stats,
                   buffer_bytes=s.getint("LAIT_PART_BUFFER_BYTES", 32 << 20), redis_url=s.get("REDIS_URL"))
        pipe.crawler = crawler
        return pipe

    def open_spider(self, spider=None):
        self.work = WorkDir(self.out, n_partitions=self.n_partitions).init()
        # `lait crawl` holds the work directory's lock for this process; `scrapy crawl lait`
        # takes it here (WorkDirBusy stops the crawl before any request when another run holds it).
        # Crawlers sharing a Redis frontier are one crawl: they hold it shared.
        self._lock = locked(self.work, "scrapy crawl lait", shared=bool(self.redis_url))
        self._lock.__enter__()
        self.run_id = getattr(spider, "run_id", None) or self.run_id
        # Scrapy 2.13+ calls open_spider() without the spider: the crawler has it.
        self.spider = spider if spider is not None else getattr(self.crawler, "spider", None)
        lease = getattr(self.spider, "lease", None)
        if lease is not None:  # an idle crawler commits its parts, then lets its requests go
            lease.commit_parts = self._commit_for_lease
        # Small row groups: a crawler holds one open part per (table, partition).
        self.parts = RollingPartitionedWriter(
            self.work, f"crawl-{self.run_id}", part_rows=self.part_rows, part_bytes=self.part_bytes,
            part_seconds=self.part_seconds, buffer_bytes=self.buffer_bytes,
            on_event=self._on_event,
            row_group_rows=256, row_group_bytes=8 << 20, extra_stats={"writer": "crawl"})
        log.info("writing pages/ and images/ into %s (%d partitions, parts crawl-%s-*)",
                 self.out, self.work.n_partitions, self.run_id)

    def _on_event(self, event: str) -> None:
        self._inc(f"crawl/{event}")
        lease = getattr(self.spider, "lease", None)  # a Redis-shared crawl (`lait.crawler.lease`)
        if event == "all_committed" and lease is not None:
            lease.committed()

    def process_item(self, item, spider=None):
        if self.stopped:
            return item
        try:
            self._store(item)
        except Exception as exc:
            self._stop(exc)
        return item

    def _stop(self, exc: BaseException) -> None:
        """A full disk: every later write would fail too. The crawl closes with `STOP_REASON`
        and the error in its stats (`lait/stop`), and exits 1 with that one line; anything
        else is raised as before (Scrapy logs it and goes on)."""
        stop = errors.stop_error(exc)
        if stop is None:
            raise exc
        self.stopped = True
        if self.stats is not None:
            self.stats.set_value("lait/stop", str(stop))
        if self.crawler is not None and self.crawler.engine is not None:
            from scrapy.utils.defer import deferred_from_coro

            deferred_from_coro(self.crawler.engine.close_spider_async(reason=STOP_REASON))

    def _store(self, item) -> None:
        if item.table == "pages":
            # One row per page per process, whatever the scheduler does (redirects, replays).
            if item.url in self._pages_written:
                self._inc("crawl/duplicate_page_dropped")
                return
            self._pages_written.add(item.url)
        partition = self.parts.partition_of(item.key())
        if item.table == "rejected":
            self.parts.reject(item.reason, partition, page_url=item.page_url, image_url=item.image_url,
                              detail=item.detail)
        else:
            self.parts.write(item.table, partition, item.row())
        self._inc(f"crawl/rows_{item.table}")

    def commit_all(self) -> None:
        """Close every open part, so that everything written so far is durable."""
        self.parts.commit_all()

    def _commit_for_lease(self) -> bool:
        """Commit every open part for the Redis lease; False when rows may have been lost (a
        full disk), so that the requests stay held for another crawler."""
        if self.stopped:
            return False
        try:
            self.commit_all()
        except Exception as exc:
            self._stop(exc)
            return False
        return True

    def close_spider(self, spider=None):
        try:
            if not self.stopped:
                self.parts.close()
            else:
                self.parts.abort()
        except Exception as exc:
            self._stop(exc)
        finally:
            self._lock.__exit__(None, None, None)

    def _inc(self, name: str) -> None:
        if self.stats is not None:
            self.stats.inc_value(name)
