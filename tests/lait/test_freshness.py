"""Truthful work directories (issue 17): what a stage wrote always matches its input and its
settings, a change redoes exactly what it affects and its downstream (and then equals a fresh
run), and one run writes to a work directory at a time."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kit.pipeline_kit import NO_GATES, crawl_site, part_bytes, shard_members, stage_commands, tables
from lait.app.cli import main as lait
from lait.workdir import WorkDir

QUIET = ["--no-progress", "--workers", "2"]


def copy(crawled: Path, dest: Path) -> str:
    shutil.copytree(crawled, dest)
    return str(dest)


def run(commands, capsys) -> str:
    err = ""
    for argv in commands:
        code = lait(argv)
        out = capsys.readouterr()
        err += out.err
        assert code == 0, (argv, out.err[-3000:])
    return err


@pytest.mark.slow
def test_changed_setting_redoes_what_it_affects_and_equals_a_fresh_run(crawled, model, tmp_path, capsys):
    work = copy(crawled, tmp_path / "changed")
    run(stage_commands(work, model, QUIET), capsys)
    before = part_bytes(WorkDir(work))

    # Nothing changed: nothing is redone, no file is rewritten.
    log = run(stage_commands(work, model, QUIET), capsys)
    assert "redoing" not in log and "to do" not in log and "rebuilding" not in log
    assert part_bytes(WorkDir(work)) == before

    # A filter setting changes: filter redoes every partition, clean none, score and build
    # follow because their input changed.
    log = run(stage_commands(work, model, QUIET, filter_args=("--min-side", "200")), capsys)
    assert "filter: min_side 300 -> 200: redoing 4 of 4 partitions" in log
    assert "clean: all 4 partitions up to date" in log
    assert "score: 4 partitions have changed input: redoing 4" in log
    assert "build: changed input: redoing" in log

    fresh = copy(crawled, tmp_path / "fresh")
    run(stage_commands(fresh, model, QUIET, filter_args=("--min-side", "200")), capsys)
    a, b = WorkDir(work), WorkDir(fresh)
    assert part_bytes(a) == part_bytes(b)  # every table, byte for byte
    assert shard_members(a) == shard_members(b)
    assert tables(a)["images_ok"] != [] and part_bytes(a) != before

    # The history says what each run redid; the current settings are the last complete run's.
    history = [p.name for p in a.config_history()]
    assert sum(n.endswith("-filter.yaml") for n in history) == 3
    assert "min_side: 200" in (a.root / "_configs" / "filter.yaml").read_text()
    last_filter = [p for p in a.config_history() if p.name.endswith("-filter.yaml")][-1].read_text()
    assert "min_side 300 -> 200: redoing 4 of 4 partitions" in last_filter

    # --force redoes everything, with the same result.
    log = run([["filter", work, *NO_GATES, "--min-side", "200", "--force", *QUIET]], capsys)
    assert "filter: --force: redoing 4 of 4 partitions" in log


@pytest.mark.slow
def test_status_shows_stale_stages_and_why(crawled, model, tmp_path, capsys):
    work = copy(crawled, tmp_path / "status")
    run(stage_commands(work, model, QUIET, regions=False), capsys)
    assert lait(["status", work]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines() if line.split()}
    for stage in ("filter", "clean", "score"):
        assert lines[stage].split()[1:5] == ["4", "4", "0", "0"], lines[stage]
    assert "images_ok" in out and "scored" in out

    pipeline = tmp_path / "pipeline.yaml"
    pipeline.write_text("filter: {min_side: 200, unsafe_model: none}\n"
                        "clean: {languages: [en, de, fr]}\n"
                        f"score: {{model: tiny-clip, model_config: {model}, allow_random_init: true, batch_size: 16}}\n"
                        "build: {samples_per_shard: 40, use_embedding_dups: false, face_model: none}\n")
    assert lait(["status", work, "--config", str(pipeline)]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines() if line.split()}
    assert lines["filter"].split()[1:5] == ["4", "0", "4", "0"] and "min_side 300 -> 200 (4)" in lines["filter"]
    assert "clean" in lines and "waits on" not in lines["clean"]
    assert "waits on filter" in lines["score"] and "waits on filter and score" in lines["build"]


@pytest.mark.slow
def test_grown_input_is_processed(tmp_path, capsys):
    work = tmp_path / "grown"
    crawl_site(work, pages=60, max_pages=12)
    assert lait(["filter", str(work), *NO_GATES, *QUIET]) == 0
    small = WorkDir(work).count("images")
    crawl_site(work, pages=60)  # the crawl resumed: more pages, more images, new parts
    w = WorkDir(work)
    assert w.count("images") > small
    capsys.readouterr()
    assert lait(["filter", str(work), *NO_GATES, *QUIET]) == 0
    log = capsys.readouterr().err
    assert "have new input: redoing" in log or "has new input: redoing" in log
    rejected = {r["image_url"] for r in w.read("rejected").to_pylist() if r["reason"].startswith("filter/")}
    kept = set(w.read("images_ok", columns=["image_url"]).column(0).to_pylist())
    fetched = set(w.read("images", columns=["image_url"]).column(0).to_pylist())
    assert fetched == kept | rejected and not kept & rejected


def test_a_second_writer_exits_2_naming_the_first(tmp_path):
    from lait.lock import locked

    work = WorkDir(tmp_path / "w", n_partitions=2).init()
    env = {**os.environ}
    env.pop("LAIT_WORK_LOCK", None)
    with locked(work, "lait crawl"):
        res = subprocess.run([sys.executable, "-m", "lait", "filter", str(work.root)], capture_output=True,
                             text=True, timeout=120, env=env)
    assert res.returncode == 2, res.stderr
    line = res.stderr.strip().splitlines()[-1]
    assert line.startswith("lait filter: ") and "in use by `lait crawl`" in line and f"pid {os.getpid()}" in line
    assert "Traceback" not in res.stderr

    # The lock was released cleanly: the next writer takes it without a word.
    res = subprocess.run([sys.executable, "-m", "lait", "filter", str(work.root)], capture_output=True, text=True,
                         timeout=120, env=env)
    assert res.returncode == 0 and "taking over" not in res.stderr, res.stderr


def test_a_lock_left_by_a_dead_process_is_taken_over(tmp_path, caplog):
    from lait.lock import locked

    work = WorkDir(tmp_path / "w", n_partitions=2).init()
    (work.root / "_lock").write_text(json.dumps({"command": "lait score", "pid": 999999, "host": "gone",
                                                 "since": "2026-01-01T00:00:00+00:00"}))
    with caplog.at_level("WARNING", logger="lait.lock"), locked(work, "lait filter"):
        pass
    assert "taking over the lock left by `lait score` (pid 999999 on gone" in caplog.text


def test_crawlers_of_one_redis_frontier_share_the_lock_and_keep_out_the_rest(tmp_path, caplog):
    """`lait crawl --redis-url` on several machines is one crawl: shared holders coexist, an
    exclusive writer is kept out while any of them runs, and the last one out leaves no name."""
    from lait.lock import WorkDirBusy, _lock_local, locked

    work = WorkDir(tmp_path / "w", n_partitions=2).init()
    with _lock_local(work, "lait crawl (machine a)", shared=True):
        with _lock_local(work, "lait crawl (machine b)", shared=True):
            with pytest.raises(WorkDirBusy, match=r"in use by `lait crawl \(machine a\)`"):
                with _lock_local(work, "lait filter"):
                    pass
        with pytest.raises(WorkDirBusy):
            with _lock_local(work, "lait filter"):
                pass
    with caplog.at_level("WARNING", logger="lait.lock"), locked(work, "lait filter"):
        with pytest.raises(WorkDirBusy, match="in use by `lait filter`"):
            with _lock_local(work, "lait crawl (machine c)", shared=True):
                pass
    assert "taking over" not in caplog.text


def _concurrent(argv: list[str], env: dict | None = None) -> list[subprocess.CompletedProcess]:
    procs = [subprocess.Popen([sys.executable, "-m", "lait", *argv], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    return [subprocess.CompletedProcess(p.args, p.wait(timeout=600), *p.communicate()) for p in procs]


@pytest.mark.slow
@pytest.mark.parametrize("command", ["filter", "build"])
def test_two_concurrent_runs_one_exits_2_and_the_other_is_undisturbed(crawled, model, tmp_path, capsys, command):
    work = copy(crawled, tmp_path / "twice")
    alone = copy(crawled, tmp_path / "alone")
    # Two filter runs at once keep the model gates on: their ~25 s make sure the runs overlap.
    gates = command == "filter"
    commands = stage_commands(work, model, ["--no-progress"], regions=False, gates=gates)
    upto = [c[0] for c in commands].index(command)
    run(commands[:upto], capsys)
    run(stage_commands(alone, model, ["--no-progress"], regions=False, gates=gates)[:upto + 1], capsys)
    env = {k: v for k, v in os.environ.items() if k != "LAIT_WORK_LOCK"}
    results = _concurrent(commands[upto][:1] + commands[upto][1:], env)
    codes = sorted(r.returncode for r in results)
    assert codes == [0, 2], [r.stderr[-2000:] for r in results]
    loser = next(r for r in results if r.returncode == 2)
    assert f"is in use by `lait {command}`" in loser.stderr.strip().splitlines()[-1]
    assert part_bytes(WorkDir(work)) == part_bytes(WorkDir(alone))


@pytest.mark.slow
def test_two_concurrent_crawls_one_exits_2_and_the_other_stores_every_page_once(tmp_path):
    from lait.testkit.generator import generate_site
    from lait.testkit.server import SiteServer

    out = tmp_path / "crawl"
    env = {k: v for k, v in os.environ.items() if k != "LAIT_WORK_LOCK"}
    with SiteServer(generate_site(30, seed=5)) as srv:
        argv = ["crawl", "--seeds", srv.url + "/", "--out", str(out), "--allow-loopback", "--no-autothrottle",
                "--log-level", "WARNING"]
        results = _concurrent(argv, env)
    assert sorted(r.returncode for r in results) == [0, 2], [r.stderr[-2000:] for r in results]
    loser = next(r for r in results if r.returncode == 2)
    assert "is in use by `lait crawl`" in loser.stderr
    urls = WorkDir(out).read("pages", columns=["url"]).column(0).to_pylist()
    assert len(urls) == len(set(urls)) and len(urls) >= 30


def test_a_run_that_loses_the_race_names_a_holder_that_has_not_written_its_name_yet(tmp_path):
    """Between taking the lock and writing its name the holder leaves the lock file empty for a
    moment; a second run that finds the lock taken then waits for the name instead of printing
    `?` (two concurrent `lait filter` runs hit this window)."""
    import fcntl
    import threading

    from lait.lock import LOCAL_FILE, WorkDirBusy, _lock_local

    work = WorkDir(tmp_path / "w", n_partitions=2).init()
    fd = os.open(work.root / LOCAL_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    name = json.dumps({"command": "lait filter", "pid": 1, "host": "h", "since": "now"}).encode()
    writer = threading.Timer(0.2, os.pwrite, (fd, name, 0))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # taken, no name yet
        writer.start()
        with pytest.raises(WorkDirBusy, match=r"in use by `lait filter` \(pid 1 on h"):
            with _lock_local(work, "lait filter"):
                pass
    finally:
        writer.join()
        os.close(fd)


@pytest.mark.parametrize("entry", ["_lock", "_done/filter"])
def test_a_linked_lock_or_marker_folder_is_refused_and_what_it_points_to_is_untouched(tmp_path, entry):
    """`WORK/_lock` a link to a file outside the work directory: `lait filter` used to open it
    through the link, truncate it and exit 0. Now it, and a linked folder of markers, make the
    command refuse with one line naming the link, before anything is written."""
    work = WorkDir(tmp_path / "w", n_partitions=2).init()
    if entry == "_lock":
        target = tmp_path / "precious.txt"
        target.write_text("someone else's file\n")
    else:
        target = tmp_path / "elsewhere"
        target.mkdir()
        (target / "notes.txt").write_text("someone else's folder\n")
    link = work.root / entry
    if link.exists():
        link.unlink()
    link.parent.mkdir(exist_ok=True)
    link.symlink_to(target)
    env = {k: v for k, v in os.environ.items() if k != "LAIT_WORK_LOCK"}
    res = subprocess.run([sys.executable, "-m", "lait", "filter", str(work.root), "--workers", "1",
                          "--no-progress"], capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().splitlines() == [
        f"lait filter: {link} is a symbolic link (to {target}); lait does not write or remove a work directory's "
        f"own files through a link: remove it (for a folder, move what it points to in its place)"]
    if entry == "_lock":
        assert target.read_text() == "someone else's file\n"
    else:
        assert [p.name for p in target.iterdir()] == ["notes.txt"]
    link.unlink()
    ok = subprocess.run([sys.executable, "-m", "lait", "filter", str(work.root), "--workers", "1", "--no-progress"],
                        capture_output=True, text=True, timeout=120, env=env)
    assert ok.returncode == 0, ok.stderr
