"""`--retry-failed`: fetch again the images that failed for a reason that may pass.

A fetch leaves every image URL it was given with exactly one outcome: an `images/` row (its
status and `error`) or a `crawl/...` row in `rejected/`. Some outcomes say the server or the
network had a bad moment, not that the image is gone: a timeout, a refused or lost
connection, 408, 429, any 5xx, a host marked down after such failures, a robots.txt that
could not be fetched. Those are *transient* (`is_transient`); everything else is final and is
never asked for again: other 4xx, not an image, empty, `noai`, TDMRep, robots.txt refusals,
the address guard, a name that does not resolve.

A retry pass (`retry_passes`) waits, then takes the transient outcomes out of the work
directory (`clear_transient`: the parts that hold them are rewritten without them, each
atomically), then runs the same fetch again: the fetcher fetches every referenced URL with no
outcome, which are exactly the ones just taken out. So a retried URL's new outcome replaces
its failure, and every URL still ends exactly once; a pass killed after the clearing leaves
the URLs without an outcome, and the next fetch of the same command takes them up.

The wait: at least `delay` seconds after the latest transient failure, and at least until
the latest time a server asked for with `Retry-After` (the fetcher records it, see
`lait.crawler.spiders.lait`), at most `max_wait` seconds from now.

Only the fetcher's own rows are retried: rows an archive held (`ingest-warc` parts, tag
`warc-...`) are what the archive captured. `lait download` and `ingest-warc` retry the URLs
their tables reference (`url_list/`, `warc_links/`), which the fetch reads again. A crawl has
no such table: its passes (`queue=True`) first write the URLs they take out, with their
pages, into `retry_queue/`, and fetch from there; the queue is emptied once its fetch has
finished, so a pass killed in between is taken up by the next.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from lait import storage
from lait.workdir import WorkDir
from lait.writers import PartWriter, stats_path

log = logging.getLogger(__name__)

# Errors of images/ rows that a later try may not meet (`download/<error class>`: Scrapy's
# own since 2.13, Twisted's before). A name that does not resolve is not among them.
TRANSIENT_DOWNLOAD_ERRORS = frozenset({
    "download/DownloadTimeoutError", "download/DownloadConnectionRefusedError", "download/DownloadFailedError",
    "download/ResponseDataLossError",
    "download/TimeoutError", "download/TCPTimedOutError", "download/ConnectionRefusedError",
    "download/ConnectionLost", "download/ConnectionDone", "download/ConnectError",
    "download/ResponseNeverReceived", "download/ResponseFailed", "download/ConnectingCancelledError",
    "download/NoRouteError", "download/PotentialDataLoss",
})
TRANSIENT_STATUSES = frozenset({408, 429})
# rejected/ reasons of requests never sent because of earlier transient failures.
TRANSIENT_REJECTS = frozenset({"crawl/host_down", "crawl/robots_unreachable"})
# Archive rows: what the capture held, not something lait fetched.
ARCHIVE_TAG_PREFIX = "warc-"
# What decides whether a row goes (read alone: images/ parts also hold the image bytes).
_KEY_COLUMNS = {"images": ["image_url", "error"], "rejected": ["image_url", "reason"]}


def is_transient(error: str | None) -> bool:
    """Whether an images/ row's `error` may go away on another try."""
    if not error:
        return False
    if error in TRANSIENT_DOWNLOAD_ERRORS:
        return True
    for prefix in ("http_", "status_"):
        if error.startswith(prefix) and error[len(prefix):].isdigit():
            status = int(error[len(prefix):])
            return status in TRANSIENT_STATUSES or 500 <= status < 600
    return False


def is_transient_reject(reason: str | None) -> bool:
    return reason in TRANSIENT_REJECTS


@dataclass
class RetryPlan:
    """What a retry pass would take out: counts per status, and when it may start."""

    counts: Counter[str] = field(default_factory=Counter)
    last_failure: float | None = None  # epoch seconds of the latest transient images/ row

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def not_before(self, delay: float, retry_after_until: float | None = None,
                   last_fetch_end: float | None = None) -> float:
        """`delay` after the latest failure (a row's time, or the end of the fetch that left
        rows without one: a host marked down), and no earlier than `Retry-After` asked."""
        base = max(self.last_failure or 0.0, last_fetch_end or 0.0)
        return max(base + delay, retry_after_until or 0.0)

    def describe(self) -> str:
        return ", ".join(f"{k}: {v}" for k, v in sorted(self.counts.items())) or "nothing"


def _own_parts(work: WorkDir, table: str, partition: int) -> list:
    """The fetcher's parts of a partition (not an archive's)."""
    out = []
    for p in work.part_files(table, partition):
        tag = p.name[len("p00000-"):-len(".parquet")]
        if not tag.startswith(ARCHIVE_TAG_PREFIX):
            out.append(p)
    return out


