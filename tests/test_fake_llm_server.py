"""The fake LLM server, checked against the real openai SDK so other tests can trust it."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletion

from tests.fakes.llm_server import (
    ControlClient,
    FakeLLM,
    FakeLLMProcess,
    alternation_problem,
    call,
    check_step,
    disconnect,
    echo_text,
    error,
    hang,
    history_problem,
    reply,
    tool_step,
)

USER = [{"role": "user", "content": "hello there\nsecond line"}]


@pytest.fixture
async def llm() -> AsyncIterator[FakeLLM]:
    async with FakeLLM() as server:
        yield server


@pytest.fixture
async def client(llm: FakeLLM) -> AsyncIterator[openai.AsyncOpenAI]:
    sdk = openai.AsyncOpenAI(base_url=llm.base_url, api_key="sk-test", max_retries=0, timeout=5)
    yield sdk
    await sdk.close()


async def ask(client: openai.AsyncOpenAI, text: str = "hi", **kwargs: Any) -> ChatCompletion:
    messages = [{"role": "user", "content": text}]
    return await client.chat.completions.create(model="m1", messages=messages, **kwargs)


# --- answers ---


async def test_default_echo_is_deterministic_and_logged(
    llm: FakeLLM, client: openai.AsyncOpenAI
) -> None:
    resp = await client.chat.completions.create(model="gpt-x", messages=USER)
    assert resp.choices[0].message.content == "echo: hello there"
    assert resp.choices[0].finish_reason == "stop"
    assert resp.model == "gpt-x"
    assert resp.usage is not None and resp.usage.total_tokens > 0

    [entry] = llm.requests
    assert entry["path"] == "/v1/chat/completions"
    assert entry["headers"]["authorization"] == "Bearer sk-test"
    assert entry["body"]["messages"] == USER
    assert entry["outcome"] == "default" and entry["status"] == 200
    assert entry["reply"]["content"] == "echo: hello there"


def test_echo_takes_first_line_trimmed() -> None:
    assert echo_text("  one\ntwo") == "echo: one"
    assert echo_text("x" * 500) == "echo: " + "x" * 200
    assert echo_text("") == "echo: "


async def test_script_is_fifo(llm: FakeLLM, client: openai.AsyncOpenAI) -> None:
    llm.script(reply("first"), {"text": "second"})
    answers = [(await ask(client)).choices[0].message.content for _ in range(3)]
    assert answers == ["first", "second", "echo: hi"]
    assert [e["outcome"] for e in llm.requests] == ["text", "text", "default"]


async def test_tool_calls_parse_in_sdk(llm: FakeLLM, client: openai.AsyncOpenAI) -> None:
    llm.script(
        tool_step(call("exec", {"command": "ls"}), ("read_file", {"path": "a.md"}), text="ok")
    )
    resp = await ask(client)
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "ok"
    calls = choice.message.tool_calls or []
    assert [c.id for c in calls] == ["call_1", "call_2"]
    assert calls[0].function.name == "exec"
    assert json.loads(calls[0].function.arguments) == {"command": "ls"}
    assert calls[1].function.name == "read_file"


async def test_low_level_post_with_bytes_body(llm: FakeLLM, client: openai.AsyncOpenAI) -> None:
    llm.script({"tool_calls": [{"name": "exec", "arguments": "{broken", "id": "call_x"}]})
    body = json.dumps({"model": "m", "messages": USER}).encode()
    resp = await client.post(
        "/chat/completions",
        cast_to=ChatCompletion,
        content=body,
        options={"headers": {"Content-Type": "application/json"}},
    )
    call_ = (resp.choices[0].message.tool_calls or [])[0]
    assert (call_.id, call_.function.arguments) == ("call_x", "{broken")
    assert resp.choices[0].message.content is None


async def test_stream_text(llm: FakeLLM, client: openai.AsyncOpenAI) -> None:
    llm.script(reply("a streamed answer"))
    stream = await ask(client, stream=True, stream_options={"include_usage": True})
    chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "a streamed answer"
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) > 1
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None


async def test_stream_tool_calls(llm: FakeLLM, client: openai.AsyncOpenAI) -> None:
    llm.script(tool_step(("exec", {"command": "ls -la"}), ("exec", {"command": "pwd"})))
    stream = await ask(client, stream=True)
    calls: dict[int, dict[str, str]] = {}
    finish = None
    async for chunk in stream:
        assert chunk.usage is None
        choice = chunk.choices[0]
        finish = choice.finish_reason or finish
        for delta in choice.delta.tool_calls or []:
            acc = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
            acc["id"] += delta.id or ""
            if delta.function:
                acc["name"] += delta.function.name or ""
                acc["arguments"] += delta.function.arguments or ""
    assert finish == "tool_calls"
    assert [c["id"] for c in calls.values()] == ["call_1", "call_2"]
    assert [json.loads(c["arguments"])["command"] for c in calls.values()] == ["ls -la", "pwd"]


async def test_models_endpoint(client: openai.AsyncOpenAI) -> None:
    models = await client.models.list()
    assert [m.id async for m in models] == ["fake-model"]


# --- failures ---


async def test_429_carries_retry_after(llm: FakeLLM, client: openai.AsyncOpenAI) -> None:
    llm.script(error(429, retry_after=1))
    with pytest.raises(openai.RateLimitError) as info:
        await ask(client)
    assert info.value.response.headers["retry-after"] == "1"
    assert info.value.code == "rate_limit_exceeded"
    assert llm.requests[0]["status"] == 429


@pytest.mark.parametrize(
    ("status", "exc_type"),
    [
        (500, openai.InternalServerError),
        (503, openai.InternalServerError),
        (400, openai.BadRequestError),
        (401, openai.AuthenticationError),
    ],
)
async def test_error_statuses(
    llm: FakeLLM, client: openai.AsyncOpenAI, status: int, exc_type: type[Exception]
) -> None:
    llm.script({"error": status, "message": "scripted", "code": "context_length_exceeded"})
    with pytest.raises(exc_type) as info:
        await ask(client)
    assert isinstance(info.value, openai.APIStatusError)
    assert info.value.status_code == status
    assert info.value.body == {
        "message": "scripted",
        "type": info.value.type,
        "param": None,
        "code": "context_length_exceeded",
    }


async def test_delay_past_client_timeout(llm: FakeLLM, client: openai.AsyncOpenAI) -> None:
    llm.script(reply("late", delay=5))
    with pytest.raises(openai.APITimeoutError):
        await ask(client, timeout=0.2)


async def test_delay_does_not_block_other_requests(
    llm: FakeLLM, client: openai.AsyncOpenAI
) -> None:
    llm.script(reply("slow", delay=2.0, when_user_contains="slow"))
    slow = asyncio.create_task(ask(client, "slow"))
    await asyncio.sleep(0.2)  # the slow request is in the server
    fast = await ask(client, "fast")
    # Answered while the slow one still waits: it did not queue behind it. (An order, not a
    # time limit: a loaded machine may take long, but not 2 s for one local request.)
    assert not slow.done()
    assert fast.choices[0].message.content == "echo: fast"
    assert (await slow).choices[0].message.content == "slow"


async def test_global_delay_applies_to_default_answers() -> None:
    async with FakeLLM(delay=0.2, log_bodies=False) as server:
        sdk = openai.AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0)
        started = time.monotonic()
        await asyncio.gather(*(ask(sdk, f"u{i}") for i in range(10)))
        assert 0.2 <= time.monotonic() - started < 1.0  # concurrent, not serial
        assert all(e["body"] is None for e in server.requests)
        await sdk.close()


async def test_disconnect(llm: FakeLLM, client: openai.AsyncOpenAI) -> None:
    llm.script(disconnect())
    with pytest.raises(openai.APIConnectionError) as info:
        await ask(client)
    assert not isinstance(info.value, openai.APITimeoutError)
    assert llm.requests[0]["outcome"] == "disconnect"
    assert (await ask(client)).choices[0].message.content == "echo: hi"


async def test_disconnect_mid_stream(llm: FakeLLM, client: openai.AsyncOpenAI) -> None:
    llm.script(reply("a longer streamed answer", disconnect_after_chunks=2))
    stream = await ask(client, stream=True)
    with pytest.raises(openai.APIConnectionError):
        async for _ in stream:
            pass


async def test_hang_ends_when_server_stops() -> None:
    server = FakeLLM(script=[hang()])
    await server.start()
    sdk = openai.AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=10)
    pending = asyncio.create_task(ask(sdk))
    await server.wait_for_requests(1, timeout=2)
    started = time.monotonic()
    await server.stop()
    with pytest.raises(openai.APIConnectionError):
        await pending
    assert time.monotonic() - started < 2
    await sdk.close()


async def test_strict_mode_refuses_unscripted_requests() -> None:
    async with FakeLLM(mode="strict") as server:
        sdk = openai.AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0)
        with pytest.raises(openai.InternalServerError):
            await ask(sdk)
        assert server.requests[0]["outcome"] == "unscripted"
        await sdk.close()


async def test_api_key_required() -> None:
    async with FakeLLM(api_key="right") as server:
        sdk = openai.AsyncOpenAI(base_url=server.base_url, api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            await ask(sdk)
        await sdk.close()


# --- history validation ---

TOOL_CALL = {"id": "c1", "type": "function", "function": {"name": "exec", "arguments": "{}"}}
ASSISTANT_CALLS = {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]}
TOOL_RESULT = {"role": "tool", "tool_call_id": "c1", "content": "done"}


@pytest.mark.parametrize(
    ("messages", "fragment"),
    [
        ([{"role": "robot", "content": "x"}], "role"),
        ([{"role": "user"}], "content"),
        ([*USER, TOOL_RESULT], "preceding message with 'tool_calls'"),
        ([*USER, ASSISTANT_CALLS, USER[0]], "did not have response messages"),
        ([*USER, ASSISTANT_CALLS], "did not have response messages"),
        ([*USER, ASSISTANT_CALLS, TOOL_RESULT, TOOL_RESULT], "answered twice"),
        (
            [*USER, {**ASSISTANT_CALLS, "tool_calls": [{**TOOL_CALL, "function": {"name": "e"}}]}],
            "arguments",
        ),
        ([*USER, {**ASSISTANT_CALLS, "tool_calls": []}], "non-empty"),
    ],
)
def test_history_problems(messages: list[dict], fragment: str) -> None:
    problem = history_problem(messages)
    assert problem is not None and fragment in problem


def test_valid_history_passes() -> None:
    assert (
        history_problem([*USER, ASSISTANT_CALLS, TOOL_RESULT, {"role": "user", "content": "x"}])
        is None
    )
    assert history_problem([*USER, ASSISTANT_CALLS, TOOL_RESULT]) is None


async def test_invalid_history_is_a_400(llm: FakeLLM, client: openai.AsyncOpenAI) -> None:
    llm.script(reply("never used"))
    with pytest.raises(openai.BadRequestError) as info:
        await client.chat.completions.create(model="m", messages=[*USER, ASSISTANT_CALLS])
    assert "c1" in info.value.message
    [entry] = llm.requests
    assert entry["outcome"] == "invalid" and "c1" in entry["error"]
    assert llm.pending == 1  # a rejected request does not consume a step


async def test_missing_model_is_a_400(llm: FakeLLM, client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError):
        await client.post("/chat/completions", cast_to=object, body={"messages": USER})


def test_malformed_steps_fail_when_scripted() -> None:
    for bad in ({"txt": "typo"}, {"error": 200}, {"tool_calls": []}, {"hang": True, "error": 500}):
        with pytest.raises(ValueError):
            check_step(bad)
    assert check_step({"delay": 1}) == {"delay": 1}


# --- concurrency, thread mode, process mode ---


async def test_when_user_contains_routes_steps(llm: FakeLLM, client: openai.AsyncOpenAI) -> None:
    llm.script(
        reply("for alice 1", when_user_contains="alice"),
        reply("for bob 1", when_user_contains="bob"),
        reply("for alice 2", when_user_contains="alice"),
        reply("for anyone"),
    )
    bob = await ask(client, "I am bob")
    alice = await ask(client, "I am alice")
    alice2 = await ask(client, "alice again")
    other = await ask(client, "carol")
    assert [r.choices[0].message.content for r in (bob, alice, alice2, other)] == [
        "for bob 1",
        "for alice 1",
        "for alice 2",
        "for anyone",
    ]


def test_thread_mode_from_sync_code() -> None:
    with FakeLLM.start_in_thread(script=[reply("from a thread")]) as handle:
        sdk = openai.OpenAI(base_url=handle.base_url, api_key="x", max_retries=0, timeout=5)
        messages: Any = USER
        first = sdk.chat.completions.create(model="m", messages=messages)
        handle.script(tool_step(("exec", {"command": "ls"})))
        second = sdk.chat.completions.create(model="m", messages=messages)
        assert first.choices[0].message.content == "from a thread"
        assert second.choices[0].finish_reason == "tool_calls"
        assert len(handle.wait_for_requests(2, timeout=1)) == 2
        handle.reset()
        assert handle.requests == [] and handle.pending == 0
        sdk.close()


def test_standalone_process(tmp_path: Path) -> None:
    proc = FakeLLMProcess.spawn(tmp_path, script=[reply("from the file")], delay=0.0)
    try:
        port = int((tmp_path / "fake_llm.port").read_text())
        assert proc.base_url == f"http://127.0.0.1:{port}/v1"
        sdk = openai.OpenAI(base_url=proc.base_url, api_key="k", max_retries=0, timeout=5)
        messages: Any = USER
        first = sdk.chat.completions.create(model="m", messages=messages)
        control = ControlClient(proc.base_url)
        assert control.script(error(429, retry_after=2), tool_step(("exec", {"c": 1}))) == 2
        with pytest.raises(openai.RateLimitError):
            sdk.chat.completions.create(model="m", messages=messages)
        third = sdk.chat.completions.create(model="m", messages=messages)
        sdk.close()

        assert first.choices[0].message.content == "from the file"
        assert third.choices[0].message.tool_calls is not None
        log = control.requests()
        assert [e["outcome"] for e in log] == ["text", "error", "tool_calls"]
        assert log[0]["headers"]["authorization"] == "Bearer k"
        assert [e["seq"] for e in control.requests(since=2)] == [3]
        control.reset()
        assert control.status()["requests"] == 0
    finally:
        assert proc.stop() == 0


@pytest.mark.parametrize(
    ("roles", "fragment"),
    [
        (["system", "user", "user"], "'user' after role 'user'"),
        (["user", "assistant+calls", "tool", "user"], "'user' after role 'tool'"),
        (["system", "assistant", "user"], "'assistant' as the first message"),
        (["user", "assistant", "assistant", "user"], "'assistant' after role 'assistant'"),
        (["system", "user", "assistant+calls", "tool", "assistant", "user"], None),
    ],
)
async def test_strict_alternation_refuses_what_strict_chat_templates_refuse(
    roles: list[str], fragment: str | None
) -> None:
    shapes = {
        "system": {"role": "system", "content": "s"},
        "user": USER[0],
        "assistant": {"role": "assistant", "content": "a"},
        "assistant+calls": ASSISTANT_CALLS,
        "tool": TOOL_RESULT,
    }
    messages = [shapes[r] for r in roles]
    assert history_problem(messages) is None  # valid for the Chat Completions API
    problem = alternation_problem(messages)
    assert (problem is None) if fragment is None else (fragment in (problem or ""))
    async with FakeLLM(strict_alternation=True) as strict, FakeLLM() as lenient:
        for server, refused in ((strict, fragment is not None), (lenient, False)):
            sdk = openai.AsyncOpenAI(base_url=server.base_url, api_key="k", max_retries=0)
            try:
                if refused:
                    with pytest.raises(openai.BadRequestError, match="alternate"):
                        await sdk.chat.completions.create(model="m", messages=messages)
                else:
                    await sdk.chat.completions.create(model="m", messages=messages)
            finally:
                await sdk.close()
