"""Scheduled jobs, the logic with an injected clock: time zones and daylight saving, the store,
and the scheduler's exactly-once hand-over to the real intake (AgentLoop.accept)."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from bot.app import build_agent
from bot.bus import InboundMessage
from bot.cron import heartbeat
from bot.cron.schedule import Schedule, ScheduleError, from_iso, to_iso
from bot.cron.scheduler import CRON_KEY, HEARTBEAT_KEY, Scheduler
from bot.cron.store import JobStore, new_job
from tests.helpers import T0, Clock, make_config, run_memobot, write_config

BERLIN = ZoneInfo("Europe/Berlin")
KEY = "telegram:1001"


def local_runs(schedule: Schedule, start: datetime, n: int) -> list[datetime]:
    """``n`` consecutive occurrences, each computed from the previous one as the scheduler
    does after firing it, in Berlin time."""
    runs, occurrence = [], schedule.first_run(start)
    for _ in range(n):
        runs.append(occurrence.astimezone(BERLIN))
        nxt = schedule.next_after(occurrence, occurrence)
        assert nxt is not None
        occurrence = nxt
    return runs


@pytest.mark.parametrize(
    ("day", "expr", "expected"),
    [
        # Spring forward (02:00 -> 03:00): 02:30 does not exist that day; it runs once, 03:00.
        ("2026-03-27", "30 2 * * *", ["28 02:30", "29 03:00", "30 02:30", "31 02:30"]),
        ("2026-03-27", "0 9 * * *", ["28 09:00", "29 09:00", "30 09:00", "31 09:00"]),
        # Fall back (03:00 -> 02:00): 02:30 happens twice that day; it runs once.
        ("2026-10-23", "30 2 * * *", ["24 02:30", "25 02:30", "26 02:30", "27 02:30"]),
        ("2026-10-23", "0 9 * * *", ["24 09:00", "25 09:00", "26 09:00", "27 09:00"]),
    ],
)
def test_daily_job_neither_skips_nor_doubles_across_dst(
    day: str, expr: str, expected: list[str]
) -> None:
    schedule = Schedule.make(cron_expr=expr, tz="Europe/Berlin")
    start = datetime.fromisoformat(f"{day}T12:00").replace(tzinfo=BERLIN)
    runs = local_runs(schedule, start, 4)
    assert [f"{r:%d %H:%M}" for r in runs] == expected
    # One run per calendar day, 24 h apart in wall time except across the change.
    assert len({r.date() for r in runs}) == 4


def test_fall_back_repeated_hour_runs_the_job_once() -> None:
    """From inside the repeated hour (second pass, fold=1), the next 02:30 is the next day's."""
    schedule = Schedule.make(cron_expr="30 2 * * *", tz="Europe/Berlin")
    first_pass = datetime(2026, 10, 25, 0, 30, tzinfo=UTC)  # 02:30 CEST
    nxt = schedule.next_after(first_pass, first_pass + timedelta(hours=1))  # 02:30 CET
    assert nxt is not None
    assert f"{nxt.astimezone(BERLIN):%Y-%m-%d %H:%M %Z}" == "2026-10-26 02:30 CET"


def test_at_is_local_to_its_zone_and_past_is_refused() -> None:
    schedule = Schedule.make(at="2026-12-24T09:00", tz="Europe/Berlin")
    assert to_iso(schedule.at_moment()) == "2026-12-24T08:00:00Z"
    with pytest.raises(ScheduleError, match="in the past"):
        schedule.first_run(datetime(2026, 12, 24, 9, tzinfo=UTC))
    with pytest.raises(ScheduleError, match="exactly one"):
        Schedule.make(at="2026-12-24T09:00", every_seconds=60, tz="UTC")
    with pytest.raises(ScheduleError, match="5 fields"):
        Schedule.make(cron_expr="* * * * * *", tz="UTC")
    with pytest.raises(ScheduleError, match="not valid"):
        Schedule.make(cron_expr="61 * * * *", tz="UTC")
    with pytest.raises(ScheduleError, match="unknown time zone"):
        Schedule.make(every_seconds=60, tz="Mars/Olympus")


def test_every_keeps_its_grid_and_skips_missed_runs() -> None:
    schedule = Schedule.make(every_seconds=60, tz="UTC")
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    # Ten minutes and a bit missed: one next run, on the grid, after now.
    nxt = schedule.next_after(t0, t0 + timedelta(minutes=10, seconds=5))
    assert nxt == t0 + timedelta(minutes=11)


