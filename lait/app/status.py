"""`lait status WORK`: what each stage has done, what is stale and why, and the rows of each table.

First stage 1 (the crawl, or the archive ingest or URL-list download that stands in for it):
what it fetched, where from, and whether it is known to have finished; a crawl has no
partitions to compare (it resumes from what it stored), so its line counts rows instead. Then
for every stage of `lait run` (filter, clean, score, build) it compares each partition's
completion marker with the fingerprint the partition would have now (`lait.fingerprint`):
settings from `--config pipeline.yaml` when given (to ask "what would this change redo?"; a
stage it has no section for keeps its recorded settings, as in `lait run`), else those the
stage last ran with (`WORK/_configs/STAGE.yaml`), else the defaults. A stage
whose input comes from a stage with work left is marked as waiting on it: its own input will
change when that one runs. `lait run` prints the same view before it starts.
"""

from __future__ import annotations

import argparse
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from lait.config import Config, ConfigError

# Which stages write the tables each stage reads (the crawl and ingest write pages/ and images/).
UPSTREAM = {"crawl": (), "filter": (), "clean": (), "score": ("filter", "clean"), "build": ("filter", "score")}
TABLES = ("pages", "url_list", "warc_links", "images", "images_ok", "candidates", "scored", "image_embs",
          "near_dups", "pool", "build_plan", "faces", "doc_pages", "doc_sims", "rejected")


@dataclass
class StageStatus:
    """One stage's partitions: done and current, stale (with why), never done."""

    name: str
    total: int = 0
    current: int = 0
    stale: Counter = field(default_factory=Counter)  # why -> partitions
    todo: int = 0
    waits_on: list[str] = field(default_factory=list)
    note: str = ""
    partitioned: bool = True  # False: a stage whose line counts rows, not partitions (the crawl)

    @property
    def has_work(self) -> bool:
        return bool(self.stale or self.todo)

    def line(self) -> str:
        why = "; ".join(f"{w} ({n})" for w, n in self.stale.most_common())
        if self.waits_on:
            why = "; ".join(filter(None, [why, f"waits on {' and '.join(self.waits_on)}"]))
        if self.note:
            why = "; ".join(filter(None, [why, self.note]))
        if not self.partitioned:
            return f"{self.name:<8} {'-':>10} {'-':>6} {'-':>6} {'-':>6}  {why}".rstrip()
        return (f"{self.name:<8} {self.total:>10} {self.current:>6} {sum(self.stale.values()):>6} "
                f"{self.todo:>6}  {why}").rstrip()


def stage_configs(work: str, sections: dict[str, dict] | None) -> dict[str, Config]:
    """Each stage's config: the pipeline section when given, else the settings of its last
    complete run recorded in `_configs/`, else its defaults."""
    from lait import storage
    from lait.app.steps import STEPS
    from lait.workdir import WorkDir

    root = WorkDir(work).root
    out = {}
    for step in STEPS:
        cls = step.config_class()
        if sections is not None:
            data = dict(sections.get(step.name, {}))
        else:
            path = root / "_configs" / f"{step.name}.yaml"
            data = _yaml(storage.read_text(path)) if storage.exists(path) else {}
        data["work"] = work
        known = {f.name for f, _ in cls._fields()}
        out[step.name] = cls.from_dict({k: v for k, v in data.items() if k in known}, where=f"{step.name} settings")
    return out


def _yaml(text: str) -> dict[str, Any]:
    import yaml

    data = yaml.safe_load(text) or {}
    return data if isinstance(data, dict) else {}


def _stage_status(name: str, stage: Any, work: Any) -> StageStatus:
    from lait.fingerprint import NEW, plan_run

    plan = plan_run(stage, work)
    causes = {p: plan.causes[p] for p in plan.pending}
    for pre in stage.before():  # a pass the stage runs first (stage 3's parse of the pages)
        pre_plan = plan_run(pre, work)
        for p in pre_plan.pending:
            causes.setdefault(p, pre_plan.causes[p])
    total = len(set(plan.current) | set(causes))
    st = StageStatus(name, total=total, current=len(set(plan.current) - set(causes)))
    for why in causes.values():
        if why == NEW:
            st.todo += 1
        else:
            st.stale[why] += 1
    return st


def _crawl_status(work: Any) -> StageStatus:
    """Stage 1: rows fetched, requests refused, and which command wrote them."""
    import json

    from lait import storage

    st = StageStatus("crawl", partitioned=False)
    pages = work.count("pages") if work.part_files("pages") else 0
    images = work.count("images") if work.part_files("images") else 0
    if not pages and not images and not work.part_files("url_list") and not work.part_files("warc_links"):
        st.todo, st.note = 1, "nothing fetched yet: lait crawl, lait ingest-warc or lait download"
        return st
    refused = 0
    for f in work.part_files("rejected"):
        reasons = storage.parquet_file(f).read(columns=["reason"]).column(0).to_pylist()
        refused += sum(r.startswith(("crawl/", "ingest/", "download/")) for r in reasons)
    root = work.root
    how = []
    demo = root / "_done" / "demo_crawl.json"
    if storage.exists(demo):
        seconds = json.loads(storage.read_text(demo)).get("seconds")
        how.append("lait demo's crawl, finished" + (f" in {seconds:g} s" if seconds is not None else ""))
    elif storage.exists(root / "_configs" / "crawl.yaml"):
        how.append("lait crawl (run it again to resume or extend)")
    archives = [p for p in storage.list_dir(root / "_done" / "ingest-warc") if p.name.endswith(".json")] \
        if storage.exists(root / "_done" / "ingest-warc") else []
    if archives:
        how.append(f"lait ingest-warc: {len(archives)} archive{'s' if len(archives) != 1 else ''} done")
    if storage.exists(root / "_configs" / "download.yaml"):
        how.append("lait download")
    st.note = "; ".join([f"{pages:,} pages and {images:,} images fetched, {refused:,} refused or skipped"] + how)
    return st


