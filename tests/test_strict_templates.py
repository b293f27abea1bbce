"""Sessions that servers enforcing a strict chat template keep answering (issue 36, item 3).

Mistral's API and the Mistral, Devstral and Gemma templates on llama.cpp and vLLM refuse a
history whose roles do not alternate: two user messages in a row, a user message right after a
tool result, an assistant message first. The real agent loop runs against the fake LLM with
``strict_alternation=True``, which refuses those as such servers do: a turn that failed or was
stopped must leave a history the next turn can be sent with, and a session an earlier memobot
stored in that shape must be sent repaired.
"""

from __future__ import annotations

import asyncio
import io
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bot.bus import InboundMessage
from bot.context import ROLE_BRIDGES
from bot.runner import CLOSING_NOTES, INTERRUPTED_TOOL_RESULT, NO_ANSWER_NOTE
from bot.session import SessionStore
from bot.streaming import STOPPED_MARK
from channels.terminal_channel.channel import TerminalChannel
from tests.fakes.llm_server import FakeLLM, alternation_problem, error, hang, reply, tool_step
from tests.helpers import Harness, channel_in_process, make_config, request_messages

CALL = {"id": "c1", "type": "function", "function": {"name": "list_dir", "arguments": "{}"}}


@pytest.fixture
async def llm() -> AsyncIterator[FakeLLM]:
    async with FakeLLM(strict_alternation=True) as server:
        yield server


def harness(tmp_path: Path, server: FakeLLM, **sections: Any) -> Harness:
    return Harness(make_config(tmp_path, server.base_url, **sections), tmp_path / "config.json")


def roles(messages: list[dict[str, Any]]) -> list[str]:
    return [m["role"] for m in messages]


def stored(tmp_path: Path, key: str = "cli:t") -> list[dict[str, Any]]:
    return SessionStore(tmp_path / "state").history(key)


async def test_a_failed_turn_then_the_next_message(tmp_path: Path, llm: FakeLLM) -> None:
    llm.script(error(400, message="the model is having a bad day"))
    async with harness(tmp_path, llm) as h:
        assert "refused" in await h.ask("first")
        assert await h.ask("second") == "echo: second"
    sent = request_messages(llm.requests[-1])
    assert roles(sent) == ["system", "user", "assistant", "user"]
    # The model reads memobot's note, not the error it could take up and repeat.
    assert sent[2]["content"] == CLOSING_NOTES["failed"]
    assert "bad day" not in str(sent)
    assert roles(stored(tmp_path)) == ["user", "assistant", "user", "assistant"]


async def test_a_failed_tool_turn_then_the_next_message(tmp_path: Path, llm: FakeLLM) -> None:
    llm.script(tool_step(("list_dir", {"path": "."})), error(400))
    async with harness(tmp_path, llm) as h:
        assert "refused" in await h.ask("look around")
        assert await h.ask("and now?") == "echo: and now?"
    sent = request_messages(llm.requests[-1])
    assert roles(sent) == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert sent[4]["content"] == CLOSING_NOTES["failed"]


async def test_a_stopped_turn_then_the_next_message(tmp_path: Path, llm: FakeLLM) -> None:
    llm.script(hang(when_user_contains="slow"))
    async with harness(tmp_path, llm) as h:
        answer = await h.send("slow question")
        await llm.wait_for_requests(1)
        assert "Stopping" in await h.ask("/stop")
        assert (await asyncio.wait_for(answer, 10)).text == "Stopped."
        assert await h.ask("after") == "echo: after"
    sent = request_messages(llm.requests[-1])
    assert roles(sent) == ["system", "user", "assistant", "user"]
    assert sent[2]["content"] == CLOSING_NOTES["stopped"]


class _Screen(io.StringIO):
    """A terminal's stdout that notes when ``needle`` has been written."""

    def __init__(self, needle: str) -> None:
        super().__init__()
        self.needle = needle
        self.seen = asyncio.Event()

    def write(self, s: str) -> int:
        n = super().write(s)
        if self.needle in self.getvalue():
            self.seen.set()
        return n


