"""One writer at a time: an exclusive lock on a work directory, naming its holder.

Every command that writes into a work directory (crawl, ingest-warc, filter, clean, score,
build, run, demo) holds the lock while it runs; `lait select` and `lait export-embeddings`
hold the lock of the folder they write, and that of the work directory they read shared
(`locked_output`). A second command on the same
directory exits with one line that names the holder (`lait filter` on host h, pid 123, since
21:04:05) instead of interleaving its rows with the first one's.

Local directories: `WORK/_lock` is locked with `flock`, which the kernel releases when the
holding process dies however it dies, and holds a JSON line naming the holder. A lock file that
still names a holder when the lock is free was left by a process that died: it is taken over
with a warning. Processes the holder starts (the crawler subprocess, stage workers) inherit
the right to write through `LAIT_WORK_LOCK` in their environment.

The lock belongs to the whole run, not to its first process: forked workers share the locked
file by fork, and the crawler subprocess gets it passed (`lock_fds`), so `flock` stays held
until the last process of the run is gone. Each of them dies with its parent
(`lait.lifeline`), so a killed run lets go of the lock at once, and a rerun never writes
beside a run that still lives.

Crawlers that share one Redis frontier (`lait crawl --redis-url`, one per machine) are one
crawl: they hold the lock *shared*, and each writes its own parts. A shared holder keeps out
every exclusive one (filter, build, a crawl without Redis) and the other way round.

The work directory's own files are never written or removed through a symbolic link: a
`_lock`, `_done/` (the markers, and each stage's folder in it), `_configs/`, `shards/`,
`shards.next/`, `shards.old/` or a selection's `_select/` that is a link makes every writing
command refuse with one line naming it (`WorkDirLink`, exit 2), before it writes anything, as
git refuses a linked `index.lock`. A link could send the lock's truncation, a marker or a
rebuild's renames and removals outside the work directory, onto whatever it points to; `WORK`
itself may be a link.

Object storage has no `flock`: there the lock is an object, `WORK/_lock.json`, refreshed every
30 s by the holder and taken over when older than two minutes. Two commands started within
the same second on the same bucket prefix can both see no lock; the lock only keeps apart runs
that do not start at the same moment (said in the README).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timezone

from lait import storage
from lait.config import ConfigError
from lait.lifeline import alive
from lait.workdir import WorkDir

log = logging.getLogger(__name__)

ENV = "LAIT_WORK_LOCK"  # the work directories this process may write without taking the lock
LOCAL_FILE = "_lock"
REMOTE_FILE = "_lock.json"
HEARTBEAT_S = 30.0
STALE_S = 120.0

_held: dict[str, int] = {}  # work URL -> nesting depth, in this process
_fds: dict[str, int] = {}  # work URL -> the locked file's descriptor (local locks this process took)
_held_guard = threading.Lock()
_notes: list[str] = []  # lines a command prints once it holds its lock (`say_when_held`)


def say_when_held(line: str) -> None:
    """Print `line` on stderr once this process holds a work directory's lock: a note about the
    run (the settings it continues with) that a command refused before it starts (a busy or
    read-only work directory) leaves unsaid, so that the refusal is its one line."""
    _notes.append(line)


def _say_notes() -> None:
    import sys

    while _notes:
        print(_notes.pop(0), file=sys.stderr, flush=True)


class WorkDirBusy(ConfigError):
    """Another command holds the work directory's lock (exit 2, one line)."""


class WorkDirLink(ConfigError):
    """One of the work directory's own files is a symbolic link (exit 2, one line)."""


# What lait itself writes and removes at the top of a work directory (and of a folder `lait
# select` writes): never through a link. Tables are not listed: their parts appear by rename.
OWN_ENTRIES = (LOCAL_FILE, "_done", "_configs", "_select", "shards", "shards.next", "shards.old")


def refuse_links(root: storage.Location) -> None:
    """WorkDirLink naming the first of the work directory's own entries (`OWN_ENTRIES`, and the
    folders in `_done/`) that is a symbolic link; nothing on object storage, which has none."""
    if isinstance(root, storage.RemotePath):
        return
    done = root / "_done"
    inside = sorted(done.iterdir()) if done.is_dir() and not done.is_symlink() else []
    for path in [root / name for name in OWN_ENTRIES] + inside:
        if path.is_symlink():
            raise WorkDirLink(f"{path} is a symbolic link (to {os.readlink(path)}); lait does not write or remove "
                              f"a work directory's own files through a link: remove it (for a folder, move "
                              f"what it points to in its place)")


