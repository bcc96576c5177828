"""Issue 51, the second catalogue: what a careless user and a crashing machine did that lait
got silently wrong, or reported in a traceback. Each case is the data that provoked it; each
ends in one line on stderr (a traceback only with `-v`), a non-zero exit, and nothing lost.

(The crawler's and the work directory's own cases live beside the code they test:
tests/crawler/, tests/build/test_integrity.py, tests/lait/test_lock*.py.)
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kit import build_data as data


def lait(*argv: str, timeout: float = 300, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return subprocess.run([*prefix, sys.executable, "-m", "lait", *argv], capture_output=True, text=True,
                          timeout=timeout)


def one_line(proc: subprocess.CompletedProcess, code: int, *words: str) -> str:
    """The one line a refused or stopped command printed, no traceback."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == code and len(lines) == 1, (proc.returncode, proc.stderr[-3000:])
    assert all(w in lines[0] for w in words), lines[0]
    return lines[0]


def files(folder: Path) -> dict[str, bytes]:
    """Every file below `folder`, by path, with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def flip(path: Path, at: float = 0.5, n: int = 16) -> None:
    raw = bytearray(path.read_bytes())
    for i in range(int(len(raw) * at), int(len(raw) * at) + n):
        raw[i] ^= 0xFF
    path.write_bytes(bytes(raw))


@pytest.fixture(scope="module")
def built_once(tmp_path_factory) -> Path:
    """A scored work directory built into shards by `lait build` (read only: copy it to change it)."""
    work = tmp_path_factory.mktemp("built") / "work"
    data.make_work(work, embeddings=True)  # stage 4's embeddings too: export-embeddings reads them
    proc = lait("build", str(work), "--workers", "1", "--no-progress", "--samples-per-shard", "16")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(list((work / "shards").glob("*.tar"))) > 1
    return work


@pytest.fixture
def built(built_once, tmp_path) -> Path:
    work = tmp_path / "work"
    shutil.copytree(built_once, work, symlinks=True)
    return work


# -- a threshold no score can pass ---------------------------------------------------------------

@pytest.mark.parametrize("value", ["2", "1.5", "-1.01"])
def test_a_min_score_outside_the_cosine_range_is_refused_and_the_shards_stay(built, tmp_path, value):
    """`lait build --min-score 2` (cosines never pass 1) exited 0 and replaced 248 samples with
    none. Now `build`, `select` and `demo` refuse it before anything is written."""
    before = files(built)
    one_line(lait("build", str(built), f"--min-score={value}", "--force", "--no-progress"), 2,
             "lait build", "min_score", "between -1 and 1", value)
    one_line(lait("select", str(built), "--out", str(tmp_path / "sel"), f"--min-score={value}"), 2,
             "lait select", "min_score")
    one_line(lait("demo", "--out", str(tmp_path / "demo"), f"--min-score={value}", "--no-progress"), 2,
             "lait demo", "min_score")
    assert files(built) == before and not (tmp_path / "sel").exists() and not (tmp_path / "demo").exists()


def test_the_cosine_range_itself_is_accepted(built):
    proc = lait("build", str(built), "--min-score=1", "--no-progress", "--workers", "1")
    assert proc.returncode == 0, proc.stderr[-2000:]  # a legal, if empty, selection


# -- one line, not a traceback -------------------------------------------------------------------

def test_build_force_on_a_corrupt_images_ok_part_is_one_line_and_the_shards_stay(built):
    part = max((built / "images_ok").glob("*.parquet"), key=lambda p: p.stat().st_size)
    flip(part)
    shards = files(built / "shards")
    proc = lait("build", str(built), "--force", "--no-progress", "--workers", "1")
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and str(part) in proc.stderr, proc.stderr[-3000:]
    assert files(built / "shards") == shards
    verbose = lait("build", str(built), "--force", "--no-progress", "--workers", "1", "-v")
    assert verbose.returncode == 1 and str(part) in verbose.stderr


def _read_only(work: Path) -> tuple[str, ...] | None:
    """A command prefix that runs its command with `work` mounted read-only (a private mount
    namespace), or None where this machine allows no such mount."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return None
    probe = subprocess.run([unshare, "-rm", "sh", "-c", f'mount --bind -o ro "{work}" "{work}" && '
                            f'! touch "{work}/.probe" 2>/dev/null'], capture_output=True, text=True)
    if probe.returncode != 0:
        return None
    return (unshare, "-rm", "sh", "-c", f'mount --bind -o ro "{work}" "{work}" && exec "$@"', "sh")


@pytest.mark.parametrize("argv", [
    ["build", "{w}", "--force", "--no-progress", "--workers", "1"],
    ["build", "{w}", "--no-progress", "--workers", "1"],  # continues with the recorded settings
    ["filter", "{w}", "--no-progress", "--workers", "1"],
    ["verify", "{w}"],
])
def test_a_work_directory_on_a_read_only_file_system_is_one_line(built, argv):
    prefix = _read_only(built)
    if prefix is None:
        pytest.skip("this machine allows no private read-only mount (unshare -rm)")
    before = files(built)
    proc = lait(*[a.format(w=built) for a in argv], prefix=prefix)
    one_line(proc, 1, f"lait {argv[0]}", str(built / "_lock"), "read-only file system")
    assert files(built) == before


