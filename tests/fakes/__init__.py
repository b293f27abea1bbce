"""Fakes that sit at the network boundary (DESIGN.md §9).

Names are loaded lazily so that ``python -m tests.fakes.llm_server`` does not import the module
twice (runpy warns when a ``-m`` target is already in ``sys.modules``).
"""

from __future__ import annotations

import importlib
from typing import Any

_LLM_SERVER_NAMES = frozenset(
    {
        "ControlClient",
        "FakeLLM",
        "FakeLLMProcess",
        "FakeLLMThread",
        "Step",
        "call",
        "disconnect",
        "error",
        "hang",
        "reply",
        "tool_step",
    }
)

__all__ = sorted(_LLM_SERVER_NAMES)


def __getattr__(name: str) -> Any:
    if name in _LLM_SERVER_NAMES:
        return getattr(importlib.import_module("tests.fakes.llm_server"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
