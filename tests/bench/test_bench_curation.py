"""bench/curation runs on small sizes and prints one row per step and size (no timing asserted)."""

from __future__ import annotations

import subprocess


def test_bench_curation_prints_a_row_per_step_and_size(repo_root, python):
    proc = subprocess.run([python, str(repo_root / "bench" / "curation" / "bench_curation.py"), "--sizes", "600,1200",
                           "--repeats", "1", "--dim", "16"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line.split() for line in proc.stdout.splitlines() if line.startswith(("semdedup ", "balance "))]
    assert [(r[0], r[1]) for r in rows] == [("semdedup", "600"), ("semdedup", "1,200"),
                                             ("balance", "600"), ("balance", "1,200")]
    for r in rows:
        assert float(r[2]) >= 0 and float(r[3]) >= 0 and "kept" in r
    assert rows[1][8].endswith("x")  # growth against the size before, beside n log n's
