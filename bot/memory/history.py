"""memory/history.jsonl: the global archive of consolidated conversation chunks.

One line per chunk: ``{"cursor", "timestamp", "session", "content"}`` (lines nanobot wrote carry
``session_key`` or no session; they are read as they are). Cursors increase by one
across every session; ``memory/.cursor`` names the last one written. The line is fsynced before
the cursor file moves, so after a crash the archive may be one entry ahead of ``.cursor`` (and the
next start takes the larger of the two), never behind.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bot import safejson, workspace_files
from bot.session import now_iso
from bot.wording import counted

log = logging.getLogger(__name__)

RAW_ARCHIVE_MAX_CHARS = 32_000


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    cursor: int
    timestamp: str
    session: str
    content: str


class HistoryArchive:
    def __init__(self, workspace: Path) -> None:
        self.workspace = workspace
        self.dir = workspace / "memory"
        self.path = self.dir / "history.jsonl"
        self.cursor_path = self.dir / ".cursor"
        self._lock = asyncio.Lock()
        self._cursor: int | None = None

    def last_cursor(self) -> int:
        """The last cursor written (the larger of ``.cursor`` and the archive's tail)."""
        if self._cursor is not None:
            return self._cursor
        cursor = 0
        try:
            cursor = int(workspace_files.read_text(self.workspace, self.cursor_path).strip() or 0)
        except (FileNotFoundError, ValueError):
            pass
        for entry in self._tail_entries():
            cursor = max(cursor, entry.cursor)
        self._cursor = cursor
        return cursor

    def _tail_entries(self, max_bytes: int = 65536) -> list[HistoryEntry]:
        try:
            fd = workspace_files.open_fd(self.workspace, self.path)
        except FileNotFoundError:
            return []
        with os.fdopen(fd, "rb") as fh:
            size = os.fstat(fd).st_size
            fh.seek(max(0, size - max_bytes))
            data = fh.read()
        out = []
        for line in data.split(b"\n"):
            entry = parse_entry(line)
            if entry:
                out.append(entry)
        return out

    def entries(self, after: int = 0) -> list[HistoryEntry]:
        out = []
        for line in _lines(self.workspace, self.path):
            entry = parse_entry(line)
            if entry and entry.cursor > after:
                out.append(entry)
        return out

    async def append(self, session: str, content: str) -> HistoryEntry:
        async with self._lock:
            return await asyncio.to_thread(self._append_sync, session, content)

    def _append_sync(self, session: str, content: str) -> HistoryEntry:
        [entry] = self.append_batch_sync([(now_iso(), session, content)])
        log.info(
            "history: archived cursor=%d session=%s chars=%d", entry.cursor, session, len(content)
        )
        return entry

    def append_batch_sync(self, items: list[tuple[str, str, str]]) -> list[HistoryEntry]:
        """Append ``(timestamp, session, content)`` items with consecutive cursors.

        One write, fsynced, and only then does ``.cursor`` move. Callers serialise (the async
        ``append`` holds the lock; the start-up migration runs before anything else).
        """
        if not items:
            return []
        self.workspace.mkdir(parents=True, exist_ok=True)  # the owner's path, not the model's
        workspace_files.make_dirs(self.workspace, "memory")
        first = self.last_cursor() + 1
        entries = [HistoryEntry(first + i, *item) for i, item in enumerate(items)]
        payload = "".join(entry_line(e) for e in entries).encode("utf-8")
        fd = workspace_files.open_fd(
            self.workspace, self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND
        )
        try:
            size = os.fstat(fd).st_size
            # A torn line left by a crash must not glue itself to the first new entry.
            if size and os.pread(fd, 1, size - 1) != b"\n":
                payload = b"\n" + payload
            os.write(fd, payload)
            os.fsync(fd)
        finally:
            os.close(fd)
        # An older cursor coming back after a power cut is harmless: the tail is read too.
        workspace_files.write_atomic(
            self.workspace, self.cursor_path, f"{entries[-1].cursor}\n", sync=False
        )
        self._cursor = entries[-1].cursor
        return entries

    async def compact(self, digested_upto: int, keep_days: int) -> int:
        """Move digested entries older than ``keep_days`` to ``memory/history-YYYY-MM.jsonl``.

        Nothing is deleted: entries are appended (fsynced) to their month's file first, and
        only then is history.jsonl rewritten without them. A crash in between leaves an entry
        in both files, and the next run skips cursors the month file already holds.
        """
        async with self._lock:
            return await asyncio.to_thread(self._compact_sync, digested_upto, keep_days)

    def _compact_sync(self, digested_upto: int, keep_days: int) -> int:
        raw_lines = _lines(self.workspace, self.path)
        if not raw_lines:
            return 0
        cutoff = (datetime.now(UTC) - timedelta(days=keep_days)).isoformat()
        keep: list[bytes] = []
        move: dict[str, list[tuple[int, bytes]]] = {}
        for raw in raw_lines:
            if not raw.strip():
                continue
            entry = parse_entry(raw)
            if entry and entry.cursor <= digested_upto and entry.timestamp < cutoff:
                move.setdefault(entry.timestamp[:7], []).append((entry.cursor, raw))
            else:
                keep.append(raw)
        if not move:
            return 0
        for month, items in move.items():
            target = self.dir / f"history-{month}.jsonl"
            have = {e.cursor for e in map(parse_entry, _lines(self.workspace, target)) if e}
            fresh = b"".join(raw + b"\n" for cursor, raw in items if cursor not in have)
            if fresh:
                workspace_files.append(self.workspace, target, fresh)
        workspace_files.write_atomic(
            self.workspace, self.path, b"".join(raw + b"\n" for raw in keep)
        )
        return sum(len(v) for v in move.values())


def _lines(workspace: Path, path: Path) -> list[bytes]:
    try:
        return workspace_files.read_bytes(workspace, path).split(b"\n")
    except FileNotFoundError:
        return []


def entry_line(entry: HistoryEntry) -> str:
    record = {
        "cursor": entry.cursor,
        "timestamp": entry.timestamp,
        "session": entry.session,
        "content": entry.content,
    }
    return json.dumps(record, ensure_ascii=False) + "\n"


def parse_entry(line: bytes | str) -> HistoryEntry | None:
    """The entry on one archive line, or None when the line is not one.

    ``cursor`` and ``content`` are required. The session is read from ``session`` (memobot),
    else ``session_key`` (nanobot), else it is ``""``: nanobot writes entries without one, and
    they are the same archive. A missing timestamp reads as ``""``. Callers never rewrite a
    line from the parsed entry, so a foreign line stays byte for byte as it was written.
    """
    if not line.strip():
        return None
    try:
        obj: Any = safejson.loads(line)  # the model can write this file: [[[[... too
        if not isinstance(obj, dict):
            return None
        session = obj.get("session")
        if session is None:
            session = obj.get("session_key")
        cursor, content = obj["cursor"], obj["content"]
        if isinstance(cursor, bool) or content is None:
            return None
        return HistoryEntry(
            int(cursor),
            str(obj.get("timestamp") or ""),
            "" if session is None else str(session),
            str(content),
        )
    except (ValueError, KeyError, TypeError):
        return None


def format_raw(messages: list[dict[str, Any]]) -> str:
    """Plain-text rendering of messages for a ``[RAW]`` archive entry (capped)."""
    lines = [f"[RAW] {counted(len(messages), 'message')}"]
    for m in messages:
        role = str(m.get("role", "?")).upper()
        stamp = str(m.get("timestamp", ""))[:16].replace("T", " ")
        content = m.get("content")
        if isinstance(content, list):
            content = " ".join(p.get("text", "[image]") for p in content if isinstance(p, dict))
        text = str(content or "").strip()
        if m.get("tool_calls"):
            names = ", ".join(c["function"]["name"] for c in m["tool_calls"])
            text = (text + f" [called: {names}]").strip()
        lines.append(f"{role} [{stamp}]: {text}" if stamp else f"{role}: {text}")
    out = "\n".join(lines)
    if len(out) > RAW_ARCHIVE_MAX_CHARS:
        out = out[:RAW_ARCHIVE_MAX_CHARS] + f"\n[... {len(out) - RAW_ARCHIVE_MAX_CHARS} chars cut]"
    return out
