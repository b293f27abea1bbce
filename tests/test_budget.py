"""Issue 31, budgets that hold and runaway work stopped: through the real agent loop, the
provider and the channel manager against the fake LLM, whose request log says which calls
were made."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from bot.config import load_config
from bot.cron import heartbeat
from bot.llm import ToolCall
from bot.runner import REPEATED_RESULT, call_key, call_results, looping
from bot.spend.budget import FILE, Budget, BudgetSpent
from bot.spend.record import CallRecord
from bot.status import status_rows
from bot.turn import BUDGET_NOTE
from tests.fakes.llm_server import FakeLLM, error, reply, tool_step
from tests.helpers import Harness, make_config, write_config

ADMIN_CHAT = "owner"


def harness(tmp_path: Path, server: FakeLLM, **sections: Any) -> Harness:
    config = tmp_path / "config.json"
    if not config.exists():
        write_config(tmp_path, server.base_url, **sections)
    h = Harness(load_config(config)[0], config)
    # The terminal channel names no admin chat of its own: give it one, so the admin
    # notices travel the real way (AdminNotice -> channel manager -> the admins' chats).
    channel = h.manager.channels["cli"]

    async def admin_chats() -> list[str]:
        return [ADMIN_CHAT]

    channel.admin_chats = admin_chats  # type: ignore[method-assign]
    return h


def notices(h: Harness) -> list[str]:
    return [m.text for m in h.outbox if m.chat_id == ADMIN_CHAT]


async def settle(h: Harness) -> None:
    """Let queued outbound messages (the notices) reach the recording channel."""
    for _ in range(300):  # a notice is two hops: AdminNotice, then a message per admin chat
        await asyncio.sleep(0)


def tokens_used(tmp_path: Path) -> int:
    total = 0
    for path in (tmp_path / "state" / "usage").glob("*.jsonl"):
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            total += rec["prompt_tokens"] + rec["completion_tokens"]
    return total


def heartbeat_tick() -> dict[str, Any]:
    return {
        "heartbeat": {"deliver_to": "cli:t", "due": "2026-12-06T09:00:00Z"},
        "is_admin": True,
        "is_group": False,
    }


JOB = {"cron": {"job_id": "j1", "deliver": "agent", "due": "2026-12-06T09:00:00Z"}}


async def test_a_spent_daily_budget_stops_every_call_until_an_admin_raises_it(
    tmp_path: Path, llm: FakeLLM
) -> None:
    """The done-when of issue 31 item 3: one 80% and one 100% notice (also across a
    restart), then no model call for a chat, the heartbeat, a scheduled agent job, Dream or
    consolidation (which archives the raw text instead); `/budget` raising the limit
    resumes work."""
    llm.script(reply("first"), reply("second"), reply("resumed"))
    async with harness(tmp_path, llm, heartbeat={"deliverTo": "cli:t"}) as h:
        assert await h.ask("hi") == "first"
        used = tokens_used(tmp_path)
        # Lowered from chat so that what was used is 90% of it: the 80% notice, at once.
        limit = used * 10 // 9
        answer = await h.ask(f"/budget daily.tokens {limit}")
        assert f"daily.tokens: no limit -> {limit:,}" in answer
        await settle(h)
        assert len(notices(h)) == 1 and "is at 90%" in notices(h)[0]
    # A restart: the override and the notice given are remembered (<state>/budget.json).
    async with harness(tmp_path, llm) as h:
        assert await h.ask("more") == "second"  # under the limit when asked: it runs
        await settle(h)
        said = notices(h)
        assert len(said) == 1 and "is at" in said[0] and "paused until" in said[0]
        calls = len(llm.requests)

        spent = await h.ask("and again?")
        assert spent.startswith("This bot's daily model budget is spent")
        assert "It resets at 00:00 on" in spent and "/budget" in spent
        kept = h.stack.store.get("cli:t").messages[-2:]
        assert kept[0]["content"].startswith("and again?") and kept[1]["content"] == BUDGET_NOTE
        beat = await h.send(
            "check", channel=heartbeat.CHANNEL, chat=heartbeat.CHAT, metadata=heartbeat_tick()
        )
        await h.stack.loop.wait_idle(heartbeat.SESSION)
        assert not beat.done()  # the heartbeat tells nobody
        job = await (await h.send("the weather?", metadata=JOB))
        assert job.text.startswith("This bot's daily model budget is spent")
        # /new archives the conversation: raw text, no summary call, nothing lost.
        assert (await h.ask("/new")).startswith("New conversation started.")
        history = (tmp_path / "ws" / "memory" / "history.jsonl").read_text()
        assert "[RAW]" in history and "and again?" in history
        dream = await h.stack.loop.dream.run()
        assert dream.status == "paused"
        assert len(llm.requests) == calls  # not one model call since the budget was spent
        assert len(notices(h)) == 1  # and no more notices
        assert "budget paused: total (daily.tokens)" in await h.ask("/status")
        row = dict(status_rows(h.cfg, tmp_path / "config.json"))["budget"]
        assert "daily.tokens:" in row and "SPENT" in row and "paused: total" in row

        lifted = await h.ask("/budget daily.tokens 100000000")
        assert "-> 100,000,000" in lifted
        assert await h.ask("back?") == "resumed"
        assert len(llm.requests) == calls + 1
    record = json.loads((tmp_path / "state" / FILE).read_text())
    assert record["overrides"]["daily.tokens"]["value"] == 100_000_000
    assert record["overrides"]["daily.tokens"]["by"].startswith("cli:t/")


async def test_a_chat_over_its_own_limit_is_answered_and_others_go_on(
    tmp_path: Path, llm: FakeLLM
) -> None:
    """budget.perChat: the chat over it gets the answer and makes no call; another chat is
    answered by the model."""
    llm.script(reply("one"), reply("other chat"))
    async with harness(tmp_path, llm, budget={"perChat": {"daily": {"tokens": 1}}}) as h:
        assert await h.ask("hi") == "one"
        spent = await h.ask("again")
        assert spent.startswith("This chat's daily model budget is spent")
        assert await h.ask("hello", chat="u") == "other chat"
        assert len(llm.requests) == 2


async def test_a_call_in_flight_finishes_when_the_budget_is_lowered(
    tmp_path: Path, llm: FakeLLM
) -> None:
    """Checked before a call, never during one: the answer under way is delivered."""
    llm.script(reply("slow answer", delay=0.3))
    async with harness(tmp_path, llm) as h:
        answer = await h.send("hi")
        await llm.wait_for_requests(1)
        assert "-> 1" in await h.ask("/budget daily.tokens 1", chat="admin")
        assert (await asyncio.wait_for(answer, 10)).text == "slow answer"
        assert (await h.ask("next")).startswith("This bot's daily model budget is spent")


async def test_budget_by_a_non_admin_is_refused(tmp_path: Path, llm: FakeLLM) -> None:
    async with harness(tmp_path, llm, budget={"daily": {"tokens": 5}}) as h:
        fut = await h.send("/budget daily.tokens off", metadata={"is_admin": False})
        assert (await asyncio.wait_for(fut, 10)).text.startswith("Only an admin")
        assert "daily.tokens: 0 tokens of 5 tokens" in await h.ask("/budget")
    assert not (tmp_path / "state" / FILE).exists()


async def test_a_turn_past_max_tokens_per_turn_ends_with_a_note(
    tmp_path: Path, llm: FakeLLM
) -> None:
    llm.script(tool_step(("list_dir", {})), reply("never asked"))
    async with harness(tmp_path, llm, agent={"maxTokensPerTurn": 10}) as h:
        answer = await h.ask("list it")
    assert answer.startswith("I stopped this answer after its model calls used")
    assert "agent.maxTokensPerTurn = 10" in answer
    assert len(llm.requests) == 1


async def test_the_same_call_with_the_same_result_a_third_time_ends_the_turn(
    tmp_path: Path, llm: FakeLLM
) -> None:
    """A scripted model calling list_dir on the same folder forever: stopped at its third
    call, which does not run, with no fourth model call."""
    llm.script(*[tool_step(("list_dir", {"path": "."})) for _ in range(10)])
    async with harness(tmp_path, llm) as h:
        answer = await h.ask("loop")
        session = h.stack.store.get("cli:t")
    assert "kept calling list_dir with the same arguments" in answer
    assert len(llm.requests) == 3
    results = [m["content"] for m in session.messages if m.get("role") == "tool"]
    assert len(results) == 3 and results[-1] == REPEATED_RESULT
    assert results[0] == results[1] != REPEATED_RESULT


def test_a_repeated_call_with_another_result_is_no_loop() -> None:
    call = ToolCall("c9", "exec", '{"command": "make test"}')
    key = call_key("exec", '{ "command":"make test" }')  # the same arguments, spaced anew
    assert looping({key: ["FAIL", "FAIL"]}, call)
    assert not looping({key: ["FAIL", "ok"]}, call)
    assert not looping({key: ["FAIL"]}, call)


async def test_failing_summaries_back_off_and_tell_the_admins_once(
    tmp_path: Path, llm: FakeLLM
) -> None:
    """Three summaries failing in a row: the admins are told once, the next chunks are
    archived raw with no model call until the (doubling) wait is over."""
    clock = [1000.0]
    turns = [reply(f"a{i}") for i in range(6)]
    llm.script(turns[0], error(400), turns[1], error(400), turns[2], error(400), turns[3])
    async with harness(tmp_path, llm) as h:
        consolidator = h.stack.loop.consolidator
        consolidator.backoff.now = lambda: clock[0]
        for i in range(3):
            await h.ask(f"hi {i}")
            assert (await consolidator.consolidate("cli:t", keep=0)).raw
        await settle(h)
        assert len(notices(h)) == 1 and "failed 3 times in a row" in notices(h)[0]
        asked = len(llm.requests)
        await h.ask("hi 3")
        assert (await consolidator.consolidate("cli:t", keep=0)).raw
        assert len(llm.requests) == asked + 1  # the turn's call only: no summary asked
        clock[0] += consolidator.backoff.delay()
        llm.script(reply("a4"), error(400))
        await h.ask("hi 4")
        assert (await consolidator.consolidate("cli:t", keep=0)).raw
        assert len(llm.requests) == asked + 3  # tried again once the wait was over
        assert consolidator.backoff.delay() == 2 * 300.0  # doubled
        await settle(h)
        assert len(notices(h)) == 1


async def test_a_failing_scheduled_dream_backs_off_and_tells_the_admins_once(
    tmp_path: Path, llm: FakeLLM
) -> None:
    clock = [50.0]
    llm.script(reply("hi"), reply("summary"), *[error(400) for _ in range(4)])
    async with harness(tmp_path, llm) as h:
        loop = h.stack.loop
        loop.dream_backoff.now = lambda: clock[0]
        await h.ask("hello")
        assert (await h.ask("/new")).startswith("New conversation started.")
        for _ in range(3):
            await loop.dream_tick()
        asked = len(llm.requests)
        await loop.dream_tick()  # backing off: Dream is not run
        assert len(llm.requests) == asked
        clock[0] += 300
        await loop.dream_tick()
        assert len(llm.requests) == asked + 1
        await settle(h)
        said = notices(h)
        assert len(said) == 1 and said[0].startswith("Dream failed 3 times in a row")


def test_a_daily_limit_resets_at_local_midnight_and_a_monthly_one_holds(tmp_path: Path) -> None:
    """Periods are local days and months of agent.timezone, on an injected clock."""
    cfg = make_config(
        tmp_path,
        "http://127.0.0.1:9/v1",
        agent={"timezone": "Europe/Berlin"},
        budget={"daily": {"tokens": 100}, "monthly": {"tokens": 150}},
    )
    now = [datetime(2026, 12, 6, 22, 30, tzinfo=UTC)]  # 23:30 in Berlin
    budget = Budget(cfg, ZoneInfo("Europe/Berlin"), now=lambda: now[0])

    def spend(tokens: int) -> None:
        at = now[0].strftime("%Y-%m-%dT%H:%M:%SZ")
        budget.observe(
            CallRecord("x", at, "cli:t", "turn", "m", "e", tokens, 0, 0, False, None, None)
        )

    spend(120)
    with pytest.raises(BudgetSpent) as spent:
        budget.check("cli:t", "turn")
    assert "It resets at 00:00 on 2026-12-07 (Europe/Berlin)" in spent.value.user_message
    budget.check("", "probe")  # the outage probe is never refused
    now[0] += timedelta(hours=1)  # 00:30 in Berlin, still 23:30 UTC
    budget.check("cli:t", "turn")
    spend(40)  # today 40 of 100, this month 160 of 150
    with pytest.raises(BudgetSpent) as spent:
        budget.check("cli:t", "consolidation")
    assert spent.value.user_message.startswith("This bot's monthly model budget is spent")
    assert "00:00 on 2027-01-01" in spent.value.user_message


async def test_an_unreadable_budget_file_is_kept_aside_not_written_over(tmp_path: Path) -> None:
    """A damaged budget.json (a hand edit gone wrong) holds the admins' overrides: the next
    /budget change keeps it as budget.json.damaged instead of replacing it."""
    cfg = make_config(tmp_path, "http://127.0.0.1:9/v1", budget={"daily": {"tokens": 100}})
    path = cfg.agent.state_path / FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    damaged = '{"overrides": {"daily.tokens": {"value": 5000, "by": "owner"'
    path.write_text(damaged)
    budget = Budget(cfg, ZoneInfo("UTC"))
    assert budget.limit("total", "daily", "tokens") == 100  # the config's, meanwhile
    answer = await budget.command("monthly.tokens 9000", "cli:t/owner")
    assert "monthly.tokens: no limit -> 9,000" in answer
    assert path.with_name(FILE + ".damaged").read_text() == damaged
    assert Budget(cfg, ZoneInfo("UTC")).limit("total", "monthly", "tokens") == 9000


def test_a_new_topic_or_thread_shares_its_chats_limit(tmp_path: Path) -> None:
    """A group member opening a new forum topic (a session of its own) gets no fresh per-chat
    limit; another chat keeps its own."""
    cfg = make_config(
        tmp_path, "http://127.0.0.1:9/v1", budget={"perChat": {"daily": {"tokens": 100}}}
    )
    budget = Budget(cfg, ZoneInfo("UTC"))
    at = budget.now().strftime("%Y-%m-%dT%H:%M:%SZ")
    budget.observe(
        CallRecord("x", at, "telegram:-1001:7", "turn", "m", "e", 120, 0, 0, False, None, None)
    )
    for session in ("telegram:-1001:8", "telegram:-1001", "slack:C1:17.1"):
        if session.startswith("slack"):
            budget.observe(
                CallRecord("y", at, "slack:C1:16.0", "turn", "m", "e", 100, 0, 0, False, None, None)
            )
        with pytest.raises(BudgetSpent):
            budget.check(session, "turn")
    budget.check("telegram:-1002", "turn")


def test_a_clock_set_back_over_midnight_keeps_todays_totals(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, "http://127.0.0.1:9/v1", budget={"daily": {"tokens": 100}})
    now = [datetime(2026, 12, 7, 0, 0, 30, tzinfo=UTC)]
    budget = Budget(cfg, ZoneInfo("UTC"), now=lambda: now[0])
    budget.observe(
        CallRecord(
            "x", "2026-12-07T00:00:30Z", "cli:t", "turn", "m", "e", 150, 0, 0, False, None, None
        )
    )
    now[0] -= timedelta(minutes=1)  # NTP sets the clock back to 23:59:30 of yesterday
    with pytest.raises(BudgetSpent):
        budget.check("cli:t", "turn")
    now[0] += timedelta(minutes=2)
    with pytest.raises(BudgetSpent):
        budget.check("cli:t", "turn")
    now[0] -= timedelta(days=40)  # a wrong clock corrected: that day's totals hold
    budget.check("cli:t", "turn")


async def test_a_voice_message_of_a_chat_over_its_limit_is_not_transcribed(
    tmp_path: Path, llm: FakeLLM
) -> None:
    """Transcription is a paid call too: a group member sending voice messages to a chat
    whose budget is spent gets the budget answer, and nothing is sent to be transcribed."""
    from bot.bus import InboundMessage

    llm.script(reply("one"))
    voice = tmp_path / "ws" / "media" / "note.ogg"
    voice.parent.mkdir(parents=True)
    voice.write_bytes(b"OggS" + b"\0" * 60)
    sections: dict[str, Any] = {
        "budget": {"perChat": {"daily": {"tokens": 1}}},
        "llm": {"transcriptionModel": "whisper-1"},
    }
    async with harness(tmp_path, llm, **sections) as h:
        assert await h.ask("hi") == "one"
        fut = h.expect("v1")
        await h.stack.bus.publish_inbound(
            InboundMessage("cli", "t", "u", "voice", media=(str(voice),), message_id="v1")
        )
        assert (await asyncio.wait_for(fut, 10)).text.startswith("This chat's daily model")
    assert llm.transcriptions == []


def test_a_hand_edited_override_that_is_no_limit_is_ignored(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, "http://127.0.0.1:9/v1", budget={"daily": {"tokens": 100}})
    path = cfg.agent.state_path / FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    entry = {"by": "owner", "at": "2026-12-06T10:00:00Z"}
    path.write_text(
        '{"overrides": {"daily.tokens": {"value": 1e309, "by": "x"}, '
        f'"monthly.cost": {json.dumps({**entry, "value": True})}}}}}'
    )
    budget = Budget(cfg, ZoneInfo("UTC"))
    assert budget.limit("total", "daily", "tokens") == 100
    assert budget.limit("total", "monthly", "cost") is None
    assert "daily.tokens: 0 tokens of 100 tokens" in budget.describe()


def test_the_start_reads_a_local_month_that_began_in_the_last_utc_month(tmp_path: Path) -> None:
    """Ledger files are per UTC month, budgets per local day: at 00:30 on 1 December in Berlin
    (23:30 UTC on 30 November) the calls of the last half hour are in November's file."""
    from bot.spend.ledger import UsageLedger

    cfg = make_config(
        tmp_path,
        "http://127.0.0.1:9/v1",
        agent={"timezone": "Europe/Berlin"},
        budget={"daily": {"tokens": 100}},
    )

    def call(at: str, tokens: int) -> CallRecord:
        return CallRecord(at, at, "cli:t", "turn", "m", "e", tokens, 0, 0, False, None, None)

    async def write() -> None:
        ledger = UsageLedger(cfg.agent.state_path)
        await ledger.record(call("2026-11-30T22:50:00Z", 1000))  # 23:50 on 30 Nov in Berlin
        await ledger.record(call("2026-11-30T23:10:00Z", 60))  # 00:10 on 1 Dec
        await ledger.aclose()

    asyncio.run(write())
    now = datetime(2026, 11, 30, 23, 30, tzinfo=UTC)
    budget = Budget(cfg, ZoneInfo("Europe/Berlin"), now=lambda: now)
    assert (budget.day.total.tokens, budget.month.total.tokens) == (60, 60)


