"""memory/history.jsonl: the global archive of consolidated conversation chunks.

One line per chunk: ``{"cursor", "timestamp", "session", "content"}``, and ``"speakers"`` (a list
of ``{"channel", "id", "name"}``) on a chunk of a chat that is not the owner's where people
other than the owner wrote (bot.memory.people; Dream routes their facts by it). Lines without
it (the owner's chats, older lines, nanobot's, which carry ``session_key`` or no session) are
read as they are. Cursors increase by one
across every session; ``memory/.cursor`` names the last one written. The line is fsynced before
the cursor file moves, so after a crash the archive may be one entry ahead of ``.cursor`` (and the
next start takes the larger of the two), never behind.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bot import safejson, workspace_files
from bot.memory.people import Speaker
from bot.session import now_iso
from bot.wording import counted

log = logging.getLogger(__name__)

RAW_ARCHIVE_MAX_CHARS = 32_000
# The longest archive line read (an entry is at most a few tens of KB: RAW_ARCHIVE_MAX_CHARS,
# JSON-escaped). A longer one (the model can write history.jsonl: one line of gigabytes) is
# skipped, never held: search, the panel's archive, `memobot memory history` and Dream alike.
MAX_LINE_BYTES = 1024 * 1024
_CHUNK = 256 * 1024


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    cursor: int
    timestamp: str
    session: str
    content: str
    speakers: tuple[Speaker, ...] = ()  # who wrote in the chunk, besides the owner


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

    def entries(self, after: int = 0, limit: int | None = None) -> list[HistoryEntry]:
        """The entries after cursor ``after``, oldest first; at most ``limit`` of them (the
        file is read only as far as that)."""
        out: list[HistoryEntry] = []
        for line in _lines(self.workspace, self.path):
            entry = parse_entry(line)
            if entry and entry.cursor > after:
                out.append(entry)
                if limit is not None and len(out) >= limit:
                    break
        return out

    async def append(
        self, session: str, content: str, speakers: tuple[Speaker, ...] = ()
    ) -> HistoryEntry:
        async with self._lock:
            return await asyncio.to_thread(self._append_sync, session, content, speakers)

    def _append_sync(
        self, session: str, content: str, speakers: tuple[Speaker, ...] = ()
    ) -> HistoryEntry:
        [entry] = self.append_batch_sync([(now_iso(), session, content)], speakers)
        log.info(
            "history: archived cursor=%d session=%s chars=%d", entry.cursor, session, len(content)
        )
        return entry

    def append_batch_sync(
        self, items: list[tuple[str, str, str]], speakers: tuple[Speaker, ...] = ()
    ) -> list[HistoryEntry]:
        """Append ``(timestamp, session, content)`` items with consecutive cursors (each
        with ``speakers``).

        One write, fsynced, and only then does ``.cursor`` move. Callers serialise (the async
        ``append`` holds the lock; the start-up migration runs before anything else).
        """
        if not items:
            return []
        self.workspace.mkdir(parents=True, exist_ok=True)  # the owner's path, not the model's
        workspace_files.make_dirs(self.workspace, "memory")
        first = self.last_cursor() + 1
        entries = [HistoryEntry(first + i, *item, speakers) for i, item in enumerate(items)]
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
        # The rewrite keeps every line it does not move, so it must hold the whole file: one
        # too large for that, or with a line too long to read, is left as it is (never cut).
        try:
            st = workspace_files.lstat(self.workspace, self.path)
        except FileNotFoundError:
            return 0
        if st.st_size > workspace_files.MAX_READ_BYTES:
            log.warning(
                "history: %s is %d bytes, more than %d: not compacted", self.path, st.st_size,
                workspace_files.MAX_READ_BYTES,
            )  # fmt: skip
            return 0
        raw_lines = list(_raw_lines(self.workspace, self.path))
        if not raw_lines:
            return 0
        if any(raw is None for raw in raw_lines):
            log.warning("history: %s has a line too long to read: not compacted", self.path)
            return 0
        cutoff = (datetime.now(UTC) - timedelta(days=keep_days)).isoformat()
        keep: list[bytes] = []
        move: dict[str, list[tuple[int, bytes]]] = {}
        for raw in raw_lines:
            assert raw is not None
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


def _raw_lines(workspace: Path, path: Path) -> Iterator[bytes | None]:
    """The lines of an archive file without their line ends, streamed (none when it is
    absent); None for a line over MAX_LINE_BYTES."""
    try:
        fd = workspace_files.open_fd(workspace, path)
    except FileNotFoundError:
        return
    try:
        for data, _ in read_lines(fd, str(path)):
            yield None if data is None else data.rstrip(b"\n")
    finally:
        os.close(fd)


def _lines(workspace: Path, path: Path) -> Iterator[bytes]:
    """As :func:`_raw_lines`, a line too long left out."""
    return (line for line in _raw_lines(workspace, path) if line is not None)


def read_lines(
    fd: int, name: str, start: int = 0, limit: int = MAX_LINE_BYTES
) -> Iterator[tuple[bytes | None, int]]:
    """Each line of the file ``fd`` from byte ``start``: (its bytes with the line end, its size
    in bytes); the last one may lack the line end (a torn line). A line longer than ``limit``
    is read through in pieces and never held: it comes as ``(None, size)``, with one warning
    naming ``name``. Holes of a sparse file (no line end in them) are jumped over, not read.
    Every reader of the archive reads through here."""
    offset = at = start  # where the current line starts; the next byte to read
    buf = bytearray()  # the current line so far (left empty once it is too long)
    over = warned = False
    while True:
        chunk = os.pread(fd, _CHUNK, at)
        if not chunk:
            break
        base, at, begin = at, at + len(chunk), 0
        while (nl := chunk.find(b"\n", begin)) >= 0:
            size = base + nl + 1 - offset
            if over or len(buf) + nl + 1 - begin > limit:
                if not warned:
                    warned = True
                    log.warning(
                        "history: %s has a line of %d bytes at byte %d, over %d: skipped",
                        name, size, offset, limit,
                    )  # fmt: skip
                yield None, size
            elif buf:
                buf += chunk[begin : nl + 1]
                yield bytes(buf), size
            else:
                yield chunk[begin : nl + 1], size
            buf.clear()
            over, offset, begin = False, offset + size, nl + 1
        if not over and len(buf) + len(chunk) - begin > limit:
            over = True
            buf.clear()
        if over:
            try:
                at = max(at, os.lseek(fd, at, os.SEEK_DATA))
            except OSError as exc:
                if exc.errno != errno.ENXIO:
                    raise
                at = max(at, os.fstat(fd).st_size)  # only a hole up to the end
                break
        else:
            buf += chunk[begin:]
    if over:
        if not warned:
            log.warning(
                "history: %s ends with a line of %d bytes, over %d: skipped",
                name, at - offset, limit,
            )  # fmt: skip
        yield None, at - offset
    elif buf:
        yield bytes(buf), len(buf)


def entry_line(entry: HistoryEntry) -> str:
    record: dict[str, Any] = {
        "cursor": entry.cursor,
        "timestamp": entry.timestamp,
        "session": entry.session,
        "content": entry.content,
    }
    if entry.speakers:
        record["speakers"] = [
            {"channel": p.channel, "id": p.id, "name": p.name} for p in entry.speakers
        ]
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
            _speakers(obj.get("speakers")),
        )
    except (ValueError, KeyError, TypeError):
        return None


def _speakers(value: Any) -> tuple[Speaker, ...]:
    """The ``speakers`` of a line; what is not a list of ``{"channel", "id"}`` objects with
    text values is left out (the model can write this file; an entry is never lost for it)."""
    if not isinstance(value, list):
        return ()
    out = []
    for item in value[:64]:
        if not isinstance(item, dict):
            continue
        channel, ident, name = item.get("channel"), item.get("id"), item.get("name", "")
        if isinstance(channel, str) and isinstance(ident, str) and isinstance(name, str):
            if channel and ident:
                out.append(Speaker(channel, ident, name))
    return tuple(out)


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
