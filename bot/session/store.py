"""The session store: loads, caches and appends to session files (DESIGN.md section 4).

Writes only ever append, and an append that writes messages ends with a metadata line that
commits them (``bot.session.journal`` recognises what a crash leaves of one). A metadata line is
a full record when the consolidation point moves or the file has none, else a change record
(``bot.session.changes``). Memory does not grow with history: a loaded session holds its state
and the unconsolidated tail the prompt needs, loaded from the last full record when the file is
big (``bot.session.snapshot``). The in-memory copy is authoritative while the process runs, so
a turn never re-reads or re-parses the file. docs/sessions.md describes the file format.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bot import failpoints
from bot.durable import fsync_dir
from bot.private import make_private_dirs
from bot.session import archive
from bot.session.archive import archive_path, compaction_due
from bot.session.changes import metadata_changes
from bot.session.journal import (
    SUFFIX,
    Parsed,
    SessionPathError,
    check_folder,
    copy_aside,
    dumps_line,
    filename_to_key,
    key_to_filename,
    now_iso,
    open_session,
    parse_lines,
)
from bot.session.model import Session
from bot.session.snapshot import read_from_snapshot, snapshot_record
from bot.session.state import SessionState
from bot.session.transitions import Transition

log = logging.getLogger("bot.session")

# A raw metadata update: keys to values (None removes the key), or a function of the current
# metadata returning one (None: write nothing). Inside the session package and in tests only;
# everyone else changes a session with ``SessionStore.apply`` and a named transition.
MetadataUpdate = dict[str, Any] | Callable[[dict[str, Any]], dict[str, Any] | None]
COMPACT_RETRY_SECONDS = 300
# A session file smaller than this is read whole; a bigger one from its consolidation point.
READ_WHOLE_BELOW = 64 * 1024
# Sessions kept loaded; idle ones beyond either bound leave memory (least recently used
# first). The byte bound, on ``Session.held_bytes``, keeps the cache's memory flat however many
# chats are busy: reloading a tail costs under a millisecond, holding it costs memory for good.
MAX_CACHED = 128
MAX_CACHED_BYTES = 2 * 1024 * 1024


class SessionStore:
    """Loads, caches and appends to session files under ``state_dir/sessions``.

    At most ``max_cached`` sessions and ``max_cached_bytes`` of their messages
    (``Session.held_bytes``) stay loaded, least recently used first out. A session
    that is evicted while some code still holds it (a running turn, a consolidation) stays
    that one object: ``get`` finds it again, so there are never two copies of one session.
    """

    def __init__(
        self,
        state_dir: Path,
        max_cached: int = MAX_CACHED,
        max_cached_bytes: int = MAX_CACHED_BYTES,
    ) -> None:
        self.dir = state_dir / "sessions"
        check_folder(self.dir, "the sessions folder")
        try:
            make_private_dirs(self.dir)  # the state folder too, whatever the umask
        except (FileExistsError, NotADirectoryError):  # lost a race with whoever put it there
            check_folder(self.dir, "the sessions folder")
            raise
        self.max_cached = max(1, max_cached)
        self.max_cached_bytes = max_cached_bytes
        self._cache: OrderedDict[str, Session] = OrderedDict()
        self._held: weakref.WeakValueDictionary[str, Session] = weakref.WeakValueDictionary()
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

    def _cached(self, key: str) -> Session | None:
        with self._cache_lock:
            session = self._cache.get(key)
            if session is not None:
                self._cache.move_to_end(key)
                return session
            session = self._held.get(key)
            if session is not None:
                self._keep(key, session)
            return session

    def _keep(self, key: str, session: Session) -> None:
        """Cache ``session`` (under ``_cache_lock``), evicting the least recently used."""
        self._cache[key] = session
        self._held[key] = session
        while len(self._cache) > self.max_cached:
            self._cache.popitem(last=False)  # still in _held while anything holds it
        self._within_bytes()

    def _within_bytes(self) -> None:
        """Evict (under ``_cache_lock``) until the loaded messages fit ``max_cached_bytes``;
        the most recently used session stays, however big."""
        held = sum(s.held_bytes for s in self._cache.values())
        while held > self.max_cached_bytes and len(self._cache) > 1:
            held -= self._cache.popitem(last=False)[1].held_bytes

    def get(self, key: str) -> Session:
        session = self._cached(key)
        if session is None:
            with self._lock_for(key):  # two threads must never load two copies of one session
                session = self._cached(key)
                if session is None:
                    session = self._load(key)
                    with self._cache_lock:
                        self._keep(key, session)
        return session

    def loaded(self) -> int:
        """Sessions in the cache (for benchmarks and tests)."""
        return len(self._cache)

    def peek_metadata(self, key: str) -> dict[str, Any] | None:
        """The session's current metadata without loading its messages (reads from the end).

        Used at start to find sessions with unfinished work among many idle ones.
        """
        cached = self._cached(key)
        if cached is not None:
            return cached.metadata
        path = self.path_for(key)
        try:
            found = read_from_snapshot(key, path, messages=False)
        except FileNotFoundError:
            return None
        if found is not None:
            parsed, _ = found
            if not parsed.bad and not parsed.misshapen:
                return parsed.metadata
        # No usable snapshot, or damage (the full load sets it aside and logs it).
        try:
            empty = os.stat(path).st_size == 0
        except FileNotFoundError:
            return None
        return None if empty else self.get(key).metadata

    def peek_state(self, key: str) -> SessionState | None:
        """``peek_metadata`` as a ``SessionState`` (None when there is no such session)."""
        cached = self._cached(key)
        if cached is not None:
            return cached.state  # built once per metadata change, not per peek
        meta = self.peek_metadata(key)
        return None if meta is None else SessionState.of(meta)

    def history(self, key: str) -> list[dict[str, Any]]:
        """Every message of the session from its first, archived ones included (reads both
        files; for export, repair and tests, never on a turn's path)."""
        session = self.get(key)
        with self._lock_for(key):
            out: list[dict[str, Any]] = []
            archive = archive_path(session.path)
            if session.archived_bytes:
                with open_session(archive) as fh:
                    data = fh.read(session.archived_bytes)
                out.extend(rec for rec, _, _ in parse_lines(key, data, quiet=True).messages)
            with open_session(session.path) as fh:
                data = fh.read(session.size)
            out.extend(rec for rec, _, _ in parse_lines(key, data, quiet=True).messages)
            return out

    # -- loading ---------------------------------------------------------------------------

    def _load(self, key: str, from_snapshot: bool = True) -> Session:
        """Load from the last consolidation point when the file allows it, else read it all
        (``from_snapshot`` False: always read it all; the tests compare the two)."""
        path = self.path_for(key)
        session = Session(key=key, path=path)
        try:
            # A small file (the usual case: compaction keeps it to the tail) is read whole
            # faster than its offsets are checked.
            big = from_snapshot and os.stat(path).st_size >= READ_WHOLE_BELOW
            found = read_from_snapshot(key, path, messages=True) if big else None
        except FileNotFoundError:
            session.metadata = {"key": key, "created_at": now_iso()}
            return session
        if found is not None:
            parsed, start = found
            if not parsed.bad and not parsed.misshapen:
                self._fill(session, parsed, start)
                return session
        try:
            with open_session(path) as fh:
                data = fh.read()
        except FileNotFoundError:
            session.metadata = {"key": key, "created_at": now_iso()}
            return session
        parsed = parse_lines(key, data)
        self._fill(session, parsed, parsed.hot["base"] if parsed.hot else 0)
        if parsed.bad or parsed.misshapen:
            self._quarantine(session, parsed.bad, parsed.misshapen)
        return session

    def _fill(self, session: Session, parsed: Parsed, start: int) -> None:
        """Session state from a read whose first message line is message number ``start``."""
        session.metadata = parsed.metadata
        session.metadata.setdefault("key", session.key)
        session.truncate_at = parsed.truncate_at
        session.size = parsed.end
        session.metadata_written = parsed.meta_lines > 0
        session.last_meta_size = parsed.last_meta_size
        session.stale_meta_lines = max(0, parsed.meta_lines - 1)
        session.stale_meta_bytes = max(0, parsed.meta_bytes - parsed.last_meta_size)
        if parsed.hot is not None:
            session.file_base = parsed.hot["base"]
            session.archived_bytes = parsed.hot["archived_bytes"]
            session.snap = parsed.snap
        count = start + len(parsed.messages)
        lc = min(max(parsed.last_consolidated, start), count)
        session.base = lc
        session.last_consolidated = lc
        session.window_start = lc
        for record, offset, size in parsed.messages[lc - start :]:
            session.add_loaded(record, offset, size, owned=True)

    def _quarantine(
        self, session: Session, bad: list[int], misshapen: list[tuple[int, str]]
    ) -> None:
        """Keep a copy of the damaged file, then rewrite it with every good line."""
        aside = copy_aside(session.path)
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
        # Only a file with nothing committed can be new: asking the disk on every append was a
        # stat per append, three per answered message, that told nothing new.
        new_file = session.size == 0 and not session.path.exists()
        fd = os.open(session.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            if session.truncate_at is not None:
                os.ftruncate(fd, session.truncate_at)
                session.truncate_at = None
            view = memoryview(payload)
            if failpoints.armed("mid_append"):  # a torn line, exactly as a crash leaves it
                os.write(fd, view[: max(1, len(view) // 2)])
                failpoints.crash()
            try:
                while view:
                    n = os.write(fd, view)
                    view = view[n:]
                end = os.lseek(fd, 0, os.SEEK_CUR)
                if fsync:
                    os.fsync(fd)
            except BaseException:
                # Part of the payload may be in the file (a full disk): the next append cuts
                # it off first, or it would fuse with that append's first line.
                session.truncate_at = session.size
                raise
        finally:
            os.close(fd)
        if end != session.size + len(payload):
            # Someone else wrote to the file: the offsets memobot keeps are off. The next full
            # record starts afresh, and a load checks every offset before trusting it.
            log.warning("session %s: the file changed under memobot (size %d)", session.key, end)
            session.snap = None
        session.size = end
        if new_file and fsync:
            fsync_dir(session.path.parent)

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

    def apply(
        self,
        session: Session,
        transition: Transition,
        messages: list[dict[str, Any]] = (),  # type: ignore[assignment]
        *,
        last_consolidated: int | None = None,
        fsync: bool = True,
    ) -> bool:
        """Change the session's state by ``transition`` (``bot.session.transitions``),
        appending ``messages`` (and moving ``last_consolidated``) in the same write.

        The transition runs under the session's lock on the current state, so
        check-then-write is atomic; it returning None writes nothing (not even ``messages``)
        and returns False. Only the fields that changed are written. Thread-safe; as
        ``append`` otherwise."""
        with self._lock_for(session.key):
            before = session.state
            after = transition(before)
            if after is None:
                return False
            update = before.update_to(after)
            self._append_locked(session, messages, update, last_consolidated, fsync)
            # The state is the one the transition made: its entries are the ones just written.
            session.state_cache = (session.metadata, after)
            return True

    async def apply_async(
        self,
        session: Session,
        transition: Transition,
        messages: list[dict[str, Any]] = (),  # type: ignore[assignment]
        *,
        last_consolidated: int | None = None,
        fsync: bool = True,
    ) -> bool:
        """``apply`` in a worker thread: an fsync never stalls the event loop (and every chat
        on it); writes to one session still happen one at a time, in call order per task."""
        return await asyncio.to_thread(
            self.apply,
            session,
            transition,
            messages,
            last_consolidated=last_consolidated,
            fsync=fsync,
        )

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
        if session.truncate_at is not None:
            session.size = session.truncate_at
        pos = session.size
        parts = []
        stamped = []
        offsets = []
        for m in messages:
            m = m if "timestamp" in m else {**m, "timestamp": now_iso()}
            line = dumps_line(m)
            stamped.append(m)
            parts.append(line)
            offsets.append(pos)
            pos += len(line)
        if metadata is None and last_consolidated is None and not stamped:
            return
        new_meta = dict(session.metadata)
        for k, v in (metadata or {}).items():
            if v is None:
                new_meta.pop(k, None)
            else:
                new_meta[k] = v
        lc = session.last_consolidated if last_consolidated is None else last_consolidated
        count = session.count + len(stamped)
        lc = min(max(lc, session.base), count)  # the messages before base are not in memory
        snap = None
        if session.snap is None or lc != session.last_consolidated:
            # A full record: where a load may start. Written when the consolidation point
            # moves (rarely); ``tail_at`` is where the first unconsolidated message is.
            i = lc - session.base
            held = len(session.offsets)
            if i >= count - session.base:
                tail_at = pos
            else:
                tail_at = session.offsets[i] if i < held else offsets[i - held]
            record = snapshot_record(
                new_meta, lc, count, session.file_base, session.archived_bytes, tail_at
            )
            snap = (pos, record["hot"]["gen"])
        else:
            record = {
                "_type": "metadata",
                "changes": metadata_changes(session.metadata, new_meta, metadata or ()),
                "last_consolidated": lc,
                "snap": list(session.snap),
            }
        meta_line = dumps_line(record)
        parts.append(meta_line)
        self._append(session, b"".join(parts), fsync)
        for m, offset, line in zip(stamped, offsets, parts[: len(stamped)], strict=True):
            session.add_loaded(m, offset, len(line))
        if snap is not None and session.size == pos + len(meta_line):
            session.snap = snap
        if session.metadata_written:
            session.stale_meta_lines += 1
            session.stale_meta_bytes += session.last_meta_size
        session.metadata = new_meta
        session.last_consolidated = lc
        session.drop_before(lc)
        session.metadata_written = True
        session.last_meta_size = len(meta_line)
        if stamped:  # the tail grew: the cache may be past its bytes now
            with self._cache_lock:
                self._within_bytes()
        if fsync and compaction_due(session) and time.monotonic() >= session.compact_after:
            # Not in an unsynced write: those run on the event loop (a delivery mark), and a
            # compaction fsyncs twice; the next synced append does it. The append is committed
            # whatever happens here: a tidy-up that fails (a full disk, an archive path that is
            # not a file) is logged and tried again later.
            try:
                self.compact(session)
            except OSError as exc:
                session.compact_after = time.monotonic() + COMPACT_RETRY_SECONDS
                log.error(
                    "session %s: cannot compact the session file (%s); the file stays as it "
                    "is, next try in %d s",
                    session.key,
                    exc,
                    COMPACT_RETRY_SECONDS,
                )

    def compact(self, session: Session) -> None:
        """Rewrite the hot file as its tail plus one full record (``bot.session.archive``)."""
        archive.compact(session)
