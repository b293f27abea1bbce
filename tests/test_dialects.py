"""Provider dialects (bot.dialects): what each profile sends, what it keeps, what it learns.

The end-to-end turns against imitations of each provider are in test_provider_matrix.py;
these pin the rules themselves, and the client's reading of what servers send back."""

from __future__ import annotations

import json
import logging
import re
from typing import Any

import pytest

from bot.config import LLMConfig
from bot.dialects import (
    GEMINI_DUMMY_SIGNATURE,
    PROFILES,
    detect_provider,
    dialect_for,
    fit_tool_call_id,
    split_reasoning,
)
from bot.llm import LLMProvider, LLMRejected, StreamAssembler, parse_completion
from tests.fakes.llm_server import FakeLLM, error, reply

CALL = {"id": "call_abc.123", "type": "function", "function": {"name": "exec", "arguments": "{}"}}


def _history(**assistant: Any) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": None, "tool_calls": [dict(CALL)], **assistant},
        {"role": "tool", "tool_call_id": CALL["id"], "name": "exec", "content": "ok"},
        {"role": "assistant", "content": "done", "reasoning_content": "final thoughts"},
    ]


@pytest.mark.parametrize(
    ("url", "provider"),
    [
        ("", "openai"),
        ("https://api.openai.com/v1", "openai"),
        ("https://me.openai.azure.com/openai/v1", "azure"),
        ("https://api.deepseek.com", "deepseek"),
        ("https://generativelanguage.googleapis.com/v1beta/openai/", "gemini"),
        ("https://api.mistral.ai/v1", "mistral"),
        ("https://api.groq.com/openai/v1", "groq"),
        ("https://openrouter.ai/api/v1", "openrouter"),
        ("https://api.anthropic.com/v1/", "anthropic"),
        ("http://localhost:11434/v1", "ollama"),
        ("http://127.0.0.1:1234/v1", "lmstudio"),
        ("http://localhost:8000/v1", "generic"),
        ("https://evil.example/api.openai.com", "generic"),
        ("https://api.openai.com.evil.example/v1", "generic"),
    ],
)
def test_the_provider_is_told_by_the_host_only(url: str, provider: str) -> None:
    assert detect_provider(url) == provider


@pytest.mark.parametrize("model", ["gpt-5", "gpt-5-mini", "o3-mini", "o1", "openai/gpt-5.1"])
def test_openai_reasoning_models_get_max_completion_tokens_and_no_temperature(model: str) -> None:
    for provider in ("auto", "openai", "azure", "generic"):
        dialect = dialect_for(provider, "http://127.0.0.1:9/v1", model)
        body = json.loads(
            dialect.body(model, [{"role": "user", "content": "hi"}], max_tokens=9, temperature=0.7)
        )
        assert body["max_completion_tokens"] == 9
        assert "max_tokens" not in body and "temperature" not in body


def test_other_models_keep_temperature_and_openai_takes_max_completion_tokens() -> None:
    body = json.loads(
        dialect_for("auto", "", "gpt-4o-mini").body(
            "gpt-4o-mini", [], max_tokens=9, temperature=0.3
        )
    )
    assert body == {
        "model": "gpt-4o-mini",
        "messages": [],
        "max_completion_tokens": 9,
        "temperature": 0.3,
    }
    local = json.loads(
        PROFILES["generic"].body("llama3", [], max_tokens=9, temperature=0.3, stream=True)
    )
    assert local["max_tokens"] == 9 and local["stream_options"] == {"include_usage": True}
    mistral = json.loads(
        PROFILES["mistral"].body("m", [], max_tokens=9, temperature=0.3, stream=True)
    )
    assert "stream_options" not in mistral and mistral["stream"] is True


def test_deepseek_gets_reasoning_back_with_tool_calls_only() -> None:
    sent = PROFILES["deepseek"].messages(_history(reasoning_content="why"))
    assert sent[2]["reasoning_content"] == "why"
    assert "reasoning_content" not in sent[4]  # a final answer's reasoning is not sent
    # A message another model wrote has none: DeepSeek checks that the field is there.
    assert PROFILES["deepseek"].messages(_history())[2]["reasoning_content"] == ""
    r1 = dialect_for("deepseek", "https://api.deepseek.com", "deepseek-r1")
    assert all("reasoning_content" not in m for m in r1.messages(_history(reasoning_content="x")))


