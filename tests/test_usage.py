"""Issue 31, spend under control: every model call is counted once in the usage ledger
(``<state>/usage/YYYY-MM.jsonl``), priced from ``llm.prices``, and read back by ``memobot
usage``, ``/usage`` and ``memobot status``. Through the real agent loop and provider against
the fake LLM, whose request log says what each answer reported."""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from bot.cli import main
from bot.config import ConfigError, load_config, parse_config
from bot.cron import heartbeat
from bot.llm import LLMProvider
from bot.spend.ledger import UsageLedger, month_file, read_records
from bot.spend.record import CallRecord
from bot.status import status_rows
from tests.fakes.llm_server import FakeLLM, reply, tool_step
from tests.helpers import Harness, make_config, write_config

PRICE = {"input": 2.5, "cachedInput": 1.25, "output": 10, "currency": "USD"}


def harness(
    tmp_path: Path, server: FakeLLM, channels: tuple[str, ...] = ("cli",), **sections: Any
) -> Harness:
    """The agent in-process, on a config written to ``tmp_path/config.json`` (which the
    `memobot usage` run afterwards reads)."""
    config = write_config(tmp_path, server.base_url, **sections)
    return Harness(load_config(config)[0], config, channels)


def ledger(tmp_path: Path) -> list[dict[str, Any]]:
    lines = []
    for path in sorted((tmp_path / "state" / "usage").glob("*.jsonl")):
        lines += [json.loads(line) for line in path.read_text().splitlines()]
    return lines


def reported(llm: FakeLLM) -> dict[str, int]:
    """What the fake's answers reported, summed: what the ledger must hold."""
    sums = {"calls": 0, "prompt_tokens": 0, "completion_tokens": 0, "cached_tokens": 0}
    for entry in llm.requests:
        usage = entry.get("usage")
        if usage:
            sums["calls"] += 1
            sums["prompt_tokens"] += usage["prompt_tokens"]
            sums["completion_tokens"] += usage["completion_tokens"]
            details = usage.get("prompt_tokens_details") or {}
            sums["cached_tokens"] += details.get("cached_tokens", 0)
    return sums


