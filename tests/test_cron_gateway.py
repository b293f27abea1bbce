"""Scheduled jobs through the real gateway process, the real python-telegram-bot against the
fake Bot API, and the fake LLM: jobs fire once, survive SIGKILL at every point around the due
moment, fire late after downtime, follow the command line while running; the heartbeat speaks
only when there is something to tell."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from bot.cron.schedule import Schedule
from bot.cron.store import JobStore, new_job
from tests.fakes.llm_server import FakeLLM, FakeLLMThread, call, reply, tool_step
from tests.fakes.telegram_api import FakeBotAPI
from tests.helpers import config_dict, run_memobot
from tests.helpers.gateway import Gateway, wait_log

ALICE = 1001
HELLO = "hello"
KEY = f"telegram:{ALICE}"


@pytest.fixture
def llm() -> Iterator[FakeLLMThread]:
    with FakeLLM.start_in_thread() as server:
        yield server


@pytest.fixture
def api() -> Iterator[Any]:
    with FakeBotAPI.start_in_thread() as server:
        # Telegram lets a bot write only to people who wrote to it first: Alice has. Her
        # message is answered by the fake LLM's echo when the gateway starts.
        server.private_text(HELLO, user_id=ALICE)
        yield server


@pytest.fixture
def config(tmp_path: Path, llm: FakeLLMThread, api: Any) -> Path:
    return write(tmp_path, llm, api)


def write(tmp_path: Path, llm: FakeLLMThread, api: Any, **sections: dict[str, Any]) -> Path:
    telegram = {
        "enabled": True,
        "token": api.token,
        "baseUrl": api.base_url,
        "allowFrom": [str(ALICE)],
        "pollTimeoutSeconds": 1,
    }
    sections.setdefault("heartbeat", {"intervalMinutes": 0})
    data = config_dict(tmp_path, llm.base_url, channels={"telegram": telegram}, **sections)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    return path


def texts(api: Any) -> list[str]:
    """What Alice got, but the answer to her first hello."""
    return [t for c in api.sent(ALICE) if (t := c.params.get("text", "")) != f"echo: {HELLO}"]


def wait_text(api: Any, text: str, timeout: float = 15) -> None:
    api.wait_for(lambda: any(text in t for t in texts(api)), timeout)


def soon(seconds: float) -> str:
    """A local (UTC) ISO date-time ``seconds`` from now, for ``--at``. A job added with the
    command line is due 5 s ahead: one more process start takes seconds on a loaded machine."""
    return (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat(timespec="milliseconds")[:-6]


def cron(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    done = run_memobot("cron", *args, config=config, timeout=30)
    assert done.returncode == 0, done.stderr
    return done


def add_text(config: Path, text: str, seconds: float) -> str:
    """Add a --text job due ``seconds`` from now (the command takes a moment under load)."""
    out = cron(config, "add", "--at", soon(seconds), "--tz", "UTC", "-s", KEY, "-m", text, "--text")
    return out.stdout.split()[0]


def add_job(config: Path, text: str, seconds: float) -> str:
    """A --text job due ``seconds`` from now, written to the store as ``cron add`` does (without
    the start-up time of one more process)."""
    at = datetime.now(UTC) + timedelta(seconds=seconds)
    schedule = Schedule.make(at=at.isoformat(), tz="UTC")
    job = JobStore(config.parent / "state").update(
        lambda jobs: new_job(
            jobs,
            session=KEY,
            message=text,
            schedule=schedule,
            now=datetime.now(UTC),
            deliver="text",
            by_admin=True,
            is_group=False,
        )
    )
    return job.id


def due_of(config: Path, job_id: str) -> float:
    """The job's due moment as a wall-clock timestamp."""
    job = JobStore(config.parent / "state").load().get(job_id)
    assert job is not None and job.next_moment is not None
    return job.next_moment.timestamp()


