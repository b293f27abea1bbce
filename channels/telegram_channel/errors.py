"""Telegram's refusals in our error vocabulary: python-telegram-bot's exception read into a
``Refusal`` (what the Bot API answered), classified by the one ``channels.errors.classify``
with Telegram's table of words."""

from __future__ import annotations

import datetime as dt
import re
import warnings
from typing import Any

from telegram.error import (
    BadRequest,
    ChatMigrated,
    Conflict,
    Forbidden,
    InvalidToken,
    NetworkError,
    TelegramError,
)
from telegram.error import RetryAfter as PTBRetryAfter
from telegram.warnings import PTBDeprecationWarning

from channels.errors import (
    NOT_FOUND,
    UNAUTHORIZED,
    ErrorTable,
    FatalChannelError,
    Refusal,
    RetryAfter,
    SendError,
    classify,
)

TOKEN_REJECTED = (
    "Telegram rejected the bot token (401/404): check channels.telegram.token (and baseUrl if "
    "set); polling stopped"
)
# Methods newer than some Bot API servers (a self-hosted telegram-bot-api is as old as its
# build): method -> (feature, what serves instead while it is off).
OPTIONAL_METHODS = {
    "sendMessageDraft": ("drafts", "answers are shown as a message edited while written"),
}
_OPTIONAL_FEATURES = {method: feature for method, (feature, _) in OPTIONAL_METHODS.items()}
_UNKNOWN_METHOD = re.compile(r"method not found|unknown method", re.I)


def send_error(exc: TelegramError, method: str) -> SendError | FatalChannelError:
    """Map one python-telegram-bot exception, raised by Bot API ``method`` (not getMe or
    getUpdates: those decide about the token themselves), to our error vocabulary."""
    return classify(refusal(exc, method), ERRORS)


def refusal(exc: TelegramError, method: str) -> Refusal:
    """What Telegram answered, as the Bot API said it (PTB keeps only the description)."""
    words = exc.message
    if isinstance(exc, PTBRetryAfter):
        return Refusal(method, words, 429, retry_after=retry_seconds(exc))
    if isinstance(exc, InvalidToken):
        # PTB raises it for a 401 and for every 404 (its message is the answer's description,
        # or "Not Found (404)"), and a Bot API server answers 404 "Not Found: method not
        # found" to a method it does not know: only a 401 ("Unauthorized", Telegram's words
        # and PTB's) or a message naming the token is the token. Any other wording is not:
        # the poll's getUpdates, which decides about the token, fails the channel if it is.
        refused = words.lower().startswith("unauthorized") or "token" in words.lower()
        return Refusal(method, words, UNAUTHORIZED if refused else NOT_FOUND, words)
    if isinstance(exc, ChatMigrated):
        return Refusal(method, f"the group became supergroup {exc.new_chat_id}", 400)
    if isinstance(exc, BadRequest):  # before NetworkError: PTB derives BadRequest from it
        return Refusal(method, words, 400, words)
    if isinstance(exc, Forbidden):
        return Refusal(method, words, 403, words)
    if isinstance(exc, NetworkError | Conflict):
        return Refusal(method, words, unreachable=True)
    # No code to read: never taken for a length or formatting refusal (that would re-send).
    return Refusal(method, words)


ERRORS = ErrorTable(
    TOKEN_REJECTED,
    optional=_OPTIONAL_FEATURES,
    unknown_method=lambda words: bool(_UNKNOWN_METHOD.search(words)),
    # "message is too long", "message caption is too long"
    too_long=lambda words: "too long" in words.lower(),
    formatting=lambda words: "can't parse entities" in words.lower(),
)


def retry_seconds(exc: PTBRetryAfter) -> float:
    """``retry_after`` is an int today and a timedelta in a future PTB; accept both."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PTBDeprecationWarning)  # the int -> timedelta notice
        wait: Any = exc.retry_after
    return wait.total_seconds() if isinstance(wait, dt.timedelta) else float(wait)


def flood(exc: PTBRetryAfter) -> RetryAfter:
    return RetryAfter(retry_seconds(exc))
