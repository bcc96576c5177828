"""The step contract: a stage processes one input partition of a table.

A `Stage` is a picklable object (its config plus code) that every executor calls through
`run_part`. Inside `Stage.process` it reads its input partition (`lait.workdir.WorkDir`) and
writes through a `lait.parts.PartContext`, which owns the output parts, the `rejected/` part and
the counters, so every stage gets atomic outputs, reasons for every drop and a stats funnel for
free. Its rules are `lait.rules.Filter`s, read by `first_rejection`; both are importable from
here too, with the rest of the contract. Global steps over whole tables run through
`run_global_step`, and `start_report` says what a run redoes and why.
"""

from __future__ import annotations

import contextlib
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from lait import storage
from lait.fingerprint import NEW, Fingerprint, RunPlan, global_step_cause, plan_run
from lait.memory import apply_memory_settings, release_free_memory

# The task's writers and the rules have modules of their own: the stage contract's names, which a
# user's stage imports from here.
from lait.parts import PartContext, task_tag  # noqa: F401
from lait.rules import Drop, Filter, KeepResult, RegexFilter, Rejected, first_rejection, read_verdict  # noqa: F401
from lait.storage import Location
from lait.workdir import WorkDir

log = logging.getLogger(__name__)

class Stage(ABC):
    """One stage of the pipeline over partitions of an input table.

    Subclasses set `name`, `input_table` and `output_tables`, keep their config in picklable
    attributes, and implement `process`. Heavy resources (models) are loaded lazily inside
    `process`, once per worker process, never in `__init__` (which runs in the driver).
    """

    name: ClassVar[str]
    input_table: ClassVar[str]
    output_tables: ClassVar[tuple[str, ...]]
    # Other tables a task reads in its own partition (stage 4 joins images_ok/ to candidates/).
    extra_inputs: ClassVar[tuple[str, ...]] = ()
    # The version of the stage's rules: bump it when a change of code changes what the stage
    # writes, so that finished partitions are redone (see `lait.fingerprint`).
    version: ClassVar[int] = 1

    def partitions(self, work: WorkDir) -> list[int]:
        return work.partitions(self.input_table)

    def input_tables(self) -> tuple[str, ...]:
        return (self.input_table, *self.extra_inputs)

    def settings(self) -> dict[str, Any]:
        """The settings that can change this stage's output: by default those of its `cfg`
        that are not marked `run` (worker counts, batch sizes, progress bars)."""
        cfg = getattr(self, "cfg", None)
        return cfg.output_settings() if cfg is not None else {}

    def global_inputs(self, work: WorkDir) -> dict[str, Any]:
        """Digests of what every task reads besides its partition (a codebook); {} by default."""
        return {}

    def before(self) -> Sequence[Stage]:
        """Stages whose tables this one reads and that every executor runs first, through itself
        and with the same partitions (stage 3 reads the page texts of its extraction pass); none
        by default. A failed partition of one of them is a failed partition of this run."""
        return ()

    def global_steps(self, work: WorkDir, *, force: bool = False, report: RunReport | None = None) -> None:
        """Steps over whole tables that every task reads (stage 3's counts of a site's texts over
        all its pages), run through `run_global_step` by every executor before it plans the
        partitions (`start_report`), so `global_inputs` sees their result; none by default."""
        return None

    # Hooks of the one launcher (`lait.drivers.run_stage`), which opens the work directory,
    # holds its lock, runs the stage on the configured executor and records the run.
    def workspace(self, cfg: Any, command: str) -> contextlib.AbstractContextManager[WorkDir] | None:
        """The directory the stage's tasks run in, held for the whole run, when it is not the
        config's work directory locked for writing (the default, None): `lait select` runs its
        shards in its output folder's `_select/`, that folder locked and the work directory it
        reads held shared."""
        return None

    def preflight(self, work: WorkDir) -> list[str] | None:
        """What must hold or be done before the partitions run (a model's weights load; stage 5
        clears a build made from other inputs), under the lock, before the executor starts.
        Returns the lines that say what it redid and why, which go first in the report's
        `plan`; nothing by default."""
        return None

    def running(self) -> contextlib.AbstractContextManager[None]:
        """What the launching process holds while the partitions run (stage 4: one decode pool
        for every partition it scores itself); nothing by default."""
        return contextlib.nullcontext()

    def after_steps(self, work: WorkDir, report: RunReport, run: Callable[..., RunReport]) -> list[RunReport]:
        """Steps over whole tables once every partition succeeded (stage 4: near-duplicates over
        all embeddings, the regions' codebook; stage 5: its plan and shards), through
        `run_global_step`; `run(stage, workers=None)` runs another stage on the launcher's
        executor. Returns the reports of the passes it ran, which the run's record lists; one
        whose failure must fail the command puts its failed partitions into `report` (or the
        command reads them); none by default."""
        return []

    def output_folder(self, work: WorkDir) -> Location | None:
        """Where the files a task records with `PartContext.record_file` live; None: it records none."""
        return None

    def changed_output(self, work: WorkDir, marker: Mapping[str, Any]) -> str | None:
        """Why a finished task's recorded files are no longer what it wrote (`file_change`), or
        None."""
        files = marker.get("files") or {}
        folder = self.output_folder(work) if files else None
        for name, rec in files.items():
            if why := file_change(folder, name, rec):
                return f"{name} {why}"
        return None

    @abstractmethod
    def process(self, ctx: PartContext) -> None: ...


