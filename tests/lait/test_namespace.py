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


def _module_of(path: str) -> str:
    """`lait/x/y.py` -> `lait.x.y`; `lait/x/__init__.py` -> `lait.x`."""
    parts = path[: -len(".py")].split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(source: str, module: str, is_package: bool) -> tuple[set[str], set[str]]:
    """(every module a source file imports, at the top or inside a function, relative imports
    resolved, `from X import a` counted as X and X.a; every dotted `lait.` path its strings name:
    commands and spiders found by name, `python -m` lines, Scrapy settings)."""
    import re

    tree = ast.parse(source)
    package = module if is_package else module.rpartition(".")[0]
    imported: set[str] = set()
    named: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            imported.add(base)
            imported.update(f"{base}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            for path in re.findall(r"\blait(?:\.[A-Za-z_]\w*)+", node.value):  # a module or a name in one
                parts = path.split(".")
                named.update(".".join(parts[:k]) for k in range(2, len(parts) + 1))
    return imported, named


def test_the_wheel_holds_no_module_only_tests_or_benches_import(built_wheel):
    """Issue 60: what only tests and benchmarks use lives in tests/kit/, outside the wheel. A
    module of the wheel that no other module of it imports or names, and that is not the command
    line's entry point, is there for tests alone (or for nobody)."""
    wheel = zipfile.ZipFile(built_wheel)
    sources = {_module_of(n): (wheel.read(n).decode(), n.endswith("__init__.py"))
               for n in wheel.namelist() if n.endswith(".py")}
    assert "lait.app.cli" in sources and "lait.testkit.generator" in sources
    used: set[str] = {"lait.app.cli", "lait.__main__"}  # the `lait` script; `python -m lait`
    for name, (source, is_package) in sources.items():
        imported, named = _imports(source, name, is_package)
        used |= {m for m in imported | named if m != name}
    # Scrapy imports every module of the packages its settings name as SPIDER_MODULES.
    settings = ast.parse(sources["lait.crawler.settings"][0])
    (spider_packages,) = [ast.literal_eval(n.value) for n in settings.body if isinstance(n, ast.Assign)
                          and any(getattr(t, "id", None) == "SPIDER_MODULES" for t in n.targets)]
    unused = sorted(m for m, (_, is_package) in sources.items()
                    if not is_package and m not in used and m.rpartition(".")[0] not in spider_packages)
    assert not unused, "modules of the wheel that nothing in the wheel imports (move them to tests/kit/):\n" + \
        "\n".join(unused)
