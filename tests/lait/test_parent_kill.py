"""Issue 29: kill -9 of a command's parent process alone, then the same command again.

`lait crawl`, `lait download`, `lait filter` and `lait build` are killed (SIGKILL, the parent only)
at two moments each; no process of the run may be left a few seconds later, and the rerun
must end as an undisturbed run does: the same rows, no URL twice, no orphan temporary files.
Before, the crawler subprocess crawled on beside the rerun (4,977 page rows for 3,000 pages)
and filter's workers held the lock for their dead parent.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import pytest

from kit.processes import descendants, running, wait_until
from lait.workdir import WorkDir

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")]


def env() -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))


def kill_parent_when(cmd: list[str], moment, timeout: float = 120) -> tuple[int, set[int]]:
    """Start `cmd`, SIGKILL it (and nothing else) once `moment()` holds while it has children;
    its pid and the children it had. Asserts they are all gone within 10 s."""
    proc = subprocess.Popen(cmd, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    children: set[int] = set()
    try:
        def ready() -> bool:
            children.update(descendants(proc.pid))
            return proc.poll() is None and bool(children) and moment()

        assert wait_until(ready, timeout), "the run ended before the moment to kill it"
        children.update(descendants(proc.pid))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        assert wait_until(lambda: not any(running(p) for p in children), 10), \
            f"processes of the killed run still live: {sorted(p for p in children if running(p))}"
    finally:
        for p in children | {proc.pid}:
            if running(p):
                os.kill(p, signal.SIGKILL)
    return proc.pid, children


def lait(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lait", *argv], env=env(), capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def web():
    from lait.testkit.generator import generate_site
    from lait.testkit.server import SiteServer, SlowSite

    with SiteServer(SlowSite(generate_site(60, seed=29), 0.05)) as srv:
        yield srv.url


def crawl_cmd(url: str, out: Path) -> list[str]:
    return [sys.executable, "-m", "lait", "crawl", "--seeds", url + "/", "--out", str(out), "--allow-loopback",
            "--no-autothrottle", "--per-domain", "2", "--n-partitions", "6", "--part-seconds", "0.3",
            "--log-level", "WARNING"]


def outcome(out: Path) -> tuple[Counter, Counter, int]:
    work = WorkDir(out)
    pages = Counter(work.read("pages", columns=["url"]).column("url").to_pylist())
    images = Counter(work.read("images", columns=["image_url"]).column("image_url").to_pylist())
    return pages, images, work.count("rejected")


@pytest.fixture(scope="module")
def undisturbed(web, tmp_path_factory):
    out = tmp_path_factory.mktemp("undisturbed") / "w"
    done = subprocess.run(crawl_cmd(web, out), env=env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    pages, images, rejected = outcome(out)
    assert len(pages) >= 40 and max(pages.values()) == 1
    return out, (pages, images, rejected)


def no_temp_left(out: Path, parent: int) -> None:
    assert not list(out.rglob(".tmp-*")), "unfinished parts left in the work directory"
    assert not list(Path(tempfile.gettempdir()).glob(f"lait-crawl-{parent}-*")), "the killed crawl's temp folder"


@pytest.mark.parametrize("moment", ["early", "late"])
def test_crawl_parent_killed_then_rerun(web, undisturbed, tmp_path, moment):
    _, (pages, images, rejected) = undisturbed
    out = tmp_path / "w"
    work = WorkDir(out)
    at = 3 if moment == "early" else len(pages) * 2 // 3

    def committed() -> bool:
        return (out / "lait.json").exists() and work.count("pages") >= at

    parent, children = kill_parent_when(crawl_cmd(web, out), committed)
    assert children, "the crawl had no crawler process"
    assert work.count("pages") < len(pages), "killed after the crawl was done"
    again = subprocess.run(crawl_cmd(web, out), env=env(), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert outcome(out) == (pages, images, rejected)
    no_temp_left(out, parent)


@pytest.fixture(scope="module")
def filtered(undisturbed, tmp_path_factory):
    """The undisturbed crawl filtered without interruption."""
    src, _ = undisturbed
    out = tmp_path_factory.mktemp("filtered") / "w"
    shutil.copytree(src, out)
    done = lait("filter", str(out), "--workers", "2", "--min-side", "32", "--no-progress")
    assert done.returncode == 0, done.stderr[-3000:]
    return src, filter_outcome(out)


def filter_outcome(out: Path) -> tuple[list, list, set]:
    work = WorkDir(out)
    ok = sorted(work.read("images_ok", columns=["image_url"]).column("image_url").to_pylist())
    rejected = sorted((r["reason"], r["image_url"] or "") for r in work.read("rejected").to_pylist()
                      if r["reason"].startswith("filter/"))
    return ok, rejected, work.done_partitions("filter")


def kill_moment(src: Path, tmp_path: Path, at_start: bool, stage: str):
    """A copy of the work directory `src` to kill a command in, and when to kill its parent:
    as soon as its workers are up (`at_start`), else once `stage` finished a partition."""
    out = tmp_path / "w"
    shutil.copytree(src, out)
    work = WorkDir(out)

    def now() -> bool:
        return at_start or bool(work.done_partitions(stage))

    return out, work, now


@pytest.mark.parametrize("moment", ["workers_up", "first_partition_done"])
def test_filter_parent_killed_then_rerun(filtered, tmp_path, moment):
    src, expected = filtered
    out, work, now = kill_moment(src, tmp_path, moment == "workers_up", "filter")
    cmd = [sys.executable, "-m", "lait", "filter", str(out), "--workers", "2", "--min-side", "32", "--no-progress"]
    parent, children = kill_parent_when(cmd, now)
    assert len(work.done_partitions("filter")) < len(expected[2]), "killed after the filter was done"
    again = lait("filter", str(out), "--workers", "2", "--min-side", "32", "--no-progress")
    assert again.returncode == 0, again.stderr[-3000:]  # refused 'in use by' the dead parent before
    ok, rejected, done = filter_outcome(out)
    assert len(ok) == len(set(ok))
    assert (ok, rejected, done) == expected
    assert not list(out.rglob(".tmp-*"))


@pytest.fixture(scope="module")
def photo_list(tmp_path_factory):
    """A URL list of 60 small images on a slow loopback host, and the undisturbed download."""
    from kit.photos import PhotoServer, PhotoSite

    jpeg = b"\xff\xd8\xff\xe0" + b"\0" * 64
    files = {f"/img/{i}.jpg": jpeg + bytes([i]) for i in range(60)}
    tmp = tmp_path_factory.mktemp("download")
    with PhotoServer(PhotoSite(files, delay=0.05)) as srv:
        path = tmp / "list.csv"
        path.write_text("url,caption\n" + "".join(f"{srv.url}{p},photo {p}\n" for p in files))
        done = lait(*download_args(path, tmp / "w"))
        assert done.returncode == 0, done.stderr[-3000:]
        yield path, download_outcome(tmp / "w")


def download_args(path: Path, out: Path) -> list[str]:
    return ["download", str(path), "--out", str(out), "--allow-loopback", "--no-autothrottle", "--per-domain",
            "2", "--processes", "2", "--n-partitions", "4", "--part-seconds", "0.3", "--no-progress",
            "--log-level", "WARNING"]


def download_outcome(out: Path) -> tuple[Counter, Counter]:
    work = WorkDir(out)
    return (Counter(work.read("url_list", columns=["image_url"]).column("image_url").to_pylist()),
            Counter(work.read("images", columns=["image_url"]).column("image_url").to_pylist()))


@pytest.mark.parametrize("moment", ["early", "late"])
def test_download_parent_killed_then_rerun(photo_list, tmp_path, moment):
    path, expected = photo_list
    assert len(expected[1]) == 60
    out = tmp_path / "w"
    work = WorkDir(out)
    at = 3 if moment == "early" else 40

    def fetched() -> bool:
        return (out / "lait.json").exists() and bool(work.partitions("images")) and work.count("images") >= at

    parent, children = kill_parent_when([sys.executable, "-m", "lait", *download_args(path, out)], fetched)
    # One host: one unit of work, so one fetcher process however many --processes allow.
    assert children, "the download had no fetcher process"
    assert work.count("images") < 60, "killed after the download was done"
    again = lait(*download_args(path, out))
    assert again.returncode == 0, again.stderr[-3000:]
    assert download_outcome(out) == expected
    no_temp_left(out, parent)


@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    """A work directory ready for stage 5 (the build tests' tables), and its undisturbed build."""
    from kit import build_data
    from kit.pipeline_kit import shard_members

    src = tmp_path_factory.mktemp("scored") / "w"
    build_data.make_work(src, n_partitions=8)
    whole = tmp_path_factory.mktemp("built") / "w"
    shutil.copytree(src, whole)
    done = lait(*build_args(whole))
    assert done.returncode == 0, done.stderr[-3000:]
    return src, shard_members(WorkDir(whole))


def build_args(out: Path) -> list[str]:
    return ["build", str(out), "--workers", "2", "--samples-per-shard", "1", "--no-progress"]


@pytest.mark.parametrize("moment", ["pick_workers_up", "first_shard_done"])
def test_build_parent_killed_then_rerun(scored, tmp_path, moment):
    from kit.pipeline_kit import shard_members

    src, expected = scored
    out, work, now = kill_moment(src, tmp_path, moment == "pick_workers_up", "build_shards")
    kill_parent_when([sys.executable, "-m", "lait", *build_args(out)], now)
    assert not (out / "shards" / "sizes.json").exists(), "killed after the build was done"
    again = lait(*build_args(out))
    assert again.returncode == 0, again.stderr[-3000:]
    assert shard_members(work) == expected
    assert not list(out.rglob(".tmp-*"))
