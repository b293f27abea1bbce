"""The LLM provider: any OpenAI-compatible Chat Completions endpoint, one retry policy.

The openai SDK does the HTTP, auth and error mapping; its own retries are off so that tenacity
is the only retry policy. The request body is serialised by us once and handed to the SDK's
low-level ``post`` as bytes: the typed ``chat.completions.create`` walks and transforms every
message on every call, which costs hundreds of milliseconds for a long session.

Streaming (``chat(..., on_text=...)``) adds ``"stream": true`` to that same serialisation and
reads the server-sent events through the SDK's ``AsyncStream``: content and tool-call deltas
are assembled into the same ``LLMResponse`` a plain request gives, usage is read from the last
chunk. A stream silent for ``llm.streamIdleSeconds`` is a timeout to the one retry policy, as
is a connection dropped mid-stream. A server that answers a streamed request with one JSON
body is read as a plain answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import functools
import importlib
import json
import logging
import os
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
    wait_random,
)

from bot.config import LLMConfig
from bot.dialects import (
    PROFILES,
    Dialect,
    ReasoningSplitter,
    dialect_for,
    merge_reasoning_details,
    new_tool_call_id,
    reasoning_of,
    split_reasoning,
)
from bot.proxy import SOCKS_SCHEMES, environment_proxy, socks_connector
from bot.spend.record import PROBE, TURN, CallRecord, make_record
from bot.urls import endpoint_access, redact_url

if TYPE_CHECKING:
    import openai

log = logging.getLogger(__name__)

RETRY_AFTER_CAP_SECONDS = 120.0
NOT_CONFIGURED_HELP = (
    "No LLM is configured. Set one of:\n"
    '  - an OpenAI API key: "llm.apiKey" in the config file, or the OPENAI_API_KEY '
    "environment variable;\n"
    '  - an OpenAI-compatible server: "llm.baseUrl" (or OPENAI_BASE_URL), for example '
    "http://localhost:11434/v1 for Ollama or http://localhost:8000/v1 for vLLM, "
    'together with "llm.model".\n'
    "Edit {config}, or run `{onboard}`, which asks for them in a terminal."
)
DEFAULT_ENDPOINT = "https://api.openai.com/v1"
# Characters of a tool call's reasoning kept to be sent back (bot.dialects).
MAX_KEPT_REASONING = 32_000
# Refusals that may each teach an endpoint's dialect one thing, per request (bot.dialects).
MAX_LESSONS = 4
# A tool-call id is sent back with every later request and kept in the session: one longer
# than any provider's (OpenAI's are about 30 characters) is replaced like a missing one.
MAX_TOOL_CALL_ID = 256
# A streamed answer's limits: one event (a whole tool call in one chunk, as Ollama sends it,
# can be megabytes), and the whole stream; past them a server is filling memory.
MAX_SSE_EVENT_BYTES = 32 << 20
MAX_STREAM_BYTES = 256 << 20
# Keep-alive comments count as activity (DeepSeek sends them while a request waits, for up to
# 10 minutes: https://api-docs.deepseek.com/quick_start/rate_limit), but not for ever: at most
# this many llm.streamIdleSeconds (10 minutes by default) without the answer growing.
KEEPALIVE_IDLE_FACTOR = 10
# Sending a request and the start of its answer get this many times llm.timeoutSeconds.
ANSWER_DEADLINE_FACTOR = 2
# Told the answer's text so far (the whole of it, not the new piece) as it streams in; a
# retry starts again from "" (a shorter text), so a listener simply shows the latest.
TextSink = Callable[[str], None]
# Told every answered call before its answer is handed back (bot.spend.ledger): awaited, so
# the record is written (in the kernel: a SIGKILL keeps it) before the caller can checkpoint
# the answer; its fsync is shared and may come up to ledger.SYNC_SECONDS later.
Meter = Callable[[CallRecord], Awaitable[None]]
# Told the whole answer as soon as it is there, before it is recorded (a chat can show a
# streamed answer as finished without waiting for the ledger's write).
AnswerSink = Callable[["LLMResponse"], None]
# Asked before every call with its session and purpose (bot.spend.budget): raises an LLMError
# (BudgetSpent) when the call may not be made; a call under way is never stopped by it.
Guard = Callable[[str, str], None]


class LLMError(Exception):
    """Base of the provider's errors; ``user_message`` is safe to show in a chat."""

    user_message = "The model request failed."


class LLMNotConfigured(LLMError):
    pass


