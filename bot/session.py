"""Append-only JSONL sessions (DESIGN.md section 4).

A session file holds message lines (OpenAI chat format plus ``timestamp``) and metadata lines.
A metadata line is either a full record (``{"_type": "metadata", "metadata": {...},
"last_consolidated": N, "hot": {...}}``) or a change record (``{"_type": "metadata",
"changes": {...}, "last_consolidated": N, "snap": [offset, gen]}``) that says what changed
since the line before: a record written per message received carries that message, not the
whole pending list and seen ids again. On load the records are replayed in order. Writes only
ever append, and an append that writes messages ends with a metadata line that commits them:
what a crash leaves of a half-written append (complete message lines, then a torn one) is
recognised on load and dropped as a whole.

Memory does not grow with history: a loaded session holds its metadata and the unconsolidated
tail the prompt needs, and a load starts at the last consolidation point (the full record's
``tail_at``, checked before it is trusted) rather than parsing the whole file. Compaction
rewrites the hot file as that tail plus one full record, and first moves the consolidated
message lines to the session's archive (``<file>.archive``, never deleted). The in-memory copy
is authoritative while the process runs, so a turn never re-reads or re-parses the file.
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import json
import logging
import os
import shutil
import stat
import sys
import threading
import time
import weakref
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bot import durable, failpoints
from bot.config import ConfigError
from bot.images import stored_form
from bot.private import make_private_dirs
from bot.records import Checked, check_record
from bot.tokens import estimate_message_tokens

log = logging.getLogger(__name__)

SUFFIX = ".jsonl"
MetadataUpdate = dict[str, Any] | Callable[[dict[str, Any]], dict[str, Any] | None]
# Compaction folds superseded metadata lines away once they are this many, or this large (and
# more than a fifth of the file's other bytes: metadata stays a small share of the file),
# or when this many bytes of consolidated lines could move to the archive.
COMPACT_AFTER_LINES = 200
COMPACT_AFTER_BYTES = 4 * 1024
COMPACT_SHARE = 0.2
ARCHIVE_AFTER_BYTES = 256 * 1024
COMPACT_RETRY_SECONDS = 300
ARCHIVE_SUFFIX = ".archive"
# A session file smaller than this is read whole; a bigger one from its consolidation point.
READ_WHOLE_BELOW = 64 * 1024
# Sessions kept loaded; idle ones beyond either bound leave memory (least recently used
# first). The byte bound, on ``Session.held_bytes``, keeps the cache's memory flat however many
# chats are busy: reloading a tail costs under a millisecond, holding it costs memory for good.
MAX_CACHED = 128
MAX_CACHED_BYTES = 2 * 1024 * 1024
# What one loaded message costs beyond its line's bytes (its dict, the side lists, the
# allocator's share), measured with tracemalloc over a soak's sessions.
MESSAGE_BYTES = 512
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


# A bookkeeping key the message does not have (its value may be anything, null included).
_ABSENT: Any = object()


@dataclass(slots=True, weakref_slot=True)
class Session:
    """One chat as memobot holds it in memory: its metadata and the unconsolidated tail.

    ``messages[0]`` is message number ``base`` of the whole conversation (counted from its
    first message ever); ``base`` is ``last_consolidated`` once loaded, so memory does not grow
    with history. Indices handed around (``last_consolidated``, ``window_start``, the cut of a
    consolidation) are absolute; ``rel`` turns one into a position in these lists.
    """

    key: str
    path: Path
    # Each message once, in the form the API takes (``to_wire``); its bookkeeping values apart,
    # in lists of the same length (``_ABSENT`` where it has none). ``messages`` puts them back.
    wire: list[dict[str, Any]] = field(default_factory=list)
    stamps: list[Any] = field(default_factory=list)
    answered: list[Any] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    # Each message's line in the file, in bytes, and their sum: what its text costs held (an
    # inlined image's data URL included, which a token estimate leaves out).
    sizes: array[int] = field(default_factory=lambda: array("q"))
    held_size: int = 0
    # Byte offset of each message line in the hot file (where a snapshot's ``tail_at`` points).
    offsets: array[int] = field(default_factory=lambda: array("q"))
    base: int = 0
    metadata: dict[str, Any] = field(default_factory=dict)
    last_consolidated: int = 0
    # Bookkeeping for compaction and torn-tail repair.
    stale_meta_lines: int = 0
    stale_meta_bytes: int = 0
    metadata_written: bool = False
    last_meta_size: int = 0
    truncate_at: int | None = None
    compact_after: float = 0.0  # monotonic time before which a failed compaction is not retried
    size: int = 0  # committed bytes of the hot file: where the next append lands
    file_base: int = 0  # number of the hot file's first message line
    archived_bytes: int = 0  # bytes of the archive that are committed (the hot file says so)
    # The last full metadata record: (its offset, its generation). Change records name it, so
    # a load can start there; None until one is written in this file.
    snap: tuple[int, str] | None = None
    # Where the prompt's history window was last trimmed to. In memory only: a cache choice
    # (keep one prefix across turns), not session state.
    window_start: int = 0
    # The context builder's API form of the window's settled part (bot.context); it lives and
    # goes with the session.
    api_prefix: Any = None

    def add_loaded(
        self, message: dict[str, Any], offset: int, size: int, owned: bool = False
    ) -> None:
        """Hold one more message. ``owned``: the dict is the session's to keep (parsed from
        its file), so its bookkeeping keys are taken out of it rather than copying it.
        ``offset`` and ``size``: where its line is in the hot file and how long.

        The same few strings repeat on every line (roles, "model @ endpoint"); a message read
        from disk keeps the one shared copy instead of its own."""
        role = message.get("role")
        if type(role) is str and len(role) < 256:
            message["role"] = sys.intern(role)
        if owned:
            if type(message.get("content")) is list:
                # Written before images were sent once only (bot.images): their data URLs
                # would go out with every request and stay in memory.
                stripped = stored_form([message])[0]
                if stripped is not message:
                    message, size = stripped, len(_dumps(stripped))  # what memory holds
            stamp = message.pop("timestamp", _ABSENT)
            answered = message.pop(ANSWERED_BY_KEY, _ABSENT)
            wire = message
        else:
            stamp = message.get("timestamp", _ABSENT)
            answered = message.get(ANSWERED_BY_KEY, _ABSENT)
            wire = to_wire(message)
        if type(answered) is str and len(answered) < 256:
            answered = sys.intern(answered)
        self.wire.append(wire)
        self.stamps.append(stamp)
        self.answered.append(answered)
        self.tokens.append(estimate_message_tokens(wire))
        self.offsets.append(offset)
        self.sizes.append(size)
        self.held_size += size

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The in-memory tail as stored (bookkeeping keys included), built when asked: for
        compaction, consolidation and /status, never on a turn's path."""
        return self.stored(0, len(self.wire))

    def stored(self, start: int, end: int) -> list[dict[str, Any]]:
        """Messages ``start``..``end`` (positions in the in-memory tail) as stored."""
        out = []
        for wire, answered, stamp in zip(
            self.wire[start:end], self.answered[start:end], self.stamps[start:end], strict=True
        ):
            if answered is _ABSENT and stamp is _ABSENT:
                out.append(wire)
                continue
            message = dict(wire)
            if answered is not _ABSENT:
                message[ANSWERED_BY_KEY] = answered
            if stamp is not _ABSENT:
                message["timestamp"] = stamp
            out.append(message)
        return out

    @property
    def count(self) -> int:
        """Messages in the whole conversation, archived ones included."""
        return self.base + len(self.wire)

    @property
    def unconsolidated(self) -> int:
        return self.count - self.last_consolidated

    def rel(self, index: int) -> int:
        """Position of absolute message ``index`` in the in-memory lists (0 if older)."""
        return max(0, index - self.base)

    @property
    def held_bytes(self) -> int:
        """Roughly what the in-memory tail costs."""
        return MESSAGE_BYTES * len(self.wire) + self.held_size

    def estimated_tokens(self, start: int = 0) -> int:
        return sum(self.tokens[self.rel(start) :])

    def drop_before(self, index: int) -> None:
        """Forget the messages before absolute ``index`` (they are consolidated)."""
        n = min(self.rel(index), len(self.wire))
        if n:
            self.held_size -= sum(self.sizes[:n])
            del self.wire[:n], self.stamps[:n], self.answered[:n], self.tokens[:n]
            del self.offsets[:n], self.sizes[:n]
            self.base += n