class _Everything:
    """The URLs of a crawl: every one (a crawl's rows are all its own)."""

    def __contains__(self, url: object) -> bool:
        return True


def _referenced(work: WorkDir, tables: list[str], partition: int) -> set[str] | _Everything:
    if not tables:
        return _Everything()
    urls: set[str] = set()
    for t in tables:
        for row in work.iter_rows(t, partition, columns=["image_url"], batch_size=4096):
            urls.add(row["image_url"])
    return urls


def _drop_mask(table: str, keys: pa.Table, referenced) -> pa.Array:
    """True for the rows of a part to take out: transient outcomes of referenced URLs."""
    urls = keys.column("image_url").to_pylist()
    if table == "images":
        values = keys.column("error").to_pylist()
        hit = [bool(u) and u in referenced and is_transient(e) for u, e in zip(urls, values)]
    else:
        values = keys.column("reason").to_pylist()
        hit = [bool(u) and u in referenced and is_transient_reject(r) for u, r in zip(urls, values)]
    return pa.array(hit, pa.bool_())


def plan_retry(work: WorkDir, tables: list[str]) -> RetryPlan:
    """Count the transient outcomes of the URLs `tables` reference (all URLs when `tables` is
    empty: a crawl); reads only key columns."""
    plan = RetryPlan()
    for p in range(work.n_partitions):
        parts = {t: _own_parts(work, t, p) for t in ("images", "rejected")}
        if not parts["images"] and not parts["rejected"]:
            continue
        referenced = _referenced(work, tables, p)
        for table, files in parts.items():
            cols = _KEY_COLUMNS[table] + (["fetched_at"] if table == "images" else [])
            for f in files:
                keys = storage.read_table(f, columns=cols)
                mask = _drop_mask(table, keys, referenced)
                if not pc.any(mask).as_py():
                    continue
                hits = keys.filter(mask)
                col = "error" if table == "images" else "reason"
                plan.counts.update(hits.column(col).to_pylist())
                if table == "images":
                    latest = pc.max(hits.column("fetched_at")).as_py()
                    if isinstance(latest, datetime):
                        ts = latest.timestamp()
                        plan.last_failure = ts if plan.last_failure is None else max(plan.last_failure, ts)
    return plan


def _rewrite_without(table: str, path, mask: pa.Array) -> int:
    """Replace a part by itself without the masked rows (atomically; removed when empty),
    streamed a row group at a time: an images/ row group holds ~8 MiB of image bytes."""
    from lait.schemas import get_table

    keep_rows = len(mask) - pc.sum(mask).as_py()
    if keep_rows == 0:
        storage.remove(stats_path(path))
        storage.remove(path)
        return len(mask)
    old_stats = {}
    try:
        old_stats = json.loads(storage.read_text(stats_path(path)))
    except (OSError, ValueError):
        pass
    extra = {k: v for k, v in old_stats.items() if k not in ("rows", "bytes")}
    pf = storage.parquet_file(path)
    writer = PartWriter(path, get_table(table).schema, extra_stats={**extra, "retry_cleared": int(pc.sum(mask).as_py())})
    start = 0
    try:
        for i in range(pf.num_row_groups):
            group = pf.read_row_group(i)
            n = group.num_rows
            writer.write_table(group.filter(pc.invert(mask.slice(start, n))))
            start += n
        writer.close()
    except BaseException:
        writer.abort()
        raise
    return len(mask) - keep_rows


def clear_transient(work: WorkDir, tables: list[str], *, queue_tag: str | None = None) -> Counter[str]:
    """Take the transient outcomes of the URLs `tables` reference (all when empty) out of
    images/ and rejected/; returns what was taken out, per error or reason. With `queue_tag`,
    each partition's URLs and pages go into `retry_queue/` (committed) before its parts are
    rewritten. The caller holds the work directory's lock."""
    from lait.parts import PartitionedWriter

    cleared: Counter[str] = Counter()
    queue = PartitionedWriter(work, queue_tag) if queue_tag else None
    try:
        for p in range(work.n_partitions):
            parts = {t: _own_parts(work, t, p) for t in ("images", "rejected")}
            if not parts["images"] and not parts["rejected"]:
                continue
            referenced = _referenced(work, tables, p)
            hits: list[tuple[str, object, pa.Array]] = []
            for table, files in parts.items():
                col = "error" if table == "images" else "reason"
                for f in files:
                    keys = storage.read_table(f, columns=_KEY_COLUMNS[table] + ["page_url"])
                    mask = _drop_mask(table, keys, referenced)
                    if not pc.any(mask).as_py():
                        continue
                    taken = keys.filter(mask)
                    cleared.update(taken.column(col).to_pylist())
                    if queue is not None:
                        for url, page in zip(taken.column("image_url").to_pylist(),
                                             taken.column("page_url").to_pylist()):
                            queue.write("retry_queue", p, {"image_url": url, "page_url": page})
                    hits.append((table, f, mask))
            if queue is not None and hits:
                queue.commit("retry_queue", p)  # queued before the failures go
            for table, f, mask in hits:
                _rewrite_without(table, f, mask)
    except BaseException:
        if queue is not None:
            queue.abort()
        raise
    if queue is not None:
        queue.close()
    return cleared


