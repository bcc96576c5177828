"""Shard writing throughput of `lait build` beside plain `tarfile` writing the same bytes.

Data: the real photos of ../shared/data/photos (COCO JPEGs, ~150 KB) repeated to N samples as
a work directory with `images_ok/` and `scored/` (3 texts per image). Measured side by side,
alternating, median of R rounds:

- tarfile:  the final samples (jpg, txt, json bytes already in memory) written into the same
            number of tars with `tarfile`, one process, each tar as durable as lait's: written
            under a temporary name, fsynced, renamed into place (lait's tars are; a peer that
            only fills the page cache would be compared with an unlike thing).
- shards:   `lait build`'s shard pass (read the plan, read image bytes from Parquet row groups,
            write tars + sidecars), one worker, then two.
- build:    the whole `lait build` (pick, global plan, shards), one worker, as a first build
            (the previous round's build tables and shards removed before the clock starts).

Size: 20,000 samples in tars of 10,000 (img2dataset's and DataComp's shard size), so two tars
and, for two workers, one each; `--quick` is 500 samples in tars of 250 (a smoke run: the warm-up
build searches every sample for faces, 2,000 of them took the suite's test 110 s). Targets (issues 23
and 35): the whole build at 0.8 of tarfile, the shard pass at 1.0. `pairs()` yields both for
`bench/all.py`.

The script also prints the layout floor (`layout_floor`): the time the build's Parquet parts,
stats files and markers cost by themselves, read and written with pyarrow and no lait logic,
and the best whole-build ratio that leaves at this size.

    .venv/bin/python bench/build/bench_shards.py [--quick | --n 20000 --per-shard 10000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import shutil
import statistics
import sys
import tarfile
import tempfile
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from pairs import Pair  # noqa: E402

from lait.build.config import BuildConfig  # noqa: E402
from lait.build.pipeline import build, reset  # noqa: E402
from lait.build.shards import ShardStage  # noqa: E402
from lait.executor import LocalExecutor  # noqa: E402
from lait.workdir import WorkDir, partition_of  # noqa: E402
from lait.writers import atomic_write_json

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
BUILD_TARGET = 0.8   # whole build / tarfile
SHARDS_TARGET = 1.0  # shard pass / tarfile
FULL = (20000, 10000)  # samples, samples per tar
QUICK = (500, 250)


def make_work(root: Path, photos: list[Path], n: int) -> WorkDir:
    from PIL import Image

    work = WorkDir(root, n_partitions=16).init()
    info = []
    for p in photos:
        data = p.read_bytes()
        with Image.open(io.BytesIO(data)) as im:
            info.append((data, im.width, im.height))
    ok_w, sc_w = {}, {}
    for i in range(n):
        data, w, h = info[i % len(info)]
        # A distinct sha256 and phash per sample, so that no sample is a duplicate of another.
        data = data + i.to_bytes(4, "big")
        url = f"http://bench.test/img/{i}.jpg"
        part = partition_of(url, 16)
        if part not in ok_w:
            ok_w[part] = work.writer("images_ok", part, "bench")
            sc_w[part] = work.writer("scored", part, "bench")
        ok_w[part].write({"image_url": url, "page_url": "http://bench.test/", "bytes": data, "mime": "image/jpeg",
                          "status": 200, "fetched_at": T0, "width": w, "height": h, "format": "JPEG",
                          "sha256": hashlib.sha256(data).hexdigest(), "phash": f"{(i * 0x9E3779B97F4A7C15) % (1 << 64):016x}"})
        for k, src in enumerate(("alt", "figcaption", "context")):
            sc_w[part].write({"image_url": url, "page_url": f"http://bench.test/p/{i}.html",
                              "text": f"caption {k} of photo number {i} on a bench page", "source": src,
                              "lang": "en", "score": 0.2 + k / 10, "model": "bench"})
    for w in (*ok_w.values(), *sc_w.values()):
        w.close()
    return work


def final_samples(root: Path) -> list[list[tuple[str, bytes]]]:
    """Per tar, the members (name, bytes) that `lait build` wrote: the baseline writes these."""
    out = []
    for tar in sorted((root / "shards").glob("*.tar")):
        with tarfile.open(tar) as tf:
            out.append([(m.name, tf.extractfile(m).read()) for m in tf.getmembers()])
    return out


def tarfile_baseline(shards: list[list[tuple[str, bytes]]], out: Path) -> float:
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    for i, members in enumerate(shards):
        final = out / f"{i:05d}.tar"
        tmp = out / f".tmp-{i:05d}.tar"
        with open(tmp, "wb") as f:
            with tarfile.open(fileobj=f, mode="w") as tf:
                for name, data in members:
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
            f.flush()
            os.fsync(f.fileno())  # on disk before it is visible, as lait's tars
        os.replace(tmp, final)
    return time.perf_counter() - start


def remove_tars(root: Path) -> None:
    # Start from no tars, as the tarfile baseline does: replacing a large file costs its unlink.
    for old in (root / "shards").glob("*.tar"):
        old.unlink()


def shard_pass(root: Path, workers: int) -> float:
    work = WorkDir(root)
    shutil.rmtree(root / "_done" / "build_shards", ignore_errors=True)
    remove_tars(root)
    start = time.perf_counter()
    report = LocalExecutor(workers=workers, retries=0, show_progress=False).run(ShardStage(), work)
    assert report.ok, report.summary()
    return time.perf_counter() - start


def full_build(root: Path, per_shard: int) -> float:
    # A first build: no markers, no build tables, no shards (`reset` is what a rebuild runs
    # first). Removing the files of the previous round is not part of the build measured, as
    # the tarfile baseline writes into an empty folder. The shards go first: with shards in
    # place, `reset` starts a staged rebuild (shards.next/, swapped in at the end, the old set
    # deleted), which is not a first build.
    shutil.rmtree(root / "shards", ignore_errors=True)
    reset(WorkDir(root))
    assert not (root / "shards.next").exists()
    start = time.perf_counter()
    result = build(BuildConfig(work=str(root), workers=1, progress=False, samples_per_shard=per_shard))
    assert result.ok
    return time.perf_counter() - start


def layout_floor(root: Path) -> float:
    """Seconds that the build's table layout costs by itself, with none of lait's logic: read
    the Parquet parts a build reads (the columns it reads) and write again, with lait's writer
    settings, stats file and rename (pyarrow and os directly), every part it writes, plus
    its task markers. The tables
    are the ones the warm-up build wrote; their rows are in memory before the clock starts.
    tarfile / (this + tarfile) bounds the whole build's ratio at this size: what it would be if
    the passes' own work cost nothing and the shard pass were exactly as fast as tarfile."""
    from lait.arrow_rows import writer_options
    from lait.build.pick import OK_COLUMNS, SCORED_COLUMNS
    from lait.schemas import get_table
    from lait.writers import stats_path

    work = WorkDir(root)
    reads = [(f, SCORED_COLUMNS) for f in work.part_files("scored")]
    reads += [(f, OK_COLUMNS) for f in work.part_files("images_ok")]
    reads += [(f, None) for f in work.part_files("build_images") + work.part_files("build_plan")]
    writes = [(table, f.name, pq.read_table(f)) for table in ("build_images", "pool", "build_plan")
              for f in work.part_files(table)]
    markers = len(work.part_files("scored")) + 1 + len(work.part_files("build_plan"))
    out = root.parent / "floor"
    shutil.rmtree(out, ignore_errors=True)
    (out / "_done").mkdir(parents=True)
    start = time.perf_counter()
    for f, columns in reads:
        pq.ParquetFile(f).read(columns=columns)
    for table, name, rows in writes:  # what `PartWriter.close` leaves: the part, renamed into place, and its stats
        schema = get_table(table).schema
        tmp, final = out / table / f".tmp-{name}", out / table / name
        tmp.parent.mkdir(exist_ok=True)
        with pq.ParquetWriter(tmp, schema, **writer_options(schema)) as w:
            w.write_table(rows.cast(schema))
        atomic_write_json(stats_path(final), {"rows": rows.num_rows, "bytes": tmp.stat().st_size})
        os.replace(tmp, final)
    for i in range(markers):
        atomic_write_json(out / "_done" / f"p{i:05d}.json", {"stage": "floor", "partition": i, "seconds": 0.0})
    seconds = time.perf_counter() - start
    shutil.rmtree(out, ignore_errors=True)
    return seconds


