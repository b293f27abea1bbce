"""One error vocabulary for every platform: what a failed send means for a retry.

Each channel maps its SDK's exceptions to these four classes; the channel manager has one
retry policy that acts on them.
"""

from __future__ import annotations


class SendError(Exception):
    """Base class. ``str()`` is a short description for the log."""


class RetryAfter(SendError):
    """The platform asked us to wait (HTTP 429, flood control) before sending to this chat."""

    def __init__(self, seconds: float, detail: str = "") -> None:
        super().__init__(detail or f"rate limited, retry after {seconds:g} s")
        self.seconds = max(0.0, float(seconds))


class TransientError(SendError):
    """Network trouble or a 5xx: the same send may work in a moment."""


class PermanentError(SendError):
    """The platform refused this message for good (chat gone, bot blocked, bad request)."""


class FormattingRejected(PermanentError):
    """The platform could not parse our markup; the same text goes again as plain text."""


class FatalChannelError(Exception):
    """The channel cannot work at all (token rejected): stop it and say so; do not retry."""
