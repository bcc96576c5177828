"""lait.storage on an fsspec filesystem other than local disk (fsspec's in-memory one)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# Reads one Parquet file 30 times through a Python file object, as every object-storage read
# does, and exits. pyarrow's threaded read_table of a file object made such a process abort at
# exit ("terminate called without an active exception") in 8 runs of 10.
SCRIPT = textwrap.dedent("""
    import os
    import fsspec
    import pyarrow as pa
    import pyarrow.parquet as pq
    from lait import storage

    with fsspec.filesystem("memory").open("memory://lait-test/t/x.parquet", "wb") as f:
        pq.write_table(pa.table({"b": [os.urandom(1000) for _ in range(2000)]}), f)
    path = storage.location("memory://lait-test/t") / "x.parquet"
    print(sum(storage.read_table(path).num_rows for _ in range(30)))
""")


def test_reading_parquet_from_object_storage_exits_cleanly():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for _ in range(8):
        run = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True)
        assert (run.returncode, run.stdout.strip()) == (0, "60000"), run.stderr[-2000:]


def test_remove_tree_removes_a_link_and_nothing_it_points_to(tmp_path):
    """A folder of the work directory that is a link is removed as a link: `shutil.rmtree`
    refuses one (and, told to ignore errors, left it in place without a word)."""
    from lait import storage

    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "00000.tar").write_bytes(b"kept")
    link = tmp_path / "shards.old"
    link.symlink_to(target)
    storage.remove_tree(link)
    assert not link.exists() and not link.is_symlink()
    assert (target / "00000.tar").read_bytes() == b"kept"
