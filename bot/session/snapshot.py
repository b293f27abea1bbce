"""Full metadata records (snapshots) and reading a session file from the last one.

A full record carries the whole metadata and ``hot``: where this file stands (its first message
line's number, the archive's committed size, where the unconsolidated tail starts, the message
count, a generation). The change records after it name it by ``snap: [offset, generation]``, so
a load may start at the consolidation point instead of parsing the whole file, once every offset
has been checked.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from bot.session.journal import Parsed, open_session, parse_line, parse_lines
from bot.session.records import check_record
from bot.session.state import SessionState


def snapshot_record(
    meta: dict[str, Any], lc: int, count: int, base: int, archived: int, tail_at: int
) -> dict[str, Any]:
    """A full metadata record; ``hot`` says where this file stands: its first message
    line's number, the archive's committed size, where the unconsolidated tail starts,
    how many messages the conversation has so far, and a generation that the change
    records after it repeat."""
    return {
        "_type": "metadata",
        "metadata": meta,
        "last_consolidated": lc,
        "hot": {
            "base": base,
            "archived_bytes": archived,
            "tail_at": tail_at,
            "count": count,
            "gen": os.urandom(4).hex(),
        },
    }


def _last_metadata(fh: Any) -> tuple[int, dict[str, Any]] | None:
    """(offset, record) of the file's last complete metadata line, reading from the end; None
    when there is none, or it is of the wrong shape (the full read deals with that)."""
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
        lines.pop()  # after the last newline: a torn line at most
        # The first piece may be a partial line unless we reached the start.
        first = 0 if pos == 0 else 1
        at = pos + len(buf) - len(buf.rsplit(b"\n", 1)[-1]) if lines else pos
        for i in range(len(lines) - 1, first - 1, -1):
            raw = lines[i]
            at -= len(raw) + 1
            # Any spelling (a line not written by us wins on load too); cheap test first.
            if b'"_type"' not in raw:
                continue
            record = parse_line(raw)
            if record is None or record.get("_type") != "metadata":
                continue
            if check_record(record).problems:
                return None
            return at, record
        chunk *= 4
    return None


def _at_line_start(fh: Any, offset: int) -> bool:
    if offset == 0:
        return True
    fh.seek(offset - 1)
    return fh.read(1) == b"\n"


def read_from_snapshot(
    key: str, path: Path, messages: bool, quiet: bool = False
) -> tuple[Parsed, int] | None:
    """Read the hot file from its last consolidation point rather than from the start.

    The last metadata record names the last full record (offset and generation); that one
    says where the first unconsolidated message line is (``tail_at``). Every offset is
    checked: it must start a line, the record there must be that full record, and the read
    must find the lines where the record says they are. Returns (what was read, the number of
    its first message), or None when anything does not hold (the caller reads the whole
    file). ``messages`` False reads from the full record only (metadata is all it needs).
    Raises FileNotFoundError when there is no file.
    """
    with open_session(path) as fh:
        found = _last_full_record(fh)
        if found is None:
            return None
        snap_at, gen, snapshot = found
        tail_at = snapshot["hot"]["tail_at"] if messages else snap_at
        if tail_at > snap_at or not _at_line_start(fh, tail_at):
            return None
        fh.seek(tail_at)
        data = fh.read()
    parsed = parse_lines(key, data, tail_at, quiet, settled_meta=snap_at)
    if parsed.snap != (snap_at, gen) or parsed.first_record != tail_at:
        return None
    lc = snapshot.get("last_consolidated") or 0
    if messages:
        # The lines between tail_at and the full record are the tail it counted, no fewer
        # and no more (an offset one line off would shift every message number).
        before = sum(1 for _, offset, _ in parsed.messages if offset < snap_at)
        if before != snapshot["hot"].get("count", -1) - lc:
            return None
        if before and parsed.messages[0][1] != tail_at:
            return None
    return parsed, lc


def last_hot(path: Path) -> dict[str, Any] | None:
    """The ``hot`` field of the file's last full record (where the file stands), reading
    only that record and the last metadata line; None when there is none to trust (the
    file has no full record with one, or its offsets do not hold). Read only."""
    with open_session(path) as fh:
        found = _last_full_record(fh)
    return found[2]["hot"] if found is not None else None


def _last_full_record(fh: Any) -> tuple[int, Any, dict[str, Any]] | None:
    """The file's last full record, checked: (its offset, its generation, the record), or
    None when there is none with offsets to trust (a file written before memobot kept
    offsets, an offset that does not start a line, a record of another generation)."""
    found = _last_metadata(fh)
    if found is None:
        return None
    at, last = found
    if "changes" not in last:
        hot = last.get("hot")
        if not isinstance(hot, dict):
            return None  # written before memobot kept offsets: read it all once
        return at, hot.get("gen"), last
    snap_at, gen = last["snap"]
    if not _at_line_start(fh, snap_at):
        return None
    fh.seek(snap_at)
    snapshot = parse_line(fh.readline())
    if (
        snapshot is None
        or snapshot.get("_type") != "metadata"
        or check_record(snapshot).problems
        or not isinstance(snapshot.get("hot"), dict)
        or snapshot["hot"].get("gen") != gen
    ):
        return None
    return snap_at, gen, snapshot


def read_metadata(path: Path) -> dict[str, Any] | None:
    """The current metadata of a session file, read only (nothing is repaired or set aside):
    from its last full record when the file has one, else from the whole file."""
    key = path.name
    try:
        found = read_from_snapshot(key, path, messages=False, quiet=True)
        if found is not None:
            return found[0].metadata
        with open_session(path) as fh:
            data = fh.read()
    except FileNotFoundError:
        return None
    parsed = parse_lines(key, data, quiet=True)
    return parsed.metadata if parsed.meta_lines else None


def read_state(path: Path) -> SessionState | None:
    """``read_metadata`` as a ``SessionState`` (None when the file has no metadata)."""
    meta = read_metadata(path)
    return None if meta is None else SessionState.of(meta)
