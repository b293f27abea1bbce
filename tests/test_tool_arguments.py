"""Tool-call arguments are the model's words, and history.jsonl is a file it can write: nested
or oversized JSON is a tool error for the model, never a failed turn (issue 27, finding 9)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bot.safejson import MAX_ARGUMENT_CHARS
from bot.session import SessionStore
from tests.fakes.llm_server import FakeLLM, call, reply, tool_step
from tests.helpers import Harness, make_config, request_messages

DEEP = "[" * 100_000 + "]" * 100_000


@pytest.fixture
async def llm():
    async with FakeLLM() as server:
        yield server


def tool_results(request: dict) -> list[dict]:
    return [m for m in request_messages(request) if m["role"] == "tool"]


@pytest.mark.parametrize("approval", ["off", "always"])
@pytest.mark.parametrize("tool", ["read_file", "exec", "no_such_tool"])
async def test_deeply_nested_arguments_are_a_tool_error(
    tmp_path: Path, llm: FakeLLM, tool: str, approval: str
) -> None:
    # A bare array and an object holding one: the second parses for a Python that allows
    # the depth, and then is too deep for whatever walks it next.
    deep_object = '{"path": ' + "[" * 500 + "]" * 500 + "}"
    llm.script(
        tool_step(call(tool, DEEP, id="c1"), call(tool, deep_object, id="c2")),
        reply("I will call it properly."),
    )
    cfg = make_config(tmp_path, llm.base_url, tools={"approval": approval})
    async with Harness(cfg, tmp_path / "config.json") as h:
        assert await h.ask("go") == "I will call it properly."
        # Refused before any approval question: nobody is asked about arguments that
        # cannot run.
        assert [m.text for m in h.outbox] == ["I will call it properly."]
    results = tool_results(llm.requests[1])
    assert [r["tool_call_id"] for r in results] == ["c1", "c2"]
    for r in results:
        assert r["content"].startswith("Error:"), r["content"][:200]
        if tool != "no_such_tool":
            assert "nested more than 64 levels deep" in r["content"]
    # The session file holds the turn and loads again, in a fresh store.
    stored = SessionStore(tmp_path / "state").history("cli:t")
    assert [m["role"] for m in stored] == ["user", "assistant", "tool", "tool", "assistant"]
    assert stored[1]["tool_calls"][0]["function"]["arguments"] == DEEP


async def test_oversized_arguments_are_a_tool_error(tmp_path: Path, llm: FakeLLM) -> None:
    huge = json.dumps({"path": "big.txt", "content": "x" * (MAX_ARGUMENT_CHARS + 1)})
    llm.script(
        tool_step(call("write_file", huge, id="c1"), call("list_dir", {}, id="c2")),
        reply("Too big, then."),
    )
    async with Harness(make_config(tmp_path, llm.base_url), tmp_path / "config.json") as h:
        assert await h.ask("write a big file") == "Too big, then."
    big, listing = tool_results(llm.requests[1])
    assert big["content"].startswith("Error: the tool arguments are too large")
    assert not (tmp_path / "ws" / "big.txt").exists()
    assert not listing["content"].startswith("Error:")  # the next call of the batch still ran


async def test_a_nested_line_in_history_jsonl_is_skipped(tmp_path: Path, llm: FakeLLM) -> None:
    history = tmp_path / "ws" / "memory" / "history.jsonl"
    history.parent.mkdir(parents=True)
    good = {"cursor": 1, "timestamp": "2026-01-02T10:00:00Z", "session": "cli:t"}
    history.write_text(
        json.dumps({**good, "content": "The deploy is on Friday."})
        + "\n"
        + '{"cursor": 2, "content": '
        + DEEP
        + "}\n"
    )
    llm.script(tool_step(call("memory_search", {"query": "deploy"})), reply("Friday."))
    async with Harness(make_config(tmp_path, llm.base_url), tmp_path / "config.json") as h:
        assert await h.ask("when is the deploy?") == "Friday."
    [found] = tool_results(llm.requests[1])
    assert "The [deploy] is on Friday." in found["content"]


def test_a_nested_line_in_a_session_file_is_set_aside(tmp_path: Path) -> None:
    store = SessionStore(tmp_path / "state")
    session = store.get("cli:t")
    store.append(session, [{"role": "user", "content": "kept"}])
    with open(session.path, "ab") as fh:
        fh.write(('{"role": "user", "content": ' + DEEP + "}\n").encode())
        fh.write(b'{"_type": "metadata", "changes": {}}\n')
    reloaded = SessionStore(tmp_path / "state").get("cli:t")
    assert [m["content"] for m in reloaded.messages] == ["kept"]
    assert list(session.path.parent.glob("*.corrupt-*"))  # the damaged file was copied aside
