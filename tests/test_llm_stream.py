"""Streaming from the model: SSE through the SDK, assembled like a plain answer, one retry
policy for stalls and broken streams, and servers that do not stream."""

from __future__ import annotations

import itertools
import json
import time

import pytest

from bot.config import LLMConfig
from bot.llm import LLMProvider, LLMUnavailable, StreamAssembler
from tests.fakes.llm_server import FakeLLM, reply, tool_step


def _provider(llm: FakeLLM, **extra: object) -> LLMProvider:
    cfg = LLMConfig.model_validate(
        {
            "baseUrl": llm.base_url,
            "model": "fake",
            "retry": {"attempts": 3, "initialDelaySeconds": 0.01, "maxDelaySeconds": 0.05},
            **extra,
        }
    )
    return LLMProvider(cfg)


async def test_stream_tells_the_text_as_it_arrives_and_assembles_the_answer() -> None:
    async with FakeLLM() as llm:
        llm.script(reply("one two three four five six", pieces=6, chunk_delay=0.05))
        provider = _provider(llm)
        seen: list[tuple[float, str]] = []
        started = time.monotonic()
        response = await provider.chat(
            [{"role": "user", "content": "hi"}],
            on_text=lambda text: seen.append((time.monotonic(), text)),
        )
        finished = time.monotonic()
        await provider.close()
    body = llm.requests[0]["body"]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert response.content == "one two three four five six"
    assert response.finish_reason == "stop"
    assert response.usage["total_tokens"] > 0  # read from the last chunk
    assert len(seen) == 6
    assert seen[-1][1] == response.content
    assert all(b[1].startswith(a[1]) for a, b in itertools.pairwise(seen))
    # The first text came well before the last (5 pauses of 50 ms): streamed, not buffered.
    assert seen[-1][0] - seen[0][0] >= 0.2
    assert finished - started >= 0.25


async def test_model_calls_share_the_channels_http_stack() -> None:
    """The SDK runs on aiohttp (its httpx pool cost 1.5 ms of CPU more per message under 50 busy
    chats): a fresh install without the extra would silently fall back, so this guards it."""
    import openai

    async with FakeLLM() as llm:
        llm.script(reply("on aiohttp", pieces=3), reply("again"))
        provider = _provider(llm)
        first = await provider.chat([{"role": "user", "content": "hi"}], on_text=lambda _: None)
        second = await provider.chat([{"role": "user", "content": "hi"}])
        http_client = provider._primary.client._client  # the SDK's HTTP client
        await provider.close()
    assert isinstance(http_client, openai.DefaultAioHttpClient)
    assert (first.content, second.content) == ("on aiohttp", "again")


async def test_tool_call_deltas_are_assembled() -> None:
    async with FakeLLM() as llm:
        llm.script(
            tool_step(
                ("read_file", {"path": "notes/a very long file name.txt"}),
                ("exec", {"command": "ls -la"}),
                text="Looking.",
            )
        )
        provider = _provider(llm)
        response = await provider.chat([{"role": "user", "content": "x"}], on_text=lambda t: None)
        await provider.close()
    assert response.content == "Looking."
    assert [c.name for c in response.tool_calls] == ["read_file", "exec"]
    assert json.loads(response.tool_calls[0].arguments) == {
        "path": "notes/a very long file name.txt"
    }
    assert json.loads(response.tool_calls[1].arguments) == {"command": "ls -la"}
    assert response.tool_calls[0].id != response.tool_calls[1].id
    assert response.finish_reason == "tool_calls"


async def test_a_stalled_stream_is_retried_like_a_timeout() -> None:
    async with FakeLLM() as llm:
        llm.script(
            reply("stalled answer", pieces=3, chunk_delay=2),
            reply("fresh answer"),
        )
        provider = _provider(llm, streamIdleSeconds=0.3)
        seen: list[str] = []
        started = time.monotonic()
        response = await provider.chat([{"role": "user", "content": "x"}], on_text=seen.append)
        took = time.monotonic() - started
        await provider.close()
    assert response.content == "fresh answer"
    assert len(llm.requests) == 2
    assert took < 3  # the stall was cut at streamIdleSeconds, not waited out
    assert seen[-1] == "fresh answer"


