"""Named crash points for the crash-test suite: ``MEMOBOT_FAILPOINTS=name[,name...]``.

At a named point the process sends itself SIGKILL, the same death as an OOM kill or a power
cut, so tests can stop memobot at an exact phase of a turn rather than at a lucky moment.
``name@N`` fires on the N-th time the point is reached. Unset, a check is one dict lookup.
"""

from __future__ import annotations

import os
import signal
import sys

_armed: dict[str, int] = {}
for _spec in filter(None, os.environ.get("MEMOBOT_FAILPOINTS", "").split(",")):
    _name, _, _nth = _spec.strip().partition("@")
    _armed[_name] = int(_nth or 1)


def armed(name: str) -> bool:
    """True when this visit to ``name`` is the one that must crash."""
    if name not in _armed:
        return False
    _armed[name] -= 1
    return _armed[name] == 0


def crash() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def hit(name: str) -> None:
    if _armed and armed(name):
        crash()
