"""Slack's refusals in our error vocabulary: a Web API answer (HTTP status, Slack's error
code, Retry-After) read into a ``Refusal`` and classified by the one
``channels.errors.classify`` with Slack's table of codes."""

from __future__ import annotations

from slack_sdk.errors import SlackApiError

from channels.errors import (
    ErrorTable,
    FatalChannelError,
    Refusal,
    SendError,
    classify,
)

NATIVE_STREAMS = "native streams"
OPTIONAL_METHODS = {
    "chat.startStream": (NATIVE_STREAMS, "answers stream by chat.postMessage and chat.update"),
}
# Token problems: retrying cannot help, the operator has to fix the config.
FATAL_API_ERRORS = frozenset(
    {"invalid_auth", "not_authed", "account_inactive", "token_revoked", "token_expired"}
)
# ... only when the login (auth.test) answers them: on any other call they are about that
# call (a method the token type may not use), workspace (an org app not granted it) or post
# (Enterprise Key Management suspended it), and the channel goes on.
LOGIN = "auth.test"
LOGIN_FATAL_API_ERRORS = frozenset(
    {"not_allowed_token_type", "team_access_not_granted", "ekm_access_denied"}
)
TRANSIENT_API_ERRORS = frozenset(
    {"internal_error", "fatal_error", "service_unavailable", "request_timeout"}
)


def map_api_error(
    status: int | None, error: str | None, retry_after: str | None = None, method: str = ""
) -> SendError | FatalChannelError:
    """Our error class for a failed Web API call ``method`` (``status`` HTTP, ``error``
    Slack's code). Slack answers a refused token with HTTP 200 and a code of its own (the
    FATAL_API_ERRORS; the LOGIN_FATAL_API_ERRORS too when ``method`` is the login), and a
    method it does not offer with ``unknown_method``."""
    detail = f"slack answered {status}: {error or 'no error code'}"
    wait = None
    if status == 429 or error == "ratelimited":
        try:
            wait = float(retry_after) if retry_after else 1.0
        except ValueError:
            wait = 1.0
    found = Refusal(
        method or "a Web API call", detail, status, error or "", wait, login=method == LOGIN
    )
    return classify(found, ERRORS)


ERRORS = ErrorTable(
    "{detail}: check channels.slack.botToken",
    optional={m: feature for m, (feature, _) in OPTIONAL_METHODS.items()},
    fatal_codes=FATAL_API_ERRORS,
    login_fatal_codes=LOGIN_FATAL_API_ERRORS,
    transient_codes=TRANSIENT_API_ERRORS,
    unknown_method=lambda code: code == "unknown_method",
    too_long=lambda code: code == "msg_too_long",
)


def api_error(exc: SlackApiError, method: str = "") -> SendError | FatalChannelError:
    response = exc.response
    headers = getattr(response, "headers", None) or {}
    # A body labelled JSON that does not parse (a proxy's error page) comes with aiohttp's
    # own response, whose status is ``status``: still a 502 for the retry policy.
    status = getattr(response, "status_code", None) or getattr(response, "status", None)
    return map_api_error(status, error_code(exc), headers.get("Retry-After"), method)


def error_code(exc: SlackApiError) -> str | None:
    data = getattr(exc.response, "data", None)  # none on an unreadable body (``api_error``)
    return data.get("error") if isinstance(data, dict) else None
