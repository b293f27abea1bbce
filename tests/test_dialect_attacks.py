"""A hostile or broken LLM server against memobot's client (bot.llm, bot.dialects).

What a server (or a proxy in the middle, or a model steered by a web page) sends back must
never crash a turn with a traceback, hang it for ever, grow memory without bound, show hidden
reasoning, or carry memobot's secrets elsewhere. The server here is a raw aiohttp one that
writes exactly the bytes a test gives it; the dialect fakes (tests/fakes/llm_dialects.py)
are for well-behaved providers."""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web

from bot.config import ConfigError, LLMConfig, parse_config, secret_strings
from bot.dialects import PROFILES, ReasoningSplitter, detect_provider, split_reasoning
from bot.llm import LLMError, LLMProvider, LLMUnavailable, StreamAssembler
from tests.fakes.llm_server import FakeLLM
from tests.fakes.llm_server import reply as fake_reply

Frames = Callable[[], AsyncIterator[bytes]]


def sse(data: Any) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data)
    return f"data: {text}\n\n".encode()


def chunk(delta: Any, finish: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def frames(*pieces: bytes, then: Callable[[], Awaitable[None]] | None = None) -> Frames:
    async def gen() -> AsyncIterator[bytes]:
        for piece in pieces:
            yield piece
        if then is not None:
            await then()

    return gen


class Hostile:
    """One chat endpoint answering what the test says: ``frames`` (an SSE stream, written
    piece by piece) or ``plain`` (a JSON body, as bytes)."""

    def __init__(self) -> None:
        self.frames: Frames | None = None
        self.handler: Callable[[web.Request], Awaitable[web.StreamResponse]] | None = None
        self.plain: bytes = b""
        self.content_type = "application/json"
        self.status = 200
        self.requests: list[web.Request] = []
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        if self.handler is not None:
            return await self.handler(request)
        await request.read()
        self.requests.append(request)
        if self.frames is None:
            return web.Response(body=self.plain, status=self.status, content_type=self.content_type)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            async for piece in self.frames():
                await response.write(piece)
        except (ConnectionResetError, asyncio.CancelledError):
            pass  # memobot hung up: what the test wanted to see
        return response

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


@pytest.fixture
async def hostile() -> AsyncIterator[Hostile]:
    server = Hostile()
    await server.start()
    yield server
    await server.stop()


def provider_for(server: Hostile, **llm: Any) -> LLMProvider:
    cfg: dict[str, Any] = {
        "baseUrl": server.base_url,
        "model": "m",
        "retry": {"attempts": 1},
        **llm,
    }
    return LLMProvider(LLMConfig.model_validate(cfg))


async def ask(server: Hostile, *, stream: bool = True, **llm: Any) -> Any:
    """The provider's answer to one message (or the LLMError it raised)."""
    provider = provider_for(server, **llm)
    try:
        return await provider.chat(
            [{"role": "user", "content": "hi"}], on_text=(lambda _: None) if stream else None
        )
    except LLMError as exc:
        return exc
    finally:
        await provider.close()


# -- odd types: a clear error or a tolerated answer, never a traceback -------------------------


@pytest.mark.parametrize(
    "event",
    [
        chunk({"tool_calls": 5}),
        {"choices": 5},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": [0], "id": "a"}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": {"i": 0}, "id": "a"}]}}]},
        chunk({"tool_calls": [{"index": 0, "id": "a", "function": {"name": 5}}]}),
        chunk({"content": "ok"}, finish=["stop"]),  # type: ignore[arg-type]
        chunk({"content": "ok", "reasoning_content": ["a"], "reasoning": {"b": 1}}),
        chunk({"reasoning_content": 5, "reasoning_details": "x"}),
        chunk({"tool_calls": [{"index": "0", "id": "a", "extra_content": [1]}]}),
        chunk({"tool_calls": [{"index": 0, "id": 7, "function": {"arguments": 5}}]}),
        {"choices": [{"index": 0, "delta": "text"}], "usage": "lots", "x_groq": 5},
    ],
    ids=[
        "tool_calls-number",
        "choices-number",
        "index-list",
        "index-dict",
        "name-number",
        "finish-list",
        "reasoning-list",
        "reasoning-number",
        "extra-list",
        "id-number",
        "delta-string",
    ],
)
async def test_a_stream_of_odd_types_is_no_traceback(hostile: Hostile, event: Any) -> None:
    hostile.frames = frames(sse(event), sse("[DONE]"))
    answer = await ask(hostile)
    assert not isinstance(answer, BaseException) or isinstance(answer, LLMError)
    if not isinstance(answer, LLMError):
        assert answer.finish_reason is None or isinstance(answer.finish_reason, str)
        assert all(isinstance(c.name, str) for c in answer.tool_calls)