def test_strict_targets_get_no_fields_of_other_providers() -> None:
    history = _history(
        reasoning_content="why",
        reasoning_details=[{"type": "reasoning.text", "text": "t"}],
    )
    history[2]["tool_calls"][0]["extra_content"] = {"google": {"thought_signature": "sig"}}
    sent = PROFILES["openai"].messages(history)
    text = json.dumps(sent)
    for field in ("reasoning_content", "reasoning_details", "extra_content"):
        assert field not in text
    assert "extra_content" in json.dumps(history)  # the stored history keeps them
    assert sent[1] is history[1] and sent[3] is history[3]  # unchanged messages: same objects


def test_gemini_keeps_signatures_and_fills_in_the_dummy_for_calls_it_did_not_make() -> None:
    history = _history()
    signed = dict(CALL, extra_content={"google": {"thought_signature": "sig"}})
    history[2] = {"role": "assistant", "content": None, "tool_calls": [signed, dict(CALL, id="b")]}
    calls = PROFILES["gemini"].messages(history)[2]["tool_calls"]
    assert calls[0]["extra_content"] == {"google": {"thought_signature": "sig"}}
    assert calls[1]["extra_content"]["google"]["thought_signature"] == GEMINI_DUMMY_SIGNATURE


def test_mistral_ids_are_rewritten_alike_in_call_and_result() -> None:
    sent = dialect_for("auto", "http://127.0.0.1:8000/v1", "devstral-small").messages(_history())
    new_id = sent[2]["tool_calls"][0]["id"]
    assert re.fullmatch(r"[A-Za-z0-9]{9}", new_id)
    assert sent[3]["tool_call_id"] == new_id
    assert fit_tool_call_id(CALL["id"], "alnum9") == new_id  # stable: the same in every request
    assert fit_tool_call_id("abcDEF123", "alnum9") == "abcDEF123"
    assert re.fullmatch(
        r"[A-Za-z0-9_-]+", PROFILES["anthropic"].messages(_history())[2]["tool_calls"][0]["id"]
    )


def test_servers_that_refuse_null_content_get_an_empty_string() -> None:
    for name in ("llamacpp", "lmstudio"):
        assert PROFILES[name].messages(_history())[2]["content"] == ""
    assert PROFILES["openai"].messages(_history())[2]["content"] is None


@pytest.mark.parametrize(
    ("text", "reasoning", "answer"),
    [
        ("<think>plan</think>\n\nHello", "plan", "Hello"),
        ("  <thinking>a\nb</thinking>Hi", "a\nb", "Hi"),
        ("<think>still thinking", "still thinking", ""),
        ("plan without an opening tag</think>Hello", "plan without an opening tag", "Hello"),
        ("Use <b>bold</b> here", "", "Use <b>bold</b> here"),
        ("Write `</think>` literally", "", "Write `</think>` literally"),
        ("Plain", "", "Plain"),
    ],
)
def test_reasoning_blocks_leave_the_text(text: str, reasoning: str, answer: str) -> None:
    assert split_reasoning(text) == (reasoning, answer)


@pytest.mark.parametrize(
    ("detail", "field", "value"),
    [
        (
            "Unsupported parameter: 'max_tokens' is not supported with this model. Use "
            "'max_completion_tokens' instead.",
            "token_parameter",
            "max_completion_tokens",
        ),
        (
            "Unsupported value: 'temperature' does not support 0.7 with this model. Only the "
            "default (1) value is supported.",
            "send_temperature",
            False,
        ),
        ("body.stream_options: Extra inputs are not permitted", "stream_usage", False),
        (
            "The reasoning_content in the thinking mode must be passed back to the API.",
            "reasoning_back",
            "with_calls",
        ),
        (
            "Tool call id was call_1 but must be a-z, A-Z, 0-9, with a length of 9.",
            "tool_call_ids",
            "alnum9",
        ),
    ],
)
def test_a_refusal_that_names_a_parameter_teaches_the_dialect(
    detail: str, field: str, value: Any
) -> None:
    learnt = PROFILES["generic"].learn(detail)
    assert learnt is not None and getattr(learnt[0], field) == value
    assert learnt[0].learn(detail) is None  # learnt once: the same refusal again is reported
    assert PROFILES["generic"].learn("Invalid API key") is None


