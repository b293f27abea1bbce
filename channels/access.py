"""allowFrom and admins: who may talk to the bot, decided before anything reaches the bus."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

log = logging.getLogger(__name__)

DENIAL_LOG_INTERVAL = 3600.0  # one log line per denied sender per hour


class AccessPolicy:
    """A channel's allowFrom list. Empty denies everyone; ``"*"`` allows everyone."""

    def __init__(
        self, channel: str, allow_from: Iterable[str], admins: Iterable[str] | None = None
    ) -> None:
        self.channel = channel
        self.allow = frozenset(allow_from)
        self.admins = frozenset(self.allow if admins is None else admins)
        self.open = "*" in self.allow
        self._denied_logged: dict[str, float] = {}

    def log_startup(self) -> None:
        if self.open:
            log.warning(
                'channel %s: allowFrom contains "*": ANYONE who finds the bot can use it '
                "(and its tools)",
                self.channel,
            )
        elif not self.allow:
            log.warning(
                "channel %s: allowFrom is empty, so every sender is refused; denied senders' "
                "ids are logged so you can add them",
                self.channel,
            )

    def allowed(self, *ids: str | None) -> bool:
        """True when any of the sender's stable ids is listed (or the list has "*")."""
        return self.open or any(i is not None and str(i) in self.allow for i in ids)

    def is_admin(self, sender_id: str) -> bool:
        return "*" in self.admins or sender_id in self.admins

    def deny(self, sender_id: str, name: str = "", now: float | None = None) -> bool:
        """Record a refused sender; logs at most once per sender per hour. True if logged."""
        now = time.monotonic() if now is None else now
        last = self._denied_logged.get(sender_id)
        if last is not None and now - last < DENIAL_LOG_INTERVAL:
            return False
        self._denied_logged[sender_id] = now
        log.warning(
            "channel %s: message from %s%s refused: not in allowFrom. To let them in, add "
            '"%s" to channels.%s.allowFrom',
            self.channel,
            sender_id,
            f" ({name})" if name else "",
            sender_id,
            self.channel,
        )
        return True


def whoami_text(channel: str, sender_id: str, allowed: bool) -> str:
    state = "allowed" if allowed else f"not allowed (add it to channels.{channel}.allowFrom)"
    return f"Your {channel} user id is {sender_id}. You are {state}."
