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


@pytest.fixture(scope="module")
def crawled(tmp_path_factory) -> Path:
    """A crawl of the generated 30-page site (4 partitions): the input of the stage tests."""
    from kit.pipeline_kit import crawl_site

    out = tmp_path_factory.mktemp("crawled") / "crawl"
    crawl_site(out)
    return out


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    """The tiny random-init CLIP config the stage tests score with."""
    import json

    from kit.pipeline_kit import TINY_CLIP

    path = tmp_path_factory.mktemp("model") / "tiny-clip.json"
    path.write_text(json.dumps(TINY_CLIP))
    return path