async def test_a_slow_steady_stream_is_not_cut() -> None:
    """streamIdleSeconds bounds the silence between chunks, not the whole answer."""
    async with FakeLLM() as llm:
        llm.script(reply("one two three four five six seven", pieces=7, chunk_delay=0.15))
        provider = _provider(llm, streamIdleSeconds=0.4)
        started = time.monotonic()
        response = await provider.chat([{"role": "user", "content": "x"}], on_text=lambda t: None)
        took = time.monotonic() - started
        await provider.close()
    assert response.content == "one two three four five six seven"
    assert len(llm.requests) == 1 and took > 0.8  # longer than the idle limit, in one go


async def test_stalls_everywhere_fail_over_then_give_up() -> None:
    async with FakeLLM() as llm:
        llm.script(*[reply("never", chunk_delay=2) for _ in range(3)], reply("from the fallback"))
        provider = _provider(
            llm,
            streamIdleSeconds=0.2,
            fallbacks=[{"model": "other", "retry": {"attempts": 1}}],
        )
        response = await provider.chat([{"role": "user", "content": "x"}], on_text=lambda t: None)
        await provider.close()
        assert response.content == "from the fallback"
        assert [r["model"] for r in llm.requests] == ["fake", "fake", "fake", "other"]
        llm.script(*[reply("never", chunk_delay=2) for _ in range(3)])
        provider = _provider(llm, streamIdleSeconds=0.2)
        with pytest.raises(LLMUnavailable):
            await provider.chat([{"role": "user", "content": "x"}], on_text=lambda t: None)
        await provider.close()


async def test_a_stream_cut_mid_way_is_retried() -> None:
    async with FakeLLM() as llm:
        llm.script(reply("cut short", disconnect_after_chunks=2), reply("whole"))
        provider = _provider(llm)
        response = await provider.chat([{"role": "user", "content": "x"}], on_text=lambda t: None)
        await provider.close()
    assert response.content == "whole"
    assert len(llm.requests) == 2


async def test_a_server_that_does_not_stream_still_answers() -> None:
    async with FakeLLM() as llm:
        llm.script(reply("all at once", no_stream=True))
        provider = _provider(llm)
        seen: list[str] = []
        response = await provider.chat([{"role": "user", "content": "x"}], on_text=seen.append)
        await provider.close()
    assert llm.requests[0]["body"]["stream"] is True
    assert response.content == "all at once"
    assert response.usage["total_tokens"] > 0
    assert seen == []  # nothing streamed: the channel shows the final answer as today


async def test_without_a_listener_the_request_is_not_streamed() -> None:
    async with FakeLLM() as llm:
        provider = _provider(llm)
        await provider.chat([{"role": "user", "content": "x"}])
        await provider.close()
    assert "stream" not in llm.requests[0]["body"]


def test_assembler_tolerates_provider_variations() -> None:
    a = StreamAssembler()
    assert not a.add({"choices": [{"index": 0, "delta": {"role": "assistant"}}]})
    assert a.add({"choices": [{"index": 0, "delta": {"content": "hi"}}]})
    # usage inside the last chunk that still has a choice (Ollama-style)
    a.add(
        {
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
            "usage": {"total_tokens": 7},
        }
    )
    body = a.completion()
    assert body["choices"][0]["message"]["content"] == "hi"
    assert body["usage"] == {"total_tokens": 7}
    assert body["choices"][0]["finish_reason"] == "stop"


def test_a_tool_name_resent_in_every_chunk_is_not_doubled() -> None:
    """Some servers (and gateways in front of them) repeat the whole function name in every
    tool-call chunk; others split it. Both give the one name."""
    resent, split = StreamAssembler(), StreamAssembler()
    for args in ("", '{"path":', '"a.txt"}'):
        tc = {"index": 0, "id": "c1", "function": {"name": "read_file", "arguments": args}}
        resent.add({"choices": [{"index": 0, "delta": {"tool_calls": [tc]}}]})
    for name, args in (("read_", ""), ("file", '{"path":"a.txt"}')):
        tc = {"index": 0, "id": "c1", "function": {"name": name, "arguments": args}}
        split.add({"choices": [{"index": 0, "delta": {"tool_calls": [tc]}}]})
    for assembler in (resent, split):
        [call] = assembler.completion()["choices"][0]["message"]["tool_calls"]
        assert call["function"] == {"name": "read_file", "arguments": '{"path":"a.txt"}'}
