"""`lait build`: the three passes of stage 5, resumable and deterministic.

1. `PickStage` per partition of `scored/` (executor, markers) -> `build_images/`
2. `plan_build` once, globally                     -> `pool/`, `build_plan/`, `rejected/`
3. `ShardStage` per shard (executor, markers)      -> `shards/NNNNN.tar`, `.parquet`, `_stats.json`
4. `sizes.json`, `uids.npy` and `stats.json`

A rerun skips finished work. The inputs and the content settings are fingerprinted: when
`scored/`, `images_ok/` or a setting that changes the shards differs from the last run, the
build state is cleared and rebuilt, so shards never mix two configurations.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import multiprocessing
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any, Callable

from lait import lifeline, storage
from lait.build.aggregate import EXTRA_COLUMNS, PLAN_TAG, plan_build
from lait.build.config import BuildConfig
from lait.build.pick import PickStage
from lait.build.shards import ShardStage, faces_line, finish_shard_dir, shard_files, write_stats, written_members
from lait.config import ConfigError
from lait.drivers import open_work_dir, run_stage
from lait.fingerprint import Fingerprint, global_fingerprint
from lait.stage import RunReport, run_global_step
from lait.workdir import WorkDir
from lait.writers import atomic_write_bytes, atomic_write_json, stats_path

log = logging.getLogger(__name__)

STAGES = ("build_pick", "build_plan", "build_shards")
INPUT_TABLES = ("scored", "images_ok", "near_dups", "regions", "region_labels", "url_list")
BUILD_STEP = "build"  # the global step whose marker holds the build's fingerprint and settings
# The version of the build's rules: bump it when a change of code changes what the build writes,
# so that a build made by an older lait is redone (2: the fixed sample schema, uids, the pool;
# 3: duplicates confirmed by their pixels, texts of copies rescored against the kept image;
# 4: a URL list's failed rows in the sidecars, its extra columns in the samples; 5: KEY.json's
# sha256 is the shipped bytes' digest, fetched_sha256 the fetched file's).
VERSION = 5
BUILD_TABLES = ("build_images", "build_plan", "pool", "build_failed")  # the build's own tables, cleared on a rebuild
# Up to this many images the plan runs in this process: its heap stays under a few tens of MB,
# and a child would cost more than it saves (40 ms of a 0.25 s plan of 2,000 images).
PLAN_IN_PROCESS_IMAGES = 20_000


@dataclass
class Reports:
    """The run reports of a command's passes and the stats of what it wrote."""

    reports: list[RunReport] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.reports)


@dataclass
class BuildResult(Reports):
    """What `build` did: per-pass executor reports and the dataset's counters."""

    reused: bool = False

    def summary(self) -> str:
        lines = [r.summary() for r in self.reports]
        if self.stats:
            lines.append(f"build: {self.stats.get('samples', 0)} samples in {self.stats.get('shards', 0)} shards "
                         f"({self.stats.get('shard_bytes', 0) / 1e6:.1f} MB of sample files, before tar headers)")
            counters = self.stats.get("counters", {})
            faces = faces_line(counters, self.stats.get("samples", 0))
            if faces:
                lines.append(faces)
            if "build/eval_images" in counters:
                lines.append(f"build: {counters.get('build/eval_overlap', 0)} images dropped as copies of the "
                             f"{counters['build/eval_images']} evaluation images (build/eval_overlap)")
        return "\n".join(lines)


def fingerprint(work: WorkDir, cfg: BuildConfig) -> Fingerprint:
    """The build's inputs (every part, with the digest of the task that wrote it), settings, and
    the content of the `--exclude-eval` set (`EvalSet.digest`): a changed set rebuilds."""
    fp = global_fingerprint(work, "build", cfg.content(), INPUT_TABLES, version=VERSION)
    if not cfg.exclude_eval:
        return fp
    from lait.build.decon import load_eval_set

    eval_set = load_eval_set(cfg.exclude_eval, cfg.exclude_eval_split, cfg.exclude_eval_root)
    return dataclasses.replace(fp, extra={"eval_set": eval_set.digest})


