"""Fixtures shared by every test package."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"

# Fuzz tests (hypothesis): a bounded, reproducible number of examples in the suite; `make fuzz`
# runs the same tests long and random (LAIT_FUZZ_PROFILE=lait-fuzz).
try:
    from hypothesis import HealthCheck, settings

    settings.register_profile("lait-suite", max_examples=40, deadline=None, database=None, derandomize=True,
                              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    settings.register_profile("lait-fuzz", max_examples=int(os.environ.get("LAIT_FUZZ_EXAMPLES", "3000")),
                              deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    settings.load_profile(os.environ.get("LAIT_FUZZ_PROFILE", "lait-suite"))
except ImportError:  # the fuzz tests skip
    pass

# Subprocesses started by tests import the project from the checkout.
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data (real pages, photos, WARCs); tests that need it skip when it is absent."""
    if not (SHARED_DATA / "SOURCES.md").exists():
        pytest.skip("../shared/data is not present (a fresh clone has no ../shared)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def python() -> str:
    return sys.executable


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory):
    """`lait demo` run once per session, as a user runs it (a subprocess): (out folder, the
    finished process). 60 pages in shards of 50 samples (several shards) and a min_score, so
    the report has a threshold to draw. Slow: it crawls, cleans and scores."""
    import subprocess

    out = tmp_path_factory.mktemp("demo") / "demo"
    proc = subprocess.run([sys.executable, "-m", "lait", "demo", "--out", str(out), "--pages", "60",
                           "--workers", "2", "--port", "0", "--samples-per-shard", "50", "--min-score", "0.6",
                           "--no-progress"], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc
