"""Logged-in browsers, in memory: a restart of the server logs everyone out. A session
expires after ``IDLE_SECONDS`` without a request; nothing sweeps them on a timer (a panel
nobody opens costs nothing), they are dropped when met or when a new one is made."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

IDLE_SECONDS = 12 * 3600.0
COOKIE = "memobot_session"
MAX_SESSIONS = 100


@dataclass(frozen=True, slots=True)
class Session:
    id: str
    csrf: str  # the hidden field every form of this session carries
    last_seen: float


class Sessions:
    def __init__(
        self, clock: Callable[[], float] = time.time, idle_seconds: float = IDLE_SECONDS
    ) -> None:
        self.clock = clock
        self.idle_seconds = idle_seconds
        self._by_id: dict[str, Session] = {}

    def create(self) -> Session:
        now = self.clock()
        self._by_id = {k: s for k, s in self._by_id.items() if not self._expired(s, now)}
        while len(self._by_id) >= MAX_SESSIONS:
            del self._by_id[min(self._by_id, key=lambda k: self._by_id[k].last_seen)]
        session = Session(secrets.token_urlsafe(32), secrets.token_urlsafe(32), now)
        self._by_id[session.id] = session
        return session

    def _expired(self, session: Session, now: float) -> bool:
        return now - session.last_seen > self.idle_seconds

    def touch(self, session_id: str | None) -> tuple[Session | None, bool]:
        """(the live session, False), or (None, True) when it existed and expired, or
        (None, False) when there is no such session."""
        found = self._by_id.get(session_id or "")
        if found is None:
            return None, False
        now = self.clock()
        if self._expired(found, now):
            del self._by_id[found.id]
            return None, True
        self._by_id[found.id] = found = replace(found, last_seen=now)
        return found, False

    def alive(self, session_id: str | None) -> bool:
        """Whether ``session_id`` is a live session, without counting this as its use (an
        open event stream must not keep a session alive, nor outlive it)."""
        found = self._by_id.get(session_id or "")
        return found is not None and not self._expired(found, self.clock())

    def drop(self, session_id: str) -> None:
        self._by_id.pop(session_id, None)

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._by_id