def archive_path(path: Path) -> Path:
    """The session's archive: its consolidated message lines, moved out of the hot file."""
    return path.with_name(path.name + ARCHIVE_SUFFIX)


_MISSING: Any = object()


class _NoId(Exception):
    pass


def _item_id(item: Any) -> Any:
    if isinstance(item, dict):
        if "id" not in item:
            raise _NoId
        item = item["id"]
    if item is None or isinstance(item, str | int):
        return item
    raise _NoId


def apply_list(items: list[Any], ops: dict[str, Any]) -> list[Any]:
    """``items`` after ``drop`` (first entry with each id), ``put`` (replace the entry with
    that id, in place) and ``add`` (append). Ids that are not there are ignored."""
    out = list(items)
    for gone in ops.get("drop") or ():
        for i, item in enumerate(out):
            try:
                if _item_id(item) == gone:
                    del out[i]
                    break
            except _NoId:
                continue
    puts = ops.get("put")
    if puts:
        by_id = {}
        for p in puts:
            try:
                by_id[_item_id(p)] = p
            except _NoId:
                continue
        for i, item in enumerate(out):
            try:
                new = by_id.get(_item_id(item), _MISSING)
            except _NoId:
                continue
            if new is not _MISSING:
                out[i] = new
    out.extend(ops.get("add") or ())
    return out


