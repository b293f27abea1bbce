"""Answers shown while they are written, still exactly once: the real agent loop, channel
manager, delivery ledger and python-telegram-bot against the fake Bot API and a fake model
that streams with pauses between chunks.

Private chats get drafts (stored nowhere) and then the answer as one message; groups get one
message, edited while the answer is written and edited into the answer at the end.
"""

from __future__ import annotations

import asyncio
from typing import Any

from bot.bus import StreamEvent
from bot.delivery import preview_ids_in
from bot.session import SessionState
from bot.session.records import clean_metadata
from bot.streaming import STOPPED_MARK
from channels import preview as preview_module
from tests.fakes.llm_server import reply, tool_step
from tests.fakes.telegram_api import BOT_USERNAME, FakeBotAPI, strip_html, utf16_len
from tests.helpers import STREAMED_ANSWER as ANSWER
from tests.helpers import TELEGRAM_FAST_PREVIEWS as FAST
from tests.helpers.telegram import running

ALICE = 1001
GROUP = -1001234
BOT = f"@{BOT_USERNAME}"


def rendered(tg: Any, text: str) -> list[str]:
    """What the chat shows of ``text`` as memobot renders a final answer, piece by piece."""
    return [strip_html(p) for p in tg.channel.render(text)]


def delivered(tg: Any, chat: int) -> bool:
    """The ledger holds no answer of ``chat`` and no preview of one: all of it is out."""
    meta = tg.stack.store.get(f"telegram:{chat}").metadata
    return not meta.get("previews") and not meta.get("outbox")


async def quiet(api: FakeBotAPI, seconds: float = 0.4) -> None:
    """Let a stray late preview (the bug these tests look for) reach the fake."""
    await asyncio.sleep(seconds)


# -- private chats: drafts -------------------------------------------------------------------


async def test_private_draft_shows_before_the_model_finishes_then_one_message(tmp_path, llm, api):
    llm.script(reply(ANSWER, pieces=8, chunk_delay=0.15))
    async with running(tmp_path, llm, api, **FAST) as tg:
        api.private_text("plan my day")
        [sent] = await api.wait_sent_async(1, ALICE, timeout=15)
        await quiet(api)
        drafts = api.drafts(ALICE)
        assert drafts, "no draft was shown while the answer was written"
        # The first draft came while the model was still writing: it held part of the answer
        # (a check of content, not of timing, which a loaded machine stretches).
        texts = [d.params["text"] for d in drafts]
        assert drafts[0].at < sent.at and 0 < len(texts[0]) < len(ANSWER)
        assert all(ANSWER.startswith(t) for t in texts if t)
        assert len({d.params["draft_id"] for d in drafts}) == 1 and drafts[0].params["draft_id"]
        # Exactly one permanent message: the rendered answer; no edits in a private chat.
        assert [m["text"] for m in api.shown(ALICE)] == rendered(tg, ANSWER)
        assert len(api.sent(ALICE)) == 1 and not api.calls("editMessageText")
        assert tg.llm.requests[0]["body"]["stream"] is True


async def test_private_draft_is_emptied_while_tools_run(tmp_path, llm, api):
    (tmp_path / "workspace").mkdir(exist_ok=True)
    (tmp_path / "workspace" / "notes.txt").write_text("buy milk")
    llm.script(
        tool_step(
            ("read_file", {"path": "notes.txt"}),
            text="Let me look at your notes first.",
            pieces=4,
            chunk_delay=0.1,
        ),
        reply("You wanted to buy milk.", pieces=4, chunk_delay=0.1),
    )
    async with running(tmp_path, llm, api, **FAST):
        api.private_text("what did I note?")
        await api.wait_sent_async(1, ALICE, timeout=15)
        texts = [d.params.get("text", "") for d in api.drafts(ALICE)]
        before = next(i for i, t in enumerate(texts) if t.startswith("Let me look"))
        tools = texts.index("", before)  # emptied ("Thinking...") while read_file ran
        assert any(t.startswith("You wanted") for t in texts[tools:])
        assert [m["text"] for m in api.shown(ALICE)] == ["You wanted to buy milk."]