@pytest.mark.parametrize(
    "body",
    [
        {"choices": {"0": {}}},
        {"choices": ["x"]},
        {"choices": [{"message": "hi"}]},
        {"choices": [{"message": {"tool_calls": 5}}]},
        {"choices": [{"message": {"tool_calls": [{"id": "a", "function": "x"}]}}]},
        {"choices": [{"message": {"content": [{"type": "text", "text": 5}]}}]},
        {"choices": [{"message": {"content": 5}}]},
        {"choices": [{"message": {"content": {"a": 1}}}]},
        {"choices": [{"message": {"tool_calls": [{"id": "a", "function": {"name": 5}}]}}]},
        {"choices": [{"message": {"content": "x"}, "finish_reason": 7}], "usage": [1]},
    ],
)
async def test_a_plain_answer_of_odd_types_is_no_traceback(hostile: Hostile, body: Any) -> None:
    hostile.plain = json.dumps(body).encode()
    answer = await ask(hostile, stream=False)
    if isinstance(answer, LLMError):
        assert "unexpected answer" in str(answer)
        return
    assert answer.content is None or isinstance(answer.content, str)
    assert answer.finish_reason is None or isinstance(answer.finish_reason, str)
    assert isinstance(answer.usage, dict)
    assert all(isinstance(c.name, str) for c in answer.tool_calls)


@pytest.mark.parametrize("body", [b"\xff\xfe not json", b"{not json", b"\x80\x81"])
async def test_a_plain_answer_that_is_not_json_is_a_clear_error(
    hostile: Hostile, body: bytes
) -> None:
    hostile.plain = body
    answer = await ask(hostile, stream=False)
    assert isinstance(answer, LLMUnavailable)
    assert "not JSON" in str(answer) or "unreadable" in str(answer)


async def test_a_tool_call_id_of_megabytes_is_replaced(hostile: Hostile) -> None:
    """It would be kept in the session and sent back with every later request."""
    call = {"id": "x" * 10_000_000, "function": {"name": "exec", "arguments": "{}"}}
    hostile.plain = json.dumps({"choices": [{"message": {"tool_calls": [call]}}]}).encode()
    answer = await ask(hostile, stream=False)
    assert len(answer.tool_calls[0].id) == 9


# -- streams that do not end ------------------------------------------------------------------


def stream_of(*pieces: bytes, forever: bytes | None = None, every: float = 0.01) -> Frames:
    """``pieces``, then ``forever`` (if given) every ``every`` seconds until memobot hangs up,
    else a connection held open and silent."""

    async def gen() -> AsyncIterator[bytes]:
        for piece in pieces:
            yield piece
        while True:
            if forever is None:
                await asyncio.sleep(3600)
            yield forever
            await asyncio.sleep(every)

    return gen


KEEPALIVE = b": keep-alive\n\n"


@pytest.mark.parametrize(
    "after", [None, KEEPALIVE, sse({"choices": []})], ids=["silent", "ka", "data"]
)
async def test_done_ends_the_answer_whatever_the_connection_does_after(
    hostile: Hostile, after: bytes | None
) -> None:
    """Waiting for the end of the body after [DONE] threw a whole answer away as a timeout
    (connection held open) or held the turn for ever (keep-alives or data after it)."""
    hostile.frames = stream_of(
        sse(chunk({"content": "answer"}, "stop")), sse("[DONE]"), forever=after
    )
    started = time.monotonic()
    answer = await ask(hostile, streamIdleSeconds=5)
    assert answer.content == "answer"
    assert time.monotonic() - started < 2


