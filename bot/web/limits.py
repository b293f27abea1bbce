"""Login attempts per client address: at most ``attempts`` in ``per_seconds`` (a sliding
window); a flood is told when to come back (HTTP 429, Retry-After)."""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable

LOGIN_ATTEMPTS = 10
LOGIN_WINDOW_SECONDS = 60.0
# Wrong API keys from one address (bot.web.api): a key is a long random string, but one a
# person made up may be guessed; past these, every request from there waits (429).
WRONG_KEYS = 20
WRONG_KEYS_WINDOW_SECONDS = 60.0
MAX_TRACKED = 10_000  # addresses remembered at once
# A connection with no request under way (one that never sends a whole request, a slowloris,
# included) is closed after this long: aiohttp's default is an hour, and a stranger who can
# reach the server held a file descriptor for that long per connection (1024 is the usual
# limit of the whole process).
IDLE_SECONDS = 75.0


class AttemptLimiter:
    def __init__(
        self,
        attempts: int = LOGIN_ATTEMPTS,
        per_seconds: float = LOGIN_WINDOW_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.attempts = attempts
        self.per_seconds = per_seconds
        self.clock = clock
        self._seen: dict[str, deque[float]] = {}

    def attempt(self, who: str) -> int | None:
        """Count one attempt from ``who``; None when it may go ahead, else the whole seconds
        to wait (the refused attempt is not counted)."""
        now = self.clock()
        times = self._seen.get(who)
        if times is None:
            if len(self._seen) >= MAX_TRACKED:
                self._forget(now)
            times = self._seen[who] = deque()
        while times and now - times[0] >= self.per_seconds:
            times.popleft()
        if len(times) >= self.attempts:
            return max(1, math.ceil(self.per_seconds - (now - times[0])))
        times.append(now)
        return None

    def waiting(self, who: str) -> int | None:
        """The whole seconds ``who`` must wait before an attempt, as :meth:`attempt` would
        say, without counting one (None: it may go ahead)."""
        times = self._seen.get(who)
        if times is None:
            return None
        now = self.clock()
        while times and now - times[0] >= self.per_seconds:
            times.popleft()
        if len(times) >= self.attempts:
            return max(1, math.ceil(self.per_seconds - (now - times[0])))
        return None

    def _forget(self, now: float) -> None:
        self._seen = {k: t for k, t in self._seen.items() if t and now - t[-1] < self.per_seconds}
        if len(self._seen) >= MAX_TRACKED:  # a flood from many addresses: start over
            self._seen.clear()
