"""One error vocabulary for every platform: what a failed send means for a retry.

Each platform turns its SDK's exception into a ``Refusal`` (a pure function, the only part
that knows the SDK) and hands it, with the platform's ``ErrorTable`` of codes, to the one
``classify`` here, which every platform shares (aiogram's ``check_response``). A channel's
``Channel.classify`` does that around every platform call (``Channel.calling``); the channel
manager has one retry policy that acts on the result (``channels.retry``). The rules shared
by every platform are here: only the login (Telegram getMe, Slack auth.test, Discord's
gateway login) says a token is bad at start; on any other call a 401 is a refused token,
and a 404 (or a refusal naming an unknown method) is the method or the chat, never the
token (``refused_call``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

UNAUTHORIZED, NOT_FOUND = 401, 404


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


class FeatureUnavailable(PermanentError):
    """The platform does not offer the method behind an optional feature (a self-hosted
    server older than the method, an app without it): the feature is switched off for the
    channel (``Channel.switch_off``) and what it served falls back. The token is fine."""

    def __init__(self, feature: str, method: str, detail: str) -> None:
        super().__init__(f"{method} refused: {detail}")
        self.feature = feature
        self.method = method


class AcceptedUnreadable(SendError):
    """The platform answered the call with success, but the SDK could not read the answer (a
    self-hosted server or a proxy answering in another shape): the call took effect. For a new
    message that means it is in the chat; sending it again would show it twice (DESIGN.md 11),
    so the one retry policy counts it as sent."""


class UnexpectedError(PermanentError):
    """A send kept failing with an exception outside this vocabulary (a bug in the SDK, an
    answer of a shape it cannot read): given up after a few tries, like a permanent refusal,
    so the chat's later answers are not held behind it."""


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


def refused_call(
    status: int, method: str, detail: str, optional: Mapping[str, str], token_refused: str
) -> SendError | FatalChannelError:
    """What a 401, a 404 or a refusal naming an unknown method means on ``method`` (any call
    but the login): 401 the token was refused (``FatalChannelError(token_refused)``);
    otherwise the method or its target is not there: a feature unavailable when
    ``optional`` (method -> feature) names the method, else a permanent refusal of this
    message (the chat or the message is gone)."""
    if status == UNAUTHORIZED:
        return FatalChannelError(token_refused)
    feature = optional.get(method)
    if feature is not None:
        return FeatureUnavailable(feature, method, detail)
    return PermanentError(f"{method}: {detail}")


def _never(code: str) -> bool:
    return False


@dataclass(frozen=True, slots=True)
class Refusal:
    """A platform's answer to one failed call, in terms every platform shares."""

    method: str  # the platform's name of the call
    detail: str  # for the log and the error's text: the platform's own words
    status: int | None = None  # HTTP status; None when there is none to tell
    code: str = ""  # the platform's error code, or its description where it has no codes
    retry_after: float | None = None  # flood control: the wait the platform asked for
    unreachable: bool = False  # no answer at all (network trouble, a timeout, a 409 poll)
    login: bool = False  # the call that checks the token (Slack's auth.test)


@dataclass(frozen=True, slots=True)
class ErrorTable:
    """One platform's words for the classes ``classify`` tells apart."""

    token_refused: str  # the FatalChannelError's text; "{detail}" becomes the refusal's
    optional: Mapping[str, str] = field(default_factory=dict)  # method -> feature
    fatal_codes: frozenset[str] = frozenset()  # a refused token, on any call
    login_fatal_codes: frozenset[str] = frozenset()  # a refused token on the login only
    transient_codes: frozenset[str] = frozenset()  # "try again" said with a 200
    unknown_method: Callable[[str], bool] = _never  # the code says the method is not there
    too_long: Callable[[str], bool] = _never
    formatting: Callable[[str], bool] = _never  # the platform could not parse our markup


def classify(refusal: Refusal, table: ErrorTable) -> SendError | FatalChannelError:
    """The class of ``refusal``, the same rules for every platform: flood control, then no
    answer (transient), a refused token, a method or target not there (``refused_call``),
    a server error, a piece too long or markup refused, and else a permanent refusal."""
    r, detail = refusal, refusal.detail
    if r.retry_after is not None:
        return RetryAfter(r.retry_after, detail)
    if r.unreachable:
        return TransientError(detail)
    if (
        r.status == UNAUTHORIZED
        or r.code in table.fatal_codes
        or (r.login and r.code in table.login_fatal_codes)
    ):
        return FatalChannelError(table.token_refused.replace("{detail}", detail))
    if r.status == NOT_FOUND or table.unknown_method(r.code):
        return refused_call(NOT_FOUND, r.method, detail, table.optional, "")
    if (r.status or 0) >= 500 or r.code in table.transient_codes:
        return TransientError(detail)
    if table.too_long(r.code):
        return TooLong(detail)
    if table.formatting(r.code):
        return FormattingRejected(detail)
    return PermanentError(detail)