async def test_keepalives_alone_hold_a_stream_for_a_bounded_time(hostile: Hostile) -> None:
    """Keep-alive comments (and chunks that carry nothing) count as activity, up to
    KEEPALIVE_IDLE_FACTOR silences: a server that sends only those fails the try."""
    hostile.frames = stream_of(
        sse(chunk({"content": "a"})), forever=KEEPALIVE + sse({"choices": []})
    )
    started = time.monotonic()
    # Silences of 0.2 s: a server starved of CPU for 0.05 s on a loaded machine really was
    # silent that long (seen: the try ended after 0.22 s).
    answer = await ask(hostile, streamIdleSeconds=0.2)
    assert isinstance(answer, LLMUnavailable) and "timed out" in str(answer)
    assert 1.6 < time.monotonic() - started < 8  # ten silences of 0.2 s, not one


async def test_keepalives_still_keep_a_slow_stream_alive(hostile: Hostile) -> None:
    async def gen() -> AsyncIterator[bytes]:
        # Keep-alives for over twice the silence allowed before the answer; each gap is far
        # shorter than that silence, so a loaded machine's late wake-up breaks nothing.
        for _ in range(20):
            yield KEEPALIVE
            await asyncio.sleep(0.03)
        yield sse(chunk({"content": "slow but alive"}, "stop"))
        yield sse("[DONE]")

    hostile.frames = gen
    assert (await ask(hostile, streamIdleSeconds=0.25)).content == "slow but alive"


async def test_a_finished_answer_whose_stream_never_ends_is_kept(hostile: Hostile) -> None:
    """DeepSeek streams seen to finish the message then send keep-alives for ever
    (https://github.com/deepseek-ai/deepseek-harness/discussions/6959)."""
    hostile.frames = stream_of(sse(chunk({"content": "done"}, "stop")), forever=KEEPALIVE)
    answer = await ask(hostile, streamIdleSeconds=0.05)
    assert answer.content == "done" and answer.finish_reason == "stop"


# -- streams that do not stop growing ---------------------------------------------------------


async def test_an_sse_line_without_end_is_refused_at_its_limit(
    hostile: Hostile, monkeypatch: pytest.MonkeyPatch
) -> None:
    import bot.llm

    monkeypatch.setattr(bot.llm, "MAX_SSE_EVENT_BYTES", 1 << 20)
    hostile.frames = stream_of(b'data: {"x": "', forever=b"a" * 65536, every=0)
    answer = await ask(hostile)
    assert isinstance(answer, LLMUnavailable) and "over 1 MiB" in str(answer)


async def test_a_stream_without_end_is_refused_at_its_limit(
    hostile: Hostile, monkeypatch: pytest.MonkeyPatch
) -> None:
    import bot.llm

    monkeypatch.setattr(bot.llm, "MAX_STREAM_BYTES", 1 << 20)
    hostile.frames = stream_of(forever=sse(chunk({"content": "spam " * 100})), every=0)
    answer = await ask(hostile)
    assert isinstance(answer, LLMUnavailable) and "over 1 MiB" in str(answer)


# -- reasoning taken out of a stream, in linear time -------------------------------------------


_WORDS = ("<think>", "</think>", "<THINKING>", "</thinking>", "<reasoning>", "</Reasoning>",
          "<", "</", "</thi", "nk>", "<thi", "`", " ", "\n", "plan", "<b>", "a < b")  # fmt: skip


def test_the_streamed_split_agrees_with_split_reasoning_at_every_piece() -> None:
    rng = random.Random(36)
    for _ in range(3000):
        text = "".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 12)))
        splitter, end = ReasoningSplitter(), 0
        while end < len(text):
            end = min(len(text), end + rng.randint(1, 6))
            assert splitter.answer(text[:end]) == split_reasoning(text[:end])[1], text[:end]


@pytest.mark.parametrize("first", ["<think>", "Here is the page: <html>"])
def test_a_long_stream_with_a_tag_costs_linear_time(first: str) -> None:
    """20,000 pieces took 25 s (an unclosed <think>) or 30 s (HTML) of event-loop CPU."""
    assembler = StreamAssembler()
    started = time.process_time()
    assembler.add(chunk({"content": first}))
    for _ in range(20_000):
        assembler.add(chunk({"content": "<p>word</p> "}))
    assert time.process_time() - started < 2
    assert assembler.shown == ("" if first == "<think>" else assembler.content)


