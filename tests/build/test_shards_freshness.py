"""Issue 20's commands in issue 17's truthful work directories: the image settings are part of
the build's fingerprint, `lait select` and `lait export-embeddings` hold the lock of what they
write, and a selection refuses a pool its work directory no longer matches."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from kit import build_data as data  # noqa: E402
from lait.build.config import BuildConfig, SelectConfig
from lait.build.pipeline import build
from lait.build.select import select
from lait.config import ConfigError
from lait.lock import locked
from lait.workdir import WorkDir


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("work") / "w"
    data.make_work(root, embeddings=True)
    assert build(BuildConfig(work=str(root), workers=1, progress=False, samples_per_shard=16)).ok
    return root


def image_sizes(folder: Path) -> set[tuple[int, int]]:
    out = set()
    for p in sorted(folder.glob("*.tar")):
        with tarfile.open(p) as tf:
            out |= {(m["width"], m["height"]) for m in
                    (json.loads(tf.extractfile(x).read()) for x in tf.getmembers() if x.name.endswith(".json"))}
    return out


def test_image_settings_are_in_the_build_fingerprint_and_run_settings_are_not(tmp_path):
    work = tmp_path / "w"
    data.make_work(work)
    cfg = BuildConfig(work=str(work), workers=1, progress=False, samples_per_shard=16)
    assert build(cfg).ok
    assert {"resize_mode", "image_size", "resize_only_if_bigger", "encode_format", "encode_quality"} <= set(
        cfg.content())
    again = build(cfg.replace(workers=2, progress=False))  # how it runs, not what it writes
    assert again.ok and again.reused and not [line for r in again.reports for line in r.plan]

    resized = build(cfg.replace(resize_mode="center_crop", image_size=64))
    assert resized.ok and not resized.reused
    assert resized.reports[0].plan[0] == "build: image_size 256 -> 64, resize_mode no -> center_crop: redoing"
    assert image_sizes(work / "shards") == {(64, 64)}
    webp = build(cfg.replace(resize_mode="center_crop", image_size=64, encode_format="webp"))
    assert "encode_format jpg -> webp" in webp.reports[0].plan[0]
    with tarfile.open(work / "shards" / "00000.tar") as tf:
        assert {m.name.rsplit(".", 1)[1] for m in tf.getmembers()} == {"webp", "txt", "json"}


def _lait(argv: list[str]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "LAIT_WORK_LOCK"}
    return subprocess.run([sys.executable, "-m", "lait", *argv], capture_output=True, text=True, timeout=300,
                          env=env)


def test_select_holds_the_lock_of_its_folder_and_reads_a_busy_work_directory(built, tmp_path):
    out = tmp_path / "sel"
    quiet = ["--workers", "1", "--no-progress"]
    with locked(WorkDir(out), "lait select"):
        res = _lait(["select", str(built), "--out", str(out), *quiet])
    assert res.returncode == 2, res.stderr
    assert "in use by `lait select`" in res.stderr.strip().splitlines()[-1]
    # The work directory it only reads is held shared by another selection: they run side by side.
    with locked(WorkDir(built), "lait select elsewhere", shared=True):
        res = _lait(["select", str(built), "--out", str(out), "--top-fraction", "0.5", *quiet])
        assert res.returncode == 0, res.stderr
        # A folder inside the work directory is written into it: its lock is needed too.
        res = _lait(["select", str(built), "--out", str(built / "sel"), *quiet])
        assert res.returncode == 2 and "in use by `lait select elsewhere`" in res.stderr, res.stderr
    assert sum(json.loads((out / "sizes.json").read_text()).values()) == 22  # ceil(0.5 * 43), one fails
    assert not (built / "sel").exists() or not list((built / "sel").glob("*.tar"))


def test_select_and_a_build_of_its_work_directory_keep_each_other_out(built, tmp_path):
    """`lait select` while `lait build --force` rewrites the pool it reads used to die with a
    54-line traceback and leave an output folder holding only `_lock`: it takes no lock on the
    work directory it reads. It now holds that lock shared: a selection finds the build there
    and exits 2 with one line, writing nothing, and a build finds the selection there."""
    out = tmp_path / "sel"
    quiet = ["--workers", "1", "--no-progress"]
    with locked(WorkDir(built), "lait build"):
        res = _lait(["select", str(built), "--out", str(out), *quiet])
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().splitlines() == [
        f"lait select: {built} is in use by `lait build` (pid {os.getpid()} on {os.uname().nodename}, since "
        + res.stderr.split(", since ", 1)[1].strip()]
    assert not out.exists()

    with locked(WorkDir(built), "lait select", shared=True):
        res = _lait(["build", str(built), "--force", *quiet])
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr
    assert f"{built} is in use by `lait select`" in res.stderr.strip().splitlines()[-1]

    res = _lait(["select", str(built), "--out", str(out), *quiet])  # the build left: the selection runs
    assert res.returncode == 0, res.stderr
    assert sum(json.loads((out / "sizes.json").read_text()).values()) == 42


def test_export_holds_the_lock_of_its_folder(built, tmp_path):
    out = tmp_path / "embs"
    with locked(WorkDir(out), "lait export-embeddings"):
        res = _lait(["export-embeddings", str(built), "--out", str(out)])
    assert res.returncode == 2 and "in use by `lait export-embeddings`" in res.stderr, res.stderr
    res = _lait(["export-embeddings", str(built), "--out", str(out)])
    assert res.returncode == 0, res.stderr
    assert len(list((out / "img_emb").glob("img_emb_*.npy"))) == 3


def test_an_export_of_fewer_tars_leaves_no_rows_of_the_earlier_one(built, tmp_path):
    from lait.build.export import ExportConfig, export_embeddings

    out = tmp_path / "embs"
    assert export_embeddings(ExportConfig(work=str(built), out=str(out)))["files"] == 3
    assert select(SelectConfig(work=str(built), out=str(tmp_path / "one"), workers=1, progress=False,
                               samples_per_shard=100)).ok
    assert export_embeddings(ExportConfig(work=str(built), out=str(out), shards=str(tmp_path / "one")))["files"] == 1
    for folder in ("img_emb", "text_emb", "metadata"):
        assert len(list((out / folder).iterdir())) == 1, folder


def test_select_refuses_a_pool_older_than_what_it_points_into(built, tmp_path):
    work = tmp_path / "w"
    shutil.copytree(built, work)
    w = WorkDir(work)
    # As `lait filter` redoing a partition would: images_ok/ parts written by another task.
    stats = sorted(w.table_dir("images_ok").glob("*.stats.json"))[0]
    record = json.loads(stats.read_text())
    record["fingerprint"] = "0" * 32
    stats.write_text(json.dumps(record))
    with pytest.raises(ConfigError, match="images_ok changed since `lait build` made the pool"):
        select(SelectConfig(work=str(work), out=str(tmp_path / "sel"), workers=1, progress=False))
    assert build(BuildConfig(work=str(work), workers=1, progress=False, samples_per_shard=16)).ok
    assert select(SelectConfig(work=str(work), out=str(tmp_path / "sel"), workers=1, progress=False)).ok


def test_force_redoes_the_same_selection(built, tmp_path):
    out = tmp_path / "sel"
    cfg = SelectConfig(work=str(built), out=str(out), workers=1, progress=False, samples_per_shard=16)
    first = select(cfg)
    assert first.ok and first.reports[0].done == [0, 1, 2]
    assert select(cfg).reports[0].done == []  # resumed: nothing left to do
    forced = select(cfg.replace(force=True))
    assert forced.reports[0].done == [0, 1, 2]
    assert (out / "00000.tar").read_bytes() == (built / "shards" / "00000.tar").read_bytes()
