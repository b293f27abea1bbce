"""The suite's bytecode written once, before the xdist workers start.

A fresh clone has none. Every worker collects every test module at the same moment, so each
one rewrote the ~40,000 lines of tests for pytest's assertions (about 13 s of CPU) and compiled
memobot's modules, none finding the others' work: six times the CPU, about 40 s of a run's
wall time on two cores. Done here first, in one process per core, the workers (and the
memobot processes they start) read the caches instead. Only an optimisation: if pytest's
rewriting internals change, this does nothing and the workers rewrite as before.
"""

from __future__ import annotations

import compileall
import os
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import pytest

_config: pytest.Config | None = None  # the forked pool's processes inherit it


def prepare(config: pytest.Config, repo: Path) -> None:
    """Write the rewritten test modules' and the imported modules' caches that are missing or
    stale; for the xdist controller (one process alone caches as it goes anyway)."""
    if config.getoption("assertmode", None) != "rewrite":
        return
    try:
        from _pytest.assertion import rewrite
    except ImportError:
        return
    names = ("_rewrite_test", "_write_pyc", "_read_pyc", "get_cache_dir", "assertstate_key")
    if not all(hasattr(rewrite, name) for name in names):
        return
    tests = [str(p) for p in sorted((repo / "tests").glob("test_*.py"))]
    tests.append(str(repo / "tests" / "conftest.py"))
    modules = [
        str(p)
        for folder in ("bot", "channels", "tests/helpers", "tests/fakes")
        for p in sorted((repo / folder).rglob("*.py"))
    ]
    global _config
    _config = config
    with ProcessPoolExecutor(os.cpu_count() or 1, mp_context=get_context("fork")) as pool:
        list(pool.map(_rewrite, tests, chunksize=4))
        list(pool.map(_compile, modules, chunksize=16))


def _rewrite(path: str) -> None:
    try:
        _rewrite_one(Path(path))
    except Exception:  # a module that does not parse: its worker reports it on collection
        return


def _rewrite_one(fn: Path) -> None:
    from _pytest.assertion import rewrite

    assert _config is not None
    cache_dir = rewrite.get_cache_dir(fn)
    pyc = cache_dir / (fn.name[:-3] + rewrite.PYC_TAIL)
    if rewrite._read_pyc(fn, pyc) is not None:
        return
    cache_dir.mkdir(exist_ok=True)
    source_hash, code = rewrite._rewrite_test(fn, _config)
    rewrite._write_pyc(_config.stash[rewrite.assertstate_key], code, source_hash, pyc)


def _compile(path: str) -> None:
    compileall.compile_file(path, quiet=2)
