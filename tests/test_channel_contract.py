"""One contract for every chat platform, run over the Telegram, Discord and Slack fakes.

Each platform below is the real channel class (python-telegram-bot, discord.py, slack-bolt)
with the real agent loop and channel manager, against the local fake of the platform's wire
(tests/fakes); only the way a person's message is put on the wire and the way the bot's posts
are read back differ, and those are the ``Platform`` adapters. A new channel joins the suite
with one adapter; what is specific to one platform stays in its own test module.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bot.bus import InboundMessage, MessageBus
from channels.base import Channel
from channels.formatting import (
    DISCORD_LIMIT,
    SLACK_LIMIT,
    TELEGRAM_LIMIT,
    telegram_length,
)
from tests.fakes.discord_api import FakeDiscord
from tests.fakes.llm_server import FakeLLM, reply
from tests.fakes.slack_api import FakeSlack
from tests.fakes.telegram_api import FakeBotAPI, strip_html
from tests.helpers import discord as dc
from tests.helpers import slack as sl
from tests.helpers import telegram as tg

pytestmark = pytest.mark.timeout(60)


@dataclass
class Platform:
    """One platform as the contract sees it: say something in a private chat, read what the
    bot posted there, make the platform refuse the next post with a rate limit."""

    name: str
    limit: int  # the platform's limit on one message, in its own units
    length: Callable[[str], int]  # a posted text's length in those units
    say: Callable[[str], Any]  # awaitable: a private message; returns a handle for say_again
    say_again: Callable[[Any], Any]  # awaitable: the platform delivers that message again
    posts: Callable[[], list[str]]  # what the bot posted to the private chat, as shown
    refuse_next_post: Callable[[float], None]  # a 429 with retry_after seconds
    post_attempts: Callable[[], int]  # posts tried, refused ones included
    channel: Channel  # the real channel object, as the manager holds it
    token_setting: str  # the config field of the credential the platform checks
    revoke: Callable[[], Any]  # awaitable: the platform refuses the credential from now on
    connects: Callable[[], int]  # how often the channel has tried to (re)connect
    partials: Callable[[], int]  # answers shown while being written (drafts, edits, appends)
    shown: Callable[[], list[str]]  # the bot's messages the private chat shows now (edited)

    async def wait_posts(self, n: int, timeout: float = 20) -> list[str]:  # noqa: ASYNC109
        deadline = time.monotonic() + timeout
        while len(self.posts()) < n:
            assert time.monotonic() < deadline, f"{self.name}: {self.posts()}"
            await _pause()
        return self.posts()


async def _pause() -> None:
    await asyncio.sleep(0.02)


async def telegram(
    stack: AsyncExitStack, tmp_path: Path, llm: FakeLLM, **settings: Any
) -> Platform:
    api = await stack.enter_async_context(FakeBotAPI())
    bot = await stack.enter_async_context(tg.running(tmp_path, llm, api, **settings))

    async def say(text: str) -> dict[str, Any]:
        message = api.message(text, chat=api.private_chat(tg.ALICE), sender=api.user(tg.ALICE))
        api.inject(message)
        return message

    async def say_again(message: dict[str, Any]) -> None:
        api.inject(message)  # the same message in a new update, as after a lost confirmation

    async def revoke() -> None:
        api.token = "7700000000:revoked-in-botfather"  # every call with the old one: 401

    return Platform(
        "telegram",
        TELEGRAM_LIMIT,
        telegram_length,
        say,
        say_again,
        lambda: [strip_html(c.params["text"]) for c in api.sent(tg.ALICE)],
        lambda seconds: api.fail("sendMessage", 429, retry_after=int(seconds)),
        lambda: len(api.calls("sendMessage")),
        bot.channel,
        "channels.telegram.token",
        revoke,
        lambda: len(api.calls("getUpdates")),
        lambda: len(api.drafts(tg.ALICE)) + len(api.calls("editMessageText")),
        lambda: [strip_html(m["text"]) for m in api.shown(tg.ALICE)],
    )


async def discord(stack: AsyncExitStack, tmp_path: Path, llm: FakeLLM, **settings: Any) -> Platform:
    api = await stack.enter_async_context(FakeDiscord())
    stack.enter_context(api.patch())
    bot = await stack.enter_async_context(dc.running(tmp_path, llm, api, **settings))

    async def say(text: str) -> dict[str, Any]:
        return await api.send_message(dc.ALICE_DM, dc.ALICE, text, guild_id=None)

    async def say_again(message: dict[str, Any]) -> None:
        await api.send_message(
            dc.ALICE_DM, dc.ALICE, message["content"], guild_id=None, message_id=message["id"]
        )

    async def revoke() -> None:
        api.gateway_token = "revoked"  # the next IDENTIFY is closed with 4004
        await api.drop_connections()

    return Platform(
        "discord",
        DISCORD_LIMIT,
        len,
        say,
        say_again,
        lambda: [c.body["content"] for c in api.posts(dc.ALICE_DM)],
        lambda seconds: api.fail_next(429, retry_after=seconds, via=False),
        lambda: len([c for c in api.calls if c.path.endswith("/messages")]),
        bot.channel,
        "channels.discord.token",
        revoke,
        lambda: len(api.identifies) + len(api.resumes),
        lambda: len(api.edits(dc.ALICE_DM)),
        lambda: [m["content"] for m in api.shown(dc.ALICE_DM)],
    )


async def slack(stack: AsyncExitStack, tmp_path: Path, llm: FakeLLM, **settings: Any) -> Platform:
    users = {sl.ALICE: {"id": sl.ALICE, "profile": {"display_name": "alice"}}}
    api = await stack.enter_async_context(FakeSlack(users=users, post_interval=0.05))
    rig = await stack.enter_async_context(sl.Rig(tmp_path, llm, api, **settings))
    said = iter(range(1, 10_000))

    async def say(text: str) -> dict[str, Any]:
        n = next(said)
        event = sl.dm(text, f"1700000001.{n:06d}")
        await api.push_event(event, event_id=f"Ev{n}")
        return {"event": event, "id": f"Ev{n}"}

    async def say_again(sent: dict[str, Any]) -> None:
        await api.push_event(sent["event"], event_id=sent["id"], retry_attempt=1)

    async def revoke() -> None:
        api.app_token = "xapp-regenerated"  # the next apps.connections.open: invalid_auth
        await api.drop_connections()

    return Platform(
        "slack",
        SLACK_LIMIT,
        len,
        say,
        say_again,
        lambda: [p.text for p in api.posts if p.channel == sl.DM],
        lambda seconds: api.post_script.append({"retry_after": int(seconds)}),
        lambda: int(api.calls["chat.postMessage"]),
        rig.channel,
        "channels.slack.appToken",
        revoke,
        lambda: int(api.calls["apps.connections.open"]),
        lambda: sum(api.calls.get(m, 0) for m in ("chat.update", "chat.appendStream")),
        lambda: [m["text"] for m in api.shown(sl.DM)],
    )


@pytest.fixture(params=[telegram, discord, slack], ids=lambda p: p.__name__)
async def platform(
    request: pytest.FixtureRequest, tmp_path: Path, llm: FakeLLM
) -> AsyncIterator[Platform]:
    async with AsyncExitStack() as stack:
        yield await request.param(stack, tmp_path, llm)


STREAMING = {"streaming": True, "streamEditIntervalSeconds": 0.2}


@pytest.fixture(params=[telegram, discord, slack], ids=lambda p: p.__name__)
async def streaming(
    request: pytest.FixtureRequest, tmp_path: Path, llm: FakeLLM
) -> AsyncIterator[Platform]:
    async with AsyncExitStack() as stack:
        yield await request.param(stack, tmp_path, llm, **STREAMING)


async def test_a_private_message_is_answered_once(platform: Platform) -> None:
    await platform.say("hello there")
    assert await platform.wait_posts(1) == ["echo: hello there"]
    await platform.say("and again")
    assert await platform.wait_posts(2) == ["echo: hello there", "echo: and again"]


async def test_a_long_answer_is_split_within_the_limit_in_the_platforms_own_units(
    platform: Platform, llm: FakeLLM
) -> None:
    # Emoji count twice in Telegram's UTF-16 units and once in Discord's and Slack's characters.
    lines = [f"line {i:03d} " + "\U0001f600" * 40 for i in range(150)]
    llm.script(reply("\n".join(lines)))
    await platform.say("a long one please")
    deadline = time.monotonic() + 30
    while "line 149" not in "".join(platform.posts()):
        assert time.monotonic() < deadline, platform.posts()
        await _pause()
    posts = platform.posts()
    assert len(posts) >= 2
    assert all(platform.length(p) <= platform.limit for p in posts)
    joined = "\n".join(posts)
    assert [joined.index(f"line {i:03d} ") for i in range(150)] == sorted(
        joined.index(f"line {i:03d} ") for i in range(150)
    )
    assert joined.count("\U0001f600") == 150 * 40


async def test_a_rate_limited_post_is_sent_again_after_the_wait_the_platform_asked_for(
    platform: Platform,
) -> None:
    platform.refuse_next_post(1.0)
    asked = time.monotonic()
    await platform.say("hurry")
    assert await platform.wait_posts(1) == ["echo: hurry"]
    assert time.monotonic() - asked >= 1.0
    assert platform.post_attempts() == 2  # the refused one and the one that went through


async def test_a_message_delivered_twice_is_answered_once(platform: Platform) -> None:
    first = await platform.say("once")
    await platform.say_again(first)
    await platform.wait_posts(1)
    await platform.say("twice")
    await platform.wait_posts(2)
    assert platform.posts() == ["echo: once", "echo: twice"]


async def test_every_message_says_who_sent_it_and_whether_in_a_group(
    platform: Platform, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A channel that leaves either out makes the core guess (bot.kinds.sender_of); the guess
    # is the least it could be, but a channel must say.
    seen: list[InboundMessage] = []
    publish = MessageBus.publish_inbound

    async def recording(bus: MessageBus, msg: InboundMessage) -> Any:
        seen.append(msg)
        return await publish(bus, msg)

    monkeypatch.setattr(MessageBus, "publish_inbound", recording)
    await platform.say("who am I")
    await platform.wait_posts(1)
    said = [m for m in seen if m.text == "who am I"]
    assert said, platform.name
    for msg in said:
        assert isinstance(msg.metadata.get("is_admin"), bool), msg.metadata
        assert msg.metadata.get("is_group") is False, msg.metadata


async def test_a_credential_revoked_while_running_stops_the_channel_and_names_the_setting(
    platform: Platform,
) -> None:
    await platform.say("still here?")
    await platform.wait_posts(1)
    reported: list[Channel] = []
    platform.channel.on_fatal = reported.append  # what the channel manager listens to
    await platform.revoke()
    deadline = time.monotonic() + 20
    while platform.channel.state != "failed":
        assert time.monotonic() < deadline, (platform.name, platform.channel.state)
        await _pause()
    assert reported == [platform.channel]
    assert platform.token_setting in str(platform.channel.fatal)
    tries = platform.connects()
    await asyncio.sleep(1.5)  # a channel that kept trying a dead credential would show here
    assert platform.connects() == tries, f"{platform.name} went on retrying a revoked credential"


async def test_a_streamed_answer_is_shown_while_written_and_ends_as_one_message(
    streaming: Platform, llm: FakeLLM
) -> None:
    answer = " ".join(f"word{i}" for i in range(80))
    llm.script(reply(answer, pieces=10, chunk_delay=0.15))
    await streaming.say("write it out")
    deadline = time.monotonic() + 20
    while streaming.shown() != [answer]:
        assert time.monotonic() < deadline, (streaming.name, streaming.shown())
        await _pause()
    await asyncio.sleep(0.5)  # a late edit or a second copy would land by now
    assert streaming.shown() == [answer], streaming.name  # one message, the whole answer
    assert streaming.partials() >= 2, f"{streaming.name} showed nothing while it was written"
