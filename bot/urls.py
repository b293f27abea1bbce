"""URLs that may carry credentials (``https://user:pass@host/v1``, ``?key=...``): hidden
wherever memobot shows one, and taken out of the URL before it is used.

``redact_url`` is the one way memobot shows a configured URL (``status``, ``doctor``, error
messages, log lines, the model's label in a session). ``endpoint_access`` splits an endpoint's
URL into what an HTTP client takes apart: the bare URL, an ``Authorization: Basic`` header for
its user name and password, and its query parameters (the openai SDK drops a base URL's query,
and aiohttp refuses a URL's credentials next to an Authorization header).
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, unquote, urlsplit, urlunsplit

from bot.service.logs import REDACTED, redact

# A scheme-less "user:pass@host:port" (a proxy from the environment).
_BARE_USERINFO = re.compile(r"^[^/\s@]+@")
# A Telegram bot token where python-telegram-bot puts it: after /bot in a Bot API URL.
_TOKEN_IN_PATH = re.compile(r"/bot\d+:[^/?#\s]*")


def redact_url(url: str) -> str:
    """``url`` fit to show: its user name and password and the value of every query
    parameter become ``***``, its fragment is dropped, and any secret the log filter knows
    (a token in the path) is hidden too, as is a Telegram bot token pasted into a path
    (``/bot123:ABC``) it does not know. Never raises."""
    url = _TOKEN_IN_PATH.sub(f"/bot{REDACTED}", url)
    if "://" not in url:
        return redact(_BARE_USERINFO.sub(f"{REDACTED}@", url))
    try:
        parts = urlsplit(url)
    except ValueError:
        return redact(re.sub(r"://[^/\s]*@", f"://{REDACTED}@", url))
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{REDACTED}@{netloc.rpartition('@')[2]}"
    query = "&".join(
        f"{name}={REDACTED}" if sep else name
        for name, sep, _ in (p.partition("=") for p in parts.query.split("&") if p)
    )
    return redact(urlunsplit((parts.scheme, netloc, parts.path, query, "")))


# -- checked when the config loads (bot.config validators): a URL mistake is a config error
# naming the field, never a network retry or a refused token later.

HTTP_SCHEMES = ("http", "https")
TELEGRAM_API = "https://api.telegram.org/bot"
_TELEGRAM_FORMS = (
    f'"{TELEGRAM_API}", or "http://localhost:8081/bot" for a local Bot API server '
    "(memobot appends the token; it goes in channels.telegram.token)"
)


def checked_url(url: str, schemes: tuple[str, ...] = HTTP_SCHEMES) -> str:
    """``url`` when it is "" or an absolute URL of one of ``schemes`` with a host; raises
    ValueError saying what is missing (its text shows the URL without credentials)."""
    if not url:
        return url
    shown = redact_url(url)
    wanted = " or ".join(f"{s}://" for s in schemes)
    if "://" not in url:
        local = shown.startswith(("localhost", "127.", "[::1]")) and "http" in schemes
        example = f"{'http' if local else schemes[-1]}://{shown}"
        raise ValueError(f"{shown!r} has no scheme: it must start with {wanted} (e.g. {example!r})")
    if any(c.isspace() for c in url):
        raise ValueError(f"{shown!r} contains a space or a line break")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 -- a port that is not a number raises here, not at first use
    except ValueError as exc:
        raise ValueError(f"{shown!r} is not a valid URL ({exc})") from None
    if parts.scheme.lower() not in schemes:
        raise ValueError(f"{shown!r} must start with {wanted}")
    if not parts.hostname:
        raise ValueError(f"{shown!r} has no host name")
    return url


def without_trailing_slash(url: str) -> str:
    """A checked http(s) URL with no "/" at the end of its path (``.../v1/`` is ``.../v1``)."""
    checked_url(url)
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=parts.path.rstrip("/")))


def with_trailing_slash(url: str) -> str:
    """A checked http(s) URL whose path ends in "/": a base that relative names are resolved
    against (Slack's SDK joins ``chat.postMessage`` onto it)."""
    checked_url(url)
    if not url:
        return url
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=parts.path.rstrip("/") + "/"))


def telegram_base_url(url: str, suffix: str = "/bot") -> str:
    """``channels.telegram.baseUrl`` (``suffix`` "/bot") or ``baseFileUrl`` ("/file/bot") in
    python-telegram-bot's form, ``scheme://host[:port][/prefix]/bot``, to which the token is
    appended. A trailing slash, a missing ``/bot`` after a bare host and a ``{token}``
    placeholder at the end are normalised; anything else raises ValueError with the form."""
    if not url:
        return url
    checked_url(url)
    parts = urlsplit(url)
    if parts.query or parts.fragment:
        raise ValueError(f"{redact_url(url)!r} must not have a ?query or #fragment")
    path = parts.path.rstrip("/")
    if _TOKEN_IN_PATH.search(path):
        raise ValueError(
            "the bot token must not be in the URL: give the Bot API URL ending in "
            f"{suffix} and put the token in channels.telegram.token"
        )
    for placeholder in ("{token}", "{TOKEN}", "{bot_token}", "{BOT_TOKEN}"):
        if path.endswith(suffix + placeholder):
            path = path[: -len(placeholder)]
    if not path:
        path = suffix
    if not path.endswith(suffix):
        forms = (
            _TELEGRAM_FORMS
            if suffix == "/bot"
            else '"https://api.telegram.org/file/bot", or the same path on a local Bot API server'
        )
        raise ValueError(
            f"{redact_url(url)!r} does not end in {suffix}: expected the Bot API URL such as "
            f"{forms}"
        )
    return urlunsplit(parts._replace(path=path))


@dataclass(frozen=True, slots=True)
class EndpointAccess:
    """An endpoint's URL without credentials, and what carries them instead."""

    url: str
    headers: dict[str, str] = field(default_factory=dict)
    query: dict[str, str] = field(default_factory=dict)


def endpoint_access(url: str, field_name: str, bearer: bool = False) -> EndpointAccess:
    """Split ``url`` (the setting ``field_name``) for an HTTP client: user name and password
    become an ``Authorization: Basic`` header, query parameters a separate mapping.

    ``bearer``: the client also sends an API key as ``Authorization: Bearer``; a URL with a
    password then raises ValueError (one header cannot carry both), naming ``field_name``.
    """
    if not url:
        return EndpointAccess("")
    try:
        parts = urlsplit(url)
        user, password = parts.username, parts.password
    except ValueError as exc:
        raise ValueError(f"{field_name} is not a valid URL ({exc})") from None
    headers: dict[str, str] = {}
    if user is not None or password is not None:
        if bearer:
            raise ValueError(
                f"{field_name} carries a user name and password (sent as HTTP Basic auth) and "
                "an API key is set too (llm.apiKey or OPENAI_API_KEY, sent as a Bearer token): "
                "both would go in the one Authorization header. Remove the key for a server "
                f"behind Basic auth, or the user:password@ part of {field_name}"
            )
        pair = f"{unquote(user or '')}:{unquote(password or '')}"
        headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode("ascii")
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    netloc = parts.netloc.rpartition("@")[2]
    return EndpointAccess(urlunsplit((parts.scheme, netloc, parts.path, "", "")), headers, query)
