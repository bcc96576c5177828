"""Process trees that die together: a child lait starts ends when its parent ends.

A `lait crawl` killed with SIGKILL cannot stop its crawler subprocess, nor a stage its pool
workers: left alone they went on writing beside the rerun (issue 29). Every child lait starts
(the crawler and fetcher subprocesses, executor and other pool workers) calls `die_with_parent`
first thing. On Linux the kernel then sends it SIGKILL when its parent exits, however the
parent exits (`prctl(PR_SET_PDEATHSIG)`); elsewhere, and where the process to outlive is not
the direct parent (a fork server's children), a daemon thread polls for it.

SIGKILL, not SIGTERM: the lock of the work directory stays held until the last process of
the run is gone (`lait.lock`), and every writer already survives SIGKILL (committed parts are
the checkpoint), so the quickest end is the safest one.

The kernel's parent is the *thread* that forked the child: children must be started from a
thread that lives as long as they do (the main thread, or a pool's own manager thread).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
POLL_SECONDS = 0.5
# The pid a child should have as its parent, for a child started through exec (the crawler):
# a parent that died before the child armed the signal is noticed at once.
PARENT_ENV = "LAIT_PARENT_PID"


def _arm_pdeathsig(sig: int) -> bool:
    """Ask the kernel for `sig` when the parent ends; False where that is not available."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def alive(pid: int) -> bool:
    """Whether a process `pid` exists on this machine (a zombie included)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process
        return True
    return True


def _orphaned(ppid: int, parent: int) -> bool:
    return os.getppid() != ppid or not alive(parent)


def _watch(ppid: int, parent: int, sig: int) -> None:
    """Fallback: poll; once this process was given to another parent, or the process that
    started it is gone, end."""
    def poll() -> None:
        while not _orphaned(ppid, parent):
            threading.Event().wait(POLL_SECONDS)
        os.kill(os.getpid(), sig)

    threading.Thread(target=poll, name="lait-lifeline", daemon=True).start()


def die_with_parent(parent: int | None = None, sig: int = signal.SIGKILL) -> None:
    """Make this process end (with `sig`) when its parent ends.

    `parent`: the pid of the process that started this one (a pool's initializer argument, or
    `PARENT_ENV`); by default the current parent. It may be a grandparent (a pool started by a
    fork server, which lives as long as its children do): then it is watched by polling too.
    A parent already gone ends this process at once."""
    env = os.environ.pop(PARENT_ENV, "")  # for this process only, not for its own children
    ppid = os.getppid()
    if parent is None:
        parent = int(env) if env.isdigit() else ppid
    if not _arm_pdeathsig(sig) or parent != ppid:
        _watch(ppid, parent, sig)
    if _orphaned(ppid, parent):  # the parent died before the signal was armed
        os.kill(os.getpid(), sig)


def child_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """An environment for a subprocess that calls `die_with_parent`: it names this process."""
    env = dict(os.environ if env is None else env)
    env[PARENT_ENV] = str(os.getpid())
    return env


def pool_kwargs(initializer=None, initargs: tuple = ()) -> dict:
    """`initializer` and `initargs` of a ProcessPoolExecutor whose workers die with this
    process, then run `initializer(*initargs)` if given."""
    return {"initializer": _start_worker, "initargs": (os.getpid(), initializer, initargs)}


def _start_worker(parent: int, initializer, initargs: tuple) -> None:
    die_with_parent(parent)
    if initializer is not None:
        initializer(*initargs)
