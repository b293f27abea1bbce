"""Platform errors classified right (issue 35): a method the server does not know is not a bad
token, an answer the SDK cannot read does not hold a chat, a preview that keeps failing is
switched off. The real python-telegram-bot against the fake Bot API taught to answer so; the
pure policy (channels.retry) and each SDK's mapping on their own."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import SimpleNamespace

import pytest
from telegram.error import BadRequest, InvalidToken, NetworkError

from bot.bus import OutboundMessage
from bot.cli import cmd_status
from bot.gateway import STATUS_FILE, write_status
from bot.service.doctor import check_running_channels
from channels.errors import (
    FatalChannelError,
    FeatureUnavailable,
    PermanentError,
    RetryAfter,
    TransientError,
    UnexpectedError,
)
from channels.retry import Breaker, Retries, RetryPolicy
from channels.telegram_channel.errors import send_error
from tests.fakes.llm_server import call, reply, tool_step
from tests.fakes.telegram_api import BOT_USERNAME, NO_RESULT, FakeBotAPI, strip_html
from tests.helpers import STREAMED_ANSWER as ANSWER
from tests.helpers import TELEGRAM_FAST_PREVIEWS as FAST
from tests.helpers import VirtualClock, make_config, telegram_in_process
from tests.helpers.telegram import Running, running

ALICE = 1001
GROUP = -1001234
BOT = f"@{BOT_USERNAME}"


def _shown(api: FakeBotAPI, chat: int) -> list[str]:
    return [m["text"] for m in api.shown(chat)]


def _rendered(tg, text: str) -> list[str]:
    return [strip_html(p) for p in tg.channel.render(text)]


def _button(question, choice: str) -> str:
    """The callback data of the ``choice`` button ("once", "always", "deny") of a question."""
    [data] = [
        b["callback_data"]
        for row in FakeBotAPI.markup(question)
        for b in row
        if b["callback_data"].endswith(f":{choice}")
    ]
    return str(data)


@asynccontextmanager
async def _approving(tmp_path, llm, api) -> AsyncIterator[Running]:
    """Telegram in process, as ``running``, with approvals asked for risky commands."""
    settings = {"enabled": True, "token": api.token, "baseUrl": api.base_url, **FAST}
    settings |= {"allowFrom": [str(ALICE)], "pollTimeoutSeconds": 2, "streaming": False}
    cfg = make_config(
        tmp_path, llm.base_url, channels={"telegram": settings}, tools={"approval": "risky"}
    )
    async with telegram_in_process(cfg, tmp_path / "config.json") as (stack, channel, manager):
        yield Running(api, llm, stack, channel, manager, tmp_path)


# -- a method the server does not know -------------------------------------------------------


async def test_a_server_without_drafts_turns_drafts_off_not_the_token(tmp_path, llm, capsys):
    llm.script(reply(ANSWER, pieces=6, chunk_delay=0.08), reply("And a second answer."))
    # A self-hosted telegram-bot-api older than Bot API 9.3: 404 "Not Found: method not found".
    async with (
        FakeBotAPI(missing_methods=("sendMessageDraft",)) as api,
        running(tmp_path, llm, api, **FAST) as tg,
    ):
        api.private_text("plan my day")
        await api.wait_for_async(lambda: _shown(api, ALICE) == _rendered(tg, ANSWER), 15)
        polls = len(api.calls("getUpdates"))
        api.private_text("and then?")
        await api.wait_for_async(lambda: "And a second answer." in _shown(api, ALICE), 10)
        # The token is fine: still connected, still polling, nothing failed.
        assert tg.channel.state == "connected" and tg.channel.fatal is None
        assert len(api.calls("getUpdates")) > polls
        # Asked once; from then on the answer is shown as an edited message, one message.
        assert len(api.calls("sendMessageDraft")) == 1
        assert len(api.sent(ALICE)) == 2 and api.calls("editMessageText")
        assert set(tg.channel.features_off) == {"drafts"}
        # memobot status, from the gateway's status file, says so.
        status = {"pid": os.getpid(), "channels": {"telegram": tg.channel.status()}}
        write_status(tmp_path / "state" / STATUS_FILE, status)
        cfg = tg.stack.loop.cfg
        capsys.readouterr()
        cmd_status(cfg, tmp_path / "config.json")
        checks = list(check_running_channels(cfg))
    [line] = [line for line in capsys.readouterr().out.splitlines() if "telegram:" in line]
    assert "telegram: connected" in line and "drafts off" in line and "sendMessageDraft" in line
    [check] = checks  # memobot doctor too: a warning, not a failed channel
    assert check.status == "warn" and "drafts off" in check.text


async def test_a_404_worded_otherwise_is_not_the_token_either(tmp_path, llm, api):
    """python-telegram-bot raises InvalidToken for any 404 with the answer's description as
    its message; one not worded "Not Found..." (a proxy's, another server's) is no more the
    token than Telegram's own: the channel lives, drafts go off."""
    llm.script(reply(ANSWER, pieces=4, chunk_delay=0.05))
    api.fail("sendMessageDraft", 404, "method not found", times=1000)
    async with running(tmp_path, llm, api, **FAST) as tg:
        api.private_text("plan my day")
        await api.wait_for_async(lambda: _shown(api, ALICE) == _rendered(tg, ANSWER), 15)
        assert tg.channel.fatal is None and tg.channel.state == "connected"
        assert set(tg.channel.features_off) == {"drafts"}


