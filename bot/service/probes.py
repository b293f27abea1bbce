"""``memobot doctor``'s network checks: the LLM answers, each enabled channel's token is accepted.

Each is one small request with a short timeout, made directly (aiohttp, or the LLM provider
itself), never through a channel's SDK: the question is only "would this token and endpoint
work", and an SDK would retry or reconnect instead of answering it.
"""

from __future__ import annotations

import contextlib
import email.utils
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bot.config import Config, RetryConfig
from bot.proxy import http_proxy, socks_connector
from bot.service.checks import Check
from bot.urls import EndpointAccess, endpoint_access, redact_url
from channels import registry
from channels.spec import TokenProbe

__all__ = [
    "LLMProbe",
    "TokenProbe",
    "check_llm",
    "check_token",
    "fetch_json",
    "proxy_for",
    "token_probes",
]

LLM_TIMEOUT_SECONDS = 20.0
HTTP_TIMEOUT_SECONDS = 8.0
OPENAI_DEFAULT_BASE = "https://api.openai.com/v1"


@dataclass(slots=True)
class LLMProbe:
    check: Check
    date_header: tuple[str, float] | None = None  # (host, server time) when the LLM answered
    # The ids ``GET /models`` lists, when the server answered it (None: not asked, or no list).
    models: list[str] | None = None
    reached: bool = False  # the server answered (the model may still have refused)


async def check_llm(cfg: Config, config_path: Path) -> LLMProbe:
    from bot.llm import LLMNotConfigured, LLMProvider, LLMRejected, LLMUnavailable

    llm = cfg.llm.model_copy(
        update={"timeout_seconds": LLM_TIMEOUT_SECONDS, "retry": RetryConfig(attempts=1)}
    )
    base = llm.resolved_base_url() or OPENAI_DEFAULT_BASE
    shown = redact_url(base)
    try:
        provider = LLMProvider(llm, str(config_path))
    except LLMNotConfigured as exc:
        if llm.resolved_base_url() or llm.resolved_api_key():  # configured, but unusable
            return LLMProbe(Check("fail", f"LLM {shown}: {exc}", f"edit {config_path}"))
        return LLMProbe(
            Check(
                "fail",
                "LLM: none configured",
                'set "llm.apiKey" (or OPENAI_API_KEY) for OpenAI, or "llm.baseUrl" (or '
                'OPENAI_BASE_URL) and "llm.model" for an OpenAI-compatible server, in '
                f"{config_path}",
            )
        )
    try:
        reply = await provider.chat(
            [{"role": "user", "content": "Reply with the single word OK."}], max_tokens=8
        )
    except LLMRejected as exc:
        refused = Check("fail", f"LLM {shown} refused: {exc}", _rejected_fix(exc.status))
        _, models = await _server_info(endpoint_access(base, "llm.baseUrl"), provider.proxy)
        return LLMProbe(refused, models=models, reached=True)
    except LLMUnavailable as exc:
        fix = "check that the server runs and llm.baseUrl is right"
        if provider.proxy:
            fix += ", and that the proxy (llm.proxy, or ALL_PROXY/HTTPS_PROXY) runs"
        return LLMProbe(Check("fail", f"LLM {shown} unreachable: {exc}", fix))
    finally:
        await provider.close()
    said = (reply.content or "").strip().replace("\n", " ")[:40]
    dialect = provider.dialect.provider
    told = "" if llm.provider == dialect else ", detected: set llm.provider if wrong"
    check = Check(
        "ok", f"LLM {shown} model {llm.model} answered: {said!r} (provider {dialect}{told})"
    )
    date, models = await _server_info(endpoint_access(base, "llm.baseUrl"), provider.proxy)
    return LLMProbe(check, date, models, reached=True)


def _rejected_fix(status: int) -> str:
    return {
        401: "check llm.apiKey (or OPENAI_API_KEY)",
        403: "this key may not use the model: check llm.model",
        404: "check llm.model and llm.baseUrl (it usually ends in /v1)",
    }.get(status, "see the error above")