def _holder(command: str) -> dict[str, object]:
    return {"command": command, "host": socket.gethostname(), "pid": os.getpid(),
            "since": datetime.now(timezone.utc).isoformat(timespec="seconds"), "heartbeat": time.time()}


def describe(holder: dict[str, object]) -> str:
    """`lait filter` (pid 123 on host h, since 2026-11-23T21:04:05+00:00)."""
    gone = ", ended; processes it started still hold the lock" if _ended(holder) else ""
    return (f"`{holder.get('command', '?')}` (pid {holder.get('pid', '?')} on {holder.get('host', '?')}, "
            f"since {holder.get('since', '?')}{gone})")


def _ended(holder: dict[str, object]) -> bool:
    """Whether the holder named is a process of this host that no longer runs."""
    pid = holder.get("pid")
    if holder.get("host") != socket.gethostname() or not isinstance(pid, int) or pid <= 0:
        return False
    return not alive(pid)


def lock_fds() -> list[int]:
    """Descriptors of the local locks this process took: pass them to a subprocess it starts
    (`subprocess.Popen(pass_fds=...)`), and the lock stays held until that one ends too."""
    with _held_guard:
        return list(_fds.values())


def _inherited_urls(env: dict[str, str] | os._Environ) -> list[str]:
    try:
        urls = json.loads(env.get(ENV) or "[]")
    except ValueError:
        return []
    return [u for u in urls if isinstance(u, str)] if isinstance(urls, list) else []


def _inherited(url: str) -> bool:
    return url in _inherited_urls(os.environ)


def child_env(work: WorkDir, env: dict[str, str] | None = None) -> dict[str, str]:
    """An environment for a subprocess that writes into `work` on this holder's behalf (a JSON
    list of work directory URLs: `s3://...` holds the characters a path list would split on)."""
    env = dict(os.environ if env is None else env)
    env[ENV] = json.dumps(list(dict.fromkeys([*_inherited_urls(env), work.url])))
    return env


@contextlib.contextmanager
def locked(work: WorkDir, command: str, *, shared: bool = False) -> Iterator[None]:
    """Hold the work directory's lock for `command`; WorkDirBusy when another process holds it.

    `shared`: several holders at once, all shared (crawlers of one Redis frontier). Re-entrant
    within a process (`lait run` holds it while each stage takes it again) and in processes
    started with `child_env`."""
    url = work.url
    with _held_guard:
        depth = _held.get(url, 0)
        if depth or _inherited(url):
            _held[url] = depth + 1
            reentrant = True
        else:
            reentrant = False
    if reentrant:
        _say_notes()
        try:
            yield
        finally:
            with _held_guard:
                _held[url] -= 1
                if not _held[url]:
                    del _held[url]
        return
    hold = _lock_remote if work.remote else _lock_local
    with hold(work, command, shared) as fd:
        with _held_guard:
            _held[url] = 1
            if fd is not None:
                _fds[url] = fd
        _say_notes()
        try:
            yield
        finally:
            with _held_guard:
                _held.pop(url, None)
                _fds.pop(url, None)


@contextlib.contextmanager
def _lock_local(work: WorkDir, command: str, shared: bool = False) -> Iterator[int]:
    import fcntl

    storage.make_dirs(work.root)
    refuse_links(work.root)
    path = work.root / LOCAL_FILE
    try:  # O_NOFOLLOW: a link made since `refuse_links` looked is refused all the same
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        raise WorkDirLink(f"{path} is a symbolic link; lait does not write a work directory's own files "
                          f"through a link: remove it") from None
    try:
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder_of_taken_lock(fd)
            raise WorkDirBusy(f"{work.root} is in use by {describe(holder)}; wait for it to finish or stop it"
                              ) from None
        left = _read_holder(fd)
        if left and not (shared and left.get("shared")):
            log.warning("%s: taking over the lock left by %s, which ended without releasing it", work.root,
                        describe(left))
        if not (shared and left.get("shared")):  # the first shared holder names the crawl
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps({**_holder(command), "shared": shared}) + "\n").encode(), 0)
            os.fsync(fd)
        try:
            yield fd
        finally:
            if shared:
                try:  # the last shared holder out clears the name; the others leave it
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    pass
                else:
                    os.ftruncate(fd, 0)
            else:
                os.ftruncate(fd, 0)  # released cleanly: nothing for the next holder to warn about
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