def test_only_a_401_on_a_send_is_the_token():
    not_found = InvalidToken("Not Found: method not found")
    drafts = send_error(not_found, "sendMessageDraft")
    assert isinstance(drafts, FeatureUnavailable) and drafts.feature == "drafts"
    # On a method every server has, a 404 is the chat or the message: this message fails.
    message = send_error(not_found, "sendMessage")
    assert type(message) is PermanentError and "sendMessage" in str(message)
    assert isinstance(send_error(InvalidToken("Unauthorized"), "sendMessage"), FatalChannelError)
    # A 401 without a description: python-telegram-bot's own words, still the token.
    no_body = InvalidToken("Unauthorized (401). Parsing the server response b'' failed")
    assert isinstance(send_error(no_body, "sendMessage"), FatalChannelError)
    unknown = send_error(BadRequest("Bad Request: method not found"), "sendMessageDraft")
    assert isinstance(unknown, FeatureUnavailable)
    assert isinstance(send_error(NetworkError("Internal Server Error"), "x"), TransientError)


def test_discord_and_slack_read_a_401_and_a_404_as_telegram_does():
    import discord

    from channels.discord_channel.errors import map_send_error
    from channels.slack_channel.errors import map_api_error

    def http(status: int) -> discord.HTTPException:
        response = SimpleNamespace(status=status, reason="scripted", headers={})
        factory = discord.NotFound if status == 404 else discord.HTTPException
        return factory(response, {"message": f"{status}: scripted", "code": 0})

    gone = map_send_error(http(404), "Edit Message")
    assert type(gone) is PermanentError and "Edit Message" in str(gone)
    assert isinstance(map_send_error(http(401), "Create Message"), FatalChannelError)
    # Slack names an unknown method; a refused token is a code of its own (or a 401).
    unknown = map_api_error(200, "unknown_method", method="chat.postMessage")
    assert type(unknown) is PermanentError and "chat.postMessage" in str(unknown)
    stream = map_api_error(200, "unknown_method", method="chat.startStream")
    assert isinstance(stream, FeatureUnavailable) and stream.feature == "native streams"
    assert type(map_api_error(404, None, method="chat.update")) is PermanentError
    assert isinstance(map_api_error(401, None, method="chat.update"), FatalChannelError)
    assert isinstance(map_api_error(200, "token_revoked"), FatalChannelError)


# -- an answer the SDK cannot read -------------------------------------------------------------


