"""Append-only JSONL sessions (DESIGN.md section 4).

A session file holds message lines (OpenAI chat format plus ``timestamp``) and metadata lines
(``{"_type": "metadata", "metadata": {...}, "last_consolidated": N}``); on load the last metadata
line wins. Writes only ever append, and an append that writes messages ends with a metadata
line that commits them: what a crash leaves of a half-written append (complete message lines,
then a torn one) is recognised on load and dropped as a whole. The in-memory copy is
authoritative while the process runs, so a turn never re-reads or re-parses the file, and the
list of request-ready messages is built once per message, not once per turn.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import shutil
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bot import failpoints
from bot.config import ConfigError
from bot.private import make_private_dirs
from bot.records import check_record
from bot.tokens import estimate_message_tokens

log = logging.getLogger(__name__)

SUFFIX = ".jsonl"
MetadataUpdate = dict[str, Any] | Callable[[dict[str, Any]], dict[str, Any] | None]
# Compaction folds superseded metadata lines away once they are this many, or this large.
COMPACT_AFTER_LINES = 200
COMPACT_AFTER_BYTES = 4 * 1024 * 1024
_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")


def key_to_filename(key: str) -> str:
    """Filesystem-safe and reversible: every byte outside [A-Za-z0-9_-] becomes %XX."""
    out = []
    for ch in key:
        if ch in _SAFE:
            out.append(ch)
        else:
            out.extend(f"%{b:02X}" for b in ch.encode("utf-8"))
    return "".join(out) + SUFFIX


def filename_to_key(name: str) -> str:
    if not name.endswith(SUFFIX):
        raise ValueError(f"not a session file name: {name}")
    stem = name[: -len(SUFFIX)]
    raw = bytearray()
    i = 0
    while i < len(stem):
        if stem[i] == "%":
            raw.append(int(stem[i + 1 : i + 3], 16))
            i += 3
        else:
            raw.extend(stem[i].encode("ascii"))
            i += 1
    return raw.decode("utf-8")


class StateLayoutError(ConfigError):
    """A file where memobot needs a folder, or the reverse. ``str()`` is one line naming it."""


class SessionPathError(OSError):
    """A session's path is there but is not a regular file (a folder, a socket...)."""

    def __init__(self, path: Path) -> None:
        super().__init__(errno.EISDIR, "not a regular file", str(path))
        self.path = path

    def __str__(self) -> str:
        return f"session file {self.path} is not a regular file (a folder?); move it away"


def check_folder(path: Path, what: str) -> None:
    """Raise StateLayoutError when ``path`` cannot be a folder because a file is in the way."""
    for candidate in (path, *path.parents):
        if candidate.exists() or candidate.is_symlink():
            if not candidate.is_dir():
                where = "it" if candidate == path else str(candidate)
                raise StateLayoutError(
                    f"{what} {path} must be a folder, but {where} is a file; move it away"
                )
            return


