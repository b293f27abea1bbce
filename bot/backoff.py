"""Back-off for background work that keeps failing (issue 31): after a few failures in a row,
wait before the next try, doubling each time up to a cap, instead of paying for a failing
model call every tick. The admins are told once, when the waiting starts."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

FAILURES_BEFORE_BACKOFF = 3
FIRST_WAIT_SECONDS = 300.0
MAX_WAIT_SECONDS = 6 * 3600.0


@dataclass(slots=True)
class Backoff:
    """The failures in a row of one kind of work, and until when it waits. ``now``: the
    clock (monotonic seconds), a parameter so tests run on a fake one."""

    after: int = FAILURES_BEFORE_BACKOFF
    first: float = FIRST_WAIT_SECONDS
    cap: float = MAX_WAIT_SECONDS
    now: Callable[[], float] = time.monotonic
    failures: int = 0
    until: float = 0.0

    def ready(self) -> bool:
        """Whether the work may be tried now."""
        return self.now() >= self.until

    def wait_left(self) -> float:
        return max(0.0, self.until - self.now())

    def failed(self) -> bool:
        """Count a failure; True when this one starts the waiting (tell the admins now)."""
        self.failures += 1
        if self.failures < self.after:
            return False
        self.until = self.now() + self.delay()
        return self.failures == self.after

    def delay(self) -> float:
        """The wait after the current failure: ``first``, doubled per failure, capped."""
        # The exponent bounded: 2**1024 is past a float (eight months of failures at the cap).
        doublings = min(max(0, self.failures - self.after), 64)
        return min(self.cap, self.first * 2**doublings)

    def succeeded(self) -> None:
        self.failures = 0
        self.until = 0.0