async def test_an_edit_answered_with_null_does_not_hold_the_chat(tmp_path, llm, api):
    llm.script(reply(ANSWER, pieces=6, chunk_delay=0.1), reply("The next answer."))
    # telegram-test-api answers editMessageText with "result": null: python-telegram-bot
    # raises AttributeError, which is no network blip.
    api.garble("editMessageText", times=1000, result=None)
    # Pacing runs on the same virtual clock as the retries: limits it never waits for, so
    # the clock's sleeps are the retries' alone.
    unpaced = {
        "rateLimits": {
            k: {"messages": 1000, "perSeconds": 1, "burst": 100} for k in ("chat", "group", "bot")
        }
    }
    async with running(tmp_path, llm, api, **{**FAST, **unpaced}) as tg:
        clock = tg.manager.delivery.clock = VirtualClock()
        api.group_text(f"{BOT} plan my day")
        await api.wait_for_async(lambda: api.sent(GROUP), 10)  # the preview message
        api.group_text(f"{BOT} and next?")
        await api.wait_for_async(lambda: "The next answer." in _shown(api, GROUP), 10)
        # A few tries of the final edit, then the piece went as a new message (the preview
        # that could not be edited is deleted): the answer is whole, once, and the chat moved
        # on well within the minute a retry may hold it.
        assert _shown(api, GROUP) == [*_rendered(tg, ANSWER), "The next answer."]
        assert clock.now() < 60 and len(clock.slept) == 2
        final_edits = [c for c in api.calls("editMessageText") if "parse_mode" in c.params]
        assert len(final_edits) == 3


async def test_a_message_the_platform_took_but_answered_oddly_is_not_sent_again(tmp_path, llm, api):
    llm.script(reply("The answer."))
    # The server sends the message, then answers with a result python-telegram-bot cannot
    # read (AttributeError): a 200 says the message is in the chat.
    api.garble("sendMessage", delivered=True, when=lambda p: "The answer." in str(p.get("text")))
    async with running(tmp_path, llm, api, streaming=False, **FAST) as tg:
        tg.manager.delivery.clock = VirtualClock()
        api.private_text("hi")
        await api.wait_for_async(lambda: "The answer." in _shown(api, ALICE), 10)
        await asyncio.sleep(0.3)  # a second copy would be here by now
        assert _shown(api, ALICE) == ["The answer."]


async def test_network_trouble_holds_a_chat_a_minute_then_its_next_answer_goes(tmp_path, llm, api):
    llm.script(reply("The first answer."), reply("The second answer."))
    second_shown = lambda: "The second answer." in _shown(api, ALICE)  # noqa: E731
    # The first answer's sends fail (502) until the second answer has been delivered.
    api.fail(
        "sendMessage",
        502,
        times=1000,
        when=lambda p: "first" in str(p.get("text")) and not second_shown(),
    )
    async with running(tmp_path, llm, api, streaming=False, **FAST) as tg:
        clock = tg.manager.delivery.clock = VirtualClock()
        api.private_text("one")
        await api.wait_for_async(lambda: len(api.calls("sendMessage")) >= 3, 10)
        api.private_text("two")
        await api.wait_for_async(lambda: "The first answer." in _shown(api, ALICE), 10)
        # Backing off held the chat for at most a minute (virtual), then the second answer
        # went first; the first one, kept in the ledger, came again behind it.
        assert _shown(api, ALICE) == ["The second answer.", "The first answer."]
        first_hold = clock.slept[: clock.slept.index(30.0)]
        assert sum(first_hold) <= 60 and len(first_hold) >= 5
        # Out of the ledger once its send returned (a moment after the fake showed it).
        key = f"telegram:{ALICE}"
        await api.wait_for_async(lambda: not tg.stack.store.get(key).metadata.get("outbox"), 10)