# -- tool-call ids rewritten for Mistral and Anthropic ----------------------------------------

_ALNUM9 = re.compile(r"[A-Za-z0-9]{9}")
_WORD = re.compile(r"[A-Za-z0-9_-]{1,64}")
_ID_POOL = ("call_0", "call_1", "abcDEF123", "toolu_01", "x.y", "a" * 70, "same", "q#1", "id1")


def _random_history(rng: random.Random) -> list[dict[str, Any]]:
    """Turns with batches of calls whose ids repeat (in a batch too: old sessions), some
    calls left without a result (an interrupted turn)."""
    history: list[dict[str, Any]] = [{"role": "system", "content": "s"}]
    for _ in range(rng.randint(1, 10)):
        history.append({"role": "user", "content": "u"})
        for _ in range(rng.randint(0, 3)):
            ids = [rng.choice(_ID_POOL) for _ in range(rng.randint(1, 3))]
            calls = [
                {"id": i, "type": "function", "function": {"name": "f", "arguments": "{}"}}
                for i in ids
            ]
            history.append({"role": "assistant", "content": None, "tool_calls": calls})
            for i in ids if rng.random() < 0.8 else ids[:-1]:
                history.append({"role": "tool", "tool_call_id": i, "content": "r"})
        history.append({"role": "assistant", "content": "a"})
    return history


@pytest.mark.parametrize(("provider", "form"), [("mistral", _ALNUM9), ("anthropic", _WORD)])
def test_rewritten_ids_fit_stay_unique_and_paired_and_stable(provider: str, form: Any) -> None:
    dialect = PROFILES[provider]
    for seed in range(400):
        history = _random_history(random.Random(seed))
        sent = dialect.messages(history)
        # The same history gives the same request, and a longer one the same prefix (the
        # provider's prompt cache).
        assert sent == dialect.messages(json.loads(json.dumps(history)))
        assert sent[:-1] == dialect.messages(history[:-1])
        given: set[str] = set()
        batch: list[tuple[str, str]] = []
        results: list[str] = []
        for old, new in zip(history, sent, strict=True):
            if old["role"] == "assistant" and "tool_calls" in old:
                ids = [c["id"] for c in new["tool_calls"]]
                assert all(form.fullmatch(i) for i in ids)
                assert not given & set(ids) and len(set(ids)) == len(ids)
                given |= set(ids)
                batch = [(c["id"], i) for c, i in zip(old["tool_calls"], ids, strict=True)]
                results = []
            elif old["role"] == "tool":
                # The n-th result of an id answers the n-th call of that id in its batch.
                mine = [i for o, i in batch if o == old["tool_call_id"]]
                n = results.count(old["tool_call_id"])
                results.append(old["tool_call_id"])
                assert new["tool_call_id"] == mine[min(n, len(mine) - 1)], seed


def test_an_id_repeated_in_every_answer_costs_linear_time() -> None:
    """LM Studio gives the first call of every answer the same id: with 3,000 of them each
    new stand-in tried every earlier one (157 ms per request at 1,500, quadratic)."""
    history: list[dict[str, Any]] = []
    for _ in range(3000):
        call = {"id": "lmstudio", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        history.append({"role": "assistant", "content": None, "tool_calls": [call]})
        history.append({"role": "tool", "tool_call_id": "lmstudio", "content": "r"})
    for provider in ("mistral", "anthropic"):
        started = time.process_time()
        sent = PROFILES[provider].messages(history)
        assert time.process_time() - started < 0.5
        assert len({m["tool_calls"][0]["id"] for m in sent[::2]}) == 3000


# -- what a refusal teaches --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("words", "field", "value"),
    [
        (
            "Missing `reasoning_content` field in the assistant message at message index 2. "
            "For more information, please refer to "
            "https://api-docs.deepseek.com/guides/thinking_mode#tool-calls",
            "reasoning_back",
            "with_calls",
        ),
        (
            "The `reasoning_content` in the thinking mode must be passed back to the API.",
            "reasoning_back",
            "with_calls",
        ),
        ("Expected 'content' to be a string or an array", "null_content", False),
        (
            f"Tool call id was {'x' * 200} but must be a-z, A-Z, 0-9, with a length of 9.",
            "tool_call_ids",
            "alnum9",
        ),
        (
            "The reasoning_content is an intermediate result for display purposes only and "
            "will not be included in the context for inference. Please remove the "
            "reasoning_content from your message to reduce network traffic.",
            "reasoning_back",
            "never",
        ),
        (
            'Invalid JSON payload received. Unknown name "reasoning_content" at '
            "'messages[2]': Cannot find field.",
            "reasoning_back",
            "never",
        ),
        (
            "Invalid 'content': 'content' field must be a string or an array of objects.",
            "null_content",
            False,
        ),
        ("property 'stream_options' is unsupported, did you mean 'stream'?", "stream_usage", False),
    ],
)
def test_real_refusals_teach_the_right_lesson(words: str, field: str, value: Any) -> None:
    """DeepSeek's 'Missing `reasoning_content`' (the wording of deepseek-reasoner since V3.2,
    continuedev/continue#9831) taught the opposite lesson, 'never'; llama.cpp's words for
    content null taught nothing."""
    start = PROFILES["deepseek"] if value == "never" else PROFILES["generic"]
    learnt = start.learn(words)
    assert learnt is not None and getattr(learnt[0], field) == value