def photos() -> list[Path]:
    return sorted((REPO.parent / "shared" / "data" / "photos").rglob("*.jpg"))


class BuildBench:
    """A work directory of n samples, built once (warm-up), and the tars that build wrote."""

    def __init__(self, tmp: Path, n: int, per_shard: int):
        self.tmp, self.n, self.per_shard = tmp, n, per_shard
        self.root = tmp / "work"
        make_work(self.root, photos(), n)
        self.full_build()  # warm-up, and the plan the shard pass rewrites
        self.shards = final_samples(self.root)
        self.total = sum(len(d) for members in self.shards for _, d in members)

    def tarfile_seconds(self) -> float:
        out = self.tmp / "base"
        try:
            return tarfile_baseline(self.shards, out)
        finally:
            shutil.rmtree(out, ignore_errors=True)

    def full_build(self) -> float:
        return full_build(self.root, self.per_shard)

    def mb_per_s(self, seconds: float) -> float:
        return self.total / seconds / 1e6


@contextmanager
def pairs(quick: bool = False, n: int | None = None):
    """The whole build and the shard pass, each beside tarfile writing the same bytes."""
    if not photos():
        sys.exit("../shared/data/photos is absent")
    tmp = Path(tempfile.mkdtemp(prefix="lait-bench-build-"))
    try:
        b = BuildBench(tmp, *((n, n // 2) if n else QUICK if quick else FULL))

        def peer() -> float:
            return b.mb_per_s(b.tarfile_seconds())

        yield [Pair("build", f"whole lait build, 1 worker, {b.n} samples", "tarfile, same bytes", "MB/s",
                    BUILD_TARGET, lambda: b.mb_per_s(b.full_build()), peer),
               Pair("shards", f"lait build shard pass, 1 worker, {b.n} samples", "tarfile, same bytes", "MB/s",
                    SHARDS_TARGET, lambda: b.mb_per_s(shard_pass(b.root, 1)), peer)]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=FULL[0], help="samples")
    ap.add_argument("--per-shard", type=int, default=FULL[1], help="samples per tar")
    ap.add_argument("--quick", action="store_true", help=f"{QUICK[0]} samples in tars of {QUICK[1]}")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if not photos():
        print("bench/build: ../shared/data/photos is not present; nothing to measure")
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="lait-bench-build-"))
    try:
        b = BuildBench(tmp, *(QUICK if args.quick else (args.n, args.per_shard)))
        shards, total, root = b.shards, b.total, b.root
        times: dict[str, list[float]] = {"tarfile": [], "shards, 1 worker": [], "shards, 2 workers": [],
                                         "whole build, 1 worker": []}
        for _ in range(args.rounds):
            times["tarfile"].append(b.tarfile_seconds())
            times["shards, 1 worker"].append(shard_pass(root, 1))
            times["shards, 2 workers"].append(shard_pass(root, 2))
            times["whole build, 1 worker"].append(b.full_build())
        floor = statistics.median(layout_floor(root) for _ in range(args.rounds))
        base = statistics.median(times["tarfile"])
        print(f"{b.n} samples, {len(shards)} tars, {total / 1e6:.1f} MB of members; median of {args.rounds}")
        for name, ts in times.items():
            t = statistics.median(ts)
            print(f"  {name:<24} {total / t / 1e6:7.1f} MB/s  {b.n / t:8.0f} samples/s  "
                  f"ratio to tarfile {base / t:.2f}")
        print(f"  layout floor: {floor:.3f} s reading and writing the build's parts and markers alone; "
              f"the whole build is at most {base / (base + floor):.2f} of tarfile at this size")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