def list_ops(old: list[Any], new: list[Any]) -> dict[str, Any] | None:
    """drop/put/add turning ``old`` into ``new``; None when they cannot say it more briefly
    than ``new`` itself (the caller then stores the whole list). Checked by applying them."""
    try:
        old_ids = [_item_id(x) for x in old]
        new_ids = [_item_id(x) for x in new]
    except _NoId:
        return None
    drop: list[Any] = []
    put: list[Any] = []
    i = j = 0
    while j < len(new):
        k = i
        while k < len(old) and old_ids[k] != new_ids[j]:
            k += 1
        if k == len(old):
            break  # not in the old list: this and the rest are added
        drop.extend(old_ids[i:k])
        if old[k] is not new[j] and old[k] != new[j]:
            put.append(new[j])
        i, j = k + 1, j + 1
    drop.extend(old_ids[i:])
    add = new[j:]
    if len(put) + len(add) >= len(new) > 0:
        return None
    ops = {name: v for name, v in (("drop", drop), ("put", put), ("add", add)) if v}
    return ops if apply_list(old, ops) == new else None


def apply_changes(meta: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """The metadata a change record (written by ``SessionStore.append``) turns ``meta`` into."""
    out = dict(meta)
    for name in changes.get("unset") or ():
        out.pop(name, None)
    out.update(changes.get("set") or {})
    for name, ops in (changes.get("lists") or {}).items():
        current = out.get(name)
        out[name] = apply_list(current if isinstance(current, list) else [], ops)
    return out


def metadata_changes(
    old: dict[str, Any], new: dict[str, Any], names: Iterable[str]
) -> dict[str, Any]:
    """What changed between ``old`` and ``new`` among ``names``: ``apply_changes(old, result)``
    equals ``new`` on those keys. Lists of entries with ids change entry by entry, so a record
    written per message received does not repeat the whole pending list and seen ids."""
    set_: dict[str, Any] = {}
    unset: list[str] = []
    lists: dict[str, Any] = {}
    for name in names:
        before = old.get(name, _MISSING)
        after = new.get(name, _MISSING)
        if after is _MISSING:
            if before is not _MISSING:
                unset.append(name)
        elif before is after:
            continue
        elif isinstance(before, list) and isinstance(after, list):
            ops = list_ops(before, after)
            if ops is None:
                set_[name] = after
            elif ops:
                lists[name] = ops
        elif before is _MISSING or before != after:
            set_[name] = after
    changes: dict[str, Any] = {}
    if set_:
        changes["set"] = set_
    if unset:
        changes["unset"] = unset
    if lists:
        changes["lists"] = lists
    return changes


@dataclass(slots=True)
class _Parsed:
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


def _parse(
    key: str,
    data: bytes,
    at: int = 0,
    quiet: bool = False,
    settled_meta: int = -1,
    batch: bool = True,
) -> _Parsed:
    """Read ``data`` (the file from offset ``at``) as the loader does: torn and uncommitted
    tails recognised, records checked, metadata replayed. Metadata lines before offset
    ``settled_meta`` (a full record there supersedes them) are counted, not checked."""
    p = _Parsed()
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
        return _parse(key, data, at, quiet, settled_meta, batch=False)
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
            found = _read_from_snapshot(key, path, messages=False)
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

    def history(self, key: str) -> list[dict[str, Any]]:
        """Every message of the session from its first, archived ones included (reads both
        files; for export, repair and tests, never on a turn's path)."""
        session = self.get(key)
        with self._lock_for(key):
            out: list[dict[str, Any]] = []
            archive = archive_path(session.path)
            if session.archived_bytes:
                with _open_session(archive) as fh:
                    data = fh.read(session.archived_bytes)
                out.extend(rec for rec, _, _ in _parse(key, data, quiet=True).messages)
            with _open_session(session.path) as fh:
                data = fh.read(session.size)
            out.extend(rec for rec, _, _ in _parse(key, data, quiet=True).messages)
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
            found = _read_from_snapshot(key, path, messages=True) if big else None
        except FileNotFoundError:
            session.metadata = {"key": key, "created_at": now_iso()}
            return session
        if found is not None:
            parsed, start = found
            if not parsed.bad and not parsed.misshapen:
                self._fill(session, parsed, start)
                return session
        try:
            with _open_session(path) as fh:
                data = fh.read()
        except FileNotFoundError:
            session.metadata = {"key": key, "created_at": now_iso()}
            return session
        parsed = _parse(key, data)
        self._fill(session, parsed, parsed.hot["base"] if parsed.hot else 0)
        if parsed.bad or parsed.misshapen:
            self._quarantine(session, parsed.bad, parsed.misshapen)
        return session

    def _fill(self, session: Session, parsed: _Parsed, start: int) -> None:
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
        aside = _copy_aside(session.path)
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
            _fsync_dir(session.path.parent)

    @staticmethod
    def _snapshot(
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
        if session.truncate_at is not None:
            session.size = session.truncate_at
        pos = session.size
        parts = []
        stamped = []
        offsets = []
        for m in messages:
            m = m if "timestamp" in m else {**m, "timestamp": now_iso()}
            line = _dumps(m)
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
            record = self._snapshot(
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
        meta_line = _dumps(record)
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
        if fsync and self._compaction_due(session) and time.monotonic() >= session.compact_after:
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

    @staticmethod
    def _compaction_due(session: Session) -> bool:
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

    def compact(self, session: Session) -> None:
        """Rewrite the hot file as the unconsolidated messages plus one full metadata record:
        tmp, fsync, rename, fsync of the folder. Consolidated message lines still in it move
        to the session's archive first (appended and fsynced before the rename, so a crash in
        between leaves them in both, and the next move does not repeat them)."""
        archived = self._archive_consolidated(session)
        tmp = session.path.with_name(f".{session.path.name}.tmp")
        parts = [_dumps(m) for m in session.messages]
        offsets = list(itertools.accumulate((len(p) for p in parts), initial=0))
        at = offsets.pop()  # where the metadata line goes
        record = self._snapshot(
            session.metadata,
            session.last_consolidated,
            session.count,
            session.base,
            archived,
            at if not parts else 0,
        )
        meta_line = _dumps(record)
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
        _fsync_dir(session.path.parent)  # after the bookkeeping: the new file is the file now
        log.info(
            "session %s: compacted to %d messages (%d archived)",
            session.key,
            len(session.wire),
            session.base,
        )

    def _archive_consolidated(self, session: Session) -> int:
        """Append the hot file's consolidated message lines to the archive (fsynced); returns
        the archive's committed size to record in the new hot file."""
        moving = session.base - session.file_base
        if moving <= 0:
            return session.archived_bytes
        with _open_session(session.path) as fh:
            data = fh.read(session.size)
        lines = _parse(session.key, data, quiet=True).messages
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
                    aside = _copy_aside(path)
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
            _fsync_dir(path.parent)
        failpoints.hit("after_archive")
        return at + len(payload)


def _copy_aside(path: Path) -> Path:
    """A private copy of ``path`` as ``<name>.corrupt-<time>`` (never deleted by memobot)."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    aside = path.with_name(f"{path.name}.corrupt-{stamp}")
    # The copy holds the same conversation: as private as the session file.
    fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with open(path, "rb") as src, os.fdopen(fd, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return aside


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


def _read_from_snapshot(
    key: str, path: Path, messages: bool, quiet: bool = False
) -> tuple[_Parsed, int] | None:
    """Read the hot file from its last consolidation point rather than from the start.

    The last metadata record names the last full record (offset and generation); that one
    says where the first unconsolidated message line is (``tail_at``). Every offset is
    checked: it must start a line, the record there must be that full record, and the read
    must find the lines where the record says they are. Returns (what was read, the number of
    its first message), or None when anything does not hold (the caller reads the whole
    file). ``messages`` False reads from the full record only (metadata is all it needs).
    Raises FileNotFoundError when there is no file.
    """
    with _open_session(path) as fh:
        found = _last_metadata(fh)
        if found is None:
            return None
        at, last = found
        if "changes" in last:
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
        else:
            snap_at, snapshot = at, last
            if not isinstance(snapshot.get("hot"), dict):
                return None  # written before memobot kept offsets: read it all once
            gen = snapshot["hot"]["gen"]
        tail_at = snapshot["hot"]["tail_at"] if messages else snap_at
        if tail_at > snap_at or not _at_line_start(fh, tail_at):
            return None
        fh.seek(tail_at)
        data = fh.read()
    parsed = _parse(key, data, tail_at, quiet, settled_meta=snap_at)
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


def read_metadata(path: Path) -> dict[str, Any] | None:
    """The current metadata of a session file, read only (nothing is repaired or set aside):
    from its last full record when the file has one, else from the whole file."""
    key = path.name
    try:
        found = _read_from_snapshot(key, path, messages=False, quiet=True)
        if found is not None:
            return found[0].metadata
        with _open_session(path) as fh:
            data = fh.read()
    except FileNotFoundError:
        return None
    parsed = _parse(key, data, quiet=True)
    return parsed.metadata if parsed.meta_lines else None


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
