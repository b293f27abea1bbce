"""JSON from the model (and from files it can write), parsed within limits.

``json.loads`` of ``[[[[...`` raises RecursionError, not ValueError, so a caller catching
ValueError is ended by it; a value nested a few hundred levels parses, and then crashes the
next code that walks it (``json.dumps`` for an approval question, a log line, an MCP request).
Everything here raises ValueError subclasses only, with a message written for the model.
"""

from __future__ import annotations

import json
from typing import Any

# Far beyond any tool's schema (a few levels) and any model's output limit.
MAX_DEPTH = 64
MAX_ARGUMENT_CHARS = 2 * 1024 * 1024


class BadArguments(ValueError):
    """A tool call's arguments that cannot be used; ``str()`` says why, for the model."""


class TooDeep(ValueError):
    """JSON nested more than ``MAX_DEPTH`` levels."""


def loads(text: str | bytes, max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads`` that raises only ValueError: ``json.JSONDecodeError`` for bad JSON,
    ``TooDeep`` for lists and objects nested more than ``max_depth`` levels."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise TooDeep(f"nested more than {max_depth} levels deep") from None
    if deeper_than(value, max_depth):
        raise TooDeep(f"nested more than {max_depth} levels deep")
    return value


def deeper_than(value: Any, limit: int) -> bool:
    """Whether lists and objects in ``value`` nest more than ``limit`` levels (no recursion)."""
    level: list[Any] = [value]
    depth = 0
    while True:
        level = [v for v in level if isinstance(v, dict | list)]
        if not level:
            return False
        depth += 1
        if depth > limit:
            return True
        level = [c for v in level for c in (v.values() if isinstance(v, dict) else v)]


def parse_arguments(raw: str) -> dict[str, Any]:
    """A tool call's arguments as a JSON object: the one parser of them in memobot.

    "" is ``{}`` (a call without arguments). Raises BadArguments when ``raw`` is over
    MAX_ARGUMENT_CHARS, is not JSON, nests more than MAX_DEPTH levels or is not an object.
    """
    if len(raw) > MAX_ARGUMENT_CHARS:
        raise BadArguments(
            f"the tool arguments are too large ({len(raw):,} characters; the limit is "
            f"{MAX_ARGUMENT_CHARS:,}): split the work into smaller calls"
        )
    if not raw.strip():
        return {}
    try:
        args = loads(raw)
    except TooDeep as exc:
        raise BadArguments(f"the tool arguments are {exc}: call again with flat ones") from None
    except json.JSONDecodeError as exc:
        raise BadArguments(
            f"tool arguments are not valid JSON ({exc.msg} at position {exc.pos})"
        ) from None
    if not isinstance(args, dict):
        raise BadArguments("tool arguments must be a JSON object")
    return args
