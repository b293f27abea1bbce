"""Sending within the platforms' rate limits: token buckets, pure (the time is passed in).

A bucket holds up to ``burst`` tokens and gains ``messages / per_seconds`` tokens a second;
each send takes one. ``reserve`` never refuses: it takes the token now (the level may go
negative, a debt) and says how long to wait before sending, so callers that reserve in turn
are served in turn and the sends, spread as told, never pass the rate. With ``burst`` 1 no
window of ``per_seconds`` holds more than ``messages`` sends.

``Pacer`` keeps the buckets of one channel by key ("bot", "chat:123", ...); the channel says
which buckets a send to a chat draws from (``Channel.pace_limits``) and the channel manager
waits them out one after another in that chat's own worker, so a wait in one chat never holds
another chat's sends except through a bucket they share.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bot.config_base import RateLimitConfig

SWEEP_EVERY = 1024  # reservations between sweeps of idle (full) buckets out of a Pacer


@dataclass(frozen=True, slots=True)
class Limit:
    """One bucket a send draws from: ``messages`` per ``per_seconds``, up to ``burst`` at once.

    ``shared``: the bucket is the whole bot's, not one chat's; a "retry after" in one chat
    does not hold it.
    """

    key: str
    messages: float
    per_seconds: float
    burst: int = 1
    shared: bool = False

    @classmethod
    def of(cls, key: str, config: RateLimitConfig, shared: bool = False) -> Limit:
        return cls(key, config.messages, config.per_seconds, config.burst, shared)


class TokenBucket:
    """A token bucket over a clock the caller passes in (seconds, monotonic)."""

    __slots__ = ("burst", "level", "rate", "updated")

    def __init__(self, messages: float, per_seconds: float, burst: int, now: float) -> None:
        if messages <= 0 or per_seconds <= 0 or burst < 1:
            raise ValueError("a rate limit needs messages > 0, per_seconds > 0 and burst >= 1")
        self.rate = messages / per_seconds  # tokens a second
        self.burst = float(burst)
        self.level = self.burst
        self.updated = now

    def _refill(self, now: float) -> float:
        # A reservation or a hold may have moved ``updated`` into the future: time never
        # runs backwards for the bucket, so an early caller is served after it, not before.
        now = max(now, self.updated)
        self.level = min(self.burst, self.level + (now - self.updated) * self.rate)
        self.updated = now
        return now

    def reserve(self, now: float) -> float:
        """Take one token; return the seconds from ``now`` until the send may go (>= 0)."""
        at = self._refill(now)
        self.level -= 1.0
        wait = 0.0 if self.level >= 0 else -self.level / self.rate
        return at - now + wait

    def ready_in(self, now: float, keep: float = 0.0) -> float:
        """Seconds from ``now`` until a token can be taken without debt and with ``keep``
        tokens left after it (0: now)."""
        at = self._refill(now)
        need = 1.0 + keep
        short = 0.0 if self.level >= need else (need - self.level) / self.rate
        return at - now + short

    def hold(self, until: float) -> None:
        """Nothing before ``until``, then one send and the steady rate (no burst): after a
        platform's "retry after", what waited behind is paced rather than let out at once."""
        self.updated = max(self.updated, until)
        self.level = 1.0

    def idle(self, now: float) -> bool:
        """Full again at ``now``: forgetting the bucket changes nothing."""
        return now >= self.updated and self.level + (now - self.updated) * self.rate >= self.burst


def _kept(limit: Limit) -> float:
    """The tokens a skippable send leaves in ``limit``'s bucket."""
    return 1.0 if limit.burst > 1 else 0.0


class Pacer:
    """The buckets of one channel, by key; buckets left full are forgotten now and then."""

    def __init__(self) -> None:
        self.buckets: dict[str, TokenBucket] = {}
        self._since_sweep = 0

    def bucket(self, limit: Limit, now: float) -> TokenBucket:
        bucket = self.buckets.get(limit.key)
        if bucket is None:
            bucket = TokenBucket(limit.messages, limit.per_seconds, limit.burst, now)
            self.buckets[limit.key] = bucket
        return bucket

    def reserve(self, limit: Limit, now: float) -> float:
        """Take a token from ``limit``'s bucket; seconds to wait before sending."""
        self._since_sweep += 1
        if self._since_sweep >= SWEEP_EVERY:
            self._since_sweep = 0
            self.buckets = {k: b for k, b in self.buckets.items() if not b.idle(now)}
        return self.bucket(limit, now).reserve(now)

    def take_if_ready(self, limits: Sequence[Limit], now: float) -> float:
        """For sends that may be skipped (stream previews): take a token from every bucket of
        ``limits`` if each has one now and return 0; else take nothing and return the seconds
        until they might. Never goes into debt, so a waiting answer is never pushed back; and
        never takes the last token of a bucket that holds more than one, so the answer that
        ends a stream finds a token there (a group's 20 a minute refill one every 3 s: a
        preview taking the last one made the final edit wait for the next)."""
        wait = max(
            (self.bucket(limit, now).ready_in(now, _kept(limit)) for limit in limits),
            default=0.0,
        )
        if wait > 0:
            return wait
        for limit in limits:
            self.bucket(limit, now).reserve(now)
        return 0.0

    def hold(self, limits: Sequence[Limit], until: float, now: float) -> None:
        """A "retry after" in a chat: its own buckets (not the shared ones) wait ``until``."""
        for limit in limits:
            if not limit.shared:
                self.bucket(limit, now).hold(until)
