"""Executors: run a stage over partitions. Every executor calls the same `run_part`.

`run_part` is the whole unit of work: skip the partition if its completion marker exists,
otherwise remove whatever an earlier, interrupted attempt left, process it, close its parts
and write the marker last. So a killed run, rerun, ends with the output of an uninterrupted
one, and the output never depends on how many workers ran or in which order.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import time
import traceback
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any

from lait.log import progress
from lait.memory import apply_memory_settings, release_free_memory
from lait.parts import WorkDir
from lait.stage import PartContext, Stage, task_tag

log = logging.getLogger(__name__)


def run_part(stage: Stage, work_root: str, partition: int) -> dict[str, Any]:
    """Process one partition of `stage` in `work_root`; the only entry point of every executor.

    `work_root` is a path or URL (`WorkDir.url`), not a WorkDir: each worker process opens its
    own, so no filesystem connection crosses a fork or a pickle."""
    apply_memory_settings()  # spawned and Ray workers start with glibc's and Arrow's defaults
    work = WorkDir(work_root)
    if work.is_done(stage.name, partition):
        return {"stage": stage.name, "partition": partition, "skipped": True}
    tag = task_tag(stage.name, partition)
    for table in (*stage.output_tables, "rejected"):
        work.remove_parts(table, tag)
    ctx = PartContext(work, stage.name, partition)
    start = time.perf_counter()
    try:
        stage.process(ctx)
        stats = ctx.close()
    except BaseException:
        ctx.abort()
        raise
    finally:
        release_free_memory()  # the next partition of this worker starts from what is live
    stats["seconds"] = round(time.perf_counter() - start, 3)
    work.mark_done(stage.name, partition, stats)
    return stats


@dataclass
class RunReport:
    """What happened to each partition of a stage run."""

    stage: str
    done: list[int] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)
    failed: dict[int, str] = field(default_factory=dict)
    stats: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failed

    def finish(self) -> RunReport:
        """Order the results by partition and log the summary; every executor ends with this."""
        self.done.sort()
        self.stats.sort(key=lambda s: s["partition"])
        log.info(self.summary())
        return self

    def summary(self) -> str:
        s = f"{self.stage}: {len(self.done)} done, {len(self.skipped)} already done, {len(self.failed)} failed"
        for p, err in sorted(self.failed.items()):
            s += f"\n  partition {p:05d} failed: {err.strip().splitlines()[-1] if err.strip() else err}"
        return s


class StageFailed(RuntimeError):
    def __init__(self, report: RunReport):
        super().__init__(report.summary())
        self.report = report


def _format_exc(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


class LocalExecutor:
    """Runs partitions in a local process pool; the embedded default.

    Finished partitions are skipped; a failing partition is retried `retries` times and then
    reported by number while every other partition still completes. A worker that dies
    (killed, out of memory) breaks the pool: the pool is rebuilt and the partitions it was
    running are retried. With `workers=1` partitions run in this process, in order.
    """

    def __init__(self, workers: int | None = None, retries: int = 2, *, show_progress: bool = True,
                 start_method: str = "fork"):
        self.workers = max(1, workers or os.cpu_count() or 1)
        self.retries = retries
        self.show_progress = show_progress
        self.start_method = start_method

    def run(self, stage: Stage, work: WorkDir | str, partitions: Sequence[int] | None = None) -> RunReport:
        work = work if isinstance(work, WorkDir) else WorkDir(work)
        work.clean_temp()
        todo = sorted(stage.partitions(work) if partitions is None else partitions)
        report = RunReport(stage.name)
        pending = []
        done = work.done_partitions(stage.name)
        for p in todo:
            if p in done:
                report.skipped.append(p)
            else:
                pending.append(p)
        if report.skipped:
            log.info("%s: %d of %d partitions already done", stage.name, len(report.skipped), len(todo))
        bar = progress(total=len(pending), desc=stage.name, unit="part", disable=not self.show_progress)
        try:
            if self.workers == 1 or len(pending) <= 1:
                self._run_inline(stage, work.url, pending, report, bar)
            else:
                self._run_pool(stage, work.url, pending, report, bar)
        finally:
            bar.close()
        return report.finish()

    def _record(self, report: RunReport, p: int, stats: dict[str, Any], bar: Any) -> None:
        report.done.append(p)
        report.stats.append(stats)
        bar.update(1)

    def _run_inline(self, stage: Stage, root: str, pending: list[int], report: RunReport, bar: Any) -> None:
        for p in pending:
            for attempt in range(self.retries + 1):
                try:
                    self._record(report, p, run_part(stage, root, p), bar)
                    break
                except Exception as exc:  # one bad partition must not stop the others
                    log.warning("%s partition %05d attempt %d failed: %r", stage.name, p, attempt + 1, exc)
                    if attempt == self.retries:
                        report.failed[p] = _format_exc(exc)
                        bar.update(1)

    def _run_pool(self, stage: Stage, root: str, pending: list[int], report: RunReport, bar: Any) -> None:
        attempts = dict.fromkeys(pending, 0)
        queue = list(pending)
        ctx = multiprocessing.get_context(self.start_method)
        while queue:
            with ProcessPoolExecutor(self.workers, mp_context=ctx) as pool:
                futures: dict[Future, int] = {}
                broken = False
                while (queue or futures) and not broken:
                    while queue and len(futures) < 2 * self.workers:
                        p = queue.pop(0)
                        futures[pool.submit(run_part, stage, root, p)] = p
                    finished, _ = wait(futures, return_when=FIRST_COMPLETED)
                    for fut in finished:
                        p = futures.pop(fut)
                        try:
                            self._record(report, p, fut.result(), bar)
                        except BrokenProcessPool as exc:
                            broken = True
                            self._retry_or_fail(stage, p, exc, attempts, queue, report, bar)
                        except Exception as exc:
                            self._retry_or_fail(stage, p, exc, attempts, queue, report, bar)
                if broken:
                    # Every partition in flight died with the pool; retry them in a new one.
                    for fut, p in futures.items():
                        self._retry_or_fail(stage, p, BrokenProcessPool("worker died"), attempts, queue, report, bar)
                    log.warning("%s: a worker process died; restarting the pool", stage.name)
                    pool.shutdown(wait=False, cancel_futures=True)

    def _retry_or_fail(self, stage: Stage, p: int, exc: BaseException, attempts: dict[int, int],
                       queue: list[int], report: RunReport, bar: Any) -> None:
        attempts[p] += 1
        log.warning("%s partition %05d attempt %d failed: %r", stage.name, p, attempts[p], exc)
        if attempts[p] > self.retries:
            report.failed[p] = _format_exc(exc)
            bar.update(1)
        else:
            queue.append(p)


EXECUTORS = ("local", "ray")


def make_executor(name: str = "local", *, ray_address: str | None = None, **kwargs: Any) -> Any:
    """The executor named on the command line (`--executor`): same `run(stage, work)` for all."""
    if name == "local":
        return LocalExecutor(**kwargs)
    if name == "ray":
        from lait.ray_executor import RayExecutor

        return RayExecutor(address=ray_address, **kwargs)
    raise ValueError(f"unknown executor {name!r}: choose from {EXECUTORS}")
