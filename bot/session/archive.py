"""The archive and compaction: how a hot file sheds superseded metadata and old messages.

The hot file (``<key>.jsonl``) only ever grows by appends. Compaction rewrites it as the
unconsolidated message lines plus one full metadata record (tmp, fsync, rename, fsync of the
folder), once superseded metadata lines are many or large, or consolidated message lines are
many. Consolidated message lines first move to the session's archive (``<key>.jsonl.archive``,
append-only, never deleted); the hot file's full record says how many archive bytes are
committed (``hot.archived_bytes``), so a move a crash interrupted is recognised and redone.
"""

from __future__ import annotations

import itertools
import logging
import os
import stat
from array import array
from pathlib import Path

from bot import durable, failpoints
from bot.durable import fsync_dir
from bot.session.journal import (
    SessionPathError,
    copy_aside,
    dumps_line,
    open_session,
    parse_lines,
)
from bot.session.model import Session
from bot.session.snapshot import snapshot_record

log = logging.getLogger("bot.session")

ARCHIVE_SUFFIX = ".archive"
# Compaction folds superseded metadata lines away once they are this many, or this large (and
# more than a fifth of the file's other bytes: metadata stays a small share of the file),
# or when this many bytes of consolidated lines could move to the archive.
COMPACT_AFTER_LINES = 200
COMPACT_AFTER_BYTES = 4 * 1024
COMPACT_SHARE = 0.2
ARCHIVE_AFTER_BYTES = 256 * 1024


def archive_path(path: Path) -> Path:
    """The session's archive: its consolidated message lines, moved out of the hot file."""
    return path.with_name(path.name + ARCHIVE_SUFFIX)


def compaction_due(session: Session) -> bool:
    """Whether the hot file has enough superseded or consolidated lines to compact."""
    stale = session.stale_meta_bytes
    rest = session.size - stale - session.last_meta_size
    archivable = 0  # bytes before the first unconsolidated line, when some are messages
    if session.base > session.file_base:
        archivable = session.offsets[0] if session.offsets else session.size
    return (
        session.stale_meta_lines >= COMPACT_AFTER_LINES
        or (stale >= COMPACT_AFTER_BYTES and stale >= rest * COMPACT_SHARE)
        or archivable >= ARCHIVE_AFTER_BYTES
    )


def compact(session: Session) -> None:
    """Rewrite the hot file as the unconsolidated messages plus one full metadata record:
    tmp, fsync, rename, fsync of the folder. Consolidated message lines still in it move
    to the session's archive first (appended and fsynced before the rename, so a crash in
    between leaves them in both, and the next move does not repeat them)."""
    archived = _archive_consolidated(session)
    tmp = session.path.with_name(f".{session.path.name}.tmp")
    parts = [dumps_line(m) for m in session.messages]
    offsets = list(itertools.accumulate((len(p) for p in parts), initial=0))
    at = offsets.pop()  # where the metadata line goes
    record = snapshot_record(
        session.metadata,
        session.last_consolidated,
        session.count,
        session.base,
        archived,
        at if not parts else 0,
    )
    meta_line = dumps_line(record)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb", closefd=False) as fh:
            fh.writelines(parts)
            fh.write(meta_line)
            fh.flush()
        os.fsync(fd)
    finally:
        os.close(fd)
    failpoints.hit("before_compact_rename")
    durable.move(tmp, session.path, sync=False)  # the folder is fsynced below
    session.file_base = session.base
    session.archived_bytes = archived
    session.offsets = array("q", offsets)
    session.sizes = array("q", map(len, parts))
    session.held_size = sum(session.sizes)
    session.size = at + len(meta_line)
    session.snap = (at, record["hot"]["gen"])
    session.truncate_at = None
    session.stale_meta_lines = 0
    session.stale_meta_bytes = 0
    session.metadata_written = True
    session.last_meta_size = len(meta_line)
    fsync_dir(session.path.parent)  # after the bookkeeping: the new file is the file now
    log.info(
        "session %s: compacted to %d messages (%d archived)",
        session.key,
        len(session.wire),
        session.base,
    )


def _archive_consolidated(session: Session) -> int:
    """Append the hot file's consolidated message lines to the archive (fsynced); returns
    the archive's committed size to record in the new hot file."""
    moving = session.base - session.file_base
    if moving <= 0:
        return session.archived_bytes
    with open_session(session.path) as fh:
        data = fh.read(session.size)
    lines = parse_lines(session.key, data, quiet=True).messages
    if len(lines) < moving:
        log.error(
            "session %s: the file holds %d consolidated message line(s), %d expected; "
            "archiving what is there",
            session.key,
            len(lines),
            moving,
        )
    payload = b"".join(data[off : off + size] for _, off, size in lines[:moving])
    path = archive_path(session.path)
    new_file = not path.exists()
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SessionPathError(path)
        size = os.fstat(fd).st_size
        at = session.archived_bytes
        if size < at:
            log.error(
                "session %s: archive %s is shorter than recorded (%d < %d bytes); appending",
                session.key,
                path.name,
                size,
                at,
            )
            at = size
        elif size > at:
            extra = os.pread(fd, size - at, at)
            # A move a crash interrupted wrote (part of) these same lines: cut them, they
            # are written again now. Anything else is kept in a copy before the cut.
            if not payload.startswith(extra):
                aside = copy_aside(path)
                log.error(
                    "session %s: %d unexpected byte(s) at the end of %s; copied it to %s",
                    session.key,
                    size - at,
                    path.name,
                    aside.name,
                )
            os.ftruncate(fd, at)
        view = memoryview(payload)
        if failpoints.armed("mid_archive"):  # a torn archive write
            os.pwrite(fd, view[: max(1, len(view) // 2)], at)
            failpoints.crash()
        done = 0
        while done < len(view):
            done += os.pwrite(fd, view[done:], at + done)
        os.fsync(fd)
    finally:
        os.close(fd)
    if new_file:
        fsync_dir(path.parent)
    failpoints.hit("after_archive")
    return at + len(payload)