def test_heartbeat_open_tasks_and_sentinel() -> None:
    text = (Path(__file__).parents[1] / "workspace_template" / "HEARTBEAT.md").read_text()
    assert heartbeat.open_tasks(text) == []  # the template's examples are commented out
    assert heartbeat.open_tasks("# T\n- [ ] a\n- [x] b\n* c\nprose\n<!-- - [ ] d -->") == [
        "a",
        "c",
    ]
    assert heartbeat.worth_telling("HEARTBEAT_OK") is None
    assert heartbeat.worth_telling("**HEARTBEAT_OK**.") is None
    assert heartbeat.worth_telling("The build is red.") == "The build is red."
    assert heartbeat.worth_telling("HEARTBEAT_OK\nbut the disk is full") == "but the disk is full"


# -- the scheduler against the real intake ---------------------------------------------------


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[tuple[Scheduler, Any, Clock, JobStore]]:
    """A scheduler on a fake clock, handing over to the real agent loop's intake (nothing
    consumes the queue: what is queued and what is pending on disk are the result)."""
    cfg = make_config(
        tmp_path,
        "http://127.0.0.1:9/v1",
        cron={"maxLateMinutes": 60},
        heartbeat={"intervalMinutes": 30, "deliverTo": KEY},
    )
    stack = build_agent(cfg, tmp_path / "config.json")
    clock = Clock(T0)
    store = JobStore(cfg.agent.state_path)
    sched = Scheduler(cfg, store, stack.bus, stack.store, {"telegram"}, clock=clock)
    try:
        yield sched, stack, clock, store
    finally:
        await stack.close()


def queued(stack: Any) -> list[InboundMessage]:
    out = []
    while not stack.bus.inbound.empty():
        out.append(stack.bus.inbound.get_nowait())
    return out


def add(store: JobStore, now: datetime, **kw: Any) -> str:
    deliver = kw.pop("deliver", "agent")
    schedule = Schedule.make(tz="Europe/Berlin", **kw)
    return store.update(
        lambda jobs: new_job(
            jobs, session=KEY, message="call mum", schedule=schedule, now=now, deliver=deliver
        )
    ).id


async def test_job_fires_once_when_due_and_one_off_is_removed(rig: Any) -> None:
    sched, stack, clock, store = rig
    job_id = add(store, T0, at="2026-03-01T09:00:05", deliver="text")  # 08:00:05 UTC
    later = add(store, T0, every_seconds=3600)  # not due: must be left as it is
    await sched.tick()
    assert queued(stack) == []
    clock.now = T0 + timedelta(seconds=5)
    await sched.tick()
    await sched.tick()
    [msg] = queued(stack)
    assert msg.message_id == f"cron:{job_id}:20260301T080005Z"
    assert msg.session_key == KEY and msg.text == "call mum"
    assert msg.metadata[CRON_KEY]["deliver"] == "text" and not msg.metadata[CRON_KEY]["late"]
    [left] = store.load().jobs  # a one-off is gone once intake has it
    assert left.id == later and left.next_run == "2026-03-01T09:00:00Z" and not left.firing
    pending = stack.store.get(KEY).metadata["pending"]
    assert [p["id"] for p in pending] == [msg.message_id]


async def test_recorded_occurrence_is_published_again_and_deduplicated(rig: Any) -> None:
    """The crash windows: recorded but not published (published at the next start), and
    published but not moved on (intake answers "duplicate": still exactly one turn)."""
    sched, stack, clock, store = rig
    job_id = add(store, T0, every_seconds=60)
    clock.now = T0 + timedelta(seconds=60)
    mid = f"cron:{job_id}:20260301T080100Z"

    def record(jobs: Any) -> None:
        jobs.get(job_id).firing = {"due": "2026-03-01T08:01:00Z", "message_id": mid}

    store.update(record)  # as if killed right after recording
    await sched.tick()
    assert [m.message_id for m in queued(stack)] == [mid]
    job = store.load().get(job_id)
    assert job.firing is None and job.next_run == "2026-03-01T08:02:00Z"
    store.update(record)  # as if killed after intake took it, before the job moved on
    await sched.tick()
    assert queued(stack) == []  # intake recognised the id
    assert store.load().get(job_id).firing is None
    assert [p["id"] for p in stack.store.get(KEY).metadata["pending"]] == [mid]


