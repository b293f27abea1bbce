"""One error vocabulary for every platform: what a failed send means for a retry.

Each channel maps its SDK's exceptions to these classes; the channel manager has one
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


class TooLong(PermanentError):
    """The platform measured the piece as over its limit; it goes again split smaller
    (``Channel.resplit``), never dropped."""


class FatalChannelError(Exception):
    """The channel cannot work at all (token rejected, intents refused): stop it and say so;
    do not retry.

    ``str()`` is one line telling the owner what to fix (``memobot status``, ``doctor``, and
    the gateway's exit message when every channel failed). A channel reports it with
    ``Channel.fail`` or by raising it from ``start`` or ``send_chunk``.
    """
