"""A small disk for the tests of a full disk: a tmpfs mounted for a test module (root only)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


def mounted_tmpfs(tmp_path_factory, size_mb: int) -> Iterator[Path]:
    """A fixture's body: a tmpfs of `size_mb` MB mounted on a fresh folder, unmounted afterwards;
    the test is skipped where it cannot be mounted (not root, no `mount`, no permission)."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path_factory.mktemp("tmpfs")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(mnt)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)