class LLMUnavailable(LLMError):
    """Transient failures outlasted every retry (of every endpoint, when raised by ``chat``).
    ``rate_limited``: every endpoint said so (HTTP 429), ``retry_after`` seconds its last
    answer asked to wait (the longest, over several endpoints), when it said."""

    user_message = "The model service is unavailable right now; try again in a moment."

    def __init__(
        self, message: str, *, rate_limited: bool = False, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.rate_limited = rate_limited
        self.retry_after = retry_after


class LLMRejected(LLMError):
    """A permanent error (bad request, auth, unknown model): retrying cannot help."""

    def __init__(self, status: int, detail: str, endpoint: str = "") -> None:
        # One line: a template error's words come with line breaks and a caret drawing.
        said = " ".join(detail.split())[:1000]
        super().__init__(f"HTTP {status}: {said}" + (f" (from {endpoint})" if endpoint else ""))
        self.status = status
        self.detail = detail  # the server's own words
        self.endpoint = endpoint
        hint = {
            401: "the API key was rejected; check llm.apiKey",
            403: "the API key may not use this model",
            404: "the model or endpoint was not found; check llm.model and llm.baseUrl",
        }.get(status, said[:200])
        self.user_message = f"The model service refused the request ({status}: {hint})."


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str
    # What the provider attached to the call and needs back (Gemini's thought signature).
    extra: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class LLMResponse:
    content: str | None
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: str | None = None
    usage: dict[str, int] = field(default_factory=dict)
    answered_by: str = ""  # "model @ endpoint" of the endpoint that answered
    # The model's reasoning (a reasoning field, or a <think> block taken out of the text):
    # never shown, kept with tool calls for the providers that want it back (bot.dialects).
    reasoning: str = ""
    reasoning_details: tuple[dict[str, Any], ...] = ()  # OpenRouter's, sent back likewise

    def assistant_message(self) -> dict[str, Any]:
        """The reply as a history message in Chat Completions format, with what its provider
        needs back on the next request (each request sends only what its target takes)."""
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            calls = []
            for c in self.tool_calls:
                wire: dict[str, Any] = {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                if c.extra:
                    wire["extra_content"] = c.extra
                calls.append(wire)
            msg["tool_calls"] = calls
            if self.reasoning:
                # Sent back with every later request where the dialect wants it, and held in
                # the session: a model that thinks at length must not fill either.
                msg["reasoning_content"] = self.reasoning[:MAX_KEPT_REASONING]
            if self.reasoning_details:
                msg["reasoning_details"] = list(self.reasoning_details)
        return msg


def retry_after_seconds(exc: BaseException) -> float | None:
    """The server's ``Retry-After`` (seconds or HTTP date, or ``retry-after-ms``), if any."""
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        parsed = email.utils.parsedate_to_datetime(value) if value else None
        if parsed is None:
            return None
        return max(0.0, parsed.timestamp() - time.time())


# A chat template's own refusal (llama.cpp answers it with 500, vLLM with 400): the same
# conversation fails the same way every time, so it is not retried.
_TEMPLATE_REFUSAL = re.compile(
    r"roles must alternate|chat template|jinja|raise_exception|conversation roles", re.IGNORECASE
)


def is_retryable(exc: BaseException, dialect: Dialect | None = None) -> bool:
    """Whether a new try can cure ``exc``: a lost connection, a timeout, 429, a 5xx (but a
    chat template's refusal, or one that teaches ``dialect``), or a 4xx whose error code the
    dialect knows to be transient."""
    import openai

    if isinstance(exc, openai.APIConnectionError):  # includes APITimeoutError
        return True
    if isinstance(exc, openai.APIStatusError):
        if exc.status_code == 429:
            return True
        if exc.status_code >= 500:
            # Nor one that names what the dialect got wrong (llama.cpp refuses content null
            # with a 500): the request is sent again at once, the dialect corrected.
            detail = _error_detail(exc)
            taught = dialect is not None and dialect.learn(detail) is not None
            return not (taught or _TEMPLATE_REFUSAL.search(detail))
        return _error_code(exc) in (dialect or PROFILES["generic"]).retry_codes
    return False


class _RetryAfterOrBackoff:
    """Wait what the server asked for, else exponential backoff with jitter."""

    def __init__(self, initial: float, maximum: float) -> None:
        self._backoff = wait_exponential(multiplier=initial, max=maximum) + wait_random(0, initial)

    def __call__(self, state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        asked = retry_after_seconds(exc) if exc else None
        if asked is not None:
            return min(asked, RETRY_AFTER_CAP_SECONDS)
        return self._backoff(state)


@dataclass(frozen=True, slots=True)
class RetryNotice:
    """A model request about to be tried again, for a person watching: the log record of each
    retry carries one (``record.retry_notice``), so the terminal chat can show it as its
    status line instead of a log line (channels.terminal_channel)."""

    reason: str  # what failed, one line: "HTTP 503", "cannot connect"
    unreachable: bool  # no answer at all (a connection or a timeout), not an error answer
    retry: int  # this retry's number, from 1
    retries: int  # how many there may be
    delay: float  # seconds before it

    def status_line(self) -> str:
        what = "model unreachable" if self.unreachable else f"model unavailable ({self.reason})"
        return f"{what}, retrying in {max(1, round(self.delay))} s ({self.retry}/{self.retries})..."


def _log_retry(url: str, state: RetryCallState, tries: int, session_key: str) -> None:
    import openai

    exc = state.outcome.exception() if state.outcome else None
    status = getattr(exc, "status_code", None)
    notice = RetryNotice(
        f"HTTP {status}" if status else type(exc).__name__,
        isinstance(exc, openai.APIConnectionError),
        state.attempt_number,
        tries - 1,
        state.upcoming_sleep,
    )
    log.warning(
        "llm request to %s failed (%s), retry %d/%d in %.1fs session=%s",
        url,
        _describe(exc) if exc else "?",
        state.attempt_number,
        tries - 1,
        state.upcoming_sleep,
        session_key,
        extra={"retry_notice": notice},
    )


def _describe(exc: BaseException) -> str:
    """``HTTP 500: <the server's words>``, or the exception's kind."""
    status = getattr(exc, "status_code", None)
    if not status:
        return type(exc).__name__
    detail = " ".join(_error_detail(exc).split())[:300]
    generic = detail in ("", f"Error code: {status}") or detail.startswith(f"Error code: {status} ")
    return f"HTTP {status}" if generic else f"HTTP {status}: {detail}"


def _connection_failure(exc: BaseException) -> str | None:
    """What a failed connection's cause chain says happened, unless it was a timeout."""
    import aiohttp

    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, TimeoutError):  # aiohttp's timeouts are TimeoutErrors too
            return None
        if isinstance(cause, OSError | aiohttp.ClientConnectionError):
            return str(cause) or type(cause).__name__
        cause = cause.__cause__ or cause.__context__
    return None


def _httpx() -> Any:
    """The SDK's HTTP library: newer openai releases ship it as httpx2."""
    try:
        import httpx2 as httpx
    except ImportError:  # pragma: no cover
        import httpx
    return httpx


@contextlib.contextmanager
def _named_connection_errors(url: str) -> Iterator[None]:
    """The SDK's aiohttp transport reports every failed connection (refused, unknown host,
    dropped) as "Request timed out.", its httpx one as a bare "Connection error.", and some
    aiohttp errors (a bad status line, an over-long header) it passes on raw: each becomes an
    APIConnectionError that says what happened, so it is retried and failed over alike."""
    import aiohttp
    import openai

    try:
        yield
    except aiohttp.ClientError as exc:
        raise openai.APIConnectionError(
            message=f"Connection error: {exc}", request=_httpx().Request("POST", url)
        ) from exc
    except openai.APIConnectionError as exc:
        vague = isinstance(exc, openai.APITimeoutError) or str(exc) == "Connection error."
        reason = _connection_failure(exc) if vague else None
        if reason is None:
            raise
        raise openai.APIConnectionError(
            message=f"Connection error: {reason}", request=exc.request
        ) from exc


@contextlib.asynccontextmanager
async def _readable(url: str) -> AsyncIterator[None]:
    """A JSON body the SDK could not decode (an HTML page, bytes that are not UTF-8) as a
    broken answer, retried and named like one, not a traceback out of the turn."""
    import openai

    try:
        yield
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise openai.APIConnectionError(
            message=f"unreadable answer, not JSON: {exc}", request=_httpx().Request("POST", url)
        ) from exc


@contextlib.asynccontextmanager
async def _answer_deadline(endpoint: _Endpoint) -> AsyncIterator[None]:
    """Sending the request and waiting for the answer's start, within twice ``timeoutSeconds``.
    aiohttp has no write timeout and starts its read timeout once the body is sent, so a
    server that stops reading would hold the request for ever (httpx's write timeout cut it)."""
    import openai

    try:
        async with asyncio.timeout(ANSWER_DEADLINE_FACTOR * endpoint.cfg.timeout_seconds):
            yield
    except TimeoutError:
        raise openai.APITimeoutError(request=_httpx().Request("POST", endpoint.url)) from None


def _transport(openai: Any, timeout: float, proxy: str) -> dict[str, Any]:
    """The SDK on aiohttp, as the channels are: under 50 busy chats its httpx pool cost about
    10% more gateway CPU per message (bench_soak.py, 8 interleaved pairs: median 11.6 against
    10.4 ms); the SDK's own httpx client where this openai release lacks the extra.

    ``proxy`` (from ``llm.proxy`` or the environment; "" for none): an http(s) URL is given
    to the SDK; a socks5 URL gets aiohttp-socks' connector, which neither the SDK nor aiohttp
    has (aiohttp would send the request to a socks port as if it were an http proxy)."""
    # memobot decides the route once, by one rule (bot.proxy), and the SDK is told exactly
    # that: left to read the environment again by rules of its own (NO_PROXY ".example.com",
    # an entry with a port, a scheme it refuses at once) it could send a socks proxy plain
    # http where memobot had bypassed it. Not reading it loses none of its TLS settings.
    route: dict[str, Any] = (
        {"proxy": proxy}
        if proxy
        else {"trust_env": False, "verify": _tls_context(*_ca_environment())}
    )
    try:
        if proxy.startswith(SOCKS_SCHEMES):
            route = {"transport": _socks_transport(proxy)}  # a transport of its own: no mounts
        return {"http_client": openai.DefaultAioHttpClient(timeout=timeout, **route)}
    except (AttributeError, RuntimeError, ImportError):
        if proxy.startswith(SOCKS_SCHEMES):
            raise LLMUnavailable(
                f"a socks5 proxy ({redact_url(proxy)}) for the model needs openai's "
                "aiohttp transport: pip install 'openai[aiohttp]'"
            ) from None
        return {"http_client": openai.DefaultAsyncHttpxClient(timeout=timeout, **route)}


def _ca_environment() -> tuple[str | None, str | None]:
    return os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR")


@functools.cache
def _tls_context(cafile: str | None, capath: str | None) -> Any:
    """The verifying TLS context the SDK's client is given, one per process (per trusted CA
    setting, the arguments): loading the CA bundle costs about 45 ms of CPU, and a provider
    is made for each model a chat switches to, for memory's model and for each probe.
    An SSLContext may be shared by any number of connections."""
    del cafile, capath  # read again from the environment by httpx, as before
    return _httpx().create_ssl_context(trust_env=True)


def _socks_transport(proxy: str) -> Any:
    """The SDK's aiohttp transport on a session whose connector tunnels through ``proxy``;
    the session is made on the first request, inside the event loop, as aiohttp needs."""
    try:
        from openai._vendor.httpx_aiohttp import AiohttpTransport
    except ImportError:  # releases that take it from the httpx-aiohttp package
        from httpx_aiohttp import AiohttpTransport  # type: ignore[import-not-found,no-redef]
    import aiohttp

    def session() -> aiohttp.ClientSession:
        return aiohttp.ClientSession(connector=socks_connector(proxy, ssl=transport.ssl_context))

    transport = AiohttpTransport(client=session)
    return transport


def _kept_home(url: str, names: list[str]) -> Callable[[Any], Awaitable[None]]:
    """An httpx request hook: a redirect away from ``url``'s origin goes without the headers
    ``names`` (Azure's api-key, llm.headers, Basic auth). The SDK follows redirects, and httpx
    takes only Authorization off a request sent to another host."""
    home = _httpx().URL(url)

    async def hook(request: Any) -> None:
        to = request.url
        upgrade = (home.scheme, to.scheme) == ("http", "https") and home.port in (None, 80)
        same = to.host == home.host and (
            (to.scheme, to.port) == (home.scheme, home.port) or (upgrade and to.port is None)
        )
        if not same:
            for name in names:
                request.headers.pop(name, None)

    return hook


class _Endpoint:
    """One model at one base URL (``llm`` or one of ``llm.fallbacks``), with its own client."""

    def __init__(self, cfg: LLMConfig) -> None:
        """Raises LLMNotConfigured when the base URL cannot be used with the key (a
        user:password@ URL and an API key; the config check misses OPENAI_* variables)."""
        self.cfg = cfg
        self.api_key = cfg.resolved_api_key()
        try:
            # Credentials leave the URL (bot.urls): what is left is fit to show and log.
            self.access = endpoint_access(
                cfg.resolved_base_url(), "llm.baseUrl (or OPENAI_BASE_URL)", bool(self.api_key)
            )
        except ValueError as exc:
            raise LLMNotConfigured(str(exc)) from None
        self.base_url = self.access.url
        # llm.proxy, else the environment's; a proxy of a kind memobot cannot use fails each
        # request with this text (not the start: the channels and the other endpoints go on).
        self.proxy_problem = ""
        try:
            self.proxy = cfg.proxy or environment_proxy(self.url)
        except ValueError as exc:
            self.proxy, self.proxy_problem = "", str(exc)
        self._client: openai.AsyncOpenAI | None = None
        # Fields of the dialect this endpoint's refusals taught (kept over a model change).
        self._learned: dict[str, Any] = {}
        self._dialect: tuple[str, Dialect] | None = None

    @property
    def dialect(self) -> Dialect:
        """How to speak to this endpoint (bot.dialects): worked out again when a reload
        changes the model."""
        if self._dialect is None or self._dialect[0] != self.cfg.model:
            cfg = self.cfg
            made = dialect_for(cfg.provider, self.url, cfg.model, cfg.dialect.overrides())
            self._dialect = (cfg.model, made.with_overrides(self._learned))
        return self._dialect[1]

    def learn(self, before: Dialect, taught: Dialect) -> None:
        """Speak as ``taught`` from now on where it differs from ``before``, the dialect the
        refused request was sent in. Only that difference: another request may have learnt
        something else meanwhile, which stays."""
        changed = {
            name: getattr(taught, name)
            for name in Dialect.__dataclass_fields__
            if getattr(taught, name) != getattr(before, name)
        }
        self._learned.update(changed)
        self._dialect = (self.cfg.model, self.dialect.with_overrides(changed))

    @property
    def url(self) -> str:
        return self.base_url or DEFAULT_ENDPOINT

    def scrub(self, text: str) -> str:
        """``text`` (a server's words, shown in a chat) without this endpoint's own secrets:
        a proxy may echo the key or a header it was sent."""
        secrets = [self.api_key, *self.cfg.headers.values(), *self.access.headers.values()]
        for secret in secrets:
            if len(secret) >= 8:  # shorter: no key, and replacing it would garble the text
                text = text.replace(secret, "[redacted]")
        return text

    @property
    def post_options(self) -> dict[str, Any]:
        """The SDK's options of each request: a JSON body, and for a key in Azure's api-key
        header no Authorization beside it (the SDK wants that said per request)."""
        headers: dict[str, Any] = {"Content-Type": "application/json"}
        if self.dialect.auth == "api-key" and self.api_key:
            import openai

            headers["Authorization"] = openai.Omit()
        return {"headers": headers}

    @property
    def label(self) -> str:
        return f"{self.cfg.model} @ {self.url}"

    @property
    def client(self) -> openai.AsyncOpenAI:
        if self.proxy_problem:
            raise LLMUnavailable(f"cannot reach the LLM endpoint {self.url}: {self.proxy_problem}")
        if self._client is None:
            import openai

            headers: dict[str, Any] = {**self.access.headers, **self.cfg.headers}
            if self.dialect.auth == "api-key" and self.api_key:
                # Azure's own header; no Bearer beside it (Azure would read it as an Entra
                # token and refuse the request).
                headers.update({"api-key": self.api_key, "Authorization": openai.Omit()})
            query = dict(self.access.query)
            if self.cfg.api_version:
                query["api-version"] = self.cfg.api_version
            transport = _transport(openai, self.cfg.timeout_seconds, self.proxy)
            own = [name for name, value in headers.items() if isinstance(value, str)]
            transport["http_client"].event_hooks["request"].append(_kept_home(self.url, own))
            # Local servers (Ollama, vLLM, llama.cpp) take any key; the SDK insists on one.
            self._client = openai.AsyncOpenAI(
                api_key=self.api_key or "not-needed",
                base_url=self.base_url or None,
                default_headers=headers or None,
                default_query=query or None,
                max_retries=0,
                timeout=self.cfg.timeout_seconds,
                **transport,
            )
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()


class LLMProvider:
    """Chat Completions against ``llm.baseUrl`` with tenacity retries, then ``llm.fallbacks``."""

    def __init__(
        self,
        cfg: LLMConfig,
        config_path: str = "~/.memobot/config.json",
        on_refused: Callable[[str], None] | None = None,
        meter: Meter | None = None,
        guard: Guard | None = None,
    ) -> None:
        """``meter``: told each answered call (the usage ledger); None counts nothing.
        ``guard``: asked before each call (the budget); None allows every call."""
        self.cfg = cfg
        self.meter = meter
        self.guard = guard
        if not cfg.resolved_base_url() and not cfg.resolved_api_key():
            from bot.invocation import command_for

            raise LLMNotConfigured(
                NOT_CONFIGURED_HELP.format(
                    config=config_path, onboard=command_for(config_path, "onboard")
                )
            )
        self._endpoints = [_Endpoint(c) for c in cfg.endpoints()]
        self._primary = self._endpoints[0]
        # llm.models, made at first use; keyed by name and its config entry (a reload that
        # replaces the entry gets a new endpoint). Every one made, to close them all.
        self._named: dict[str, tuple[object, _Endpoint]] = {}
        self._made: list[_Endpoint] = []
        self._unknown: set[str] = set()  # names chosen but no longer configured (logged once)
        # (endpoint, status) already reported: a wrong key is logged once, not per message.
        self._reported: set[tuple[str, int]] = set()
        # Called once per (endpoint, 401/404) with a text for the owner (the daemon sends it to
        # the admins' private chats); the text names the endpoint and the setting, no secret.
        self.on_refused = on_refused

    @property
    def proxy(self) -> str:
        """The proxy the primary endpoint's calls go through ("" for none)."""
        return self._primary.proxy

    @property
    def model(self) -> str:
        """The primary model; set by a config reload (SIGHUP)."""
        return self._primary.cfg.model

    @model.setter
    def model(self, value: str) -> None:
        self._primary.cfg = self._primary.cfg.model_copy(update={"model": value})

    @property
    def dialect(self) -> Dialect:
        """How the primary endpoint is spoken to (bot.dialects), as far as known now."""
        return self._primary.dialect

    @property
    def client(self) -> openai.AsyncOpenAI:
        """The primary endpoint's SDK client, made on first use: importing openai costs about
        half a second, which the daemon spends after its channels are up (``warm_up``)."""
        return self._primary.client

    async def warm_up(self) -> None:
        """Import the SDK in a worker thread so the first answer does not wait for it."""
        await asyncio.to_thread(importlib.import_module, "openai")
        _ = self.client

    async def transcribe(self, name: str, data: bytes, model: str, session_key: str = "") -> str:
        """Speech to text through the endpoint's ``/audio/transcriptions`` (OpenAI-compatible);
        ``data`` is the recording, ``name`` its file name (the endpoint reads the format off
        the suffix). Not counted (priced by the minute), but held to the chat's budget as its
        turn is: a spent budget raises BudgetSpent, no voice message is sent anywhere."""
        import openai

        if self.guard is not None:
            self.guard(session_key, TURN)

        try:
            with _named_connection_errors(self._primary.url):
                result = await self.client.audio.transcriptions.create(
                    model=model, file=(name, data)
                )
        except (openai.OpenAIError, OSError) as exc:
            raise LLMUnavailable(f"transcription failed: {exc}") from exc
        return str(getattr(result, "text", "") or "").strip()

    async def close(self) -> None:
        for e in [*self._endpoints, *self._made]:
            await e.close()

    @property
    def models(self) -> list[str]:
        """The names a chat may choose (``llm.models``), sorted."""
        return sorted(self.cfg.models)

    def describe(self, name: str | None) -> str:
        """``name``'s model and endpoint as the owner may read them (no key): "gpt-4o @ url"."""
        return self._chain(name, "")[0].label

    def _chain(self, name: str | None, session_key: str) -> list[_Endpoint]:
        """The endpoints a request for the named model tries: its own, then llm.fallbacks;
        llm's when ``name`` is None, or a name no longer in llm.models (logged once)."""
        if name is None:
            return self._endpoints
        entry = self.cfg.models.get(name)
        if entry is None:
            if name not in self._unknown:
                self._unknown.add(name)
                log.warning(
                    "llm.models has no %r any more: using llm.model session=%s", name, session_key
                )
            return self._endpoints
        made = self._named.get(name)
        if made is None or made[0] is not entry:
            endpoint = _Endpoint(self.cfg.named(name))
            self._made.append(endpoint)
            made = self._named[name] = (entry, endpoint)
        return [made[1], *self._endpoints[1:]]

    async def chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        session_key: str = "",
        force_tool: str | None = None,
        max_tokens: int | None = None,
        on_text: TextSink | None = None,
        purpose: str = TURN,
        on_answer: AnswerSink | None = None,
        model: str | None = None,
    ) -> LLMResponse:
        """One completion, from the first endpoint that answers.

        Each endpoint gets its own retries; one that stays unavailable (connection error,
        timeout, 5xx, 429) passes the same messages to the next fallback, in that endpoint's
        dialect (bot.dialects). Raises LLMUnavailable when every endpoint failed, LLMRejected
        on a 4xx (the request itself is wrong: another endpoint is not tried) that taught the
        endpoint's dialect nothing.
        ``force_tool`` makes the model answer with a call to that tool (structured output).
        ``on_text``: stream the answer, telling it the text so far as it arrives (see
        ``TextSink``); the result is the same as without.
        ``purpose``: why the call is made, as the usage ledger records it (bot.spend.record);
        the answered call is recorded before this returns, after ``on_answer`` was told it.
        ``model``: a name in ``llm.models`` (a chat's choice, ``memory.model``); its endpoint
        is tried first, then llm.fallbacks. None: llm's own model.
        """
        if self.guard is not None:
            self.guard(session_key, purpose)
        failures: list[LLMUnavailable] = []
        endpoints = self._chain(model, session_key)
        for i, endpoint in enumerate(endpoints):
            try:
                raw = await self._ask(
                    endpoint, messages, tools, force_tool, max_tokens, session_key, on_text
                )
            except LLMUnavailable as exc:
                failures.append(exc)
                if i + 1 < len(endpoints):
                    log.warning(
                        "llm endpoint %s unavailable, failing over to %s session=%s: %s",
                        endpoint.label,
                        endpoints[i + 1].label,
                        session_key,
                        exc,
                    )
                continue
            response = replace(parse_completion(raw), answered_by=endpoint.label)
            if on_answer is not None:
                on_answer(response)
            await self._count(endpoint, session_key, purpose, response, messages, tools)
            return response
        waits = [e.retry_after for e in failures if e.retry_after is not None]
        raise LLMUnavailable(
            str(failures[0])
            if len(failures) == 1
            else "every model failed: " + "; ".join(map(str, failures)),
            rate_limited=all(e.rate_limited for e in failures),
            retry_after=max(waits, default=None),
        )

    async def probe(self) -> str | None:
        """One try per endpoint, no retries, a one-token request: the label of the first
        endpoint that answers, or None. For detecting the end of an outage."""
        ping = [{"role": "user", "content": "ping"}]
        for endpoint in self._endpoints:
            try:
                raw = await self._ask(endpoint, ping, None, None, 1, "probe", None, attempts=1)
                response = parse_completion(raw)
            except LLMError as exc:
                log.debug("probe of %s failed: %s", endpoint.label, exc)
                continue
            await self._count(endpoint, "", PROBE, response, ping, None)
            return endpoint.label
        return None

    async def _count(
        self,
        endpoint: _Endpoint,
        session_key: str,
        purpose: str,
        response: LLMResponse,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
    ) -> None:
        """Hand the answered call to the meter (the usage ledger), priced from llm.prices."""
        if self.meter is None:
            return
        thought = response.reasoning
        record = make_record(
            session=session_key,
            purpose=purpose,
            model=endpoint.cfg.model,
            endpoint=endpoint.url,
            usage=response.usage,
            prices=self.cfg.prices,
            messages=messages,
            tools=tools,
            # Reasoning is billed as completion whether or not it is kept with the answer.
            answer=lambda: {**response.assistant_message(), "reasoning_content": thought},
        )
        await self.meter(record)

    async def _ask(
        self,
        endpoint: _Endpoint,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        force_tool: str | None,
        max_tokens: int | None,
        session_key: str,
        on_text: TextSink | None,
        attempts: int | None = None,
    ) -> Any:
        """One request to one endpoint in its dialect. A refusal that names what the dialect
        got wrong (``'max_tokens' is not supported``) changes the dialect for good and the
        request is sent again, once per thing learnt."""
        cfg = endpoint.cfg
        for lesson in range(MAX_LESSONS + 1):
            dialect = endpoint.dialect
            payload = dialect.body(
                cfg.model,
                messages,
                max_tokens=max_tokens or cfg.max_tokens,
                temperature=cfg.temperature,
                tools=tools,
                force_tool=force_tool,
                stream=on_text is not None,
            )
            try:
                return await self._post(endpoint, payload, session_key, attempts, on_text)
            except LLMRejected as exc:
                teaches = exc.status in (400, 422) or exc.status >= 500
                learnt = dialect.learn(exc.detail) if teaches else None
                if learnt is None or lesson == MAX_LESSONS:
                    self._report_rejection(endpoint, exc, session_key)
                    raise
                endpoint.learn(dialect, learnt[0])
                log.warning(
                    "llm endpoint %s refused a request (HTTP %d: %s): %s from now on; set "
                    "llm.provider (or llm.dialect) to start that way session=%s",
                    endpoint.label,
                    exc.status,
                    " ".join(exc.detail.split())[:200],
                    learnt[1],
                    session_key,
                )
        raise AssertionError("unreachable: the last lesson re-raises")

    async def _post(
        self,
        endpoint: _Endpoint,
        payload: bytes,
        session_key: str,
        attempts: int | None = None,
        on_text: TextSink | None = None,
    ) -> Any:
        """POST one request to one endpoint under the retry policy; the raw JSON answer (for a
        stream, the chunks assembled into that same shape). Raises LLMRejected unreported."""
        import openai

        cfg = endpoint.cfg
        tries = attempts or cfg.retry.attempts
        retrying = AsyncRetrying(
            stop=stop_after_attempt(tries),
            wait=_RetryAfterOrBackoff(cfg.retry.initial_delay_seconds, cfg.retry.max_delay_seconds),
            retry=retry_if_exception(lambda exc: is_retryable(exc, endpoint.dialect)),
            before_sleep=lambda s: _log_retry(endpoint.url, s, tries, session_key),
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt, _named_connection_errors(endpoint.url):
                    if on_text is not None:
                        return await _read_stream(endpoint, payload, on_text)
                    async with _answer_deadline(endpoint), _readable(endpoint.url):
                        raw = await endpoint.client.post(
                            "/chat/completions",
                            cast_to=object,
                            content=payload,
                            options=endpoint.post_options,
                        )
                    return _checked(raw, endpoint.url)
        except openai.APIStatusError as exc:
            if is_retryable(exc, endpoint.dialect):
                raise LLMUnavailable(
                    f"{endpoint.url} answered {_describe(exc)}; gave up after {tries} tries",
                    rate_limited=exc.status_code == 429,
                    retry_after=retry_after_seconds(exc),
                ) from exc
            detail = endpoint.scrub(_error_detail(exc))
            raise LLMRejected(exc.status_code, detail, endpoint.url) from exc
        except openai.APIConnectionError as exc:
            # Name the endpoint and the setting: "Connection error." alone leaves the person
            # guessing which server was meant.
            through = (
                f" through the proxy {redact_url(endpoint.proxy)} (llm.proxy, or ALL_PROXY)"
                if endpoint.proxy
                else ""
            )
            raise LLMUnavailable(
                f"cannot reach the LLM endpoint {endpoint.url}{through} ({_describe(exc)}: "
                f"{exc}) after {tries} tries; check llm.baseUrl (or OPENAI_BASE_URL)"
                f"{', the proxy,' if through else ''} and that the server is running"
            ) from exc
        raise AssertionError("unreachable: tenacity either returns or raises")

    def _report_rejection(self, endpoint: _Endpoint, exc: LLMRejected, session_key: str) -> None:
        """A refused request does not fail over: it is logged with its endpoint; a wrong key or
        model (401/404) once per endpoint as an ERROR, for the admin to fix the config."""
        if exc.status in (401, 404):
            if (endpoint.url, exc.status) in self._reported:
                return
            self._reported.add((endpoint.url, exc.status))
            log.error(
                "llm endpoint %s refused the request: %s (not failing over: fix the config; "
                "reported once) session=%s",
                endpoint.label,
                exc,
                session_key,
            )
            if self.on_refused is not None:
                self.on_refused(
                    f"memobot: the model endpoint {endpoint.label} refused a request. "
                    f"{exc.user_message} Answers that need this endpoint fail until the config "
                    "is fixed and memobot reloaded. (Sent once.)"
                )
        else:
            log.warning(
                "llm endpoint %s refused the request: %s session=%s",
                endpoint.label,
                exc,
                session_key,
            )


def _error_body(exc: Any) -> Any:
    """The error object of a refusal's body: ``{"error": {...}}``, a bare ``{...}``, or
    Gemini's list of one ``[{"error": {...}}]``."""
    body = getattr(exc, "body", None)
    if isinstance(body, list) and body:
        body = body[0]
    if isinstance(body, dict):
        err = body.get("error", body)
        return err if isinstance(err, dict) else body
    return None


def _error_detail(exc: Any) -> str:
    """The server's words. OpenRouter says only "Provider returned error" and puts the
    words of the provider behind it in ``metadata.raw``
    (https://openrouter.ai/docs/api/reference/errors-and-debugging): they are added, so the
    reason is logged and a dialect lesson in them learnt."""
    err = _error_body(exc)
    if err is not None and err.get("message"):
        said = str(err["message"])
        metadata = err.get("metadata")
        raw = metadata.get("raw") if isinstance(metadata, dict) else None
        if isinstance(raw, str) and raw:
            try:
                inner = json.loads(raw)
            except ValueError:
                inner = None
            inner_err = inner.get("error", inner) if isinstance(inner, dict) else None
            if isinstance(inner_err, dict) and isinstance(inner_err.get("message"), str):
                raw = inner_err["message"]
            said = f"{said}: {raw}"
        return said
    return str(getattr(exc, "message", exc))


def _error_code(exc: Any) -> str:
    err = _error_body(exc)
    code = err.get("code") if err is not None else None
    return code if isinstance(code, str) else ""


def _status_error(error: Any, url: str) -> Exception:
    """An error a server put in a 200 answer or in a stream (OpenRouter does both) as the
    exception its status would have raised, so the retry policy treats it alike: its
    ``code`` when that is an HTTP status, else a 502 (the model behind the server failed)."""
    import openai

    httpx = _httpx()
    err = error if isinstance(error, dict) else {"message": str(error)}
    code = err.get("code")
    status = code if isinstance(code, int) and 400 <= code <= 599 else 502
    message = str(err.get("message") or "error in the answer")
    response = httpx.Response(status, request=httpx.Request("POST", url))
    return openai.APIStatusError(
        f"Error code: {status} - {message}", response=response, body={"error": err}
    )


def _checked(raw: Any, url: str) -> Any:
    """``raw`` unless it is an error body that came with status 200."""
    if isinstance(raw, dict) and raw.get("error") and not raw.get("choices"):
        raise _status_error(raw["error"], url)
    return raw


class _TooLarge(Exception):
    """A stream, or one event of it, over its size limit."""


async def _sse_data(
    chunks: AsyncIterator[bytes], alive: Callable[[], None]
) -> AsyncIterator[bytes]:
    """The ``data`` of each server-sent event in ``chunks``. ``alive()`` is called for every
    piece that arrives, keep-alive comments and blank lines included (DeepSeek and OpenRouter
    send those while a slow model thinks: a stream that sends them is not silent).

    Raises _TooLarge past ``MAX_SSE_EVENT_BYTES`` in one event or ``MAX_STREAM_BYTES`` in
    all: a server that never ends a line would otherwise fill memory."""
    pending = bytearray()  # appended to in place: a long line costs its length, not its square
    data: list[bytes] = []
    size = total = 0
    async for raw in chunks:
        alive()
        total += len(raw)
        pending += raw
        if total > MAX_STREAM_BYTES:
            raise _TooLarge(f"a stream over {MAX_STREAM_BYTES >> 20} MiB")
        if b"\n" not in raw:
            if len(pending) + size > MAX_SSE_EVENT_BYTES:
                raise _TooLarge(f"an event over {MAX_SSE_EVENT_BYTES >> 20} MiB")
            continue
        *lines, rest = pending.split(b"\n")
        pending = bytearray(rest)
        for line in lines:
            if line.endswith(b"\r"):
                line = line[:-1]
            if not line:
                if data:
                    yield b"\n".join(data)
                    data, size = [], 0
            elif line.startswith(b"data:"):
                value = bytes(line[5:])
                data.append(value[1:] if value.startswith(b" ") else value)
                size += len(value)
                if size > MAX_SSE_EVENT_BYTES:
                    raise _TooLarge(f"an event over {MAX_SSE_EVENT_BYTES >> 20} MiB")
            # ":" comments, "event:", "id:" and "retry:" carry nothing a completion needs.
    if pending.startswith(b"data:"):
        value = bytes(pending[5:]).rstrip(b"\r")
        data.append(value[1:] if value.startswith(b" ") else value)
    if data:  # a stream cut without the blank line after its last event
        yield b"\n".join(data)


async def _read_stream(endpoint: _Endpoint, payload: bytes, on_text: TextSink) -> Any:
    """One streamed request: the chunks assembled into a Chat Completions body.

    Raises the SDK's errors, so the retry policy classifies them as for a plain request: a
    silence of ``streamIdleSeconds`` becomes ``APITimeoutError``; a connection lost mid-stream
    becomes ``APIConnectionError``; an error event inside the stream the status error it names
    (``_status_error``), or a connection error when it names none; a stream over its size
    limit a 502. Keep-alive comments and chunks that carry nothing (no text, reasoning or
    call) hold the stream open for ``KEEPALIVE_IDLE_FACTOR`` silences at most; an answer
    that finished (a finish_reason came) is kept when its stream then never ends.
    """
    import openai

    httpx = _httpx()
    async with _answer_deadline(endpoint):
        stream = await endpoint.client.post(
            "/chat/completions",
            cast_to=object,
            content=payload,
            options=endpoint.post_options,
            stream=True,
            stream_cls=openai.AsyncStream[object],
        )
    response = stream.response
    request = response.request
    try:
        if "text/event-stream" not in response.headers.get("content-type", ""):
            try:  # a server that does not stream
                async with _answer_deadline(endpoint):
                    raw = json.loads(await response.aread())
            except ValueError as exc:
                raise openai.APIConnectionError(
                    message=f"unreadable answer: {exc}", request=request
                ) from exc
            return _checked(raw, endpoint.url)
        idle = endpoint.cfg.stream_idle_seconds
        assembler = StreamAssembler(endpoint.dialect.template_opens_think)
        loop = asyncio.get_running_loop()
        last_news = loop.time()  # when the answer last grew
        try:
            # One deadline moved on by every piece (wait_for would wrap each read in a task).
            async with asyncio.timeout(idle) as silence:

                def alive() -> None:
                    now = loop.time()
                    silence.reschedule(min(now + idle, last_news + KEEPALIVE_IDLE_FACTOR * idle))

                events = _sse_data(response.aiter_bytes(), alive)
                async with contextlib.aclosing(events):
                    async for data in events:
                        if data == b"[DONE]":
                            break  # what follows, if anything, is not waited for
                        try:
                            chunk = json.loads(data)
                        except ValueError:
                            log.debug(
                                "llm stream from %s: a data line that is not JSON", endpoint.url
                            )
                            continue
                        if isinstance(chunk, dict) and chunk.get("error"):
                            error = chunk["error"]
                            code = error.get("code") if isinstance(error, dict) else None
                            if isinstance(code, int) and 400 <= code <= 599:
                                raise _status_error(error, endpoint.url)
                            message = error.get("message") if isinstance(error, dict) else error
                            raise openai.APIConnectionError(
                                message=f"error in stream: {message}", request=request
                            )
                        pieces = assembler.pieces
                        if assembler.add(chunk):
                            on_text(assembler.shown)
                        if assembler.pieces != pieces:
                            last_news = loop.time()
                            silence.reschedule(last_news + idle)
        except TimeoutError:
            if assembler.finish_reason is None:
                raise openai.APITimeoutError(request=request) from None
            log.debug("llm stream from %s: finished but not ended; answer kept", endpoint.url)
        except _TooLarge as exc:
            raise _status_error({"message": f"{exc}: answer refused"}, endpoint.url) from None
        return assembler.completion()
    except httpx.TransportError as exc:
        raise openai.APIConnectionError(message=f"stream broken: {exc}", request=request) from exc
    finally:
        await stream.close()


class StreamAssembler:
    """``chat.completion.chunk`` values in, one ``chat.completion`` body out, whatever the
    server's dialect.

    Tool calls arrive as deltas keyed by ``index``: the first carries id and name, later ones
    pieces of the arguments. Gemini sends parallel calls all at index 0, each with its own id
    (a new id at an index starts a new call); Ollama sends whole calls without an index;
    llama.cpp builds of March 2026 send arguments as a JSON object. Reasoning comes in
    ``reasoning_content`` or ``reasoning`` deltas, or as a ``<think>`` block in the text:
    ``shown`` is the text without it. Usage comes in the last chunk (``include_usage``), often
    one with no choices at all, or in Groq's ``x_groq``."""

    __slots__ = (
        "_by_index",
        "_split",
        "_tagged",
        "calls",
        "content",
        "details",
        "finish_reason",
        "has_content",
        "pieces",
        "reasoning",
        "shown",
        "usage",
    )

    def __init__(self, template_opens_think: bool = False) -> None:
        """``template_opens_think``: the model's template wrote "<think>" before the text
        begins (``Dialect.template_opens_think``): the text is held back until "</think>",
        unless the server sends the reasoning in a field of its own."""
        self.content = ""  # the text as sent, reasoning blocks included
        self.shown = ""  # the text a person may see
        self.has_content = False
        self.calls: list[dict[str, Any]] = []
        self._by_index: dict[Any, int] = {}
        # A "<" arrived (or the block was opened before the text): it may hold reasoning.
        self._tagged = template_opens_think
        self._split = ReasoningSplitter(template_opens_think)
        self.reasoning: list[str] = []
        self.details: list[dict[str, Any]] = []
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.pieces = 0  # of text, reasoning and calls taken: a chunk without any is no news

    def add(self, chunk: Any) -> bool:
        """Take one chunk; True when the text a person may see changed."""
        if not isinstance(chunk, dict):
            return False
        usage = chunk.get("usage")
        groq = chunk.get("x_groq")
        if isinstance(usage, dict):
            self.usage = usage
        elif isinstance(groq, dict) and isinstance(groq.get("usage"), dict):
            self.usage = groq["usage"]
        grew = False
        for choice in _list(chunk.get("choices")):
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            if isinstance(choice.get("finish_reason"), str) and choice["finish_reason"]:
                self.finish_reason = choice["finish_reason"]
            delta = choice.get("delta")
            if not isinstance(delta, dict):
                continue
            piece = delta.get("content")
            if isinstance(piece, str):
                self.has_content = True
                if piece:
                    self.pieces += 1
                    if not self.content and self.reasoning and self._tagged:
                        # A reasoning field came first: this server parses the block out.
                        self._split, self._tagged = ReasoningSplitter(), False
                    self.content += piece
                    self._tagged = self._tagged or "<" in piece
                    grew = self._show()
            thought = reasoning_of(delta)
            if thought:
                self.pieces += 1
                self.reasoning.append(thought)
            if "reasoning_details" in delta:
                self.pieces += 1
                merge_reasoning_details(self.details, delta["reasoning_details"])
            for tc in _list(delta.get("tool_calls")):
                if isinstance(tc, dict):
                    self.pieces += 1
                    self._add_call(tc)
        return grew

    def _show(self) -> bool:
        shown = self._split.answer(self.content) if self._tagged else self.content
        if shown == self.shown:
            return False
        self.shown = shown
        return True

    def _add_call(self, tc: dict[str, Any]) -> None:
        index = tc.get("index")
        if not isinstance(index, int | str):
            index = None  # a list or an object cannot key a call
        call_id = tc.get("id") if isinstance(tc.get("id"), str) and tc.get("id") else None
        fn = tc.get("function") if isinstance(tc.get("function"), dict) else {}
        pos = self._by_index.get(index) if index is not None else None
        if pos is not None and call_id and self.calls[pos]["id"] not in (None, call_id):
            pos = None  # Gemini: another call at the same index
        if pos is None and index is None and self.calls:
            if call_id:
                pos = next((i for i, c in enumerate(self.calls) if c["id"] == call_id), None)
            elif not fn.get("name"):
                pos = len(self.calls) - 1  # a piece of the last call, without index or id
        if pos is None:
            pos = len(self.calls)
            self.calls.append({"id": None, "name": "", "arguments": [], "extra": None})
            if index is not None:
                self._by_index[index] = pos
        call = self.calls[pos]
        if call_id:
            call["id"] = call_id
        name = fn.get("name")
        if isinstance(name, str) and name:
            # OpenAI sends the name once; some servers resend the whole name in every chunk,
            # a few split it. A repeat must not double it ("read_fileread_file").
            call["name"] = name if name.startswith(call["name"]) else call["name"] + name
        args = fn.get("arguments")
        if isinstance(args, str):
            call["arguments"].append(args)
        elif isinstance(args, dict):
            call["arguments"].append(json.dumps(args, ensure_ascii=False))
        extra = tc.get("extra_content")
        if isinstance(extra, dict):
            call["extra"] = {**(call["extra"] or {}), **extra}

    def completion(self) -> dict[str, Any]:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": self.content if self.has_content else None,
        }
        if self.reasoning:
            message["reasoning_content"] = "".join(self.reasoning)
        if self.details:
            message["reasoning_details"] = self.details
        if self.calls:
            calls = []
            for c in self.calls:
                wire: dict[str, Any] = {
                    "id": c["id"],
                    "type": "function",
                    "function": {"name": c["name"], "arguments": "".join(c["arguments"])},
                }
                if c["extra"]:
                    wire["extra_content"] = c["extra"]
                calls.append(wire)
            message["tool_calls"] = calls
        choice = {"index": 0, "message": message, "finish_reason": self.finish_reason}
        return {"choices": [choice], "usage": self.usage or {}}


def parse_completion(raw: Any) -> LLMResponse:
    """Read a Chat Completions response body (a dict); tolerant of providers' variations.
    Raises LLMUnavailable for a body that is not one (the server's answer, cut short, in the
    text): a field of an unexpected type is dropped, never a traceback later in the turn."""
    choices = raw.get("choices") if isinstance(raw, dict) else None
    choice = choices[0] if isinstance(choices, list) and choices else None
    message = choice.get("message") if isinstance(choice, dict) else None
    if not isinstance(choice, dict) or not isinstance(message, dict | None):
        raise LLMUnavailable(f"the model service sent an unexpected answer: {str(raw)[:200]}")
    message = message or {}
    calls = []
    seen: set[str] = set()
    for c in _list(message.get("tool_calls")):
        if not isinstance(c, dict):
            continue
        fn = c.get("function") if isinstance(c.get("function"), dict) else {}
        args = fn.get("arguments")
        if not isinstance(args, str):
            args = json.dumps(args if args is not None else {}, ensure_ascii=False)
        call_id = c.get("id")
        if not _fit_id(call_id) or call_id in seen:
            call_id = new_tool_call_id()
        seen.add(call_id)
        extra = c.get("extra_content")
        name = fn.get("name")
        calls.append(
            ToolCall(
                id=call_id,
                name=name if isinstance(name, str) else "",
                arguments=args,
                extra=extra if isinstance(extra, dict) and extra else None,
            )
        )
    content = message.get("content")
    if isinstance(content, list):  # some servers return content parts
        content = "".join(
            p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
        )
    elif not isinstance(content, str):
        content = None
    reasoning = reasoning_of(message)
    if isinstance(content, str) and "<" in content:
        thought, content = split_reasoning(content)
        reasoning = "\n\n".join(r for r in (reasoning, thought) if r)
    details = message.get("reasoning_details")
    finish = choice.get("finish_reason")
    usage = raw.get("usage")
    return LLMResponse(
        content=content,
        tool_calls=tuple(calls),
        finish_reason=finish if isinstance(finish, str) else None,
        usage=usage if isinstance(usage, dict) else {},
        reasoning=reasoning,
        reasoning_details=tuple(d for d in details if isinstance(d, dict))
        if isinstance(details, list)
        else (),
    )


def _list(value: Any) -> list[Any] | tuple[()]:
    """``value`` if it is a list, else nothing to iterate (a server's odd type)."""
    return value if isinstance(value, list) else ()


def _fit_id(call_id: Any) -> bool:
    return isinstance(call_id, str) and 0 < len(call_id) <= MAX_TOOL_CALL_ID