async def _server_info(
    access: EndpointAccess, proxy: str
) -> tuple[tuple[str, float] | None, list[str] | None]:
    """The Date header of the LLM server (any answer carries one), for the clock check, and
    the model ids its ``GET /models`` lists; asked the way the model calls go, through
    ``proxy`` when there is one."""
    import aiohttp

    models: list[str] | None = None
    try:
        timeout = aiohttp.ClientTimeout(total=HTTP_TIMEOUT_SECONDS)
        async with (
            aiohttp.ClientSession(timeout=timeout, connector=socks_connector(proxy)) as http,
            http.get(
                access.url.rstrip("/") + "/models",
                params=access.query,
                headers=access.headers,
                proxy=http_proxy(proxy),
            ) as resp,
        ):
            value = resp.headers.get("Date")
            if resp.status == 200:
                with contextlib.suppress(ValueError, aiohttp.ContentTypeError):
                    models = _model_ids(await resp.json(content_type=None))
    except (aiohttp.ClientError, TimeoutError):
        return None, None
    parsed = email.utils.parsedate_to_datetime(value) if value else None
    date = (urlsplit(access.url).hostname or access.url, parsed.timestamp()) if parsed else None
    return date, models


def _model_ids(body: Any) -> list[str] | None:
    """The ids of an OpenAI-style model list ``{"data": [{"id": ...}, ...]}``; None if not one."""
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        return None
    return [str(m["id"]) for m in data if isinstance(m, dict) and m.get("id")]


def token_probes(cfg: Config) -> list[TokenProbe]:
    """One probe per token of each enabled channel (each channel's spec knows its URLs)."""
    return registry.token_probes(cfg)


def proxy_for(cfg: Config, probe: TokenProbe) -> str:
    return getattr(cfg.channels, probe.channel.split()[0]).proxy


async def fetch_json(
    probe: TokenProbe, proxy: str = "", seconds: float = HTTP_TIMEOUT_SECONDS
) -> tuple[int, Any]:
    """Make ``probe``'s request: (HTTP status, its JSON body; None for a 5xx). Raises
    aiohttp.ClientConnectionError, TimeoutError or OSError when the server cannot be reached,
    aiohttp.ClientError or ValueError for an answer that is not JSON."""
    import aiohttp

    # The channel's own rule: socks5h (the proxy resolves names) is not python-socks' scheme.
    connector = socks_connector(proxy)
    kwargs: dict[str, Any] = {"proxy": http_proxy(proxy)}
    async with (
        aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=seconds), connector=connector
        ) as http,
        http.request(probe.method, probe.url, headers=probe.headers, **kwargs) as resp,
    ):
        status = resp.status
        return status, await resp.json(content_type=None) if status < 500 else None


async def check_token(probe: TokenProbe, proxy: str = "") -> Check:
    import aiohttp

    host = urlsplit(probe.url).hostname or "?"
    try:
        status, body = await fetch_json(probe, proxy)
    except (aiohttp.ClientConnectionError, TimeoutError, OSError) as exc:
        reason = str(exc).replace(probe.secret, "<token>") if probe.secret else str(exc)
        return Check("warn", f"{probe.channel}: cannot reach {host} (no network?): {reason}")
    except (aiohttp.ClientError, ValueError) as exc:
        return Check(
            "fail", f"{probe.channel}: unexpected answer from {host}: {type(exc).__name__}"
        )
    # Slack answers 200 with {"ok": false, "error": ...}; Telegram and Discord use 401.
    ok = status == 200 and (not isinstance(body, dict) or body.get("ok", True) is not False)

    def hidden(text: str) -> str:  # the platform's words may quote the token back
        return text.replace(probe.secret, "<token>") if probe.secret else text

    if ok:
        return Check("ok", hidden(f"{probe.channel}: token accepted by {host}{_who(body)}"))
    error = None
    if isinstance(body, dict):
        error = body.get("error") or body.get("description") or body.get("message")
    return Check(
        "fail",
        hidden(f"{probe.channel}: {host} refused the token (HTTP {status}: {error})"),
        probe.fix or f"check channels.{probe.channel.split()[0]} in the config",
    )


def _who(body: Any) -> str:
    if not isinstance(body, dict):
        return ""
    result = body.get("result") if isinstance(body.get("result"), dict) else body
    name = result.get("username") or result.get("user")
    return f" (as {name})" if name else ""
