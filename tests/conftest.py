"""Fixtures shared by every test package."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"

# Fuzz tests (hypothesis): a bounded, reproducible number of examples in the suite; `make fuzz`
# runs the same tests long and random (LAIT_FUZZ_PROFILE=lait-fuzz).
try:
    from hypothesis import HealthCheck, settings

    settings.register_profile("lait-suite", max_examples=40, deadline=None, database=None, derandomize=True,
                              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    settings.register_profile("lait-fuzz", max_examples=int(os.environ.get("LAIT_FUZZ_EXAMPLES", "3000")),
                              deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    settings.load_profile(os.environ.get("LAIT_FUZZ_PROFILE", "lait-suite"))
except ImportError:  # the fuzz tests skip
    pass

# Subprocesses started by tests import the project from the checkout.
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))


# -- what a test run leaves behind ------------------------------------------------------------
# Places outside pytest's tmp_path that a run could fill and never clean: Scrapy's job files
# (a port and a token per crawl), Ray's session folders, and pytest's own numbered folders
# (which `tmp_path_retention_policy = "failed"` in pyproject.toml empties when every test
# passes). The run snapshots them at its start and prints what is new at its very end, after
# pytest's own clean-up; other processes of the machine may add to them too, hence "new
# during this run".
def _leftover_places() -> list[Path]:
    import getpass
    import tempfile

    tmp = Path(tempfile.gettempdir())
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    state = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    return [state / "scrapy" / "job_files", tmp / "ray", tmp / f"pytest-of-{user}"]


def _entries() -> set[Path]:
    import tempfile

    out: set[Path] = set()
    for place in _leftover_places():
        if place.is_dir():
            out |= {p for p in place.iterdir() if p.name != "pytest-current"}
    return out | set(Path(tempfile.gettempdir()).glob("lait-ray-*"))


def _size(path: Path) -> int:
    try:
        if path.is_symlink() or not path.is_dir():
            return path.lstat().st_size
        return sum(f.lstat().st_size for f in path.rglob("*") if not f.is_dir() or f.is_symlink())
    except OSError:  # gone meanwhile, or not ours to read
        return 0


def pytest_sessionstart(session):
    if not hasattr(session.config, "workerinput"):  # the controller of an xdist run, or a plain run
        session.config.stash[_BEFORE] = _entries()


def pytest_unconfigure(config):
    before = config.stash.get(_BEFORE, None)
    if before is None:
        return
    new = sorted(_entries() - before)
    if not new:
        print("\nleftovers: nothing new in " + ", ".join(map(str, _leftover_places())), file=sys.stderr)
        return
    print(f"\nleftovers: {len(new)} new entries outside the tests' temporary folders (new during this run; "
          "pytest-of-* keeps a failed run's folders on purpose):", file=sys.stderr)
    for path in new:
        print(f"  {path}  ({_size(path) / 1e6:.1f} MB)", file=sys.stderr)


_BEFORE = pytest.StashKey[set]()


@pytest.fixture(scope="session")
def ray_temp_dir():
    """Where the Ray tests' local clusters keep their session files (Ray's default is /tmp/ray,
    which it never cleans): a folder of this run, removed at its end. Short, in /tmp, because
    Ray puts Unix sockets in it (a socket path has a 107-byte limit that pytest's tmp paths
    can pass)."""
    import shutil
    import tempfile

    path = tempfile.mkdtemp(prefix="lait-ray-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data (real pages, photos, WARCs); tests that need it skip when it is absent."""
    if not (SHARED_DATA / "SOURCES.md").exists():
        pytest.skip("../shared/data is not present (a fresh clone has no ../shared)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def python() -> str:
    return sys.executable


@pytest.fixture(scope="session")
def demo_scorer():
    """The offline demo scorer (`lait score --model demo`): found in `$LAIT_CACHE`, or built there
    once per machine (about two minutes). Its file lock makes a second process, such as another
    xdist worker, wait for the one build instead of starting its own."""
    from lait.testkit.demo_scorer import ensure_demo_model

    return ensure_demo_model()


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory):
    """`lait demo` run once per session, as a user runs it (a subprocess): (out folder, the
    finished process). 60 pages in shards of 50 samples (several shards) and a min_score, so
    the report has a threshold to draw. Slow: it crawls, cleans and scores."""
    import subprocess

    out = tmp_path_factory.mktemp("demo") / "demo"
    proc = subprocess.run([sys.executable, "-m", "lait", "demo", "--out", str(out), "--pages", "60",
                           "--workers", "2", "--port", "0", "--samples-per-shard", "50", "--min-score", "0.6",
                           "--no-progress"], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc
