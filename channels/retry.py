"""The channel manager's retry policy, pure: the time is passed in.

A send is tried again only where trying again can help, and never holds its chat for long:

* the platform asked us to wait (``RetryAfter``): wait that long; such waits are the
  platform's, so they do not count against the hold;
* network trouble or a 5xx (``TransientError``): back off (x1.5 from 1 s, up to 30 s) for at
  most ``hold_seconds`` (60 s) of the chat's time, then give up on this attempt
  (``TimeoutError``): the answer stays in the delivery ledger and the chat's queue moves on;
* anything outside our vocabulary (an ``AttributeError`` when an edit answers
  ``result: null``): a programming-level failure, not a blip. Tried ``unexpected_tries``
  times in all, then ``UnexpectedError``, which ends the piece like a permanent refusal.

``Clock`` is where the manager reads the time and sleeps while retrying, so tests run the
policy on a virtual clock.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Protocol

from channels.errors import RetryAfter, SendError, UnexpectedError

RETRY_HOLD_SECONDS = 60.0
UNEXPECTED_TRIES = 3
BACKOFF_START, BACKOFF_FACTOR, BACKOFF_MAX = 1.0, 1.5, 30.0
RETRY_AFTER_MARGIN = 0.1  # on top of the platform's retry_after (it rounds down)


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