async def test_an_answer_outside_the_ledger_sent_again_goes_on_from_its_piece(tmp_path, llm, api):
    """A command's answer is not in the delivery ledger (``Turns.publish``); held a minute at
    its second piece, it comes again later from that piece: the first is not sent twice."""
    llm.script(reply("Hello."))
    words = " ".join(f"word{i}" for i in range(1500))
    async with running(tmp_path, llm, api, streaming=False, **FAST) as tg:
        api.private_text("hi")
        await api.wait_for_async(lambda: _shown(api, ALICE) == ["Hello."], 10)
        clock = tg.manager.delivery.clock = VirtualClock()
        pieces = _rendered(tg, words)
        assert len(pieces) >= 3
        second = pieces[1].split()[0] + " "
        # The second piece fails (502) for longer than a hold.
        api.fail(
            "sendMessage",
            502,
            times=1000,
            when=lambda p: str(p.get("text")).startswith(second) and clock.now() < 70,
        )
        answer = OutboundMessage("telegram", str(ALICE), words, reply_to=f"{ALICE}:9", final=True)
        await tg.stack.bus.publish_outbound(answer)
        await api.wait_for_async(lambda: len(_shown(api, ALICE)) >= 1 + len(pieces), 10)
        await asyncio.sleep(0.2)  # a stray copy would be here by now
        assert 30.0 in clock.slept  # it was sent again, after the pause
        assert _shown(api, ALICE) == ["Hello.", *pieces]


async def test_an_approval_question_held_a_minute_is_asked_again_later(tmp_path, llm, api):
    """The question a turn waits on is no answer (not final, not in the ledger), and yet
    nobody can answer it unseen: held a minute, it comes again later, as answers do."""
    llm.script(tool_step(call("exec", {"command": "echo ran >> ran.txt"})), reply("It ran."))
    async with _approving(tmp_path, llm, api) as tg:
        clock = tg.manager.delivery.clock = VirtualClock()
        # The question (the message with buttons) fails (502) for longer than a hold.
        api.fail(
            "sendMessage",
            502,
            times=1000,
            when=lambda p: "reply_markup" in p and clock.now() < 70,
        )
        api.private_text("please run it")
        await api.wait_for_async(lambda: any(api.markup(c) for c in api.sent(ALICE)), 10)
        [question] = [c for c in api.sent(ALICE) if api.markup(c)]
        assert 30.0 in clock.slept
        api.press(question, _button(question, "once"))
        await api.wait_for_async(lambda: "It ran." in _shown(api, ALICE), 10)


async def test_a_button_press_answered_oddly_does_not_end_intake(tmp_path, llm, api):
    """answerCallbackQuery only stops the button's spinner; an answer the SDK cannot read
    ({"ok": true} without a result: KeyError) must not end the poll loop."""
    llm.script(
        tool_step(call("exec", {"command": "echo ran >> ran.txt"})),
        reply("It ran."),
        reply("Still here."),
    )
    async with _approving(tmp_path, llm, api) as tg:
        api.private_text("please run it")
        await api.wait_for_async(lambda: any(api.markup(c) for c in api.sent(ALICE)), 10)
        [question] = [c for c in api.sent(ALICE) if api.markup(c)]
        api.garble("answerCallbackQuery", result=NO_RESULT)
        api.press(question, _button(question, "once"))
        await api.wait_for_async(lambda: "It ran." in _shown(api, ALICE), 10)
        api.private_text("still there?")
        await api.wait_for_async(lambda: "Still here." in _shown(api, ALICE), 10)
        assert tg.channel.state == "connected"


# -- a preview method that keeps failing -------------------------------------------------------