def clear_queue(work: WorkDir) -> None:
    """Remove every part of `retry_queue/` (after a fetch of it finished)."""
    for f in work.part_files("retry_queue"):
        storage.remove(stats_path(f))
        storage.remove(f)


def outcome_counts(stats: dict[str, Any]) -> Counter[str]:
    """Outcomes of one fetch, by status, from the fetcher's counters: `ok`, `http_503`,
    `download_error`, `host_down`, ..."""
    out: Counter[str] = Counter()
    for key, value in stats.items():
        if not isinstance(value, int) or isinstance(value, bool):
            continue
        if key.startswith("crawl/image_"):
            out[key[len("crawl/image_"):]] += value
        elif key.startswith("crawl/") and key[len("crawl/"):] in {r.split("/", 1)[1] for r in TRANSIENT_REJECTS}:
            out[key[len("crawl/"):]] += value
    return out


def format_counts(counts: Counter[str]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) or "nothing"


RETRY_AFTER_KEY = "lait/retry_after_until"


def retry_passes(work: WorkDir, tables: list[str], fetch: Callable[[], dict[str, Any]], stats: dict[str, Any] | None,
                 *, passes: int, delay: float, max_wait: float, report: Callable[[str], None],
                 queue: bool = False, sleep: Callable[[float], None] = time.sleep) -> dict[str, Any] | None:
    """Up to `passes` retry passes after a first fetch whose stats are `stats`; each waits,
    clears the transient outcomes of the URLs `tables` reference and calls `fetch` again. With
    `queue` (a crawl: `tables` empty, `fetch` reads `retry_queue/`), the URLs go through
    `retry_queue/`. Returns the last fetch's stats (or `stats` when nothing was retried)."""
    from lait.crawler.run import crawl_succeeded

    if stats is not None:
        report("pass 0 (first fetch): " + format_counts(outcome_counts(stats)))
    retry_after = (stats or {}).get(RETRY_AFTER_KEY)
    last_end = time.time() if stats is not None else None
    if queue and work.part_files("retry_queue"):  # a pass that was killed: finish it first
        report("retry: fetching the URLs an interrupted pass queued")
        stats = fetch()
        if not crawl_succeeded(stats.get("finish_reason")):
            return stats
        clear_queue(work)
    for n in range(1, passes + 1):
        plan = plan_retry(work, tables)
        if plan.total == 0:
            report(f"retry pass {n}: no transient failures left")
            break
        wait = min(max_wait, max(0.0, plan.not_before(delay, retry_after, last_end) - time.time()))
        report(f"retry pass {n}: {plan.total} rows failed for a transient reason ({plan.describe()}); "
               f"fetching them again in {wait:.1f} s")
        if wait > 0:
            sleep(wait)
        clear_transient(work, tables, queue_tag=f"retry-{time.time_ns()}" if queue else None)
        stats = fetch()
        last_end = time.time()
        report(f"retry pass {n}: " + format_counts(outcome_counts(stats)))
        if not crawl_succeeded(stats.get("finish_reason")):  # stopped (Ctrl-C) or failed: no more passes
            break
        if queue:
            clear_queue(work)
        retry_after = stats.get(RETRY_AFTER_KEY)
    return stats


def retry_fetch(cfg: Any, work: WorkDir, fetch_cfg: Any, stats: dict[str, Any], *, processes: int,
                command: str) -> dict[str, Any] | None:
    """`--retry-failed` of `lait download` and `lait ingest-warc`: `retry_passes` over the
    images `fetch_cfg` fetches, each pass on the executor `cfg` names (`cfg`: a command config
    with the retry settings, `executor` and `ray_address`)."""
    from lait.crawler.run import fetch_images

    def fetch_again() -> dict[str, Any]:
        return fetch_images(fetch_cfg, processes=processes, executor=cfg.executor, ray_address=cfg.ray_address)

    return retry_passes(work, fetch_cfg.tables, fetch_again, stats, passes=cfg.retry_passes, delay=cfg.retry_delay,
                        max_wait=cfg.retry_max_wait, report=lambda line: print(f"{command}: {line}", file=sys.stderr))

