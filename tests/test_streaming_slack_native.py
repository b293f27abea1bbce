"""Slack's streaming methods for apps (chat.startStream / appendStream / stopStream): the real
slack_sdk against the fake Slack, which keeps Slack's rules (thread_ts required, recipient ids
outside a DM, 12,000 characters per call, no append to an ended stream, blocks kept by an
update that does not replace them). In a thread the answer streams into one message, which
the final answer turns into the rendered answer; where Slack refuses, the answer streams by
chat.postMessage and chat.update instead, once."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from bot.streaming import STOPPED_MARK
from tests.fakes.llm_server import FakeLLM, reply, tool_step
from tests.fakes.slack_api import TEAM_ID, FakeSlack
from tests.helpers.slack import ALICE, CHAN, DM, Rig, dm, mention

FAST = {
    "streaming": True,
    "streamEditIntervalSeconds": 0.1,
    "rateLimits": {"channel": {"messages": 20, "perSeconds": 1, "burst": 3}},
}
ANSWER = "**Done.** See [the docs](https://example.com/docs) and `code`.\n\n" + " ".join(
    f"step {i}." for i in range(40)
)


@pytest.fixture
async def llm() -> AsyncIterator[FakeLLM]:
    async with FakeLLM() as server:
        yield server


def _fake(**kwargs: Any) -> FakeSlack:
    users = {ALICE: {"id": ALICE, "profile": {"display_name": "alice"}}}
    return FakeSlack(users=users, post_interval=0.05, **kwargs)


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    async with _fake() as s:
        yield s


async def _until(predicate, timeout: float = 15) -> None:  # noqa: ASYNC109
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


def _calls(slack: FakeSlack, method: str, error: str | None = None) -> list[str]:
    return [ts for m, ts, e in slack.stream_calls if m == method and e == error]


# (where, the event that asks, the chat the answer goes to)
THREADS = {
    "channel thread": (CHAN, lambda text, ts: mention(text, ts)),
    "dm thread": (DM, lambda text, ts: dm(text, ts, thread_ts="1700000030.000001")),
}


@pytest.mark.parametrize("where", list(THREADS))
async def test_thread_answer_streams_natively_into_one_message(tmp_path, llm, slack, where):
    channel, event = THREADS[where]
    llm.script(reply(ANSWER, pieces=10, chunk_delay=0.12))
    async with Rig(tmp_path, llm, slack, **FAST) as rig:
        await slack.push_event(event("explain", "1700000031.000100"), event_id="N1")
        # Text shows (and grows) while the model is still writing.
        await _until(lambda: bool(_calls(slack, "chat.appendStream")))
        [live] = slack.shown(channel)
        assert live["streaming"] and 0 < len(live["text"]) < len(ANSWER)
        assert ANSWER.startswith(live["text"])  # appends carry the Markdown as written
        expected = rig.channel.render(ANSWER)
        await _until(lambda: [m["text"] for m in slack.shown(channel)] == expected)
        await asyncio.sleep(0.4)  # a late append or a second copy would land by now
    [shown] = slack.shown(channel)
    assert shown["text"] == expected[0] and "<https://example.com/docs|" in shown["text"]
    assert not shown["streaming"] and shown["appends"] >= 2
    assert shown["ts"] == slack.streams[0]["ts"]  # the streamed message became the answer
    assert slack.posts == []  # no chat.postMessage: nothing beside the stream
    [start] = slack.streams
    assert start["thread_ts"] == shown["thread_ts"]
    if channel == CHAN:  # outside a DM the stream names its recipient
        assert (start["recipient_user_id"], start["recipient_team_id"]) == (ALICE, TEAM_ID)
    assert [e for _, _, e in slack.stream_calls if e] == []


@pytest.mark.parametrize("refusal", ["unknown_method", "missing_scope"])
async def test_refused_streaming_falls_back_once_and_answers_once(tmp_path, llm, refusal, caplog):
    caplog.set_level(logging.INFO, logger="channels.slack_channel.channel")
    llm.script(
        reply(ANSWER, pieces=6, chunk_delay=0.1),
        reply("Second answer, " + ANSWER, pieces=6, chunk_delay=0.1),
    )
    async with _fake(streaming_error=refusal) as slack, Rig(tmp_path, llm, slack, **FAST) as rig:
        await slack.push_event(mention("first", "1700000032.000100"), event_id="R1")
        first = rig.channel.render(ANSWER)
        await _until(lambda: [m["text"] for m in slack.shown(CHAN)] == first)
        await slack.push_event(mention("second", "1700000032.000200"), event_id="R2")
        second = rig.channel.render("Second answer, " + ANSWER)
        await _until(lambda: [m["text"] for m in slack.shown(CHAN)] == first + second)
        await asyncio.sleep(0.4)
    # One message per answer, posted then updated while it was written.
    assert len(slack.posts) == 2 and all(m["edits"] >= 2 for m in slack.shown(CHAN))
    # Slack was asked once; the refusal is remembered for the workspace, and said once.
    assert slack.stream_calls == [("chat.startStream", "", refusal)]
    lines = [r.getMessage() for r in caplog.records if "chat.startStream refused" in r.getMessage()]
    assert len(lines) == 1 and refusal in lines[0] and "xoxb" not in lines[0]
    assert set(rig.channel.features_off) == {"native streams"}  # and memobot status says so


async def test_text_rewritten_after_a_tool_call_goes_on_by_update(tmp_path, llm, slack):
    """The model's next reply after a tool call does not extend what the stream shows (a
    stream only appends): the stream is stopped and the same message edited from then on."""
    (tmp_path / "ws").mkdir(exist_ok=True)
    (tmp_path / "ws" / "notes.txt").write_text("buy milk")
    llm.script(
        tool_step(
            ("read_file", {"path": "notes.txt"}),
            text="Let me look at your notes first. ",
            pieces=4,
            chunk_delay=0.1,
        ),
        reply("You wanted to buy milk, and " + ANSWER, pieces=6, chunk_delay=0.1),
    )
    async with Rig(tmp_path, llm, slack, **FAST) as rig:
        await slack.push_event(mention("what did I note?", "1700000037.000100"), event_id="W1")
        await _until(lambda: bool(slack.streams))
        assert "Let me look at your notes first.".startswith(slack.streams[0]["markdown_text"])
        expected = rig.channel.render("You wanted to buy milk, and " + ANSWER)
        await _until(lambda: [m["text"] for m in slack.shown(CHAN)] == expected)
        await asyncio.sleep(0.3)
    [shown] = slack.shown(CHAN)
    assert shown["ts"] == slack.streams[0]["ts"] and slack.posts == []
    assert _calls(slack, "chat.stopStream") == [shown["ts"]]
    assert [e for _, _, e in slack.stream_calls if e] == []


async def test_top_level_dm_is_not_streamed_natively(tmp_path, llm, slack):
    """Slack streams only replies in a thread: a DM's top level keeps post + update (the
    answer stays where the user reads it, not in a new thread under the question)."""
    llm.script(reply(ANSWER, pieces=8, chunk_delay=0.15))
    async with Rig(tmp_path, llm, slack, **FAST) as rig:
        await slack.push_event(dm("explain", "1700000033.000100"), event_id="T1")
        expected = rig.channel.render(ANSWER)
        await _until(lambda: [m["text"] for m in slack.shown(DM)] == expected)
    assert slack.stream_calls == [] and len(slack.posts) == 1
    assert slack.posts[0].thread_ts is None


async def test_stop_mid_stream_keeps_the_streamed_text_marked_stopped(tmp_path, llm, slack):
    long_answer = " ".join(f"sentence {i} of a long answer." for i in range(60))
    llm.script(reply(long_answer, pieces=40, chunk_delay=0.15))
    root = "1700000034.000100"
    async with Rig(tmp_path, llm, slack, **FAST) as rig:
        await slack.push_event(mention("tell me everything", root), event_id="S1")
        await _until(lambda: len(_calls(slack, "chat.appendStream")) >= 2)
        stream_ts = slack.streams[0]["ts"]
        await slack.push_event(mention("!stop", "1700000034.000200", root), event_id="S2")
        await _until(lambda: STOPPED_MARK in slack.shown_messages[stream_ts]["text"])
        await asyncio.sleep(0.5)
        session = rig.stack.store.get(f"slack:{CHAN}:{root}")
        assert not session.metadata.get("previews") and not session.metadata.get("outbox")
    shown = {m["ts"]: m for m in slack.shown(CHAN)}
    stopped = shown.pop(stream_ts)  # the stream itself became the final message
    assert not stopped["streaming"] and stopped["text"].endswith(STOPPED_MARK)
    streamed = stopped["text"].removesuffix(STOPPED_MARK).strip()
    assert streamed and long_answer.startswith(streamed) and streamed != long_answer
    assert [m["text"] for m in shown.values()] == ["Stopping the current answer."]


async def test_long_answer_continues_in_new_streams(tmp_path, llm, slack):
    long = " ".join(f"word{i}" for i in range(1500))
    llm.script(reply(long, pieces=12, chunk_delay=0.1))
    async with Rig(tmp_path, llm, slack, **FAST) as rig:
        await slack.push_event(mention("count", "1700000035.000100"), event_id="L1")
        expected = rig.channel.render(long)
        assert len(expected) >= 3
        await _until(lambda: [m["text"] for m in slack.shown(CHAN)] == expected, 20)
        await asyncio.sleep(0.3)
    shown = slack.shown(CHAN)
    assert len(slack.streams) == len(expected) and slack.posts == []  # one per piece
    assert not any(m["streaming"] for m in shown)
    assert [e for _, _, e in slack.stream_calls if e] == []  # none over Slack's limits
    assert " ".join(m["text"] for m in shown).split() == long.split()


async def test_stream_ended_by_slack_goes_on_with_updates(tmp_path, llm):
    """Slack ends a stream on its side (about 5 minutes after it started; here 0.6 s): the
    next append is refused, and the same message goes on growing by chat.update."""
    llm.script(reply(ANSWER, pieces=12, chunk_delay=0.12))
    async with _fake(stream_lifetime=0.6) as slack, Rig(tmp_path, llm, slack, **FAST) as rig:
        await slack.push_event(mention("explain", "1700000036.000100"), event_id="E1")
        expected = rig.channel.render(ANSWER)
        await _until(lambda: [m["text"] for m in slack.shown(CHAN)] == expected)
        await asyncio.sleep(0.3)
    [shown] = slack.shown(CHAN)
    assert shown["ts"] == slack.streams[0]["ts"] and slack.posts == []
    assert _calls(slack, "chat.appendStream", "message_not_in_streaming_state")
    assert shown["edits"] >= 2  # the answer (and previews before it) by chat.update


async def test_a_stream_cut_and_retried_ends_as_the_retried_answer(tmp_path, llm, slack):
    """A stream broken mid-way is retried from the start by the LLM client: its text does not
    extend what the stream shows, so the stream is stopped and the message edited into the
    retried answer; nothing of the cut text is left."""
    retried = "Second try: " + ANSWER
    llm.script(
        reply(ANSWER, pieces=10, chunk_delay=0.1, disconnect_after_chunks=6),
        reply(retried, pieces=4, chunk_delay=0.1),
    )
    async with Rig(tmp_path, llm, slack, **FAST) as rig:
        await slack.push_event(mention("explain", "1700000038.000100"), event_id="X1")
        await _until(lambda: bool(_calls(slack, "chat.appendStream")))
        expected = rig.channel.render(retried)
        await _until(lambda: [m["text"] for m in slack.shown(CHAN)] == expected)
        await asyncio.sleep(0.3)
    assert len(llm.requests) == 2
    [shown] = slack.shown(CHAN)
    assert shown["ts"] == slack.streams[0]["ts"] and slack.posts == []
    assert [e for _, _, e in slack.stream_calls if e] == []