def build_record(work: WorkDir) -> dict[str, Any] | None:
    """The marker of the build's global step: the fingerprint and settings the build state was
    made with (None before any build)."""
    return work.markers(BUILD_STEP).get(0)


def reset(work: WorkDir) -> None:
    """Remove every output of an earlier build (markers, build tables, its rejects, shards)."""
    live = live_files(work)  # before the markers that hold them go
    for stage in STAGES:
        work.clear_done(stage)
    for table in BUILD_TABLES:
        storage.remove_tree(work.table_dir(table))
    for p in work.part_files("rejected"):
        tag = p.name.split("-", 1)[1].rsplit(".", 1)[0]
        if tag.startswith(("build_pick", "build_shards")) or tag == PLAN_TAG:
            storage.remove(stats_path(p))
            storage.remove(p)
    stage_rebuild(work, live)


# A rebuild writes its shards beside the set it replaces and swaps them in when complete: a
# build that fails or is killed leaves the earlier shards as they were (DESIGN.md).
LIVE, NEXT, OLD = "shards", "shards.next", "shards.old"
STAGING = "shards_staging.json"  # in _done/: a rebuild is writing into shards.next/
PLACEHOLDER = ".lait-staging"  # so that shards.next/ exists (on object storage too) before its first shard


def _staging_flag(work: WorkDir) -> storage.Location:
    return work.root / "_done" / STAGING


def stage_rebuild(work: WorkDir, live: dict[str, dict[str, Any]]) -> None:
    """Start a rebuild's staging folder when a set of shards exists to keep meanwhile; without
    one (a first build, or an earlier one removed) the shards go straight into shards/. `live`:
    what the markers recorded of the tars in shards/ (`live_files`); the staging flag keeps it,
    since the markers now describe the staged set, so `lait verify` and `lait status` still
    check the shards that are shipped until the rebuild replaces them."""
    storage.remove_tree(work.root / NEXT)
    if shard_files(work.root / LIVE):
        atomic_write_bytes(work.root / NEXT / PLACEHOLDER, b"")
        atomic_write_json(_staging_flag(work), {"folder": NEXT, "live": live})
    else:
        storage.remove(_staging_flag(work))
        storage.remove_tree(work.root / LIVE)


def rebuilding(work: WorkDir) -> bool:
    """Whether a rebuild is writing its shards into shards.next/ (and shards/ holds the last
    complete set)."""
    return storage.exists(_staging_flag(work))


def live_files(work: WorkDir) -> dict[str, dict[str, Any]]:
    """Tar name -> its record (`bytes`, `sha256`, `mtime_ns`) of every shard in shards/: from
    the shard markers, or, while a rebuild stages its own set, from the staging flag (empty for
    a flag an older lait wrote)."""
    if rebuilding(work):
        return json.loads(storage.read_text(_staging_flag(work))).get("live") or {}
    return {name: rec for _, m in sorted(work.markers(ShardStage.name).items())
            for name, rec in (m.get("files") or {}).items()}


def shard_dir(work: WorkDir) -> storage.Location:
    """Where this build writes its shards: shards.next/ during a rebuild, else shards/."""
    return work.root / (NEXT if rebuilding(work) else LIVE)


def shard_pass(work: WorkDir) -> ShardStage:
    """The shard pass as its markers describe it: what `lait status` and `lait verify` check
    the finished shards with (`Stage.changed_output`, `output_folder`)."""
    return ShardStage(out=str(shard_dir(work)))


def recover_swap(work: WorkDir) -> None:
    """Finish a swap that a kill interrupted (see `swap_in` for its steps)."""
    flag = _staging_flag(work)
    if storage.exists(flag) and not storage.is_dir(work.root / NEXT) and storage.is_dir(work.root / LIVE):
        storage.remove(flag)  # killed after the new set took its place
    if not storage.exists(flag):
        storage.remove_tree(work.root / OLD)


