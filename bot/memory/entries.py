"""Targeted edits of Markdown memory files, one bullet entry at a time.

An entry is a top-level bullet (``- text`` or ``* text``) plus its indented continuation lines.
Dream edits files only through these functions, so a run can add, replace or remove single
entries and can never regenerate a file wholesale.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_BULLET = re.compile(r"^[-*] +(?P<text>.*\S)\s*$")
_HEADING = re.compile(r"^(#{1,6}) +(?P<title>.*\S)\s*$")


class EntryError(ValueError):
    """The edit cannot be applied as asked; the message says why, for the model."""


@dataclass(frozen=True, slots=True)
class Entry:
    start: int  # first line index
    end: int  # one past the last line
    text: str  # the entry's text without the bullet, continuation lines joined by spaces


def _norm(text: str) -> str:
    return " ".join(text.split()).casefold()


def parse_entries(text: str) -> list[Entry]:
    lines = text.splitlines()
    out: list[Entry] = []
    i = 0
    while i < len(lines):
        m = _BULLET.match(lines[i])
        if not m:
            i += 1
            continue
        j = i + 1
        parts = [m.group("text")]
        while j < len(lines) and lines[j].startswith(("  ", "\t")) and lines[j].strip():
            parts.append(lines[j].strip())
            j += 1
        out.append(Entry(i, j, " ".join(parts)))
        i = j
    return out


def count_entries(text: str) -> int:
    return len(parse_entries(text))


def find_entry(text: str, needle: str) -> Entry:
    """The one entry containing ``needle`` (whitespace and case folded)."""
    want = _norm(needle.lstrip("-* "))
    if not want:
        raise EntryError("the entry text to look for is empty")
    matches = [e for e in parse_entries(text) if want in _norm(e.text)]
    if not matches:
        raise EntryError(f"no entry contains {needle!r}")
    if len(matches) > 1:
        exact = [e for e in matches if _norm(e.text) == want]
        if len(exact) == 1:
            return exact[0]
        shown = "; ".join(e.text[:60] for e in matches[:5])
        raise EntryError(
            f"{len(matches)} entries contain {needle!r} ({shown}); quote more of the one you mean"
        )
    return matches[0]


def _join(lines: list[str]) -> str:
    return "\n".join(lines).rstrip("\n") + "\n"


def add_entry(text: str, entry: str, section: str | None = None) -> tuple[str, bool]:
    """Add ``- entry`` under ``## section`` (created if missing), or at the end.

    Returns the new text and False when an identical entry already exists (no change).
    """
    entry = " ".join(entry.split()).lstrip("-* ").strip()
    if not entry:
        raise EntryError("the entry is empty")
    if any(_norm(e.text) == _norm(entry) for e in parse_entries(text)):
        return text, False
    lines = text.splitlines()
    bullet = f"- {entry}"
    if section:
        heading_at = next(
            (
                i
                for i, line in enumerate(lines)
                if (m := _HEADING.match(line)) and _norm(m.group("title")) == _norm(section)
            ),
            None,
        )
        if heading_at is None:
            while lines and not lines[-1].strip():
                lines.pop()
            lines += ["", f"## {section.strip()}", "", bullet]
            return _join(lines), True
        end = heading_at + 1
        while end < len(lines) and not _HEADING.match(lines[end]):
            end += 1
        # Insert after the section's last non-blank line, keeping blank lines before the next.
        insert = end
        while insert > heading_at + 1 and not lines[insert - 1].strip():
            insert -= 1
        if insert == heading_at + 1:
            lines[insert:insert] = ["", bullet]
        else:
            lines.insert(insert, bullet)
        return _join(lines), True
    while lines and not lines[-1].strip():
        lines.pop()
    lines.append(bullet)
    return _join(lines), True


def replace_entry(text: str, old: str, new: str) -> tuple[str, str]:
    """Replace the one entry containing ``old`` with ``- new``; returns (text, replaced text)."""
    new = " ".join(new.split()).lstrip("-* ").strip()
    if not new:
        raise EntryError("the new entry is empty; use remove to delete an entry")
    found = find_entry(text, old)
    lines = text.splitlines()
    lines[found.start : found.end] = [f"- {new}"]
    return _join(lines), found.text


def remove_entry(text: str, needle: str) -> tuple[str, str]:
    """Remove the one entry containing ``needle``; returns (text, removed entry text)."""
    found = find_entry(text, needle)
    lines = text.splitlines()
    del lines[found.start : found.end]
    return _join(lines), found.text