async def test_a_scheduled_job_is_held_to_its_chats_limit(tmp_path: Path, llm: FakeLLM) -> None:
    """A group member may schedule an agent job in their chat: once the chat's own limit is
    spent, its jobs make no call either (they were only held to background's)."""
    llm.script(reply("one"), reply("other chat's job"))
    async with harness(tmp_path, llm, budget={"perChat": {"daily": {"tokens": 1}}}) as h:
        assert await h.ask("hi") == "one"
        job = await (await h.send("the weather?", metadata=JOB))
        assert job.text.startswith("This chat's daily model budget is spent")
        other = await (await h.send("the weather?", chat="u", metadata=JOB))
        assert other.text == "other chat's job"
        assert len(llm.requests) == 2


def test_a_budget_file_that_is_a_fifo_does_not_hang_the_start(tmp_path: Path) -> None:
    import os
    import threading

    cfg = make_config(tmp_path, "http://127.0.0.1:9/v1", budget={"daily": {"tokens": 100}})
    path = cfg.agent.state_path / FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
    made: list[Budget] = []
    start = threading.Thread(target=lambda: made.append(Budget(cfg, ZoneInfo("UTC"))))
    start.daemon = True
    start.start()
    start.join(2)
    if start.is_alive():  # it hangs in open() (the test fails): a writer lets it go
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        start.join()
        pytest.fail("the start waited on the FIFO")
    assert made and made[0].limit("total", "daily", "tokens") == 100