# A holder writes its name just after it takes the lock: a run that finds the lock taken and the
# file still empty waits up to this long for the name.
NAME_WAIT_SECONDS = 1.0


def _holder_of_taken_lock(fd: int) -> dict[str, object]:
    """The record of whoever holds the lock; an empty one is read again until the holder has
    written its name (it takes the lock first, then writes), for `NAME_WAIT_SECONDS` at most."""
    deadline = time.monotonic() + NAME_WAIT_SECONDS
    while not (holder := _read_holder(fd)) and time.monotonic() < deadline:
        time.sleep(0.01)
    return holder


def _read_holder(fd: int) -> dict[str, object]:
    raw = os.pread(fd, 4096, 0)
    try:
        return json.loads(raw) if raw.strip() else {}
    except ValueError:
        return {"command": "unknown (unreadable lock file)"}


@contextlib.contextmanager
def _lock_remote(work: WorkDir, command: str, shared: bool = False) -> Iterator[None]:
    path = work.root / (f"_lock.{socket.gethostname()}.{os.getpid()}.json" if shared else REMOTE_FILE)
    if storage.exists(work.root / REMOTE_FILE):
        try:
            holder = json.loads(storage.read_text(work.root / REMOTE_FILE))
        except (ValueError, OSError):
            holder = {}
        age = time.time() - float(holder.get("heartbeat", 0) or 0)
        if age < STALE_S:
            raise WorkDirBusy(f"{work.root} is in use by {describe(holder)}; wait for it to finish or stop it")
        log.warning("%s: taking over the lock of %s, silent for %.0f s", work.root, describe(holder), age)
    if not shared:  # shared holders (crawlers of one Redis frontier) each beat their own object
        for other in storage.list_dir(work.root):
            name = str(other).rsplit("/", 1)[-1]
            if name.startswith("_lock.") and name != REMOTE_FILE:
                try:
                    holder = json.loads(storage.read_text(other))
                except (ValueError, OSError):
                    continue
                if time.time() - float(holder.get("heartbeat", 0) or 0) < STALE_S:
                    raise WorkDirBusy(f"{work.root} is in use by {describe(holder)}; wait for it to finish "
                                      "or stop it")
    me = {**_holder(command), "shared": shared}
    storage.write_atomic(path, json.dumps(me).encode())
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(HEARTBEAT_S):
            me["heartbeat"] = time.time()
            try:
                storage.write_atomic(path, json.dumps(me).encode())
            except OSError as exc:  # a missed beat only shortens what others wait
                log.debug("lock heartbeat failed: %r", exc)

    thread = threading.Thread(target=beat, name="lait-lock-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)
        storage.remove(path)


def _inside(child: storage.Location, parent: storage.Location) -> bool:
    """Whether `child` is `parent` or lies under it (local paths resolved, URLs compared as text)."""
    if isinstance(child, storage.RemotePath) or isinstance(parent, storage.RemotePath):
        c, p = str(child).rstrip("/"), str(parent).rstrip("/")
        return c == p or c.startswith(p + "/")
    return child.resolve().is_relative_to(parent.resolve())


@contextlib.contextmanager
def locked_output(out: storage.Location, command: str, *, reads: WorkDir | None = None) -> Iterator[None]:
    """Hold the lock of a folder a command writes outside any work directory (`lait select
    --out`, `lait export-embeddings --out`): `OUT/_lock` (`_lock.json` remotely), so two commands
    never write one folder at once; and the lock of the work directory `reads`, taken first.

    The work directory a command only reads is held *shared*: several selections from one pool
    run side by side, while a command that writes it (`lait build --force` removing the pool a
    selection reads) is kept out, and keeps the reader out, with one line naming the holder.
    When the folder is the work directory, or lies inside it, that lock is held exclusively: it
    is then written into."""
    with contextlib.ExitStack() as stack:
        if reads is not None:
            stack.enter_context(locked(reads, command, shared=not _inside(out, reads.root)))
        stack.enter_context(locked(WorkDir(out), command))
        yield
