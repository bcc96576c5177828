"""Process-wide memory settings every lait process applies before it works.

glibc's `malloc` serves blocks above `M_MMAP_THRESHOLD` with their own mapping, returned to the
system when freed. By default that threshold rises to the size of the largest such block freed
(up to 32 MiB on 64-bit), after which tensors, decoded images and Arrow buffers of a few MB
come from the heap instead, whose freed space fragments and is seldom given back. Measured with
`bench/scale`, the scoring process of the 20,000-page crawl then peaked 300 MB higher than with
a fixed threshold for the same live data, and the excess grew with the partition size. A fixed
threshold keeps the peak at what is live.

Arrow's default pool in the pip wheels is mimalloc, which keeps the segments it has used: the
filter worker of the 20,000-page crawl grew by about 12 MB a partition in 64 MB mappings, to 330 MB
after eight partitions, while Arrow's own count of live bytes never passed 40 MB. lait has Arrow
use the system allocator instead, under the pinned threshold: the same worker then stays at
about 180 MB from the first partition to the last, and in side-by-side runs its time per
partition was within the run-to-run noise (jemalloc, also flat, sat about 45 MB higher).
Arrow reads its pool's name from `ARROW_DEFAULT_MEMORY_POOL` once, when pyarrow is loaded, and
its C++ code (the Parquet reader's page buffers) keeps to that choice; `pyarrow.set_memory_pool`
afterwards reaches only allocations made through pyarrow's Python calls. So the variable is set
before pyarrow loads: by the CLI first thing, inherited by forked and spawned workers, and passed
to Ray workers in their runtime environment (`arrow_env`).

A setting in the environment (`MALLOC_MMAP_THRESHOLD_`, `ARROW_DEFAULT_MEMORY_POOL`) wins; other
C libraries and platforms are left as they are. `apply_memory_settings` does both and is cheap
to repeat: the CLI calls it before anything imports pyarrow, and executor workers call it before
every partition.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import sys
from collections.abc import Iterator
from typing import Any

M_TRIM_THRESHOLD = -1  # <malloc.h>
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 1 << 20
DEFAULT_TRIM_THRESHOLD = 128 << 10  # glibc's, which a pinned mmap threshold leaves as it is
MEDIA_MMAP_THRESHOLD = 32 << 20  # see media_heap
MEDIA_TRIM_THRESHOLD = 32 << 20

ARROW_POOL = "system"  # see the module docstring
_ARROW_ENV = "ARROW_DEFAULT_MEMORY_POOL"

_applied: bool | None = None


@functools.lru_cache(maxsize=1)
def glibc() -> Any:
    """glibc with `mallopt`, `malloc_trim` (and `sync_file_range`) typed, or None (another platform
    or C library)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
    except (OSError, AttributeError):  # not glibc (musl, ...)
        return None
    libc.mallopt.restype = libc.malloc_trim.restype = ctypes.c_int
    if hasattr(libc, "sync_file_range"):  # lait.storage.start_writeback
        libc.sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
        libc.sync_file_range.restype = ctypes.c_int
    return libc


def _mallopt(param: int, value: int) -> bool:
    libc = glibc()
    return libc is not None and libc.mallopt(param, value) == 1


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


@contextlib.contextmanager
def media_heap() -> Iterator[None]:
    """For a task that streams media row groups (a stage 2 partition): multi-MB buffers come
    from the heap and are reused instead of being mapped afresh.

    Every row group of images passes through buffers of its size (8 MiB): the Parquet reader's
    decoded column, the output column, the Parquet writer's pages. With the pinned 1 MiB
    threshold each is a fresh mapping whose pages fault in one by one: stage 2 over one
    partition of 2,000 photos (300 MB) took 509,000 page faults, about 0.4 s on this 2-core VM.
    Inside this block the mmap threshold is 32 MiB and the heap keeps up to 32 MiB of free space
    at its top, so those buffers recycle the same pages (44,000 faults). The price is memory:
    that run peaked at 253-269 MiB RSS instead of 219 MiB. On exit the pinned threshold is
    restored and the heap trimmed (`release_free_memory`), so the peak does not outlive the
    partition. Does nothing where the threshold was not pinned (another C library, or the
    environment's own setting)."""
    if not _applied or os.environ.get("MALLOC_TRIM_THRESHOLD_"):
        yield
        return
    _mallopt(M_TRIM_THRESHOLD, MEDIA_TRIM_THRESHOLD)
    _mallopt(M_MMAP_THRESHOLD, MEDIA_MMAP_THRESHOLD)
    try:
        yield
    finally:
        _mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        _mallopt(M_TRIM_THRESHOLD, DEFAULT_TRIM_THRESHOLD)
        release_free_memory()


def release_free_memory() -> bool:
    """Give the heap's free pages back to the system (glibc `malloc_trim`); True if any were.

    Small blocks (lxml's nodes, Python objects) never reach the mmap threshold, so after a big
    burst of them the heap keeps its high-water mark: parsing one 2.2 MB page took a clean
    process from 216 to 349 MB RSS, and a trim brought it to 185 MB. It walks the heap, so call
    it after such bursts and between partitions, not per row."""
    libc = glibc()
    return libc is not None and libc.malloc_trim(0) == 1


def arrow_env() -> dict[str, str]:
    """The environment a lait worker process should start with: the user's Arrow pool or ours."""
    return {_ARROW_ENV: os.environ.get(_ARROW_ENV) or ARROW_POOL}


def fix_arrow_pool() -> str:
    """Have Arrow allocate from `ARROW_POOL` unless the environment names a pool; returns the
    pool pyarrow's calls now use.

    Before pyarrow is loaded this sets the environment variable, which covers all of Arrow and
    every child process. Once it is loaded (a worker that imported it before its first
    partition) it can only switch pyarrow's default pool; buffers already allocated keep their
    own pool, so switching in a running process is safe."""
    wanted = arrow_env()[_ARROW_ENV]
    if "pyarrow" not in sys.modules:
        os.environ[_ARROW_ENV] = wanted
    import pyarrow as pa

    if pa.default_memory_pool().backend_name != wanted:  # pyarrow was loaded before this call
        try:
            pa.set_memory_pool(getattr(pa, f"{wanted}_memory_pool")())
        except (AttributeError, NotImplementedError):  # a pool this build of Arrow lacks
            pass
    return pa.default_memory_pool().backend_name


def apply_memory_settings() -> None:
    """Every memory setting of this module; both are cheap after the first call."""
    fix_mmap_threshold()
    fix_arrow_pool()
