"""Reading a session for a person (the panel's Chats screen, exports): read-only, streamed.

Nothing here writes, repairs or sets a file aside (the running gateway's store owns that), and
nothing holds a whole session in memory: a session may be hundreds of megabytes, so its lines
are read one at a time, and only the page asked for is parsed. A message is read as the loader
counts it: the archive's committed bytes first, then the hot file's message lines that a
metadata line committed (an append a crash cut short, and a torn last line, are not messages).
"""

from __future__ import annotations

import json
import os
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bot.session.archive import archive_path
from bot.session.journal import open_session, parse_line
from bot.session.records import check_record
from bot.session.snapshot import last_hot, read_state

_META_PREFIX = b'{"_type":"metadata"'  # how memobot writes one (any other spelling is parsed)
_CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class SessionFile:
    """One session as a list shows it: its size on disk (archive included), when it was last
    written, and the people its state knows of (senders of turns not yet answered)."""

    key: str
    size: int
    modified: float
    people: tuple[str, ...]


def describe(path: Path, key: str) -> SessionFile | None:
    """``key``'s file at ``path`` as a list shows it; None when it is gone."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    try:
        archived = os.stat(archive_path(path)).st_size
    except FileNotFoundError:
        archived = 0
    try:
        state = read_state(path)
    except OSError:
        state = None
    people: list[str] = []
    for entry in state.pending if state else ():
        extra = entry.get("metadata")
        name = extra.get("sender_name") if isinstance(extra, dict) else None
        who = str(entry.get("sender_id") or "")
        shown = f"{who} ({name})" if name and who else (who or str(name or ""))
        if shown and shown not in people:
            people.append(shown)
    return SessionFile(key, st.st_size + archived, st.st_mtime, tuple(people))


def _archived_bytes(path: Path) -> int:
    """How many bytes of the archive the hot file says are committed (0 without a record
    that says so: a file written before the archive existed has none)."""
    try:
        hot = last_hot(path)
    except FileNotFoundError:
        return 0
    return int(hot["archived_bytes"]) if hot is not None else 0


def _lines(
    path: Path, limit: int | None = None, count: Callable[[int], None] | None = None
) -> Iterator[bytes]:
    """The complete lines of ``path`` (up to ``limit`` bytes), without their newline; a torn
    last line is left out. ``count`` is told each chunk's size as it is read."""
    try:
        fh = open_session(path)
    except FileNotFoundError:
        return
    with fh:
        left = limit
        rest = b""
        while left is None or left > 0:
            chunk = fh.read(_CHUNK if left is None else min(_CHUNK, left))
            if not chunk:
                break
            if count is not None:
                count(len(chunk))
            if left is not None:
                left -= len(chunk)
            parts = (rest + chunk).split(b"\n")
            rest = parts.pop()
            yield from parts


def _is_metadata(raw: bytes) -> bool:
    if raw.startswith(_META_PREFIX):
        return True
    if b'"_type"' not in raw:
        return False
    record = parse_line(raw)
    return record is not None and record.get("_type") == "metadata"


def message_lines(
    key: str, path: Path, count: Callable[[int], None] | None = None
) -> Iterator[bytes]:
    """Every committed message line of the session, oldest first, as stored (no newline).
    ``count`` is told the bytes read as they are, metadata lines' included."""
    for raw in _lines(archive_path(path), _archived_bytes(path), count):
        if raw.strip():
            yield raw
    uncommitted: list[bytes] = []  # message lines not yet followed by a metadata line
    for raw in _lines(path, None, count):
        if not raw.strip():
            continue
        if _is_metadata(raw):
            yield from uncommitted
            uncommitted.clear()
        else:
            uncommitted.append(raw)


def message_of(raw: bytes) -> dict[str, Any] | None:
    """A stored message line as a message, or None when it is not one (damage)."""
    record = parse_line(raw)
    if record is None or check_record(record).problems:
        return None
    return record


@dataclass(frozen=True, slots=True)
class Page:
    """Messages ``start`` .. of ``total`` (numbered from the conversation's first)."""

    start: int
    total: int
    messages: tuple[tuple[int, dict[str, Any] | None], ...]  # (number, message or None: damage)


def read_page(key: str, path: Path, start: int | None, size: int) -> Page:
    """``size`` messages from number ``start`` (None: the last ``size``), and how many the
    session has. One pass over the file; only the page's lines are held and parsed."""
    total = 0
    kept: deque[bytes] | list[bytes] = deque(maxlen=size) if start is None else []
    for raw in message_lines(key, path):
        if start is None or start <= total < start + size:
            kept.append(raw)
        total += 1
    first = max(0, total - len(kept)) if start is None else start
    return Page(first, total, tuple((first + i, message_of(raw)) for i, raw in enumerate(kept)))


# -- a message as text -------------------------------------------------------------------


def content_text(content: Any) -> str:
    """A message's content as text: text parts joined, an image named, not inlined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                parts.append(str(part.get("text", "")))
            elif isinstance(part, dict) and part.get("type") == "image_url":
                parts.append("[image]")
            else:
                parts.append(json.dumps(part, ensure_ascii=False)[:200])
        return "\n".join(parts)
    return json.dumps(content, ensure_ascii=False)


@dataclass(frozen=True, slots=True)
class Hit:
    key: str
    number: int  # the message's number in its session
    role: str
    snippet: str


@dataclass(frozen=True, slots=True)
class Found:
    hits: tuple[Hit, ...]
    complete: bool  # False: stopped at the hit or byte limit, more may match


def search(
    sessions: list[tuple[str, Path]],
    query: str,
    max_hits: int = 100,
    max_bytes: int = 256 * 1024 * 1024,
    around: int = 80,
) -> Found:
    """Messages whose text holds ``query`` (case-insensitive), newest sessions as given first;
    stops after ``max_hits`` hits or ``max_bytes`` read (every byte read, a file's metadata
    lines' too). Blocking: run it in a thread."""
    needle = query.casefold()
    # JSON writes these as they are, so a line that does not hold them has no match.
    plain = needle.isascii() and needle.isprintable() and not any(c in needle for c in '"\\')
    raw_needle = needle.encode("ascii") if plain else b""
    hits: list[Hit] = []
    read = 0

    def count(size: int) -> None:
        nonlocal read
        read += size
        if read > max_bytes:  # raised inside the reading: a file of metadata alone stops too
            raise _Spent

    try:
        for key, path in sessions:
            for number, raw in enumerate(message_lines(key, path, count)):
                if len(hits) >= max_hits:
                    raise _Spent
                # The raw line first (cheap): only the lines that may match are parsed.
                # (ASCII case only: a non-ASCII letter whose case folds to ASCII, such as the
                # Kelvin sign, is not found by an ASCII query.)
                if plain and raw_needle not in raw.lower():
                    continue
                message = message_of(raw)
                if message is None:
                    continue
                text = content_text(message.get("content"))
                calls = message.get("tool_calls") or []
                text += "".join(
                    f"\n{c['function']['name']}({c['function']['arguments']})" for c in calls
                )
                at = text.casefold().find(needle)
                if at < 0:
                    continue
                lo = max(0, at - around)
                snippet = ("…" if lo else "") + text[lo : at + len(needle) + around]
                hits.append(Hit(key, number, str(message.get("role")), snippet))
    except _Spent:
        return Found(tuple(hits), complete=False)
    return Found(tuple(hits), complete=True)


class _Spent(Exception):
    """A search's hits or bytes are used up."""
