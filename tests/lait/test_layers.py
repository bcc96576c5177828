"""The house: import-linter's layer contract (pyproject.toml) holds, and no module imports
itself back through others.

Both read the installed layout (the wheel unpacked), where the stages sit inside `lait/` as
grimp expects; in a checkout they are found through `lait.__path__`, which grimp does not follow.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CORE_EXEMPT = {"__main__"}  # the `python -m lait` entry point, which runs the app layer


def _contract_layers() -> list[str]:
    import tomllib

    (contract,) = [c for c in tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
                   if c["type"] == "layers"]
    return contract["layers"]


def test_every_module_of_lait_is_in_a_layer():
    """A module the contract does not name would escape it: new core modules must be listed."""
    named = {m.strip() for layer in _contract_layers() for m in layer.replace("|", ":").split(":")}
    children = {p.stem for p in (REPO / "lait").glob("*.py") if p.stem != "__init__"}
    children |= {p.name for p in (REPO / "lait").iterdir() if (p / "__init__.py").is_file()}
    children |= {"crawler", "filters", "scoring", "build", "train"}
    missing = children - named - CORE_EXEMPT
    assert not missing, f"add these to the layers contract in pyproject.toml: {sorted(missing)}"


def test_import_linter_contracts_hold(installed_tree):
    env = {**os.environ, "PYTHONPATH": str(installed_tree)}
    lint = Path(sys.executable).with_name("lint-imports")
    res = subprocess.run([str(lint), "--config", str(REPO / "pyproject.toml"), "--no-cache"], cwd=installed_tree,
                         env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert "0 broken" in res.stdout


def _cycles(graph) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []
    counter = 0
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        m = stack.pop()
                        on_stack.discard(m)
                        comp.append(m)
                        if m == node:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def test_no_import_cycles(installed_tree, monkeypatch):
    grimp = pytest.importorskip("grimp")
    monkeypatch.syspath_prepend(str(installed_tree))
    for name in [m for m in sys.modules if m == "lait" or m.startswith("lait.")]:
        monkeypatch.delitem(sys.modules, name)
    graph = grimp.build_graph("lait", cache_dir=None)
    assert "lait.crawler.spiders.lait" in graph.modules
    cycles = _cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_cycle_finder_finds_a_cycle():
    class G:
        modules = {"a", "b", "c", "d"}
        edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}

        def find_modules_directly_imported_by(self, m):
            return self.edges.get(m, set())

    assert _cycles(G()) == [["a", "b", "c"]]