def test_max_completion_tokens_refused_teaches_max_tokens() -> None:
    """Azure's api-versions before 2024-09 (and Mistral, see below) refuse it."""
    learnt = PROFILES["openai"].learn(
        "Unrecognized request argument supplied: max_completion_tokens"
    )
    assert learnt is not None and learnt[0].token_parameter == "max_tokens"


@pytest.mark.parametrize(
    "words",
    [
        # vLLM's context overflow (vllm-project/vllm#20409 and many reports):
        "'max_tokens' or 'max_completion_tokens' is too large: 8000. This model's maximum "
        "context length is 4096 tokens and your request has 2778 input tokens (8000 > 4096 - "
        "2778).",
        "max_tokens is too large: 50000. This model supports at most 16384 completion tokens, "
        "whereas you provided 50000.",
        "This model's maximum context length is 128000 tokens. However, your messages resulted "
        "in 130532 tokens. Please reduce the length of the messages.",
        # Mistral and Ollama on an empty assistant message (OpenHands/OpenHands#8685):
        "Assistant message must have either content or tool_calls, but not none.",
        "The response was filtered due to the prompt triggering Azure OpenAI's content "
        "management policy. Please modify your prompt and retry.",
        "Incorrect API key provided: sk-abc***xyz. You can find your API key at "
        "https://platform.openai.com/account/api-keys.",
        # A refusal about something else that echoes the request (pydantic's "input"):
        "[{'type': 'string_too_long', 'loc': ['body', 'messages', 1, 'content'], 'msg': 'too "
        "long', 'input': {'model': 'm', 'stream': True, 'stream_options': {'include_usage': "
        "True}, 'temperature': 0.7, 'messages': [{'content': 'the reasoning_content of a "
        "thinking model is hidden'}]}}]",
    ],
)
def test_ordinary_refusals_teach_nothing(words: str) -> None:
    """A false lesson costs a request, a misleading warning and a dialect changed for good."""
    assert PROFILES["generic"].learn(words) is None


async def test_llamacpps_500_for_content_null_is_learnt_not_retried(
    hostile: Hostile,
) -> None:
    """llama.cpp before mid-2025 refuses content null with HTTP 500: memobot (provider auto:
    its port tells nothing) retried it four times and gave up, on every tool turn."""
    seen: list[dict[str, Any]] = []

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append(body)
        if any(m.get("content") is None for m in body["messages"]):
            error = {"code": 500, "message": "Expected 'content' to be a string or an array"}
            return web.json_response({"error": error}, status=500)
        return web.json_response({"choices": [{"message": {"content": "ok"}}]})

    hostile.handler = chat
    history = [
        {"role": "user", "content": "u"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "abc", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "abc", "content": "r"},
    ]
    provider = provider_for(hostile, retry={"attempts": 4, "initialDelaySeconds": 0})
    try:
        assert (await provider.chat(history)).content == "ok"
        assert (await provider.chat(history)).content == "ok"
    finally:
        await provider.close()
    assert len(seen) == 3  # refused once, then sent right, for good


# -- secrets -------------------------------------------------------------------------------------


