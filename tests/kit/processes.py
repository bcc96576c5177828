"""What the tests of killed runs look at: which processes live below a pid, read from /proc."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path


def _task_alive(stat_file: Path) -> bool:
    try:
        stat = stat_file.read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def running(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped by its new parent, does not).

    A killed process's main thread shows as a zombie while its other threads are still being torn
    down, and its files (a lock among them) close only when the last of them is gone: so the
    process runs while any of its threads does."""
    if _task_alive(Path(f"/proc/{pid}/stat")):
        return True
    try:
        tasks = list(Path(f"/proc/{pid}/task").glob("*/stat"))
    except OSError:
        return False
    return any(_task_alive(t) for t in tasks)


def descendants(pid: int) -> set[int]:
    """Every process below `pid`."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {p for p, pp in parents.items() if pp in frontier} - found
        found |= frontier
    return found


def wait_until(predicate: Callable[[], bool], seconds: float = 20.0) -> bool:
    """Poll `predicate` until it holds or `seconds` pass; its last answer."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()
