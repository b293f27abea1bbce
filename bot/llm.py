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
import importlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator
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
from bot.proxy import SOCKS_SCHEMES, environment_proxy, socks_connector
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
# Sending a request and the start of its answer get this many times llm.timeoutSeconds.
ANSWER_DEADLINE_FACTOR = 2
# Told the answer's text so far (the whole of it, not the new piece) as it streams in; a
# retry starts again from "" (a shorter text), so a listener simply shows the latest.
TextSink = Callable[[str], None]


class LLMError(Exception):
    """Base of the provider's errors; ``user_message`` is safe to show in a chat."""

    user_message = "The model request failed."


class LLMNotConfigured(LLMError):
    pass


class LLMUnavailable(LLMError):
    """Transient failures outlasted every retry (of every endpoint, when raised by ``chat``)."""

    user_message = "The model service is unavailable right now; try again in a moment."


class LLMRejected(LLMError):
    """A permanent error (bad request, auth, unknown model): retrying cannot help."""

    def __init__(self, status: int, detail: str, endpoint: str = "") -> None:
        super().__init__(f"HTTP {status}: {detail}" + (f" (from {endpoint})" if endpoint else ""))
        self.status = status
        self.endpoint = endpoint
        hint = {
            401: "the API key was rejected; check llm.apiKey",
            403: "the API key may not use this model",
            404: "the model or endpoint was not found; check llm.model and llm.baseUrl",
        }.get(status, detail[:200])
        self.user_message = f"The model service refused the request ({status}: {hint})."


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class LLMResponse:
    content: str | None
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: str | None = None
    usage: dict[str, int] = field(default_factory=dict)
    answered_by: str = ""  # "model @ endpoint" of the endpoint that answered

    def assistant_message(self) -> dict[str, Any]:
        """The reply as a history message in Chat Completions format."""
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            msg["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in self.tool_calls
            ]
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


def is_retryable(exc: BaseException) -> bool:
    import openai

    if isinstance(exc, openai.APIConnectionError):  # includes APITimeoutError
        return True
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code == 429 or exc.status_code >= 500
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


def _describe(exc: BaseException) -> str:
    status = getattr(exc, "status_code", None)
    return f"HTTP {status}" if status else type(exc).__name__


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
        else {"trust_env": False, "verify": _httpx().create_ssl_context(trust_env=True)}
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

    @property
    def url(self) -> str:
        return self.base_url or DEFAULT_ENDPOINT

    @property
    def label(self) -> str:
        return f"{self.cfg.model} @ {self.url}"

    @property
    def client(self) -> openai.AsyncOpenAI:
        if self.proxy_problem:
            raise LLMUnavailable(f"cannot reach the LLM endpoint {self.url}: {self.proxy_problem}")
        if self._client is None:
            import openai

            # Local servers (Ollama, vLLM, llama.cpp) take any key; the SDK insists on one.
            self._client = openai.AsyncOpenAI(
                api_key=self.api_key or "not-needed",
                base_url=self.base_url or None,
                default_headers=self.access.headers or None,
                default_query=self.access.query or None,
                max_retries=0,
                timeout=self.cfg.timeout_seconds,
                **_transport(openai, self.cfg.timeout_seconds, self.proxy),
            )
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()


