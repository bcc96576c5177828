"""img2dataset in an environment of its own, for the tests that compare lait's resizer with it.

img2dataset pins old webdataset and pandas, so it never enters lait's environment. The first
test that asks for it builds a virtual environment with img2dataset from PyPI in
`$LAIT_CACHE/img2dataset-VERSION` (`$LAIT_CACHE` defaulting to `~/.cache/lait`), once; later runs
reuse it. `$LAIT_IMG2DATASET_PYTHON` names another environment's Python instead. The tests skip,
saying why, when the environment cannot be built (no package index) or cannot import
img2dataset.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).parent
IMG2DATASET = "img2dataset==1.47.0"  # the version ../shared/BASELINES.md measured
READY = ".lait-ready"


def _env() -> dict[str, str]:
    """The environment for img2dataset's Python: without the checkout on PYTHONPATH (its
    folders `build/`, `train/` would shadow packages of the same names)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["NO_ALBUMENTATIONS_UPDATE"] = "1"
    return env


def _probe(python: str) -> str | None:
    """None when `python` imports img2dataset's resizer, else why not."""
    res = subprocess.run([python, "-c", "import img2dataset.resizer, cv2"], capture_output=True, text=True,
                         timeout=300, env=_env())
    return None if res.returncode == 0 else (res.stderr.strip().splitlines() or ["failed"])[-1]


def _build_env(venv: Path) -> str | None:
    """Make the environment (under a file lock, so one pytest process builds it); None when it
    is ready, else why it could not be built."""
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f".{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (venv / READY).exists():
            return None
        shutil.rmtree(venv, ignore_errors=True)  # a build that stopped half way
        log = venv.parent / f"{venv.name}.log"
        with open(log, "w") as out:
            for cmd in ([sys.executable, "-m", "venv", str(venv)],
                        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", IMG2DATASET]):
                try:
                    res = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=900, env=_env())
                except subprocess.TimeoutExpired:
                    return f"{' '.join(cmd[-2:])} took over 900 s (see {log})"
                if res.returncode != 0:
                    return f"`{' '.join(cmd[-3:])}` failed (see {log})"
        (venv / READY).write_text(IMG2DATASET + "\n")
    return None


@pytest.fixture(scope="session")
def img2dataset_python() -> str:
    """The Python of an environment with img2dataset (built on first use), or a skip."""
    python = os.environ.get("LAIT_IMG2DATASET_PYTHON")
    if not python:
        cache = Path(os.environ.get("LAIT_CACHE") or Path.home() / ".cache" / "lait")
        venv = cache / IMG2DATASET.replace("==", "-")
        why = _build_env(venv)
        if why:
            pytest.skip(f"no img2dataset environment: {why}")
        python = str(venv / "bin" / "python")
    if not Path(python).is_file():
        pytest.skip(f"no img2dataset environment at {python}")
    why = _probe(python)
    if why:
        pytest.skip(f"{python} cannot import img2dataset's resizer: {why}")
    return python


@pytest.fixture(scope="session")
def img2dataset_resize(img2dataset_python, tmp_path_factory) -> Callable[..., dict[str, np.ndarray]]:
    """`resize(photos, modes, image_size, only_if_bigger)`: img2dataset's `Resizer` run on the
    image files in its own environment (tests/build/img2dataset_resizer.py), PNG out, decoded to
    RGB arrays keyed `MODE/INDEX`."""

    def resize(photos: list[Path], modes: list[str], image_size: int, only_if_bigger: bool = False
               ) -> dict[str, np.ndarray]:
        tmp = tmp_path_factory.mktemp("img2dataset")
        spec = {"photos": [str(p) for p in photos], "modes": modes, "image_size": image_size,
                "only_if_bigger": only_if_bigger, "out": str(tmp / "img2dataset.npz")}
        (tmp / "spec.json").write_text(json.dumps(spec))
        subprocess.run([img2dataset_python, str(HERE / "img2dataset_resizer.py"), str(tmp / "spec.json")],
                       check=True, env=dict(_env(), TMPDIR=str(tmp)), timeout=600)  # wandb's tmp folders
        with np.load(spec["out"]) as z:
            return {k: z[k] for k in z.files}

    return resize


@pytest.fixture(scope="session")
def demo40(tmp_path_factory) -> tuple[Path, str]:
    """`lait demo` with its defaults on a 40-page local web, run once per session in this process:
    (its output folder, what it printed). Read by test_build_demo_e2e (against the ground truth,
    then a second run that must reuse everything) and test_shards_ecosystem (the shards' readers),
    which ran a demo each before; tests/conftest.py puts them on one xdist worker ("demo40")."""
    import contextlib
    import io

    from lait.app.demo import DemoConfig, run_demo

    out = tmp_path_factory.mktemp("demo40") / "demo"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert run_demo(DemoConfig(out=str(out), pages=40, workers=2, port=0, progress=False)) == 0
    return out, printed.getvalue()