# -- groups: one message, edited -------------------------------------------------------------


async def test_group_preview_is_edited_into_the_one_answer(tmp_path, llm, api):
    llm.script(reply(ANSWER, pieces=8, chunk_delay=0.15))
    async with running(tmp_path, llm, api, **FAST) as tg:
        api.group_text(f"{BOT} plan my day")
        await api.wait_for_async(lambda: len(api.sent(GROUP)) == 1, 15)
        first = api.sent(GROUP)[0]
        assert "parse_mode" not in first.params  # the preview is plain while written
        assert "reply_parameters" in first.params  # and quotes the question, as answers do
        message_id = first.result["message_id"]

        # Recorded in the ledger (once the platform gave its id) while it is being edited.
        def recorded() -> bool:
            meta = tg.stack.store.get(f"telegram:{GROUP}").metadata
            return [str(message_id)] in [p["ids"] for p in meta.get("previews") or []]

        await api.wait_for_async(recorded, 5)
        assert not api.calls("editMessageText") or api.calls("editMessageText")[0].at > first.at
        final = lambda: any(  # noqa: E731
            c.params.get("parse_mode") == "HTML" and c.status == 200
            for c in api.calls("editMessageText")
        )
        await api.wait_for_async(final, 15)
        await quiet(api)
        shown = api.shown(GROUP)
        assert [m["message_id"] for m in shown] == [message_id]
        assert [m["text"] for m in shown] == rendered(tg, ANSWER)  # rendered: "the plan" bold
        assert len(api.sent(GROUP)) == 1  # no second copy
        edits = api.calls("editMessageText")
        assert len(edits) >= 3 and shown[0]["edits"] >= 3  # it grew while written
        # (That the edits keep the configured interval is asserted on exact, virtual times
        # in test_streaming_virtual.py: times taken here include the HTTP round trips.)
        meta = tg.stack.store.get(f"telegram:{GROUP}").metadata
        assert not meta.get("previews") and not meta.get("outbox")


async def test_idle_chats_leave_memory_and_a_late_event_reopens_nothing(tmp_path, llm, api):
    """Per-chat state (the manager's queue, worker and previews, the loop's turn queue) lives
    while a chat has something under way, then goes: memory follows the chats active now, not
    every chat ever seen. The delivered answer is still remembered: a stream event for it that
    comes late shows nothing."""
    llm.script(reply(ANSWER, pieces=6, chunk_delay=0.1))
    async with running(tmp_path, llm, api, **FAST) as tg:
        api.group_text(f"{BOT} plan my day")
        await api.wait_for_async(lambda: tg.manager.chats_in_memory == 1, 10)
        final = lambda: any(  # noqa: E731
            c.params.get("parse_mode") == "HTML" and c.status == 200
            for c in api.calls("editMessageText")
        )
        await api.wait_for_async(final, 15)
        await api.wait_for_async(
            lambda: tg.manager.chats_in_memory == 0 and tg.stack.loop.sessions_at_work == 0, 5
        )
        asked = api.sent(GROUP)[0].params["reply_parameters"]["message_id"]
        shows = lambda: [c for c in api.calls() if c.method != "getUpdates"]  # noqa: E731
        calls = len(shows())
        tg.stack.bus.publish_stream(
            StreamEvent("telegram", str(GROUP), f"{GROUP}:{asked}", "text", ANSWER + " more")
        )
        await quiet(api)
        assert len(shows()) == calls, shows()[calls:]  # no preview for a delivered answer
        assert tg.manager.chats_in_memory == 0

        for uid in range(3):  # private chats too, with typing and drafts
            api.private_text(f"hello {uid}", user_id=ALICE)
        await api.wait_for_async(lambda: len(api.sent(ALICE)) == 3, 20)
        await api.wait_for_async(
            lambda: tg.manager.chats_in_memory == 0 and tg.stack.loop.sessions_at_work == 0, 5
        )


