"""Issue 29: a child lait starts ends when its parent ends, and the lock lives as long as the run.

Each test starts a parent process that starts children the way lait does (a pool with
`lifeline.pool_kwargs`, a subprocess that calls `die_with_parent`, a subprocess given the lock
with `lock_fds`), kills the parent alone with SIGKILL and looks at /proc for the children.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from kit.processes import descendants, running, wait_until
from lait.lock import WorkDirBusy, locked
from lait.workdir import WorkDir

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")


@pytest.fixture
def leftovers():
    """Pids the test started: whatever still runs at the end is killed (a failing test must not
    leave its sleepers behind)."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        if running(pid):
            os.kill(pid, signal.SIGKILL)


def start_parent(tmp_path: Path, body: str, n_children: int, leftovers: list[int]
                 ) -> tuple[subprocess.Popen, list[int]]:
    """Run `body` in a parent process, which creates READY once its children run; the parent
    and its children's pids."""
    ready = tmp_path / "ready"
    script = "import os, sys, time\nREADY = sys.argv[1]\n" + textwrap.dedent(body)
    # TMPDIR: a killed parent leaves what it kept in the temporary folder (a fork server's
    # pymp-* socket folder): in the test's own folder, not in /tmp.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
               TMPDIR=str(tmp_path))
    parent = subprocess.Popen([sys.executable, "-c", script, str(ready)], env=env)
    leftovers.append(parent.pid)
    assert wait_until(ready.exists), "the parent never got ready"
    children = sorted(descendants(parent.pid))
    leftovers.extend(children)
    assert len(children) >= n_children and all(running(p) for p in children)
    return parent, children


def kill_parent(parent: subprocess.Popen) -> None:
    parent.send_signal(signal.SIGKILL)
    parent.wait(timeout=10)


POOL = """
from concurrent.futures import ProcessPoolExecutor
import multiprocessing
from lait import lifeline
from lait.lock import locked
from lait.workdir import WorkDir
{prelude}
with locked(WorkDir({work!r}).init(), "test parent"):
    pool = ProcessPoolExecutor(2, mp_context=multiprocessing.get_context({method!r}), **lifeline.pool_kwargs())
    futures = [pool.submit(time.sleep, 600) for _ in range(2)]
    time.sleep(1.0)
    open(READY, "w").close()
    time.sleep(600)
"""


@pytest.mark.parametrize("method,pdeathsig", [("fork", True), ("fork", False), ("forkserver", True)],
                         ids=["fork-prctl", "fork-polling", "forkserver"])
def test_pool_workers_die_with_their_parent_and_free_the_lock(tmp_path, method, pdeathsig, leftovers):
    """Python 3.14 starts pools through a fork server: their workers are the parent's grandchildren."""
    work = tmp_path / "w"
    prelude = "" if pdeathsig else "lifeline._arm_pdeathsig = lambda sig: False  # as where prctl is missing"
    body = POOL.format(prelude=prelude, work=str(work), method=method)
    parent, children = start_parent(tmp_path, body, 2, leftovers)
    with pytest.raises(WorkDirBusy):  # the run holds it
        with locked(WorkDir(work), "rerun"):
            pass
    kill_parent(parent)
    assert wait_until(lambda: not any(running(p) for p in children), 10), "workers outlived their parent"
    with locked(WorkDir(work), "rerun"):  # nothing of the run is left to hold it
        pass


SUBPROCESS = """
import subprocess
from lait import lifeline
from lait.lock import locked, lock_fds
from lait.workdir import WorkDir
with locked(WorkDir({work!r}).init(), "test parent"):
    code = {child!r}
    child = subprocess.Popen([sys.executable, "-c", code], env=lifeline.child_env(),
                             pass_fds=lock_fds(), start_new_session=True)
    time.sleep(1.0)
    open(READY, "w").close()
    time.sleep(600)
"""
DIES_WITH_PARENT = "import time; from lait import lifeline; lifeline.die_with_parent(); time.sleep(600)"
OUTLIVES_PARENT = "import time; time.sleep(600)"


def test_a_subprocess_dies_with_its_parent_in_another_session(tmp_path, leftovers):
    """The crawler runs in its own session: a Ctrl-C or a kill of the group does not reach it."""
    work = tmp_path / "w"
    parent, children = start_parent(tmp_path, SUBPROCESS.format(work=str(work), child=DIES_WITH_PARENT), 1, leftovers)
    kill_parent(parent)
    assert wait_until(lambda: not running(children[0]), 10)
    with locked(WorkDir(work), "rerun"):
        pass


def test_the_lock_is_held_while_any_process_of_the_run_lives(tmp_path, leftovers):
    """A child given the lock that (by a bug) outlives its parent still keeps a rerun out, and
    the rerun's message says the holder has ended."""
    work = tmp_path / "w"
    parent, children = start_parent(tmp_path, SUBPROCESS.format(work=str(work), child=OUTLIVES_PARENT), 1, leftovers)
    kill_parent(parent)
    time.sleep(0.3)
    assert running(children[0])
    with pytest.raises(WorkDirBusy, match="ended; processes it started still hold the lock"):
        with locked(WorkDir(work), "rerun"):
            pass
    os.kill(children[0], signal.SIGKILL)
    assert wait_until(lambda: not running(children[0]), 10)
    with locked(WorkDir(work), "rerun"):
        pass


def test_a_child_whose_parent_is_already_gone_ends_at_once(tmp_path):
    """The parent may die between the fork and the moment the child arms the signal."""
    code = ("import os, sys, time\nfrom lait import lifeline\n"
            "os.environ[lifeline.PARENT_ENV] = '999999999'  # not this process's parent\n"
            "lifeline.die_with_parent()\ntime.sleep(30)\nsys.exit(3)")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", code], env=env, timeout=60)
    assert proc.returncode == -signal.SIGKILL
