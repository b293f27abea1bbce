"""The fake LLM's dialects keep their providers' rules: a request the provider refuses is refused
with its status, words and body shape, a valid one passes, and answers have the provider's shape.
Plain aiohttp against the running fake (to see the wire), the openai SDK where a client's view
matters (Azure's client, OpenRouter's errors in a 200)."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import openai
import pytest

from tests.fakes.llm_dialects import DIALECTS, make_dialect
from tests.fakes.llm_server import FakeLLM, FakeLLMProcess, error, reply, tool_step

USER = {"role": "user", "content": "hi"}


async def post(
    llm: FakeLLM,
    body: Any,
    *,
    path: str = "/v1/chat/completions",
    headers: dict[str, str] | None = None,
) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{llm.url}{path}", json=body, headers=headers or {}) as resp:
            return resp.status, await resp.read()


def events(raw: bytes) -> list[Any]:
    """An SSE body as its lines: parsed ``data:`` payloads, "[DONE]", comments as str."""
    out: list[Any] = []
    for line in raw.decode().split("\n"):
        if line.startswith("data: "):
            data = line.removeprefix("data: ")
            out.append(data if data == "[DONE]" else json.loads(data))
        elif line.startswith(":"):
            out.append(line)
    return out


def deltas(raw: bytes) -> list[dict[str, Any]]:
    return [e["choices"][0]["delta"] for e in events(raw) if isinstance(e, dict) and e["choices"]]


def stream_calls(raw: bytes) -> list[dict[str, Any]]:
    return [tc for d in deltas(raw) for tc in d.get("tool_calls") or ()]


def body(model: str, messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": messages, **extra}


def with_call(call_id: str = "call_1", content: str | None = None, **fields: Any) -> list[dict]:
    """A history: user, an assistant tool call (plus ``fields``), its result."""
    function = {"name": "exec", "arguments": '{"command": "ls"}'}
    assistant = {"role": "assistant", "content": content, **fields}
    assistant["tool_calls"] = [{"id": call_id, "type": "function", "function": function}]
    result = {"role": "tool", "tool_call_id": call_id, "name": "exec", "content": "a.txt"}
    return [USER, assistant, result]


def test_dialect_names() -> None:
    assert make_dialect(None) is None
    assert make_dialect("openai-compatible") is None and make_dialect("generic") is None
    assert FakeLLM(dialect="generic").dialect is None
    assert {"openai", "azure", "mistral", "lmstudio", "generic"} <= set(DIALECTS)
    with pytest.raises(ValueError, match=r"unknown dialect 'mistrall'.*mistral"):
        make_dialect("mistrall")


# -- OpenAI -----------------------------------------------------------------------------------


@pytest.mark.parametrize("model", ["gpt-5", "gpt-5-mini", "o1", "o3-mini", "openai/o4-mini"])
async def test_openai_reasoning_models_refuse_max_tokens(model: str) -> None:
    async with FakeLLM(dialect="openai") as llm:
        status, raw = await post(llm, body(model, [USER], max_tokens=100))
        ok, _ = await post(llm, body(model, [USER], max_completion_tokens=100))
    error = json.loads(raw)["error"]
    assert status == 400 and error["param"] == "max_tokens"
    assert error["code"] == "unsupported_parameter"
    assert error["message"] == (
        "Unsupported parameter: 'max_tokens' is not supported with this model. "
        "Use 'max_completion_tokens' instead."
    )
    assert ok == 200


async def test_openai_temperature_rules() -> None:
    async with FakeLLM(dialect="openai") as llm:
        gpt5_07, raw = await post(llm, body("gpt-5", [USER], temperature=0.7))
        gpt5_1, _ = await post(llm, body("gpt-5", [USER], temperature=1))
        o3_1, raw_o3 = await post(llm, body("o3-mini", [USER], temperature=1))
        gpt4o, _ = await post(llm, body("gpt-4o", [USER], temperature=0.7, max_tokens=5))
    assert gpt5_07 == 400 and json.loads(raw)["error"]["message"] == (
        "Unsupported value: 'temperature' does not support 0.7 with this model. "
        "Only the default (1) value is supported."
    )
    assert gpt5_1 == 200 and gpt4o == 200
    assert o3_1 == 400
    assert "'temperature' is not supported" in json.loads(raw_o3)["error"]["message"]


# -- Azure ------------------------------------------------------------------------------------


CLASSIC = "/openai/deployments/gpt-4o/chat/completions"


async def test_azure_classic_needs_the_api_key_header_then_the_api_version() -> None:
    async with FakeLLM(dialect="azure", api_key="secret") as llm:
        bearer = {"Authorization": "Bearer secret"}
        no_key, raw_401 = await post(llm, body("x", [USER]), path=CLASSIC, headers=bearer)
        key = {"api-key": "secret"}
        no_version, raw_404 = await post(llm, body("x", [USER]), path=CLASSIC, headers=key)
        ok, _ = await post(
            llm, body("x", [USER]), path=f"{CLASSIC}?api-version=2024-10-21", headers=key
        )
        v1, _ = await post(
            llm, body("x", [USER]), path="/openai/v1/chat/completions", headers=bearer
        )
    assert no_key == 401 and json.loads(raw_401)["error"]["code"] == "401"
    assert (
        "Access denied due to invalid subscription key" in json.loads(raw_401)["error"]["message"]
    )
    assert no_version == 404 and json.loads(raw_404) == {
        "error": {"code": "404", "message": "Resource not found"}
    }
    assert ok == 200 and v1 == 200
    assert [r["outcome"] for r in llm.requests] == ["unauthorized", "invalid", "default", "default"]


async def test_azure_through_the_sdks_azure_client_and_its_empty_first_chunk() -> None:
    async with FakeLLM(dialect="azure", api_key="secret") as llm:
        llm.script(reply("hello there", pieces=2))
        client = openai.AsyncAzureOpenAI(
            api_key="secret", azure_endpoint=llm.url, api_version="2024-10-21", max_retries=0
        )
        stream = await client.chat.completions.create(model="gpt-4o", messages=[USER], stream=True)
        chunks = [c async for c in stream]
        await client.close()
    [req] = llm.requests
    assert req["path"] == CLASSIC and req["query"] == {"api-version": "2024-10-21"}
    assert chunks[0].choices == [] and chunks[0].prompt_filter_results  # type: ignore[attr-defined]
    assert "".join(c.choices[0].delta.content or "" for c in chunks[1:]) == "hello there"


async def test_azure_reasoning_deployment_has_openais_rules() -> None:
    async with FakeLLM(dialect="azure") as llm:
        path = "/openai/deployments/gpt-5-chat/chat/completions?api-version=2025-04-01-preview"
        status, raw = await post(
            llm, body("ignored", [USER], max_tokens=9), path=path, headers={"api-key": "k"}
        )
    assert status == 400 and "max_completion_tokens" in json.loads(raw)["error"]["message"]


# -- DeepSeek ---------------------------------------------------------------------------------


async def test_deepseek_reasoner_sends_reasoning_and_needs_it_back_with_tool_calls() -> None:
    async with FakeLLM(dialect="deepseek") as llm:
        llm.script(tool_step(("exec", {"command": "ls"})), reply("done", pieces=2))
        _, plain = await post(llm, body("deepseek-reasoner", [USER]))
        _, streamed = await post(llm, body("deepseek-reasoner", [USER], stream=True))
        missing, raw = await post(llm, body("deepseek-reasoner", with_call()))
        kept, _ = await post(llm, body("deepseek-reasoner", with_call(reasoning_content="why")))
        v4, raw_v4 = await post(llm, body("deepseek-v4-flash", with_call()))
        chat, _ = await post(llm, body("deepseek-chat", with_call()))
    message = json.loads(plain)["choices"][0]["message"]
    assert message["reasoning_content"] and message["tool_calls"]
    stream_deltas = deltas(streamed)
    assert "reasoning_content" in stream_deltas[1] and stream_deltas[-2]["content"]
    assert missing == 400 and json.loads(raw)["error"]["message"].startswith(
        "Missing `reasoning_content` field in the assistant message at message index 1."
    )
    assert kept == 200 and chat == 200
    assert v4 == 400 and json.loads(raw_v4)["error"]["message"] == (
        "The `reasoning_content` in the thinking mode must be passed back to the API."
    )


async def test_deepseek_r1_refuses_reasoning_content_and_successive_users() -> None:
    async with FakeLLM(dialect="deepseek") as llm:
        back, raw = await post(llm, body("deepseek-r1", with_call(reasoning_content="why")))
        users, raw_users = await post(llm, body("deepseek-r1", [USER, USER]))
        fine, _ = await post(llm, body("deepseek-r1", with_call()))
    async with FakeLLM(dialect="deepseek", old_build=True) as llm:
        old, _ = await post(llm, body("deepseek-reasoner", with_call(reasoning_content="x")))
    assert back == 400 and old == 400 and fine == 200
    assert "Please remove the reasoning_content" in json.loads(raw)["error"]["message"]
    assert (
        users == 400
        and "does not support successive user or assistant messages"
        in (json.loads(raw_users)["error"]["message"])
    )


async def test_deepseek_keep_alive_comments_and_blank_lines_under_load() -> None:
    slow = {"keepalive_before": 0.05, "keepalive_every": 0.01}
    async with FakeLLM(dialect="deepseek") as llm:
        llm.script(reply("streamed", **slow), reply("plain", **slow))
        _, streamed = await post(llm, body("deepseek-chat", [USER], stream=True))
        _, plain = await post(llm, body("deepseek-chat", [USER]))
    lines = events(streamed)
    assert lines[0] == ": keep-alive" and lines.count(": keep-alive") >= 2
    assert isinstance(lines[-2], dict) and lines[-1] == "[DONE]"
    assert (
        plain.startswith(b"\n\n")
        and json.loads(plain)["choices"][0]["message"]["content"] == "plain"
    )


# -- Gemini -----------------------------------------------------------------------------------


def signed(history: list[dict], signature: str) -> list[dict]:
    history[1]["tool_calls"][0]["extra_content"] = {"google": {"thought_signature": signature}}
    return history


async def test_gemini_3_signs_its_calls_and_refuses_them_back_unsigned() -> None:
    async with FakeLLM(dialect="gemini") as llm:
        llm.script(tool_step(("exec", {"command": "ls"}), ("read_file", {"path": "a"})))
        _, raw = await post(llm, body("gemini-3-flash-preview", [USER]))
        [answer] = json.loads(raw)["choices"]
        calls = answer["message"]["tool_calls"]
        signature = calls[0]["extra_content"]["google"]["thought_signature"]
        unsigned, raw_400 = await post(llm, body("gemini-3-pro-preview", with_call()))
        ok, _ = await post(llm, body("gemini-3-pro-preview", signed(with_call(), signature)))
        forged, _ = await post(llm, body("gemini-3-pro-preview", signed(with_call(), "made-up")))
        dummy = signed(with_call(), "skip_thought_signature_validator")
        dummy_ok, _ = await post(llm, body("gemini-3-pro-preview", dummy))
        # An earlier turn's calls are not checked: a user message came after them.
        later = [*with_call(), {"role": "assistant", "content": "a.txt"}, USER]
        earlier_ok, _ = await post(llm, body("gemini-3-pro-preview", later))
        old, _ = await post(llm, body("gemini-2.5-flash", with_call()))
    assert answer["finish_reason"] == "tool_calls" and "extra_content" not in calls[1]
    assert unsigned == 400 and forged == 400
    [refusal] = json.loads(raw_400)  # a JSON list
    assert refusal["error"]["status"] == "INVALID_ARGUMENT"
    assert refusal["error"]["message"].startswith(
        "Function call is missing a thought_signature in functionCall parts."
    )
    assert ok == 200 and dummy_ok == 200 and earlier_ok == 200 and old == 200


async def test_gemini_streams_parallel_calls_all_at_index_0_without_done() -> None:
    async with FakeLLM(dialect="gemini") as llm:
        llm.script(tool_step(("exec", {"command": "ls"}), ("read_file", {"path": "a"})))
        llm.script(tool_step(("exec", {"command": "ls"})))
        _, raw = await post(llm, body("gemini-3-flash-preview", [USER], stream=True))
        _, raw_25 = await post(llm, body("gemini-2.5-flash", [USER]))
    calls = stream_calls(raw)
    assert [c["index"] for c in calls] == [0, 0]
    assert len({c["id"] for c in calls}) == 2
    assert json.loads(calls[1]["function"]["arguments"]) == {"path": "a"}  # whole, one chunk
    assert "thought_signature" in calls[0]["extra_content"]["google"]
    assert events(raw)[-1] != "[DONE]"
    assert [e["choices"][0]["finish_reason"] for e in events(raw)][-1] == "stop"
    choice = json.loads(raw_25)["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["message"]["tool_calls"]
    assert "extra_content" not in choice["message"]["tool_calls"][0]


async def test_gemini_error_steps_are_lists() -> None:
    async with FakeLLM(dialect="gemini", script=[error(429)]) as llm:
        status, raw = await post(llm, body("gemini-2.5-flash", [USER]))
    assert status == 429 and json.loads(raw)[0]["error"]["status"] == "RESOURCE_EXHAUSTED"


# -- Mistral ----------------------------------------------------------------------------------


async def test_mistral_ids_are_nine_letters_or_digits_and_others_are_refused() -> None:
    async with FakeLLM(dialect="mistral") as llm:
        llm.script(tool_step(("exec", {"command": "ls"}), ("read_file", {"path": "a"})))
        _, raw = await post(llm, body("mistral-large-latest", [USER]))
        ids = [c["id"] for c in json.loads(raw)["choices"][0]["message"]["tool_calls"]]
        theirs, _ = await post(llm, body("mistral-large-latest", with_call(ids[0])))
        status, raw_400 = await post(llm, body("mistral-large-latest", with_call("call_1")))
    assert all(len(i) == 9 and i.isalnum() for i in ids) and theirs == 200
    assert status == 400 and json.loads(raw_400) == {
        "object": "error",
        "message": "Tool call id was call_1 but must be a-z, A-Z, 0-9, with a length of 9.",
        "type": "invalid_function_call",
        "param": None,
        "code": "3280",
    }


async def test_mistral_refuses_unknown_fields_with_422() -> None:
    async with FakeLLM(dialect="mistral") as llm:
        options = {"stream_options": {"include_usage": True}}
        status, raw = await post(llm, body("mistral-small-latest", [USER], stream=True, **options))
        history = with_call("abcDEF123", reasoning_content="why")
        field, raw_field = await post(llm, body("mistral-small-latest", history))
        streamed, ok_raw = await post(llm, body("mistral-small-latest", [USER], stream=True))
    [detail] = json.loads(raw)["detail"]
    assert status == 422 and detail["type"] == "extra_forbidden"
    assert detail["loc"] == ["body", "stream_options", "include_usage"]
    assert detail["msg"] == "Extra inputs are not permitted"
    assert field == 422
    assert json.loads(raw_field)["detail"][0]["loc"] == [
        "body", "messages", 1, "assistant", "reasoning_content"
    ]  # fmt: skip
    assert streamed == 200 and any(isinstance(e, dict) and e.get("usage") for e in events(ok_raw))


async def test_mistral_role_order() -> None:
    after_tool = [*with_call("abcDEF123"), USER]
    closed = [*with_call("abcDEF123"), {"role": "assistant", "content": "a.txt"}, USER]
    async with FakeLLM(dialect="mistral") as llm:
        status, raw = await post(llm, body("mistral-large-latest", after_tool))
        ok, _ = await post(llm, body("mistral-large-latest", closed))
        two_users, _ = await post(llm, body("mistral-large-latest", [USER, USER]))
        last, raw_last = await post(llm, body("m", [USER, {"role": "assistant", "content": "x"}]))
    assert (
        status == 400 and json.loads(raw)["message"] == "Unexpected role 'user' after role 'tool'"
    )
    assert json.loads(raw)["type"] == "invalid_request_message_order"
    assert ok == 200 and two_users == 200  # mistral_common allows user after user
    assert last == 400 and "Expected last role User or Tool" in json.loads(raw_last)["message"]


# -- Groq -------------------------------------------------------------------------------------


async def test_groq_tool_use_failed_and_unknown_message_fields() -> None:
    generation = '<function=exec>{"command": "ls"}</function>'
    failed = error(400, code="tool_use_failed", failed_generation=generation)
    async with FakeLLM(dialect="groq", script=[failed]) as llm:
        status, raw = await post(llm, body("llama-3.3-70b-versatile", [USER]))
        field, raw_field = await post(llm, body("m", with_call(reasoning_content="why")))
        _, thought = await post(llm, body("openai/gpt-oss-20b", [USER]))
        back, _ = await post(llm, body("openai/gpt-oss-20b", with_call(reasoning="why")))
        wrong, _ = await post(llm, body("llama-3.3-70b-versatile", with_call(reasoning="why")))
        options = {"stream": True, "stream_options": {"include_usage": True}}
        today, _ = await post(llm, body("llama-3.3-70b-versatile", [USER], **options))
    async with FakeLLM(dialect="groq", old_build=True) as llm:
        old, raw_old = await post(llm, body("llama3-70b-8192", [USER], **options))
    assert status == 400 and json.loads(raw)["error"] == {
        "message": "Failed to call a function. Please adjust your prompt. See 'failed_generation' "
        "for more details.",
        "type": "invalid_request_error",
        "code": "tool_use_failed",
        "failed_generation": generation,
    }
    assert field == 400 and json.loads(raw_field)["error"]["message"] == (
        "'messages.1' : for 'role:assistant' the following must be satisfied"
        "[('messages.1' : property 'reasoning_content' is unsupported)]"
    )
    assert json.loads(thought)["choices"][0]["message"]["reasoning"]
    assert back == 200 and wrong == 400 and today == 200
    assert old == 400 and "property 'stream_options' is unsupported" in raw_old.decode()


# -- OpenRouter -------------------------------------------------------------------------------


async def test_openrouter_comments_reasoning_and_errors_in_a_200() -> None:
    async with FakeLLM(dialect="openrouter") as llm:
        llm.script(reply("thinking aloud", reasoning="first this", pieces=2))
        llm.script(error(502, in_body=True, message="upstream down"))
        llm.script(error(502, in_body=True, text="partial answer here", error_after_chunks=2))
        _, streamed = await post(llm, body("deepseek/deepseek-r1", [USER], stream=True))
        status, plain = await post(llm, body("deepseek/deepseek-r1", [USER]))
        mid_status, mid = await post(llm, body("deepseek/deepseek-r1", [USER], stream=True))
    lines = events(streamed)
    assert lines[:2] == [": OPENROUTER PROCESSING"] * 2
    thoughts = [d for d in deltas(streamed) if "reasoning" in d]
    assert "".join(d["reasoning"] for d in thoughts) == "first this"
    assert thoughts[0]["reasoning_details"][0]["type"] == "reasoning.text"
    assert any(isinstance(e, dict) and e["usage"] for e in lines)  # usage without asking
    assert status == 200 and json.loads(plain)["error"]["code"] == 502
    assert mid_status == 200
    tail = [e for e in events(mid) if isinstance(e, dict)]
    assert "".join(d.get("content") or "" for d in deltas(mid)) == "partial answer here"[:14]
    assert tail[-1]["error"]["message"] == "Provider returned error"
    assert tail[-1]["choices"][0]["finish_reason"] == "error"
    assert [r["status"] for r in llm.requests] == [200, 200, 200]


async def test_openrouter_errors_reach_the_sdk_as_errors() -> None:
    async with FakeLLM(dialect="openrouter") as llm:
        llm.script(error(502, in_body=True, text="ab cd", error_after_chunks=1))
        client = openai.AsyncOpenAI(api_key="k", base_url=llm.base_url, max_retries=0)
        stream = await client.chat.completions.create(model="x", messages=[USER], stream=True)
        with pytest.raises(openai.APIError, match="Provider returned error"):
            async for _ in stream:
                pass
        await client.close()


# -- Anthropic --------------------------------------------------------------------------------


async def test_anthropic_n_empty_content_and_repeated_tool_ids() -> None:
    repeated = [*with_call("call_0"), {"role": "assistant", "content": "a"}, *with_call("call_0")]
    empty = [USER, {"role": "assistant", "content": ""}, USER]
    async with FakeLLM(dialect="anthropic") as llm:
        llm.script(tool_step(("exec", {"command": "ls"})))
        _, raw_ids = await post(llm, body("claude-sonnet-4-5", [USER]))
        n, raw_n = await post(llm, body("claude-sonnet-4-5", [USER], n=2))
        dup, raw_dup = await post(llm, body("claude-sonnet-4-5", repeated))
        blank, _ = await post(llm, body("claude-sonnet-4-5", empty))
        hot, _ = await post(llm, body("claude-sonnet-4-5", [USER], temperature=1.5))
    call_id = json.loads(raw_ids)["choices"][0]["message"]["tool_calls"][0]["id"]
    assert call_id.startswith("toolu_01")
    assert n == 400 and json.loads(raw_n) == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "n: Must be exactly 1"},
    }
    assert dup == 400 and "`tool_use` ids must be unique" in json.loads(raw_dup)["error"]["message"]
    assert blank == 400 and hot == 200


# -- Ollama -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("old_build", "indexes"), [(False, [0, 0]), (True, [None, None])])
async def test_ollama_streams_whole_calls(old_build: bool, indexes: list[int | None]) -> None:
    async with FakeLLM(dialect="ollama", old_build=old_build) as llm:
        llm.script(tool_step(("exec", {"command": "ls"}), ("read_file", {"path": "a"})))
        _, raw = await post(llm, body("qwen3:8b", [USER], stream=True))
    calls = stream_calls(raw)
    assert [c.get("index") for c in calls] == indexes
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [
        {"command": "ls"},
        {"path": "a"},
    ]
    assert all(c["id"].startswith("call_") for c in calls)
    assert any("reasoning" in d for d in deltas(raw))


# -- vLLM and llama.cpp -----------------------------------------------------------------------

TWO_USERS = [{"role": "system", "content": "s"}, USER, USER]


async def test_vllm_strict_templates_mistral_ids_and_reasoning_field() -> None:
    mistral = "mistralai/Mistral-Small-3.2-24B-Instruct-2506"
    async with FakeLLM(dialect="vllm") as llm:
        llm.script(tool_step(("exec", {"command": "ls"}), when_user_contains="call"))
        status, raw = await post(llm, body(mistral, TWO_USERS))
        qwen, _ = await post(llm, body("Qwen/Qwen3-8B", TWO_USERS))
        ids, raw_ids = await post(llm, body(mistral, with_call("call_1")))
        _, raw_call = await post(llm, body(mistral, [{"role": "user", "content": "call"}]))
        _, thought = await post(llm, body("Qwen/Qwen3-8B", [USER], stream=True))
    async with FakeLLM(dialect="vllm", old_build=True) as llm:
        _, old = await post(llm, body("Qwen/Qwen3-8B", [USER], stream=True))
    assert status == 400 and json.loads(raw) == {
        "object": "error",
        "message": "After the optional system message, conversation roles must alternate "
        "user/assistant/user/assistant/...",
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    }
    assert qwen == 200 and ids == 400 and "length of 9" in json.loads(raw_ids)["message"]
    [made] = json.loads(raw_call)["choices"][0]["message"]["tool_calls"]
    assert len(made["id"]) == 9
    assert any("reasoning" in d for d in deltas(thought))
    assert any("reasoning_content" in d for d in deltas(old))


async def test_llamacpp_template_errors_are_500_with_the_jinja_words() -> None:
    async with FakeLLM(dialect="llamacpp") as llm:
        status, raw = await post(llm, body("devstral-small-2", TWO_USERS))
        gemma, raw_gemma = await post(llm, body("gemma-3-12b-it", TWO_USERS))
        forced, _ = await post(llm, body("Qwen3-30B", TWO_USERS))
    async with FakeLLM(dialect="llamacpp", strict_template=True) as llm:
        strict, _ = await post(llm, body("Qwen3-30B", TWO_USERS))
    error = json.loads(raw)["error"]
    assert status == 500 and error["type"] == "server_error" and error["code"] == 500
    assert error["message"].endswith(
        "Error: Jinja Exception: After the optional system message, conversation roles must "
        "alternate user and assistant roles except for tool calls and results."
    )
    assert gemma == 500 and "Conversation roles must alternate" in raw_gemma.decode()
    assert forced == 200 and strict == 500


async def test_llamacpp_old_builds_refuse_null_content_and_march_2026_sends_objects() -> None:
    async with FakeLLM(dialect="llamacpp", old_build=True) as llm:
        null, raw = await post(llm, body("qwen3", with_call(content=None)))
        empty, _ = await post(llm, body("qwen3", with_call(content="")))
    async with FakeLLM(dialect="llamacpp", object_arguments=True) as llm:
        llm.script(tool_step(("exec", {"command": "ls"})), tool_step(("exec", {"command": "ls"})))
        _, streamed = await post(llm, body("qwen3", [USER], stream=True))
        _, plain = await post(llm, body("qwen3", [USER]))
    assert null == 500 and "Expected 'content' to be a string or an array" in raw.decode()
    assert empty == 200
    assert [c["function"]["arguments"] for c in stream_calls(streamed)] == [{"command": "ls"}]
    message = json.loads(plain)["choices"][0]["message"]
    assert message["tool_calls"][0]["function"]["arguments"] == {"command": "ls"}
    assert message["reasoning_content"]


# -- LM Studio --------------------------------------------------------------------------------


async def test_lmstudio_think_blocks_repeated_ids_and_2024_null_content() -> None:
    async with FakeLLM(dialect="lmstudio") as llm:
        llm.script(tool_step(("exec", {})), tool_step(("exec", {})), reply("the answer"))
        first, second = [
            json.loads((await post(llm, body("qwen/qwen3-8b", [USER])))[1]) for _ in range(2)
        ]
        _, raw = await post(llm, body("qwen/qwen3-8b", [USER]))
    async with FakeLLM(dialect="lmstudio", old_build=True) as llm:
        null, raw_null = await post(llm, body("qwen2.5-7b-instruct", with_call()))
    ids = [a["choices"][0]["message"]["tool_calls"][0]["id"] for a in (first, second)]
    assert ids[0] == ids[1] and ids[0].isdigit() and len(ids[0]) == 9
    content = json.loads(raw)["choices"][0]["message"]["content"]
    assert content.startswith("<think>") and content.endswith("</think>\n\nthe answer")
    assert null == 400 and json.loads(raw_null) == {
        "error": "Invalid 'content': 'content' field must be a string or an array of objects."
    }


# -- thread and process modes -----------------------------------------------------------------


def test_thread_and_process_modes_take_a_dialect(tmp_path: Any) -> None:
    options = {"stream_options": {"include_usage": True}}
    with FakeLLM.start_in_thread(dialect="mistral") as handle:
        client = openai.OpenAI(api_key="k", base_url=handle.base_url, max_retries=0)
        with pytest.raises(openai.UnprocessableEntityError):
            client.chat.completions.create(model="m", messages=[USER], stream=True, **options)
    with FakeLLMProcess.spawn(tmp_path, dialect="llamacpp", strict_template=True) as proc:
        client = openai.OpenAI(api_key="k", base_url=proc.base_url, max_retries=0)
        with pytest.raises(openai.InternalServerError, match="Jinja Exception"):
            client.chat.completions.create(model="qwen3", messages=TWO_USERS)
        assert proc.status()["dialect"] == "llamacpp"
