"""What made a partition, and whether a finished partition still matches what would make it now.

A stage task's completion marker (`WORK/_done/STAGE/pPPPPP.json`) records the task's
`Fingerprint`: the stage's rules version, the settings that can change its output (not worker
counts or log levels: see `lait.config.setting(run=True)`), anything global the stage reads
(a codebook), and the input parts it read: for every input table, each part of the partition
by name, size and the fingerprint digest of the task that wrote it (from the part's stats).
Every part a task writes carries that task's digest in its stats, so a change anywhere
upstream reaches every stage after it, as `make` would: a filter partition redone with a new
`min_side` writes `images_ok` parts with a new digest, and the score partitions that read them
are stale in turn. Crawl and ingest parts are never rewritten (each has a unique name), so their
name and size say all there is.

`plan_run` compares the fingerprint each partition would have now with its marker and returns
what to do: partitions to redo grouped by cause (one line each for the user), and those that
are current. A rerun with nothing changed reads the markers and the input parts' stats and
redoes nothing.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lait import storage

if TYPE_CHECKING:
    from lait.workdir import WorkDir

_PART_RE = re.compile(r"^p(\d{5})-(.+)\.parquet$")
_STATS_SUFFIX = ".stats.json"
NEW = "new"


def digest(obj: Any) -> str:
    """A stable hex digest of a JSON-able value."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


InputPart = tuple[str, int, str | None]  # part file name, bytes, digest of the task that wrote it


@dataclass(frozen=True)
class Fingerprint:
    """Everything that decides a task's output."""

    stage: str
    version: int
    settings: dict[str, Any]
    inputs: dict[str, list[InputPart]]
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def digest(self) -> str:
        return digest([self.stage, self.version, self.settings, self.inputs, self.extra])

    def to_json(self) -> dict[str, Any]:
        return {"stage": self.stage, "version": self.version, "settings": self.settings,
                "inputs": {t: [list(p) for p in parts] for t, parts in self.inputs.items()},
                "extra": self.extra, "digest": self.digest}


def _show(value: Any) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else value
    return text if len(text) <= 40 else text[:37] + "..."


def cause(old: dict[str, Any] | None, new: Fingerprint) -> str | None:
    """Why a finished task must be redone (one short phrase), or None when it is current.

    `old` is the marker's `fingerprint` (None: a marker from a lait that kept none)."""
    if old is None:
        return "finished before lait kept fingerprints"
    if old.get("digest") == new.digest:
        return None
    reasons = []
    if old.get("version") != new.version:
        reasons.append(f"rules v{old.get('version')} -> v{new.version}")
    old_settings = old.get("settings") or {}
    changed = sorted(k for k in set(old_settings) | set(new.settings) if old_settings.get(k) != new.settings.get(k))
    if changed:
        reasons.append(", ".join(f"{k} {_show(old_settings.get(k))} -> {_show(new.settings.get(k))}" for k in changed))
    if (old.get("extra") or {}) != new.extra:
        reasons.append("changed " + ", ".join(sorted(k for k in set(old.get("extra") or {}) | set(new.extra)
                                                      if (old.get("extra") or {}).get(k) != new.extra.get(k))))
    old_inputs = {t: {tuple(p) for p in parts} for t, parts in (old.get("inputs") or {}).items()}
    new_inputs = {t: set(parts) for t, parts in new.inputs.items()}
    if old_inputs != new_inputs:
        grown = all(old_inputs.get(t, set()) <= new_inputs.get(t, set()) for t in set(old_inputs) | set(new_inputs))
        reasons.append("new input" if grown else "changed input")
    return "; ".join(reasons) or "changed fingerprint"


