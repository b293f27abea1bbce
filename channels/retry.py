"""The channel manager's retry policy and circuit breaker, pure: the time is passed in.

A send is tried again only where trying again can help, and never holds its chat for long:

* the platform asked us to wait (``RetryAfter``): wait that long; such waits are the
  platform's, so they do not count against the hold;
* network trouble or a 5xx (``TransientError``): back off (x1.5 from 1 s, up to 30 s) for at
  most ``hold_seconds`` (60 s) of the chat's time, then give up on this attempt
  (``TimeoutError``): the answer stays in the delivery ledger and the chat's queue moves on;
* anything outside our vocabulary (an ``AttributeError`` when an edit answers
  ``result: null``): a programming-level failure, not a blip. Tried ``unexpected_tries``
  times in all, then ``UnexpectedError``, which ends the piece like a permanent refusal.

Previews are ephemeral and never retried; ``Breaker`` switches a chat's previews off for
``cool_down`` seconds once they failed ``threshold`` times in a row, so a method that keeps
failing (sendMessageDraft answering 500) costs a few calls per answer, not one a second.

``Clock`` is where the manager reads the time and sleeps while retrying, so tests run the
policy on a virtual clock.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Protocol

from channels.errors import FatalChannelError, RetryAfter, SendError, UnexpectedError

RETRY_HOLD_SECONDS = 60.0
UNEXPECTED_TRIES = 3
BACKOFF_START, BACKOFF_FACTOR, BACKOFF_MAX = 1.0, 1.5, 30.0
RETRY_AFTER_MARGIN = 0.1  # on top of the platform's retry_after (it rounds down)
BREAKER_THRESHOLD = 3  # preview failures in a row that switch a chat's previews off
BREAKER_COOL_DOWN_SECONDS = 300.0
BREAKERS_KEPT = 1024  # chats whose preview failures are remembered (oldest forgotten)


class Clock(Protocol):
    def now(self) -> float: ...
    async def sleep(self, seconds: float) -> None: ...


class MonotonicClock:
    """The real one: ``time.monotonic`` and ``asyncio.sleep``."""

    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How long one piece may hold its chat retrying, and how often an unknown failure is
    tried; see the module docstring."""

    hold_seconds: float = RETRY_HOLD_SECONDS
    unexpected_tries: int = UNEXPECTED_TRIES
    backoff_start: float = BACKOFF_START
    backoff_factor: float = BACKOFF_FACTOR
    backoff_max: float = BACKOFF_MAX


class Retries:
    """The retries of one send under ``policy``, begun at ``now``."""

    __slots__ = ("backoff", "deadline", "policy", "unexpected")

    def __init__(self, policy: RetryPolicy, now: float) -> None:
        self.policy = policy
        self.deadline = now + policy.hold_seconds
        self.backoff = policy.backoff_start
        self.unexpected = 0

    def wait_after(self, exc: Exception, now: float) -> float:
        """Seconds to wait before trying again after ``exc`` failed the send at ``now``.

        Raises ``UnexpectedError`` (from ``exc``) once an exception outside our vocabulary
        failed ``unexpected_tries`` sends, and ``TimeoutError`` when the wait would pass
        the hold. Only for errors worth retrying: the caller raises permanent ones itself.
        """
        if isinstance(exc, RetryAfter):
            wait = exc.seconds + RETRY_AFTER_MARGIN
            self.deadline += wait  # the platform's own wait: not ours to cut short
            return wait
        if not isinstance(exc, SendError):
            self.unexpected += 1
            if self.unexpected >= self.policy.unexpected_tries:
                raise UnexpectedError(
                    f"{type(exc).__name__}: {exc} ({self.unexpected} tries)"
                ) from exc
        wait = self.backoff
        self.backoff = min(self.policy.backoff_max, self.backoff * self.policy.backoff_factor)
        if now + wait > self.deadline:
            raise TimeoutError(f"gave up after {self.policy.hold_seconds:.0f} s of retries")
        return wait


class Breaker:
    """Per key (a chat): after ``threshold`` failures in a row, open (calls refused) for
    ``cool_down`` seconds; then one call may try again, and its failure opens it again."""

    def __init__(
        self,
        threshold: int = BREAKER_THRESHOLD,
        cool_down: float = BREAKER_COOL_DOWN_SECONDS,
        kept: int = BREAKERS_KEPT,
    ) -> None:
        self.threshold = threshold
        self.cool_down = cool_down
        self.kept = kept
        # key -> (failures in a row, open until); only keys with a failure are kept
        self._keys: OrderedDict[Hashable, tuple[int, float]] = OrderedDict()

    def allows(self, key: Hashable, now: float) -> bool:
        failures, until = self._keys.get(key, (0, 0.0))
        return failures < self.threshold or now >= until

    def failed(self, key: Hashable, now: float) -> bool:
        """Count a failure; True when it opened the breaker (say so once)."""
        failures = self._keys.pop(key, (0, 0.0))[0] + 1
        opened = failures >= self.threshold
        self._keys[key] = (failures, now + self.cool_down if opened else 0.0)
        while len(self._keys) > self.kept:
            self._keys.popitem(last=False)
        return opened

    def succeeded(self, key: Hashable) -> None:
        self._keys.pop(key, None)


class Reconnect:
    """The waits of one transport's reconnect loop (a channel's connection, an MCP server),
    after python-telegram-bot's network loop: on flood control wait ``retry_after`` plus a
    little; on a timeout try again at once; on a refused token stop (``FatalChannelError``:
    ``wait_after`` answers None, the caller says so and ends its loop); on anything else back
    off, x1.5 from ``start`` up to ``maximum``. ``succeeded`` starts the backoff afresh.

    ``clock`` sleeps (tests pass a virtual one, so no test waits in real time).
    """

    __slots__ = ("backoff", "clock", "factor", "maximum", "start", "timeouts_at_once")

    def __init__(
        self,
        clock: Clock | None = None,
        start: float = BACKOFF_START,
        factor: float = BACKOFF_FACTOR,
        maximum: float = BACKOFF_MAX,
        *,
        timeouts_at_once: bool = True,
    ) -> None:
        """``timeouts_at_once`` False: a timeout backs off like any failure (an MCP server
        whose connect timed out stays "failed" in status for the wait, as any failure)."""
        self.clock: Clock = clock if clock is not None else MonotonicClock()
        self.start, self.factor, self.maximum = start, factor, maximum
        self.timeouts_at_once = timeouts_at_once
        self.backoff = start

    def wait_after(self, exc: BaseException) -> float | None:
        """Seconds to wait before the next attempt after ``exc``; None: stop for good."""
        if isinstance(exc, FatalChannelError):
            return None
        if isinstance(exc, RetryAfter):
            return exc.seconds + RETRY_AFTER_MARGIN
        if isinstance(exc, TimeoutError) and self.timeouts_at_once:
            return 0.0
        wait = self.backoff
        self.backoff = min(self.maximum, self.backoff * self.factor)
        return wait

    async def pause(self, exc: BaseException) -> bool:
        """Wait as ``wait_after`` says; False (at once) when the loop must stop."""
        wait = self.wait_after(exc)
        if wait is None:
            return False
        await self.clock.sleep(wait)
        return True

    def succeeded(self) -> None:
        self.backoff = self.start
