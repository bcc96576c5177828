import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kit import toy_stage as toy  # noqa: E402
from lait.executor import LocalExecutor
from lait.stage import run_part

# The toy stage's script is a module of the test kit (tests/kit/), which pytest puts on sys.path.
KIT_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(
    [str(Path(__file__).resolve().parents[1])] + [p for p in [os.environ.get("PYTHONPATH")] if p])}


def output_bytes(root: Path) -> dict[str, bytes]:
    """Every finished output file, by relative path (markers carry timings, so they are left out)."""
    out = {}
    for table in ("images_ok", "rejected"):
        for p in sorted((root / table).glob("*")):
            out[f"{table}/{p.name}"] = p.read_bytes()
    return out


def test_one_and_two_workers_write_identical_parts(tmp_path):
    a = toy.make_input(tmp_path / "a")
    b = toy.make_input(tmp_path / "b")
    ra = LocalExecutor(workers=1, show_progress=False).run(toy.ToyStage(), a)
    rb = LocalExecutor(workers=2, show_progress=False).run(toy.ToyStage(), b)
    assert ra.ok and rb.ok and ra.done == rb.done == a.partitions("images")
    oa, ob = output_bytes(a.root), output_bytes(b.root)
    assert oa.keys() == ob.keys() and oa == ob
    kept, rejected = a.count("images_ok"), a.count("rejected")
    assert kept > 0 and rejected > 0 and kept + rejected == a.count("images")
    assert set(a.read("rejected")["reason"].to_pylist()) == {"toy/odd"}


def test_rerun_skips_finished_partitions(tmp_path):
    work = toy.make_input(tmp_path)
    first = LocalExecutor(workers=2, show_progress=False).run(toy.ToyStage(), work)
    before = output_bytes(work.root)
    second = LocalExecutor(workers=2, show_progress=False).run(toy.ToyStage(), work)
    assert second.done == [] and second.skipped == first.done
    assert output_bytes(work.root) == before


def test_failing_partition_is_reported_and_others_complete(tmp_path):
    work = toy.make_input(tmp_path)
    parts = work.partitions("images")
    bad = parts[3]
    report = LocalExecutor(workers=2, retries=1, show_progress=False).run(toy.ToyStage(fail_partition=bad), work)
    assert not report.ok
    assert list(report.failed) == [bad]
    assert "toy failure in partition" in report.failed[bad]
    assert f"partition {bad:05d} failed" in report.summary()
    assert report.done == [p for p in parts if p != bad]
    assert not work.is_done("toy", bad)
    assert work.part_files("images_ok", bad) == []


def test_failing_partition_in_subprocess_is_named_and_exit_code_is_nonzero(tmp_path):
    work = toy.make_input(tmp_path)
    bad = work.partitions("images")[0]
    proc = subprocess.run([sys.executable, "-m", "kit.toy_stage", str(work.root), "2", str(bad)],
                          env=KIT_ENV, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert f"partition {bad:05d} failed" in proc.stdout
    assert f"{len(work.partitions('images')) - 1} done" in proc.stdout


def test_worker_killed_midway_is_retried(tmp_path):
    """A worker process that dies (OOM killer, SIGKILL) breaks the pool; its partition is retried."""
    work = toy.make_input(tmp_path)

    class KillOnce(toy.ToyStage):
        def process(self, ctx):
            flag = ctx.work.root / f"killed-{ctx.partition}"
            if ctx.partition == 2 and not flag.exists():
                flag.write_text("x")
                os.kill(os.getpid(), signal.SIGKILL)
            super().process(ctx)

    toy.KillOnce = KillOnce
    KillOnce.__module__, KillOnce.__qualname__ = toy.__name__, "KillOnce"
    report = LocalExecutor(workers=2, retries=1, show_progress=False).run(KillOnce(), work)
    assert report.ok, report.summary()
    assert report.done == work.partitions("images")
    ref = toy.make_input(tmp_path / "ref")
    LocalExecutor(workers=1, show_progress=False).run(toy.ToyStage(), ref)
    assert output_bytes(work.root) == output_bytes(ref.root)


@pytest.mark.parametrize("workers", [1, 2])
def test_sigkill_then_rerun_matches_uninterrupted_run(tmp_path, workers):
    ref = toy.make_input(tmp_path / "ref")
    LocalExecutor(workers=1, show_progress=False).run(toy.ToyStage(), ref)

    work = toy.make_input(tmp_path / "killed")
    env = {**KIT_ENV, "TOY_SLEEP": "0.4"}
    cmd = [sys.executable, "-m", "kit.toy_stage", str(work.root), str(workers)]
    proc = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 60
    while time.time() < deadline and len(work.done_stats("toy")) < 2:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    done_before = len(work.done_stats("toy"))
    assert 0 < done_before < len(work.partitions("images")), "the kill must land mid-run"

    rerun = subprocess.run(cmd, env=KIT_ENV, capture_output=True, text=True, timeout=120)
    assert rerun.returncode == 0, rerun.stderr
    assert f"{done_before} up to date" in rerun.stdout
    assert output_bytes(work.root) == output_bytes(ref.root)
    assert not list(work.root.rglob(".tmp-*"))


def test_run_part_replaces_leftovers_of_an_interrupted_attempt(tmp_path):
    work = toy.make_input(tmp_path)
    p = work.partitions("images")[0]
    stale = work.writer("images_ok", p, "toy" + f"{p:05d}")
    stale.write({"image_url": "stale", "status": 200, "fetched_at": toy.T0, "width": 1, "height": 1,
                 "format": "X", "sha256": "0", "phash": "0"})
    stale.close()
    run_part(toy.ToyStage(), str(work.root), p)
    assert "stale" not in work.read("images_ok", p)["image_url"].to_pylist()