async def test_group_answer_beyond_4096_units_continues_in_new_messages(tmp_path, llm, api):
    words = " ".join(f"word{i}🙂" for i in range(1400))  # emoji: 2 UTF-16 units each
    assert utf16_len(words) > 2 * 4096
    llm.script(reply(words, pieces=12, chunk_delay=0.08))
    async with running(tmp_path, llm, api, **FAST) as tg:
        api.group_text(f"{BOT} count")
        expected = rendered(tg, words)
        assert len(expected) >= 3

        def done() -> bool:
            return [m["text"] for m in api.shown(GROUP)] == expected

        await api.wait_for_async(done, 20)
        await quiet(api)
        shown = api.shown(GROUP)
        assert [m["text"] for m in shown] == expected
        assert all(utf16_len(m["text"]) <= 4096 for m in shown)
        assert len(api.sent(GROUP)) == len(expected)  # one per 4,096-unit piece, no copies
        assert " ".join(m["text"] for m in shown).split() == words.split()


async def test_group_answer_in_pieces_quotes_once_and_edits_only_what_changed(tmp_path, llm, api):
    """Only the answer's first message replies to the question, and the final answer edits
    only the previews that do not show it yet: a finished piece already shows the plain
    words, and Telegram refuses an edit that changes nothing ("message is not modified")."""
    words = " ".join(f"word{i}" for i in range(1300))
    llm.script(reply(words, pieces=12, chunk_delay=0.05))
    async with running(tmp_path, llm, api, **FAST) as tg:
        api.group_text(f"{BOT} count")
        expected = rendered(tg, words)
        assert len(expected) >= 3
        await api.wait_for_async(lambda: len(api.sent(GROUP)) == len(expected), 20)
        await api.wait_for_async(lambda: delivered(tg, GROUP), 20)
        await quiet(api)
        assert [m["text"] for m in api.shown(GROUP)] == expected
        sent = api.sent(GROUP)
        assert len(sent) == len(expected)
        assert "reply_parameters" in sent[0].params
        edits = api.calls("editMessageText")
        assert edits and [c.status for c in edits] == [200] * len(edits), [
            c.result for c in edits if c.status != 200
        ]
        assert ["reply_parameters" in c.params for c in sent[1:]] == [False] * (len(sent) - 1)


async def test_group_answer_past_its_previews_quotes_only_in_its_first_message(tmp_path, llm, api):
    """The second preview message fails: the pieces from there on come as new messages with
    the final answer, after the first (the edited preview), and do not quote it again."""
    words = " ".join(f"word{i}" for i in range(1300))
    llm.script(reply(words, pieces=12, chunk_delay=0.05))
    api.fail(
        "sendMessage",
        500,
        when=lambda p: "parse_mode" not in p and not str(p.get("text")).startswith("word0 "),
    )
    async with running(tmp_path, llm, api, **FAST) as tg:
        api.group_text(f"{BOT} count")
        expected = rendered(tg, words)
        assert len(expected) >= 3
        await api.wait_for_async(lambda: len(api.sent(GROUP)) == len(expected), 20)
        await api.wait_for_async(lambda: delivered(tg, GROUP), 20)
        assert [m["text"] for m in api.shown(GROUP)] == expected
        sent = api.sent(GROUP)
        assert [c.params.get("parse_mode") for c in sent[1:]] == ["HTML"] * (len(sent) - 1)
        assert ["reply_parameters" in c.params for c in sent] == [True] + [False] * (len(sent) - 1)


async def test_a_group_stream_cut_and_retried_ends_as_the_retried_answer(tmp_path, llm, api):
    """The LLM client retries a stream broken mid-way from the start: the preview, by then
    two messages long, becomes the short retried answer; nothing of the cut text is left."""
    words = " ".join(f"word{i}🙂" for i in range(1400))
    llm.script(
        reply(words, pieces=12, chunk_delay=0.05, disconnect_after_chunks=9),
        reply("The retried answer is short.", pieces=3, chunk_delay=0.08),
    )
    async with running(tmp_path, llm, api, **FAST) as tg:
        api.group_text(f"{BOT} count")
        await api.wait_for_async(lambda: len(api.sent(GROUP)) >= 2, 15)  # two previews
        expected = rendered(tg, "The retried answer is short.")
        await api.wait_for_async(lambda: [m["text"] for m in api.shown(GROUP)] == expected, 15)
        await quiet(api)
        assert [m["text"] for m in api.shown(GROUP)] == expected
        assert len(tg.llm.requests) == 2 and api.calls("deleteMessage")
        meta = tg.stack.store.get(f"telegram:{GROUP}").metadata
        assert not meta.get("previews") and not meta.get("outbox")