def _chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def test_stream_assembly_takes_every_dialect_of_tool_calls() -> None:
    a = StreamAssembler()
    # Gemini: two parallel calls, both at index 0, each with its id and signature.
    sig = {"google": {"thought_signature": "s1"}}
    a.add(
        _chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "g1",
                        "function": {"name": "a", "arguments": "{}"},
                        "extra_content": sig,
                    }
                ]
            }
        )
    )
    a.add(
        _chunk(
            {
                "tool_calls": [
                    {"index": 0, "id": "g2", "function": {"name": "b", "arguments": '{"x": 1}'}}
                ]
            }
        )
    )
    # Ollama: a whole call without an index; llama.cpp (March 2026): arguments as an object.
    a.add(
        _chunk(
            {"tool_calls": [{"id": "o1", "function": {"name": "c", "arguments": {"path": "p"}}}]},
            "stop",
        )
    )
    parsed = parse_completion(a.completion())
    assert [(c.id, c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == [
        ("g1", "a", {}),
        ("g2", "b", {"x": 1}),
        ("o1", "c", {"path": "p"}),
    ]
    assert parsed.tool_calls[0].extra == sig
    assert parsed.assistant_message()["tool_calls"][0]["extra_content"] == sig


def test_streamed_reasoning_is_kept_apart_and_never_shown() -> None:
    a = StreamAssembler()
    shown = []
    for delta in (
        {"reasoning_content": "deep "},
        {"reasoning": "thought"},
        {"content": "<think>hidden"},
        {"content": " more</think>"},
        {"content": "Hello"},
    ):
        if a.add(_chunk(delta)):
            shown.append(a.shown)
    a.add({"choices": [], "x_groq": {"usage": {"total_tokens": 5}}})
    assert shown == ["Hello"]
    parsed = parse_completion(a.completion())
    assert parsed.content == "Hello"
    assert "deep thought" in parsed.reasoning and "hidden more" in parsed.reasoning
    assert parsed.usage == {"total_tokens": 5}
    assert parsed.assistant_message() == {"role": "assistant", "content": "Hello"}


def test_ids_a_server_repeats_in_one_answer_or_leaves_out_are_replaced() -> None:
    raw = {
        "choices": [
            {
                "message": {
                    "content": None,
                    "tool_calls": [
                        {"id": None, "function": {"name": "a", "arguments": "{}"}},
                        {"id": "", "function": {"name": "b", "arguments": "{}"}},
                        {"id": "x7Gk2LmQ9", "function": {"name": "c", "arguments": "{}"}},
                        {"id": "x7Gk2LmQ9", "function": {"name": "d", "arguments": "{}"}},
                    ],
                }
            }
        ]
    }
    ids = [c.id for c in parse_completion(raw).tool_calls]
    assert ids[2] == "x7Gk2LmQ9"
    assert len(set(ids)) == 4 and all(re.fullmatch(r"[A-Za-z0-9]{9}", i) for i in ids)


async def test_a_refused_parameter_is_learnt_and_the_request_sent_again(
    llm: FakeLLM, caplog: pytest.LogCaptureFixture
) -> None:
    """An endpoint memobot cannot identify (a proxy in front of OpenAI) still works."""
    llm.script(
        error(
            400,
            message="Unsupported parameter: 'max_tokens' is not supported with this model. "
            "Use 'max_completion_tokens' instead.",
        ),
        reply("one"),
        reply("two"),
    )
    provider = LLMProvider(LLMConfig(base_url=llm.base_url, model="my-proxy-model"))
    try:
        with caplog.at_level(logging.WARNING):
            assert (await provider.chat([{"role": "user", "content": "a"}])).content == "one"
            assert (await provider.chat([{"role": "user", "content": "b"}])).content == "two"
    finally:
        await provider.close()
    bodies = [r["body"] for r in llm.requests]
    assert "max_tokens" in bodies[0]
    assert all("max_completion_tokens" in b and "max_tokens" not in b for b in bodies[1:])
    assert len(bodies) == 3  # learnt once, not tried again per message
    assert "sending max_completion_tokens instead of max_tokens" in caplog.text


async def test_a_chat_template_refusal_is_not_retried_and_says_the_servers_words(
    llm: FakeLLM, caplog: pytest.LogCaptureFixture
) -> None:
    llm.script(
        error(500, message="Conversation roles must alternate user/assistant/user/assistant/...")
    )
    provider = LLMProvider(
        LLMConfig(base_url=llm.base_url, retry={"attempts": 4, "initial_delay_seconds": 0})
    )
    try:
        with caplog.at_level(logging.WARNING), pytest.raises(LLMRejected) as info:
            await provider.chat([{"role": "user", "content": "a"}])
    finally:
        await provider.close()
    assert len(llm.requests) == 1
    assert "roles must alternate" in info.value.user_message
    assert "roles must alternate" in caplog.text


async def test_a_retried_5xx_logs_the_servers_words(
    llm: FakeLLM, caplog: pytest.LogCaptureFixture
) -> None:
    llm.script(error(503, message="model is loading, 12% done"), reply("ok"))
    provider = LLMProvider(
        LLMConfig(
            base_url=llm.base_url,
            retry={"attempts": 2, "initial_delay_seconds": 0, "max_delay_seconds": 0},
        )
    )
    try:
        with caplog.at_level(logging.WARNING):
            assert (await provider.chat([{"role": "user", "content": "a"}])).content == "ok"
    finally:
        await provider.close()
    assert "HTTP 503: model is loading, 12% done" in caplog.text


async def test_groqs_tool_use_failed_is_tried_again(llm: FakeLLM) -> None:
    llm.script(
        error(400, code="tool_use_failed", message="Failed to call a function."), reply("ok")
    )
    cfg = LLMConfig(
        base_url=llm.base_url,
        retry={"attempts": 2, "initial_delay_seconds": 0, "max_delay_seconds": 0},
    )
    provider = LLMProvider(cfg)
    try:
        assert (await provider.chat([{"role": "user", "content": "a"}])).content == "ok"
    finally:
        await provider.close()


def test_config_checks_azure_deployment_urls_and_headers() -> None:
    with pytest.raises(ValueError, match="apiVersion"):
        LLMConfig.model_validate({"baseUrl": "https://r.openai.azure.com/openai/deployments/d"})
    LLMConfig.model_validate(
        {"baseUrl": "https://r.openai.azure.com/openai/deployments/d", "apiVersion": "2024-10-21"}
    )
    LLMConfig.model_validate(
        {"baseUrl": "https://r.openai.azure.com/openai/deployments/d?api-version=2024-10-21"}
    )
    with pytest.raises(ValueError, match="header"):
        LLMConfig.model_validate({"headers": {"X-A": "line\nbreak"}})
    with pytest.raises(ValueError):
        LLMConfig.model_validate({"provider": "openia"})


def test_a_template_opened_block_is_not_held_where_the_server_parses_it_out() -> None:
    """DeepSeek-R1 on Ollama with its reasoning parser: the reasoning comes in a field of its
    own, the text after it is the answer and is shown as it comes."""
    dialect = dialect_for("ollama", "http://localhost:11434/v1", "deepseek-r1:8b")
    assert dialect.template_opens_think
    a = StreamAssembler(dialect.template_opens_think)
    a.add(_chunk({"reasoning": "greet back"}))
    assert a.add(_chunk({"content": "Hello"}))
    assert a.shown == "Hello"
    held = StreamAssembler(True)
    assert not held.add(_chunk({"content": "greet back"}))
    assert held.add(_chunk({"content": "</think>Hi"})) and held.shown == "Hi"
    assert not dialect_for("openrouter", "", "deepseek/deepseek-r1").template_opens_think


def test_reasoning_kept_with_a_tool_call_is_bounded() -> None:
    from bot.llm import MAX_KEPT_REASONING, LLMResponse, ToolCall

    response = LLMResponse(None, (ToolCall("abcDEF123", "f", "{}"),), reasoning="x" * 10**6)
    assert len(response.assistant_message()["reasoning_content"]) == MAX_KEPT_REASONING
