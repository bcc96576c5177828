"""What every stage driver shares: the work directory with a clear error, and a stage run with
the executor its config names."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lait import storage
from lait.config import Config, ConfigError, StageConfig
from lait.executor import executor_for
from lait.lock import locked
from lait.stage import RunReport, Stage
from lait.workdir import WorkDir

log = logging.getLogger(__name__)


def open_work_dir(root: str, *, create: bool = False, n_partitions: int | None = None,
                  initialized: bool = True) -> WorkDir:
    """The work directory of a command, or a ConfigError that says what is wrong with it.

    `create` makes it (crawl, ingest); otherwise it must exist and hold `lait.json` (unless
    `initialized` is False): a command given an empty folder, or a table folder such as
    WORK/images_ok, is refused here, before it writes its lock or `_configs/` into it.
    Storage failures (no such bucket, no credentials, s3fs missing) become errors with the
    location in the message instead of tracebacks.
    """
    try:
        work = WorkDir(root, n_partitions=n_partitions)
        if create:
            if not work.is_initialized() and _work_dir_above(work) is not None:
                raise _not_a_work_dir(work)  # a table folder must not become a work directory
            try:
                return work.init()
            except FileNotFoundError as exc:
                if work.remote:  # S3 answers NoSuchBucket, which s3fs raises as FileNotFoundError
                    raise ConfigError(f"bucket not found: {work.root.bucket} (create it first): {exc}") from None
                raise
        if not work.exists():
            if work.remote and not storage.exists(work.root.bucket):
                raise ConfigError(f"bucket not found (or not accessible): {work.root.bucket}")
            raise ConfigError(f"work directory not found: {work.root}")
        if initialized and not work.is_initialized():
            raise _not_a_work_dir(work)
        return work
    except ConfigError:
        raise
    except ValueError as exc:  # partition count, bad URL or LAIT_STORAGE_OPTIONS
        raise ConfigError(str(exc)) from None
    except (ImportError, NotImplementedError) as exc:  # s3fs not installed, unsupported protocol
        raise ConfigError(str(exc)) from None
    except OSError as exc:  # permissions, a full disk; s3fs turns S3 errors into OSError too
        raise ConfigError(f"cannot open work directory {root}: {type(exc).__name__}: {exc}") from None
    except Exception as exc:
        if not storage.is_remote_url(root):
            raise
        # botocore's own errors: no credentials, endpoint unreachable, ...
        raise ConfigError(f"cannot open work directory {root}: {type(exc).__name__}: {exc}") from None


def _work_dir_above(work: WorkDir) -> Path | None:
    """The work directory `work` lies inside (a table folder such as WORK/images_ok), if any."""
    if work.remote:
        return None
    return next((p for p in list(work.root.resolve().parents)[:3] if WorkDir(p).is_initialized()), None)


def _not_a_work_dir(work: WorkDir) -> ConfigError:
    above = _work_dir_above(work)
    hint = (f"; it is inside the work directory {above}: give that one" if above else
            " (lait crawl, ingest-warc and download make work directories)")
    return ConfigError(f"not a lait work directory (no lait.json): {work.root}{hint}")


def run_stage(stage: Stage, cfg: StageConfig, command: str) -> RunReport:
    """The one launcher: run a stage over the work directory with the executor the config
    names, holding the directory's lock, and record the run's settings and what it redid
    (the directory is the stage's own `workspace` where it names one: `lait select`'s).

    In order: `stage.preflight` (checks before anything is written), the executor's run inside
    `stage.running()` (the stages of `stage.before()`, its global steps, then its partitions),
    and, when every partition succeeded, `stage.after_steps` (global work over whole tables, and
    any stage it runs, on the same executor settings). Returns the stage's report; the lines
    `preflight` returned come first in its `plan`."""
    own = stage.workspace(cfg, command)
    with own if own is not None else locked_work_dir(cfg.work, command) as work:
        said = stage.preflight(work) or []
        with stage.running():
            report = stage_executor(stage, cfg).run(stage, work)
        report.plan[:0] = said
        reports = [report]
        if report.ok:
            def run(other: Stage, workers: int | None = None) -> RunReport:
                return stage_executor(other, cfg, workers=workers).run(other, work)

            reports += stage.after_steps(work, report, run)
        record_run(work, command, cfg, reports)
    return report


@contextlib.contextmanager
def locked_work_dir(root: str, command: str) -> Iterator[WorkDir]:
    """The work directory `root` (`open_work_dir`), its lock held for `lait COMMAND`."""
    work = open_work_dir(root)
    with locked(work, f"lait {command}"):
        yield work


def stage_executor(stage: Stage, cfg: StageConfig, workers: int | None = None) -> Any:
    """The executor the config names, for `stage` (with `workers` instead of the config's). A
    stage whose workers run torch says so (`spawn_workers`) and gets spawned local workers: a
    child forked from a process whose torch (OpenMP) thread pool is up can hang in its first
    parallel region."""
    spawn = cfg.executor == "local" and getattr(stage, "spawn_workers", False)
    return executor_for(cfg, **({"start_method": "spawn"} if spawn else {}), **({"workers": workers} if workers else {}))


def record_run(work: WorkDir, command: str, cfg: Config, reports: list[RunReport]) -> None:
    """`_configs/`: the run's settings in the history with what it redid and why; as the
    directory's current settings only when every partition ended up made with them."""
    ok = all(r.ok for r in reports)
    redone = {"redone": {r.stage: len(r.done) for r in reports}, "why": [line for r in reports for line in r.plan],
              "complete": ok}
    failed = {r.stage: sorted(r.failed) for r in reports if r.failed}
    if failed:
        redone["failed"] = failed
    work.write_config(command, cfg.to_yaml(), latest=ok, redone=redone)
