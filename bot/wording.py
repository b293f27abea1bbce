"""Counts as a person reads them: "1 message", "2 messages", never "1 messages"."""

from __future__ import annotations


def counted(n: int, singular: str, plural: str | None = None) -> str:
    """``n`` and the noun that agrees with it (``plural`` defaults to ``singular + "s"``)."""
    return f"{n:,} {singular if n == 1 else plural or singular + 's'}"
