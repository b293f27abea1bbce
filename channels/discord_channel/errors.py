"""Discord's refusals in our error vocabulary: discord.py's exception read into a ``Refusal``
and classified by the one ``channels.errors.classify`` (Discord needs no codes of its own:
its HTTP statuses say it all)."""

from __future__ import annotations

import aiohttp
import discord

from channels.errors import (
    UNAUTHORIZED,
    ErrorTable,
    FatalChannelError,
    Refusal,
    SendError,
    classify,
)


def _retry_after(exc: discord.HTTPException) -> float:
    header = exc.response.headers.get("Retry-After") if exc.response is not None else None
    try:
        return float(header) if header else 1.0
    except ValueError:
        return 1.0


def map_send_error(exc: BaseException, method: str) -> SendError | FatalChannelError | None:
    """Our error class for a failed Discord REST call ``method`` (the API's name, "Create
    Message"), or None for an exception we do not know."""
    found = refusal(exc, method)
    return None if found is None else classify(found, ERRORS)


def refusal(exc: BaseException, method: str) -> Refusal | None:
    """What Discord answered to ``method``; None for an exception that is not an answer."""
    if isinstance(exc, discord.RateLimited):
        return Refusal(method, f"rate limited for {exc.retry_after:g} s", 429, "", exc.retry_after)
    if isinstance(exc, discord.LoginFailure):
        return Refusal(method, f"discord refused the token: {exc}", UNAUTHORIZED, login=True)
    if isinstance(exc, discord.HTTPException):
        detail = f"discord answered {exc.status}: {exc.text or exc}"
        wait = _retry_after(exc) if exc.status == 429 else None
        # A 404 is the channel or the message, never the token; 403 is Forbidden.
        return Refusal(method, detail, exc.status, str(exc.code), wait)
    if isinstance(exc, aiohttp.ClientError | TimeoutError | ConnectionError):
        return Refusal(method, f"discord unreachable: {exc!r}", unreachable=True)
    return None


ERRORS = ErrorTable("{detail}")