def swap_in(work: WorkDir) -> None:
    """A complete rebuild's shards take the place of the earlier set: shards/ -> shards.old/,
    shards.next/ -> shards/, the staging flag removed, then shards.old/ removed. A kill at any
    step is finished by `recover_swap` on the next run."""
    flag = _staging_flag(work)
    if not storage.exists(flag):
        return
    live, nxt, old = work.root / LIVE, work.root / NEXT, work.root / OLD
    if storage.is_dir(live):
        storage.remove_tree(old)
        storage.rename_tree(live, old)
    storage.rename_tree(nxt, live)
    storage.remove(flag)
    storage.remove(live / PLACEHOLDER)
    storage.remove_tree(old)


def build(cfg: BuildConfig) -> BuildResult:
    """Run stage 5 on `cfg.work` through the one launcher (`BuildStage`); returns the reports of
    the passes and the dataset counters."""
    stage = BuildStage(cfg)
    picked = run_stage(stage, cfg, "build")  # after_steps, when it runs, sets stage.result
    stage.result.reports.insert(0, picked)
    return stage.result


class BuildStage(PickStage):
    """Stage 5 as `lait.drivers.run_stage` runs it: its partitions are the pick pass's
    (`PickStage`, whose name, settings and markers it keeps); `preflight` finishes a swap a kill
    interrupted and clears a build made from other inputs or settings; `after_steps` plans once
    and writes the shards (`run_passes`), then swaps them in. `result` holds what it did."""

    def __init__(self, cfg: BuildConfig):
        self.cfg = cfg
        self.fp: Fingerprint | None = None
        self.result = BuildResult()

    def settings(self) -> dict[str, Any]:
        return {}  # the pick pass's: the build's settings are in its own fingerprint (`fingerprint`)

    def __getstate__(self) -> dict[str, Any]:  # sent to workers as the pick pass: no reports
        return {**self.__dict__, "result": BuildResult()}

    def preflight(self, work: WorkDir) -> list[str]:
        if not work.part_files("scored"):
            raise ConfigError(f"{work.root} has no scored/ table yet: run `lait score` first")
        recover_swap(work)
        self.fp = fingerprint(work, self.cfg)
        why = start_build(work, self.cfg, self.fp)
        return [why] if why else []

    def after_steps(self, work: WorkDir, report: RunReport, run: Callable[..., RunReport]) -> list[RunReport]:
        assert self.fp is not None
        self.result = run_passes(work, self.cfg, self.fp, run, picked=report)
        return self.result.reports


def start_build(work: WorkDir, cfg: BuildConfig, fp: Fingerprint) -> str | None:
    """Clear an earlier build made from other inputs or settings (`fp`; the plan is global: any
    change redoes it, and every shard after it); returns the line that says why, if any."""
    report = RunReport("build")
    run_global_step(work, fp, lambda: reset(work) or {"config": cfg.content(), "exclude_eval": eval_record(cfg)},
                    label="build", force=cfg.force, report=report)
    return report.plan[0] if report.plan else None


def eval_record(cfg: BuildConfig) -> dict[str, Any] | None:
    """What the build's record and `stats.json` say of the `--exclude-eval` set: the flags are
    not among the fingerprinted settings (the set's content is), so they are kept here."""
    if not cfg.exclude_eval:
        return None
    from lait.build.decon import load_eval_set

    eval_set = load_eval_set(cfg.exclude_eval, cfg.exclude_eval_split, cfg.exclude_eval_root)
    return {"source": cfg.exclude_eval, "splits": list(cfg.exclude_eval_split), "root": cfg.exclude_eval_root or None,
            "images": len(eval_set), "digest": eval_set.digest}