def test_cli_jobs_reach_a_running_gateway_and_text_job_fires_once(config: Path, api: Any) -> None:
    gw = Gateway(config)
    try:
        gw.wait_running()
        hourly = cron(config, "add", "--every", "3600", "-s", KEY, "-m", "stand up").stdout.split()[
            0
        ]
        wait_log(gw.log, f"store changed: 1 job(s), next {hourly}", 10, gw.proc)
        # Far enough ahead for four commands on a loaded machine; once the gateway has
        # dropped it (logged), it cannot fire (the clock-driven test goes past its time).
        doomed = add_text(config, "never sent", 12)
        listed = cron(config, "list").stdout.splitlines()
        assert [line.split()[0] for line in listed] == [doomed, hourly]
        assert KEY in listed[0] and "never sent" in listed[0] and "next:" in listed[0]
        assert f"2 job(s); next: {doomed}" in run_memobot("status", config=config).stdout
        cron(config, "remove", doomed)
        wait_log(gw.log, f"store changed: 1 job(s), next {hourly}", 10, gw.proc, count=2)
        add_text(config, "call mum", 5)
        wait_text(api, "call mum")
        time.sleep(1.5)  # long enough for a second copy to arrive
    finally:
        gw.stop()
    assert texts(api).count("call mum") == 1, texts(api)
    assert "never sent" not in texts(api)
    # The one-off is gone once fired; the hourly job stays.
    listed = cron(config, "list").stdout
    assert [line.split()[0] for line in listed.splitlines()] == [hourly], (
        listed,
        gw.log.read_text(),
    )


def test_agent_job_answer_arrives(config: Path, api: Any, llm: FakeLLMThread) -> None:
    llm.script(reply("Time to stretch!", when_user_contains="remind me to stretch"))
    gw = Gateway(config)
    try:
        gw.wait_running()
        cron(config, "add", "--at", soon(5), "--tz", "UTC", "-s", KEY, "-m", "remind me to stretch")

        wait_text(api, "Time to stretch!")
        time.sleep(1)
    finally:
        gw.stop()
    assert texts(api) == ["Time to stretch!"]
    [request] = [r for r in llm.requests if "stretch" in json.dumps(r["body"]["messages"])]
    task = request["body"]["messages"][-1]["content"]
    assert task.startswith("[scheduled task ") and "remind me to stretch" in task


def test_model_adds_lists_and_removes_jobs_with_the_tool(
    config: Path, api: Any, llm: FakeLLMThread, tmp_path: Path
) -> None:
    """Alice is an admin: her chat may schedule a job every 2 s (others: at least 60 s)."""
    store = JobStore(tmp_path / "state")
    llm.script(
        tool_step(
            call("cron", {"action": "add", "message": "drink water", "every_seconds": 3600}),
            call(
                "cron",
                {"action": "add", "message": "tea", "every_seconds": 2, "deliver": "text"},
            ),
            when_user_contains="remind me",
        ),
        reply("Both scheduled.", when_user_contains="remind me"),
    )
    gw = Gateway(config)
    try:
        api.private_text("remind me", user_id=ALICE)
        wait_text(api, "Both scheduled.")
        tea = next(j for j in store.load().jobs if j.message == "tea")
        wait_text(api, "tea")
        llm.script(
            tool_step(call("cron", {"action": "list"}), when_user_contains="stop the tea"),
            tool_step(
                call("cron", {"action": "remove", "job_id": tea.id}),
                when_user_contains="stop the tea",
            ),
            reply("Removed it.", when_user_contains="stop the tea"),
        )
        api.private_text("what is scheduled? stop the tea", user_id=ALICE)
        wait_text(api, "Removed it.")
        teas = texts(api).count("tea")
        time.sleep(3)  # more than one period: no tea after the removal
    finally:
        gw.stop()
    assert texts(api).count("tea") == teas
    results = [
        m["content"] for r in llm.requests for m in r["body"]["messages"] if m.get("role") == "tool"
    ]
    assert any(f"Scheduled job {tea.id}: every 2 s; next run" in t for t in results), results
    assert any("drink water" in t and "every 1 h" in t and tea.id in t for t in results)
    assert any(t.startswith(f"Removed job {tea.id}") for t in results), results
    assert [j.message for j in store.load().jobs] == ["drink water"]


# A SIGKILL at each point of an occurrence's way: recorded in the store, taken by intake (a
# pending turn) but the job not moved on, its answer in the ledger but not sent. After the
# restart the chat shows the reminder exactly once.
@pytest.mark.parametrize("failpoint", ["cron_recorded", "cron_published", "before_delivery"])
def test_sigkill_at_the_due_moment_then_restart_delivers_once(
    config: Path, api: Any, failpoint: str
) -> None:
    add_job(config, "pay rent", 2)
    first = Gateway(config, failpoints=failpoint)
    try:
        assert first.proc.wait(20) == -signal.SIGKILL
    finally:
        first.kill()
    second = Gateway(config)
    try:
        wait_text(api, "pay rent")
        time.sleep(1.5)
    finally:
        second.stop()
    assert texts(api).count("pay rent") == 1, (texts(api), first.log.read_text())
    assert "No scheduled jobs." in cron(config, "list").stdout


