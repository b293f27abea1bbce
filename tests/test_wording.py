"""Counts in what memobot prints agree with their nouns (issue 29: "1 messages")."""

from __future__ import annotations

from bot.wording import counted


def test_counted_agrees_with_its_noun() -> None:
    assert counted(1, "message") == "1 message"
    assert counted(0, "message") == "0 messages"
    assert counted(2, "entry", "entries") == "2 entries"
    assert counted(1, "entry", "entries") == "1 entry"
    assert counted(12_000, "message") == "12,000 messages"
