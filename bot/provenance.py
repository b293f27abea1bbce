"""Who last wrote the workspace files that act later, unattended: HEARTBEAT.md and skills.

Rights follow provenance (DESIGN.md section 12). A turn shaped by a non-admin (a group chat,
a private chat with someone who is not an admin, a job a non-admin made) may write
HEARTBEAT.md with its file tools or its shell; the heartbeat then runs it with nobody watching.
So after each turn whose tools ran, the files below are compared with their status before the
first tool; a change is recorded here, in the state folder where the model cannot reach, with
the turn's session and whether the turn was trusted. A later run of the file is trusted unless
the record says a non-admin wrote exactly the version on disk now: an admin's turn that changes
the file, or the owner editing it by hand (even ``touch HEARTBEAT.md``), makes it trusted again.

``state/provenance.json``: ``{"version": 1, "files": {rel: {"stamp": [mtime_ns, size, inode],
"by": session key, "trusted": bool, "at": ISO time}}}``.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bot import workspace_files
from bot.bus import InboundMessage
from bot.private import make_private_dirs, replace_durably

log = logging.getLogger(__name__)

FILE = "provenance.json"
HEARTBEAT_FILE = "HEARTBEAT.md"
_VERSION = 1
Stamp = tuple[int, int, int, int]
Stamps = dict[str, Stamp]


def watched_stamps(workspace: Path) -> Stamps:
    """The status of every watched file now (HEARTBEAT.md, skills/*/SKILL.md); links and
    missing files are left out. A few stat calls."""
    out: Stamps = {}
    st = workspace_files.file_stat(workspace, HEARTBEAT_FILE)
    if st is not None:
        out[HEARTBEAT_FILE] = _stamp(st)
    for rel, st in workspace_files.files_matching(workspace, "skills", "SKILL.md"):
        out[rel] = _stamp(st)
    return out


def _stamp(st: os.stat_result) -> Stamp:
    # The writer sets mtime (touch -d), size and, writing in place, keeps the inode; nobody
    # sets ctime, and any write or touch moves it (so the owner's touch trusts a file).
    return (st.st_mtime_ns, st.st_size, st.st_ino, st.st_ctime_ns)


def turn_is_trusted(msg: InboundMessage) -> bool:
    """Whether what this turn writes may later run with the owner's rights: an admin's turn
    in a private chat (a group's turn carries the other members' words), or an unattended
    turn that was itself trusted."""
    return msg.sender.is_admin and not msg.sender.is_group


@dataclass(frozen=True, slots=True)
class Writer:
    """Who wrote the version of a file that is on disk now."""

    by: str
    trusted: bool


_LOCKS: dict[Path, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


def _lock_for(path: Path) -> threading.Lock:
    with _LOCKS_GUARD:
        return _LOCKS.setdefault(path.absolute(), threading.Lock())


class Provenance:
    """The record of who last wrote each watched file (one per state folder)."""

    def __init__(self, state_dir: Path, workspace: Path) -> None:
        self.path = state_dir / FILE
        self.workspace = workspace
        # Turns record from worker threads, Dream from its own: one lock per record file, so
        # two instances never lose each other's read-modify-write.
        self._lock = _lock_for(self.path)
        self._open_sessions: set[str] | None = None

    def _read(self) -> dict[str, Any]:
        """The whole record; {"*": ...} in ``files`` when it cannot be read (fail closed)."""
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {"files": {}, "open": {}}
        except (OSError, ValueError) as exc:
            log.error(
                "provenance: %s cannot be read (%s); unattended runs are narrowed", self.path, exc
            )
            return {"files": {"*": {"by": "unknown", "trusted": False}}, "open": {}}
        if not isinstance(data, dict):
            return {"files": {"*": {"by": "unknown", "trusted": False}}, "open": {}}
        files = data.get("files") if isinstance(data.get("files"), dict) else {}
        opened = data.get("open") if isinstance(data.get("open"), dict) else {}
        return {"files": files, "open": opened}

    def _write(self, files: dict[str, Any], opened: dict[str, Any]) -> None:
        make_private_dirs(self.path.parent)
        data = {"version": _VERSION, "files": files, "open": opened}
        replace_durably(self.path, json.dumps(data, indent=1))

    def has_open(self, by: str) -> bool:
        """Whether ``by`` has a turn opened and not yet recorded (asked when a turn ends
        without a tool phase: a turn resumed after a crash); read from disk once."""
        if self._open_sessions is None:
            with self._lock:
                self._open_sessions = set(self._read()["open"])
        return by in self._open_sessions

    def open_turn(self, before: Stamps, by: str) -> None:
        """Before the first tool of an untrusted turn runs: until that turn's :meth:`record`,
        every watched file that differs from ``before`` counts as ``by``'s (also for other
        turns and the heartbeat meanwhile, and after a crash until the resumed turn ends)."""
        with self._lock:
            data = self._read()
            if by in data["open"]:
                return  # a resumed turn keeps the stamps from before its first tool
            data["open"][by] = {"before": {k: list(v) for k, v in before.items()}, "at": _now()}
            self._write(data["files"], data["open"])
            self._open_sessions = set(data["open"])

    def record(self, before: Stamps, after: Stamps, by: str, trusted: bool) -> list[str]:
        """Note every watched file whose status moved between ``before`` and ``after`` as
        written by ``by`` (from the stamps :meth:`open_turn` kept, when it did), and close
        ``by``'s open turn. A trusted turn never clears what an untrusted one wrote in the
        same version (two turns at once both saw the change). Returns the files recorded."""
        with self._lock:
            data = self._read()
            files, opened = data["files"], data["open"]
            kept = opened.pop(by, None)
            if kept is not None:
                before = {k: tuple(v) for k, v in (kept.get("before") or {}).items()}
            changed = [rel for rel, stamp in after.items() if before.get(rel) != stamp]
            if not changed and kept is None:
                return []
            files.pop("*", None)
            for rel in changed:
                old = files.get(rel)
                same = old is not None and tuple(old.get("stamp") or ()) == after[rel]
                if trusted and same and not old.get("trusted", False):
                    continue
                files[rel] = {
                    "stamp": list(after[rel]),
                    "by": by,
                    "trusted": trusted,
                    "at": _now(),
                }
            for rel in [r for r in files if r not in after and r in before]:
                del files[rel]  # removed by the turn: nothing left to run
            self._write(files, opened)
            self._open_sessions = set(opened)
        for rel in changed:
            level = logging.INFO if trusted else logging.WARNING
            log.log(level, "provenance: %r written session=%s trusted=%s", rel, by, trusted)
        return changed

    def carry(self, rel: str, writer: Writer | None) -> None:
        """``rel``, just put back as it was, is again ``writer``'s (None: written outside any
        recorded turn, the owner's own), at its status now."""
        with self._lock:
            data = self._read()
            files = data["files"]
            if "*" in files:
                return  # unreadable: everything stays untrusted
            now = watched_stamps(self.workspace).get(rel)
            old = files.get(rel)
            if (
                old is not None
                and not old.get("trusted", False)
                and now is not None
                and tuple(old.get("stamp") or ()) == now
            ):
                return  # a non-admin's turn wrote and recorded this very version since
            if writer is None or now is None:
                files.pop(rel, None)
            else:
                files[rel] = {"stamp": list(now), "by": writer.by, "trusted": writer.trusted}
                files[rel]["at"] = _now()
            self._write(files, data["open"])

    def writer(self, rel: str) -> Writer | None:
        """Who wrote the version of ``rel`` on disk now, when a turn did; None when it was
        written outside any recorded turn (the owner's own edit) or is absent."""
        with self._lock:
            data = self._read()
        files = data["files"]
        if "*" in files:
            return Writer("unknown (provenance.json unreadable)", False)
        now = watched_stamps(self.workspace).get(rel)
        shaping = _open_writer(data["open"], rel, now)
        if shaping is not None:
            return Writer(shaping, False)
        record = files.get(rel)
        if record is None or now is None or tuple(record.get("stamp") or ()) != now:
            return None
        return Writer(str(record.get("by", "")), bool(record.get("trusted", False)))

    def untrusted(self, rel: str) -> str | None:
        """The session that shaped ``rel`` as it is now, when that was not an admin's."""
        found = self.writer(rel)
        return None if found is None or found.trusted else found.by

    def stamp(self) -> tuple[int, int, int]:
        """The record's own status: it changes whenever a turn records a write."""
        try:
            st = self.path.stat()
        except OSError:
            return (0, 0, 0)
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def untrusted_now(self) -> dict[str, str]:
        """Every watched file whose version on disk a non-admin's turn wrote (or may be
        writing: an open turn): rel -> session."""
        with self._lock:
            data = self._read()
        files = data["files"]
        now = watched_stamps(self.workspace)
        if "*" in files:
            return dict.fromkeys(now, "unknown (provenance.json unreadable)")
        out = {
            rel: str(record.get("by", ""))
            for rel, record in files.items()
            if not record.get("trusted", False)
            and rel in now
            and tuple(record.get("stamp") or ()) == now[rel]
        }
        for rel, stamp in now.items():
            shaping = _open_writer(data["open"], rel, stamp)
            if shaping is not None:
                out[rel] = shaping
        return out


def _open_writer(opened: dict[str, Any], rel: str, now: Stamp | None) -> str | None:
    """The untrusted turn still open whose stamps from before its first tool differ from
    ``rel``'s now (it may have written it), or None."""
    if now is None:
        return None
    for by, entry in opened.items():
        before = (entry.get("before") or {}).get(rel) if isinstance(entry, dict) else None
        if before is None or tuple(before) != now:
            return str(by)
    return None


def _now() -> str:
    from datetime import UTC, datetime

    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