def _build_status(work: Any, cfg: Any) -> StageStatus:
    from lait.build.pipeline import build_record, fingerprint, rebuilding, shard_pass
    from lait.fingerprint import cause

    st = StageStatus("build", total=1)
    record = build_record(work)
    done = record is not None and work.is_done("build_plan", 0) and bool(work.markers("build_shards"))
    if not work.part_files("scored"):
        st.todo, st.note = 1, "no scored/ yet"
        return st
    if rebuilding(work):
        return _rebuild_status(work, st)
    if not done:
        st.todo = 1
        return st
    old = record.get("fingerprint")
    why = cause(old if isinstance(old, dict) else None, fingerprint(work, cfg))
    if not why:  # a shard cut, replaced or removed since the build finished it
        shards = shard_pass(work)
        why = next(filter(None, (shards.changed_output(work, m) for m in work.markers(shards.name).values())), None)
    if why:
        st.stale[why] += 1
    else:
        st.current = 1
    shards = len(work.markers("build_shards"))
    st.note = f"{shards} shard{'s' if shards != 1 else ''}"
    return st


def _rebuild_status(work: Any, st: StageStatus) -> StageStatus:
    """A rebuild that has not finished: the shards it staged in shards.next/ (their markers),
    and the earlier set still shipped in shards/, checked against the records the staging flag
    kept of it."""
    from lait.build.pipeline import LIVE, live_files, shard_pass
    from lait.stage import file_change

    live = live_files(work)
    stage = shard_pass(work)
    staged = len(work.markers(stage.name))
    planned = len(stage.partitions(work)) if work.is_done("build_plan", 0) else "?"
    why = [f"rebuild unfinished: {staged} of {planned} shards in shards.next/, `lait build` goes on"]
    for name, rec in live.items():
        if problem := file_change(work.root / LIVE, name, rec):
            why.append(f"{LIVE}/{name} {problem}")
            break
    st.stale["; ".join(why)] += 1
    st.note = f"{len(live)} shard{'s' if len(live) != 1 else ''} of the earlier build in shards/"
    return st


def gather(work_url: str, sections: dict[str, dict] | None = None) -> list[StageStatus]:
    """The status of every stage of `lait run` (see the module docstring)."""
    from lait.filters.image_stage import ImageFilterStage
    from lait.filters.text_stage import CleanStage
    from lait.scoring.stage import ScoreStage
    from lait.workdir import WorkDir

    work = WorkDir(work_url)
    configs = stage_configs(work_url, sections)
    statuses = [
        _crawl_status(work),
        _stage_status("filter", ImageFilterStage(configs["filter"]), work),
        _stage_status("clean", CleanStage(configs["clean"]), work),
        _stage_status("score", ScoreStage(configs["score"]), work),
        _build_status(work, configs["build"]),
    ]
    by_name = {s.name: s for s in statuses}
    for s in statuses:
        s.waits_on = [u for u in UPSTREAM[s.name] if by_name[u].has_work or by_name[u].waits_on]
    return statuses


def table_rows(work_url: str) -> list[tuple[str, int, int]]:
    """(table, rows, parts) of the work directory's main tables, from the Parquet footers."""
    from lait.workdir import WorkDir

    work = WorkDir(work_url)
    out = []
    for table in TABLES:
        parts = work.part_files(table)
        if parts:
            out.append((table, work.count(table), len(parts)))
    return out


def render(work_url: str, statuses: list[StageStatus], tables: list[tuple[str, int, int]]) -> str:
    lines = [f"{work_url}", f"{'stage':<8} {'partitions':>10} {'done':>6} {'stale':>6} {'to do':>6}  why"]
    lines += [s.line() for s in statuses]
    if tables:
        lines += ["", f"{'table':<12} {'rows':>10} {'parts':>6}"]
        lines += [f"{t:<12} {rows:>10,} {parts:>6}" for t, rows, parts in tables]
    return "\n".join(lines)


def status_text(work_url: str, sections: dict[str, dict] | None = None) -> str:
    return render(work_url, gather(work_url, sections), table_rows(work_url))


def run_status(args: argparse.Namespace) -> int:
    from lait.app.steps import pipeline_sections
    from lait.drivers import open_work_dir

    try:
        open_work_dir(args.work, initialized=True)
    except ConfigError as exc:
        raise ConfigError(f"{exc}; crawl into it first") from None
    # With --config, what `lait run --config` would do: a stage the file has no section for
    # continues with its recorded settings.
    sections = pipeline_sections(args.work, args.config)[0] if args.config else None
    print(status_text(args.work, sections))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add `lait status`."""
    p = sub.add_parser("status", help="what each stage has done, what is stale and why, rows per table",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="examples:\n  lait status work/\n"
                              "  lait status work/ --config pipeline.yaml   what these settings would redo")
    p.add_argument("work", metavar="WORK", help="work directory")
    p.add_argument("--config", metavar="YAML", help="pipeline YAML whose settings to compare with (default: "
                                                    "the settings each stage last ran with)")
    p.set_defaults(func=run_status)
