"""Issue 29, stage 5: flipped bytes, cut shards and failed rebuilds are found, named, and never
shipped; a rebuild replaces the earlier shards only once complete."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kit import build_data as data  # noqa: E402
from lait.build.config import BuildConfig
from lait.build.pipeline import build
from lait.workdir import WorkDir


def _cfg(work: Path, **kw) -> BuildConfig:
    return BuildConfig(**{"work": str(work), "workers": 1, "progress": False, "samples_per_shard": 16, **kw})


def snapshot(folder: Path, *, timings: bool = True) -> dict[str, bytes]:
    """Every file of a folder by name; without `timings`, less the stats files that hold them."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())
            if p.is_file() and (timings or not p.name.endswith("stats.json"))}


def flip(path: Path, at: float = 0.5, n: int = 16) -> None:
    raw = bytearray(path.read_bytes())
    start = int(len(raw) * at)
    for i in range(start, start + n):
        raw[i] ^= 0xFF
    path.write_bytes(bytes(raw))


def failures(result) -> str:
    return "\n".join(err for r in result.reports for err in r.failed.values())


@pytest.fixture()
def built(tmp_path) -> Path:
    work = tmp_path / "w"
    data.make_work(work)
    assert build(_cfg(work)).ok
    return work


def test_flipped_bytes_in_images_ok_are_named_and_the_earlier_shards_stay(built):
    before = snapshot(built / "shards")
    part = max((built / "images_ok").glob("*.parquet"), key=lambda p: p.stat().st_size)
    flip(part)
    result = build(_cfg(built, force=True))
    assert not result.ok
    assert f"{part} (partition" in failures(result) or str(part) in failures(result)
    assert "corrupt" in failures(result)
    assert snapshot(built / "shards") == before  # the failed rebuild touched nothing shipped


def test_a_corrupt_scored_part_is_named_and_deletes_no_shard(built):
    before = snapshot(built / "shards")
    part = max((built / "scored").glob("*.parquet"), key=lambda p: p.stat().st_size)
    flip(part, at=0.3)
    result = build(_cfg(built, force=True))
    assert not result.ok
    assert str(part) in failures(result)
    assert snapshot(built / "shards") == before


