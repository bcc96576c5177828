"""The work directory: its layout, partitioning, reading its parts, completion markers and the
config history (its parts are written through `lait.parts.PartitionedWriter`).

Layout of a work directory::

    WORK/lait.json                     # {"partitions": N}: fixed when the directory is created
    WORK/TABLE/pPPPPP-TAG.parquet      # one part of partition PPPPP, written by TAG
    WORK/TABLE/pPPPPP-TAG.stats.json   # its stats, written together with it
    WORK/_done/STAGE/pPPPPP.json       # a task of STAGE over input partition PPPPP finished
    WORK/_configs/COMMAND.yaml         # resolved config of the last run of COMMAND

A partition of a table is the union of its parts, read in file-name order, so several writers
(crawler processes, or stage tasks that re-partition) can add to the same partition.

WORK is a local folder or an object storage URL such as `s3://bucket/prefix` (see
`lait.storage`): `WorkDir.root` is a `Path` or a `RemotePath`, and every file operation here
goes through `lait.storage`, which keeps local paths on plain os and pyarrow calls.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa
import yaml

from lait import storage
from lait.arrow_rows import (
    _rows_of,
)
from lait.errors import corrupt
from lait.schemas import get_table
from lait.storage import Location, RemotePath
from lait.writers import PartWriter, atomic_write_bytes, atomic_write_json, helper_thread, stats_path

log = logging.getLogger(__name__)

DEFAULT_PARTITIONS = 16
META_FILE = "lait.json"
_PART_RE = re.compile(r"^p(\d{5})-(.+)\.parquet$")


def partition_of(key: str, n_partitions: int) -> int:
    """Stable partition of a key (an image or page URL): the same on every machine and run."""
    digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % n_partitions


def part_name(partition: int, tag: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", tag):
        raise ValueError(f"part tag must be [A-Za-z0-9_.-]+, got {tag!r}")
    return f"p{partition:05d}-{tag}.parquet"


def schema_problem(table: str, found: pa.Schema, columns: Iterable[str] | None = None) -> str | None:
    """Why the columns of a part of `table` (its file's schema, `found`) are not the table's, or
    None: a column the table requires that the part lacks, a column of another type, a column
    named twice. A nullable column it lacks was added to the table after the part was written,
    and reads as nulls. `columns`: only these (what a reader asked for)."""
    wanted = None if columns is None else set(columns)
    for f in get_table(table).schema:
        if wanted is not None and f.name not in wanted:
            continue
        at = found.get_all_field_indices(f.name)
        if not at:
            if f.nullable:
                continue
            return f"it has no column {f.name!r}, which the {table} table requires"
        if len(at) > 1:
            return f"it has {len(at)} columns named {f.name!r}"
        if not found.field(at[0]).type.equals(f.type):
            return f"its column {f.name!r} holds {found.field(at[0]).type}, not the {f.type} of the {table} table"
    return None


def open_part(table: str, path: Location, columns: Iterable[str] | None = None) -> storage.CheckedParquetFile:
    """A part of `table` opened to be read, page checksums verified (`storage.parquet_file`);
    a part whose columns are not the table's (`schema_problem`) raises `CorruptPart` naming the
    file and the column, rather than reading nulls or text where the table has numbers."""
    pf = storage.parquet_file(path)
    problem = schema_problem(table, pf.schema_arrow, columns)
    if problem:
        raise corrupt(path, problem)
    return pf


class WorkDir:
    """A work directory: the tables of DESIGN.md as folders of Parquet parts.

    `root` is a local folder or an object storage URL (`s3://bucket/prefix`); `url` is it as a
    string, which is what executors hand to workers (a WorkDir is cheap to rebuild and holds no
    connection). Listings are never cached: other processes add parts while this one runs.
    """

    def __init__(self, root: str | os.PathLike | RemotePath, *, n_partitions: int | None = None):
        self.root = storage.location(root)
        meta = self.root / META_FILE
        if storage.exists(meta):
            stored = json.loads(storage.read_text(meta))["partitions"]
            if n_partitions is not None and n_partitions != stored:
                raise ValueError(
                    f"{self.root} was created with {stored} partitions, not {n_partitions}; "
                    "use a new work directory to change the partition count"
                )
            self.n_partitions = int(stored)
        else:
            self.n_partitions = int(n_partitions or DEFAULT_PARTITIONS)

    @property
    def url(self) -> str:
        return str(self.root)

    @property
    def remote(self) -> bool:
        return isinstance(self.root, RemotePath)

    def __repr__(self) -> str:
        return f"WorkDir({self.url!r})"

    def exists(self) -> bool:
        """Whether the directory exists (remotely: whether any object lies under its prefix)."""
        return storage.is_dir(self.root)

    def is_initialized(self) -> bool:
        """Whether the directory holds `lait.json` (made by `init`, i.e. by a crawl or ingest)."""
        return storage.exists(self.root / META_FILE)

    def init(self) -> WorkDir:
        """Create the directory and fix its partition count."""
        storage.make_dirs(self.root)
        meta = self.root / META_FILE
        if not storage.exists(meta):
            try:
                atomic_write_json(meta, {"partitions": self.n_partitions})
            except FileNotFoundError:
                # A second lait that made the directory at the same time took its lock first and
                # swept the temporary files (`clean_temp`), ours among them, after writing its
                # own lait.json: the directory is made; its lock then says who holds it.
                if not storage.exists(meta):
                    raise
        return self

    # -- parts -----------------------------------------------------------------------------
    def table_dir(self, table: str) -> Location:
        return self.root / table

    def part_path(self, table: str, partition: int, tag: str) -> Location:
        return self.table_dir(table) / part_name(partition, tag)

    def writer(self, table: str, partition: int, tag: str, **kwargs: Any) -> PartWriter:
        return PartWriter(self.part_path(table, partition, tag), get_table(table).schema, **kwargs)

    def part_files(self, table: str, partition: int | None = None) -> list[Location]:
        out = []
        for p in storage.list_dir(self.table_dir(table)):
            m = _PART_RE.match(p.name)
            if m and (partition is None or int(m.group(1)) == partition):
                out.append(p)
        return sorted(out, key=lambda p: p.name)

    def partitions(self, table: str) -> list[int]:
        """Partitions of a table that hold at least one part."""
        return sorted({int(_PART_RE.match(p.name).group(1)) for p in self.part_files(table)})

    def read(self, table: str, partition: int | None = None, columns: list[str] | None = None) -> pa.Table:
        """A partition (or the whole table) as one Arrow table, in part-name order; a part whose
        columns are not the table's raises `CorruptPart` naming it (`open_part`)."""
        schema = get_table(table).schema
        files = self.part_files(table, partition)
        if columns is not None:
            schema = pa.schema([schema.field(c) for c in columns])
        if not files:
            return schema.empty_table()
        tables = []
        for f in files:
            open_part(table, f, columns)  # its columns checked against the table's first: one footer read
            tables.append(storage.read_table(f, columns=columns, schema=schema))
        return pa.concat_tables(tables)

    def iter_rows(self, table: str, partition: int | None = None, columns: list[str] | None = None,
                  batch_size: int = 256, *, views: bool = False,
                  read_ahead: bool | int | ThreadPoolExecutor = False) -> Iterator[dict[str, Any]]:
        """Rows as dicts, streamed batch by batch so a large partition never sits in memory.

        One row group is read at a time: `ParquetFile.iter_batches` reads ahead and holds most
        of a file (a 150 MB images_ok partition whole), so memory grew with partition size.

        With `views`, binary values are read-only memoryviews into the row group's Arrow buffers
        instead of bytes copies (a row group of media is 8 MiB copied once more); a view keeps
        its row group in memory for as long as it is held, and `PartWriter` accepts it as bytes.

        With `read_ahead`, the next row group is read on a helper thread while the caller works
        through this one (Arrow reads without the GIL): for a caller whose own work also runs
        without it (stage 2's decoding). Two row groups are then held instead of one.
        `read_ahead` may be a `helper_thread` to share, else the reader starts its own; an int
        N > 1 reads the next N row groups at once, on N threads of its own."""
        groups = ((pf, i) for f in self.part_files(table, partition)
                  for pf in (open_part(table, f, columns),) for i in range(pf.num_row_groups))
        if not read_ahead:
            for pf, i in groups:
                group = pf.read_row_group(i, columns=columns)
                yield from _rows_of(group, batch_size, views)
                del group
            return
        shared = isinstance(read_ahead, ThreadPoolExecutor)
        # An int: that many row groups read ahead at once, each on its own thread (a reader
        # that must keep up with a GPU: one thread checks and copies ~1.5 GB/s).
        depth = 1 if shared or read_ahead is True else max(1, int(read_ahead))
        reader = read_ahead if shared else (helper_thread("lait-read") if depth == 1 else
                                            ThreadPoolExecutor(depth, thread_name_prefix="lait-read"))
        try:
            pending: deque = deque()
            for nxt in groups:
                pending.append(reader.submit(nxt[0].read_row_group, nxt[1], columns=columns))
                if len(pending) > depth:
                    group = pending.popleft().result()
                    yield from _rows_of(group, batch_size, views)
                    del group
            while pending:
                group = pending.popleft().result()
                yield from _rows_of(group, batch_size, views)
                del group
        finally:
            for fut in pending:
                fut.cancel()
            if not shared:
                reader.shutdown(wait=True)

    def count(self, table: str, partition: int | None = None) -> int:
        return sum(storage.parquet_file(f).metadata.num_rows for f in self.part_files(table, partition))

    def part_sizes(self, table: str) -> list[tuple[str, int]]:
        """(file name, bytes) of every part of a table, in name order."""
        return [(p.name, storage.size(p)) for p in self.part_files(table)]

    def remove_parts(self, table: str, tag: str) -> int:
        """Remove every part of a table written under `tag`, with its stats and any temporary
        files a killed writer of that tag left; returns how many parts were removed."""
        n = 0
        for p in self.part_files(table):
            if _PART_RE.match(p.name).group(2) == tag:
                storage.remove(stats_path(p))
                storage.remove(p)
                n += 1
        if not self.remote:  # object storage has no temporary files: uploads are invisible
            d = self.table_dir(table)
            if d.is_dir():
                leftover = re.compile(rf"^\.tmp-[0-9a-f]{{32}}-p\d{{5}}-{re.escape(tag)}\.(parquet|stats\.json)$")
                for p in d.iterdir():
                    if leftover.match(p.name):
                        p.unlink(missing_ok=True)
        return n

    def clean_temp(self) -> None:
        """Remove temporary files left by writers that were killed (local only: remotely an
        unfinished upload is invisible, and the bucket's lifecycle rule expires it)."""
        if self.remote or not self.root.is_dir():
            return
        for p in self.root.rglob(".tmp-*"):
            p.unlink(missing_ok=True)

    # -- task markers ----------------------------------------------------------------------
    def marker_path(self, stage: str, partition: int) -> Location:
        return self.root / "_done" / stage / f"p{partition:05d}.json"

    def is_done(self, stage: str, partition: int) -> bool:
        return storage.exists(self.marker_path(stage, partition))

    def mark_done(self, stage: str, partition: int, stats: Mapping[str, Any]) -> None:
        atomic_write_json(self.marker_path(stage, partition), dict(stats))

    def done_partitions(self, stage: str) -> set[int]:
        """Partitions of a stage whose marker exists: one listing instead of a lookup each."""
        return {int(m.group(1)) for p in storage.list_dir(self.root / "_done" / stage)
                if (m := re.fullmatch(r"p(\d{5})\.json", p.name))}

    def clear_done(self, stage: str, partition: int | None = None) -> None:
        """Remove the marker of one task of a stage, or (no partition) every marker of it."""
        if partition is None:
            storage.remove_tree(self.root / "_done" / stage)
        else:
            storage.remove(self.marker_path(stage, partition))

    def markers(self, stage: str) -> dict[int, dict[str, Any]]:
        """Every completion marker of a stage by partition (stats and fingerprint)."""
        files = sorted((p for p in storage.list_dir(self.root / "_done" / stage)
                        if re.fullmatch(r"p\d{5}\.json", p.name)), key=lambda p: p.name)
        return {int(f.name[1:6]): json.loads(b) for f, b in zip(files, storage.read_many(files))}

    def done_stats(self, stage: str) -> list[dict[str, Any]]:
        return list(self.markers(stage).values())

    # -- configs ---------------------------------------------------------------------------
    def write_config(self, command: str, text: str, *, latest: bool = True,
                     redone: Mapping[str, Any] | None = None) -> Location:
        """Record a run's resolved settings: `_configs/history/TIME-COMMAND.yaml` always, with
        what the run redid and why; `_configs/COMMAND.yaml` (the settings the data was last
        built with) only when `latest`, i.e. when the run completed."""
        now = datetime.now(timezone.utc)
        entry = f"# {command} at {now.isoformat(timespec='seconds')}\n"
        if redone is not None:
            entry += "".join(f"# {line}\n" for line in yaml.safe_dump(dict(redone), sort_keys=False).splitlines())
        stamp = now.strftime("%Y%m%dT%H%M%S.%fZ")
        atomic_write_bytes(self.root / "_configs" / "history" / f"{stamp}-{command}.yaml", (entry + text).encode())
        path = self.root / "_configs" / f"{command}.yaml"
        if latest:
            atomic_write_bytes(path, text.encode())
        return path

    def config_history(self) -> list[Location]:
        """Every recorded run, oldest first."""
        return sorted(storage.list_dir(self.root / "_configs" / "history"), key=lambda p: p.name)



def input_marker(work: WorkDir, stage: str, tag: str):
    """The completion marker of one input file (an archive, a URL list) that `stage` read."""
    return work.root / "_done" / stage / f"{tag}.json"


def input_done(work: WorkDir, stage: str, tag: str, fingerprint: dict) -> bool:
    """True when the marker of input `tag` exists and records `fingerprint` (the file unchanged)."""
    m = input_marker(work, stage, tag)
    if not storage.exists(m):
        return False
    try:
        done = json.loads(storage.read_text(m))
    except ValueError:
        return False
    return all(done.get(k) == v for k, v in fingerprint.items())
