"""LLM provider pieces: Retry-After parsing, retry classification, response parsing."""

from __future__ import annotations

import asyncio
import email.utils
import re
import time
from typing import Any

import openai
import pytest

try:  # newer openai releases ship their HTTP client as httpx2
    import httpx2 as httpx
except ImportError:  # pragma: no cover
    import httpx

from bot.config import LLMConfig
from bot.llm import (
    LLMNotConfigured,
    LLMProvider,
    LLMUnavailable,
    is_retryable,
    parse_completion,
    retry_after_seconds,
)
from tests.fakes.llm_server import FakeLLM, reply
from tests.helpers import closed_port


def _status_error(status: int, headers: dict[str, str] | None = None) -> openai.APIStatusError:
    request = httpx.Request("POST", "http://127.0.0.1/v1/chat/completions")
    response = httpx.Response(status, headers=headers or {}, request=request)
    cls = {429: openai.RateLimitError, 500: openai.InternalServerError}.get(
        status, openai.APIStatusError
    )
    return cls("boom", response=response, body=None)


def test_retry_after_forms() -> None:
    assert retry_after_seconds(_status_error(429, {"retry-after": "3"})) == 3
    assert retry_after_seconds(_status_error(429, {"retry-after-ms": "250"})) == 0.25
    future = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 25 < retry_after_seconds(_status_error(503, {"retry-after": future})) <= 30
    assert retry_after_seconds(_status_error(429)) is None
    assert retry_after_seconds(ValueError("no response")) is None


@pytest.mark.parametrize(
    ("status", "retry"), [(429, True), (500, True), (503, True), (400, False), (401, False)]
)
def test_retry_classification(status: int, retry: bool) -> None:
    assert is_retryable(_status_error(status)) is retry


def test_parse_completion_variants() -> None:
    raw = {
        "choices": [
            {
                "message": {
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                    "tool_calls": [{"function": {"name": "exec", "arguments": {"command": "ls"}}}],
                },
                "finish_reason": "tool_calls",
            }
        ]
    }
    parsed = parse_completion(raw)
    assert parsed.content == "ab"
    assert parsed.tool_calls[0].name == "exec"
    assert parsed.tool_calls[0].arguments == '{"command": "ls"}'
    assert re.fullmatch(r"[A-Za-z0-9]{9}", parsed.tool_calls[0].id)  # invented: fits every dialect
    with pytest.raises(LLMUnavailable):
        parse_completion({"error": "nope"})


def test_not_configured_names_what_to_set() -> None:
    with pytest.raises(LLMNotConfigured) as info:
        LLMProvider(LLMConfig(), "/etc/memobot/config.json")
    text = str(info.value)
    assert "OPENAI_API_KEY" in text and "llm.baseUrl" in text and "/etc/memobot/config.json" in text


async def test_a_refused_connection_is_named_not_called_a_timeout() -> None:
    """Nothing listens on the port: the error says the connection failed, at once, where the
    SDK's aiohttp transport alone says "Request timed out."."""
    port = closed_port()
    provider = LLMProvider(
        LLMConfig.model_validate(
            {
                "baseUrl": f"http://127.0.0.1:{port}/v1",
                "model": "m",
                "retry": {"attempts": 2, "initialDelaySeconds": 0.01, "maxDelaySeconds": 0.02},
            }
        )
    )
    try:
        with pytest.raises(LLMUnavailable) as info:
            await provider.chat([{"role": "user", "content": "hi"}])
    finally:
        await provider.close()
    text = str(info.value)
    assert f"cannot reach the LLM endpoint http://127.0.0.1:{port}/v1" in text
    assert "Connect call failed" in text or "refused" in text.lower(), text
    assert "(APIConnectionError: Connection error: " in text and "timed out" not in text


