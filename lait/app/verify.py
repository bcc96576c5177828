"""`lait verify WORK`: read back everything a work directory holds and say what is damaged.

- every Parquet part of every table, each page against the checksum it was written with (parts
  written before lait kept checksums are read through, which still finds a cut or garbled file);
- every image body of `images_ok/` against the SHA-256 stage 2 recorded for it;
- every shard a build finished, against the size and SHA-256 in its task's marker; while a
  rebuild is unfinished, both the shards it staged in `shards.next/` and the earlier set still
  shipped in `shards/` (their records kept by the rebuild's staging flag);
- the tars and Parquet files of `WORK/documents/` (`lait documents`), against the sizes and
  SHA-256 digests its `stats.json` records; `lait documents` writes the folder anew.

Each problem is one line naming the file, its partition and the commands that redo it. A
part's columns are checked against its table's too (a dropped `score` column, numbers turned
text). A damaged shard is noticed by the next `lait build` itself; a damaged part is not (its
task's marker still says done), so its line names `lait verify WORK --repair` first: with
`--repair` the damaged files and the markers of the tasks that wrote them are removed, so that
the next run of that stage (or `lait run`) redoes exactly those partitions and what depends on
them. Exit 0 when everything is intact, 1 when something is not.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shlex
import sys
from dataclasses import dataclass
from typing import Any

# The command that redoes a stage's task, by the stage name its parts and markers carry.
REDO = {"filter": "lait filter", "clean_pages": "lait clean", "clean": "lait clean", "score": "lait score", "build_pick": "lait build",
        "build_shards": "lait build", "build_faces": "lait build", "clean_documents": "lait documents",
        "score_documents": "lait documents", "documents_build": "lait documents"}


@dataclass
class Damage:
    """One damaged file: where, what is wrong, and which task wrote it."""

    path: Any
    problem: str
    stage: str | None = None
    partition: int | None = None  # the writer's task (its input partition)
    # Whether the stage's next run notices the damage itself: a recorded file (a shard) is
    # compared with its task's marker. A damaged part is not (its task's marker still says
    # done): `--repair` removes both, then the stage redoes it.
    noticed: bool = False

    def line(self, root: Any, *, repaired: bool = False) -> str:
        """What is damaged and the commands that redo it, as they are typed (`repaired`: this
        run of verify removed it)."""
        name = str(self.path).removeprefix(str(root)).lstrip("/")
        m = re.match(r"p(\d{5})-", self.path.name)
        table_partition = int(m.group(1)) if m else self.partition
        where = f" (partition {table_partition:05d})" if table_partition is not None else ""
        redo = REDO.get(self.stage or "")
        work = shlex.quote(str(root))
        if not redo:
            then = (f"written by {self.stage or 'stage 1 (crawl, download, ingest-warc)'}: cannot be redone "
                    f"from the work directory; fetch it again or remove it")
        elif self.noticed:
            then = f"{redo} redoes it"
        elif repaired:
            then = f"removed with its task's marker: `{redo} {work}` redoes it"
        else:
            then = f"`lait verify {work} --repair` removes it and its task's marker, then `{redo} {work}` redoes it"
        return f"{name}{where}: {self.problem.rstrip('.')}; {then}"


def _writer_of(part: Any) -> tuple[str | None, int | None]:
    """The stage and input partition of the task that wrote a part (from its stats file)."""
    from lait import storage
    from lait.writers import stats_path

    try:
        stats = json.loads(storage.read_text(stats_path(part)))
    except (OSError, ValueError):
        return None, None
    return stats.get("stage"), stats.get("input_partition")


def check_part(work: Any, table: str, part: Any) -> tuple[str | None, int]:
    """Read one part through (and hash its image bodies in images_ok/); returns the problem or
    None, and the bytes read."""
    from lait import storage
    from lait.arrow_rows import binary_views
    from lait.errors import CorruptPart
    from lait.workdir import schema_problem

    try:
        pf = storage.parquet_file(part)
        problem = schema_problem(table, pf.schema_arrow)  # a dropped column, a number turned text
        if problem:
            return problem, storage.size(part)
        for i in range(pf.num_row_groups):
            group = pf.read_row_group(i)
            if table == "images_ok":
                bodies = group.column("bytes").combine_chunks()  # hashed as views, not copied
                for j, (body, digest) in enumerate(zip(binary_views(bodies), group.column("sha256").to_pylist())):
                    if body is not None and digest and hashlib.sha256(body).hexdigest() != digest:
                        return f"row group {i} row {j}: image bytes do not match their SHA-256", storage.size(part)
    except CorruptPart as exc:
        return exc.detail, 0
    return None, storage.size(part)


def check_files(work: Any, stage: Any) -> list[Damage]:
    """The files a stage's finished tasks recorded (a build's shards), against their markers."""
    folder = stage.output_folder(work)
    return [d for partition, marker in sorted(work.markers(stage.name).items())
            for d in check_recorded(folder, marker.get("files") or {}, stage.name, partition)]


def check_recorded(folder: Any, files: dict[str, Any], stage: str, partition: int | None) -> list[Damage]:
    """Each file of `files` (name -> record) in `folder`, read back whole (`file_change`)."""
    from lait.stage import file_change

    damaged = []
    for name, rec in files.items():
        problem = file_change(folder, name, rec, read=True)
        if problem:
            damaged.append(Damage(folder / name, problem.removeprefix("is "), stage, partition, noticed=True))
    return damaged


def check_documents(work: Any) -> tuple[list[Damage], int]:
    """WORK/documents/ (`lait documents`) against the sizes and digests its `stats.json` records;
    the damage and the number of files checked. A folder written by a lait that recorded none
    is not checked."""
    from lait import storage
    from lait.build.documents import FOLDER, TAG

    folder = work.root / FOLDER
    if not storage.is_dir(folder):
        return [], 0
    stats = folder / "stats.json"
    try:
        files = json.loads(storage.read_text(stats)).get("files")
    except FileNotFoundError:
        return [Damage(stats, "is missing", TAG, noticed=True)], 0
    except ValueError as exc:
        return [Damage(stats, f"is not valid JSON ({exc})", TAG, noticed=True)], 0
    if files is None:
        return [], 0
    return check_recorded(folder, files, TAG, None), len(files)


def verify(work: Any, *, progress: bool = True) -> tuple[list[Damage], dict[str, int]]:
    """Every damaged file of a work directory, and counts of what was checked."""
    from lait.build.pipeline import LIVE, live_files, rebuilding, shard_pass
    from lait.log import progress as bar
    from lait.schemas import TABLES

    parts = [(t, p) for t in TABLES for p in work.part_files(t)]
    damaged: list[Damage] = []
    counts = {"parts": 0, "bytes": 0, "shards": 0}
    for table, part in bar(parts, desc="verify", unit="part", disable=not progress):
        problem, size = check_part(work, table, part)
        counts["parts"] += 1
        counts["bytes"] += size
        if problem:
            damaged.append(Damage(part, problem, *_writer_of(part)))
    shards = shard_pass(work)
    counts["shards"] = sum(len(m.get("files") or {}) for m in work.markers(shards.name).values())
    damaged += check_files(work, shards)
    if rebuilding(work):  # the markers are the staged set's: the shipped one is checked too
        live = live_files(work)
        counts["staged"], counts["shards"] = counts["shards"], counts["shards"] + len(live)
        # No task of the rebuild wrote these: finishing it (`lait build`) replaces them.
        damaged += check_recorded(work.root / LIVE, live, shards.name, None)
    documents, counts["documents"] = check_documents(work)
    damaged += documents
    return damaged, counts


def repair(work: Any, damaged: list[Damage]) -> None:
    """Remove each damaged file and the marker of the task that wrote it: the next run redoes it."""
    from lait import storage
    from lait.writers import stats_path

    for d in damaged:
        if d.stage not in REDO:
            continue
        if str(d.path).endswith(".parquet") and d.stage != "build_shards":
            storage.remove(stats_path(d.path))
        storage.remove(d.path)
        if d.partition is not None:
            work.clear_done(d.stage, d.partition)


def run_verify(args: argparse.Namespace) -> int:
    from lait.drivers import open_work_dir
    from lait.lock import locked

    work = open_work_dir(args.work, initialized=True)
    with locked(work, "lait verify"):
        damaged, counts = verify(work, progress=not args.quiet)
        if damaged and args.repair:
            repair(work, damaged)
        for d in damaged:
            print(d.line(work.root, repaired=args.repair), file=sys.stderr)
        if damaged and args.repair:
            print("verify: removed the damaged files the pipeline can redo; run the commands named above",
                  file=sys.stderr)
    state = f"{len(damaged)} damaged" if damaged else "all intact"
    staged = (f" ({counts['staged']} of them staged in shards.next/ by a rebuild not finished yet: "
              f"`lait build` finishes it)") if "staged" in counts else ""
    documents = f", {counts['documents']} document files" if counts.get("documents") else ""
    print(f"verify: {counts['parts']} parts ({counts['bytes'] / 1e6:.1f} MB) and {counts['shards']} shards{staged}"
          f"{documents} read back: {state}", file=sys.stderr)
    return 1 if damaged else 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add `lait verify`."""
    p = sub.add_parser("verify", help="read back every part, image and shard; name what is damaged",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="examples:\n  lait verify work/\n"
                              "  lait verify work/ --repair     then `lait run work/` redoes what was damaged")
    p.add_argument("work", metavar="WORK", help="work directory")
    p.add_argument("--repair", action="store_true",
                   help="remove the damaged files and their tasks' markers so that the next run redoes them")
    p.set_defaults(func=run_verify)