def test_status_and_stats_read_a_work_directory_on_a_read_only_file_system(built):
    prefix = _read_only(built)
    if prefix is None:
        pytest.skip("this machine allows no private read-only mount (unshare -rm)")
    before = files(built)
    proc = lait("status", str(built), prefix=prefix)
    assert proc.returncode == 0 and "build" in proc.stdout and not proc.stderr, proc.stderr[-2000:]
    proc = lait("stats", str(built), prefix=prefix)
    assert proc.returncode == 0 and "samples" in proc.stdout, proc.stderr[-2000:]
    assert files(built) == before


# -- the sweep: every command that writes a work directory, on each kind of bad work directory ----

def _inputs(tmp: Path, shared: Path | None) -> dict[str, str]:
    seeds = tmp / "seeds.txt"
    seeds.write_text("http://127.0.0.1:9/\n")
    urls = tmp / "urls.txt"
    urls.write_text("http://127.0.0.1:9/a.jpg\n")
    warc = shared / "warc" / "pywb" / "example2.warc.gz" if shared else None
    return {"seeds": str(seeds), "urls": str(urls), "warc": str(warc) if warc and warc.exists() else "",
            "out": str(tmp / "out")}


# Every command that writes into WORK, as a user types it ({w}: the work directory).
WRITERS = {
    "crawl": ["crawl", "--seeds", "{seeds}", "--out", "{w}", "--allow-loopback"],
    "download": ["download", "{urls}", "--out", "{w}", "--caption-col", ""],
    "ingest-warc": ["ingest-warc", "{warc}", "--out", "{w}"],
    "filter": ["filter", "{w}", "--no-progress"],
    "clean": ["clean", "{w}", "--no-progress"],
    "score": ["score", "{w}", "--model", "demo", "--no-progress"],
    "build": ["build", "{w}", "--no-progress"],
    "build --force": ["build", "{w}", "--force", "--no-progress"],
    "run": ["run", "{w}", "--no-progress"],
    "verify": ["verify", "{w}"],
    # These write elsewhere (--out) and hold WORK's lock shared while they read it.
    "select": ["select", "{w}", "--out", "{out}", "--top-fraction", "0.5"],
    "export-embeddings": ["export-embeddings", "{w}", "--out", "{out}"],
}


@pytest.mark.parametrize("command", list(WRITERS))
def test_sweep_every_writing_command_on_a_read_only_work_directory(built, tmp_path, shared_data, command):
    """Exit 1, one line naming the work directory's file and the cause, nothing written."""
    prefix = _read_only(built)
    if prefix is None:
        pytest.skip("this machine allows no private read-only mount (unshare -rm)")
    inputs = _inputs(tmp_path, shared_data)
    argv = [a.format(w=built, **inputs) for a in WRITERS[command]]
    before = files(built)
    proc = lait(*argv, prefix=prefix, timeout=120)
    one_line(proc, 1, f"lait {argv[0]}", str(built), "read-only file system")
    assert files(built) == before


# -- memory: the parent of a stage whose workers run the models ------------------------------------

def test_the_filter_command_checks_its_models_without_loading_torch_into_the_parent(built, tmp_path):
    """`lait filter` on 8 images peaked at 1.2 GB in its parent: checking that the face detector's
    package is installed imported it, and torch with it (about 470 MB resident), in a process
    whose spawned workers load their own. The check now only finds the package; a run with the
    gates on still drops nothing silently."""
    probe = ("import sys\n"
             "from lait.app.cli import build_parser\n"
             "from lait.filters.image_stage import FilterConfig\n"
             "build_parser()\n"
             f"FilterConfig(work={str(built)!r}).validate()\n"
             "print(sorted(m for m in ('torch', 'facenet_pytorch', 'onnxruntime') if m in sys.modules))\n")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", (proc.stdout, proc.stderr[-2000:])


@pytest.mark.parametrize("command", list(WRITERS))
def test_sweep_every_writing_command_on_a_work_directory_whose_lock_is_a_link(built, tmp_path, shared_data, command):
    """`WORK/_lock` linked to a file outside: `lait filter` exited 0 and emptied that file. Every
    writing command now refuses (exit 2) with one line naming the link; the outside file and the
    work directory are unchanged."""
    outside = tmp_path / "precious.txt"
    outside.write_text("not lait's\n")
    (built / "_lock").unlink()
    (built / "_lock").symlink_to(outside)
    inputs = _inputs(tmp_path, shared_data)
    argv = [a.format(w=built, **inputs) for a in WRITERS[command]]
    before = files(built)
    proc = lait(*argv, timeout=120)
    one_line(proc, 2, f"lait {argv[0]}", str(built / "_lock"), "symbolic link")
    assert outside.read_text() == "not lait's\n" and files(built) == before