async def _raw_server(on_connect: Any) -> tuple[asyncio.Server, int]:
    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def test_a_server_that_is_not_http_fails_over_like_any_unreachable_one() -> None:
    """An answer that is not HTTP (here an SSH banner) raised a raw aiohttp error through the
    SDK's aiohttp transport: no retry, no fallback, a crash in doctor. It is a connection error
    naming what came back, retried, then the fallback answers."""
    connections = 0

    async def ssh(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await reader.read(65536)
        writer.write(b"SSH-2.0-OpenSSH_9.6\r\n")
        await writer.drain()
        writer.close()

    server, port = await _raw_server(ssh)
    async with server, FakeLLM() as fallback:
        fallback.script(reply("from the fallback"))
        cfg = {
            "baseUrl": f"http://127.0.0.1:{port}/v1",
            "model": "m",
            "retry": {"attempts": 2, "initialDelaySeconds": 0.01, "maxDelaySeconds": 0.02},
        }
        alone = LLMProvider(LLMConfig.model_validate(cfg))
        both = LLMProvider(
            LLMConfig.model_validate(
                {**cfg, "fallbacks": [{"baseUrl": fallback.base_url, "model": "fb"}]}
            )
        )
        try:
            with pytest.raises(LLMUnavailable) as info:
                await alone.chat([{"role": "user", "content": "hi"}])
            answer = await both.chat([{"role": "user", "content": "hi"}])
        finally:
            await alone.close()
            await both.close()
    assert "(APIConnectionError: Connection error: " in str(info.value)
    assert "SSH-2.0" in str(info.value)  # what came back instead of HTTP
    assert connections == 4  # two tries each time: retried like any connection error
    assert (answer.content, answer.answered_by) == (
        "from the fallback",
        f"fb @ {fallback.base_url}",
    )


async def test_a_server_that_stops_reading_the_request_times_out() -> None:
    """aiohttp has no write timeout: a request body the server never reads held the request
    for ever. Sending and the answer's start get twice ``timeoutSeconds``."""
    held: list[asyncio.StreamWriter] = []

    async def deaf(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # accepted, never read: the socket buffers fill, the send stalls

    server, port = await _raw_server(deaf)
    async with server:
        provider = LLMProvider(
            LLMConfig.model_validate(
                {
                    "baseUrl": f"http://127.0.0.1:{port}/v1",
                    "model": "m",
                    "timeoutSeconds": 0.5,
                    "retry": {"attempts": 1},
                }
            )
        )
        big = "x" * (16 * 1024 * 1024)  # far more than the socket buffers hold
        try:
            with pytest.raises(LLMUnavailable) as info:
                async with asyncio.timeout(30):  # the bug: still waiting here
                    await provider.chat([{"role": "user", "content": big}])
            with pytest.raises(LLMUnavailable):
                async with asyncio.timeout(30):
                    await provider.chat([{"role": "user", "content": big}], on_text=print)
        finally:
            await provider.close()
            for writer in held:
                writer.close()
    assert "APITimeoutError" in str(info.value)


async def test_a_fallback_on_another_server_never_gets_llms_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """llm's key (or OPENAI_API_KEY) belongs to llm's server: a fallback at a baseUrl of its
    own (a local model, another provider) gets its own apiKey or none, never that one."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-the-environment")
    async with FakeLLM() as main, FakeLLM() as local, FakeLLM() as keyed:
        for server in (main, local, keyed):
            server.script({"error": 503}, {"error": 503})  # every endpoint down...
        keyed.reset()
        keyed.script(reply("from the keyed fallback"))  # ...but the last
        retry = {"attempts": 1}
        for llm in (
            {"apiKey": "sk-main-secret"},
            {},  # the key comes from OPENAI_API_KEY
        ):
            provider = LLMProvider(
                LLMConfig.model_validate(
                    {
                        "baseUrl": main.base_url,
                        "model": "m",
                        "retry": retry,
                        **llm,
                        "fallbacks": [
                            {"model": "same-server"},
                            {"baseUrl": local.base_url, "model": "llama"},
                            {"baseUrl": keyed.base_url, "model": "k", "apiKey": "sk-keyed"},
                        ],
                    }
                )
            )
            try:
                answer = await provider.chat([{"role": "user", "content": "hi"}])
            finally:
                await provider.close()
            assert answer.content == "from the keyed fallback"
            key = llm.get("apiKey", "sk-from-the-environment")
            assert {r["headers"]["authorization"] for r in main.requests} == {f"Bearer {key}"}
            assert key not in str([r["headers"] for r in local.requests])
            assert local.requests, "the local fallback was tried"
            assert {r["headers"]["authorization"] for r in keyed.requests} == {"Bearer sk-keyed"}
            for server in (main, local, keyed):
                server.reset()
            for server in (main, local):
                server.script({"error": 503}, {"error": 503})
            keyed.script(reply("from the keyed fallback"))


async def test_a_fallback_whose_base_url_is_empty_never_gets_llms_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``"baseUrl": ""`` (or a ``${VAR}`` that is unset) in a fallback is the SDK's own
    endpoint, OPENAI_BASE_URL or api.openai.com: not llm's server, so not llm's key nor its
    headers."""
    async with FakeLLM() as main, FakeLLM() as other:
        monkeypatch.setenv("OPENAI_BASE_URL", other.base_url)
        main.script({"error": 503}, {"error": 503})
        other.script(reply("from the other server"))
        provider = LLMProvider(
            LLMConfig.model_validate(
                {
                    "baseUrl": main.base_url,
                    "apiKey": "sk-main-secret",
                    "headers": {"X-Main-Token": "main-header-secret"},
                    "model": "m",
                    "retry": {"attempts": 1},
                    "fallbacks": [{"baseUrl": "", "model": "x"}],
                }
            )
        )
        try:
            answer = await provider.chat([{"role": "user", "content": "hi"}])
        finally:
            await provider.close()
        assert answer.content == "from the other server"
        assert main.requests and other.requests
        sent = str([r["headers"] for r in other.requests])
        assert "sk-main-secret" not in sent and "main-header-secret" not in sent
