"""Pass 3 of `lait build` (per shard): copy the planned samples into WebDataset tars.

Each shard is one task of the executor (its `build_plan/` partition is the shard number):
`NNNNN.tar` with `KEY.jpg`, `KEY.txt`, `KEY.json` (and region arrays when stage 4 stored them),
and `NNNNN.parquet`, the img2dataset-style sidecar. Both appear atomically; the task's marker
comes last, so a rerun rewrites only unfinished shards. Bytes are read one Parquet row group
at a time, in the order the plan laid them out, and written with fixed tar metadata, so the
same plan always gives byte-identical tars.
"""

from __future__ import annotations

import io
import logging
import re
import tarfile
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from lait.build.regions import RegionReader
from lait import storage
from lait.parts import WorkDir, atomic_write_bytes, atomic_write_json
from lait.stage import PartContext, Stage
from lait.storage import Location

log = logging.getLogger(__name__)

JPEG_FORMATS = {"JPEG", "MPO"}
# Fixed metadata so that tars are reproducible byte for byte (no clock, no user names).
MTIME = 1_700_000_000

SIDECAR = pa.schema([
    pa.field("key", pa.string()), pa.field("url", pa.string()), pa.field("page_url", pa.string()),
    pa.field("caption", pa.string()), pa.field("score", pa.float32()), pa.field("source", pa.string()),
    pa.field("lang", pa.string()), pa.field("width", pa.int32()), pa.field("height", pa.int32()),
    pa.field("sha256", pa.string()), pa.field("phash", pa.string()), pa.field("n_candidates", pa.int32()),
    pa.field("n_duplicates", pa.int32()), pa.field("status", pa.string()), pa.field("error_message", pa.string()),
])


def shard_name(shard: int) -> str:
    return f"{shard:05d}"


