"""The step contract: a stage processes one input partition; filters answer keep-or-reason.

A `Stage` is a picklable object (its config plus code) that every executor calls through
`lait.stage.run_part`. Inside `Stage.process` it reads its input partition and writes
through a `PartContext`, which owns the output parts, the `rejected/` part and the counters,
so every stage gets atomic outputs, reasons for every drop and a stats funnel for free.

A row is dropped in one of two ways, both ending in `PartContext.reject` with a reason
registered in `lait.reasons`: the first of a list of `Filter`s that drops a record
(`first_rejection`, which reads every `keep` result the one way and names the rule as a `Drop`),
or, for a rule that is not a test of one record, a call to `reject` (deep inside a decoder, a
`Rejected` exception carries the rule up to the loop that calls it).
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

import pyarrow as pa

from lait import storage
from lait.fingerprint import NEW, Fingerprint, RunPlan, global_step_cause, plan_run
from lait.memory import apply_memory_settings, release_free_memory
from lait.parts import PartitionedWriter, WorkDir
from lait.storage import Location
from lait.writers import PartWriter

log = logging.getLogger(__name__)

KeepResult = bool | tuple[bool, str] | tuple[bool, str, str]


class Filter(ABC):
    """A rule that keeps a record or names why it drops it.

    `keep` returns True, or `(False, detail)`; `first_rejection` reads it, and the stage records
    the drop as `STAGE/NAME` with the detail (`PartContext.reject`). A filter whose one test
    tells several rules apart (stage 2's fetch status, its sniffing of the bytes) lists them in
    `rules` and returns `(False, detail, rule)`.
    """

    name: ClassVar[str]
    rules: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    def keep(self, record: Any) -> KeepResult: ...


class RegexFilter(Filter):
    """A rule that drops a record whose text matches `pattern`; the detail is the match (its
    first `detail_chars` characters when set). `text_of` picks the text (default: `.text`)."""

    pattern: ClassVar[re.Pattern[str]]
    detail_chars: ClassVar[int | None] = None

    def text_of(self, record: Any) -> str:
        return record.text

    def surely_kept(self, text: str) -> bool:
        """Whether `text` cannot match, known without the pattern (a cheaper pre-check a rule
        may define; by default the pattern always decides)."""
        return False

    def keep(self, record: Any) -> KeepResult:
        text = self.text_of(record)
        if self.surely_kept(text):
            return True
        m = self.pattern.search(text)
        return m is None or (False, m.group(0)[: self.detail_chars])


class Drop(NamedTuple):
    """Why a record is dropped: the rule (a `Filter`'s name, or one of its `rules`) and the detail."""

    rule: str
    detail: str | None


def read_verdict(result: KeepResult) -> tuple[bool, str | None, str | None]:
    """A `Filter.keep` result as (kept, detail, rule): True, False, a `(kept, detail)` pair, or
    `(False, detail, rule)` of a filter with several `rules` (else the rule is None)."""
    if isinstance(result, tuple):
        return bool(result[0]), result[1], result[2] if len(result) > 2 else None
    return bool(result), None, None


def first_rejection(filters: Sequence[Filter], record: Any) -> Drop | None:
    """Why the first filter that drops `record` drops it; None when every filter keeps it."""
    for f in filters:
        kept, detail, rule = read_verdict(f.keep(record))
        if not kept:
            return Drop(rule or f.name, detail)
    return None


class Rejected(Exception):
    """A record dropped deep inside a step; the loop over records passes `rule` and `detail`
    to `PartContext.reject`."""

    def __init__(self, rule: str, detail: str = ""):
        super().__init__(f"{rule}: {detail}")
        self.rule = rule
        self.detail = detail


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
