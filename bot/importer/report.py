"""What an import did, one line per file or setting, for the person who ran it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Action = Literal["adopted", "converted", "added", "moved aside", "left alone", "not carried"]
_ORDER: tuple[Action, ...] = (
    "adopted",
    "converted",
    "added",
    "moved aside",
    "left alone",
    "not carried",
)


@dataclass(frozen=True, slots=True)
class Item:
    action: Action
    what: str  # a path relative to the source, or a config key
    detail: str = ""

    def line(self) -> str:
        return f"  {self.action:<11} {self.what}" + (f": {self.detail}" if self.detail else "")


@dataclass(slots=True)
class Report:
    items: list[Item] = field(default_factory=list)

    def add(self, action: Action, what: str, detail: str = "") -> None:
        self.items.append(Item(action, what, detail))

    def of(self, action: Action) -> list[Item]:
        return [i for i in self.items if i.action == action]

    def render(self) -> str:
        """The items grouped by action, in a fixed order (adopted first, not carried last)."""
        out: list[str] = []
        for action in _ORDER:
            group = self.of(action)
            if action == "not carried" and group:
                out.append("  Settings with no memobot equivalent (not carried over):")
                out += [f"    {i.what}" + (f": {i.detail}" if i.detail else "") for i in group]
                continue
            out += [i.line() for i in group]
        return "\n".join(out)