def usage_json(config: Path, capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    capsys.readouterr()
    assert main(["--config", str(config), "usage", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def heartbeat_tick(due: str) -> dict[str, Any]:
    return {"heartbeat": {"deliver_to": "cli:t", "due": due}, "is_admin": True, "is_group": False}


async def test_every_call_is_counted_once_with_its_purpose_tokens_and_cost(
    tmp_path: Path, llm: FakeLLM, capsys: pytest.CaptureFixture[str]
) -> None:
    """A plain turn, a tool turn (its second call a tool iteration), a heartbeat, a scheduled
    agent job, the consolidation /new runs and Dream: one record each, the provider's own
    token counts, cached tokens priced at cachedInput; `memobot usage --json` sums to what
    the fake reported."""
    llm.script(
        reply("Hello there!", cached_tokens=100),
        tool_step(("list_dir", {})),
        reply("listed"),
        reply("The build is red."),
        reply("Sunny."),
    )
    config = tmp_path / "config.json"
    async with harness(tmp_path, llm, llm={"prices": {"fake-model": PRICE}}) as h:
        assert await h.ask("hi") == "Hello there!"
        assert await h.ask("list it") == "listed"
        beat = await h.send(
            "check the build",
            channel=heartbeat.CHANNEL,
            chat=heartbeat.CHAT,
            metadata=heartbeat_tick("2026-12-06T09:00:00Z"),
        )
        assert (await beat).text == "The build is red."
        job = {"cron": {"job_id": "j1", "deliver": "agent", "due": "2026-12-06T09:00:00Z"}}
        assert (await (await h.send("the weather?", metadata=job))).text == "Sunny."
        assert (await h.ask("/new")).startswith("New conversation started.")
        # Dream digests what /new archived: its call is Dream's.
        assert (await h.stack.loop.dream.run()).status in ("done", "nothing")
    records = ledger(tmp_path)
    assert [(r["purpose"], r["session"]) for r in records] == [
        ("turn", "cli:t"),
        ("turn", "cli:t"),
        ("tool_iteration", "cli:t"),
        ("heartbeat", heartbeat.SESSION),
        ("job", "cli:t"),
        ("consolidation", "cli:t"),
        ("dream", "dream"),
    ]
    assert len({r["id"] for r in records}) == 7
    first, said = records[0], llm.requests[0]["usage"]
    assert (first["prompt_tokens"], first["completion_tokens"], first["cached_tokens"]) == (
        said["prompt_tokens"],
        said["completion_tokens"],
        100,
    )
    expected = (said["prompt_tokens"] - 100) * 2.5 + 100 * 1.25 + said["completion_tokens"] * 10
    assert first["cost"] == pytest.approx(expected / 1e6) and first["currency"] == "USD"
    assert first["model"] == "fake-model" and first["endpoint"] == llm.base_url
    assert "estimated" not in first

    total = usage_json(config, capsys)["total"]
    assert {k: total[k] for k in reported(llm)} == reported(llm)
    assert total["cost"] == pytest.approx(sum(r["cost"] for r in records))
    assert total["estimated_calls"] == total["unpriced_calls"] == 0

    by = usage_json(config, capsys, "--by", "purpose")
    assert {k: g["calls"] for k, g in by["groups"].items()} == {
        "turn": 2,
        "tool_iteration": 1,
        "heartbeat": 1,
        "job": 1,
        "consolidation": 1,
        "dream": 1,
    }
    assert by["total"] == total
    by_session = usage_json(config, capsys, "--by", "session")["groups"]
    assert by_session["cli:t"]["calls"] == 5 and by_session[heartbeat.SESSION]["calls"] == 1
    today = datetime.now(UTC).astimezone().date().isoformat()
    assert list(usage_json(config, capsys, "--by", "day")["groups"]) == [today]
    # A window without those days holds nothing.
    empty = usage_json(config, capsys, "--since", "2020-01-01", "--until", "2020-01-31")
    assert empty["total"]["calls"] == 0 and empty["total"]["cost"] is None


async def test_a_streamed_answer_is_counted_from_its_usage_chunk(tmp_path: Path) -> None:
    """Streamed requests ask for include_usage; the last chunk's usage is what is recorded,
    after the answer was handed to ``on_answer``."""
    records: list[CallRecord] = []
    order: list[str] = []

    async def meter(rec: CallRecord) -> None:
        records.append(rec)
        order.append("recorded")

    async with FakeLLM(script=[reply("streamed words", cached_tokens=3)]) as llm:
        cfg = make_config(tmp_path, llm.base_url).llm
        provider = LLMProvider(cfg, meter=meter)
        try:
            seen: list[str] = []
            answer = await provider.chat(
                [{"role": "user", "content": "hi"}],
                session_key="cli:s",
                on_text=seen.append,
                on_answer=lambda response: order.append("answered"),
            )
        finally:
            await provider.close()
    assert answer.content == "streamed words" and seen
    # The chat hears the answer is whole before the ledger's fsync, not after it: a streamed
    # preview is not sent again while the record is written.
    assert order == ["answered", "recorded"]
    [request] = llm.requests
    assert request["body"]["stream_options"] == {"include_usage": True}
    [rec] = records
    usage = request["usage"]
    assert (rec.prompt_tokens, rec.completion_tokens, rec.cached_tokens) == (
        usage["prompt_tokens"],
        usage["completion_tokens"],
        3,
    )
    assert not rec.estimated and rec.cost is None and rec.currency is None  # no price: tokens


async def test_a_provider_that_reports_nothing_is_estimated_and_marked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with FakeLLM(report_usage=False) as llm:
        llm.script(tool_step(("list_dir", {})), reply("done " * 40))
        config = tmp_path / "config.json"
        async with harness(tmp_path, llm) as h:
            assert (await h.ask("go")).startswith("done")
    assert all(entry["usage"] is None for entry in llm.requests)
    records = ledger(tmp_path)
    assert [r["purpose"] for r in records] == ["turn", "tool_iteration"]
    assert all(r["estimated"] is True for r in records)
    assert all(r["prompt_tokens"] > 0 and r["completion_tokens"] > 0 for r in records)
    assert records[1]["completion_tokens"] >= 40  # "done " forty times
    assert all("cost" not in r for r in records)  # no price: never a guessed cost
    total = usage_json(config, capsys)["total"]
    assert total["estimated_calls"] == 2 and total["unpriced_calls"] == 2
    assert total["cost"] is None and total["costs"] == {}
    capsys.readouterr()
    assert main(["--config", str(config), "usage", "--by", "model"]) == 0
    table = capsys.readouterr().out
    assert "fake-model" in table and "2 calls without usage from the provider" in table
    assert "2 calls of a model without a price" in table


async def test_usage_in_chat_shows_a_person_their_own_chat_and_an_admin_every_chat(
    tmp_path: Path, llm: FakeLLM
) -> None:
    guest = {"is_admin": False, "is_group": False}
    admin = {"is_admin": True, "is_group": False}
    async with harness(tmp_path, llm, ("cli", "telegram")) as h:

        async def say(text: str, chat: str, who: dict[str, Any]) -> str:
            fut = await h.send(text, chat=chat, channel="telegram", metadata=who)
            return (await fut).text

        await say("hello", "1", guest)
        await say("hello", "2", admin)
        await say("again", "2", admin)
        mine = await say("/usage", "1", guest)
        everyone = await say("/usage", "2", admin)
        in_group = await say("/usage", "2", {"is_admin": True, "is_group": True})
    assert "this chat (telegram:1)" in mine and "today: 1 call," in mine
    assert "telegram:2" not in mine  # another chat is not shown to a guest
    assert "every chat" in everyone and "today: 3 calls," in everyone
    assert "telegram:1" in everyone and "telegram:2" in everyone
    # In a group the others would read it too: the chat's own figures only.
    assert "this chat (telegram:2)" in in_group and "telegram:1" not in in_group


async def test_status_shows_today_and_this_month(tmp_path: Path, llm: FakeLLM) -> None:
    llm.script(reply("one", cached_tokens=2), reply("two"))
    async with harness(tmp_path, llm, llm={"prices": {"fake-model": PRICE}}) as h:
        await h.ask("a")
        await h.ask("b")
    cfg = make_config(tmp_path, llm.base_url, llm={"prices": {"fake-model": PRICE}})
    line = dict(status_rows(cfg, tmp_path / "config.json"))["usage"]
    tokens = sum(r["prompt_tokens"] + r["completion_tokens"] for r in ledger(tmp_path))
    cost = sum(r["cost"] for r in ledger(tmp_path))
    today = f"today 2 calls, {tokens:,} tokens"
    assert line.startswith(today) and f"this month 2 calls, {tokens:,} tokens" in line
    assert "of which 2 cached" in line and f"{cost:,.4f} USD" in line


def test_a_torn_or_damaged_ledger_line_is_skipped_and_the_torn_tail_cut(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    at = "2026-12-06T10:00:00Z"
    good = CallRecord("a1", at, "cli:t", "turn", "m", "e", 10, 5, 0, False, None, None)
    path = month_file(tmp_path, "2026-12")
    path.parent.mkdir(parents=True)
    path.write_bytes(good.line() + b"not json\n" + good.line() + b'{"id":"b2","at":"2026-1')
    found = list(read_records(tmp_path, "2026-12-01T00:00:00Z", "2027-01-01T00:00:00Z"))
    assert [r.id for r in found] == ["a1", "a1"]
    assert "skipped damaged line(s) 2" in caplog.text

    asyncio.run(UsageLedger(tmp_path).record(good))
    data = path.read_bytes()
    assert data.endswith(good.line()) and b'"b2"' not in data  # the torn tail went first
    found = list(read_records(tmp_path, "2026-12-01T00:00:00Z", "2027-01-01T00:00:00Z"))
    assert len(found) == 3


@pytest.mark.parametrize(
    ("price", "problem"),
    [
        ({"input": "2.5", "output": 10}, "llm.prices.gpt-4o.input: expected a number"),
        ({"input": -1, "output": 10}, "llm.prices.gpt-4o.input"),
        ({"input": 2.5}, "llm.prices.gpt-4o.output: required"),
        ({"input": 1, "output": 1, "currency": "usd"}, "llm.prices.gpt-4o.currency"),
        ({"input": 1, "output": 1, "cached": 1}, "llm.prices.gpt-4o.cached: unknown option"),
    ],
)
def test_a_wrong_price_is_a_config_error_naming_the_field(
    price: dict[str, Any], problem: str
) -> None:
    with pytest.raises(ConfigError, match=problem.replace(".", r"\.")):
        parse_config({"llm": {"prices": {"gpt-4o": price}}})
    assert parse_config({"llm": {"prices": {"gpt-4o": PRICE}}}).llm.prices["gpt-4o"].output == 10


def test_a_failed_ledger_write_is_retried_with_the_next_record_never_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A full disk must not fail the turn, lose the record, or (half of the failed write
    having landed) count it twice once the disk has room again."""
    import errno
    import os

    real_write = os.write
    calls = iter(["half", "full"])

    def write(fd: int, data: Any) -> int:
        if next(calls, None) == "half":  # half the line lands, then the disk is full
            return real_write(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    at = "2026-12-06T10:00:00Z"
    before = CallRecord("r0", at, "cli:t", "turn", "m", "e", 1, 1, 0, False, None, None)
    first = CallRecord("r1", at, "cli:t", "turn", "m", "e", 10, 5, 0, False, None, None)
    second = CallRecord("r2", at, "cli:t", "turn", "m", "e", 7, 3, 0, False, None, None)
    path = month_file(tmp_path, "2026-12")
    path.parent.mkdir()
    path.write_bytes(before.line())
    caplog.set_level(logging.INFO, "bot.spend")

    async def three_calls() -> None:
        ledger = UsageLedger(tmp_path)
        await ledger.record(before._replace(id="r00"))  # the file is open and warm
        monkeypatch.setattr(os, "write", write)
        await ledger.record(first)  # the write fails halfway: logged, not raised
        assert "cannot write 1 record(s)" in caplog.text
        assert path.read_bytes().endswith(first.line()[: len(first.line()) // 2])
        monkeypatch.setattr(os, "write", real_write)
        await ledger.record(second)
        await ledger.aclose()

    asyncio.run(three_calls())
    lines = path.read_bytes().splitlines(keepends=True)
    assert lines == [before.line(), before._replace(id="r00").line(), first.line(), second.line()]
    assert "usage ledger: writing again" in caplog.text


async def test_records_are_written_at_once_and_share_one_fsync_and_an_idle_ledger_waits_on_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each record is in the file when ``record`` returns (a SIGKILL cannot lose it); the
    fsyncs are shared (at most one a second, so a power cut loses at most about a second of
    records); ``flush`` syncs them all, and then no timer or task is left waiting."""
    import os
    import stat

    real_fsync = os.fsync
    synced: list[int] = []  # the file's size at each fsync of the month's file

    def fsync(fd: int) -> None:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            synced.append(os.fstat(fd).st_size)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    at = "2026-12-06T10:00:00Z"
    path = month_file(tmp_path, "2026-12")
    ledger = UsageLedger(tmp_path)
    for i in range(20):
        await ledger.record(
            CallRecord(f"r{i}", at, "cli:t", "turn", "m", "e", i, 1, 0, False, None, None)
        )
        assert len(path.read_bytes().splitlines()) == i + 1
    assert len(synced) <= 1  # the first record's, at most: the others wait for the next
    await ledger.flush()
    assert synced[-1] == path.stat().st_size  # every record synced
    assert ledger._flusher is not None and ledger._flusher.done() and ledger._wake is None
    count = len(synced)
    await ledger.flush()  # nothing new: no fsync
    await ledger.aclose()
    assert len(synced) == count


async def test_prices_given_by_a_reload_price_the_next_calls(tmp_path: Path, llm: FakeLLM) -> None:
    from bot.service.reload import apply_config

    async with harness(tmp_path, llm) as h:
        await h.ask("before")
        new = make_config(tmp_path, llm.base_url, llm={"prices": {"fake-model": PRICE}})
        assert apply_config(h.cfg, new, h.stack, channels=[]).applied == ["llm.prices"]
        await h.ask("after")
    before, after = ledger(tmp_path)
    assert "cost" not in before  # recorded as it was priced then
    assert after["cost"] > 0 and after["currency"] == "USD"


def test_usage_refuses_a_window_that_ends_before_it_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path, "http://127.0.0.1:9/v1")
    args = ["--config", str(config), "usage", "--since", "2026-12-05", "--until", "2026-12-01"]
    assert main(args) == 2
    assert "--since 2026-12-05 is after --until 2026-12-01" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        main(["--config", str(config), "usage", "--since", "last tuesday"])
    assert stop.value.code == 2


def test_status_says_when_the_ledger_cannot_be_read(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, "http://127.0.0.1:9/v1")
    month = datetime.now(UTC).strftime("%Y-%m")
    month_file(cfg.agent.state_path, month).mkdir(parents=True)  # a folder where a file goes
    line = dict(status_rows(cfg, tmp_path / "config.json"))["usage"]
    assert line.startswith("cannot read the usage ledger") and month in line


async def test_a_ledger_locked_by_another_process_does_not_stall_the_event_loop(
    tmp_path: Path,
) -> None:
    """Another memobot process (``memobot dream``, stopped with Ctrl-Z mid-append) holding the
    month's flock: the record waits in a worker thread, not on the gateway's event loop."""
    import fcntl
    import os
    import threading

    at = "2026-12-06T10:00:00Z"
    first = CallRecord("r0", at, "cli:t", "turn", "m", "e", 1, 1, 0, False, None, None)
    second = first._replace(id="r1")
    path = month_file(tmp_path, "2026-12")
    ledger = UsageLedger(tmp_path)
    await ledger.record(first)  # the file is open and warm: the next write is on the loop
    fd = os.open(path, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another open file: its flock excludes the ledger's
    # Only when the loop is stalled (the test fails then): let it go on after a second.
    unstall = threading.Timer(1.0, fcntl.flock, (fd, fcntl.LOCK_UN))
    unstall.start()
    try:
        waiting = asyncio.create_task(ledger.record(second))
        for _ in range(5):
            await asyncio.sleep(0)
        assert not waiting.done()  # waiting in a worker thread; this loop ran on meanwhile
        fcntl.flock(fd, fcntl.LOCK_UN)
        await waiting
    finally:
        unstall.cancel()
        os.close(fd)
    await ledger.aclose()
    assert path.read_bytes() == first.line() + second.line()


def test_a_ledger_file_that_is_a_fifo_or_a_link_is_refused_never_used(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A FIFO in place of a month's file must not hang the read (the gateway's start reads
    this month) nor take records; a symlink is not followed, to read or to write."""
    import os
    import threading

    at = "2026-12-06T10:00:00Z"
    rec = CallRecord("r0", at, "cli:t", "turn", "m", "e", 1, 1, 0, False, None, None)
    window = ("2026-12-01T00:00:00Z", "2027-01-01T00:00:00Z")
    path = month_file(tmp_path, "2026-12")
    path.parent.mkdir()
    os.mkfifo(path)
    result: dict[str, Any] = {}

    def read() -> None:
        try:
            result["records"] = list(read_records(tmp_path, *window))
        except OSError as exc:
            result["error"] = exc

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(2)
    if reader.is_alive():  # it hangs in open() (the test fails): a writer lets it go
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        reader.join()
    assert "not a regular file" in str(result.get("error"))
    asyncio.run(_record(tmp_path, rec))
    assert "cannot write 1 record(s)" in caplog.text

    path.unlink()
    elsewhere = tmp_path / "elsewhere.jsonl"
    elsewhere.write_bytes(b"")
    path.symlink_to(elsewhere)
    caplog.clear()
    asyncio.run(_record(tmp_path, rec))
    assert "cannot write 1 record(s)" in caplog.text and elsewhere.read_bytes() == b""
    with pytest.raises(OSError):
        list(read_records(tmp_path, *window))


async def _record(state: Path, rec: CallRecord) -> None:
    ledger = UsageLedger(state)
    await ledger.record(rec)
    await ledger.aclose()


@pytest.mark.parametrize(
    ("section", "field"),
    [
        ({"budget": {"daily": {"cost": 1e309}}}, "budget.daily.cost"),
        ({"llm": {"prices": {"gpt-4o": {**PRICE, "output": 1e309}}}}, "llm.prices.gpt-4o.output"),
    ],
)
def test_an_infinite_price_or_cost_limit_is_a_config_error(
    section: dict[str, Any], field: str
) -> None:
    """1e309 in JSON reads as infinity: no limit that could be reached, a cost no call has."""
    with pytest.raises(ConfigError, match=field.replace(".", r"\.") + ": Input should be a finite"):
        parse_config(section)
