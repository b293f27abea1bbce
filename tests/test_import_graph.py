"""The import graph of memobot's own packages has no cycle, and the core imports no platform SDK.

Read from the source with `ast`, so the rule holds for every module, also those a test run never
imports. An import inside a function is lazy and is not an edge; an import under
`if TYPE_CHECKING:` never runs and is not one either.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

from tests.helpers.source import parse

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("bot", "channels")
PLATFORM_SDKS = ("telegram", "discord", "slack_bolt", "slack_sdk")


def _modules() -> dict[str, tuple[Path, bool]]:
    found: dict[str, tuple[Path, bool]] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts = parts[:-1]
            found[".".join(parts)] = (path, is_package)
    return found


def _module_level(nodes: Iterable[ast.stmt]) -> Iterable[ast.Import | ast.ImportFrom]:
    """Imports that run when the module is imported (not in functions, not TYPE_CHECKING)."""
    for node in nodes:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If):
            if "TYPE_CHECKING" not in ast.unparse(node.test):
                yield from _module_level(node.body)
            yield from _module_level(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody):
                yield from _module_level(block)
            for handler in node.handlers:
                yield from _module_level(handler.body)
        elif isinstance(node, ast.With):
            yield from _module_level(node.body)


def _imported(name: str, is_package: bool, node: ast.Import | ast.ImportFrom) -> set[str]:
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names}
    if node.level:
        base = name.split(".") if is_package else name.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        source = ".".join([*base, *([node.module] if node.module else [])])
    else:
        source = node.module or ""
    return {source, *(f"{source}.{alias.name}" for alias in node.names)}


def _graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    modules = _modules()
    edges: dict[str, set[str]] = {}
    externals: dict[str, set[str]] = {}
    for name, (path, is_package) in modules.items():
        targets: set[str] = set()
        outside: set[str] = set()
        for node in _module_level(parse(path).body):
            names = _imported(name, is_package, node)
            own = {n for n in names if n.split(".")[0] in PACKAGES}
            outside |= {n.split(".")[0] for n in names - own}
            submodules = {n for n in own if n in modules}
            # `from pkg import submodule` needs the submodule, not the package's own names.
            if isinstance(node, ast.ImportFrom) and node.names:
                source = min(names, key=len)
                if all(f"{source}.{a.name}" in modules for a in node.names):
                    submodules.discard(source)
            for target in submodules or own:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    targets.add(target)
        edges[name] = targets
        externals[name] = outside
    return edges, externals


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycle_among_bot_and_channels() -> None:
    edges, _ = _graph()
    assert _cycles(edges) == []


def test_the_checker_sees_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_core_imports_no_platform_sdk() -> None:
    _, externals = _graph()
    offenders = {
        name: sorted(sdks & set(PLATFORM_SDKS))
        for name, sdks in externals.items()
        if name.startswith("bot.") and sdks & set(PLATFORM_SDKS)
    }
    assert offenders == {}


def test_a_gateway_does_not_import_the_panel_server_until_someone_opens_it() -> None:
    """The panel's server (aiohttp.web, its screens: ~2 MiB) is built at the first connection
    (bot.web.listener); nothing the gateway imports at its start reaches it."""
    edges, _ = _graph()
    seen, todo = set(), ["bot.gateway", "bot.cli", "bot.web.listener"]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(edges.get(name, ()))
    assert "bot.web.server" not in seen
    assert not any(n.startswith("bot.web.screens") for n in seen)
