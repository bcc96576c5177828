"""Counts the checks in tests/: `assert` statements and `pytest.raises`/`pytest.warns` calls,
beside the number of test functions (docs/testing.md compares them before and after a change).

    python scripts/count_asserts.py            # totals
    python scripts/count_asserts.py --files    # and one line per test file
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "tests"


def count(path: Path) -> tuple[int, int, int]:
    """(test functions, assert statements, pytest.raises/warns calls) in one file."""
    tests = asserts = raises = 0
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Assert):
            asserts += 1
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("raises", "warns") and getattr(node.func.value, "id", "") == "pytest":
            raises += 1
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"):
            tests += 1
    return tests, asserts, raises


def main() -> None:
    total = [0, 0, 0]
    for path in sorted(ROOT.rglob("*.py")):
        c = count(path)
        total = [a + b for a, b in zip(total, c)]
        if "--files" in sys.argv and any(c):
            print(f"{path.relative_to(ROOT.parent)}\t{c[0]}\t{c[1]}\t{c[2]}")
    print(f"test functions {total[0]}, assert statements {total[1]}, pytest.raises/warns {total[2]}, "
          f"checks {total[1] + total[2]}")


if __name__ == "__main__":
    main()
