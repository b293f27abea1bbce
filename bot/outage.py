"""A model outage: turns wait for the model to come back instead of failing.

When every endpoint (``llm`` and ``llm.fallbacks``) stays unavailable, the loop does not answer
the turn with an error: the turn stays pending on disk, its chat gets one short notice, and the
turn waits here. A probe with backoff (at most ``llm.outage.probeMaxSeconds`` between tries)
notices the model's return; the waiting turns are then released oldest message first. A turn
that waited ``llm.outage.maxWaitMinutes`` is answered with the error after all.

What must survive a restart lives on the pending entry itself (``wait``: since when it waits,
and whether its chat was told), so a restart during an outage neither repeats the notice nor
restarts the clock.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

from bot.config import OutageConfig
from bot.wording import counted

log = logging.getLogger(__name__)

NOTICE_TEXT = "The model is not answering; I'll reply as soon as it is back."
FIRST_PROBE_SECONDS = 1.0

Probe = Callable[[], Awaitable[str | None]]


def wall_seconds(iso: str | None) -> float | None:
    """An ISO time written by ``now_iso`` as epoch seconds; None if missing or unreadable."""
    if not iso:
        return None
    try:
        return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class Outage:
    """The outage state shared by every turn: active or not, the probe, the waiting turns."""

    def __init__(self, probe: Probe, cfg: OutageConfig) -> None:
        self._probe = probe
        self.cfg = cfg
        self.since: float | None = None  # wall time the outage was noticed
        self.reason = ""
        self.rate_limited = False  # every model answered 429: a client may be told so
        self.retry_after: float | None = None  # what the last failure asked to wait, if it did
        self._probe_task: asyncio.Task[None] | None = None
        self._seq = itertools.count()
        # (arrival time, sequence, future): released oldest first when the model is back.
        self._waiters: list[tuple[float, int, asyncio.Future[None]]] = []
        self._waiting_keys: dict[str, int] = {}
        self.notified: set[str] = set()  # chats told during this outage (this process)

    @property
    def active(self) -> bool:
        return self.since is not None

    @property
    def waiting(self) -> int:
        """How many turns wait for the model now."""
        return sum(self._waiting_keys.values())

    def begin(
        self, reason: str, rate_limited: bool = False, retry_after: float | None = None
    ) -> None:
        """Every model failed: start (or continue) the outage and its probe."""
        self.reason = reason
        self.rate_limited, self.retry_after = rate_limited, retry_after
        if self.active:
            return
        self.since = time.time()
        log.error("model outage: every model failed; turns wait for one to answer: %s", reason)
        self._probe_task = asyncio.create_task(self._probe_until_back(), name="llm-probe")

    def end(self, answered_by: str) -> None:
        """A model answered: release the waiting turns, oldest message first."""
        if not self.active:
            return
        assert self.since is not None
        log.warning(
            "model outage over after %.0f s (%s answered); %d turn(s) resume",
            time.time() - self.since,
            answered_by,
            self.waiting,
        )
        self.since = None
        self.notified.clear()
        if self._probe_task is not None and self._probe_task is not asyncio.current_task():
            self._probe_task.cancel()
        self._probe_task = None
        while self._waiters:
            _, _, fut = heapq.heappop(self._waiters)
            if not fut.done():
                fut.set_result(None)

    async def wait(self, key: str, arrived: float, deadline: float) -> bool:
        """Wait until the model is back (True) or the wall-clock ``deadline`` passed (False).

        ``arrived`` (the message's arrival, wall seconds) orders the release. Cancellable.
        """
        if not self.active:
            return True
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (arrived, next(self._seq), fut))
        self._waiting_keys[key] = self._waiting_keys.get(key, 0) + 1
        try:
            async with asyncio.timeout(max(0.0, deadline - time.time())):
                await asyncio.shield(fut)
            return True
        except TimeoutError:
            return False
        finally:
            fut.cancel()  # a released turn's slot in the heap is skipped by end()
            self._waiting_keys[key] -= 1
            if not self._waiting_keys[key]:
                del self._waiting_keys[key]

    async def _probe_until_back(self) -> None:
        delay = min(FIRST_PROBE_SECONDS, self.cfg.probe_max_seconds)
        while True:
            await asyncio.sleep(delay)
            try:
                answered = await self._probe()
            except Exception:
                log.exception("model probe failed")
                answered = None
            if answered:
                self.end(answered)
                return
            delay = min(delay * 2, self.cfg.probe_max_seconds)

    async def close(self) -> None:
        if self._probe_task is not None:
            self._probe_task.cancel()
            await asyncio.gather(self._probe_task, return_exceptions=True)

    def describe(self) -> str:
        """One line for ``/status``, ``memobot status`` and the STATUS line; "" if none."""
        if self.since is None:
            return ""
        since = time.strftime("%H:%M:%S", time.localtime(self.since))
        n = self.waiting
        return f"model outage since {since}, {counted(n, 'turn')} waiting"

    def snapshot(self) -> dict[str, Any] | None:
        """For the gateway's status file."""
        if self.since is None:
            return None
        shown: dict[str, Any] = {
            "since": self.since,
            "waiting": self.waiting,
            "reason": self.reason[:300],
        }
        if self.rate_limited:
            shown["rateLimited"] = True
            if self.retry_after is not None:
                shown["retryAfter"] = self.retry_after
        return shown
