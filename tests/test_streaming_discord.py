"""Discord while an answer is written: the real discord.py against the fake Discord API. One
message is sent once there is text, edited within the channel's rate limit, and edited into
the rendered answer; beyond 2,000 characters the answer continues in new messages."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.fakes.discord_api import BOT_USER, TEXT_CHANNEL_ID, FakeDiscord
from tests.fakes.llm_server import FakeLLM, reply
from tests.helpers.discord import ALICE, ALICE_DM, MENTION, running, until


@pytest.fixture
async def llm() -> AsyncIterator[FakeLLM]:
    async with FakeLLM() as server:
        yield server


@pytest.fixture
async def api() -> AsyncIterator[FakeDiscord]:
    async with FakeDiscord() as server:
        with server.patch():
            yield server


FAST = {"streaming": True, "streamEditIntervalSeconds": 0.1}
ANSWER = (
    "Here is **the plan** for today:\n\n"
    "- wake up and drink water\n- walk for twenty minutes\n- write the report\n\n"
    "Ping @everyone when it is done."
)


async def test_guild_answer_streams_into_one_edited_reply(
    tmp_path: Path, llm: FakeLLM, api: FakeDiscord
) -> None:
    llm.script(reply(ANSWER, pieces=8, chunk_delay=0.2))
    async with running(tmp_path, llm, api, **FAST) as bot:
        question = await api.send_message(
            TEXT_CHANNEL_ID, ALICE, f"{MENTION} plan", mentions=[BOT_USER]
        )
        expected = bot.channel.render(ANSWER)
        await until(lambda: [m["content"] for m in api.shown(TEXT_CHANNEL_ID)] == expected, 15)
        await asyncio.sleep(0.4)  # a late preview edit (the bug) would land by now
        [post] = api.posts(TEXT_CHANNEL_ID)
        assert str(post.body["message_reference"]["message_id"]) == question["id"]
        assert post.body["allowed_mentions"] == {"parse": [], "replied_user": False}
        assert "@everyone" not in post.body["content"]  # a preview never pings either
        [shown] = api.shown(TEXT_CHANNEL_ID)
        assert shown["edits"] >= 2  # it grew while written, then became the answer
        assert llm.requests[0]["body"]["stream"] is True


async def test_dm_answer_beyond_2000_characters_continues_in_new_messages(
    tmp_path: Path, llm: FakeLLM, api: FakeDiscord
) -> None:
    long = " ".join(f"word{i}" for i in range(700))
    llm.script(reply(long, pieces=12, chunk_delay=0.1))
    async with running(tmp_path, llm, api, **FAST) as bot:
        await api.send_message(ALICE_DM, ALICE, "count", guild_id=None)
        expected = bot.channel.render(long)
        assert len(expected) >= 3
        await until(lambda: [m["content"] for m in api.shown(ALICE_DM)] == expected, 20)
        assert len(api.posts(ALICE_DM)) == len(expected)  # one message per piece, no copy
        assert all(len(m["content"]) <= 2000 for m in api.shown(ALICE_DM))
        assert " ".join(m["content"] for m in api.shown(ALICE_DM)).split() == long.split()
        store = bot.harness.stack.store

        def settled() -> bool:
            meta = store.get(f"discord:{ALICE_DM}").metadata
            return not meta.get("previews") and not meta.get("outbox")

        await until(settled, 5)  # the ledger forgets the answer and its previews together


async def test_guild_answer_in_pieces_replies_once_and_edits_only_what_changed(
    tmp_path: Path, llm: FakeLLM
) -> None:
    """Only the answer's first message replies to the question, and the final answer edits
    only the previews that do not show it yet: Discord takes an edit that changes nothing,
    but each costs one of the channel's sends, so the last piece would come that much later."""
    long = " ".join(f"word{i}" for i in range(700))
    llm.script(reply(long, pieces=12, chunk_delay=0.05))
    pace = {"rateLimits": {"channel": {"messages": 50, "perSeconds": 1}}}
    async with FakeDiscord(rate_limit=50, rate_window=1.0) as api:
        with api.patch():
            async with running(tmp_path, llm, api, **FAST, **pace) as bot:
                question = await api.send_message(
                    TEXT_CHANNEL_ID, ALICE, f"{MENTION} count", mentions=[BOT_USER]
                )
                expected = bot.channel.render(long)
                assert len(expected) >= 3
                store = bot.harness.stack.store

                def delivered() -> bool:
                    meta = store.get(f"discord:{TEXT_CHANNEL_ID}").metadata
                    return len(api.posts(TEXT_CHANNEL_ID)) == len(expected) and not (
                        meta.get("previews") or meta.get("outbox")
                    )

                await until(delivered, 20)
                await asyncio.sleep(0.3)
    assert [m["content"] for m in api.shown(TEXT_CHANNEL_ID)] == expected
    assert api.edits(TEXT_CHANNEL_ID)  # the previews grew, then became the answer
    assert api.unchanged_edits(TEXT_CHANNEL_ID) == []
    references = [p.body.get("message_reference") for p in api.posts(TEXT_CHANNEL_ID)]
    assert str(references[0]["message_id"]) == question["id"]
    assert references[1:] == [None] * (len(expected) - 1)
