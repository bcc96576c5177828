"""lait.memory: the pinned mmap threshold gives freed multi-MB buffers back to the system, and
Arrow (the Parquet reader included) allocates from the system pool, not mimalloc."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc only")

# Resident memory of the script's own process, in bytes.
RSS = textwrap.dedent("""
    import os

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
""")

# Large buffers freed while small blocks allocated after them stay alive: the pattern of a
# partition's image bytes and decoded arrays among its rows. `retained` is the MiB still resident.
RETENTION = textwrap.dedent("""
    base = rss()
    bufs, small = [], []
    for _ in range(100):
        bufs.append(bytearray(2 << 20))
        small.append(bytearray(3000))
    del bufs
    retained = (rss() - base) >> 20
""")


def _run(script: str, *args: str, env_extra: dict | None = None) -> str:
    """stdout of `script` in a fresh interpreter, without the caller's MALLOC_ settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env.update({"PYTHONPATH": str(REPO), **(env_extra or {})})
    return subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True, text=True,
                          check=True).stdout


# The retention pattern with glibc's default or the pinned threshold. Prints the MiB still resident.
SCRIPT = RSS + textwrap.dedent("""
    import sys

    if sys.argv[1] == "fix":
        from lait.memory import fix_mmap_threshold
        print(fix_mmap_threshold(), fix_mmap_threshold())
    else:
        print("default")
    big = bytearray(8 << 20)
    del big  # by default this raises glibc's mmap threshold to 8 MiB
""") + RETENTION + "print(retained)\n"


def _retained(mode: str, env_extra: dict | None = None) -> tuple[str, int]:
    out = _run(SCRIPT, mode, env_extra=env_extra).split("\n")
    return out[0], int(out[1])


def test_pinned_threshold_returns_freed_buffers():
    _, default = _retained("default")
    flags, fixed = _retained("fix")
    assert flags == "True True"  # applied once, and the second call reports the same
    # glibc's default keeps the 200 MiB of freed 2 MiB buffers in the heap; pinned, they go back.
    assert default >= 150
    assert fixed <= 20


def test_threshold_from_the_environment_wins():
    flags, _ = _retained("fix", {"MALLOC_MMAP_THRESHOLD_": "65536"})
    assert flags == "False False"  # the user's setting is left alone


# Writes and reads a Parquet file, then reports the environment variable, pyarrow's default pool
# and how much the Parquet code took from mimalloc, the pool lait moves Arrow off.
ARROW_SCRIPT = textwrap.dedent("""
    import os, sys
    if sys.argv[1] == "late":
        import pyarrow
    from lait.memory import apply_memory_settings
    apply_memory_settings()
    apply_memory_settings()
    import pyarrow as pa, pyarrow.parquet as pq
    # a file path, not a BytesIO: pyarrow's threaded reads of Python buffers can abort the
    # process at exit (see lait.storage)
    path = os.path.join(sys.argv[2], "t.parquet")
    pq.write_table(pa.table({"b": [os.urandom(1000) for _ in range(2000)]}), path)
    assert pq.read_table(path).num_rows == 2000
    mi = pa.mimalloc_memory_pool().max_memory() if hasattr(pa, "mimalloc_memory_pool") else 0
    print(os.environ.get("ARROW_DEFAULT_MEMORY_POOL"), pa.default_memory_pool().backend_name, mi > 0)
""")


def _arrow(mode: str, tmp_path: Path, env_extra: dict | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    env.update({"PYTHONPATH": str(REPO), **(env_extra or {})})
    return subprocess.run([sys.executable, "-c", ARROW_SCRIPT, mode, str(tmp_path)], env=env,
                          capture_output=True, text=True, check=True).stdout.strip()


def test_arrow_allocates_from_the_system_pool(tmp_path):
    # Applied before pyarrow loads (as the CLI does): all of Arrow, Parquet reader included.
    assert _arrow("early", tmp_path) == "system system False"


def test_arrow_pool_after_pyarrow_loaded_reaches_pyarrow_calls(tmp_path):
    # A worker that loaded pyarrow first gets pyarrow's default switched; the Parquet reader's
    # C++ buffers stay on the pool Arrow chose at load, which is why Ray workers get the variable.
    env, backend, _ = _arrow("late", tmp_path).split()
    assert (env, backend) == ("None", "system")


def test_arrow_pool_from_the_environment_wins(tmp_path):
    assert _arrow("early", tmp_path, {"ARROW_DEFAULT_MEMORY_POOL": "mimalloc"}) == "mimalloc mimalloc True"


# Many small blocks (a parse tree's nodes) freed while one allocated after them stays alive, so
# the heap's top cannot shrink on its own. Prints the MiB still resident before and after a trim.
TRIM_SCRIPT = RSS + textwrap.dedent("""
    from lait.memory import release_free_memory

    base = rss()
    nodes = [bytearray(700) for _ in range(200_000)]
    pin = bytearray(700)
    del nodes
    before = rss()
    released = release_free_memory()
    print(released, (before - base) >> 20, (rss() - base) >> 20)
""")


def test_release_free_memory_gives_a_freed_heap_back():
    released, before, after = _run(TRIM_SCRIPT).split()
    assert released == "True"
    assert int(before) >= 80  # ~140 MB of freed 700-byte blocks (above pymalloc's 512) stay in the heap...
    assert int(after) <= 20  # ...until the trim


# Row groups of media (8 MiB buffers allocated and freed in turn) inside and outside
# `media_heap`, then the retention pattern of SCRIPT after it. Prints the page faults of 20 such
# buffers inside and outside, and the MiB retained after the block.
MEDIA_SCRIPT = RSS + textwrap.dedent("""
    import resource, sys
    from lait.memory import fix_mmap_threshold, media_heap

    def faults_of_row_groups():
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(20):
            buf = bytearray(8 << 20)  # calloc'd: every page is touched, as a filled buffer's are
            buf[::4096] = b"x" * len(buf[::4096])
            del buf
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

    if sys.argv[1] == "fix":
        fix_mmap_threshold()
    outside = faults_of_row_groups()
    with media_heap():
        inside = faults_of_row_groups()
""") + RETENTION + "print(outside, inside, retained)\n"


def _media(mode: str) -> list[int]:
    return [int(x) for x in _run(MEDIA_SCRIPT, mode).split()]


def test_media_heap_recycles_row_group_buffers_and_restores_the_pinned_threshold():
    outside, inside, retained = _media("fix")
    pages = 20 * (8 << 20) // 4096
    assert outside >= pages * 0.9  # pinned: each 8 MiB buffer is a fresh mapping, faulted page by page
    assert inside <= pages * 0.2  # inside the block the heap hands the same pages back
    assert retained <= 20  # after it, freed multi-MB buffers go back to the system again


def test_media_heap_does_nothing_where_the_threshold_is_not_pinned():
    # Not pinned (glibc's dynamic threshold): the block sets nothing, so it restores nothing
    # either; freed 2 MiB buffers stay in the heap as glibc's default keeps them.
    _, _, retained = _media("default")
    assert retained >= 150