async def test_group_rate_limit_on_an_edit_is_honoured(tmp_path, llm, api):
    llm.script(reply(ANSWER, pieces=10, chunk_delay=0.15))
    api.fail("editMessageText", 429, retry_after=1)
    async with running(tmp_path, llm, api, **FAST) as tg:
        api.group_text(f"{BOT} plan")
        await api.wait_for_async(
            lambda: [m["text"] for m in api.shown(GROUP)] == rendered(tg, ANSWER), 15
        )
        edits = api.calls("editMessageText")
        refused = [c for c in edits if c.status == 429]
        assert len(refused) == 1
        after = [c for c in edits if c.at > refused[0].at]
        assert after and after[0].at - refused[0].at >= 1.0  # retry_after waited out
        assert len(api.sent(GROUP)) == 1


async def test_stop_mid_stream_keeps_the_streamed_text_marked_stopped(tmp_path, llm, api):
    long_answer = " ".join(f"sentence {i} of a long answer." for i in range(60))
    llm.script(reply(long_answer, pieces=40, chunk_delay=0.15))
    async with running(tmp_path, llm, api, **FAST) as tg:
        api.group_text(f"{BOT} tell me everything")
        await api.wait_for_async(lambda: api.calls("editMessageText"), 15)
        preview_id = api.sent(GROUP)[0].result["message_id"]
        api.group_text(f"/stop{BOT}")
        await api.wait_for_async(
            lambda: any(STOPPED_MARK in m["text"] for m in api.shown(GROUP)), 15
        )
        await quiet(api, 0.6)
        shown = {m["message_id"]: m["text"] for m in api.shown(GROUP)}
        stopped = shown.pop(preview_id)  # the preview itself became the final message
        assert stopped.endswith(STOPPED_MARK)
        streamed = stopped.removesuffix(STOPPED_MARK).strip()
        assert streamed and long_answer.startswith(streamed) and streamed != long_answer
        assert list(shown.values()) == ["Stopping the current answer."]
        session = tg.stack.store.get(f"telegram:{GROUP}")
        assert not session.metadata.get("previews") and not session.metadata.get("outbox")


# -- what does not stream ----------------------------------------------------------------------


async def test_streaming_off_is_todays_behaviour(tmp_path, llm, api):
    llm.script(reply(ANSWER, pieces=6, chunk_delay=0.1))
    async with running(tmp_path, llm, api, streaming=False, **FAST) as tg:
        api.group_text(f"{BOT} plan")
        await api.wait_sent_async(1, GROUP, timeout=15)
        await quiet(api)
        assert "stream" not in tg.llm.requests[0]["body"]
        assert not api.calls("editMessageText") and not api.calls("sendMessageDraft")
        [sent] = api.sent(GROUP)
        assert sent.params["parse_mode"] == "HTML"


async def test_a_model_server_that_does_not_stream_still_answers_once(tmp_path, llm, api):
    llm.script(reply(ANSWER, no_stream=True), reply(ANSWER, no_stream=True))
    async with running(tmp_path, llm, api, **FAST) as tg:
        api.group_text(f"{BOT} plan")
        api.private_text("plan")
        await api.wait_sent_async(1, GROUP, timeout=15)
        await api.wait_sent_async(1, ALICE, timeout=15)
        await quiet(api)
        assert tg.llm.requests[0]["body"]["stream"] is True
        for chat in (GROUP, ALICE):
            assert [m["text"] for m in api.shown(chat)] == rendered(tg, ANSWER)
        assert not api.calls("editMessageText") and not api.drafts()


NOTE = "Working on it, one moment."
LEAD = "Let me look into this for you right now, it takes a moment."


