"""Slack while an answer is written: the real slack_sdk against the fake Slack Web API. One
message is posted once there is text, updated (chat.update) within the channel's pace, and
updated into the rendered answer; beyond Slack's length the answer continues in new
messages."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from tests.fakes.llm_server import FakeLLM, reply
from tests.fakes.slack_api import FakeSlack
from tests.helpers.slack import ALICE, DM, Rig, dm

FAST = {
    "streaming": True,
    "streamEditIntervalSeconds": 0.1,
    "rateLimits": {"channel": {"messages": 20, "perSeconds": 1, "burst": 3}},
}


@pytest.fixture
async def llm() -> AsyncIterator[FakeLLM]:
    async with FakeLLM() as server:
        yield server


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    users = {ALICE: {"id": ALICE, "profile": {"display_name": "alice"}}}
    async with FakeSlack(users=users, post_interval=0.05) as s:
        yield s


async def _until(predicate, timeout: float = 15) -> None:  # noqa: ASYNC109
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


async def test_dm_answer_streams_into_one_updated_message(tmp_path, llm, slack):
    answer = "**Done.** See [the docs](https://example.com/docs) and `code`.\n\n" + " ".join(
        f"step {i}." for i in range(30)
    )
    llm.script(reply(answer, pieces=8, chunk_delay=0.2))
    async with Rig(tmp_path, llm, slack, **FAST) as rig:
        await slack.push_event(dm("format it", "1700000014.000100"), event_id="M1")
        expected = rig.channel.render(answer)
        await _until(lambda: [m["text"] for m in slack.shown(DM)] == expected)
        await asyncio.sleep(0.4)  # a late preview update (the bug) would land by now
        [shown] = slack.shown(DM)
        assert shown["text"] == expected[0] and "<https://example.com/docs|" in shown["text"]
        assert shown["edits"] >= 2  # it grew while written
        assert len(slack.posts) == 1  # no second copy
        assert slack.rate_limited == 0
        assert llm.requests[0]["body"]["stream"] is True


async def test_long_answer_continues_in_new_messages(tmp_path, llm, slack):
    long = " ".join(f"word{i}" for i in range(1500))
    llm.script(reply(long, pieces=12, chunk_delay=0.1))
    async with Rig(tmp_path, llm, slack, **FAST) as rig:
        await slack.push_event(dm("count", "1700000015.000100"), event_id="M2")
        expected = rig.channel.render(long)
        assert len(expected) >= 3
        await _until(lambda: [m["text"] for m in slack.shown(DM)] == expected, 20)
        await asyncio.sleep(0.3)
        assert len(slack.posts) == len(expected)  # one per piece, no copies
        assert " ".join(m["text"] for m in slack.shown(DM)).split() == long.split()


async def test_final_answer_updates_only_the_messages_it_changes(tmp_path, llm, slack):
    """A finished piece already shows its words: the final answer updates only the previews
    that do not show it yet (Slack takes an update that changes nothing, at a send's cost)."""
    long = " ".join(f"word{i}" for i in range(1100))
    llm.script(reply(long, pieces=12, chunk_delay=0.05))
    async with Rig(tmp_path, llm, slack, **FAST) as rig:
        await slack.push_event(dm("count", "1700000016.000100"), event_id="M3")
        expected = rig.channel.render(long)
        assert len(expected) >= 3

        def delivered() -> bool:
            meta = rig.stack.store.get(f"slack:{DM}").metadata
            return len(slack.posts) == len(expected) and not (
                meta.get("previews") or meta.get("outbox")
            )

        await _until(delivered, 20)
        await asyncio.sleep(0.3)
        assert [m["text"] for m in slack.shown(DM)] == expected
        assert slack.updates  # the previews grew, then became the answer
        assert slack.unchanged_updates == []
