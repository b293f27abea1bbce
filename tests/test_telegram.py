"""Telegram end to end: the real python-telegram-bot against the local fake Bot API, the real
agent loop against the fake LLM, real files on disk (DESIGN.md §9)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from bot.config import ConfigError, parse_config
from bot.gateway import read_status
from bot.session import SessionStore
from channels.formatting import TELEGRAM_LIMIT, telegram_length
from channels.telegram_channel import channel as telegram_channel
from tests.fakes.llm_server import FakeLLM, reply
from tests.fakes.socks_proxy import FakeSocks5
from tests.fakes.telegram_api import BOT_USERNAME, FakeBotAPI, mention_entities, strip_html
from tests.helpers import (
    VirtualClock,
    closed_port,
    config_dict,
    listed_commands,
    readme_commands,
    run_memobot,
    start_gateway,
    stop_gateway,
    wait_for,
    write_config,
)
from tests.helpers.telegram import ALICE, BOT, GROUP, MALLORY, running

# -- private chats and allowFrom --------------------------------------------------------------


async def test_allowed_private_message_is_answered_in_html(tmp_path, llm, api):
    async with running(tmp_path, llm, api) as tg:
        api.private_text("hello there")
        [sent] = await api.wait_sent_async(1)
        assert sent.params["chat_id"] == ALICE
        assert sent.params["parse_mode"] == "HTML"
        assert "echo: hello there" in sent.params["text"]
        assert "reply_parameters" not in sent.params  # private chats get no quote
        assert tg.channel.state == "connected"
        assert tg.channel.last_event_at is not None


async def test_offset_confirms_only_after_intake_and_survives_restart(tmp_path, llm, api):
    async with running(tmp_path, llm, api) as tg:
        first = api.private_text("one")
        last = api.private_text("two")
        await api.wait_sent_async(2)
        await tg.handled(last)
        offsets = [c.params.get("offset") for c in api.calls("getUpdates")]
        assert offsets[0] is None  # nothing saved yet: take whatever Telegram still holds
        assert offsets[-1] == last + 1
        assert first < last
        assert api.pending_updates == []
    # Saved at most once a second while running, and at stop: the next start goes on from it.
    state = tmp_path / "state" / "channels" / "telegram.json"
    assert json.loads(state.read_text()) == {"offset": last + 1}
    polls_before = len(api.calls("getUpdates"))
    async with running(tmp_path, llm, api) as tg:
        await api.wait_for_async(lambda: len(api.calls("getUpdates")) > polls_before)
        assert api.calls("getUpdates")[polls_before].params["offset"] == last + 1


async def test_typing_shows_only_while_an_answer_takes_time(tmp_path, llm, api):
    # Telegram asks bots to show a chat action only when an answer takes noticeable time.
    async with running(tmp_path, llm, api, typingDelaySeconds=0.8) as tg:
        api.private_text("quick")
        await api.wait_sent_async(1)
        assert api.calls("sendChatAction") == [], "a quick answer needs no typing call"
        llm.script(reply("slow", delay=5.5))
        api.private_text("slow one")
        [_, slow] = await api.wait_sent_async(2)
        typing = api.calls("sendChatAction")
        assert [c.params["action"] for c in typing] == ["typing", "typing"]  # refreshed at 4 s
        assert typing[0].params["chat_id"] == ALICE
        assert 3.5 <= typing[1].at - typing[0].at < 4.5
        assert slow.at - typing[0].at > 4.0  # shown long before the answer came
        await tg.handled(api.private_text("after"))
        await api.wait_sent_async(3)
    assert len(api.calls("sendChatAction")) == 2, "the indicator stopped with the answer"


async def test_no_typing_call_once_the_answer_is_on_its_way(tmp_path, llm, api):
    # The delay running out while the answer is being sent must not put "typing..." under
    # it: the indicator stops when the answer leaves the queue, not after its last piece.
    api.reply_delay = 0.5  # a slow sendMessage round trip
    async with running(tmp_path, llm, api, typingDelaySeconds=1.0, streaming=False):
        llm.script(reply("about one second", delay=0.8))
        api.private_text("hi")
        [answer] = await api.wait_sent_async(1)
        await asyncio.sleep(1.0)
        late = [c for c in api.calls("sendChatAction") if c.at > answer.at]
        assert late == [], "typing shown after the answer went out"


async def test_the_offset_is_written_off_the_event_loop(tmp_path, llm, api, monkeypatch):
    # Renaming the offset file over the old one can stall for tens of milliseconds (ext4 pushes
    # the new data out first): done on the event loop, that stalls every chat.
    from channels.state import ChannelState

    writers: list[bool] = []
    save = ChannelState.save

    def recording_save(self: ChannelState, data: dict[str, Any], durable: bool = True) -> None:
        try:
            asyncio.get_running_loop()
            writers.append(True)
        except RuntimeError:
            writers.append(False)
        save(self, data, durable)

    monkeypatch.setattr(ChannelState, "save", recording_save)
    monkeypatch.setattr(telegram_channel, "OFFSET_SAVE_SECONDS", 0.0)
    async with running(tmp_path, llm, api) as tg:
        for text in ("one", "two", "three"):
            update = api.private_text(text)
            await tg.handled(update)
        await api.wait_for_async(lambda: len(writers) >= 2)
        state = tmp_path / "state" / "channels" / "telegram.json"
        await api.wait_for_async(lambda: json.loads(state.read_text()) == {"offset": update + 1})
    assert writers and not any(writers), "the offset file was written on the event loop"


async def test_denied_sender_is_never_answered_and_logged_once(tmp_path, llm, api, caplog):
    caplog.set_level(logging.WARNING)
    async with running(tmp_path, llm, api) as tg:
        api.private_text("let me in", user_id=MALLORY, username="mallory")
        second = api.private_text("please", user_id=MALLORY, username="mallory")
        await tg.handled(second)
        assert api.sent() == []
        assert llm.requests == []
    denials = [r for r in caplog.records if "not in allowFrom" in r.getMessage()]
    assert len(denials) == 1
    assert str(MALLORY) in denials[0].getMessage()
    assert "@mallory" in denials[0].getMessage()


async def test_star_allows_everyone_with_a_warning(tmp_path, llm, api, caplog):
    caplog.set_level(logging.WARNING)
    async with running(tmp_path, llm, api, allowFrom=["*"]):
        api.private_text("hi from a stranger", user_id=MALLORY)
        [sent] = await api.wait_sent_async(1)
        assert sent.params["chat_id"] == MALLORY
    assert any('allowFrom contains "*"' in r.getMessage() for r in caplog.records)


def test_username_in_allow_from_is_refused_at_config_load(tmp_path):
    data = config_dict(tmp_path, "http://127.0.0.1:1/v1")
    data["channels"] = {"telegram": {"token": "x", "allowFrom": ["@alice"]}}
    with pytest.raises(ConfigError) as err:
        parse_config(data)
    text = str(err.value)
    assert "channels.telegram.allowFrom" in text and "@alice" in text
    assert "numeric user id" in text and "/whoami" in text


async def test_help_lists_the_commands_the_readme_lists(tmp_path, llm, api):
    async with running(tmp_path, llm, api):
        api.private_text("/help")
        [sent] = await api.wait_sent_async(1)
    assert listed_commands(strip_html(sent.params["text"])) == readme_commands("telegram")
    assert llm.requests == []


async def test_whoami_answers_a_denied_sender_in_private(tmp_path, llm, api):
    async with running(tmp_path, llm, api):
        api.private_text("/whoami", user_id=MALLORY)
        [sent] = await api.wait_sent_async(1)
        assert sent.params["chat_id"] == MALLORY
        assert f"Your telegram user id is {MALLORY}" in sent.params["text"]
        assert "not allowed" in sent.params["text"]
        assert llm.requests == []


async def test_rejected_token_fails_the_channel_without_crashing(tmp_path, llm, api, caplog):
    caplog.set_level(logging.ERROR)
    async with running(tmp_path, llm, api, token="999:WRONG") as tg:
        await api.wait_for_async(lambda: tg.channel.state == "failed")
        assert "token" in tg.channel.state_detail
        assert tg.stack.loop is not None  # the rest of memobot keeps running
    assert not any("999:WRONG" in r.getMessage() for r in caplog.records)


# -- groups -----------------------------------------------------------------------------------


async def test_group_gating(tmp_path, llm, api):
    answered = {
        "mention": api.group_text(f"{BOT} what is 2+2"),
        "reply": api.group_text("and 3+3?", reply_to_bot=True),
        "command": api.group_text(f"/status{BOT}"),
    }
    ignored = [
        api.group_text("just chatting"),
        api.group_text(
            "@other_bot do it", entities=mention_entities("@other_bot do it", "other_bot")
        ),
        api.group_text(
            f"{BOT}x lookalike", entities=mention_entities(f"{BOT}x lookalike", BOT_USERNAME + "x")
        ),
        api.group_text("@everyone look here"),
        api.group_text("/status@otherbot"),
        api.group_text(f"{BOT} I am a bot", user_id=777, is_bot=True),
        api.group_text(f"{BOT} not allowed", user_id=MALLORY),
    ]
    async with running(tmp_path, llm, api) as tg:
        await tg.handled(max([*answered.values(), *ignored]))
        sent = await api.wait_sent_async(3)
        await asyncio.sleep(0.3)  # anything wrongly let in would be answered by now
        assert len(api.sent()) == 3
        # The model sees the question without the bot's own @name.
        assert sorted(tg.user_texts()) == ["and 3+3?", "what is 2+2"]
        texts = [c.params["text"] for c in sent]
        assert any("echo: what is 2+2" in t for t in texts)
        assert any("model" in t.lower() for t in texts)  # the /status answer
        # In groups the answer quotes the message it answers.
        assert all("reply_parameters" in c.params for c in sent)


async def test_group_policy_open_answers_without_mention(tmp_path, llm, api):
    async with running(tmp_path, llm, api, groupPolicy="open") as tg:
        api.group_text("anyone here?")
        other = api.group_text("/status@otherbot")
        await tg.handled(other)
        [sent] = await api.wait_sent_async(1)
        assert "echo: anyone here?" in sent.params["text"]
        await asyncio.sleep(0.2)
        assert len(api.sent()) == 1


async def test_forum_topics_are_separate_sessions_answered_in_their_thread(tmp_path, llm, api):
    async with running(tmp_path, llm, api) as tg:
        api.group_text(f"{BOT} in topic seven", thread_id=7)
        api.group_text(f"{BOT} in topic eight", thread_id=8)
        sent = await api.wait_sent_async(2)
        threads = {c.params["message_thread_id"]: c.params["text"] for c in sent}
        assert "topic seven" in threads[7] and "topic eight" in threads[8]
        keys = set(tg.stack.loop.store.keys())
        assert {f"telegram:{GROUP}:7", f"telegram:{GROUP}:8"} <= keys
        # A topic's root message is not a reply to the bot, however the topic was created.
        assert tg.user_texts() == ["in topic seven", "in topic eight"]


# -- sending ----------------------------------------------------------------------------------


async def test_long_answer_is_split_within_the_limit_and_code_survives(tmp_path, llm, api):
    code = "\n".join(f"line_{i:04d} = {i} * 2  # some code" for i in range(250))
    answer = "Here is the script:\n\n```python\n" + code + "\n```\n\nDone."
    llm.script(reply(answer))
    async with running(tmp_path, llm, api):
        api.private_text("write a long script")
        await api.wait_for_async(lambda: any("Done." in c.params["text"] for c in api.sent()))
        sent = api.sent()
        assert len(sent) >= 2
        assert all(telegram_length(c.params["text"]) <= TELEGRAM_LIMIT for c in sent)
        assert all(c.params["parse_mode"] == "HTML" for c in sent)  # every chunk parsed
        # The code block spans the split: each chunk opens and closes its own <pre>.
        code_chunks = [c.params["text"] for c in sent if "line_" in c.params["text"]]
        assert len(code_chunks) >= 2
        assert all(t.count("<pre") == t.count("</pre>") == 1 for t in code_chunks)
        joined = "".join(code_chunks)
        assert all(f"line_{i:04d}" in joined for i in range(250))


async def test_rejected_markup_is_resent_as_plain_text(tmp_path, llm, api):
    llm.script(reply("**bold** and `code`"))
    api.fail(
        "sendMessage",
        400,
        "Bad Request: can't parse entities: Unsupported start tag",
        when=lambda p: p.get("parse_mode") == "HTML",
    )
    async with running(tmp_path, llm, api):
        api.private_text("format something")
        [sent] = await api.wait_sent_async(1)
        failed = [c for c in api.calls("sendMessage") if c.status == 400]
        assert len(failed) == 1 and "<b>bold</b>" in failed[0].params["text"]
        assert "parse_mode" not in sent.params
        assert sent.params["text"] == "bold and code"


async def test_flood_wait_is_honoured_then_delivered(tmp_path, llm, api):
    api.fail("sendMessage", 429, retry_after=1)
    async with running(tmp_path, llm, api):
        api.private_text("hurry")
        [sent] = await api.wait_sent_async(1, timeout=15)
        calls = api.calls("sendMessage")
        assert [c.status for c in calls] == [429, 200]
        assert calls[1].at - calls[0].at >= 1.0
        assert "echo: hurry" in sent.params["text"]


def _visible(calls: list[Any]) -> list[str]:
    return [strip_html(c.params["text"]) for c in calls]


async def test_emoji_answer_is_split_in_utf16_units(tmp_path, llm, api):
    # 6,000 emoji: 6,120 characters but 12,120 UTF-16 units, the unit Telegram counts.
    llm.script(reply(("\U0001f600" * 50 + "\n") * 120))
    async with running(tmp_path, llm, api):
        api.private_text("emoji please")
        await api.wait_for_async(lambda: "".join(_visible(api.sent())).count("\U0001f600") == 6000)
        sent = api.sent()
        assert all(telegram_length(c.params["text"]) <= TELEGRAM_LIMIT for c in sent)
        assert len(sent) == 3  # ceil(12,120 / 4,096)
        assert all(c.status == 200 for c in api.calls("sendMessage"))


async def test_escaped_markup_characters_cost_no_extra_pieces(tmp_path, llm, api):
    llm.script(reply("&<>" * 3000))  # 9,000 visible characters, 45,000 of HTML
    async with running(tmp_path, llm, api):
        api.private_text("symbols")
        await api.wait_for_async(lambda: sum(map(len, _visible(api.sent()))) >= 9000)
        assert "".join(_visible(api.sent())) == "&<>" * 3000
        assert len(api.sent()) == 3  # ceil(9,000 / 4,096), as the visible length allows


def _four_pieces() -> str:
    return "\n\n".join(f"PIECE{i} " + "word " * 780 for i in range(1, 5))


def _piece_numbers(calls: list[Any]) -> list[int]:
    return [int(c.params["text"].split()[0].removeprefix("PIECE")) for c in calls]


async def test_a_piece_taken_but_answered_oddly_is_not_repeated_and_the_rest_follow(
    tmp_path, llm, api
):
    llm.script(reply(_four_pieces()))
    # {"ok": true} with a result PTB cannot read: Telegram took piece 2 (channels.errors'
    # AcceptedUnreadable); the answer goes on at piece 3.
    api.garble(
        "sendMessage", when=lambda p: str(p.get("text", "")).startswith("PIECE2"), delivered=True
    )
    async with running(tmp_path, llm, api) as tg:
        tg.manager.delivery.clock = VirtualClock()  # the retry's backoff, without the wait
        api.private_text("four pieces")
        await api.wait_sent_async(3)  # the garbled piece is not among the readable answers
        await asyncio.sleep(0.2)  # a repeated piece would be here by now
        shown = [m["text"].split()[0] for m in api.shown(ALICE)]
        assert shown == ["PIECE1", "PIECE2", "PIECE3", "PIECE4"]
        [garbled] = [c for c in api.calls("sendMessage") if c.garbled]
        assert garbled.params["text"].startswith("PIECE2")
        meta = tg.stack.store.get(f"telegram:{ALICE}").metadata
        assert not meta.get("outbox")  # delivered: the ledger is empty


async def test_a_200_that_is_not_telegrams_answer_is_not_counted_as_sent(tmp_path, llm, api):
    # A proxy or gateway in front of the Bot API (a baseUrl to a relay) answers 200 with JSON
    # of its own, not {"ok": true, ...}: Telegram never took the message. It is sent again,
    # not counted as sent and lost.
    llm.script(reply("The answer."))
    api.garble("sendMessage", body={"error": "upstream unavailable"})
    async with running(tmp_path, llm, api) as tg:
        tg.manager.delivery.clock = VirtualClock()  # the retry's backoff, without the wait
        api.private_text("hello")
        await api.wait_sent_async(1)
        assert [m["text"] for m in api.shown(ALICE)] == ["The answer."]
        assert [c.garbled for c in api.calls("sendMessage")] == [True, False]


async def test_a_200_page_that_is_not_json_is_sent_again_not_given_up(tmp_path, llm, api):
    # A captive portal or a proxy answers 200 with an HTML page: python-telegram-bot raises
    # its bare TelegramError("Invalid server response"), which has no code to read. Telegram
    # never answers so, and never took the message: it is sent again, not dropped.
    llm.script(reply("The answer."))
    api.garble("sendMessage", body="<html><body>Sign in to the Wi-Fi</body></html>")
    async with running(tmp_path, llm, api) as tg:
        tg.manager.delivery.clock = VirtualClock()  # the retry's backoff, without the wait
        api.private_text("hello")
        await api.wait_sent_async(1)
        assert [m["text"] for m in api.shown(ALICE)] == ["The answer."]


async def test_piece_refused_as_too_long_is_split_smaller(tmp_path, llm, api):
    llm.script(reply(_four_pieces()))
    api.fail(
        "sendMessage",
        400,
        "Bad Request: message is too long",
        when=lambda p: str(p.get("text", "")).startswith("PIECE3"),
    )
    async with running(tmp_path, llm, api):
        api.private_text("four pieces")
        await api.wait_for_async(lambda: "PIECE4" in " ".join(_visible(api.sent())), 15)
        await api.wait_for_async(lambda: _visible(api.sent())[-1].endswith("word"), 15)
        await asyncio.sleep(0.3)  # a repeated piece would be here by now
        words = " ".join(_visible(api.sent())).split()
        assert words == _four_pieces().split()  # nothing dropped, nothing repeated
        assert _piece_numbers(api.sent()[:2]) == [1, 2] and len(api.sent()) >= 5


async def test_undeliverable_answer_gives_a_notice_and_stays_in_the_ledger(tmp_path, llm, api):
    llm.script(reply("the secret answer"))
    api.fail(
        "sendMessage",
        400,
        "Bad Request: the chat does not take this",
        when=lambda p: "secret" in str(p.get("text", "")),
        times=5,
    )
    async with running(tmp_path, llm, api) as tg:
        api.private_text("tell me")
        [notice] = await api.wait_sent_async(1)
        assert notice.params["text"] == (
            "I could not deliver my answer: The chat does not take this"
        )
        [entry] = tg.stack.store.get(f"telegram:{ALICE}").metadata["outbox"]
        assert entry["state"] == "failed" and entry["text"] == "the secret answer"
    config = write_config(
        tmp_path,
        llm.base_url,
        channels={"telegram": {"enabled": True, "token": api.token, "allowFrom": [str(ALICE)]}},
    )
    out = run_memobot("status", config=config).stdout
    assert f"1 could not be delivered (telegram:{ALICE} {entry['id']}: The chat does" in out


async def test_photo_is_downloaded_into_the_workspace_and_passed_as_image(tmp_path, llm, api):
    jpeg = b"\xff\xd8\xff\xe0" + os.urandom(2000)
    async with running(tmp_path, llm, api) as tg:
        api.photo(jpeg, caption="what is in this picture?")
        await api.wait_sent_async(1)
        saved = list((tmp_path / "ws" / "media" / "telegram" / str(ALICE)).glob("*.jpg"))
        assert len(saved) == 1 and saved[0].read_bytes() == jpeg
        content = llm.requests[0]["body"]["messages"][-1]["content"]
        assert content[0]["text"].startswith("what is in this picture?")
        assert content[1]["image_url"]["url"].startswith("data:image/jpeg;base64,")
        assert tg.user_texts() == ["what is in this picture?"]


async def test_a_planted_media_folder_link_is_never_written_through(tmp_path, llm, api):
    """The model can make media/telegram/<chat> a link to ~/.ssh: the download must not land
    there, and a planted "already downloaded" link must not be inlined as the photo."""
    outside = tmp_path / "outside"
    outside.mkdir()
    media = tmp_path / "ws" / "media" / "telegram"
    media.mkdir(parents=True)
    (media / str(ALICE)).symlink_to(outside)
    jpeg = b"\xff\xd8\xff\xe0" + os.urandom(2000)
    async with running(tmp_path, llm, api):
        api.photo(jpeg, caption="look")
        await api.wait_sent_async(1)
    assert list(outside.iterdir()) == []
    content = llm.requests[0]["body"]["messages"][-1]["content"]
    assert "data:image" not in json.dumps(content)  # not saved, so nothing inlined


async def test_documents_and_voice_are_saved_and_oversized_files_noted(tmp_path, llm, api):
    doc = api.add_file(b"%PDF-1.4 report", ".pdf")
    voice = api.add_file(b"OggS voice", ".oga")
    huge = {**api.add_file(b"tiny stand-in", ".zip"), "file_size": 25 * 1024 * 1024}
    sender, chat = api.user(ALICE), api.private_chat(ALICE)
    document = {**doc, "file_name": "report.pdf", "mime_type": "application/pdf"}
    api.inject(api.message(None, chat=chat, sender=sender, document=document, caption="summarise"))
    api.inject(api.message(None, chat=chat, sender=sender, voice={**voice, "duration": 2}))
    api.inject(api.message(None, chat=chat, sender=sender, document={**huge, "file_name": "b.zip"}))
    async with running(tmp_path, llm, api) as tg:
        await api.wait_sent_async(3)
        folder = tmp_path / "ws" / "media" / "telegram" / str(ALICE)
        assert sorted(p.suffix for p in folder.iterdir()) == [".oga", ".pdf"]
        texts = tg.user_texts()
        assert texts[0].startswith("summarise") and "report.pdf" not in texts[0]
        assert "[attached files: " in llm.requests[0]["body"]["messages"][-1]["content"]
        assert "voice message" in texts[1] and "attached" in texts[1]
        assert "25.0 MB" in texts[2] and "not downloaded" in texts[2]
        assert len(api.calls("download")) == 2  # the oversized file was never fetched


async def test_refused_intake_leaves_the_update_unconfirmed(tmp_path, llm, api):
    async with running(tmp_path, llm, api) as tg:
        await api.wait_for_async(lambda: tg.channel.state == "connected")
        tg.stack.bus.accepting = False  # what intake answers while memobot shuts down
        update_id = api.private_text("during shutdown")
        await api.wait_for_async(lambda: tg.channel.state == "reconnecting")
        assert tg.channel.offset is None or tg.channel.offset <= update_id
        assert update_id in api.pending_updates  # Telegram still holds it
        tg.stack.bus.accepting = True
        [sent] = await api.wait_sent_async(1, timeout=10)
        assert "echo: during shutdown" in sent.params["text"]
        await tg.handled(update_id)


# -- polling resilience -----------------------------------------------------------------------


async def test_a_batch_from_several_chats_is_taken_in_side_by_side(tmp_path, llm, api):
    """One slow intake (a slow disk, a long session to load) no longer holds up the other
    chats of its batch; its own chat's later messages still wait their turn, and the offset
    is confirmed only past what is stored."""
    bob = 2002
    async with running(tmp_path, llm, api, allowFrom=[str(ALICE), str(bob)]) as tg:
        await api.wait_for_async(lambda: tg.channel.state == "connected", 10)
        bus = tg.channel.bus
        real = bus.publish_inbound
        release = asyncio.Event()
        order: list[str] = []

        async def slow_for_alice(msg: Any) -> Any:
            if msg.chat_id == str(ALICE):
                await release.wait()
            order.append(msg.text)
            return await real(msg)

        bus.publish_inbound = slow_for_alice  # type: ignore[method-assign]
        sender = api.user(bob, "bob")
        first, _, _ = api.inject_many(
            [
                api.message("alice one", chat=api.private_chat(ALICE), sender=api.user()),
                api.message("bob one", chat=api.private_chat(bob), sender=sender),
                api.message("alice two", chat=api.private_chat(ALICE), sender=api.user()),
            ]
        )
        [to_bob] = await api.wait_sent_async(1, bob, timeout=10)
        assert "echo: bob one" in to_bob.params["text"]
        assert (tg.channel.offset or 0) <= first  # alice's first update is not stored yet
        release.set()
        to_alice = await api.wait_sent_async(2, ALICE, timeout=10)
        assert [c.params["text"] for c in to_alice] == ["echo: alice one", "echo: alice two"]
        assert order == ["bob one", "alice one", "alice two"]
        await tg.handled(first + 2)


async def test_a_backlog_is_taken_in_a_few_chats_at_a_time(tmp_path, llm, api, monkeypatch):
    monkeypatch.setattr(telegram_channel, "INTAKE_CHATS_AT_ONCE", 3)
    async with running(tmp_path, llm, api, allowFrom=["*"]) as tg:
        await api.wait_for_async(lambda: tg.channel.state == "connected", 10)
        real = tg.channel.bus.publish_inbound
        in_flight, peak = 0, 0

        async def counted(msg: Any) -> Any:
            nonlocal in_flight, peak
            in_flight += 1
            peak = max(peak, in_flight)
            await asyncio.sleep(0.05)
            in_flight -= 1
            return await real(msg)

        tg.channel.bus.publish_inbound = counted  # type: ignore[method-assign]
        users = [api.user(3000 + n, None) for n in range(10)]
        api.inject_many(
            [api.message("hi", chat=api.private_chat(u["id"]), sender=u) for u in users]
        )
        await api.wait_sent_async(10, timeout=15)
        assert peak == 3  # side by side, and no more than the bound


async def test_conflict_is_logged_and_polling_continues(tmp_path, llm, api, caplog):
    caplog.set_level(logging.WARNING)
    api.fail("getUpdates", 409)
    async with running(tmp_path, llm, api):
        await api.wait_for_async(lambda: any(c.status == 409 for c in api.calls("getUpdates")))
        api.private_text("still there?")
        [sent] = await api.wait_sent_async(1, timeout=15)
        assert "echo: still there?" in sent.params["text"]
    assert any(
        "another bot instance is polling with this token" in r.getMessage() for r in caplog.records
    )


async def test_connected_again_once_the_conflict_is_over(tmp_path, llm, api):
    """After a 409 the next long poll is accepted: the channel is "connected" while that poll
    waits, not "reconnecting (409 Conflict)" until it returns pollTimeoutSeconds later."""
    api.fail("getUpdates", 409)
    async with running(tmp_path, llm, api, pollTimeoutSeconds=30) as tg:
        await api.wait_for_async(lambda: any(c.status == 409 for c in api.calls("getUpdates")))
        await api.wait_for_async(lambda: "409" in tg.channel.state_detail)
        assert tg.channel.state == "reconnecting"
        await api.wait_for_async(lambda: tg.channel.state == "connected", 8)
        assert tg.channel.state_detail == ""


async def test_connected_at_once_and_back_after_network_errors(tmp_path, llm, api, caplog):
    caplog.set_level(logging.INFO)
    async with running(tmp_path, llm, api, pollTimeoutSeconds=30) as tg:
        # getMe, not the first (possibly 30 s) long poll, proves the connection.
        await api.wait_for_async(lambda: tg.channel.state == "connected", 3)
        api.fail("getUpdates", 502, "Bad Gateway")  # the poll after the next batch fails,
        api.fail("getMe", 502, "Bad Gateway")  # and so does the first getMe after it
        api.private_text("before")
        await api.wait_for_async(lambda: tg.channel.state == "reconnecting")
        await api.wait_for_async(lambda: tg.channel.state == "connected", 10)
        api.private_text("after the outage")
        sent = await api.wait_sent_async(2, timeout=10)
        assert "echo: after the outage" in sent[1].params["text"]
    states = [r.getMessage() for r in caplog.records if r.name == telegram_channel.__name__]
    assert sum("reconnecting (getUpdates failed" in m for m in states) == 1
    assert sum("reconnecting (cannot reach Telegram" in m for m in states) == 1
    assert sum(m == "telegram: connected" for m in states) == 2


async def test_stalled_poll_is_restarted(tmp_path, llm, api, monkeypatch, caplog):
    caplog.set_level(logging.WARNING)
    monkeypatch.setattr(telegram_channel, "POLL_MARGIN_SECONDS", 0.5)
    api.fail("getUpdates", 0, delay=30)  # the first poll hangs far past timeout + margin
    async with running(tmp_path, llm, api, pollTimeoutSeconds=1):
        started = time.monotonic()
        api.private_text("are you stuck?")
        await api.wait_sent_async(1, timeout=10)
        assert time.monotonic() - started < 5
    assert any("restarting the poll" in r.getMessage() for r in caplog.records)


async def test_stop_landing_as_a_poll_returns_still_stops_the_channel(
    tmp_path, llm, api, monkeypatch
):
    """CI once hung here: on Python 3.11 ``wait_for`` gives back the poll's result and drops a
    cancel() that lands in the same loop pass as getUpdates returning, so stop() waited for a
    poll loop that went on for ever. The race is made certain: stop() starts as a poll returns."""
    async with running(tmp_path, llm, api, pollTimeoutSeconds=1) as tg:
        bot_class = type(tg.channel.bot)
        real = bot_class.get_updates
        stopping: list[asyncio.Task[None]] = []

        async def poll_then_stop(self: Any, *args: Any, **kwargs: Any) -> Any:
            updates = await real(self, *args, **kwargs)
            if not stopping:
                # Its first step cancels the poll loop before that loop hears of this result.
                stopping.append(asyncio.ensure_future(tg.channel.stop()))
            return updates

        monkeypatch.setattr(bot_class, "get_updates", poll_then_stop)
        await api.wait_for_async(lambda: bool(stopping), 10)
        done, _ = await asyncio.wait(stopping, timeout=5)
        assert done, "stop() is still waiting for the poll loop"
        polls = len(api.calls("getUpdates"))
        await asyncio.sleep(1.5)  # longer than a poll: a loop that survived would poll again
        assert len(api.calls("getUpdates")) == polls
        assert tg.channel.state == "stopped"


# -- the daemon: SIGKILL between fetch and processing -----------------------------------------


def _answers_to(api: Any, text: str) -> int:
    return sum(f"echo: {text}" in c.params["text"] for c in api.sent())


def _status_when_written(config: Path) -> str:
    """``memobot status`` once the gateway's periodic snapshot shows the channel connected
    (the snapshot is read here, so only one ``memobot status`` process is started)."""

    def connected() -> bool:
        live = read_status(config.parent / "state") or {}
        return (live.get("channels") or {}).get("telegram", {}).get("state") == "connected"

    wait_for(connected, within=8)
    return run_memobot("status", config=config).stdout


def test_status_follows_the_channel_at_once_and_a_killed_gateways_is_old(tmp_path):
    """`memobot status` showed "starting" seconds after the log said connected: the status
    file is written when a channel's state changes, not only every few seconds. A file a
    killed gateway left is shown as out of date."""
    with FakeLLM.start_in_thread() as llm, FakeBotAPI.start_in_thread() as api:
        api.fail("getMe", 0, delay=1.5)  # connected 1.5 s after the start
        config = tmp_path / "config.json"
        settings = {"enabled": True, "token": api.token, "baseUrl": api.base_url,
                    "allowFrom": [str(ALICE)], "pollTimeoutSeconds": 30}  # fmt: skip
        config.write_text(
            json.dumps(config_dict(tmp_path, llm.base_url, channels={"telegram": settings}))
        )
        state = tmp_path / "state"
        proc = start_gateway(config)
        try:
            assert wait_for(lambda: read_status(state) is not None, within=20)
            first = time.monotonic()

            def connected() -> bool:
                telegram = ((read_status(state) or {}).get("channels") or {}).get("telegram")
                return (telegram or {}).get("state") == "connected"

            assert wait_for(connected, within=10)
            assert time.monotonic() - first < 3.5  # not the next 5 s tick
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
        finally:
            stop_gateway(proc)
        shown = run_memobot("status", config=config).stdout
    assert f"not running (pid {proc.pid} stopped without cleaning up" in shown
    assert "connected" not in shown


def test_sigkill_between_fetch_and_processing_loses_nothing_and_repeats_nothing(tmp_path):
    with FakeLLM.start_in_thread() as llm, FakeBotAPI.start_in_thread() as api:
        config = tmp_path / "config.json"
        settings = {
            "enabled": True,
            "token": api.token,
            "baseUrl": api.base_url,
            "allowFrom": [str(ALICE)],
            "pollTimeoutSeconds": 5,
        }
        data = config_dict(tmp_path, llm.base_url, channels={"telegram": settings})
        config.write_text(json.dumps(data))

        # 1. Killed the instant the getUpdates answer carrying the message has left the server.
        proc = start_gateway(config)
        try:
            api.after_get_updates = lambda ids: os.kill(proc.pid, signal.SIGKILL)
            api.private_text("first")
            assert proc.wait(20) == -signal.SIGKILL
        finally:
            api.after_get_updates = None
            stop_gateway(proc)
        assert api.sent() == []
        # The kill comes from this process's fake server thread: on a loaded machine the
        # gateway may have stored "first" before it landed. Then "first" comes again as a
        # duplicate (no intake), and the next intake is "second"'s.
        store = SessionStore(tmp_path / "state")
        stored = bool(store.get(f"telegram:{ALICE}").state.pending)

        # 2. Killed right after intake stored the next message (before the offset moved).
        failpoint = "after_intake@1" if stored else "after_intake@2"
        proc = start_gateway(config, {"MEMOBOT_FAILPOINTS": failpoint})
        try:
            api.private_text("second")
            assert proc.wait(30) == -signal.SIGKILL
        finally:
            stop_gateway(proc)

        # 3. A clean restart answers each message exactly once.
        proc = start_gateway(config)
        try:
            api.wait_for(lambda: _answers_to(api, "first") and _answers_to(api, "second"), 30)
            time.sleep(1.0)  # a duplicate would arrive by now
            assert _answers_to(api, "first") == 1
            assert _answers_to(api, "second") == 1
            assert "telegram: connected" in _status_when_written(config)
        finally:
            stop_gateway(proc)
        assert proc.returncode == 0, (tmp_path / "gateway.log").read_text()


def test_sigkill_between_pieces_resumes_without_repeating(tmp_path):
    with FakeLLM.start_in_thread() as llm, FakeBotAPI.start_in_thread() as api:
        llm.script(reply(_four_pieces()))
        config = tmp_path / "config.json"
        settings = {
            "enabled": True,
            "token": api.token,
            "baseUrl": api.base_url,
            "allowFrom": [str(ALICE)],
            "pollTimeoutSeconds": 5,
        }
        data = config_dict(tmp_path, llm.base_url, channels={"telegram": settings})
        config.write_text(json.dumps(data))
        # Killed after pieces 1 and 2 went out, before piece 3 was marked.
        proc = start_gateway(config, {"MEMOBOT_FAILPOINTS": "between_pieces@2"})
        try:
            api.private_text("four pieces")
            assert proc.wait(30) == -signal.SIGKILL
        finally:
            stop_gateway(proc)
        assert _piece_numbers(api.sent()) == [1, 2]
        proc = start_gateway(config)
        try:
            api.wait_for(lambda: len(api.sent()) >= 4, 30)
            time.sleep(0.5)  # a repeated piece would arrive by now
            assert _piece_numbers(api.sent()) == [1, 2, 3, 4]
        finally:
            stop_gateway(proc)
        assert proc.returncode == 0, (tmp_path / "gateway.log").read_text()


def test_wrong_token_makes_the_gateway_exit_78_with_one_line(tmp_path):
    with FakeBotAPI.start_in_thread() as api:
        settings = {"enabled": True, "token": "999:WRONG", "baseUrl": api.base_url}
        config = write_config(tmp_path, "http://127.0.0.1:9", channels={"telegram": settings})
        proc = start_gateway(config)
        try:
            assert proc.wait(30) == 78
        finally:
            stop_gateway(proc)
    log_text = (tmp_path / "gateway.log").read_text()
    lines = [line for line in log_text.splitlines() if "cannot work" in line]
    assert len(lines) == 1 and "channel telegram" in lines[0]
    assert "check channels.telegram.token" in lines[0]
    assert "999:WRONG" not in log_text


# -- pieces -----------------------------------------------------------------------------------


async def test_http_proxy_carries_every_call(tmp_path, llm, api):
    # baseUrl points nowhere; only a proxy that forwards the absolute URL reaches the fake.
    async with running(tmp_path, llm, api, baseUrl="http://127.0.0.1:9/bot", proxy=api.url) as tg:
        await api.wait_for_async(lambda: tg.channel.state == "connected")
        assert api.calls("getMe")


async def test_a_socks_proxy_that_is_down_is_waited_for_not_a_crash(tmp_path, llm, api, caplog):
    """A socks proxy that is down (an ssh tunnel restarting) is a network error like any other:
    the state says so in words (PTB alone said "Unknown error in HTTP implementation"), and
    the channel is back once the proxy is."""
    port = closed_port()
    async with running(tmp_path, llm, api, proxy=f"socks5://127.0.0.1:{port}") as tg:
        await api.wait_for_async(lambda: tg.channel.state == "reconnecting", 10)
        assert "socks proxy" in tg.channel.state_detail
        async with FakeSocks5(port) as socks:
            await api.wait_for_async(lambda: tg.channel.state == "connected", 15)
            api.private_text("through the tunnel")
            [sent] = await api.wait_sent_async(1, timeout=10)
            assert "echo: through the tunnel" in sent.params["text"]
            assert socks.connects
    assert not any("crashed" in r.getMessage() for r in caplog.records)


async def test_socks_proxy_uses_a_socks_connector():
    from aiohttp_socks import ProxyConnector

    connector, http_proxy = telegram_channel._proxy_connector("socks5h://127.0.0.1:1080", 4)
    try:
        assert isinstance(connector, ProxyConnector) and http_proxy is None
        assert connector._rdns is True  # socks5h: the proxy resolves api.telegram.org
    finally:
        await connector.close()


def test_ptb_errors_map_to_our_vocabulary():
    import datetime as dt

    from telegram import error as tg

    from channels import errors
    from channels.telegram_channel.errors import send_error

    def mapped(exc: Exception) -> Exception:
        return send_error(exc, "sendMessage")  # type: ignore[arg-type]

    flood = mapped(tg.RetryAfter(dt.timedelta(seconds=3)))
    assert isinstance(flood, errors.RetryAfter) and flood.seconds == 3
    assert isinstance(mapped(tg.BadRequest("Can't parse entities: x")), errors.FormattingRejected)
    assert type(mapped(tg.BadRequest("Chat not found"))) is errors.PermanentError
    assert isinstance(mapped(tg.Forbidden("bot was blocked")), errors.PermanentError)
    assert "-100777" in str(mapped(tg.ChatMigrated(-100777)))
    assert isinstance(mapped(tg.TimedOut()), errors.TransientError)
    assert isinstance(mapped(tg.NetworkError("reset")), errors.TransientError)
    assert isinstance(mapped(tg.InvalidToken()), errors.FatalChannelError)


def test_commands_and_mentions_are_read_like_telegram_does():
    assert telegram_channel.command_target("/status@Memobot_Test_Bot now") == (
        "status",
        "memobot_test_bot",
    )
    assert telegram_channel.command_target("/new") == ("new", "")
    assert telegram_channel.command_target("/ not a command") is None
    assert telegram_channel.command_target("a/b") is None
    # Offsets count UTF-16 units: an emoji before the mention takes two.
    text = f"🙂 {BOT} hi"
    [entity] = mention_entities(text, BOT_USERNAME)
    assert entity["offset"] == 3
    cut = telegram_channel._utf16_cut(text, [(entity["offset"], entity["length"])])
    assert cut == "🙂  hi"
    assert telegram_channel.split_chat_key("-1001234:7") == (-1001234, 7)
    assert telegram_channel.split_chat_key("42") == (42, None)
    assert telegram_channel.telegram_message_id("-1001234:99") == 99


async def test_an_error_quoting_the_url_never_puts_the_token_in_the_status(tmp_path, llm, api):
    """aiohttp quotes the request URL, /bot<token>/getMe, in some errors (too many redirects
    from a baseUrl behind a misconfigured reverse proxy): the log filter hid it, but the
    channel's state detail went as it was into state/gateway.json and `memobot status`."""

    async def loop(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        target = head.split(b" ", 2)[1]
        writer.write(b"HTTP/1.1 302 Found\r\nLocation: " + target + b"\r\n")
        writer.write(b"Content-Length: 0\r\nConnection: close\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(loop, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with running(tmp_path, llm, api, baseUrl=f"http://127.0.0.1:{port}/bot") as tg:
            await api.wait_for_async(lambda: tg.channel.state == "reconnecting", 10)
            assert "TooManyRedirects" in tg.channel.state_detail
            assert api.token not in json.dumps(tg.channel.status())
    finally:
        server.close()