async def test_a_draft_failing_every_time_is_switched_off_for_the_chat(tmp_path, llm, api, caplog):
    caplog.set_level(logging.INFO, logger="channels.manager")
    second = "Second: " + ANSWER
    llm.script(reply(ANSWER, pieces=8, chunk_delay=0.08), reply(second, pieces=4, chunk_delay=0.08))
    api.fail("sendMessageDraft", 500, times=1000)
    async with running(tmp_path, llm, api, **FAST) as tg:
        api.private_text("plan my day")
        await api.wait_for_async(lambda: _shown(api, ALICE) == _rendered(tg, ANSWER), 15)
        drafts = len(api.calls("sendMessageDraft"))
        api.private_text("again")
        await api.wait_for_async(lambda: len(api.sent(ALICE)) == 2, 15)
        assert _shown(api, ALICE) == [*_rendered(tg, ANSWER), *_rendered(tg, second)]
    # A few calls, then drafts are off in that chat (the next answer tries none), and one
    # warning says so.
    assert drafts <= 3 and len(api.calls("sendMessageDraft")) == drafts
    warned = [
        r.getMessage()
        for r in caplog.records
        if r.name == "channels.manager" and r.levelno >= logging.WARNING
    ]
    assert len(warned) == 1 and "previews off" in warned[0], warned


# -- the policy itself, on plain numbers -------------------------------------------------------


def test_a_transient_error_holds_at_most_the_hold_and_retry_after_is_the_platforms():
    retries = Retries(RetryPolicy(hold_seconds=60), now=0.0)
    now, waits = 0.0, []
    with pytest.raises(TimeoutError):
        while True:
            waits.append(retries.wait_after(TransientError("502"), now))
            now += waits[-1]
    assert sum(waits) <= 60 and waits[:3] == [1.0, 1.5, 2.25]
    # The platform's own wait is honoured even past the hold, and not counted against it.
    retries = Retries(RetryPolicy(hold_seconds=60), now=0.0)
    assert retries.wait_after(RetryAfter(120), 0.0) == pytest.approx(120.1)
    assert retries.wait_after(TransientError("502"), 120.1) == 1.0


def test_an_unknown_exception_is_tried_three_times_then_given_up():
    retries = Retries(RetryPolicy(), now=0.0)
    bug = AttributeError("'NoneType' object has no attribute 'copy'")
    assert retries.wait_after(bug, 0.0) == 1.0
    assert retries.wait_after(bug, 1.0) == 1.5
    with pytest.raises(UnexpectedError) as raised:
        retries.wait_after(bug, 2.5)
    assert raised.value.__cause__ is bug and "AttributeError" in str(raised.value)
    assert isinstance(raised.value, PermanentError)  # ends the piece as a refusal does


def test_the_breaker_opens_after_three_failures_and_tries_again_after_the_cool_down():
    breaker = Breaker(threshold=3, cool_down=300)
    chat = ("telegram", "1001")
    assert [breaker.failed(chat, t) for t in (0, 1, 2)] == [False, False, True]
    assert not breaker.allows(chat, 3) and not breaker.allows(chat, 301)
    assert breaker.allows(chat, 302) and breaker.allows(("telegram", "1002"), 3)
    assert breaker.failed(chat, 302)  # the trial failed: open again, said again
    assert not breaker.allows(chat, 303)
    breaker.succeeded(chat)
    assert breaker.allows(chat, 303)
    breaker.failed(chat, 304)
    assert breaker.allows(chat, 305)  # one failure after a success is not a trip


async def test_a_call_a_channel_does_not_offer_refuses_the_piece_and_names_it() -> None:
    """A channel that declares more than it implements (``sends_files``, a preview mode)
    refuses that piece with a PermanentError naming the call: the chat's queue moves on."""
    from bot.bus import MessageBus, OutboundMessage
    from channels.base import Channel
    from channels.errors import PermanentError

    class Bare(Channel):
        name = "bare"

        async def send_chunk(self, msg, chunk, plain=False, *, first=False):  # type: ignore[no-untyped-def]
            return None

    bare = Bare(MessageBus())
    msg = OutboundMessage("bare", "c1", "hi")
    with pytest.raises(PermanentError, match="bare does not offer send_file"):
        await bare.send_file(msg, "/nowhere")
    with pytest.raises(PermanentError, match="does not offer edit_chunk"):
        await bare.edit_chunk("c1", "m1", "x")
