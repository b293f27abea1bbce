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


def redact_url(url: str) -> str:
    """``url`` fit to show: its user name and password and the value of every query
    parameter become ``***``, its fragment is dropped, and any secret the log filter knows
    (a token in the path) is hidden too. Never raises."""
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
