"""What one ``memobot doctor`` check found: a status, a line for a person, and the fix."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Status = Literal["ok", "warn", "fail", "info"]


@dataclass(frozen=True, slots=True)
class Check:
    status: Status
    text: str
    fix: str = ""
    fixable: bool = False  # ``--fix`` would repair it