async def test_missed_runs_fire_once_late_then_too_late_is_skipped(
    rig: Any, caplog: pytest.LogCaptureFixture
) -> None:
    sched, stack, clock, store = rig
    job_id = add(store, T0, every_seconds=600)
    clock.now = T0 + timedelta(minutes=45, seconds=1)  # four runs missed while down
    await sched.tick()
    [msg] = queued(stack)
    assert msg.metadata[CRON_KEY]["late"] and "[late: was due at Sun 1 Mar 2026 09:10" in msg.text
    assert store.load().get(job_id).next_run == "2026-03-01T08:50:00Z"
    # Finish that turn, then go down for longer than cron.maxLateMinutes (60).
    stack.store.append(stack.store.get(KEY), metadata={"pending": None})
    clock.now = T0 + timedelta(hours=5)
    with caplog.at_level(logging.WARNING):
        await sched.tick()
    assert queued(stack) == []
    assert "more than cron.maxLateMinutes" in caplog.text
    assert from_iso(store.load().get(job_id).next_run) > clock.now


async def test_a_job_waits_while_its_previous_run_is_pending(rig: Any) -> None:
    sched, stack, clock, store = rig
    add(store, T0, every_seconds=60)
    clock.now = T0 + timedelta(seconds=60)
    await sched.tick()
    assert len(queued(stack)) == 1
    clock.now = T0 + timedelta(seconds=120)
    await sched.tick()
    assert queued(stack) == []  # the first run is still pending: no stacking
    stack.store.append(stack.store.get(KEY), metadata={"pending": None})  # it finished
    await sched.tick()
    assert len(queued(stack)) == 1


async def test_cli_style_change_is_noticed_and_removed_job_never_fires(rig: Any) -> None:
    sched, stack, clock, store = rig
    await sched.tick()
    job_id = add(store, T0, every_seconds=60)
    await sched.tick()
    assert sched.snapshot()["jobs"] == 1
    store.update(lambda jobs: jobs.jobs.remove(jobs.get(job_id)))
    clock.now = T0 + timedelta(minutes=5)
    await sched.tick()
    assert queued(stack) == [] and sched.snapshot()["jobs"] == 0


async def test_heartbeat_runs_only_with_open_tasks(rig: Any) -> None:
    sched, stack, clock, _store = rig
    ws = stack.loop.cfg.agent.workspace_path
    await sched.tick()  # sets the first tick 30 min ahead
    clock.now = T0 + timedelta(minutes=31)
    await sched.tick()
    assert queued(stack) == []  # the template has no open task
    (ws / "HEARTBEAT.md").write_text("- [ ] check the build\n")
    clock.now = T0 + timedelta(minutes=61)
    await sched.tick()
    [msg] = queued(stack)
    assert msg.session_key == heartbeat.SESSION
    assert msg.message_id == "heartbeat:20260301T090000Z"
    assert msg.metadata[HEARTBEAT_KEY]["deliver_to"] == KEY
    assert "check the build" in msg.text and "HEARTBEAT_OK" in msg.text


def test_store_write_is_atomic_json(tmp_path: Path) -> None:
    store = JobStore(tmp_path)
    add(store, T0, cron_expr="0 8 * * 1")
    data = json.loads(store.path.read_text())
    assert data["version"] == 1 and data["jobs"][0]["schedule"]["cron_expr"] == "0 8 * * 1"
    assert not list(store.folder.glob(".*.tmp"))
    assert oct(store.path.stat().st_mode & 0o777) == "0o600"


# -- the tool's limits -------------------------------------------------------------------------


async def test_tool_limits_per_chat_and_for_non_admins(tmp_path: Path) -> None:
    from bot.config import CronConfig
    from bot.kinds import Sender
    from bot.tools.base import ToolContext, ToolError
    from bot.tools.cron import CronTool

    store = JobStore(tmp_path)
    tool = CronTool(store, CronConfig(max_jobs_per_chat=2), "Europe/Berlin")

    def ctx(admin: bool, key: str = KEY, group: bool = False) -> ToolContext:
        channel, _, chat = key.partition(":")
        return ToolContext(
            tmp_path,
            channel=channel,
            chat_id=chat,
            session_key=key,
            sender=Sender("7", is_admin=admin, is_group=group),
        )

    fast = {"action": "add", "message": "ping", "every_seconds": 5}
    with pytest.raises(ToolError, match="at least 60"):
        await tool.run(fast, ctx(admin=False))
    answer = await tool.run(fast, ctx(admin=True))
    assert answer.startswith("Scheduled job ") and "every 5 s; next run" in answer
    await tool.run({"action": "add", "message": "x", "cron_expr": "0 8 * * 1"}, ctx(True))
    with pytest.raises(ToolError, match="maxJobsPerChat"):
        await tool.run({"action": "add", "message": "y", "every_seconds": 60}, ctx(True))
    # Another chat has its own quota and sees only its own jobs; it cannot remove ours.
    other = "telegram:2002"
    await tool.run({"action": "add", "message": "z", "every_seconds": 60}, ctx(False, other))
    assert "ping" not in await tool.run({"action": "list"}, ctx(False, other))
    ours = store.load().of_session(KEY)[0].id
    with pytest.raises(ToolError, match="no job"):
        await tool.run({"action": "remove", "job_id": ours}, ctx(False, other))
    with pytest.raises(ToolError, match="only an admin"):
        await tool.run({"action": "list", "all": True}, ctx(False, other))
    assert "ping" in await tool.run({"action": "list", "all": True}, ctx(True))
    with pytest.raises(ToolError, match="private chat"):  # not into a group, even an admin's
        await tool.run({"action": "list", "all": True}, ctx(True, "telegram:-100", group=True))
    # The terminal cannot receive scheduled jobs.
    with pytest.raises(ToolError, match="terminal"):
        await tool.run(fast, ctx(True, "cli:direct"))


