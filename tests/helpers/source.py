"""Reading memobot's own sources as syntax trees, for the tests that check rules of the code."""

from __future__ import annotations

import ast
import functools
import time
from pathlib import Path

TRIES = 20


def parse(path: Path) -> ast.Module:
    """``path`` parsed, once per version of the file in this process (several rules read the
    same sources; a tree is theirs to walk, never to change). CPython 3.11 before 3.11.8 keeps
    the AST converter's recursion depth in state shared by every thread, so a parse while
    another thread parses (a traceback formatted in a worker thread parses the failing line)
    can raise a spurious "AST constructor recursion depth mismatch" SystemError (gh-106905);
    the parse is tried again."""
    info = path.stat()
    return _parse(path.resolve(), info.st_mtime_ns, info.st_size)


@functools.lru_cache(maxsize=4096)
def _parse(path: Path, _mtime_ns: int, _size: int) -> ast.Module:
    source = path.read_text(encoding="utf-8")
    for attempt in range(TRIES):
        try:
            return ast.parse(source, str(path))
        except SystemError as exc:
            if "recursion depth mismatch" not in str(exc) or attempt == TRIES - 1:
                raise
            time.sleep(0.001)
    raise AssertionError("unreachable")
