"""Fixtures of the core's tests."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def built_wheel(tmp_path_factory) -> Path:
    """lait's wheel, built from this checkout (hatchling, no isolated environment)."""
    out = tmp_path_factory.mktemp("wheel")
    res = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(REPO)],
        capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    (wheel,) = out.glob("lait-*.whl")
    return wheel


@pytest.fixture(scope="session")
def installed_tree(built_wheel, tmp_path_factory) -> Path:
    """The wheel unpacked as an install would lay it out: `lait/` with every stage inside it."""
    site = tmp_path_factory.mktemp("site")
    zipfile.ZipFile(built_wheel).extractall(site)
    return site
