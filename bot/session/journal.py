"""The session file's lines: names, the line format, torn tails and damaged lines.

A session file (``<key>.jsonl``, the key made filesystem-safe and reversible) is JSON Lines:
message lines and metadata lines (see docs/sessions.md). This module reads a run of lines as the
loader must: a torn last line (a crash mid-write) and message lines after the last metadata line
(an append a crash cut short) are recognised and dropped, and a line that is not JSON or not of
a record's shape anywhere else is damage: reported, never skipped silently (the store copies the
file aside as ``<name>.corrupt-<time>`` first).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import stat
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bot.config import ConfigError
from bot.session.changes import apply_changes
from bot.session.records import Checked, check_record

log = logging.getLogger("bot.session")

SUFFIX = ".jsonl"
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


def dumps_line(obj: Any) -> bytes:
    return (json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")


@dataclass(slots=True)
class Parsed:
    """What one read of (part of) a hot file found; offsets are file offsets."""

    messages: list[tuple[dict[str, Any], int, int]] = field(default_factory=list)  # rec, off, len
    metadata: dict[str, Any] = field(default_factory=dict)
    last_consolidated: int = 0
    hot: dict[str, Any] | None = None  # of the last full record
    snap: tuple[int, str] | None = None
    first_record: int | None = None  # offset of the first record read
    end: int = 0  # committed end
    truncate_at: int | None = None
    bad: list[int] = field(default_factory=list)
    misshapen: list[tuple[int, str]] = field(default_factory=list)
    meta_lines: int = 0
    meta_bytes: int = 0
    last_meta_size: int = 0


# A metadata line a later full record supersedes: replayed as no change at all.
_SETTLED = Checked({"_type": "metadata", "changes": {}}, is_metadata=True, last_consolidated=None)


def parse_lines(
    key: str,
    data: bytes,
    at: int = 0,
    quiet: bool = False,
    settled_meta: int = -1,
    batch: bool = True,
) -> Parsed:
    """Read ``data`` (the file from offset ``at``) as the loader does: torn and uncommitted
    tails recognised, records checked, metadata replayed. Metadata lines before offset
    ``settled_meta`` (a full record there supersedes them) are counted, not checked."""
    p = Parsed()
    lines = data.split(b"\n")
    tail = lines.pop()  # after the last newline: empty unless the last write was torn
    p.end = at + len(data) - len(tail)
    if tail:
        p.truncate_at = p.end
        if not quiet:
            log.warning(
                "session %s: ignoring torn last line (%d bytes) left by an interrupted write",
                key,
                len(tail),
            )
    # Complete JSON of the wrong shape: never a torn write (a crash cannot produce it),
    # always damage or a hostile edit, so it is set aside wherever it is in the file.
    records: list[tuple[int, Any, int, int]] = []  # lineno, Checked, size, offset
    pos = at
    values = _json_lines(lines) if batch else None
    for lineno, raw in enumerate(lines, start=1):
        offset, pos = pos, pos + len(raw) + 1
        if not raw.strip():
            continue
        value = values[lineno - 1] if values is not None else _json_line(raw)
        if value is _NOT_JSON:
            p.bad.append(lineno)
            continue
        if offset < settled_meta and isinstance(value, dict) and value.get("_type") == "metadata":
            checked = _SETTLED
        else:
            checked = check_record(value)
        p.misshapen.extend((lineno, problem) for problem in checked.problems)
        if checked.record is not None:
            records.append((lineno, checked, len(raw) + 1, offset))
    if values is not None and p.misshapen:
        # Damage: line by line, so every finding names its own line and nothing else.
        return parse_lines(key, data, at, quiet, settled_meta, batch=False)
    # A complete last line that does not parse is a torn write too (crash mid-page).
    if p.bad and p.bad[-1] == len(lines) and (not records or records[-1][0] < p.bad[-1]):
        p.end = p.end - len(lines[-1]) - 1
        p.truncate_at = p.end
        if not quiet:
            log.warning("session %s: ignoring unparsable last line left by a crash", key)
        p.bad.pop()
    # Message lines after the last metadata line were never committed (see ``append``):
    # they are the start of an append a crash cut short. Their turn is still pending or
    # checkpointed and is written again in full, so keeping them would repeat it.
    committed = len(records)
    while committed and not records[committed - 1][1].is_metadata:
        committed -= 1
    if 0 < committed < len(records):
        p.end = p.truncate_at = records[committed][3]
        if not quiet:
            log.warning(
                "session %s: ignoring %d message line(s) after line %d, left by an "
                "interrupted write",
                key,
                len(records) - committed,
                records[committed - 1][0],
            )
        del records[committed:]
    if records:
        p.first_record = records[0][3]
    for _, checked, size, offset in records:
        record = checked.record
        if not checked.is_metadata:
            p.messages.append((record, offset, size))
            continue
        if "changes" in record:
            p.metadata = apply_changes(p.metadata, record["changes"])
        else:
            p.metadata = dict(record.get("metadata") or {})
            hot = record.get("hot")
            if hot is not None:
                p.hot = hot
                p.snap = (offset, hot["gen"])
        # An unusable pointer keeps the previous one: it only moves forward, so the
        # last good value is the closest safe answer (0 would re-archive everything).
        if checked.last_consolidated is not None:
            p.last_consolidated = checked.last_consolidated
        p.meta_lines += 1
        p.meta_bytes += size
        p.last_meta_size = size
    return p


def copy_aside(path: Path) -> Path:
    """A private copy of ``path`` as ``<name>.corrupt-<time>`` (never deleted by memobot)."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    aside = path.with_name(f"{path.name}.corrupt-{stamp}")
    # The copy holds the same conversation: as private as the session file.
    fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with open(path, "rb") as src, os.fdopen(fd, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return aside


_NOT_JSON: Any = object()


def _json_line(raw: bytes) -> Any:
    """The line's JSON value, or ``_NOT_JSON`` (a torn or garbled write)."""
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):  # [[[[... too
        return _NOT_JSON


def _json_lines(lines: list[bytes]) -> list[Any] | None:
    """Every line's JSON value from one parse (a load's hot loop; None for blank lines), or
    None when the lines together are not one value each (the caller then goes line by
    line, and finds which)."""
    filled = [i for i, raw in enumerate(lines) if raw.strip()]
    try:
        values = json.loads(b"[" + b",".join([lines[i] for i in filled]) + b"]")
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if len(values) != len(filled):
        return None
    out: list[Any] = [None] * len(lines)
    for i, value in zip(filled, values, strict=True):
        out[i] = value
    return out


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


def open_session(path: Path) -> Any:
    """Open a session file for reading; SessionPathError when it is a folder or the like."""
    # O_NONBLOCK: a FIFO planted in place of the file must not hang the load.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise SessionPathError(path)
    return os.fdopen(fd, "rb")
