"""bench/all.py runs end to end on small inputs and prints a table and `ratio NAME X` lines.

No timing is asserted: speed is what the bench reports, not what a test checks.
"""

from __future__ import annotations

import math
import re
import subprocess


def test_bench_all_quick_prints_table_and_ratios(repo_root, python, shared_data):
    proc = subprocess.run([python, str(repo_root / "bench" / "all.py"), "--quick", "--rounds", "1",
                           "--only", "filter,shards"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()

    # The last lines: one `ratio NAME X` per pair asked for, in pipeline order, X a number.
    tail = [re.fullmatch(r"ratio (\w+) (\S+)", line) for line in lines[-2:]]
    assert all(tail), lines[-2:]
    assert [m[1] for m in tail] == ["filter", "shards"]
    ratios = {m[1]: float(m[2]) for m in tail}
    assert all(math.isfinite(r) and r > 0 for r in ratios.values()), ratios

    # The table: a header, and one row per pair with both figures, the ratio, its target and spread.
    header = next(i for i, line in enumerate(lines) if line.startswith("stage "))
    assert lines[header].split()[:6] == ["stage", "lait", "peer", "ratio", "target", "met"]
    rows = {line.split()[0]: line for line in lines[header + 2: header + 4]}
    assert set(rows) == {"filter", "shards"}
    assert re.search(r"img/s\s+[\d,.]+ img/s\s+[\d.]+\s+>= 0\.80\s+(yes|NO)\s+1\s+[\d.]+-[\d.]+$", rows["filter"])
    assert re.search(r"MB/s\s+[\d,.]+ MB/s\s+[\d.]+\s+>= 1\.00\s+(yes|NO)\s+1\s+[\d.]+-[\d.]+$", rows["shards"])
    assert f"{ratios['filter']:.2f}" in rows["filter"].split()


def test_bench_all_refuses_an_unknown_name(repo_root, python):
    proc = subprocess.run([python, str(repo_root / "bench" / "all.py"), "--only", "nosuch"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "unknown bench nosuch" in proc.stderr
