"""One namespace: the stage folders are `lait.crawler`, `lait.filters`, ... and nothing else.

The wheel must install exactly one top-level package, so that lait never shadows PyPA's `build`
or anyone's `train`; and no code may import a stage by its bare folder name (in a checkout
that would still work, since the repository root is on the path, and then break in the wheel).
"""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STAGES = ("crawler", "filters", "scoring", "build", "train")
CODE_DIRS = ("lait", *STAGES, "tests", "bench", "scripts")


def _python_files() -> list[Path]:
    out = []
    for d in CODE_DIRS:
        out += [p for p in (REPO / d).rglob("*.py") if "__pycache__" not in p.parts]
    return sorted(out)


def test_no_bare_stage_imports():
    offenders = []
    for path in _python_files():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                if name.split(".")[0] in STAGES:
                    offenders.append(f"{path.relative_to(REPO)}:{node.lineno}: import {name}")
    assert not offenders, "import stages as lait.X:\n" + "\n".join(offenders)


def test_no_bare_stage_module_strings():
    """Module paths in strings (Scrapy settings, importlib, `python -m`) follow the namespace."""
    import re

    pattern = re.compile(r"""["'](?:-m\s+)?(crawler|filters|scoring|build|train)\.[a-z_]+(\.[A-Za-z_]+)*["']""")
    offenders = []
    for path in [*_python_files(), REPO / "scrapy.cfg"]:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            m = pattern.search(line)
            if m and not m.group(0)[1:-1].endswith((".py", ".yaml", ".json", ".html", ".tar", ".npy", ".txt")):
                offenders.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    cfg = (REPO / "scrapy.cfg").read_text()
    assert "default = lait.crawler.settings" in cfg
    assert not offenders, "\n".join(offenders)


def test_wheel_has_one_top_level_package(built_wheel, installed_tree, tmp_path):
    names = zipfile.ZipFile(built_wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    dist_info = "-".join(built_wheel.name.split("-")[:2]) + ".dist-info"
    assert tops == {"lait", dist_info}, tops
    for stage in STAGES:
        assert f"lait/{stage}/__init__.py" in names, stage
    assert "lait/crawler/spiders/lait.py" in names
    assert any(n.startswith("lait/train/configs/") and n.endswith(".yaml") for n in names)

    # Installed on its own (no checkout on the path), the stages import from inside lait/.
    code = ("import sys; sys.path[:] = [p for p in sys.path if p and p != %r]; "
            "sys.path.insert(0, %r); import lait, lait.build.config, lait.crawler.settings; "
            "print(lait.__path__, lait.build.config.__file__)") % (str(REPO), str(installed_tree))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path, env={"PATH": "/usr/bin:/bin"})
    assert res.returncode == 0, res.stderr[-2000:]
    assert str(installed_tree / "lait") in res.stdout and str(REPO) not in res.stdout
