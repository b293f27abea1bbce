"""The Discord channel end to end: real discord.py against a local fake of Discord's wire.

discord.py logs in over REST, opens the gateway WebSocket, receives READY / GUILD_CREATE and
MESSAGE_CREATE from ``tests.fakes.discord_api`` and sends replies back to it; the agent loop and
the channel manager are the real ones, the model is the fake OpenAI-compatible server (its
default answer echoes the first line the model saw, so a reply shows what reached the model).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from bot.session import SessionStore
from channels.discord_channel import channel as discord_channel
from channels.errors import FatalChannelError, PermanentError, RetryAfter, TransientError
from channels.registry import create_channel
from tests.fakes.discord_api import (
    BOT_USER,
    OTHER_CHANNEL_ID,
    TEXT_CHANNEL_ID,
    THREAD_ID,
    TOKEN,
    FakeDiscord,
)
from tests.fakes.llm_server import FakeLLM, reply
from tests.helpers import (
    VirtualClock,
    listed_commands,
    make_config,
    readme_commands,
    request_messages,
)
from tests.helpers.discord import (
    ALICE,
    ALICE_DM,
    BOB,
    BOB_DM,
    MENTION,
    NO_PINGS,
    OTHER_BOT,
    running,
    running_on,
    settle,
    until,
)


@pytest.fixture
async def llm() -> AsyncIterator[FakeLLM]:
    async with FakeLLM() as server:
        yield server


@pytest.fixture
async def api() -> AsyncIterator[FakeDiscord]:
    async with FakeDiscord() as server:
        with server.patch():
            yield server


# --- direct messages --------------------------------------------------------------------------


async def test_typing_shows_only_while_an_answer_takes_time(
    tmp_path: Path, llm: FakeLLM, api
) -> None:
    async with running(tmp_path, llm, api) as bot:  # the default: 1 s
        await api.send_message(ALICE_DM, ALICE, "quick", guild_id=None)
        await bot.answered(ALICE_DM)
        assert api.typings() == [], "a quick answer needs no typing indicator"
        llm.script(reply("slow", delay=2.0))
        await api.send_message(ALICE_DM, ALICE, "slow one", guild_id=None)
        await api.wait_posts(2, ALICE_DM)
        [typing] = api.typings()
        assert typing.path == f"/api/v10/channels/{ALICE_DM}/typing"


async def test_dm_from_allowed_user_is_answered(tmp_path: Path, llm: FakeLLM, api) -> None:
    async with running(tmp_path, llm, api) as bot:
        assert api.identifies[0]["intents"] == 1 | (1 << 9) | (1 << 12) | (1 << 15)
        await api.send_message(ALICE_DM, ALICE, "hello there", guild_id=None)
        [body] = await bot.answered(ALICE_DM)
        assert body["content"] == "echo: hello there"
        assert "message_reference" not in body  # DMs get plain messages, not replies
        assert body["allowed_mentions"] == NO_PINGS
    [req] = llm.requests
    user_turn = request_messages(req)[-1]["content"]
    assert user_turn.startswith("hello there\n\n") and f"chat: {ALICE_DM}" in user_turn
    assert [m["role"] for m in bot.session(ALICE_DM)] == ["user", "assistant"]


async def test_denied_user_is_ignored_and_logged_once(
    tmp_path: Path, llm: FakeLLM, api, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="channels.access")
    async with running(tmp_path, llm, api) as bot:
        await api.send_message(BOB_DM, BOB, "let me in", guild_id=None)
        await api.send_message(BOB_DM, BOB, "please", guild_id=None)
        await api.send_message(ALICE_DM, ALICE, "hi", guild_id=None)
        await bot.answered(ALICE_DM)
        await asyncio.sleep(0.1)
        assert api.posts(BOB_DM) == []
    assert len(llm.requests) == 1
    denials = [r for r in caplog.records if BOB["id"] in r.getMessage()]
    assert len(denials) == 1
    assert f'add "{BOB["id"]}" to channels.discord.allowFrom' in denials[0].getMessage()


async def test_whoami_in_dm_answers_a_denied_user(tmp_path: Path, llm: FakeLLM, api) -> None:
    async with running(tmp_path, llm, api) as bot:
        await api.send_message(BOB_DM, BOB, "/whoami", guild_id=None)
        [body] = await bot.answered(BOB_DM)
    assert body["content"] == (
        f"Your discord user id is {BOB['id']}. "
        "You are not allowed (add it to channels.discord.allowFrom)."
    )
    assert llm.requests == []


# --- guilds -----------------------------------------------------------------------------------


async def test_guild_answers_only_when_addressed(tmp_path: Path, llm: FakeLLM, api) -> None:
    async with running(tmp_path, llm, api) as bot:
        await api.send_message(TEXT_CHANNEL_ID, ALICE, "just chatting")
        await api.send_message(TEXT_CHANNEL_ID, ALICE, "@everyone hello", mention_everyone=True)
        asked = await api.send_message(
            TEXT_CHANNEL_ID, ALICE, f"{MENTION} what is up?", mentions=[BOT_USER]
        )
        [body] = await bot.answered(TEXT_CHANNEL_ID)
        await asyncio.sleep(0.1)
        assert len(api.posts(TEXT_CHANNEL_ID)) == 1
    # A reply to the user's message, without pinging them, the mention gone from the text.
    assert body["content"] == "echo: what is up?"
    assert body["message_reference"]["message_id"] == int(asked["id"])
    assert body["message_reference"]["fail_if_not_exists"] is False
    assert body["allowed_mentions"] == NO_PINGS
    [req] = llm.requests
    user_turn = request_messages(req)[-1]["content"]
    assert user_turn.startswith("what is up?\n\n") and MENTION not in user_turn


async def test_reply_to_the_bot_is_answered(tmp_path: Path, llm: FakeLLM, api) -> None:
    ours = FakeDiscord.message_payload(TEXT_CHANNEL_ID, BOT_USER, "an earlier answer")
    theirs = FakeDiscord.message_payload(TEXT_CHANNEL_ID, BOB, "someone else")
    async with running(tmp_path, llm, api) as bot:
        await api.send_message(TEXT_CHANNEL_ID, ALICE, "not to you", referenced=theirs)
        await api.send_message(TEXT_CHANNEL_ID, ALICE, "and then?", referenced=ours)
        [body] = await bot.answered(TEXT_CHANNEL_ID)
        await asyncio.sleep(0.1)
        assert len(api.posts(TEXT_CHANNEL_ID)) == 1
    assert body["content"] == "echo: and then?"


async def test_command_in_guild_needs_no_mention(tmp_path: Path, llm: FakeLLM, api) -> None:
    async with running(tmp_path, llm, api) as bot:
        await api.send_message(TEXT_CHANNEL_ID, ALICE, "/help")
        [body] = await bot.answered(TEXT_CHANNEL_ID)
    assert body["content"].startswith("memobot commands:")
    assert llm.requests == []


async def test_help_lists_the_commands_the_readme_lists(tmp_path: Path, llm: FakeLLM, api) -> None:
    async with running(tmp_path, llm, api) as bot:
        await api.send_message(ALICE_DM, ALICE, "/help", guild_id=None)
        [body] = await bot.answered(ALICE_DM)
    assert listed_commands(body["content"]) == readme_commands("discord")
    assert llm.requests == []


async def test_bots_are_ignored(tmp_path: Path, llm: FakeLLM, api) -> None:
    async with running(tmp_path, llm, api, allowFrom=["*"]) as bot:
        await api.send_message(TEXT_CHANNEL_ID, OTHER_BOT, f"{MENTION} hi", mentions=[BOT_USER])
        await api.send_message(TEXT_CHANNEL_ID, BOT_USER, f"{MENTION} me", mentions=[BOT_USER])
        await api.send_message(ALICE_DM, OTHER_BOT, "psst", guild_id=None)
        await settle(bot, TEXT_CHANNEL_ID)
        assert [c.body["content"] for c in api.posts()] == ["echo: sync"]


async def test_open_group_policy_answers_everything(tmp_path: Path, llm: FakeLLM, api) -> None:
    async with running(tmp_path, llm, api, groupPolicy="open") as bot:
        await api.send_message(TEXT_CHANNEL_ID, ALICE, "no mention needed")
        [body] = await bot.answered(TEXT_CHANNEL_ID)
    assert body["content"] == "echo: no mention needed"


async def test_allow_channels_and_threads_as_sessions(tmp_path: Path, llm: FakeLLM, api) -> None:
    async with running(tmp_path, llm, api, allowChannels=[str(TEXT_CHANNEL_ID)]) as bot:
        await api.send_message(OTHER_CHANNEL_ID, ALICE, f"{MENTION} elsewhere", mentions=[BOT_USER])
        await api.send_message(THREAD_ID, ALICE, f"{MENTION} in the thread", mentions=[BOT_USER])
        [in_thread] = await bot.answered(THREAD_ID)
        await api.send_message(
            TEXT_CHANNEL_ID, ALICE, f"{MENTION} in the channel", mentions=[BOT_USER]
        )
        [in_channel] = await bot.answered(TEXT_CHANNEL_ID)
        assert api.posts(OTHER_CHANNEL_ID) == []
    assert in_thread["content"] == "echo: in the thread"
    assert in_channel["content"] == "echo: in the channel"
    # The thread has its own session; the parent channel's session never saw it.
    assert "in the thread" in bot.session(THREAD_ID)[0]["content"]
    assert "in the channel" in bot.session(TEXT_CHANNEL_ID)[0]["content"]
    assert len(bot.session(THREAD_ID)) == len(bot.session(TEXT_CHANNEL_ID)) == 2
    assert len(llm.requests) == 2


# --- sending ----------------------------------------------------------------------------------


async def test_long_answer_is_split_around_a_code_block(tmp_path: Path, llm: FakeLLM, api) -> None:
    code = "\n".join(f"line_{i:03d} = {i} * 2  # padding to make it long" for i in range(80))
    prose = " ".join(f"word{i}" for i in range(200))
    answer = f"{prose}\n\n```python\n{code}\n```\n\nThat is all."
    assert len(answer) > 2 * 2000
    llm.script(reply(answer))
    async with running(tmp_path, llm, api) as bot:
        asked = await api.send_message(
            TEXT_CHANNEL_ID, ALICE, f"{MENTION} code", mentions=[BOT_USER]
        )
        await api.wait_posts(1, TEXT_CHANNEL_ID)
        await bot.harness.manager.flush()  # returns once every piece was handed over
        bodies = [c.body for c in api.posts(TEXT_CHANNEL_ID)]
    assert len(bodies) >= 3
    for body in bodies:
        assert len(body["content"]) <= 2000
        assert body["content"].count("```") % 2 == 0, "every piece opens and closes its fences"
        assert body["allowed_mentions"] == NO_PINGS
    assert bodies[0]["message_reference"]["message_id"] == int(asked["id"])
    assert all("message_reference" not in b for b in bodies[1:])
    joined = "\n".join(b["content"] for b in bodies)
    for i in range(80):
        assert f"line_{i:03d} = {i} * 2" in joined
    assert "word199" in joined and "That is all." in joined


@pytest.mark.parametrize("via", [True, False], ids=["library-retry", "manager-retry"])
async def test_rate_limit_is_waited_out_and_delivered(
    tmp_path: Path, llm: FakeLLM, api, via: bool
) -> None:
    # With "Via" discord.py sleeps through the 429 itself; without it the 429 escapes the
    # library and the channel manager waits retry_after (RetryAfter) before sending again.
    api.fail_next(429, retry_after=0.3, via=via)
    async with running(tmp_path, llm, api) as bot:
        await api.send_message(ALICE_DM, ALICE, "hurry", guild_id=None)
        [body] = await bot.answered(ALICE_DM)
    assert body["content"] == "echo: hurry"
    attempts = [c for c in api.calls if c.path.endswith("/messages")]
    assert [c.status for c in attempts] == [429, 200]
    assert attempts[1].at - attempts[0].at >= 0.3


async def test_a_call_discord_never_answers_is_given_up_and_sent_again(
    tmp_path: Path, llm: FakeLLM, api, monkeypatch: pytest.MonkeyPatch
) -> None:
    # discord.py's session waits 300 s for an answer; the chat's later answers would wait too.
    monkeypatch.setattr(discord_channel, "CALL_TIMEOUT_SECONDS", 0.5)
    api.fail_next(0, stall=4)  # the first Create Message hangs (answered only after 4 s)
    async with running(tmp_path, llm, api) as bot:
        bot.harness.manager.delivery.clock = VirtualClock()  # the retry's backoff, no wait
        await api.send_message(ALICE_DM, ALICE, "still there?", guild_id=None)
        [body] = await bot.answered(ALICE_DM)
    assert body["content"] == "echo: still there?"
    attempts = [c for c in api.calls if c.path.endswith("/messages")]
    assert len(attempts) == 2 and attempts[1].at - attempts[0].at < 5


async def test_a_file_upload_slower_than_the_call_deadline_is_not_sent_twice(
    tmp_path: Path, llm: FakeLLM, api, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A 10 MB file on a slow uplink takes longer than a text message's deadline; cut, it was
    # sent again while Discord took the first (or never got through at all).
    from bot.bus import OutboundMessage

    monkeypatch.setattr(discord_channel, "CALL_TIMEOUT_SECONDS", 0.5)
    monkeypatch.setattr(discord_channel, "UPLOAD_BYTES_PER_SECOND", 1000)
    report = tmp_path / "report.bin"
    report.write_bytes(b"x" * 3000)  # 3 s at this test's upload rate
    async with running(tmp_path, llm, api) as bot:
        bot.harness.manager.delivery.clock = VirtualClock()
        await api.send_message(ALICE_DM, ALICE, "send me the report", guild_id=None)
        await bot.answered(ALICE_DM)
        api.fail_next(0, stall=1.5)  # the upload takes 1.5 s; then Discord takes it
        msg = OutboundMessage("discord", str(ALICE_DM), "", media=(str(report),))
        await bot.harness.manager.delivery.with_retries(
            bot.channel, msg, lambda _plain: bot.channel.send_file(msg, str(report))
        )
        await asyncio.sleep(2)  # a second upload would be here by now
        assert len([c for c in api.posts(ALICE_DM) if c.files]) == 1


async def test_six_pieces_are_paced_by_the_rate_limit_headers(tmp_path: Path, llm: FakeLLM) -> None:
    # 5 messages per window per channel: discord.py reads X-RateLimit-Remaining/Reset-After
    # and waits for the window itself, so the 6th piece goes out after it without any 429.
    window = 1.0
    pieces = [f"part {i}: " + " ".join(["word"] * 360) for i in range(1, 7)]
    llm.script(reply("\n\n".join(pieces)))
    fast = {"channel": {"messages": 100, "perSeconds": 1, "burst": 10}}  # ours out of the way
    async with FakeDiscord(rate_window=window) as api, running_on(api) as patched:
        async with running(tmp_path, llm, patched, rateLimits=fast) as bot:
            assert len(bot.channel.render("\n\n".join(pieces))) == 6
            await api.send_message(ALICE_DM, ALICE, "long one", guild_id=None)
            await api.wait_posts(6, ALICE_DM)
    attempts = [c for c in api.calls if c.path.endswith("/messages")]
    assert [c.status for c in attempts] == [200] * 6, "no 429 at all: the library paced itself"
    assert [c.body["content"].split(":", 1)[0] for c in attempts] == [
        f"part {i}" for i in range(1, 7)
    ]
    assert attempts[5].at - attempts[0].at >= window * 0.95
    assert attempts[4].at - attempts[0].at < window


async def test_our_pacing_keeps_six_pieces_within_five_per_window(
    tmp_path: Path, llm: FakeLLM
) -> None:
    # rateLimits matched to the fake's window: the manager spaces the pieces itself.
    window = 1.0
    pieces = [f"part {i}: " + " ".join(["word"] * 360) for i in range(1, 7)]
    llm.script(reply("\n\n".join(pieces)))
    paced = {"channel": {"messages": 5, "perSeconds": window}}
    async with FakeDiscord(rate_window=window) as api, running_on(api) as patched:
        async with running(tmp_path, llm, patched, rateLimits=paced):
            await api.send_message(ALICE_DM, ALICE, "long one", guild_id=None)
            await api.wait_posts(6, ALICE_DM)
    attempts = [c for c in api.calls if c.path.endswith("/messages")]
    assert [c.status for c in attempts] == [200] * 6
    # Spread evenly by us (the library alone sends five at once, then waits): the i-th piece
    # no sooner than i fifths of the window after the first. Counted from the first, not
    # piece to piece, so one piece delayed on the way does not make the next gap look short;
    # 50 ms for the first piece itself arriving late (0.176 s against 0.18 seen under load).
    since = [b.at - attempts[0].at for b in attempts]
    assert all(t >= i * window / 5 - 0.05 for i, t in enumerate(since)), since


async def test_fake_enforces_five_per_window_with_headers() -> None:
    # The rule itself, as a raw client meets it: the 6th message in the window is refused.
    import aiohttp

    async with FakeDiscord(rate_window=1.0) as api, aiohttp.ClientSession() as http:
        url = f"{api.api_base}/channels/{ALICE_DM}/messages"
        auth = {"Authorization": f"Bot {TOKEN}"}
        seen = []
        for i in range(6):
            async with http.post(url, json={"content": str(i)}, headers=auth) as resp:
                seen.append((resp.status, dict(resp.headers), await resp.json()))
    assert [s for s, _, _ in seen] == [200] * 5 + [429]
    assert [h["X-RateLimit-Remaining"] for _, h, _ in seen] == ["4", "3", "2", "1", "0", "0"]
    _, headers, body = seen[5]
    assert body["global"] is False and 0 < body["retry_after"] <= 1.0
    assert float(headers["Retry-After"]) == pytest.approx(body["retry_after"], abs=0.01)
    for key in ("X-RateLimit-Limit", "X-RateLimit-Reset", "X-RateLimit-Reset-After"):
        assert key in headers
    assert headers["X-RateLimit-Bucket"] == "fake-channel-messages"


async def test_everyone_in_the_answer_never_pings(tmp_path: Path, llm: FakeLLM, api) -> None:
    llm.script(reply("@everyone @here <@&123> <@456> look at this"))
    async with running(tmp_path, llm, api) as bot:
        await api.send_message(TEXT_CHANNEL_ID, ALICE, f"{MENTION} ping them", mentions=[BOT_USER])
        [body] = await bot.answered(TEXT_CHANNEL_ID)
    # Belt and braces: the text is defused and the API is told to ping nobody.
    assert "everyone" in body["content"] and "@everyone" not in body["content"]
    assert body["allowed_mentions"] == NO_PINGS


async def test_forbidden_channel_fails_the_delivery(
    tmp_path: Path, llm: FakeLLM, api, caplog: pytest.LogCaptureFixture
) -> None:
    api.fail_next(403, body={"message": "Missing Permissions", "code": 50013})
    async with running(tmp_path, llm, api) as bot:
        await api.send_message(TEXT_CHANNEL_ID, ALICE, f"{MENTION} hi", mentions=[BOT_USER])
        await api.wait_for(lambda: any(c.status == 403 for c in api.calls))
        await bot.harness.manager.flush()
    attempts = [c for c in api.calls if c.path.endswith("/messages")]
    assert [c.status for c in attempts] == [403, 200]  # refused once, not retried
    assert attempts[1].body["content"].startswith("I could not deliver my answer")
    assert "Missing Permissions" in attempts[1].body["content"]
    assert any("Missing Permissions" in r.getMessage() for r in caplog.records)
    # The answer stays in the ledger (memobot status shows it), marked failed.
    meta = SessionStore(tmp_path / "state").get(f"discord:{TEXT_CHANNEL_ID}").metadata
    assert [e["state"] for e in meta["outbox"]] == ["failed"]


# --- media ------------------------------------------------------------------------------------


async def test_attachments_are_downloaded_into_media(tmp_path: Path, llm: FakeLLM, api) -> None:
    png = b"\x89PNG\r\n\x1a\n" + b"\x00" * 64
    image = api.add_attachment("cat photo.png", png, "image/png")
    notes = api.add_attachment("notes.txt", b"remember the milk", "text/plain")
    huge = {
        **api.add_attachment("huge.bin", b"x", "application/octet-stream"),
        "size": 30 * 1024 * 1024,
    }
    async with running(tmp_path, llm, api) as bot:
        sent = await api.send_message(
            ALICE_DM, ALICE, "look", guild_id=None, attachments=[image, notes, huge]
        )
        await bot.answered(ALICE_DM)
    folder = tmp_path / "ws" / "media" / "discord" / str(ALICE_DM)
    saved = sorted(p.name for p in folder.iterdir())
    assert saved == [f"{sent['id']}-cat_photo.png", f"{sent['id']}-notes.txt"]
    assert (folder / f"{sent['id']}-cat_photo.png").read_bytes() == png
    [req] = llm.requests
    parts = request_messages(req)[-1]["content"]
    text = parts[0]["text"]
    assert text.startswith("look\n[attachment huge.bin not saved: too large]")
    assert str(folder / f"{sent['id']}-notes.txt") in text
    assert parts[1]["image_url"]["url"].startswith("data:image/png;base64,")


async def test_a_chat_keeps_its_order_while_media_downloads(
    tmp_path: Path, llm: FakeLLM, api
) -> None:
    api.attachment_delay = 0.3
    notes = api.add_attachment("notes.txt", b"slow to fetch", "text/plain")
    async with running(tmp_path, llm, api) as bot:
        await api.send_message(ALICE_DM, ALICE, "first", guild_id=None, attachments=[notes])
        await api.send_message(ALICE_DM, ALICE, "second", guild_id=None)
        await bot.answered(ALICE_DM, 2)
    users = [m["content"] for m in bot.session(ALICE_DM) if m["role"] == "user"]
    assert [u.split("\n", 1)[0] for u in users] == ["first", "second"]


# --- connection lifecycle ---------------------------------------------------------------------


async def test_rejected_token_stops_the_channel(
    tmp_path: Path, llm: FakeLLM, api, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = make_config(
        tmp_path,
        llm.base_url,
        channels={"discord": {"enabled": True, "token": "wrong", "allowFrom": [ALICE["id"]]}},
    )
    channel = create_channel("discord", _bus(), cfg)
    await channel.start()
    try:
        await until(lambda: channel.state == "failed")
        await asyncio.sleep(0.2)
        assert api.logins == 1, "a rejected token is not retried"
        assert channel.fatal is not None and "channels.discord.token" in str(channel.fatal)
        assert api.identifies == []
        assert "channels.discord.token" in caplog.text
    finally:
        await channel.stop()
    assert channel.state == "stopped"


async def test_login_error_is_retried_with_backoff(tmp_path: Path, llm: FakeLLM, api) -> None:
    api.login_failures = [400]
    async with running(tmp_path, llm, api) as bot:
        assert api.logins == 2
        await api.send_message(ALICE_DM, ALICE, "back again", guild_id=None)
        [body] = await bot.answered(ALICE_DM)
    assert body["content"] == "echo: back again"


async def test_gateway_drop_is_resumed(tmp_path: Path, llm: FakeLLM, api) -> None:
    async with running(tmp_path, llm, api) as bot:
        states: list[str] = []
        bot.channel.set_state = _recording(bot.channel.set_state, states)
        await api.drop_connections(4000)
        await until(lambda: api.resumes and bot.channel.state == "connected")
        assert states[:2] == ["reconnecting", "connected"]
        assert api.resumes[0]["session_id"] == "session-1" and len(api.identifies) == 1
        await api.send_message(ALICE_DM, ALICE, "still there?", guild_id=None)
        [body] = await bot.answered(ALICE_DM)
    assert body["content"] == "echo: still there?"


async def test_reconnect_request_is_survived(tmp_path: Path, llm: FakeLLM, api) -> None:
    async with running(tmp_path, llm, api) as bot:
        await api.send_reconnect()
        await until(lambda: api.resumes and bot.channel.state == "connected")
        assert len(api.identifies) == 1, "RECONNECT resumes the session, no new IDENTIFY"
        await api.send_message(ALICE_DM, ALICE, "after op 7", guild_id=None)
        [body] = await bot.answered(ALICE_DM)
    assert body["content"] == "echo: after op 7"


@pytest.mark.parametrize("resumable", [True, False], ids=["resumable", "not-resumable"])
async def test_invalid_session_is_survived(
    tmp_path: Path, llm: FakeLLM, api, resumable: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    import discord

    async def no_identify_pause(self: Any, shard_id: int | None, *, initial: bool) -> None:
        pass  # discord.py waits 5 s before every IDENTIFY but the first; not worth it here

    monkeypatch.setattr(discord.Client, "before_identify_hook", no_identify_pause)
    async with running(tmp_path, llm, api) as bot:
        await api.invalidate_session(resumable)
        if resumable:
            await until(lambda: api.resumes and bot.channel.state == "connected")
            assert len(api.identifies) == 1
        else:  # the session is gone: discord.py identifies afresh
            await until(lambda: len(api.identifies) == 2 and bot.channel.state == "connected")
            assert api.resumes == []
        await api.wait_identified()
        await api.send_message(ALICE_DM, ALICE, "after op 9", guild_id=None)
        [body] = await bot.answered(ALICE_DM)
    assert body["content"] == "echo: after op 9"


@pytest.mark.parametrize(
    ("code", "setup", "advice"),
    [
        (4004, {"gateway_token": "revoked"}, "gateway closed the connection with code 4004"),
        (4014, {"allowed_intents": 0}, "Privileged Gateway Intents"),
    ],
    ids=["4004-token", "4014-intents"],
)
async def test_fatal_close_stops_the_channel_with_one_line(
    tmp_path: Path,
    llm: FakeLLM,
    api,
    caplog: pytest.LogCaptureFixture,
    code: int,
    setup: dict[str, Any],
    advice: str,
) -> None:
    # REST login works; the gateway refuses IDENTIFY (a token revoked meanwhile, or the
    # MESSAGE CONTENT intent not switched on: the most common first-run mistake).
    for name, value in setup.items():
        setattr(api, name, value)
    caplog.set_level(logging.WARNING)
    cfg = make_config(
        tmp_path,
        llm.base_url,
        channels={"discord": {"enabled": True, "token": TOKEN, "allowFrom": [ALICE["id"]]}},
    )
    channel = create_channel("discord", _bus(), cfg)
    reported: list[Any] = []
    channel.on_fatal = reported.append  # what the channel manager listens to
    await channel.start()
    try:
        await until(lambda: channel.state == "failed")
        await asyncio.sleep(0.3)
        assert api.closes == [code] and len(api.identifies) == 1, "no reconnect after it"
        assert channel.state == "failed"
        assert channel.fatal is not None, "reported as fatal: the gateway exits when all are"
        assert reported == [channel]
    finally:
        await channel.stop()
    # Our lines only: discord.py's own one-time notes (PyNaCl missing) depend on test order.
    problems = [
        r
        for r in caplog.records
        if r.levelno >= logging.WARNING and r.name.startswith(("channels", "bot"))
    ]
    assert len(problems) == 1, [r.getMessage() for r in problems]
    assert problems[0].levelno == logging.ERROR and advice in problems[0].getMessage()
    assert "stopped" in problems[0].getMessage()


def _recording(set_state: Callable[..., None], states: list[str]) -> Callable[..., None]:
    def wrapper(state: str, detail: str = "") -> None:
        states.append(state)
        set_state(state, detail)

    return wrapper


def _bus() -> Any:
    from bot.bus import MessageBus

    return MessageBus()


# --- error mapping (pure) ---------------------------------------------------------------------


def _http_error(status: int, headers: dict[str, str] | None = None) -> Exception:
    import discord

    response = SimpleNamespace(status=status, reason="scripted", headers=headers or {})
    factory = {403: discord.Forbidden, 404: discord.NotFound}.get(status, discord.HTTPException)
    if status >= 500:
        factory = discord.DiscordServerError
    return factory(response, {"message": f"status {status}", "code": 0})


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (400, PermanentError),
        (403, PermanentError),
        (404, PermanentError),
        (401, FatalChannelError),
        (500, TransientError),
        (503, TransientError),
    ],
)
def test_http_errors_map_to_our_vocabulary(status: int, expected: type) -> None:
    from channels.discord_channel.errors import map_send_error

    assert type(map_send_error(_http_error(status), "Create Message")) is expected


def test_rate_limits_map_to_retry_after() -> None:
    import aiohttp
    import discord

    from channels.discord_channel.errors import map_send_error

    def mapped(exc: BaseException) -> Exception | None:
        return map_send_error(exc, "Create Message")

    escaped = mapped(_http_error(429, {"Retry-After": "2.5"}))
    assert isinstance(escaped, RetryAfter) and escaped.seconds == 2.5
    long_wait = mapped(discord.RateLimited(45.0))
    assert isinstance(long_wait, RetryAfter) and long_wait.seconds == 45.0
    assert isinstance(mapped(aiohttp.ClientConnectionError()), TransientError)
    assert isinstance(mapped(discord.LoginFailure("bad")), FatalChannelError)
    assert mapped(ValueError("a bug")) is None


def test_proxy_options() -> None:
    from channels.discord_channel.channel import proxy_options, strip_bot_mention

    assert proxy_options("") == {}
    assert proxy_options("http://127.0.0.1:3128") == {"proxy": "http://127.0.0.1:3128"}
    assert strip_bot_mention("<@!42> hi <@42>  there", 42) == "hi there"


async def test_socks_proxy_uses_a_connector() -> None:
    from aiohttp_socks import ProxyConnector

    from channels.discord_channel.channel import proxy_options

    plain = proxy_options("socks5://user:pw@127.0.0.1:1080")["connector"]
    remote = proxy_options("socks5h://127.0.0.1:1080")["connector"]
    try:
        assert isinstance(plain, ProxyConnector) and plain._rdns is False
        assert isinstance(remote, ProxyConnector) and remote._rdns is True
    finally:
        await plain.close()
        await remote.close()