@pytest.mark.parametrize("kill_after", [-0.7, 0.6])
def test_sigkill_just_before_or_after_the_due_moment(
    config: Path, api: Any, kill_after: float
) -> None:
    due = due_of(config, add_job(config, "water plants", 4))
    first = Gateway(config)
    try:
        first.wait_running()
        time.sleep(max(0.0, due + kill_after - time.time()))
        first.kill()
    finally:
        first.kill()
    time.sleep(max(0.0, due + 0.5 - time.time()))  # restart after the due moment
    second = Gateway(config)
    try:
        wait_text(api, "water plants")
        time.sleep(1.5)
    finally:
        second.stop()
    assert texts(api).count("water plants") == 1, texts(api)


def test_missed_while_down_fires_once_late_and_too_old_is_skipped(
    config: Path, api: Any, tmp_path: Path
) -> None:
    store = JobStore(tmp_path / "state")
    now = datetime.now(UTC)

    def job(message: str, ago: timedelta, **when: Any) -> None:
        schedule = Schedule.make(tz="UTC", **when)
        store.update(
            lambda jobs: new_job(
                jobs,
                session=KEY,
                message=message,
                schedule=schedule,
                now=now - ago - timedelta(minutes=1),
                deliver="text",
            )
        )

    job("five minutes ago", timedelta(minutes=5), at=(now - timedelta(minutes=5)).isoformat())
    job("two days ago", timedelta(days=2), at=(now - timedelta(days=2)).isoformat())
    job("hourly", timedelta(minutes=10), every_seconds=60)  # ten runs missed
    gw = Gateway(config)
    try:
        wait_text(api, "five minutes ago")
        wait_text(api, "hourly")
        wait_log(gw.log, "skipped and the one-off job removed", 10, gw.proc)
        time.sleep(1.5)
    finally:
        gw.stop()
    sent = texts(api)
    assert len(sent) == 2, sent
    assert any(t.startswith("[late: was due at ") and "five minutes ago" in t for t in sent)
    assert sum("hourly" in t for t in sent) == 1  # once, not once per missed run
    [left] = store.load().jobs
    assert left.message == "hourly" and left.next_moment > datetime.now(UTC)


def test_heartbeat_speaks_only_when_there_is_something_to_tell(
    tmp_path: Path, api: Any, llm: FakeLLMThread
) -> None:
    config = write(tmp_path, llm, api, heartbeat={"intervalMinutes": 0.03})  # 1.8 s
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "HEARTBEAT.md").write_text("# Heartbeat\n- [ ] check the build\n")
    beat = "[heartbeat]"
    llm.script(
        reply("HEARTBEAT_OK", when_user_contains=beat),
        reply("The build is red.", when_user_contains=beat),
    )
    gw = Gateway(config)
    try:
        wait_text(api, "The build is red.", timeout=20)
        time.sleep(0.5)
    finally:
        gw.stop()
    assert texts(api) == ["The build is red."]  # to the admin's private chat, once
    beats = [r for r in llm.requests if "[heartbeat]" in json.dumps(r["body"]["messages"])]
    assert len(beats) >= 2


def test_heartbeat_answer_killed_before_delivery_is_delivered_once(
    tmp_path: Path, api: Any, llm: FakeLLMThread
) -> None:
    """The heartbeat's answer lives in its own session's outbox, addressed to Alice's chat: a
    SIGKILL between the ledger write and the send (third final answer: hello, the first
    HEARTBEAT_OK, then this one) still gets it to her exactly once after the restart."""
    config = write(tmp_path, llm, api, heartbeat={"intervalMinutes": 0.03})
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "HEARTBEAT.md").write_text("- [ ] check the disk\n")
    beat = "[heartbeat]"
    llm.script(
        reply("HEARTBEAT_OK", when_user_contains=beat),
        reply("The disk is full.", when_user_contains=beat),
        *[reply("HEARTBEAT_OK", when_user_contains=beat) for _ in range(20)],
    )
    first = Gateway(config, failpoints="before_delivery@3")
    try:
        assert first.proc.wait(30) == -signal.SIGKILL
    finally:
        first.kill()
    assert texts(api) == []
    second = Gateway(config)
    try:
        wait_text(api, "The disk is full.")
        time.sleep(2.5)  # more heartbeats run (nothing to tell); no second copy
    finally:
        second.stop()
    assert texts(api) == ["The disk is full."]
