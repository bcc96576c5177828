"""Pass 3 of `lait build` and of `lait select` (per shard): the planned samples into WebDataset tars.

Each shard is one task of the executor (its `build_plan/` partition is the shard number):
`NNNNN.tar` with `KEY.jpg` (or `.png`/`.webp`, see `build.resize`), `KEY.txt`, `KEY.json` (the
fixed schema of `build.sample`; and region arrays when stage 4 stored them), `NNNNN.parquet`, the
img2dataset-style sidecar with failed samples too, and `NNNNN_stats.json`. They appear
atomically, the tar last; the task's marker comes after, so a rerun rewrites only unfinished
shards. Bytes are read one Parquet row group at a time, in the order the plan laid them out, and
written with fixed tar metadata, so the same plan always gives byte-identical tars.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import logging
import os
import queue
import re
import sys
import tarfile
import threading
import time
from collections import Counter
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from lait import errors, storage
from lait.arrow_rows import binary_views
from lait.build.books import TYPES, type_of
from lait.build.card import CARD_FILE, REGION_MEMBERS, dataset_card, sample_schema
from lait.build.regions import RegionReader
from lait.build.resize import ImageOptions, ShardImage, exif_json, prepare, stored_format
from lait.build.sample import (
    FAILED_TO_DOWNLOAD,
    FAILED_TO_RESIZE,
    KEYS,
    REASON,
    SIDECAR,
    SUCCESS,
    PlannedSamples,
    failed_record,
    make_sample,
    read_metas,
    sample_json,
    uids_to_array,
)
from lait.memory import media_heap
from lait.parts import PartContext
from lait.stage import Stage
from lait.storage import Location
from lait.workdir import WorkDir
from lait.writers import atomic_write_bytes, atomic_write_json

log = logging.getLogger(__name__)

# Fixed metadata so that tars are reproducible byte for byte (no clock, no user names).
MTIME = 1_700_000_000

UIDS_FILE = "uids.npy"
# The columns of `build_plan/` a shard reads per sample (the others are for people and `lait select`).
PLAN_COLUMNS = ["key", "image_url", "page_url", "caption", "format", "width", "height", "src_file", "row_group",
                "row_index", "meta"]


def shard_name(shard: int) -> str:
    return f"{shard:05d}"


def _header_template() -> tuple[bytes, int]:
    head = bytearray(512)
    head[100:108] = b"0000444\0"
    head[108:116] = b"0000000\0"
    head[116:124] = b"0000000\0"
    head[136:148] = b"%011o\0" % MTIME
    head[148:156] = b"        "  # the checksum counts its own field as spaces
    head[156:157] = b"0"
    head[257:265] = b"ustar\x0000"
    return bytes(head), sum(head)


_HEADER, _HEADER_SUM = _header_template()


def ustar_header(name: str, size: int) -> bytes:
    """The 512-byte ustar header of a regular file with lait's fixed metadata.

    Built directly, byte-identical to what `tarfile` writes for the same member (its `TarInfo.tobuf`
    costs as much as copying a 150 KB JPEG): a fixed template with the name, the size and the
    checksum filled in. Names must be ASCII and under 100 bytes.
    """
    raw = name.encode("ascii")
    return _header(raw, sum(raw), size)


def _header(raw: bytes, raw_sum: int, size: int) -> bytes:
    """`ustar_header` of the name `raw` (ASCII bytes) whose byte sum is `raw_sum`."""
    if len(raw) >= 100:
        raise ValueError(f"tar member name too long for a plain ustar header: {raw.decode()!r}")
    size_field = b"%011o\0" % size
    check = b"%06o\0 " % (_HEADER_SUM + raw_sum + sum(size_field))
    return b"".join((raw, _HEADER[len(raw):124], size_field, _HEADER[136:148], check, _HEADER[156:]))


_ZEROS = bytes(512)


class TarShardWriter:
    """Streams samples (dicts of extension -> bytes) into a tar that appears atomically
    (a local temporary file renamed into place, or an upload completed on `close`).

    Locally, samples are handed in batches of about `BATCH_BYTES` to a writer thread that puts
    each batch out in one `writev` (headers, bytes and padding: no copy into a user-space
    buffer) while the caller prepares the next samples; the copy into the page cache releases
    the GIL. Every `WRITEBACK_BYTES` the thread asks the kernel to start writing the pages out,
    so that the fsync of `close` finds little left to wait for. At most `QUEUE` batches wait.
    """

    BATCH_BYTES = 1 << 20
    BATCH_CHUNKS = 512  # well under IOV_MAX (1024 on Linux)
    WRITEBACK_BYTES = 8 << 20
    QUEUE = 8

    def __init__(self, path: Location):
        self.path = path
        self._out = storage.open_output(path)
        local = isinstance(self._out, storage.LocalOutput)
        self._file = self._out.stream(buffering=0 if local else -1)
        self._fd = self._file.fileno() if local else None
        self._batch: list = []
        self._batch_bytes = 0
        self._offset = 0  # bytes handed out so far (headers and padding included)
        self._error: BaseException | None = None
        self._queue: queue.Queue | None = None
        self._thread: threading.Thread | None = None
        if self._fd is not None:
            self._queue = queue.Queue(self.QUEUE)
            self._thread = threading.Thread(target=self._drain, name="lait-tar-writer", daemon=True)
            self._thread.start()
        self.samples = 0
        self.bytes = 0
        self._sha256 = hashlib.sha256()  # of the whole tar, for the task's marker (`lait verify`)
        self.size = 0

    @property
    def sha256(self) -> str:
        """Hex SHA-256 of the tar as written (complete after `close`)."""
        return self._sha256.hexdigest()

    def write(self, key: str, sample: dict[str, bytes]) -> None:
        batch = self._batch
        # The members' names share the key: its bytes and their sum are worked out once.
        stem = key.encode("ascii") + b"."
        stem_sum = sum(stem)
        for ext, data in sample.items():
            size = len(data)
            suffix = ext.encode("ascii")
            batch.append(_header(stem + suffix, stem_sum + sum(suffix), size))
            batch.append(data)
            pad = -size % 512
            if pad:
                batch.append(_ZEROS[:pad])
            self._batch_bytes += 512 + size + pad
            self.bytes += size
        self.samples += 1
        if self._batch_bytes >= self.BATCH_BYTES or len(batch) >= self.BATCH_CHUNKS:
            self._send()

    def _send(self) -> None:
        batch, self._batch, size = self._batch, [], self._batch_bytes
        self._batch_bytes = 0
        self._offset += size
        if self._queue is None:
            for c in batch:
                self._sha256.update(c)
                self._file.write(c)
            return
        self._raise_error()
        self._queue.put((batch, size))

    def _drain(self) -> None:
        """The writer thread: batches out to the file until the end mark (None)."""
        assert self._queue is not None and self._fd is not None
        fd, offset, synced = self._fd, 0, 0
        while True:
            item = self._queue.get()
            if item is None:
                return
            if self._error is not None:
                continue  # keep taking batches so that the producer never blocks
            batch, size = item
            try:
                for c in batch:  # hashlib lets go of the GIL for the large chunks (images)
                    self._sha256.update(c)
                written = os.writev(fd, batch)
                if written < size:  # a short write (a signal, a full disk): the rest in one piece
                    rest = memoryview(b"".join(bytes(c) for c in batch))[written:]
                    while rest:
                        rest = rest[os.write(fd, rest):]
                offset += size
                if offset - synced >= self.WRITEBACK_BYTES:
                    storage.start_writeback(fd, synced, offset - synced)
                    synced = offset
            except BaseException as exc:  # raised in the caller by the next write or close
                self._error = exc

    def _stop(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None

    def close(self) -> None:
        # End of archive: two zero blocks, padded to tarfile's 10 KiB record size.
        end = self._offset + self._batch_bytes + 1024
        tail = 1024 + (-end % tarfile.RECORDSIZE)
        self._batch.append(b"\0" * tail)
        self._batch_bytes += tail
        self._send()
        self._stop()
        self._raise_error()
        self.size = self._offset
        self._out.commit()  # fsync and rename; or complete the upload

    def _raise_error(self) -> None:
        """Raise what the writer thread hit, naming the tar (a full disk as `OutOfSpace`)."""
        if self._error is None:
            return
        if errors.is_out_of_space(self._error):
            raise errors.out_of_space(self._error, self.path) from self._error
        raise OSError(f"writing {self.path} failed: {self._error}") from self._error

    def abort(self) -> None:
        self._stop()
        self._out.discard()


class _RowGroupBytes:
    """The `bytes` column of the images_ok row groups a shard needs, read ahead in a thread.

    Parquet decoding releases the GIL, so reading the next row group overlaps with writing the
    current one into the tar. At most `ahead` + 1 groups are held at a time.
    """

    def __init__(self, work: WorkDir, groups: list[tuple[str, int]], ahead: int = 1,
                 rows: dict[tuple[str, int], set[int]] | None = None):
        self.dir = work.table_dir("images_ok")
        self._groups = groups
        self._rows = rows or {}  # per group, the rows whose SHA-256 is taken on the reader thread
        self._digests: dict[int, str] = {}
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="lait-shard-read")
        self._futures: dict[tuple[str, int], Future] = {}
        self._next = 0
        self._ahead = ahead
        self._key: tuple[str, int] | None = None
        self._col: list[memoryview | None] = []

    def _read(self, src_file: str, row_group: int) -> tuple[list[memoryview | None], dict[int, str]]:
        # A file is opened per group, not kept open: an open ParquetFile keeps a buffer as large
        # as the last column chunk it read, which over 16 partitions' files was 130 MB a worker.
        col = storage.parquet_file(self.dir / src_file).read_row_group(row_group, columns=["bytes"]).column(0)
        col = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()  # no copy when whole
        # Each row's bytes as a slice of Arrow's buffer: no copy, and no scalar per row.
        views = binary_views(col)
        # Hashed here, beside the caller's work (hashlib runs without the GIL on large buffers).
        digests = {i: hashlib.sha256(views[i]).hexdigest() for i in self._rows.get((src_file, row_group), ())
                   if i < len(views) and views[i] is not None}
        return views, digests

    def _fill(self) -> None:
        while self._next < len(self._groups) and len(self._futures) <= self._ahead:
            g = self._groups[self._next]
            self._futures[g] = self._pool.submit(self._read, *g)
            self._next += 1

    def get(self, src_file: str, row_group: int, row_index: int) -> memoryview | None:
        key = (src_file, row_group)
        if self._key != key:
            self._fill()
            fut = self._futures.pop(key, None)
            self._col, self._digests = fut.result() if fut is not None else self._read(*key)
            self._key = key
            self._fill()
        return self._col[row_index]  # a view of Arrow's buffer, not a copy: the tar writer reads it once

    def sha256(self, row_index: int) -> str | None:
        """The SHA-256 of a row of the current group that was asked for (`rows`), as read."""
        return self._digests.get(row_index)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


class ShardStage(Stage):
    """Writes shard N from partition N of `build_plan/`.

    The plan is read from the task's work directory; image bytes and region arrays from
    `source` (another work directory's URL, for `lait select`; the same one by default); the
    shard goes into `out` (default: the work directory's `shards/`).
    """

    name = "build_shards"
    input_table = "build_plan"
    # The URL list rows of the shard that became no sample: its sidecar and _stats.json list them.
    extra_inputs = ("build_failed",)
    output_tables = ()

    def __init__(self, images: ImageOptions | None = None, regions: bool = True, *,
                 source: str | None = None, out: str | None = None,
                 extra_columns: list[tuple[str, str]] | None = None):
        self.images = images or ImageOptions()
        self.regions = regions
        self.source = source
        self.out = out
        # The URL lists' extra columns and their types over the whole build (the plan's); None:
        # typed from the shard's own values (`lait select`, whose pool rows carry them).
        self.extra_columns = extra_columns

    @property
    def spawn_workers(self) -> bool:
        """The face detector runs torch: local workers are spawned when this process has torch
        loaded (`lait run` after scoring); forked ones would risk its thread pool's hang."""
        return self.images.face_model != "none" and "torch" in sys.modules

    def settings(self) -> dict[str, Any]:
        """What changes a shard besides its plan: the image options and the region arrays (the
        build's and the selection's own fingerprints hold every other setting)."""
        out = {**dataclasses.asdict(self.images), "regions": self.regions}
        if self.extra_columns:
            out["extra_columns"] = [list(c) for c in self.extra_columns]
        return out

    def partitions(self, work: WorkDir) -> list[int]:
        """Shards with samples or failed rows (a shard of URL list rows that all failed still
        gets its tar, sidecar and stats, as img2dataset's)."""
        return sorted(set(work.partitions("build_plan")) | set(work.partitions("build_failed")))

    def output_folder(self, work: WorkDir) -> Location:
        return storage.location(self.out) if self.out else work.root / "shards"

    def process(self, ctx: PartContext) -> None:
        # Row groups of image bytes (several MB each) pass through the reader one after another:
        # recycled from the heap, not mapped and faulted in afresh each time (`media_heap`).
        with media_heap():
            self._write_shard(ctx)

    def _write_shard(self, ctx: PartContext) -> None:
        started = time.time()
        source_work = WorkDir(self.source) if self.source else ctx.work
        out_dir = self.output_folder(ctx.work)
        storage.make_dirs(out_dir)
        name = shard_name(ctx.partition)
        # Held as Arrow (column buffers), turned into dicts a batch at a time: a 10,000-sample
        # plan with its JSON metadata is a few MB this way, several times that as Python dicts.
        table = ctx.work.read("build_plan", ctx.partition).sort_by(
            [("src_file", "ascending"), ("row_group", "ascending"), ("row_index", "ascending"),
             ("key", "ascending")])
        where = list(zip(table.column("src_file").to_pylist(), table.column("row_group").to_pylist()))
        groups = list(dict.fromkeys(where))
        rows: dict[tuple[str, int], set[int]] = {}
        for g, i in zip(where, table.column("row_index").to_pylist()):
            rows.setdefault(g, set()).add(i)
        source = _RowGroupBytes(source_work, groups, rows=rows)
        search = FaceSearch(source_work, self.images, table.column("sha256").to_pylist())
        regions = RegionReader.load(source_work, table.column("image_url").to_pylist()) if self.regions else None
        plan = (r for batch in table.select(PLAN_COLUMNS).to_batches(max_chunksize=512) for r in batch.to_pylist())
        # The samples' metadata parsed by column, and the parts of their KEY.json that the image
        # leaves as they are made once for the shard (`PlannedSamples`); a plan that `read_metas`
        # does not take (a URL list's extra columns) is decoded and encoded sample by sample.
        metas = read_metas(table.column("meta").combine_chunks()) if table.num_rows else None
        planned = PlannedSamples(metas, table.column("key").to_pylist()) if metas is not None else None
        written: list[int] = []  # with `planned`: the rows written into the tar, and their image's measures
        measures: tuple[list, ...] = ([], [], [], [], [], [], [])
        tar = TarShardWriter(out_dir / f"{name}.tar")
        sidecar: list[dict[str, Any]] = []
        try:
            for i, r in enumerate(plan):
                data = source.get(r["src_file"], r["row_group"], r["row_index"])
                meta = json.loads(r["meta"]) if planned is None else None
                sha256, faces = (meta.get("sha256"), meta.get("face_bboxes")) if planned is None else \
                    (planned.sha256[i], planned.faces[i])
                try:
                    if data is None:
                        raise MissingBytes("images_ok row has no bytes")
                    stored_sha = source.sha256(r["row_index"])
                    if sha256 and stored_sha != sha256:
                        raise CorruptImage(f"{r['src_file']} row group {r['row_group']} row {r['row_index']}: "
                                           f"SHA-256 {stored_sha}, not the {sha256} stage 2 recorded")
                    # What the bytes are now decides what is done with them: stage 2 stores a PNG
                    # or WebP as a JPEG, which a JPEG shard takes as it is (no second encode).
                    fmt = stored_format(data, r["format"])
                    known = search.known(sha256, faces)
                    image = prepare(data, fmt, r["width"], r["height"], self.images, known,
                                    None if known is not None else search.finder)
                except Exception as exc:  # a broken image is recorded, the shard goes on
                    # Without object addresses, so that reruns write identical sidecars.
                    err = re.sub(r" at 0x[0-9a-fA-F]+", "", f"{type(exc).__name__}: {exc}")[:500]
                    ctx.reject("build/corrupt_image" if isinstance(exc, CorruptImage) else "build/unreadable",
                               image_url=r["image_url"], page_url=r["page_url"], text=r["caption"], detail=err)
                    status = FAILED_TO_DOWNLOAD if isinstance(exc, (MissingBytes, CorruptImage)) else FAILED_TO_RESIZE
                    sidecar.append({**make_sample(meta or json.loads(r["meta"]), key=r["key"], status=status,
                                                  error_message=err, width=None, height=None,
                                                  original_width=r["width"], original_height=r["height"], exif="{}"),
                                    REASON: "build/corrupt_image" if isinstance(exc, CorruptImage)
                                    else "build/unreadable"})
                    continue
                if image.reencoded:
                    ctx.count("build/reencoded")
                faces = search.found(ctx, sha256, image)
                exif = exif_json(data, fmt)
                # KEY.json's sha256 is the digest of the bytes shipped, which readers check.
                shipped_sha = hashlib.sha256(image.data).hexdigest() if image.reencoded or not stored_sha \
                    else stored_sha
                if planned is None:
                    sample = make_sample({**meta, "sha256": shipped_sha, "face_bboxes": faces}, key=r["key"],
                                         status=SUCCESS,
                                         width=image.width, height=image.height,
                                         original_width=image.original_width,
                                         original_height=image.original_height, exif=exif)
                    sample_bytes = sample_json(sample)
                    sidecar.append(sample)
                else:
                    sample_bytes = planned.json(i, image.width, image.height, image.original_width,
                                                image.original_height, exif, shipped_sha, faces)
                    written.append(i)
                    for values, v in zip(measures, (image.width, image.height, image.original_width,
                                                    image.original_height, exif, shipped_sha, faces)):
                        values.append(v)
                members = {image.ext: image.data, "txt": r["caption"].encode("utf-8"), "json": sample_bytes}
                if regions is not None:
                    arrays = regions.arrays(r["image_url"])
                    members.update(arrays)
                    for m in arrays:  # which region members the folder's card lists
                        ctx.count(f"build/member/{m}")
                tar.write(r["key"], members)
            for f in ctx.work.read("build_failed", ctx.partition).to_pylist():
                sidecar.append(failed_record(f["key"], f["status"], f["error_message"], url=f["image_url"],
                                             caption=f["caption"], page_url=f["page_url"],
                                             extra=json.loads(f["extra"]) if f["extra"] else {}))
                sidecar[-1][REASON] = f["reason"]
            search.close(ctx)  # the new searches kept before the tar appears: a redo reuses them
            ctx.count("build/samples", tar.samples)
            ctx.count("build/shard_bytes", tar.bytes)
            side = self.sidecar_table(sidecar, planned.sidecar(written, *measures) if written else None)
            side_bytes = io.BytesIO()
            pq.write_table(side, side_bytes, compression="zstd")
            atomic_write_bytes(out_dir / f"{name}.parquet", side_bytes.getvalue())
            atomic_write_json(out_dir / f"{name}_stats.json", shard_stats(side.column("status").to_pylist(),
                                                                         side.column("error_message").to_pylist(),
                                                                         started))
            tar.close()
            # Its time as renamed into place (None on object storage): a later stat that finds
            # another one hashes the tar before calling the shard up to date.
            ctx.record_file(f"{name}.tar", tar.size, tar.sha256, storage.mtime_ns(out_dir / f"{name}.tar"))
        except BaseException:
            tar.abort()
            raise
        finally:
            source.close()


    def sidecar_table(self, rows: list[dict[str, Any]], written: pa.Table | None = None) -> pa.Table:
        """The shard's sidecar, sorted by key: `rows` (records), and the rows of `written`
        (SIDECAR, made by column), which hold none of the extra columns (null there)."""
        schema = self.sidecar_schema(rows)
        table = pa.Table.from_pylist(sorted(rows, key=lambda s: s["key"]), schema=schema)
        if written is None:
            return table
        for f in schema:
            if f.name not in written.column_names:
                written = written.append_column(f, pa.nulls(written.num_rows, f.type))
        return pa.concat_tables([table, written]).sort_by([("key", "ascending")]).combine_chunks()

    def sidecar_schema(self, rows: list[dict[str, Any]]) -> pa.Schema:
        """SIDECAR, then the extra columns: with the build's types, else typed from `rows`."""
        if self.extra_columns is not None:
            extra = self.extra_columns
        else:
            names = list(dict.fromkeys(k for r in rows for k in r if k not in KEYS and k != REASON))
            extra = [(n, type_of([r.get(n) for r in rows])) for n in names]
        return pa.schema(list(SIDECAR) + [pa.field(n, TYPES[tp]) for n, tp in extra])


class FaceSearch:
    """A shard's face search (`lait.build.faces`): the searches its pictures already have under
    this build's key, read once; the detector for the others; the new ones kept when the
    shard is done. With `face_model` none nothing is searched, and a sample keeps the boxes
    its images_ok row came with (none from lait's stage 2)."""

    def __init__(self, work: WorkDir, opts: ImageOptions, digests: list[str]):
        self.on = opts.face_model != "none"
        self.blur = opts.blur_faces
        self.finder = self.cache = None
        self._known: dict[str, tuple[list[list[float]], list[float]]] = {}
        if self.on:
            from lait.build.faces import FaceCache, FaceFinder, search_key

            self.cache = FaceCache(work, search_key(opts.face_model, opts.min_face_score, opts.geometry))
            self._known = self.cache.load(digests)
            self.finder = FaceFinder(opts.face_model, opts.min_face_score)

    def known(self, sha256: str | None, planned: list[list[float]] | None) -> list[list[float]] | None:
        """The boxes of a picture when no search is needed: searched before, or the search off
        (then the plan's); None: search it."""
        if not self.on:
            return planned or []
        hit = self._known.get(sha256 or "")
        return None if hit is None else hit[0]

    def found(self, ctx: PartContext, sha256: str | None, image: ShardImage) -> list[list[float]]:
        """The faces of a picture written, counted (searched now or before, with faces, blurred)
        and, when searched now, kept for the cache."""
        faces = image.faces or []
        if self.on:
            if image.searched:
                ctx.count("build/faces_searched")
                if sha256:
                    self.cache.add(sha256, faces, image.face_scores or [])
            else:
                ctx.count("build/faces_reused")
            ctx.count("build/faces_found", len(faces))
            if faces:
                ctx.count("build/samples_with_faces")
        if faces and self.blur:
            ctx.count("build/faces_blurred", len(faces))
        return faces

    def close(self, ctx: PartContext) -> None:
        if self.cache is not None:
            self.cache.write()


def faces_line(counters: dict[str, Any], samples: int, command: str = "build") -> str | None:
    """The summary's line on the face search of a build or selection (None when off)."""
    now, reused = int(counters.get("build/faces_searched", 0)), int(counters.get("build/faces_reused", 0))
    if not now and not reused:
        return None
    return (f"{command}: faces searched in {now + reused} of {samples} samples as they were written ({now} now, "
            f"{reused} reused from earlier searches); {int(counters.get('build/faces_found', 0))} faces on "
            f"{int(counters.get('build/samples_with_faces', 0))} samples, "
            f"{int(counters.get('build/faces_blurred', 0))} blurred")


class MissingBytes(ValueError):
    """The images_ok row a sample points to holds no bytes."""


class CorruptImage(ValueError):
    """The bytes of an images_ok row are not those stage 2 hashed: never shipped."""


def shard_stats(status: list[str], error_message: list[str | None], started: float) -> dict[str, Any]:
    """`NNNNN_stats.json` as img2dataset writes it (DataComp's resharder reads `successes`), from
    the sidecar's `status` and `error_message` columns."""
    counts = Counter(status)
    errors = Counter("success" if s == SUCCESS else e for s, e in zip(status, error_message))
    ended = time.time()
    return {"count": len(status), "successes": counts[SUCCESS],
            "failed_to_download": counts[FAILED_TO_DOWNLOAD], "failed_to_resize": counts[FAILED_TO_RESIZE],
            "duration": round(ended - started, 3), "start_time": started, "end_time": ended,
            "status_dict": dict(errors.most_common())}


def shard_files(work: WorkDir | Location) -> list[Location]:
    """The tars of a shard folder (a work directory's `shards/`, or a folder `lait select` wrote)."""
    folder = work.root / "shards" if isinstance(work, WorkDir) else work
    return sorted((p for p in storage.list_dir(folder) if re.fullmatch(r"[0-9]{5}\.tar", p.name)),
                  key=lambda p: p.name)


def finish_shard_dir(folder: Location, image_ext: str = "jpg", members: Iterable[str] = ()) -> dict[str, int]:
    """`sizes.json` (tar name -> samples, as open_clip reads it), `uids.npy` (every sample's uid
    in DataComp's subset format) and `README.md` (the dataset card that types every member for
    Hugging Face, `build.card`), from the sidecars; returns the sizes. `image_ext`: the tars'
    image member; `members`: the region arrays some sample has (`written_members`)."""
    sizes, uids, schemas = {}, [], []
    for tar in shard_files(folder):
        side = storage.parquet_file(tar.with_suffix(".parquet"))
        schemas.append(side.schema_arrow)
        table = side.read(columns=["uid", "status"])
        ok = [u for u, s in zip(table.column("uid").to_pylist(), table.column("status").to_pylist())
              if s == SUCCESS]
        sizes[tar.name] = len(ok)
        uids += ok
    atomic_write_json(folder / "sizes.json", sizes)
    buf = io.BytesIO()
    np.save(buf, uids_to_array(uids), allow_pickle=False)
    atomic_write_bytes(folder / UIDS_FILE, buf.getvalue())
    # Shards of `lait select` type a URL list's extra columns each from its own rows: where two
    # disagree (integers in one, numbers in another), the card takes the wider type.
    schema = pa.unify_schemas(schemas, promote_options="permissive") if schemas else SIDECAR
    written = set(members)
    order = [m for m in REGION_MEMBERS if m in written]
    atomic_write_bytes(folder / CARD_FILE, dataset_card(sample_schema(schema), image_ext, order, sizes).encode())
    return sizes


def written_members(work: WorkDir, stage: str) -> set[str]:
    """The region members (`KEY.regions.npy`, ...) that at least one shard of `stage` wrote."""
    prefix = "build/member/"
    return {k[len(prefix):] for s in work.done_stats(stage) for k, v in s.get("counters", {}).items()
            if k.startswith(prefix) and v}


def write_stats(folder: Location, stats: dict[str, Any]) -> None:
    atomic_write_json(folder / "stats.json", stats)
