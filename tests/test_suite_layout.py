"""The suite's own shape: test modules share code through tests/helpers and conftest.py only.

A test module that imports another drags that module's fixtures, marks and collection into
its own, and a private helper used from a second file cannot be renamed without breaking it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from tests.helpers.source import parse

TESTS = Path(__file__).resolve().parent


def imports_of(path: Path, root: Path) -> list[tuple[int, str, list[str]]]:
    """(line, module, names) of every import in ``path`` (under the package folder ``root``),
    at any depth, relative ones made absolute; names is empty for ``import x``."""
    package = path.relative_to(root.parent).parent.parts
    found: list[tuple[int, str, list[str]]] = []
    for node in statements(parse(path).body):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else ()
            module = ".".join((*base, *([node.module] if node.module else [])))
            found.append((node.lineno, module, [alias.name for alias in node.names]))
    return found


def statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Every statement in ``body`` at any depth (an import is a statement; the expressions,
    most of a tree's nodes, are not walked)."""
    for node in body:
        yield node
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            inner = getattr(node, field, None)
            if isinstance(inner, list):
                yield from statements(inner)


def problems(root: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        where = path.relative_to(root.parent)
        for line, module, names in imports_of(path, root):
            parts = module.split(".")
            if parts[0] != "tests":
                continue
            if any(p.startswith("test_") for p in (*parts[1:], *names)):
                found.append(f"{where}:{line} imports the test module {module}")
            private = [n for n in names if n.startswith("_") and not n.startswith("__")]
            if private:
                found.append(f"{where}:{line} imports private {', '.join(private)} from {module}")
    return found


def test_no_test_module_imports_another_or_a_private_name() -> None:
    assert problems(TESTS) == []


def test_the_check_sees_a_test_module_import_and_a_private_name(tmp_path: Path) -> None:
    root = tmp_path / "tests"
    (root / "helpers").mkdir(parents=True)
    (root / "test_a.py").write_text("def helper():\n    from tests.test_b import running\n")
    (root / "test_c.py").write_text("from tests import test_b\nimport tests.test_b\n")
    (root / "helpers" / "x.py").write_text("from tests.helpers.y import _secret, __all__\n")
    (root / "test_d.py").write_text("from tests.helpers import Harness\nimport os\n")
    (root / "helpers" / "z.py").write_text("from . import _y\nfrom ..test_e import x\n")
    assert problems(root) == [
        "tests/helpers/x.py:1 imports private _secret from tests.helpers.y",
        "tests/helpers/z.py:1 imports private _y from tests.helpers",
        "tests/helpers/z.py:2 imports the test module tests.test_e",
        "tests/test_a.py:2 imports the test module tests.test_b",
        "tests/test_c.py:1 imports the test module tests",
        "tests/test_c.py:2 imports the test module tests.test_b",
    ]