async def test_a_turn_stopped_while_it_streamed_keeps_what_was_read(tmp_path: Path) -> None:
    """The streamed text the person read is the stopped turn's answer in the history too."""
    long = " ".join(f"part {i} of a long answer." for i in range(40))
    async with FakeLLM(strict_alternation=True) as llm:
        llm.script(reply(long, pieces=40, chunk_delay=0.05, when_user_contains="tell"))
        cfg = make_config(tmp_path, llm.base_url)
        out = _Screen("part 2 ")
        async with channel_in_process(
            cfg,
            tmp_path / "config.json",
            lambda stack: TerminalChannel(stack.bus, "i", out=out, err=io.StringIO()),
        ) as (stack, terminal, _manager):
            asking = asyncio.create_task(terminal.ask("tell me"))
            await asyncio.wait_for(out.seen.wait(), 10)
            await stack.bus.publish_inbound(InboundMessage("cli", "i", "user", "/stop"))
            stopped = await asyncio.wait_for(asking, 10)
            assert stopped is not None and stopped.text.endswith(STOPPED_MARK)
            assert (await asyncio.wait_for(terminal.ask("go on"), 10)) is not None
        sent = request_messages(llm.requests[-1])
    assert roles(sent) == ["system", "user", "assistant", "user"]
    assert sent[2]["content"] == stopped.text  # the model's own words, marked stopped
    assert long.startswith(sent[2]["content"].removesuffix(STOPPED_MARK).strip())


async def test_an_old_poisoned_session_file_is_sent_repaired(
    tmp_path: Path, llm: FakeLLM, caplog: pytest.LogCaptureFixture
) -> None:
    """Turns an earlier memobot stored, as it stored them: a failed one (no answer), a failed
    tool turn (its results, no answer), an answered one, then a reminder."""
    old = SessionStore(tmp_path / "state")
    session = old.get("cli:t")
    for turn in (
        [{"role": "user", "content": "failed"}],
        [
            {"role": "user", "content": "look"},
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "c1", "name": "list_dir", "content": "a.txt"},
        ],
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
        [{"role": "assistant", "content": "Reminder: call Ada."}],
    ):
        old.append(session, turn)
    caplog.set_level(logging.INFO, logger="bot.context")
    async with harness(tmp_path, llm) as h:
        assert await h.ask("now") == "echo: now"
        assert await h.ask("again") == "echo: again"
    sent = request_messages(llm.requests[0])
    assert roles(sent) == [
        "system",
        *("user", "assistant"),  # "failed" and a note
        *("user", "assistant", "tool", "assistant"),  # the tool turn and a note
        *("user", "assistant", "user", "assistant"),  # hi, hello, a note, the reminder
        "user",
    ]
    assert sent[2] == sent[6] == ROLE_BRIDGES[("user", "user")]
    assert sent[9] == ROLE_BRIDGES[("assistant", "assistant")]
    # What is on disk is left as it was; the next request repeats the first one's prefix.
    assert request_messages(llm.requests[1])[: len(sent)] == sent
    poisoned = ["user", "user", "assistant", "tool", "user", "assistant", "assistant"]
    assert roles(stored(tmp_path))[:7] == poisoned
    reports = [r for r in caplog.records if "session cli:t" in r.getMessage()]
    assert len(reports) == 1 and reports[0].levelname == "INFO"


async def test_a_window_trimmed_inside_one_long_turn_opens_on_a_note(
    tmp_path: Path, llm: FakeLLM
) -> None:
    """When the part of the history that fits is one tool turn, the window opens on its
    assistant message: a note of the person's role goes before it."""
    llm.script(
        tool_step(("read_file", {"path": "big.txt"})),
        tool_step(("read_file", {"path": "big.txt"})),
        reply("I read it twice."),
    )
    async with harness(tmp_path, llm, llm={"contextWindowTokens": 8192, "maxTokens": 512}) as h:
        (tmp_path / "ws" / "big.txt").write_text("lorem ipsum dolor " * 600)
        assert await h.ask("read the big file twice") == "I read it twice."
        assert await h.ask("what did it say?") == "echo: what did it say?"
    sent = request_messages(llm.requests[-1])
    assert alternation_problem(sent) is None
    assert sent[1] == ROLE_BRIDGES[(None, "assistant")] and sent[2]["role"] == "assistant"
    assert INTERRUPTED_TOOL_RESULT not in str(sent)


async def test_a_checkpoint_whose_message_is_gone_is_kept_closed(tmp_path: Path, llm: FakeLLM):
    """At start a checkpoint that can no longer be answered (its message is not pending) is
    kept as history: closed like a failed turn, so the next message can follow it."""
    store = SessionStore(tmp_path / "state")
    session = store.get("cli:t")
    work = [
        {"role": "user", "content": "look"},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "c1", "name": "list_dir", "content": "a.txt"},
    ]
    checkpoint = {"phase": "tools_completed", "message_id": "gone", "messages": work}
    store.append(session, metadata={"runtime_checkpoint": checkpoint})
    async with harness(tmp_path, llm) as h:
        assert await h.ask("next") == "echo: next"
    sent = request_messages(llm.requests[-1])
    assert roles(sent) == ["system", "user", "assistant", "tool", "assistant", "user"]
    kept = stored(tmp_path)
    assert roles(kept) == ["user", "assistant", "tool", "assistant", "user", "assistant"]
    assert kept[3]["content"] == NO_ANSWER_NOTE  # stored closed, not only sent so