async def test_a_progress_note_keeps_the_preview_record_for_a_restart(tmp_path, llm, api):
    """A `message` tool note answers the same message as the streamed answer: delivering it
    must not drop the preview's ledger record, or a restart sends a second copy."""
    llm.script(
        tool_step(("message", {"text": NOTE}), text=LEAD, pieces=4, chunk_delay=0.1),
        reply(ANSWER, pieces=30, chunk_delay=0.3),
    )
    async with running(tmp_path, llm, api, **FAST) as tg:
        api.group_text(f"{BOT} plan my day")
        await api.wait_for_async(lambda: any(m["text"] == NOTE for m in api.shown(GROUP)), 15)
        preview_id = str(api.sent(GROUP)[0].result["message_id"])
        await asyncio.sleep(0.5)
        meta = tg.stack.store.get(f"telegram:{GROUP}").metadata
        assert [preview_id] in [p["ids"] for p in meta.get("previews") or []]
    llm.script(reply(ANSWER, pieces=4, chunk_delay=0.1))  # the restart resumes the turn
    async with running(tmp_path, llm, api, **FAST) as tg:
        await api.wait_for_async(
            lambda: rendered(tg, ANSWER)[0] in [m["text"] for m in api.shown(GROUP)], 15
        )
        await quiet(api, 1.0)
        shown = [m["text"] for m in api.shown(GROUP)]
        # The first preview (the lead-in) was edited into the answer; the note came after.
        assert shown == [rendered(tg, ANSWER)[0], NOTE], shown


async def test_a_preview_that_may_no_longer_be_edited_is_replaced(tmp_path, llm, api):
    """The final edit is refused for good ("message can't be edited"): the answer is sent
    anew and the preview deleted, so one message remains."""
    llm.script(reply(ANSWER, pieces=8, chunk_delay=0.15))
    api.fail(
        "editMessageText",
        400,
        "Bad Request: message can't be edited",
        when=lambda p: p.get("parse_mode") == "HTML",
    )
    async with running(tmp_path, llm, api, **FAST) as tg:
        api.group_text(f"{BOT} plan my day")
        await api.wait_for_async(
            lambda: rendered(tg, ANSWER)[0] in [m["text"] for m in api.shown(GROUP)], 20
        )
        await quiet(api, 0.6)
        assert [m["text"] for m in api.shown(GROUP)] == [rendered(tg, ANSWER)[0]]


def test_damaged_preview_records_are_dropped_on_load_and_ignored_when_peeked():
    meta = {"previews": [{"reply_to": "a", "ids": ["1"]}, "junk", {"reply_to": "b", "ids": [3]}]}
    clean, problems = clean_metadata(meta)
    assert clean["previews"] == [{"reply_to": "a", "ids": ["1"]}] and len(problems) == 2
    state = SessionState.of(meta)
    assert preview_ids_in(state, "a") == ["1"]
    assert preview_ids_in(state, "b") == []  # an id that is not text is never edited
    assert preview_ids_in(SessionState.of({"previews": "junk"}), "a") == []


async def test_a_draft_is_sent_again_while_a_long_tool_runs(tmp_path, llm, api, monkeypatch):
    # Telegram shows a draft for about 30 s: a tool running longer must not leave the chat
    # looking idle. (0.3 s here instead of 20 s.)
    monkeypatch.setattr(preview_module, "DRAFT_REFRESH_SECONDS", 0.3)
    llm.script(
        tool_step(("exec", {"command": "sleep 1.5"}), text="Checking.", pieces=2),
        reply("All done.", pieces=2),
    )
    async with running(tmp_path, llm, api, **FAST):
        api.private_text("run the long thing")
        await api.wait_sent_async(1, ALICE, timeout=20)
        drafts = api.drafts(ALICE)
        empty = [d for d in drafts if d.params.get("text", "") == ""]
        # Emptied when the tool started, then kept up about every 0.3 s while it ran.
        assert len(empty) >= 3, [d.params.get("text") for d in drafts]
        assert {d.params["draft_id"] for d in drafts} == {drafts[0].params["draft_id"]}
        assert [m["text"] for m in api.shown(ALICE)] == ["All done."]
        sent_at = api.sent(ALICE)[0].at
    await quiet(api, 0.8)
    # The answer is out: no draft after it.
    assert all(d.at <= sent_at for d in api.drafts(ALICE))