@pytest.mark.parametrize("provider", ["azure", "generic"])
async def test_a_redirect_to_another_host_carries_none_of_the_endpoints_secrets(
    hostile: Hostile, provider: str
) -> None:
    """The SDK follows redirects and httpx drops only Authorization on the way to another
    origin: Azure's api-key and every llm.headers value went along."""
    elsewhere = Hostile()
    await elsewhere.start()
    seen: dict[str, str] = {}

    async def there(request: web.Request) -> web.Response:
        seen.update(request.headers)
        return web.json_response({"choices": [{"message": {"content": "from elsewhere"}}]})

    async def here(request: web.Request) -> web.Response:
        assert request.headers.get("X-Org-Token") == "tok-SECRET"  # sent home, of course
        raise web.HTTPTemporaryRedirect(f"{elsewhere.base_url}/chat/completions")

    hostile.handler, elsewhere.handler = here, there
    try:
        answer = await ask(
            hostile,
            stream=False,
            provider=provider,
            apiKey="sk-SECRET",
            headers={"X-Org-Token": "tok-SECRET"},
        )
    finally:
        await elsewhere.stop()
    assert answer.content == "from elsewhere"
    assert seen and not [v for v in seen.values() if "SECRET" in v]


@pytest.mark.parametrize("value", ["Bearer sk-SECRET\n", "sk-SECRET é"])
def test_a_bad_header_value_is_not_echoed_by_the_config_check(value: str) -> None:
    """The config check printed the headers it refused, values included, and JSON-escaped
    ("\\n"), so the log filter's copy of the secret did not match them either."""
    with pytest.raises(ConfigError) as info:
        parse_config({"llm": {"headers": {"Helicone-Auth": value}}})
    assert "Helicone-Auth" in str(info.value) and "SECRET" not in str(info.value)


def test_header_values_are_secrets_to_the_log_filter() -> None:
    found = list(secret_strings({"llm": {"headers": {"Helicone-Auth": "Bearer sk-x"}}}))
    assert "Bearer sk-x" in found


async def test_openrouters_provider_error_gives_the_providers_words(hostile: Hostile) -> None:
    """OpenRouter's 'Provider returned error' alone hid the reason, and the dialect lesson
    in it (danny-avila/LibreChat#13366: DeepSeek V4 through OpenRouter)."""
    raw = json.dumps(
        {
            "error": {
                "message": "The `reasoning_content` in the thinking mode must be passed back "
                "to the API.",
                "type": "invalid_request_error",
            }
        }
    )
    body = {
        "error": {
            "code": 400,
            "message": "Provider returned error",
            "metadata": {"provider_name": "DeepSeek", "raw": raw},
        }
    }
    hostile.plain, hostile.status = json.dumps(body).encode(), 400
    answer = await ask(hostile, stream=False, provider="openrouter")
    assert isinstance(answer, LLMError)
    assert "Provider returned error: The `reasoning_content`" in str(answer)
    # ... and it taught the dialect (the second try was refused the same way, and said so).
    assert len(hostile.requests) == 2


async def test_a_refusal_that_echoes_the_key_or_a_header_does_not_show_them(
    hostile: Hostile,
) -> None:
    """A refusal's words go to the chat (user_message): a proxy that echoes what it was sent
    would show the endpoint's secrets to everyone in a group."""
    said = "bad request from key sk-SECRET-123 with header gw-SECRET-456"
    hostile.plain, hostile.status = json.dumps({"error": {"message": said}}).encode(), 400
    answer = await ask(
        hostile, stream=False, apiKey="sk-SECRET-123", headers={"X-Gw": "gw-SECRET-456"}
    )
    assert isinstance(answer, LLMError)
    assert "SECRET" not in answer.user_message and "SECRET" not in str(answer)
    assert "[redacted]" in answer.user_message


# -- reasoning sent back, and reasoning a template opened ---------------------------------------