def input_listing(work: WorkDir, tables: Iterable[str]) -> dict[str, dict[int, list[InputPart]]]:
    """For each table, its parts by partition as (name, bytes, writer digest), read from the
    parts' stats files: one directory listing per table, one small read per part."""
    out: dict[str, dict[int, list[InputPart]]] = {}
    for table in dict.fromkeys(tables):
        files = storage.list_dir(work.table_dir(table))
        names = {p.name for p in files}
        parts = sorted((p for p in files if _PART_RE.match(p.name)), key=lambda p: p.name)
        stats_paths = [p.with_name(p.name[: -len(".parquet")] + _STATS_SUFFIX) for p in parts]
        present = [s.name in names for s in stats_paths]
        blobs = iter(storage.read_many([s for s, ok in zip(stats_paths, present) if ok]))
        by_partition: dict[int, list[InputPart]] = defaultdict(list)
        for part, ok in zip(parts, present):
            stats = json.loads(next(blobs)) if ok else {}
            size = stats.get("bytes")
            if size is None:
                size = storage.size(part)
            by_partition[int(_PART_RE.match(part.name).group(1))].append(
                (part.name, int(size), stats.get("fingerprint")))
        out[table] = dict(by_partition)
    return out


def fingerprint_of(stage: Any, partition: int, listing: dict[str, dict[int, list[InputPart]]],
                   extra: dict[str, Any]) -> Fingerprint:
    return Fingerprint(stage.name, stage.version, stage.settings(),
                       {t: listing[t].get(partition, []) for t in stage.input_tables()}, extra)


@dataclass
class RunPlan:
    """What a run of a stage over some partitions will do, and why."""

    stage: str
    total: int
    current: list[int] = field(default_factory=list)
    pending: list[int] = field(default_factory=list)
    causes: dict[int, str] = field(default_factory=dict)  # pending partition -> why
    fingerprints: dict[int, Fingerprint] = field(default_factory=dict)

    def lines(self) -> list[str]:
        """One line per cause: `filter: min_side 300 -> 100: redoing 16 of 16 partitions`."""
        by_cause: dict[str, list[int]] = defaultdict(list)
        for p in self.pending:
            by_cause[self.causes[p]].append(p)
        out = []
        for why, parts in sorted(by_cause.items(), key=lambda kv: (kv[0] != NEW, kv[0])):
            n = len(parts)
            if why == NEW:
                out.append(f"{self.stage}: {n} of {self.total} partitions to do")
            elif why in ("new input", "changed input"):
                out.append(f"{self.stage}: {n} partition{'s' if n != 1 else ''} "
                           f"{'have' if n != 1 else 'has'} {why}: redoing {n}")
            else:
                out.append(f"{self.stage}: {why}: redoing {n} of {self.total} partitions")
        return out


def plan_run(stage: Any, work: WorkDir, partitions: Sequence[int] | None = None, *,
             force: bool = False) -> RunPlan:
    """Which partitions of `stage` (a `lait.stage.Stage`) need running now, and why (see the
    module docstring)."""
    todo = sorted(stage.partitions(work) if partitions is None else partitions)
    listing = input_listing(work, stage.input_tables())
    extra = stage.global_inputs(work)
    markers = work.markers(stage.name)
    plan = RunPlan(stage.name, len(todo))
    for p in todo:
        fp = fingerprint_of(stage, p, listing, extra)
        plan.fingerprints[p] = fp
        marker = markers.get(p)
        why = NEW if marker is None else ("--force" if force else cause(marker.get("fingerprint"), fp))
        if why is None and hasattr(stage, "changed_output"):
            why = stage.changed_output(work, marker)  # a file it wrote was cut, replaced or removed
        if why is None:
            plan.current.append(p)
        else:
            plan.pending.append(p)
            plan.causes[p] = why
    return plan


def global_fingerprint(work: WorkDir, step: str, settings: dict[str, Any], tables: Sequence[str],
                       version: int = 1) -> Fingerprint:
    """The fingerprint of a step that reads whole tables at once (near-duplicates over every
    image embedding, a codebook over every region): every part of those tables."""
    listing = input_listing(work, tables)
    inputs = {t: [part for p in sorted(parts) for part in parts[p]] for t, parts in listing.items()}
    return Fingerprint(step, version, settings, inputs)


def global_step_cause(work: WorkDir, fp: Fingerprint, *, force: bool = False) -> str | None:
    """Why a global step must run now (None: its marker matches `fp`)."""
    marker = work.markers(fp.stage).get(0)
    if marker is None:
        return NEW
    return "--force" if force else cause(marker.get("fingerprint"), fp)
