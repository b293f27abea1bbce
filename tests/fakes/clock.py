"""A virtual clock for code that takes a ``channels.retry.Clock``: time stands still while
anything can run, and jumps to the next sleeper's wake-up time as soon as nothing can.

So a test of pacing or streaming runs as fast as the code does, and reads exact times: a
send paced to 0.1 s happens at 0.1 on this clock, never at 0.1 plus a loop stall. It is for
in-memory set-ups (fake channels, fake ledgers): a wait on real I/O looks idle to it, and
time would jump while a socket or a thread works.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools


class FakeClock:
    """``now()`` in virtual seconds from ``start``; ``sleep(s)`` returns when the clock
    reaches ``now() + s``. Times of every sleep are kept in ``slept``."""

    def __init__(self, start: float = 0.0) -> None:
        self.t = start
        self.slept: list[float] = []
        self._timers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()
        self._mover: asyncio.Task[None] | None = None

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        loop = asyncio.get_running_loop()
        woken: asyncio.Future[None] = loop.create_future()
        heapq.heappush(self._timers, (self.t + seconds, next(self._order), woken))
        if self._mover is None or self._mover.done():
            self._mover = loop.create_task(self._move())
        try:
            await woken
        finally:
            woken.cancel()  # a cancelled sleeper's timer is skipped when it comes up

    async def _move(self) -> None:
        loop = asyncio.get_running_loop()
        while self._timers:
            await asyncio.sleep(0)
            # Something besides this task can run (its callbacks are queued): not idle yet.
            # (The ready queue is asyncio's own; no public API says "idle".)
            if loop._ready:  # type: ignore[attr-defined]
                continue
            while self._timers and self._timers[0][2].done():
                heapq.heappop(self._timers)  # cancelled
            if not self._timers:
                return
            self.t = max(self.t, self._timers[0][0])
            while self._timers and self._timers[0][0] <= self.t:
                _, _, woken = heapq.heappop(self._timers)
                if not woken.done():
                    woken.set_result(None)