def test_reasoning_sent_back_is_counted_in_the_context_budget() -> None:
    from bot.tokens import estimate_message_tokens

    call = {"id": "abcDEF123", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    bare = {"role": "assistant", "content": None, "tool_calls": [call]}
    thinking = {**bare, "reasoning_content": "a long chain of thought " * 2000}
    sent = PROFILES["deepseek"].messages([thinking])[0]
    assert "reasoning_content" in sent
    assert estimate_message_tokens(thinking) > estimate_message_tokens(bare) + 5000


async def test_a_template_opened_think_block_is_never_shown_while_streaming(
    hostile: Hostile,
) -> None:
    hostile.frames = frames(
        sse(chunk({"content": "The user greets me, "})),
        sse(chunk({"content": "I should greet back."})),
        sse(chunk({"content": "</think>\n\nHello!"}, "stop")),
        sse("[DONE]"),
    )
    shown: list[str] = []
    provider = provider_for(hostile, model="deepseek-r1-distill-qwen-7b")
    try:
        answer = await provider.chat([{"role": "user", "content": "hi"}], on_text=shown.append)
    finally:
        await provider.close()
    assert answer.content == "Hello!"
    assert not [s for s in shown if "greet" in s]


@pytest.mark.parametrize(
    ("url", "provider"),
    [
        ("https://api.openai.com@evil.example/v1", "generic"),
        ("https://evil.example#@api.openai.com/v1", "generic"),
        ("https://evil.example?@api.openai.com/", "generic"),
        ("https://x.openai.azure.com.evil.example/openai/v1", "generic"),
        ("https://evilopenrouter.ai/api/v1", "generic"),
        ("https://api.openai.com%2eevil.example/v1", "generic"),
        ("https://api.openai.com./v1", "openai"),
        ("https://API.OpenAI.com/v1", "openai"),
    ],
)
def test_the_detected_provider_is_the_host_the_request_goes_to(url: str, provider: str) -> None:
    """Spoofing the detection changes only quirks, never where the request goes; the two
    must agree (httpx sends to the host after the last '@', as urlsplit reads it)."""
    assert detect_provider(url) == provider


async def test_lessons_learnt_at_the_same_time_by_two_requests_both_stay(
    hostile: Hostile,
) -> None:
    """Each request learns on the dialect it was sent in: a lesson that landed while
    another request was out was undone when that one learnt (the dialect it started from
    replaced the endpoint's), and was learnt again, a refused request each time."""
    both_sent, plain_learnt = asyncio.Event(), asyncio.Event()
    bodies: list[dict[str, Any]] = []

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        bodies.append(body)
        if len(bodies) == 2:
            both_sent.set()
        if body.get("stream"):
            await both_sent.wait()
            await plain_learnt.wait()  # the streamed one is refused after the other learnt
        if "stream_options" in body:
            said = "property 'stream_options' is unsupported, did you mean 'stream'?"
        elif "max_tokens" in body:
            await both_sent.wait()
            said = "Unsupported parameter: 'max_tokens' is not supported with this model."
        else:
            plain_learnt.set()
            return web.json_response({"choices": [{"message": {"content": "ok"}}]})
        return web.json_response({"error": {"message": said}}, status=400)

    hostile.handler = chat
    provider = provider_for(hostile)
    try:
        plain = provider.chat([{"role": "user", "content": "a"}])
        streamed = provider.chat([{"role": "user", "content": "b"}], on_text=lambda _: None)
        answers = await asyncio.gather(plain, streamed)
        assert [a.content for a in answers] == ["ok", "ok"]
        assert provider.dialect.token_parameter == "max_completion_tokens"
        assert provider.dialect.stream_usage is False
    finally:
        await provider.close()
    assert len(bodies) == 4  # two refusals, two answers: no lesson learnt twice


async def test_mistral_spoken_to_as_openai_learns_max_tokens_back() -> None:
    """llm.provider "openai" for an endpoint that is not (the nanobot importer sets it for
    nanobot's "openai" provider whatever its apiBase) sent max_completion_tokens, which
    Mistral refuses, and nothing taught max_tokens back: every request failed."""
    async with FakeLLM(dialect="mistral") as llm:
        llm.script(fake_reply("one"), fake_reply("two"))
        provider = LLMProvider(
            LLMConfig(base_url=llm.base_url, provider="openai", model="mistral-large-latest")
        )
        try:
            assert (await provider.chat([{"role": "user", "content": "a"}])).content == "one"
            assert (await provider.chat([{"role": "user", "content": "b"}])).content == "two"
        finally:
            await provider.close()
    assert ["max_tokens" in r["body"] for r in llm.requests] == [False, True, True]
