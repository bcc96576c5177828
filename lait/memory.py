"""Process-wide memory settings every lait process applies before it works.

glibc's `malloc` serves blocks above `M_MMAP_THRESHOLD` with their own mapping, returned to the
system when freed. By default that threshold rises to the size of the largest such block freed
(up to 32 MiB on 64-bit), after which tensors, decoded images and Arrow buffers of a few MB
come from the heap instead, whose freed space fragments and is seldom given back. Measured with
`bench/scale`, the scoring process of the 20,000-page crawl then peaked 300 MB higher than with
a fixed threshold for the same live data, and the excess grew with the partition size. A fixed
threshold keeps the peak at what is live.

A threshold set in the environment (`MALLOC_MMAP_THRESHOLD_`) wins; other C libraries and
platforms are left as they are.
"""

from __future__ import annotations

import ctypes
import os
import sys

M_MMAP_THRESHOLD = -3  # <malloc.h>
MMAP_THRESHOLD = 1 << 20

_applied: bool | None = None


def _mallopt(param: int, value: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc (musl, ...)
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return mallopt(param, value) == 1


def fix_mmap_threshold(size: int = MMAP_THRESHOLD) -> bool:
    """Pin glibc's mmap threshold at `size` bytes (once per process); True when it was set."""
    global _applied
    if _applied is None:
        _applied = not os.environ.get("MALLOC_MMAP_THRESHOLD_") and _mallopt(M_MMAP_THRESHOLD, size)
    return _applied


def large_mmap_threshold() -> None:
    """For short-lived helpers (image decoders) forked from a process that pinned the threshold:
    they allocate and free a full-size decoded image per picture, which with a 1 MiB threshold
    means a fresh mapping, and its page faults, every time. Their heap stays small either way."""
    if _applied:
        _mallopt(M_MMAP_THRESHOLD, 32 << 20)
