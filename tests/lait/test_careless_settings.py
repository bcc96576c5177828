"""Issue 29, careless settings: each is one line on stderr, exit status 2, and nothing written.

NaN and infinities for float settings, a folder that is not a work directory, an empty URL
list; `lait run WORK` without `--config` keeps the settings WORK was built with; a command
waiting on another process says so."""

from __future__ import annotations

import dataclasses
import fcntl
import io
import re
import subprocess
import sys
import threading
import time
import typing
from pathlib import Path

import pytest

from lait.config import Config, ConfigError, _base_type, _is_config_class
from lait.parts import PartitionedWriter
from lait.workdir import WorkDir


def lait(*argv: str, timeout: float = 300, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lait", *argv], capture_output=True, text=True, timeout=timeout,
                          cwd=cwd)


def listing(folder: Path) -> dict[str, int]:
    """Every file and folder below `folder` with its size (folders: -1)."""
    if not folder.exists():
        return {}
    return {str(p.relative_to(folder)): (p.stat().st_size if p.is_file() else -1) for p in sorted(folder.rglob("*"))}


def refused(proc: subprocess.CompletedProcess, *words: str) -> str:
    """The one line a refused command printed (exit status 2, no traceback)."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, (proc.returncode, proc.stderr[-2000:])
    assert all(w in lines[0] for w in words), lines[0]
    return lines[0]


# -- NaN and infinities ------------------------------------------------------------------------

def _config_classes() -> list[type]:
    from lait.app.cli import build_parser

    build_parser()  # imports every command module, hence every command's config class
    seen: dict[type, None] = {}
    todo = list(Config.__subclasses__())
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen[cls] = None
        todo += cls.__subclasses__()
        for f in dataclasses.fields(cls):  # nested settings (train stages, optimisers, ...)
            tp, _ = _base_type(typing.get_type_hints(cls)[f.name])
            for inner in (tp, *typing.get_args(tp)):
                if _is_config_class(inner) and inner not in seen:
                    todo.append(inner)
    return sorted(seen, key=lambda c: f"{c.__module__}.{c.__qualname__}")


def _float_settings() -> list[tuple[type, str]]:
    out = []
    for cls in _config_classes():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if f.init and _base_type(hints[f.name])[0] is float:
                out.append((cls, f.name))
    return out


FLOAT_SETTINGS = _float_settings()


def test_there_are_float_settings_to_check():
    names = {name for _, name in FLOAT_SETTINGS}
    assert {"max_aspect", "min_score", "min_letter_share"} <= names and len(FLOAT_SETTINGS) > 20


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf"), "nan", "NaN", "inf", "-Infinity"])
def test_no_float_setting_takes_nan_or_infinity(value):
    from lait.config import build

    for cls, name in FLOAT_SETTINGS:
        with pytest.raises(ConfigError, match=f"{name}: expected a finite number"):
            build(cls, {name: value})


@pytest.fixture
def work(tmp_path) -> Path:
    """A work directory with one page and one image: what a crawl leaves."""
    from PIL import Image

    root = tmp_path / "work"
    w = WorkDir(root, n_partitions=1).init()
    buf = io.BytesIO()
    Image.new("RGB", (400, 320), (200, 40, 40)).save(buf, "PNG")
    parts = PartitionedWriter(w, "crawl-test")
    from datetime import datetime, timezone

    now = datetime(2024, 1, 1, tzinfo=timezone.utc)
    html = b"<html><body><img src='/a.png' alt='A red square painted on a white wall'></body></html>"
    parts.write("pages", 0, {"url": "http://site.test/p.html", "status": 200, "fetched_at": now,
                             "headers": {"content-type": "text/html"}, "content_type": "text/html; charset=utf-8",
                             "html": html, "encoding": "utf-8", "depth": 0, "referer": None, "error": None})
    parts.write("images", 0, {"image_url": "http://site.test/a.png", "page_url": "http://site.test/p.html",
                              "bytes": buf.getvalue(), "mime": "image/png", "status": 200, "fetched_at": now,
                              "error": None})
    parts.close()
    return root


@pytest.mark.parametrize("argv, words", [
    (["filter", "{w}", "--max-aspect", "nan"], ["lait filter", "max_aspect", "finite", "nan"]),
    (["build", "{w}", "--min-score=nan"], ["lait build", "min_score", "finite"]),
    (["clean", "{w}", "--min-letter-share", "inf"], ["lait clean", "min_letter_share", "finite"]),
    (["build", "{w}", "--min-score=-inf"], ["lait build", "min_score", "finite"]),
])
def test_nan_and_infinity_flags_are_refused(work, argv, words):
    before = listing(work)
    refused(lait(*[a.format(w=work) for a in argv]), *words)
    assert listing(work) == before


def test_nan_in_a_pipeline_yaml_is_refused(work, tmp_path):
    (tmp_path / "p.yaml").write_text("filter: {max_aspect: .nan}\nbuild: {min_score: .inf}\n")
    before = listing(work)
    refused(lait("run", str(work), "--config", str(tmp_path / "p.yaml")), "max_aspect", "finite")
    refused(lait("filter", str(work), "--config", str(tmp_path / "p.yaml")), "max_aspect", "finite")
    assert listing(work) == before


# -- a folder that is not a work directory -----------------------------------------------------

@pytest.mark.parametrize("command", [["filter"], ["clean"], ["score", "--model", "tiny"], ["build"], ["run"],
                                     ["status"], ["stats"]])
def test_a_folder_that_is_not_a_work_directory_is_refused_before_anything_is_written(tmp_path, work, command):
    empty = tmp_path / "empty"
    empty.mkdir()
    table = work / "images"  # a table folder inside a work directory
    for folder, words in ((empty, ["not a lait work directory"]), (table, ["inside the work directory", str(work)])):
        before, work_before = listing(folder), listing(work)
        refused(lait(command[0], str(folder), *command[1:]), *words)
        assert listing(folder) == before and listing(work) == work_before


def test_a_table_folder_is_not_made_a_work_directory_by_stage_1(tmp_path, work):
    urls = tmp_path / "urls.txt"
    urls.write_text("http://a.test/x.jpg\n")
    table = work / "images"
    for argv in (["download", str(urls), "--caption-col", "", "--no-fetch", "--out", str(table)],
                 ["crawl", "--seeds", "http://a.test/", "--out", str(table)]):
        before = listing(work)
        refused(lait(*argv), "inside the work directory", str(work))
        assert listing(work) == before


# -- an empty URL list --------------------------------------------------------------------------

@pytest.mark.parametrize("name, text, flags", [("urls.txt", "", ["--caption-col", ""]),
                                               ("urls.txt", "# only a comment\n\n", ["--caption-col", ""]),
                                               ("urls.csv", "url,caption\n", []),
                                               ("urls.jsonl", "\n", [])])
def test_an_empty_url_list_is_one_line_and_nothing_written(tmp_path, name, text, flags):
    path = tmp_path / name
    path.write_text(text)
    out = tmp_path / "out"
    line = refused(lait("download", str(path), "--out", str(out), *flags), "lait download", name, "no URL")
    assert "Scrapy" not in line and not out.exists()


# -- lait run without --config ---------------------------------------------------------------------

def test_run_without_config_keeps_the_settings_the_work_directory_was_built_with(work, tmp_path):
    (tmp_path / "p.yaml").write_text("filter: {min_side: 64, max_aspect: 2.0}\nclean: {languages: [any], min_words: 3}\n")
    first = lait("run", str(work), "--config", str(tmp_path / "p.yaml"), "--to", "clean", "--no-progress")
    assert first.returncode == 0, first.stderr[-3000:]
    assert "filter: 1 done" in first.stderr and "clean: 1 done" in first.stderr
    built = {name: (work / "_configs" / f"{name}.yaml").read_text() for name in ("filter", "clean")}

    again = lait("run", str(work), "--to", "clean", "--no-progress")
    assert again.returncode == 0, again.stderr[-3000:]
    said = [l for l in again.stderr.splitlines() if "no --config" in l]
    assert len(said) == 1 and "last built with" in said[0] and "filter.yaml, clean.yaml" in said[0], said
    # Nothing redone: the defaults (min_side 300, languages en) would have redone both stages.
    assert "filter: 0 done, 1 up to date" in again.stderr and "clean: 0 done, 1 up to date" in again.stderr
    assert {n: (work / "_configs" / f"{n}.yaml").read_text() for n in built} == built

    # Other settings given: they are used.
    (tmp_path / "q.yaml").write_text("clean: {languages: [any], min_words: 1}\n")
    other = lait("run", str(work), "--config", str(tmp_path / "q.yaml"), "--from", "clean", "--to", "clean",
                 "--no-progress")
    assert other.returncode == 0 and "clean: 1 done" in other.stderr and "no --config" not in other.stderr


@pytest.mark.slow
def test_run_without_config_on_the_demo_redoes_nothing(demo_run, tmp_path):
    """The issue's case: `lait run WORK` on a demo work directory used the defaults, redid
    clean with other settings and stopped at score (the demo scores with `model: demo`)."""
    import shutil

    out, _ = demo_run
    work = tmp_path / "work"
    shutil.copytree(out / "work", work)
    shards = listing(work / "shards")
    again = lait("run", str(work), "--no-progress", timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "filter.yaml, clean.yaml, score.yaml, build.yaml" in again.stderr
    for stage in ("filter", "clean", "score"):
        assert re.search(rf"^{stage}: 0 done, \d+ up to date, 0 failed", again.stderr, re.M), again.stderr[-3000:]
    assert listing(work / "shards") == shards


@pytest.mark.slow
def test_a_stage_command_without_flags_continues_with_the_demos_settings(demo_run, tmp_path):
    """Issue 52: `lait build WORK` after `lait demo` took the defaults (10,000 samples a shard)
    and turned the demo's shards into one; `lait filter WORK` would have redone stage 2 likewise.
    Without flags a stage continues with the settings the directory was made with and redoes
    nothing; a flag overrides one setting and says what it redoes."""
    import shutil

    out, _ = demo_run
    work = tmp_path / "work"
    shutil.copytree(out / "work", work)
    before = {name: listing(work / name) for name in ("shards", "images_ok", "rejected")}
    for stage, steps in (("build", ("build_pick", "build_plan", "build_shards")), ("filter", ("filter",))):
        again = lait(stage, str(work), "--no-progress", timeout=600)
        assert again.returncode == 0, again.stderr[-3000:]
        assert f"lait {stage}: continuing with the settings {work} was last made with" in again.stderr
        assert "redoing" not in again.stderr, again.stderr[-3000:]
        for step in steps:
            assert re.search(rf"^{step}: 0 done, [1-9]\d* up to date, 0 failed", again.stderr, re.M), again.stderr[-3000:]
    assert {name: listing(work / name) for name in before} == before

    smaller = lait("build", str(work), "--samples-per-shard", "20", "--no-progress", timeout=600)
    assert smaller.returncode == 0, smaller.stderr[-3000:]
    assert "given here: --samples-per-shard" in smaller.stderr
    assert re.search(r"samples_per_shard 50 -> 20.*redoing", smaller.stderr), smaller.stderr[-3000:]
    tars = sorted(p for p in listing(work / "shards") if p.endswith(".tar"))
    assert len(tars) > len([p for p in before["shards"] if p.endswith(".tar")])


# -- waiting on another process ----------------------------------------------------------------------

def test_score_waiting_for_another_process_building_the_demo_scorer_says_so(tmp_path):
    from lait.testkit.demo_scorer import DemoModel

    demo = tmp_path / "demo-scorer"
    demo.mkdir()
    empty = tmp_path / "empty"
    empty.mkdir()
    lines: list[str] = []
    with open(demo / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process is building it
        proc = subprocess.Popen([sys.executable, "-m", "lait", "score", str(empty), "--model", "demo",
                                 "--demo-dir", str(demo)], stderr=subprocess.PIPE, text=True)
        reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
        reader.start()
        deadline = time.monotonic() + 120
        while not any("waiting for another process" in l for l in lines) and time.monotonic() < deadline:
            assert proc.poll() is None, lines
            time.sleep(0.1)
        assert any("waiting for another process" in l and str(demo) in l for l in lines), lines
        # The other process finishes: its files are there when the lock is released.
        model = DemoModel(demo)
        model.checkpoint_path.write_bytes(b"")
        model.config_path.write_text("{}")
    proc.wait(timeout=120)
    reader.join(timeout=10)
    assert any("ready after" in l for l in lines), lines
    assert proc.returncode == 2 and "not a lait work directory" in lines[-1], lines