def to_jpeg(data: bytes, quality: int) -> bytes:
    """Re-encode PNG, WebP, GIF... as RGB JPEG; transparency becomes white, as browsers show it."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        im.load()
        if im.mode in ("RGBA", "LA", "P"):
            im = im.convert("RGBA")
            bg = Image.new("RGB", im.size, (255, 255, 255))
            bg.paste(im, mask=im.getchannel("A"))
            im = bg
        elif im.mode != "RGB":
            im = im.convert("RGB")
        buf = io.BytesIO()
        im.save(buf, "JPEG", quality=quality)
        return buf.getvalue()


def ustar_header(name: str, size: int) -> bytes:
    """The 512-byte ustar header of a regular file with lait's fixed metadata.

    Built directly, byte-identical to what `tarfile` writes for the same member (its `TarInfo.tobuf`
    costs as much as copying a 150 KB JPEG). Names must be ASCII and under 100 bytes.
    """
    raw = name.encode("ascii")
    if len(raw) >= 100:
        raise ValueError(f"tar member name too long for a plain ustar header: {name!r}")
    head = bytearray(512)
    head[0:len(raw)] = raw
    head[100:108] = b"0000444\0"
    head[108:116] = b"0000000\0"
    head[116:124] = b"0000000\0"
    head[124:136] = b"%011o\0" % size
    head[136:148] = b"%011o\0" % MTIME
    head[148:156] = b"        "
    head[156:157] = b"0"
    head[257:265] = b"ustar\x0000"
    head[148:156] = b"%06o\0 " % sum(head)
    return bytes(head)


class TarShardWriter:
    """Streams samples (dicts of extension -> bytes) into a tar that appears atomically
    (a local temporary file renamed into place, or an upload completed on `close`)."""

    def __init__(self, path: Location):
        self.path = path
        self._out = storage.open_output(path)
        self._file = self._out.stream(buffering=1 << 20)
        self.samples = 0
        self.bytes = 0

    def write(self, key: str, sample: dict[str, bytes]) -> None:
        f = self._file
        for ext, data in sample.items():
            f.write(ustar_header(f"{key}.{ext}", len(data)))
            f.write(data)
            pad = -len(data) % 512
            if pad:
                f.write(b"\0" * pad)
            self.bytes += len(data)
        self.samples += 1

    def close(self) -> None:
        # End of archive: two zero blocks, padded to tarfile's 10 KiB record size.
        written = self._file.tell() + 1024
        self._file.write(b"\0" * (1024 + (-written % tarfile.RECORDSIZE)))
        self._out.commit()  # flush, fsync and rename; or complete the upload

    def abort(self) -> None:
        self._out.discard()


class _RowGroupBytes:
    """The `bytes` column of the images_ok row groups a shard needs, read ahead in a thread.

    Parquet decoding releases the GIL, so reading the next row group overlaps with writing the
    current one into the tar. At most `ahead` + 1 groups are held at a time.
    """

    def __init__(self, work: WorkDir, groups: list[tuple[str, int]], ahead: int = 1):
        self.dir = work.table_dir("images_ok")
        self._groups = groups
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="lait-shard-read")
        self._futures: dict[tuple[str, int], Future] = {}
        self._next = 0
        self._ahead = ahead
        self._key: tuple[str, int] | None = None
        self._col: pa.Array | None = None

    def _read(self, src_file: str, row_group: int) -> pa.Array:
        # A file is opened per group, not kept open: an open ParquetFile keeps a buffer as large
        # as the last column chunk it read, which over 16 partitions' files was 130 MB a worker.
        col = storage.parquet_file(self.dir / src_file).read_row_group(row_group, columns=["bytes"]).column(0)
        return col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()  # no copy when whole

    def _fill(self) -> None:
        while self._next < len(self._groups) and len(self._futures) <= self._ahead:
            g = self._groups[self._next]
            self._futures[g] = self._pool.submit(self._read, *g)
            self._next += 1

    def get(self, src_file: str, row_group: int, row_index: int) -> pa.Buffer | None:
        key = (src_file, row_group)
        if self._key != key:
            self._fill()
            fut = self._futures.pop(key, None)
            self._col = fut.result() if fut is not None else self._read(*key)
            self._key = key
            self._fill()
        # A view of Arrow's buffer, not a copy: the tar writer reads it once.
        value = self._col[row_index]
        return value.as_buffer() if value.is_valid else None

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


class ShardStage(Stage):
    """Writes shard N from partition N of `build_plan/`."""

    name = "build_shards"
    input_table = "build_plan"
    output_tables = ()

    def __init__(self, jpeg_quality: int = 95, regions: bool = True):
        self.jpeg_quality = jpeg_quality
        self.regions = regions

    def settings(self) -> dict[str, Any]:
        return {"jpeg_quality": self.jpeg_quality, "regions": self.regions}

    def process(self, ctx: PartContext) -> None:
        work = ctx.work
        out_dir = work.root / "shards"
        storage.make_dirs(out_dir)
        name = shard_name(ctx.partition)
        # Held as Arrow (column buffers), turned into dicts a batch at a time: a 10,000-sample
        # plan with its JSON metadata is a few MB this way, several times that as Python dicts.
        table = work.read("build_plan", ctx.partition).sort_by(
            [("src_file", "ascending"), ("row_group", "ascending"), ("row_index", "ascending"),
             ("key", "ascending")])
        groups = list(dict.fromkeys(zip(table.column("src_file").to_pylist(),
                                        table.column("row_group").to_pylist())))
        source = _RowGroupBytes(work, groups)
        regions = RegionReader.load(work, table.column("image_url").to_pylist()) if self.regions else None
        plan = (r for batch in table.to_batches(max_chunksize=512) for r in batch.to_pylist())
        tar = TarShardWriter(out_dir / f"{name}.tar")
        sidecar: list[dict[str, Any]] = []
        try:
            for r in plan:
                data = source.get(r["src_file"], r["row_group"], r["row_index"])
                side = {"key": r["key"], "url": r["image_url"], "page_url": r["page_url"],
                        "caption": r["caption"], "score": r["score"], "source": r["source"],
                        "lang": r["lang"], "width": r["width"], "height": r["height"],
                        "sha256": r["sha256"], "phash": r["phash"], "n_candidates": r["n_candidates"],
                        "n_duplicates": r["n_duplicates"], "status": "success", "error_message": None}
                try:
                    if data is None:
                        raise ValueError("images_ok row has no bytes")
                    if r["format"].upper() not in JPEG_FORMATS:
                        data = to_jpeg(data, self.jpeg_quality)
                        ctx.count("build/reencoded")
                except Exception as exc:  # a broken image is recorded, the shard goes on
                    # Without object addresses, so that reruns write identical sidecars.
                    err = re.sub(r" at 0x[0-9a-fA-F]+", "", f"{type(exc).__name__}: {exc}")[:500]
                    ctx.reject("build/unreadable", image_url=r["image_url"], page_url=r["page_url"],
                               text=r["caption"], detail=err)
                    sidecar.append({**side, "status": "failed_to_write", "error_message": err})
                    continue
                sample = {"jpg": data, "txt": r["caption"].encode("utf-8"), "json": r["meta"].encode("utf-8")}
                if regions is not None:
                    sample.update(regions.arrays(r["image_url"]))
                tar.write(r["key"], sample)
                sidecar.append(side)
            ctx.count("build/samples", tar.samples)
            ctx.count("build/shard_bytes", tar.bytes)
            sidecar.sort(key=lambda s: s["key"])
            side_bytes = io.BytesIO()
            pq.write_table(pa.Table.from_pylist(sidecar, schema=SIDECAR), side_bytes, compression="zstd")
            atomic_write_bytes(out_dir / f"{name}.parquet", side_bytes.getvalue())
            tar.close()
        except BaseException:
            tar.abort()
            raise
        finally:
            source.close()


def shard_files(work: WorkDir) -> list[Location]:
    return sorted((p for p in storage.list_dir(work.root / "shards") if re.fullmatch(r"[0-9]{5}\.tar", p.name)),
                  key=lambda p: p.name)


def write_sizes(work: WorkDir) -> dict[str, int]:
    """`sizes.json` as open_clip reads it: tar name -> number of samples (from the sidecars)."""
    sizes = {}
    for tar in shard_files(work):
        side = tar.with_suffix(".parquet")
        table = storage.read_table(side, columns=["status"])
        sizes[tar.name] = sum(1 for s in table.column("status").to_pylist() if s == "success")
    atomic_write_json(work.root / "shards" / "sizes.json", sizes)
    return sizes


def write_stats(work: WorkDir, stats: dict[str, Any]) -> None:
    atomic_write_json(work.root / "shards" / "stats.json", stats)
