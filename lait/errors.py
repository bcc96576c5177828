"""Errors that a retry cannot fix: what every executor and the command line treat alike.

- `CorruptPart`: a file of the work directory does not read back as it was written (a page
  checksum fails, a footer is cut, an image's sha256 is not its row's). The task that read it
  fails at once, naming the file; other partitions go on. `lait verify` names what to redo.
- `OutOfSpace`: the disk (or quota) is full. Every later write would fail too, so the whole run
  stops at once with one line naming the path, and exits 1.

Both cross process boundaries (a pool worker, a Ray task) as their message alone.
"""

from __future__ import annotations

import errno
from typing import Any

_FULL = (errno.ENOSPC, errno.EDQUOT)


class NoRetry(Exception):
    """A task error that the same task, run again on the same input, would hit again."""

    def __init__(self, message: str):
        super().__init__(message)

    def __str__(self) -> str:
        return str(self.args[0])


class CorruptPart(NoRetry):
    """A work directory file that fails its integrity check: the message names the file and
    why, `detail` is the why alone."""

    def __init__(self, message: str, detail: str = ""):
        Exception.__init__(self, message, detail)

    @property
    def detail(self) -> str:
        return str(self.args[1])


class StopRun(NoRetry):
    """An error after which no partition can succeed: the run stops at once."""


class OutOfSpace(StopRun):
    """No space left where the run writes."""


def is_out_of_space(exc: BaseException) -> bool:
    """An OSError of a full disk or quota, also as pyarrow words it ('[errno 28] ...')."""
    if isinstance(exc, OutOfSpace):
        return True
    if not isinstance(exc, OSError):
        return False
    return exc.errno in _FULL or any(f"[errno {n}]" in str(exc).lower() for n in _FULL)


def out_of_space(exc: BaseException, path: Any) -> OutOfSpace:
    """The one line a full disk is reported with: the path written and the cause."""
    if isinstance(exc, OutOfSpace):
        return exc
    cause = "disk quota exceeded" if getattr(exc, "errno", None) == errno.EDQUOT else "no space left on device"
    return OutOfSpace(f"cannot write {path}: {cause}; free some space and rerun the command (finished work is kept)")


def on_write_error(exc: BaseException, path: Any) -> BaseException:
    """What a writer raises for `exc` hit while writing `path`: a full disk becomes
    `OutOfSpace` naming the path, anything else is left as it is."""
    return out_of_space(exc, path) if is_out_of_space(exc) else exc


def corrupt(path: Any, exc: BaseException | str) -> CorruptPart:
    """A `CorruptPart` for a file that failed to read back: names the file and why."""
    return CorruptPart(f"{path} is corrupt: {exc}", str(exc))


class ReadOnly(StopRun):
    """The work directory (or the output folder) is on a read-only file system."""


def stop_error(exc: BaseException) -> StopRun | None:
    """The `StopRun` that `exc` is or stands for (a bare full-disk or read-only file system
    OSError), else None."""
    if isinstance(exc, StopRun):
        return exc
    if is_out_of_space(exc):
        where = getattr(exc, "filename", None)
        return out_of_space(exc, where) if where else OutOfSpace(f"{exc}; free some space and rerun the command")
    if isinstance(exc, OSError) and (exc.errno == errno.EROFS or f"[errno {errno.EROFS}]" in str(exc).lower()):
        where = getattr(exc, "filename", None) or "the work directory"
        return ReadOnly(f"cannot write {where}: read-only file system; copy the work directory where you may "
                        f"write and run the command there")
    return None


def user_error(exc: BaseException) -> str | None:
    """The one line the command line prints for an error the user can mend, else None: a stop
    (`stop_error`), a file the user may not read or write."""
    stop = stop_error(exc)
    if stop is not None:
        return str(stop)
    if isinstance(exc, PermissionError):
        return f"{exc.filename or 'a file'}: permission denied"
    return None


def retryable(exc: BaseException) -> bool:
    """Whether running the same task again may succeed."""
    return not isinstance(exc, NoRetry) and stop_error(exc) is None