class LLMProvider:
    """Chat Completions against ``llm.baseUrl`` with tenacity retries, then ``llm.fallbacks``."""

    def __init__(self, cfg: LLMConfig, config_path: str = "~/.memobot/config.json") -> None:
        self.cfg = cfg
        if not cfg.resolved_base_url() and not cfg.resolved_api_key():
            from bot.invocation import command_for

            raise LLMNotConfigured(
                NOT_CONFIGURED_HELP.format(
                    config=config_path, onboard=command_for(config_path, "onboard")
                )
            )
        self._endpoints = [_Endpoint(c) for c in cfg.endpoints()]
        self._primary = self._endpoints[0]
        # (endpoint, status) already reported: a wrong key is logged once, not per message.
        self._reported: set[tuple[str, int]] = set()
        # Called once per (endpoint, 401/404) with a text for the owner (the daemon sends it to
        # the admins' private chats); the text names the endpoint and the setting, no secret.
        self.on_refused: Callable[[str], None] | None = None

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
    def client(self) -> openai.AsyncOpenAI:
        """The primary endpoint's SDK client, made on first use: importing openai costs about
        half a second, which the daemon spends after its channels are up (``warm_up``)."""
        return self._primary.client

    async def warm_up(self) -> None:
        """Import the SDK in a worker thread so the first answer does not wait for it."""
        await asyncio.to_thread(importlib.import_module, "openai")
        _ = self.client

    async def transcribe(self, name: str, data: bytes, model: str) -> str:
        """Speech to text through the endpoint's ``/audio/transcriptions`` (OpenAI-compatible);
        ``data`` is the recording, ``name`` its file name (the endpoint reads the format off
        the suffix)."""
        import openai

        try:
            with _named_connection_errors(self._primary.url):
                result = await self.client.audio.transcriptions.create(
                    model=model, file=(name, data)
                )
        except (openai.OpenAIError, OSError) as exc:
            raise LLMUnavailable(f"transcription failed: {exc}") from exc
        return str(getattr(result, "text", "") or "").strip()

    async def close(self) -> None:
        for e in self._endpoints:
            await e.close()

    @staticmethod
    def _body(
        cfg: LLMConfig,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        force_tool: str | None = None,
        max_tokens: int | None = None,
        stream: bool = False,
    ) -> bytes:
        body: dict[str, Any] = {
            "model": cfg.model,
            "messages": messages,
            "max_tokens": max_tokens or cfg.max_tokens,
            "temperature": cfg.temperature,
        }
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        if tools:
            body["tools"] = tools
            body["tool_choice"] = (
                {"type": "function", "function": {"name": force_tool}} if force_tool else "auto"
            )
        return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")

    async def chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        session_key: str = "",
        force_tool: str | None = None,
        max_tokens: int | None = None,
        on_text: TextSink | None = None,
    ) -> LLMResponse:
        """One completion, from the first endpoint that answers.

        Each endpoint gets its own retries; one that stays unavailable (connection error,
        timeout, 5xx, 429) passes the same messages, byte for byte, to the next fallback.
        Raises LLMUnavailable when every endpoint failed, LLMRejected on a 4xx (the request
        itself is wrong: another endpoint is not tried).
        ``force_tool`` makes the model answer with a call to that tool (structured output).
        ``on_text``: stream the answer, telling it the text so far as it arrives (see
        ``TextSink``); the result is the same as without.
        """
        failures: list[str] = []
        stream = on_text is not None
        for i, endpoint in enumerate(self._endpoints):
            payload = self._body(endpoint.cfg, messages, tools, force_tool, max_tokens, stream)
            try:
                raw = await self._post(endpoint, payload, session_key, on_text=on_text)
            except LLMUnavailable as exc:
                failures.append(str(exc))
                if i + 1 < len(self._endpoints):
                    log.warning(
                        "llm endpoint %s unavailable, failing over to %s session=%s: %s",
                        endpoint.label,
                        self._endpoints[i + 1].label,
                        session_key,
                        exc,
                    )
                continue
            response = parse_completion(raw)
            return replace(response, answered_by=endpoint.label)
        if len(failures) == 1:
            raise LLMUnavailable(failures[0])
        raise LLMUnavailable("every model failed: " + "; ".join(failures))

    async def probe(self) -> str | None:
        """One try per endpoint, no retries, a one-token request: the label of the first
        endpoint that answers, or None. For detecting the end of an outage."""
        ping = [{"role": "user", "content": "ping"}]
        for endpoint in self._endpoints:
            payload = self._body(endpoint.cfg, ping, None, max_tokens=1)
            try:
                parse_completion(await self._post(endpoint, payload, "probe", attempts=1))
            except LLMError as exc:
                log.debug("probe of %s failed: %s", endpoint.label, exc)
                continue
            return endpoint.label
        return None

    async def _post(
        self,
        endpoint: _Endpoint,
        payload: bytes,
        session_key: str,
        attempts: int | None = None,
        on_text: TextSink | None = None,
    ) -> Any:
        """POST one request to one endpoint under the retry policy; the raw JSON answer (for a
        stream, the chunks assembled into that same shape)."""
        import openai

        cfg = endpoint.cfg
        tries = attempts or cfg.retry.attempts
        retrying = AsyncRetrying(
            stop=stop_after_attempt(tries),
            wait=_RetryAfterOrBackoff(cfg.retry.initial_delay_seconds, cfg.retry.max_delay_seconds),
            retry=retry_if_exception(is_retryable),
            before_sleep=lambda s: log.warning(
                "llm request to %s failed (%s), retry %d/%d in %.1fs session=%s",
                endpoint.url,
                _describe(s.outcome.exception()) if s.outcome else "?",
                s.attempt_number,
                tries - 1,
                s.upcoming_sleep,
                session_key,
            ),
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt, _named_connection_errors(endpoint.url):
                    if on_text is not None:
                        return await _read_stream(endpoint, payload, on_text)
                    async with _answer_deadline(endpoint):
                        return await endpoint.client.post(
                            "/chat/completions",
                            cast_to=object,
                            content=payload,
                            options={"headers": {"Content-Type": "application/json"}},
                        )
        except openai.APIStatusError as exc:
            if is_retryable(exc):
                raise LLMUnavailable(
                    f"{endpoint.url} answered {_describe(exc)}; gave up after {tries} tries"
                ) from exc
            rejected = LLMRejected(exc.status_code, _error_detail(exc), endpoint.url)
            self._report_rejection(endpoint, rejected, session_key)
            raise rejected from exc
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


def _error_detail(exc: Any) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
    return str(getattr(exc, "message", exc))


async def _read_stream(endpoint: _Endpoint, payload: bytes, on_text: TextSink) -> Any:
    """One streamed request: the chunks assembled into a Chat Completions body.

    Raises the SDK's errors, so the retry policy classifies them as for a plain request: a
    silence of ``streamIdleSeconds`` becomes ``APITimeoutError``; a connection lost mid-stream
    or an error event inside the stream becomes ``APIConnectionError`` (both retried).
    """
    import openai

    httpx = _httpx()
    async with _answer_deadline(endpoint):
        stream = await endpoint.client.post(
            "/chat/completions",
            cast_to=object,
            content=payload,
            options={"headers": {"Content-Type": "application/json"}},
            stream=True,
            stream_cls=openai.AsyncStream[object],
        )
    request = stream.response.request
    try:
        if "text/event-stream" not in stream.response.headers.get("content-type", ""):
            return json.loads(await stream.response.aread())  # a server that does not stream
        idle = endpoint.cfg.stream_idle_seconds
        assembler = StreamAssembler()
        loop = asyncio.get_running_loop()
        try:
            # One deadline moved on by every chunk (wait_for would wrap each read in a task).
            async with asyncio.timeout(idle) as silence:
                async for chunk in stream:
                    silence.reschedule(loop.time() + idle)
                    if assembler.add(chunk):
                        on_text(assembler.content)
        except TimeoutError:
            raise openai.APITimeoutError(request=request) from None
        return assembler.completion()
    except httpx.TransportError as exc:
        raise openai.APIConnectionError(message=f"stream broken: {exc}", request=request) from exc
    except openai.APIError as exc:
        if isinstance(exc, openai.APIStatusError | openai.APIConnectionError):
            raise
        raise openai.APIConnectionError(message=f"error in stream: {exc}", request=request) from exc
    finally:
        await stream.close()


class StreamAssembler:
    """``chat.completion.chunk`` values in, one ``chat.completion`` body out.

    Tool calls arrive as deltas keyed by ``index``: the first carries id and name, later ones
    pieces of the arguments. Usage comes in the last chunk (``include_usage``), often one
    with no choices at all."""

    __slots__ = ("calls", "content", "finish_reason", "has_content", "usage")

    def __init__(self) -> None:
        self.content = ""
        self.has_content = False
        self.calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None

    def add(self, chunk: Any) -> bool:
        """Take one chunk; True when the content grew."""
        if not isinstance(chunk, dict):
            return False
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        grew = False
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
            delta = choice.get("delta") or {}
            piece = delta.get("content")
            if isinstance(piece, str):
                self.has_content = True
                if piece:
                    self.content += piece
                    grew = True
            for tc in delta.get("tool_calls") or ():
                self._add_call(tc)
        return grew

    def _add_call(self, tc: dict[str, Any]) -> None:
        index = tc.get("index", len(self.calls))
        call = self.calls.setdefault(index, {"id": None, "name": "", "arguments": []})
        if tc.get("id"):
            call["id"] = tc["id"]
        fn = tc.get("function") or {}
        name = fn.get("name")
        if name:
            # OpenAI sends the name once; some servers resend the whole name in every chunk,
            # a few split it. A repeat must not double it ("read_fileread_file").
            call["name"] = name if name.startswith(call["name"]) else call["name"] + name
        if isinstance(fn.get("arguments"), str):
            call["arguments"].append(fn["arguments"])

    def completion(self) -> dict[str, Any]:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": self.content if self.has_content else None,
        }
        if self.calls:
            message["tool_calls"] = [
                {
                    "id": c["id"] or f"call_{i}",
                    "type": "function",
                    "function": {"name": c["name"], "arguments": "".join(c["arguments"])},
                }
                for i, c in sorted(self.calls.items())
            ]
        choice = {"index": 0, "message": message, "finish_reason": self.finish_reason}
        return {"choices": [choice], "usage": self.usage or {}}


def parse_completion(raw: Any) -> LLMResponse:
    """Read a Chat Completions response body (a dict); tolerant of providers' variations."""
    if not isinstance(raw, dict) or not raw.get("choices"):
        raise LLMUnavailable(f"the model service sent an unexpected answer: {str(raw)[:200]}")
    choice = raw["choices"][0]
    message = choice.get("message") or {}
    calls = []
    for i, c in enumerate(message.get("tool_calls") or []):
        fn = c.get("function") or {}
        args = fn.get("arguments")
        if not isinstance(args, str):
            args = json.dumps(args if args is not None else {})
        calls.append(
            ToolCall(id=c.get("id") or f"call_{i}", name=fn.get("name", ""), arguments=args)
        )
    content = message.get("content")
    if isinstance(content, list):  # some servers return content parts
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return LLMResponse(
        content=content,
        tool_calls=tuple(calls),
        finish_reason=choice.get("finish_reason"),
        usage=raw.get("usage") or {},
    )