def test_a_call_id_a_server_uses_again_is_no_loop() -> None:
    """Servers that number calls "call_0" in every answer: each result is its own call's,
    not the last one of that id (which made a file read during a build look repeated)."""

    def asked(args: str) -> dict[str, Any]:
        call = {"id": "call_0", "function": {"name": "read_file", "arguments": args}}
        return {"role": "assistant", "tool_calls": [call]}

    def result(text: str) -> dict[str, Any]:
        return {"role": "tool", "tool_call_id": "call_0", "content": text}

    a, b = '{"path": "log"}', '{"path": "other"}'
    turn = [asked(a), result("step 1"), asked(b), result("x"), asked(a), result("step 2")]
    history = call_results(turn)
    assert history[call_key("read_file", a)] == ["step 1", "step 2"]
    assert not looping(history, ToolCall("call_0", "read_file", a))
    turn += [asked(b), result("x")]
    assert looping(call_results(turn), ToolCall("call_0", "read_file", b))


def test_a_backoff_failing_for_months_waits_the_cap() -> None:
    """At the 6-hour cap, 1,024 more failures take eight months: the doubling must not
    overflow a float then (it raised out of the consolidation's failure path)."""
    from bot.backoff import MAX_WAIT_SECONDS, Backoff

    clock = [0.0]
    backoff = Backoff(now=lambda: clock[0], failures=1100)
    assert not backoff.failed()  # not the first failure of the waiting: nobody told again
    assert backoff.delay() == MAX_WAIT_SECONDS and backoff.wait_left() == MAX_WAIT_SECONDS


def test_a_background_task_is_charged_to_the_chat_that_started_it(tmp_path: Path) -> None:
    """A task runs in a session of its own (``task:<id>``): uncharged, a group member could
    spend past the group's per-chat limit by starting tasks."""
    cfg = make_config(
        tmp_path, "http://127.0.0.1:9/v1", budget={"perChat": {"daily": {"tokens": 100}}}
    )
    budget = Budget(cfg, ZoneInfo("UTC"))
    at = budget.now().strftime("%Y-%m-%dT%H:%M:%SZ")
    budget.charge_to("task:3f2a", "telegram:-1001")
    budget.observe(CallRecord("x", at, "task:3f2a", "task", "m", "e", 120, 0, 0, False, None, None))
    with pytest.raises(BudgetSpent):
        budget.check("telegram:-1001", "turn")  # the group's own next turn
    with pytest.raises(BudgetSpent):
        budget.check("task:3f2a", "task")  # and the task's next call
    budget.check("telegram:-1002", "turn")
