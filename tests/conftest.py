"""Fixtures shared by every test package."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"

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
