"""Executors: run a stage over partitions. Every executor calls the same `lait.stage.run_part`
and reports in a `lait.stage.RunReport`; this one runs them in a local process pool, and
`make_executor` picks it or the Ray executor (`lait.ray_executor`) by name.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import traceback
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from lait import errors, lifeline
from lait.config import ConfigError
from lait.fingerprint import Fingerprint
from lait.log import progress
from lait.stage import RunReport, Stage, merge_before, run_part, start_report
from lait.workdir import WorkDir

log = logging.getLogger(__name__)


def _format_exc(exc: BaseException) -> str:
    if isinstance(exc, errors.NoRetry):  # its message says all: the file and what is wrong with it
        return str(exc)
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


def _short(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, errors.NoRetry) else repr(exc)


class LocalExecutor:
    """Runs partitions in a local process pool; the embedded default.

    Finished partitions are skipped; a failing partition is retried `retries` times and then
    reported by number while every other partition still completes. A worker that dies
    (killed, out of memory) breaks the pool: the pool is rebuilt and the partitions it was
    running are retried. With `workers=1` partitions run in this process, in order.
    """

    def __init__(self, workers: int | None = None, retries: int = 2, *, show_progress: bool = True,
                 start_method: str = "fork", force: bool = False):
        self.workers = max(1, workers or os.cpu_count() or 1)
        self.retries = retries
        self.show_progress = show_progress
        self.start_method = start_method
        self.force = force

    def run(self, stage: Stage, work: WorkDir | str, partitions: Sequence[int] | None = None) -> RunReport:
        work = work if isinstance(work, WorkDir) else WorkDir(work)
        work.clean_temp()
        before = [self.run(pre, work, partitions) for pre in stage.before()]
        report, plan = start_report(stage, work, partitions, force=self.force)
        merge_before(report, before)
        pending = plan.pending
        bar = progress(total=len(pending), desc=stage.name, unit="part", disable=not self.show_progress)
        try:
            if self.workers == 1 or len(pending) <= 1:
                self._run_inline(stage, work.url, pending, plan.fingerprints, report, bar)
            else:
                self._run_pool(stage, work.url, pending, plan.fingerprints, report, bar)
        finally:
            bar.close()
        return report.finish()

    def _record(self, report: RunReport, p: int, stats: dict[str, Any], bar: Any) -> None:
        report.done.append(p)
        report.stats.append(stats)
        bar.update(1)

    def _run_inline(self, stage: Stage, root: str, pending: list[int], fingerprints: dict[int, Fingerprint],
                    report: RunReport, bar: Any) -> None:
        for p in pending:
            for attempt in range(self.retries + 1):
                try:
                    self._record(report, p, run_part(stage, root, p, fingerprints[p]), bar)
                    break
                except Exception as exc:  # one bad partition must not stop the others
                    stop = errors.stop_error(exc)
                    if stop is not None:  # a full disk: every other partition would fail too
                        raise stop from exc
                    log.warning("%s partition %05d attempt %d failed: %s", stage.name, p, attempt + 1, _short(exc))
                    if attempt == self.retries or not errors.retryable(exc):
                        report.failed[p] = _format_exc(exc)
                        bar.update(1)
                        break

    def _run_pool(self, stage: Stage, root: str, pending: list[int], fingerprints: dict[int, Fingerprint],
                  report: RunReport, bar: Any) -> None:
        attempts = dict.fromkeys(pending, 0)
        queue = list(pending)
        ctx = multiprocessing.get_context(self.start_method)
        while queue:
            with ProcessPoolExecutor(self.workers, mp_context=ctx, **lifeline.pool_kwargs()) as pool:
                futures: dict[Future, int] = {}
                broken = False
                while (queue or futures) and not broken:
                    while queue and len(futures) < 2 * self.workers:
                        p = queue.pop(0)
                        futures[pool.submit(run_part, stage, root, p, fingerprints[p])] = p
                    finished, _ = wait(futures, return_when=FIRST_COMPLETED)
                    for fut in finished:
                        p = futures.pop(fut)
                        try:
                            self._record(report, p, fut.result(), bar)
                        except BrokenProcessPool as exc:
                            broken = True
                            self._retry_or_fail(stage, p, exc, attempts, queue, report, bar)
                        except Exception as exc:
                            stop = errors.stop_error(exc)
                            if stop is not None:  # a full disk: stop every worker, retry nothing
                                pool.shutdown(wait=True, cancel_futures=True)
                                raise stop from exc
                            self._retry_or_fail(stage, p, exc, attempts, queue, report, bar)
                if broken:
                    # Every partition in flight died with the pool; retry them in a new one.
                    for p in futures.values():
                        self._retry_or_fail(stage, p, BrokenProcessPool("worker died"), attempts, queue, report, bar)
                    log.warning("%s: a worker process died; restarting the pool", stage.name)
                    pool.shutdown(wait=False, cancel_futures=True)

    def _retry_or_fail(self, stage: Stage, p: int, exc: BaseException, attempts: dict[int, int],
                       queue: list[int], report: RunReport, bar: Any) -> None:
        attempts[p] += 1
        log.warning("%s partition %05d attempt %d failed: %s", stage.name, p, attempts[p], _short(exc))
        if attempts[p] > self.retries or not errors.retryable(exc):
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


def executor_for(cfg: Any, **overrides: Any) -> Any:
    """The executor a command's config names (`lait.config.StageConfig`: executor, ray_address,
    workers, retries, progress, force), for every command that runs a stage; `overrides` are
    the few things a command decides itself (scoring's spawned workers)."""
    kwargs: dict[str, Any] = {"workers": cfg.workers or None, "retries": cfg.retries, "show_progress": cfg.progress,
                              "force": cfg.force, "ray_address": cfg.ray_address}
    kwargs.update(overrides)
    try:
        return make_executor(cfg.executor, **kwargs)
    except ValueError as exc:  # an unknown --executor
        raise ConfigError(str(exc)) from None