def file_change(folder: Location, name: str, rec: Mapping[str, Any], *, read: bool = False) -> str | None:
    """Why the file `name` in `folder` is not the one a task recorded (`PartContext.record_file`),
    said after its name (`is missing`), or None when it is. Missing, or another size: known from
    one stat. A local file of the same
    size is hashed when its modification time is not the one recorded (or none was: a marker of
    an older lait), so a byte changed in place is caught before a run calls the task up to date,
    while a file nobody touched costs no read. On object storage an object is replaced whole,
    never changed in place, and a hash there would download every shard: the size decides.
    `read`: hash it in any case (`lait verify`)."""
    path = folder / name
    try:
        size = storage.size(path)
    except FileNotFoundError:
        return "is missing"
    if size != rec.get("bytes"):
        return f"is {size:,} bytes, not the {rec.get('bytes'):,} it was written with"
    if not read:
        if isinstance(path, storage.RemotePath):
            return None
        recorded = rec.get("mtime_ns")
        if recorded is not None and storage.mtime_ns(path) == recorded:
            return None
    if storage.sha256_of(path) != rec.get("sha256"):
        return "does not match the SHA-256 it was written with"
    return None


def run_part(stage: Stage, work_root: str, partition: int, fingerprint: Fingerprint | None = None
             ) -> dict[str, Any]:
    """Process one partition of `stage` in `work_root`; the only entry point of every executor.

    The executor decided the partition needs doing (`lait.fingerprint.plan_run`) and passes
    the fingerprint it computed; called without one, the task checks for itself and returns
    `skipped` when its marker is current. Whatever an earlier attempt left under the task's tag
    is removed first, the marker (with the fingerprint) is written last.

    `work_root` is a path or URL (`WorkDir.url`), not a WorkDir: each worker process opens its
    own, so no filesystem connection crosses a fork or a pickle."""
    apply_memory_settings()  # spawned and Ray workers start with glibc's and Arrow's defaults
    work = WorkDir(work_root)
    if fingerprint is None:
        plan = plan_run(stage, work, [partition])
        if not plan.pending:
            return {"stage": stage.name, "partition": partition, "skipped": True}
        fingerprint = plan.fingerprints[partition]
    tag = task_tag(stage.name, partition)
    work.clear_done(stage.name, partition)  # a stale marker must not outlive a failed redo
    for table in (*stage.output_tables, "rejected"):
        work.remove_parts(table, tag)
    ctx = PartContext(work, stage.name, partition, fingerprint.digest)
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
    stats["fingerprint"] = fingerprint.to_json()
    work.mark_done(stage.name, partition, stats)
    return stats


@dataclass
class RunReport:
    """What happened to each partition of a stage run."""

    stage: str
    done: list[int] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)  # up to date: nothing to redo
    failed: dict[int, str] = field(default_factory=dict)
    stats: list[dict[str, Any]] = field(default_factory=list)
    plan: list[str] = field(default_factory=list)  # what was redone and why, one line per cause

    @property
    def ok(self) -> bool:
        return not self.failed

    def finish(self) -> RunReport:
        """Order the results by partition; every executor ends with this. The summary is logged
        at debug level only: the command that ran the stage prints it, once."""
        self.done.sort()
        self.stats.sort(key=lambda s: s["partition"])
        log.debug(self.summary())
        return self

    def summary(self) -> str:
        s = f"{self.stage}: {len(self.done)} done, {len(self.skipped)} up to date, {len(self.failed)} failed"
        for p, err in sorted(self.failed.items()):
            s += f"\n  partition {p:05d} failed: {err.strip().splitlines()[-1] if err.strip() else err}"
        return s


def run_global_step(work: WorkDir, fp: Fingerprint, run: Callable[[], Mapping[str, Any] | None], *,
                    label: str, force: bool = False, report: RunReport | None = None) -> dict[str, Any] | None:
    """A step that reads whole tables at once (near-duplicates, a codebook, the build's plan),
    the one way: when `fp` differs from the fingerprint in the step's marker (`fp.stage`,
    partition 0), or with `force`, say why in one line (`LABEL: CAUSE: redoing`, into the log
    and `report.plan`), clear the marker, call `run`, and write the marker last with what `run`
    returned, the fingerprint and the seconds it took. Returns those stats; None when the step
    was current, or when `run` returned None (it made nothing: no marker, so it runs again)."""
    why = global_step_cause(work, fp, force=force)
    if why is None:
        return None
    if why != NEW:
        line = f"{label}: {why}: redoing"
        log.info(line)
        if report is not None:
            report.plan.append(line)
    work.clear_done(fp.stage, 0)
    start = time.perf_counter()
    made = run()
    if made is None:
        return None
    stats = {**made, "seconds": round(time.perf_counter() - start, 3), "fingerprint": fp.to_json()}
    work.mark_done(fp.stage, 0, stats)
    return stats


def merge_before(report: RunReport, before: Sequence[RunReport]) -> None:
    """The plan lines, task stats and failed partitions of the stages run first (`Stage.before`)
    into the report of the stage that reads them: the run failed where one of them did."""
    for pre in before:
        report.plan[:0] = pre.plan
        report.stats += pre.stats
        for p, err in pre.failed.items():
            report.failed.setdefault(p, f"{pre.stage}: {err}")


def start_report(stage: Stage, work: WorkDir, partitions: Sequence[int] | None, *,
                 force: bool = False) -> tuple[RunReport, RunPlan]:
    """What every executor does first: find the partitions to (re)do and say why, one line
    per cause (`filter: min_side 300 -> 100: redoing 16 of 16 partitions`). The stage's global
    steps run first (`Stage.global_steps`): the partitions' fingerprints hold their results."""
    report = RunReport(stage.name)
    stage.global_steps(work, force=force, report=report)
    plan = plan_run(stage, work, partitions, force=force)
    report.skipped = list(plan.current)
    report.plan += plan.lines()
    for line in plan.lines():
        log.info(line)
    if plan.current and not plan.pending:
        log.info("%s: all %d partitions up to date", stage.name, len(plan.current))
    return report, plan