async def test_many_jobs_due_at_once_fire_in_two_store_writes(
    rig: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    sched, stack, clock, store = rig
    for n in range(50):
        store.update(
            lambda jobs, n=n: new_job(
                jobs,
                session=f"telegram:{3000 + n}",
                message=f"job {n}",
                schedule=Schedule.make(every_seconds=60, tz="UTC"),
                now=T0,
            )
        )
    await sched.tick()
    writes: list[int] = []
    real_write = store._write
    monkeypatch.setattr(store, "_write", lambda text: (writes.append(1), real_write(text)))
    clock.now = T0 + timedelta(seconds=60)
    await sched.tick()
    assert len(queued(stack)) == 50
    assert len(writes) == 2  # recorded together, moved on together
    assert {j.next_run for j in store.load().jobs} == {"2026-03-01T08:02:00Z"}


async def test_cron_chat_command_lists_this_chats_jobs(tmp_path: Path) -> None:
    from tests.helpers import Harness

    cfg = make_config(tmp_path, "http://127.0.0.1:9/v1")
    store = JobStore(cfg.agent.state_path)
    now = datetime.now(UTC)
    for key, text in (("cli:t", "water the plants"), ("cli:other", "not yours")):
        store.update(
            lambda jobs, key=key, text=text: new_job(
                jobs,
                session=key,
                message=text,
                schedule=Schedule.make(cron_expr="0 8 * * 1", tz="Europe/Berlin"),
                now=now,
            )
        )
    async with Harness(cfg, tmp_path / "config.json") as h:
        answer = await h.ask("/cron")
        empty = await h.ask("/cron", chat="nobody")
    assert answer.startswith("Scheduled jobs in this chat:")
    assert "water the plants" in answer and "cron '0 8 * * 1' (Europe/Berlin)" in answer
    assert "not yours" not in answer
    assert empty == "No scheduled jobs in this chat."


def test_runtime_block_is_in_agent_timezone(tmp_path: Path) -> None:
    from bot.context import ContextBuilder

    builder = ContextBuilder(tmp_path, timezone=ZoneInfo("Pacific/Kiritimati"))  # UTC+14
    content = builder.user_message("hi", "cli", "t")["content"]
    assert "+14" in content or "LINT" in content, content


# -- `memobot cron add` refuses what would flood or wait for ever (issue 29) ---------------------


def _cron_add(capsys: pytest.CaptureFixture[str], config: Path, *args: str) -> tuple[int, str]:
    from bot.cli import main

    try:
        code = main(["--config", str(config), "cron", "add", *args])
    except SystemExit as exc:  # argparse refuses a bad argument with exit 2
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out + out.err


def test_cron_add_refuses_an_agent_job_every_few_seconds(tmp_path: Path, capsys) -> None:
    config = write_config(tmp_path, "http://127.0.0.1:9/v1")
    code, said = _cron_add(capsys, config, "--every", "5", "-s", "telegram:1", "-m", "check")
    assert code == 2
    assert "every 5 s" in said and "--every 60" in said and "--force" in said
    assert JobStore(tmp_path / "state").load().jobs == []
    for ok in (("--every", "5", "--force"), ("--every", "5", "--text"), ("--every", "60")):
        code, said = _cron_add(capsys, config, *ok, "-s", "telegram:1", "-m", "check")
        assert code == 0, said
    assert len(JobStore(tmp_path / "state").load().jobs) == 3


def test_cron_add_refuses_a_channel_memobot_does_not_have(tmp_path: Path) -> None:
    config = write_config(tmp_path, "http://127.0.0.1:9/v1")
    done = run_memobot(
        "cron", "add", "--every", "3600", "-s", "whatsapp:1", "-m", "x", config=config
    )
    assert done.returncode == 2
    assert "no channel 'whatsapp'" in done.stderr and "telegram, discord, slack" in done.stderr
    assert "Traceback" not in done.stderr
    assert JobStore(tmp_path / "state").load().jobs == []


def test_cron_add_for_a_channel_not_enabled_warns(tmp_path: Path, capsys) -> None:
    config = write_config(tmp_path, "http://127.0.0.1:9/v1")
    code, said = _cron_add(capsys, config, "--every", "3600", "-s", "cli:me", "-m", "x")
    assert code == 2 and "the terminal (cli) runs no scheduled jobs" in said
    code, said = _cron_add(capsys, config, "--every", "3600", "-s", "discord:5", "-m", "x")
    assert code == 0
    assert "warning: channel discord is not enabled (channels.discord.enabled" in said


async def test_a_heartbeat_with_no_chat_warns_once_and_only_when_it_has_tasks(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """It warned at every start until an admin was named, though it had nothing to do."""
    caplog.set_level(logging.WARNING, logger="bot.cron.scheduler")
    cfg = make_config(tmp_path, "http://127.0.0.1:9/v1", heartbeat={"intervalMinutes": 30})
    stack = build_agent(cfg, tmp_path / "config.json")
    clock = Clock(T0)
    sched = Scheduler(
        cfg, JobStore(cfg.agent.state_path), stack.bus, stack.store, set(), clock=clock
    )
    try:
        sched.start()
        await sched.stop()
        await sched.tick()
        assert [r.getMessage() for r in caplog.records] == []  # the template has no task
        (cfg.agent.workspace_path / "HEARTBEAT.md").write_text("- [ ] check the build\n")
        for minutes in (31, 32, 70, 200):
            clock.now = T0 + timedelta(minutes=minutes)
            await sched.tick()
        [warning] = [r.getMessage() for r in caplog.records]
        assert "HEARTBEAT.md has open tasks" in warning and "heartbeat.deliverTo" in warning
        assert queued(stack) == []
    finally:
        await stack.close()


async def test_a_heartbeat_told_to_deliver_to_a_channel_not_running_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="bot.cron.scheduler")
    cfg = make_config(tmp_path, "http://127.0.0.1:9/v1", heartbeat={"deliverTo": "discord:5"})
    stack = build_agent(cfg, tmp_path / "config.json")
    sched = Scheduler(cfg, JobStore(cfg.agent.state_path), stack.bus, stack.store, {"telegram"})
    try:
        sched.start()
        await sched.stop()
    finally:
        await stack.close()
    [warning] = [r.getMessage() for r in caplog.records]
    assert "heartbeat.deliverTo is discord:5" in warning and "channels.discord" in warning


def test_the_run_log_pairs_runs_with_their_outcome_and_stays_small(tmp_path, monkeypatch):
    from bot.cron import runs

    log = runs.RunLog(tmp_path)
    log.append("fired", "cron:a:1", job="a", session="telegram:1", intake="accepted")
    log.append("fired", "cron:b:now-x", job="b", session="telegram:2", manual=True)
    log.append("skipped", "cron:c:1", job="c", session="telegram:3")
    log.append("finished", "cron:a:1", outcome="failed")
    log.append("finished", "cron:unknown", outcome="ok")  # its start was trimmed away
    with open(log.path, "a", encoding="utf-8") as fh:
        fh.write('{"torn": ')  # a crash in the middle of a line: skipped when read
    log.append("fired", "cron:e:1", job="e", session="telegram:5")
    shown = {r.id: (r.job, r.manual, r.outcome) for r in log.recent()}
    assert shown == {
        "cron:a:1": ("a", False, "failed"),
        "cron:b:now-x": ("b", True, "running"),
        "cron:c:1": ("c", False, "skipped (late)"),
        "cron:e:1": ("e", False, "running"),  # the line after a torn one is whole
    }
    monkeypatch.setattr(runs, "TRIM_BYTES", 2000)
    for i in range(300):
        log.append("fired", f"cron:d:{i}", job="d", session="telegram:4")
    lines = log.path.read_text().splitlines()
    assert len(lines) <= runs.KEEP and lines[-1].endswith('"session": "telegram:4"}')
    assert [r.id for r in log.recent(2)] == ["cron:d:299", "cron:d:298"]
    assert all(json.loads(line) for line in lines)  # the torn line gone with the trim