def run_passes(work: WorkDir, cfg: BuildConfig, fp: Fingerprint, run: Callable[..., RunReport],
               picked: RunReport) -> BuildResult:
    """After the pick pass (`picked`, done per partition by the launcher): plan once, then the
    shards per shard through `run` (the launcher's executor); each pass skips what is done. `fp`
    is the build's fingerprint (`fingerprint`): the plan reads the same inputs and settings.
    Returns the plan's and the shards' reports, with the stats of what was written."""
    result = BuildResult()

    plan_report = RunReport("build_plan")
    plan_fp = dataclasses.replace(fp, stage="build_plan")  # the pick pass wrote none of its inputs

    def plan() -> dict[str, Any]:
        counters = run_plan(work, cfg)
        extra = counters.pop(EXTRA_COLUMNS, [])
        return {"stage": "build_plan", "partition": 0, "counters": counters, "extra_columns": extra}

    if run_global_step(work, plan_fp, plan, label="build_plan", report=plan_report) is None:
        plan_report.skipped.append(0)
    else:
        plan_report.done.append(0)
    result.reports.append(plan_report)
    log.debug(plan_report.summary())  # printed with the others by the command

    out = shard_dir(work)
    extra = [tuple(c) for c in (work.markers("build_plan").get(0) or {}).get("extra_columns") or []]
    shards = ShardStage(cfg.image_options(), cfg.regions, out=str(out), extra_columns=extra)
    shard_report = run(shards)
    result.reports.append(shard_report)
    if not shard_report.ok:
        return result
    result.reused = all(not r.done for r in (picked, *result.reports))
    sizes = finish_shard_dir(out, cfg.image_options().encode_format, written_members(work, ShardStage.name))
    result.stats = collect_stats(work, sizes)
    write_stats(out, result.stats)
    swap_in(work)
    return result


def _plan(cfg: BuildConfig) -> dict[str, Any]:
    return plan_build(open_work_dir(cfg.work, initialized=True), cfg)


def run_plan(work: WorkDir, cfg: BuildConfig) -> dict[str, Any]:
    """`plan_build` here for a small build, in a child process for a large one; its counters.
    Either way an error comes out as one RuntimeError that names it."""
    if work.count("build_images") > PLAN_IN_PROCESS_IMAGES:
        return plan_in_child(cfg)
    try:
        return _plan(cfg)
    except Exception as exc:
        raise RuntimeError(f"build: planning failed: {type(exc).__name__}: {exc}") from exc


def plan_in_child(cfg: BuildConfig) -> dict[str, Any]:
    """`plan_build` in a forked child process; returns its counters.

    The plan is the one global step of the build: it holds every image record at once. Run in
    this process, that heap would stay mapped after the plan (freed Python objects seldom go
    back to the system) and be inherited by every shard worker forked afterwards. In a child,
    it is returned whole when the child exits, so the shard pass starts from a small parent.
    Where fork is unavailable the plan runs here.
    """
    if "fork" not in multiprocessing.get_all_start_methods():
        return _plan(cfg)
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork"), **lifeline.pool_kwargs()) as pool:
        try:
            return pool.submit(_plan, cfg).result()
        except BrokenProcessPool as exc:
            raise RuntimeError("build: the plan process died; rerun `lait build` to redo the plan") from exc
        except Exception as exc:  # the child's traceback is chained as the cause
            raise RuntimeError(f"build: planning failed: {type(exc).__name__}: {exc}") from exc


def stage_counters(work: WorkDir, stages: tuple[str, ...]) -> Counter[str]:
    """The numeric counters of every finished task of `stages`, summed."""
    counters: Counter[str] = Counter()
    for stage in stages:
        for s in work.done_stats(stage):
            counters.update({k: v for k, v in s.get("counters", {}).items() if isinstance(v, (int, float))})
    return counters


def collect_stats(work: WorkDir, sizes: dict[str, int]) -> dict[str, Any]:
    """The dataset's `stats.json`: sample and shard counts, and every build counter."""
    counters = stage_counters(work, STAGES)
    plan = work.done_stats("build_plan")
    return {
        "samples": sum(sizes.values()),
        "shards": len(sizes),
        "shard_bytes": int(counters.get("build/shard_bytes", 0)),
        "counters": dict(sorted(counters.items())),
        "config": (build_record(work) or {}).get("config"),
        "exclude_eval": (build_record(work) or {}).get("exclude_eval"),
        "plan_seconds": plan[0].get("seconds") if plan else None,
    }