def check_session_path(state_dir: Path, key: str) -> None:
    """Raise StateLayoutError naming the path when ``key``'s session cannot be used.

    For a command that works on one session (``memobot agent``): it stops with one line
    instead of answering with an error.
    """
    folder = state_dir / "sessions"
    check_folder(folder, "the sessions folder")
    path = folder / key_to_filename(key)
    if (path.exists() or path.is_symlink()) and not path.is_file():
        raise StateLayoutError(str(SessionPathError(path)))


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _dumps(obj: Any) -> bytes:
    return (json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")


# The model that wrote an assistant answer ("model @ endpoint"), kept for /status.
ANSWERED_BY_KEY = "answered_by"
# Keys of a stored message that are ours, never sent to the model.
BOOKKEEPING_KEYS = frozenset({"timestamp", ANSWERED_BY_KEY})


def to_wire(message: dict[str, Any]) -> dict[str, Any]:
    """The message as the Chat Completions API takes it (our bookkeeping keys removed)."""
    if not BOOKKEEPING_KEYS.intersection(message):
        return message
    return {k: v for k, v in message.items() if k not in BOOKKEEPING_KEYS}


@dataclass(slots=True)
class Session:
    key: str
    path: Path
    messages: list[dict[str, Any]] = field(default_factory=list)
    wire: list[dict[str, Any]] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    last_consolidated: int = 0
    # Bookkeeping for compaction and torn-tail repair.
    stale_meta_lines: int = 0
    stale_meta_bytes: int = 0
    metadata_written: bool = False
    last_meta_size: int = 0
    truncate_at: int | None = None
    # Where the prompt's history window was last trimmed to. In memory only: a cache choice
    # (keep one prefix across turns), not session state.
    window_start: int = 0

    def add_loaded(self, message: dict[str, Any]) -> None:
        self.messages.append(message)
        wire = to_wire(message)
        self.wire.append(wire)
        self.tokens.append(estimate_message_tokens(wire))

    @property
    def unconsolidated(self) -> int:
        return len(self.messages) - self.last_consolidated

    def estimated_tokens(self, start: int = 0) -> int:
        return sum(self.tokens[start:])


class SessionStore:
    """Loads, caches and appends to session files under ``state_dir/sessions``."""

    def __init__(self, state_dir: Path) -> None:
        self.dir = state_dir / "sessions"
        check_folder(self.dir, "the sessions folder")
        try:
            make_private_dirs(self.dir)  # the state folder too, whatever the umask
        except (FileExistsError, NotADirectoryError):  # lost a race with whoever put it there
            check_folder(self.dir, "the sessions folder")
            raise
        self._cache: dict[str, Session] = {}
        self._cache_lock = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}

    def path_for(self, key: str) -> Path:
        return self.dir / key_to_filename(key)

    def keys(self) -> list[str]:
        out = []
        for p in self.dir.iterdir():
            if p.name.endswith(SUFFIX) and not p.name.startswith("."):
                if not p.is_file():
                    log.error("skipping session: %s", SessionPathError(p))
                    continue
                try:
                    out.append(filename_to_key(p.name))
                except (ValueError, UnicodeDecodeError):
                    log.warning("ignoring unrecognised file in sessions folder: %s", p.name)
        return sorted(out)

    def get(self, key: str) -> Session:
        session = self._cache.get(key)
        if session is None:
            with self._lock_for(key):  # two threads must never load two copies of one session
                session = self._cache.get(key)
                if session is None:
                    session = self._load(key)
                    self._cache[key] = session
        return session

    def peek_metadata(self, key: str) -> dict[str, Any] | None:
        """The session's current metadata without loading its messages (reads from the end).

        Used at start to find sessions with unfinished work among many idle ones.
        """
        cached = self._cache.get(key)
        if cached is not None:
            return cached.metadata
        path = self.path_for(key)
        try:
            with _open_session(path) as fh:
                end = fh.seek(0, os.SEEK_END)
                chunk = 65536
                buf = b""
                pos = end
                while pos > 0:
                    step = min(chunk, pos)
                    pos -= step
                    fh.seek(pos)
                    buf = fh.read(step) + buf
                    lines = buf.split(b"\n")
                    # The first piece may be a partial line unless we reached the start.
                    candidates = lines if pos == 0 else lines[1:]
                    for raw in reversed(candidates):
                        # Any spelling (a line not written by us wins on load too); cheap
                        # test first, since the last metadata line is nearly always the last.
                        if b'"_type"' in raw:
                            record = parse_line(raw)
                            if record is None or record.get("_type") != "metadata":
                                continue
                            if check_record(record).problems:
                                # Wrong shape: the full load sets it aside and logs it.
                                return self.get(key).metadata
                            return dict(record.get("metadata") or {})
                    chunk *= 4
        except FileNotFoundError:
            return None
        # No metadata line at all (e.g. written by hand): parse the whole file.
        return self.get(key).metadata if end else None

    # -- loading ---------------------------------------------------------------------------

    def _load(self, key: str) -> Session:
        path = self.path_for(key)
        session = Session(key=key, path=path)
        try:
            with _open_session(path) as fh:
                data = fh.read()
        except FileNotFoundError:
            session.metadata = {"key": key, "created_at": now_iso()}
            return session
        lines = data.split(b"\n")
        tail = lines.pop()  # after the last newline: empty unless the last write was torn
        offset = len(data) - len(tail)
        if tail:
            session.truncate_at = offset
            log.warning(
                "session %s: ignoring torn last line (%d bytes) left by an interrupted write",
                key,
                len(tail),
            )
        # A complete last line that does not parse is a torn write too (crash mid-page).
        bad: list[int] = []
        # Complete JSON of the wrong shape: never a torn write (a crash cannot produce it),
        # always damage or a hostile edit, so it is set aside wherever it is in the file.
        misshapen: list[tuple[int, str]] = []
        records: list[tuple[int, dict[str, Any], int]] = []
        pointers: dict[int, int | None] = {}  # line -> its usable last_consolidated
        for lineno, raw in enumerate(lines, start=1):
            if not raw.strip():
                continue
            value = _json_line(raw)
            if value is _NOT_JSON:
                bad.append(lineno)
                continue
            checked = check_record(value)
            misshapen.extend((lineno, p) for p in checked.problems)
            if checked.record is not None:
                records.append((lineno, checked.record, len(raw) + 1))
                pointers[lineno] = checked.last_consolidated
        if bad and bad[-1] == len(lines) and (not records or records[-1][0] < bad[-1]):
            session.truncate_at = offset - len(lines[-1]) - 1
            log.warning("session %s: ignoring unparsable last line left by a crash", key)
            bad.pop()
        # Message lines after the last metadata line were never committed (see ``append``):
        # they are the start of an append a crash cut short. Their turn is still pending or
        # checkpointed and is written again in full, so keeping them would repeat it.
        committed = len(records)
        while committed and records[committed - 1][1].get("_type") != "metadata":
            committed -= 1
        if 0 < committed < len(records):
            first = records[committed][0]
            session.truncate_at = sum(len(raw) + 1 for raw in lines[: first - 1])
            log.warning(
                "session %s: ignoring %d message line(s) after line %d, left by an interrupted "
                "write",
                key,
                len(records) - committed,
                records[committed - 1][0],
            )
            del records[committed:]
        meta_seen = 0
        meta_bytes = 0
        last_meta_size = 0
        for lineno, record, size in records:
            if record.get("_type") == "metadata":
                session.metadata = dict(record.get("metadata") or {})
                # An unusable pointer keeps the previous one: it only moves forward, so the
                # last good value is the closest safe answer (0 would re-archive everything).
                pointer = pointers[lineno]
                if pointer is not None:
                    session.last_consolidated = pointer
                meta_seen += 1
                meta_bytes += size
                last_meta_size = size
            else:
                session.add_loaded(record)
        session.metadata_written = meta_seen > 0
        session.last_meta_size = last_meta_size
        session.stale_meta_lines = max(0, meta_seen - 1)
        session.stale_meta_bytes = max(0, meta_bytes - last_meta_size)
        session.metadata.setdefault("key", key)
        session.last_consolidated = min(session.last_consolidated, len(session.messages))
        if bad or misshapen:
            self._quarantine(session, bad, misshapen)
        return session

    def _quarantine(
        self, session: Session, bad: list[int], misshapen: list[tuple[int, str]]
    ) -> None:
        """Keep a copy of the damaged file, then rewrite it with every good line."""
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        aside = session.path.with_name(f"{session.path.name}.corrupt-{stamp}")
        # The copy holds the same conversation: as private as the session file.
        fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with open(session.path, "rb") as src, os.fdopen(fd, "wb") as dst:
            shutil.copyfileobj(src, dst)
        found = []
        if bad:
            found.append(f"unparsable line(s) {', '.join(map(str, bad[:10]))}")
        if misshapen:
            found.append(
                "wrong-shaped record(s): "
                + "; ".join(f"line {n}: {what}" for n, what in misshapen[:10])
            )
        log.error(
            "session %s: %s in %s; copied the file to %s and kept every good record",
            session.key,
            "; ".join(found),
            session.path,
            aside.name,
        )
        self.compact(session)

    # -- writing ---------------------------------------------------------------------------

    def _append(self, session: Session, payload: bytes, fsync: bool) -> None:
        new_file = not session.path.exists()
        fd = os.open(session.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            if session.truncate_at is not None:
                os.ftruncate(fd, session.truncate_at)
                session.truncate_at = None
            view = memoryview(payload)
            if failpoints.armed("mid_append"):  # a torn line, exactly as a crash leaves it
                os.write(fd, view[: max(1, len(view) // 2)])
                failpoints.crash()
            while view:
                n = os.write(fd, view)
                view = view[n:]
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        if new_file and fsync:
            _fsync_dir(session.path.parent)

    def _meta_record(self, session: Session) -> dict[str, Any]:
        return {
            "_type": "metadata",
            "metadata": session.metadata,
            "last_consolidated": session.last_consolidated,
        }

    async def append_async(
        self,
        session: Session,
        messages: list[dict[str, Any]] = (),  # type: ignore[assignment]
        metadata: MetadataUpdate | None = None,
        last_consolidated: int | None = None,
        fsync: bool = True,
    ) -> bool:
        """``append`` in a worker thread: an fsync never stalls the event loop (and every chat
        on it); appends to one session still happen one at a time, in call order per task."""
        return await asyncio.to_thread(
            self.append, session, messages, metadata, last_consolidated, fsync
        )

    def append(
        self,
        session: Session,
        messages: list[dict[str, Any]] = (),  # type: ignore[assignment]
        metadata: MetadataUpdate | None = None,
        last_consolidated: int | None = None,
        fsync: bool = True,
    ) -> bool:
        """Append messages and, when given, a metadata update, in one write. Thread-safe.

        ``metadata`` keys set to None are removed. ``metadata`` may also be a function of the
        current metadata returning the update, or None to write nothing (returns False); it
        runs under the session's lock, so check-then-write (deduplication) is atomic.
        Messages are always followed by a metadata line (unchanged metadata if none is
        given): it marks them committed. The in-memory session changes only after the bytes
        are written, so a failed write leaves memory and disk in agreement.
        """
        with self._lock_for(session.key):
            if callable(metadata):
                metadata = metadata(session.metadata)
                if metadata is None:
                    return False
            self._append_locked(session, messages, metadata, last_consolidated, fsync)
            return True

    def fsync(self, session: Session) -> None:
        """Make earlier unsynced appends durable (for writes that used ``fsync=False``)."""
        try:
            fd = os.open(session.path, os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _lock_for(self, key: str) -> threading.Lock:
        with self._cache_lock:
            lock = self._locks.get(key)
            if lock is None:
                lock = self._locks[key] = threading.Lock()
            return lock

    def _append_locked(
        self,
        session: Session,
        messages: list[dict[str, Any]],
        metadata: dict[str, Any] | None,
        last_consolidated: int | None,
        fsync: bool,
    ) -> None:
        parts = []
        stamped = []
        for m in messages:
            m = m if "timestamp" in m else {**m, "timestamp": now_iso()}
            stamped.append(m)
            parts.append(_dumps(m))
        new_meta = None
        if metadata is not None or last_consolidated is not None or stamped:
            new_meta = dict(session.metadata)
            for k, v in (metadata or {}).items():
                if v is None:
                    new_meta.pop(k, None)
                else:
                    new_meta[k] = v
            lc = session.last_consolidated if last_consolidated is None else last_consolidated
            meta_line = _dumps({"_type": "metadata", "metadata": new_meta, "last_consolidated": lc})
            parts.append(meta_line)
        if not parts:
            return
        self._append(session, b"".join(parts), fsync)
        for m in stamped:
            session.add_loaded(m)
        if new_meta is not None:
            if session.metadata_written:
                session.stale_meta_lines += 1
                session.stale_meta_bytes += session.last_meta_size
            session.metadata = new_meta
            session.last_consolidated = lc
            session.metadata_written = True
            session.last_meta_size = len(meta_line)
            if (
                session.stale_meta_lines >= COMPACT_AFTER_LINES
                or session.stale_meta_bytes >= COMPACT_AFTER_BYTES
            ):
                self.compact(session)

    def compact(self, session: Session) -> None:
        """Rewrite as messages plus one metadata line: tmp, fsync, rename, fsync of the folder."""
        tmp = session.path.with_name(f".{session.path.name}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            with os.fdopen(fd, "wb", closefd=False) as fh:
                for m in session.messages:
                    fh.write(_dumps(m))
                meta_line = _dumps(self._meta_record(session))
                fh.write(meta_line)
                fh.flush()
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, session.path)
        _fsync_dir(session.path.parent)
        session.truncate_at = None
        session.stale_meta_lines = 0
        session.stale_meta_bytes = 0
        session.metadata_written = True
        session.last_meta_size = len(meta_line)
        log.info("session %s: compacted to %d messages", session.key, len(session.messages))


_NOT_JSON: Any = object()


def _json_line(raw: bytes) -> Any:
    """The line's JSON value, or ``_NOT_JSON`` (a torn or garbled write)."""
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return _NOT_JSON


def parse_json_line(raw: bytes) -> tuple[bool, Any]:
    """(True, value) for a line that is JSON, (False, None) for a torn or garbled one."""
    value = _json_line(raw)
    return (False, None) if value is _NOT_JSON else (True, value)


def parse_line(raw: bytes) -> dict[str, Any] | None:
    """A session line as a JSON object, or None when it is not JSON or not an object.

    Syntax only: ``bot.records.check_record`` checks the shape.
    """
    value = _json_line(raw)
    return value if isinstance(value, dict) else None


def _open_session(path: Path) -> Any:
    """Open a session file for reading; SessionPathError when it is a folder or the like."""
    # O_NONBLOCK: a FIFO planted in place of the file must not hang the load.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise SessionPathError(path)
    return os.fdopen(fd, "rb")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
