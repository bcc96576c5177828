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
# Ray's local clusters authenticate with a token (its default since 2.5x); found nowhere, the first
# `ray.init()` writes a new one into ~/.ray/auth_token, which outlives the run. The suite's clusters
# and every process started by its tests (xdist's workers, `ray start`, lait's Ray runs) share one
# token from the environment instead: token authentication stays on, the home folder is untouched.
if "RAY_AUTH_TOKEN" not in os.environ:
    import secrets

    os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)


# -- what a test run leaves behind ------------------------------------------------------------
# Places outside pytest's tmp_path that a run could fill and never clean: Scrapy's job files
# (a port and a token per crawl), Ray's session folders and its `~/.ray` (the token a new local
# cluster saves there), pytest's own numbered folders (which `tmp_path_retention_policy =
# "failed"` in pyproject.toml empties when every test passes), the home folder itself and the
# temporary folder's top level (lait's Ray folders, torchrun's `torchelastic_*` log folders).
# The run snapshots them at its start and prints what is new at its very end, after pytest's
# own clean-up; other processes of the machine may add to them too, hence "new during this run".
def _leftover_places() -> list[Path]:
    import getpass
    import tempfile

    tmp = Path(tempfile.gettempdir())
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    state = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    return [state / "scrapy" / "job_files", tmp / "ray", tmp / f"pytest-of-{user}", Path.home() / ".ray",
            Path.home(), tmp]


# Entries of the home and temporary folders that are not a test run's to answer for: caches
# shared by every run (made once per machine, as `pip`'s is), and the files the run's own
# machinery keeps while it runs (pytest's and xdist's, the group file below).
_SHARED = {".cache", ".local", ".config", ".ray", ".npm", ".ipython", ".keras", "ray"}


def _entries() -> set[Path]:
    import tempfile

    out: set[Path] = set()
    tmp, home = Path(tempfile.gettempdir()), Path.home()
    for place in _leftover_places():
        if not place.is_dir():
            continue
        for p in place.iterdir():
            if p.name == "pytest-current" or (place in (tmp, home) and (
                    p.name in _SHARED or p.name.startswith(("pytest-of-", "lait-xdist-groups-")))):
                continue
            out.add(p)
    return out


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
    groups_file = config.stash.get(_STATE, {}).get(_GROUPS_FILE)
    if groups_file:
        Path(groups_file).unlink(missing_ok=True)
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


# -- running on every core (pytest-xdist, `make test`) ----------------------------------------
# `make test` runs the suite in one worker process per core with `--dist loadgroup`: a test
# without a group goes to whichever worker is free, the tests of one group run one after the
# other on one worker. The groups (docs/testing.md):
#   demo      the tests that read the session's demo run (`demo_run`): it is made once, on the
#             worker that runs them all, instead of once on each worker; likewise
#   demo40    the tests that read tests/build's 40-page demo (`demo40`);
#   ray       the modules that start Ray clusters (local or of separate nodes): one cluster at a
#             time on the machine, so no two clusters compete for Ray's fixed agent ports or the
#             cores that a test gave its cluster;
#   a module  the tests of a module that share a module- or class-scoped fixture (a crawl, a
#             server, a pipeline run): made once on one worker instead of once on each;
#   train-heavy  the two trainings that keep a core busy each (tests/train's test_learning and
#             test_real_photos, marked in their modules): side by side they slowed each other
#             from 68-87 s alone to 131-133 s; one after the other, beside the demo runs' workers,
#             test_real_photos still took 167 s. The group is handed out last, when the other
#             worker has at most its last unit to finish.
# Within that, the work units with many tests go first (xdist's own order), then the slow tests,
# so that a long test does not start last while the other worker has nothing left to do.
#
# The groups travel from the workers (which collect) to the controller (which schedules) in a
# JSON file of node id -> group, read by the scheduler below. xdist's own `loadgroup` sends
# them as a suffix it writes into each node id, which pytest 9.2's structured node ids ignore:
# every group was silently spread over all workers (pytest-dev/pytest-xdist#1386).
SHARED_RUNS = {"demo_run": "demo", "demo40": "demo40"}  # session fixture -> its group


def _group_of(item: pytest.Item, ray_modules: set[str]) -> str | None:
    module = item.nodeid.split("::", 1)[0]
    for fixture, group in SHARED_RUNS.items():
        if fixture in item.fixturenames:
            return group
    if module in ray_modules:
        return "ray"
    info = getattr(item, "_fixtureinfo", None)
    for defs in (info.name2fixturedefs.values() if info else ()):
        if any(d.scope in ("module", "class", "package") for d in defs):
            return module
    return None


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups from the marks
def pytest_collection_modifyitems(config, items):
    ray_modules = {item.nodeid.split("::", 1)[0] for item in items
                   if "ray_temp_dir" in item.fixturenames or "_ray" in item.nodeid.split("::", 1)[0]}
    for item in items:
        group = _group_of(item, ray_modules)
        if group and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(group))
    if hasattr(config, "workerinput"):  # an xdist worker: every worker sorts alike
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)


_GROUPS_FILE = "lait_xdist_groups"


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """The controller names the file its workers write the groups to."""
    import tempfile

    if _GROUPS_FILE not in node.config.stash.get(_STATE, {}):
        fd, path = tempfile.mkstemp(prefix="lait-xdist-groups-", suffix=".json")
        os.close(fd)
        node.config.stash[_STATE] = {_GROUPS_FILE: path}
    node.workerinput[_GROUPS_FILE] = node.config.stash[_STATE][_GROUPS_FILE]


@pytest.hookimpl(tryfirst=True)  # before xdist's own tells the controller that collection is done
def pytest_collection_finish(session):
    """A worker writes the group of every test it collected (all workers collect alike)."""
    path = getattr(session.config, "workerinput", {}).get(_GROUPS_FILE)
    if path is None:
        return
    import json

    groups = {}
    for item in session.items:
        mark = item.get_closest_marker("xdist_group")
        if mark is not None:
            groups[item.nodeid] = str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
    tmp = f"{path}.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(groups, f)
    os.replace(tmp, path)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadgroup`: xdist's scope scheduler with a test's scope being its group (from the
    workers' file), or the test alone."""
    if config.getvalue("dist") != "loadgroup":
        return None
    import json

    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        groups: dict[str, str] | None = None

        def _assign_work_unit(self, node) -> None:
            # The two trainings go last: by then the other worker has little or nothing left,
            # and they do not share the cores with a demo run's workers.
            if LAST in self.workqueue and len(self.workqueue) > 1:
                self.workqueue.move_to_end(LAST)
            super()._assign_work_unit(node)

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:  # first asked once every worker has collected
                path = config.stash.get(_STATE, {}).get(_GROUPS_FILE)
                self.groups = json.loads(Path(path).read_text() or "{}") if path else {}
            group = self.groups.get(nodeid)
            return f"group:{group}" if group else nodeid

    return GroupScheduling(config, log)


_STATE = pytest.StashKey[dict]()
LAST = "group:train-heavy"  # handed out when it is the only work unit left


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
