"""The LLM provider: any OpenAI-compatible Chat Completions endpoint, one retry policy.

The openai SDK does the HTTP, auth and error mapping; its own retries are off so that tenacity
is the only retry policy. The request body is serialised by us once and handed to the SDK's
low-level ``post`` as bytes: the typed ``chat.completions.create`` walks and transforms every
message on every call, which costs hundreds of milliseconds for a long session.
"""

from __future__ import annotations

import asyncio
import email.utils
import importlib
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
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


class LLMError(Exception):
    """Base of the provider's errors; ``user_message`` is safe to show in a chat."""

    user_message = "The model request failed."


class LLMNotConfigured(LLMError):
    pass


class LLMUnavailable(LLMError):
    """Transient failures outlasted every retry."""

    user_message = "The model service is unavailable right now; try again in a moment."


class LLMRejected(LLMError):
    """A permanent error (bad request, auth, unknown model): retrying cannot help."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"HTTP {status}: {detail}")
        self.status = status
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


class LLMProvider:
    """Chat Completions against ``llm.baseUrl`` with tenacity retries."""

    def __init__(self, cfg: LLMConfig, config_path: str = "~/.memobot/config.json") -> None:
        self.cfg = cfg
        base_url = cfg.resolved_base_url()
        api_key = cfg.resolved_api_key()
        if not base_url and not api_key:
            from bot.invocation import command_for

            raise LLMNotConfigured(
                NOT_CONFIGURED_HELP.format(
                    config=config_path, onboard=command_for(config_path, "onboard")
                )
            )
        self._base_url = base_url
        self._api_key = api_key
        self._client: openai.AsyncOpenAI | None = None
        self.model = cfg.model

    @property
    def endpoint(self) -> str:
        """The base URL requests go to, for messages (credentials in it are masked in logs)."""
        return self._base_url or DEFAULT_ENDPOINT

    @property
    def client(self) -> openai.AsyncOpenAI:
        """The SDK client, made on first use: importing openai costs about half a second, which
        the daemon spends after its channels are up (``warm_up``) instead of before."""
        if self._client is None:
            import openai

            # Local servers (Ollama, vLLM, llama.cpp) take any key; the SDK insists on one.
            self._client = openai.AsyncOpenAI(
                api_key=self._api_key or "not-needed",
                base_url=self._base_url or None,
                max_retries=0,
                timeout=self.cfg.timeout_seconds,
            )
        return self._client

    async def warm_up(self) -> None:
        """Import the SDK in a worker thread so the first answer does not wait for it."""
        await asyncio.to_thread(importlib.import_module, "openai")
        _ = self.client

    async def transcribe(self, path: str, model: str) -> str:
        """Speech to text through the endpoint's ``/audio/transcriptions`` (OpenAI-compatible)."""
        import openai

        try:
            data = await asyncio.to_thread(Path(path).read_bytes)
            result = await self.client.audio.transcriptions.create(
                model=model, file=(os.path.basename(path), data)
            )
        except (openai.OpenAIError, OSError) as exc:
            raise LLMUnavailable(f"transcription failed: {exc}") from exc
        return str(getattr(result, "text", "") or "").strip()

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()

    def _body(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        force_tool: str | None = None,
        max_tokens: int | None = None,
    ) -> bytes:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "max_tokens": max_tokens or self.cfg.max_tokens,
            "temperature": self.cfg.temperature,
        }
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
    ) -> LLMResponse:
        """One completion. Raises LLMUnavailable after retries, LLMRejected on a 4xx.

        ``force_tool`` makes the model answer with a call to that tool (structured output).
        """
        import openai

        payload = self._body(messages, tools, force_tool, max_tokens)
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.cfg.retry.attempts),
            wait=_RetryAfterOrBackoff(
                self.cfg.retry.initial_delay_seconds, self.cfg.retry.max_delay_seconds
            ),
            retry=retry_if_exception(is_retryable),
            before_sleep=lambda s: log.warning(
                "llm request failed (%s), retry %d/%d in %.1fs session=%s",
                _describe(s.outcome.exception()) if s.outcome else "?",
                s.attempt_number,
                self.cfg.retry.attempts - 1,
                s.upcoming_sleep,
                session_key,
            ),
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    raw = await self.client.post(
                        "/chat/completions",
                        cast_to=object,
                        content=payload,
                        options={"headers": {"Content-Type": "application/json"}},
                    )
        except openai.APIStatusError as exc:
            if is_retryable(exc):
                raise LLMUnavailable(
                    f"{self.endpoint} answered {_describe(exc)}; gave up after "
                    f"{self.cfg.retry.attempts} tries"
                ) from exc
            raise LLMRejected(exc.status_code, _error_detail(exc)) from exc
        except openai.APIConnectionError as exc:
            # Name the endpoint and the setting: "Connection error." alone leaves the person
            # guessing which server was meant.
            raise LLMUnavailable(
                f"cannot reach the LLM endpoint {self.endpoint} ({_describe(exc)}: {exc}) "
                f"after {self.cfg.retry.attempts} tries; check llm.baseUrl (or "
                "OPENAI_BASE_URL) and that the server is running"
            ) from exc
        return parse_completion(raw)


def _error_detail(exc: Any) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
    return str(getattr(exc, "message", exc))


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