def test_a_cut_shard_is_noticed_and_rewritten_the_same(built):
    shards = built / "shards"
    before = snapshot(shards)
    tar = sorted(shards.glob("*.tar"))[0]
    tar.write_bytes(tar.read_bytes()[: tar.stat().st_size // 2])
    result = build(_cfg(built))
    assert result.ok
    shard_report = result.reports[-1]
    assert shard_report.done == [int(tar.stem)]
    assert any(f"{tar.name} is" in line for line in shard_report.plan)
    assert snapshot(shards, timings=False) == {k: v for k, v in before.items() if not k.endswith("stats.json")}


def test_a_removed_shard_is_rewritten(built):
    tar = sorted((built / "shards").glob("*.tar"))[-1]
    original = tar.read_bytes()
    tar.unlink()
    result = build(_cfg(built))
    assert result.ok and result.reports[-1].done == [int(tar.stem)]
    assert tar.read_bytes() == original


def test_a_complete_rebuild_replaces_the_set_and_leaves_no_staging(built):
    before = snapshot(built / "shards")
    result = build(_cfg(built, samples_per_shard=8))
    assert result.ok and not result.reused
    after = snapshot(built / "shards")
    assert after != before and len([n for n in after if n.endswith(".tar")]) > len(
        [n for n in before if n.endswith(".tar")])
    assert sorted(p.name for p in built.iterdir() if p.name.startswith("shards")) == ["shards"]
    marker = json.loads((built / "_done" / "build_shards" / "p00000.json").read_text())
    tar = built / "shards" / "00000.tar"
    assert marker["files"]["00000.tar"]["bytes"] == tar.stat().st_size
    import hashlib

    assert marker["files"]["00000.tar"]["sha256"] == hashlib.sha256(tar.read_bytes()).hexdigest()


def test_a_rebuild_killed_between_the_renames_is_finished_by_the_next_run(built):
    from lait.build import pipeline

    build(_cfg(built, samples_per_shard=8))  # shards of 8
    expected = snapshot(built / "shards")
    build(_cfg(built))  # back to 16 a shard
    # Interrupt a rebuild to 8 right after shards/ moved aside (swap_in's first rename).
    real = pipeline.storage.rename_tree
    calls = []

    def first_only(src, dst):
        calls.append((src, dst))
        if len(calls) == 2:
            raise KeyboardInterrupt
        real(src, dst)

    pipeline.storage.rename_tree = first_only
    try:
        with pytest.raises(KeyboardInterrupt):
            build(_cfg(built, samples_per_shard=8))
    finally:
        pipeline.storage.rename_tree = real
    assert not (built / "shards").exists() and (built / "shards.next").is_dir()
    again = build(_cfg(built, samples_per_shard=8))
    assert again.ok and again.reused  # nothing redone: the complete set only had to move in
    assert snapshot(built / "shards", timings=False) == {k: v for k, v in expected.items()
                                                         if not k.endswith("stats.json")}
    assert not (built / "shards.old").exists() and not (built / "shards.next").exists()


def test_an_image_whose_bytes_changed_without_a_checksum_is_never_shipped(tmp_path):
    """A part written without page checksums (an older lait, another tool) whose image bytes
    are not those stage 2 hashed: the sample is refused with its reason, the rest ships."""
    work_dir = tmp_path / "w"
    work, expect = data.make_work(work_dir)
    victim = f"{data.SITE}/img/photo4.jpg"
    for part in (work_dir / "images_ok").glob("*.parquet"):
        table = pq.read_table(part)
        urls = table.column("image_url").to_pylist()
        if victim not in urls:
            continue
        blobs = table.column("bytes").to_pylist()
        blobs[urls.index(victim)] = data.photo(999)  # a valid JPEG, but not the one hashed
        table = table.set_column(table.schema.get_field_index("bytes"), "bytes",
                                 pa.array(blobs, type=table.schema.field("bytes").type))
        pq.write_table(table, part, compression="none")  # no page checksums
    result = build(_cfg(work_dir))
    assert result.ok
    shipped = set()
    for tar in (work_dir / "shards").glob("*.tar"):
        with tarfile.open(tar) as tf:
            for m in tf.getmembers():
                if m.name.endswith(".json"):
                    shipped.add(json.loads(tf.extractfile(m).read())["url"])
    assert victim not in shipped
    assert f"{data.SITE}/img/photo5.jpg" in shipped
    rejected = WorkDir(work_dir).read("rejected").to_pylist()
    hit = [r for r in rejected if r["image_url"] == victim and r["reason"] == "build/corrupt_image"]
    assert hit and "SHA-256" in hit[0]["detail"]
    sidecars = pa.concat_tables([pq.read_table(p) for p in (work_dir / "shards").glob("*.parquet")])
    row = [r for r in sidecars.to_pylist() if r["url"] == victim]
    assert row and row[0]["status"] != "success"


def test_checksums_are_written_on_every_part(built):
    part = next((built / "images_ok").glob("*.parquet"))
    raw = part.read_bytes()
    meta = pq.ParquetFile(io.BytesIO(raw)).metadata
    assert meta.num_row_groups >= 1
    flip(part)
    from lait import storage
    from lait.errors import CorruptPart

    with pytest.raises(CorruptPart, match="CRC|checksum"):
        storage.read_table(part)


def _lait(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lait", "-q", *args], capture_output=True, text=True, timeout=300)


def test_verify_names_each_damaged_file_and_repair_lets_the_build_redo_it(built):
    clean = _lait("verify", str(built))
    assert clean.returncode == 0, clean.stderr
    assert "all intact" in clean.stderr
    intact = snapshot(built / "shards", timings=False)

    part = max((built / "images_ok").glob("*.parquet"), key=lambda p: p.stat().st_size)
    flip(part)
    tar = sorted((built / "shards").glob("*.tar"))[0]
    raw = bytearray(tar.read_bytes())
    raw[len(raw) // 3] ^= 0xFF  # same size: only a digest can tell
    tar.write_bytes(bytes(raw))

    found = _lait("verify", str(built))
    assert found.returncode == 1
    lines = [line for line in found.stderr.splitlines() if not line.startswith("verify:")]
    assert any(line.startswith(f"images_ok/{part.name} (partition") for line in lines), found.stderr
    assert any(line.startswith(f"shards/{tar.name} (partition") and "SHA-256" in line
               and "lait build redoes it" in line for line in lines), found.stderr
    assert "2 damaged" in found.stderr

    # The shard's marker is cleared by --repair: the next build writes it again.
    fixed = _lait("verify", str(built), "--repair")
    assert fixed.returncode == 1 and not tar.exists()
    assert not (built / "_done" / "build_shards" / f"p{int(tar.stem):05d}.json").exists()
    # The images_ok part was written by the fixture (not a stage task): named, not removable.
    assert part.exists()
    flip(part)  # the same 16 bytes back: the part is whole again
    again = build(_cfg(built))
    assert again.ok and again.reports[-1].done == [int(tar.stem)]
    assert snapshot(built / "shards", timings=False) == intact
    assert _lait("verify", str(built)).returncode == 0


def test_status_notices_a_cut_shard(built):
    tar = sorted((built / "shards").glob("*.tar"))[0]
    before = _lait("status", str(built)).stdout
    assert "00000.tar is" not in before
    # stage 1 has its line too: what was fetched, and by which command (or that nothing was)
    (crawl,) = [line for line in before.splitlines() if line.startswith("crawl ")]
    assert re.search(r"\d+ pages and \d+ images fetched|nothing fetched yet", crawl), crawl
    tar.write_bytes(tar.read_bytes()[:1024])
    out = _lait("status", str(built))
    assert f"{tar.name} is 1,024 bytes" in out.stdout + out.stderr


# Issue 51: what `lait build` and `lait status` call up to date, and the work directory's own files.
QUIET = ("--workers", "1", "--no-progress")


def _shard_line(proc: subprocess.CompletedProcess[str]) -> str:
    (line,) = [x for x in (proc.stdout + proc.stderr).splitlines() if x.startswith("build_shards:")]
    return line


def test_a_shard_with_bytes_flipped_in_place_is_not_up_to_date(built):
    """16 bytes flipped inside a tar, same size: `lait status` calls the build stale, naming the
    tar, and `lait build` writes that shard again (the same bytes as before) instead of saying
    "up to date"; a tar whose time alone changed is hashed and found whole."""
    shards = built / "shards"
    tar = shards / "00002.tar"
    before = snapshot(shards, timings=False)
    size = tar.stat().st_size
    flip(tar)
    assert tar.stat().st_size == size

    status = _lait("status", str(built))
    assert status.returncode == 0, status.stderr
    (line,) = [x for x in status.stdout.splitlines() if x.startswith("build ")]
    assert "00002.tar does not match the SHA-256 it was written with" in line, status.stdout

    rebuilt = _lait("build", str(built), *QUIET)
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert _shard_line(rebuilt).startswith("build_shards: 1 done, 2 up to date"), rebuilt.stderr
    assert snapshot(shards, timings=False) == before
    assert _lait("verify", str(built)).returncode == 0
    marker = json.loads((built / "_done" / "build_shards" / "p00002.json").read_text())
    assert marker["files"]["00002.tar"]["mtime_ns"] == tar.stat().st_mtime_ns  # what the cheap check compares

    os.utime(tar, ns=(tar.stat().st_atime_ns, tar.stat().st_mtime_ns + 10**9))  # touched, not changed
    again = _lait("build", str(built), *QUIET)
    assert again.returncode == 0 and _shard_line(again).startswith("build_shards: 0 done, 3 up to date"), \
        again.stderr


def test_an_unfinished_rebuild_leaves_the_shipped_shards_checked(built):
    """A rebuild that failed (or was killed, or ran out of disk) leaves shards.next/ beside the
    shipped shards/: `lait verify` still reads every shipped tar back against its digest, and
    `lait status` says the rebuild is unfinished and which shipped tar changed."""
    part = max((built / "images_ok").glob("*.parquet"), key=lambda p: p.stat().st_size)
    flip(part)
    assert not build(_cfg(built, force=True)).ok
    flip(part)  # whole again: only the rebuild is left unfinished
    assert (built / "shards.next").is_dir() and (built / "_done" / "shards_staging.json").exists()
    tar = built / "shards" / "00001.tar"
    flip(tar)

    found = _lait("verify", str(built))
    assert found.returncode == 1, found.stderr
    assert any(x.startswith("shards/00001.tar") and "SHA-256" in x for x in found.stderr.splitlines()), found.stderr
    staged = len(list((built / "_done" / "build_shards").glob("p*.json")))
    # Every tar is read back: the 3 shipped and those the rebuild staged.
    assert found.stderr.splitlines()[-1].endswith(
        f"and {3 + staged} shards ({staged} of them staged in shards.next/ by a rebuild not finished yet: "
        "`lait build` finishes it) read back: 1 damaged"), found.stderr

    status = _lait("status", str(built))
    (line,) = [x for x in status.stdout.splitlines() if x.startswith("build ")]
    assert "rebuild unfinished" in line and "shards/00001.tar does not match the SHA-256" in line, status.stdout
    assert "3 shards of the earlier build in shards/" in line, line

    finished = _lait("build", str(built), *QUIET)
    assert finished.returncode == 0, finished.stderr
    assert not (built / "shards.next").exists()
    assert _lait("verify", str(built)).returncode == 0


def test_a_linked_shards_folder_is_refused_and_what_it_points_to_stays(built, tmp_path):
    """`WORK/shards` a link to a folder outside: `lait build --force` refuses with one line naming
    it, before it renames or removes anything (it used to move the link to shards.old/ and fail
    on every later run with a traceback). A shards.old link an older lait left is named too."""
    outside = tmp_path / "elsewhere"
    shutil.move(built / "shards", outside)
    (built / "shards").symlink_to(outside)
    kept = snapshot(outside)

    res = _lait("build", str(built), "--force", *QUIET)
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith(f"lait build: {built / 'shards'} is a symbolic link (to {outside})"), res.stderr
    assert snapshot(outside) == kept
    assert sorted(p.name for p in built.iterdir() if p.name.startswith("shards")) == ["shards"]

    (built / "shards").unlink()
    shutil.move(outside, built / "shards")
    (built / "shards.old").symlink_to(outside)  # as the swap of an older lait left it
    outside.mkdir()
    res = _lait("build", str(built), "--force", *QUIET)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert f"{built / 'shards.old'} is a symbolic link" in res.stderr.strip().splitlines()[-1]
    (built / "shards.old").unlink()
    assert _lait("build", str(built), "--force", *QUIET).returncode == 0
    assert outside.is_dir()
