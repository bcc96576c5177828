"""Issue 29: a stage that runs out of disk stops at once with one line naming the path and the
cause, exits 1, and after space is freed a rerun equals a run that never ran short.

The work directory lives on a 40 MB tmpfs mounted for the test (root only; skipped elsewhere),
filled with a filler file up to a few KB before the stage under test."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kit.disks import mounted_tmpfs
from kit.pipeline_kit import shard_members, stage_commands, tables
from lait.workdir import WorkDir

STAGES = ("filter", "clean", "score", "build")


@pytest.fixture(scope="module")
def tmpfs(tmp_path_factory):
    yield from mounted_tmpfs(tmp_path_factory, 40)


def lait(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lait", *argv], capture_output=True, text=True, timeout=600,
                          stdin=subprocess.DEVNULL)


def commands(work: str, model: Path) -> dict[str, list[str]]:
    return dict(zip(STAGES, stage_commands(work, model, ["--no-progress", "--workers", "2"], regions=False)))


def fill(mnt: Path, leave: int) -> Path:
    """A filler file that takes all but `leave` bytes of the tmpfs."""
    filler = mnt / "filler"
    st = os.statvfs(mnt)
    free = st.f_bavail * st.f_frsize
    with open(filler, "wb") as f:
        f.truncate(0)
        chunk = b"\0" * (1 << 20)
        todo = max(0, free - leave)
        while todo > 0:
            f.write(chunk[: min(len(chunk), todo)])
            todo -= min(len(chunk), todo)
    return filler


@pytest.fixture(scope="module")
def undisturbed(crawled, model, tmp_path_factory) -> tuple[WorkDir, dict[str, Path]]:
    """The chain run whole, and a copy of its work directory before each stage: where the test
    of that stage starts (the stages before it ran as they would have)."""
    root = tmp_path_factory.mktemp("whole")
    work = root / "w"
    shutil.copytree(crawled, work)
    before = {}
    for stage, argv in commands(str(work), model).items():
        before[stage] = root / f"before-{stage}"
        shutil.copytree(work, before[stage])
        done = lait(argv)
        assert done.returncode == 0, done.stderr[-2000:]
    return WorkDir(work), before


@pytest.mark.slow
@pytest.mark.parametrize("stage", STAGES)
def test_a_full_disk_stops_the_stage_with_one_line_and_a_rerun_equals_an_undisturbed_run(
        stage, model, tmpfs, undisturbed):
    whole, before = undisturbed
    work = tmpfs / f"w-{stage}"
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(before[stage], work)
    cmds = commands(str(work), model)
    filler = fill(tmpfs, leave=16 << 10)
    try:
        full = lait(cmds[stage])
    finally:
        filler.unlink()
    # Beside the usual INFO lines of what the stage plans: one line, no retries, no traceback.
    lines = [line for line in full.stderr.splitlines() if line.strip() and " INFO " not in line
             and "No pretrained weights loaded" not in line]  # the tiny model is random on purpose
    assert full.returncode == 1, full.stderr[-3000:]
    assert len(lines) == 1, full.stderr[-3000:]
    assert lines[0].startswith(f"lait {stage}: cannot write {tmpfs}/"), lines[0]
    assert "no space left on device" in lines[0]
    assert "Traceback" not in full.stderr
    for name in STAGES[STAGES.index(stage):]:
        again = lait(cmds[name])
        assert again.returncode == 0, again.stderr[-3000:]
    assert tables(WorkDir(work)) == tables(whole)
    assert shard_members(WorkDir(work)) == shard_members(whole)
    shutil.rmtree(work)


def _crawl(out: Path, port: int) -> subprocess.CompletedProcess:
    return lait(["-q", "crawl", "--seeds", f"http://127.0.0.1:{port}/", "--out", str(out), "--allow-loopback",
                 "--no-autothrottle", "--log-level", "WARNING", "--n-partitions", "4"])


def _pages(out: Path) -> list[tuple[str, int]]:
    work = WorkDir(out)
    return sorted((r["url"], r["status"]) for r in work.read("pages", columns=["url", "status"]).to_pylist())


def _images(out: Path) -> list[tuple[str, str]]:
    work = WorkDir(out)
    return sorted((r["image_url"], r["status"]) for r in work.read("images", columns=["image_url", "status"]).to_pylist())


@pytest.mark.slow
def test_a_crawl_that_fills_the_disk_exits_1_with_one_line_and_its_rerun_is_whole(tmpfs, tmp_path):
    """Today's failure: 'No space left on device' in the log, stats 'finished', exit 0, and the
    tables short of pages and images."""
    from lait.testkit.generator import generate_site
    from lait.testkit.server import SiteServer

    out = tmpfs / "crawl"
    shutil.rmtree(out, ignore_errors=True)
    with SiteServer(generate_site(40, seed=5)) as srv:
        whole = tmp_path / "whole"
        assert _crawl(whole, srv.port).returncode == 0
        filler = fill(tmpfs, leave=256 << 10)
        try:
            done = _crawl(out, srv.port)
        finally:
            filler.unlink()
        assert done.returncode == 1, done.stderr[-3000:]
        line = [x for x in done.stderr.splitlines() if x.startswith("lait crawl: ")]
        assert line and "no space left on device" in line[0] and str(tmpfs) in line[0], done.stderr[-3000:]
        assert "Traceback" not in done.stderr
        assert len(_pages(out)) < len(_pages(whole))  # it did stop short
        again = _crawl(out, srv.port)
        assert again.returncode == 0, again.stderr[-3000:]
    assert _pages(out) == _pages(whole)  # every page once
    assert _images(out) == _images(whole)
