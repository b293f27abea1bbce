"""The panel's Schedule screen over real HTTP: jobs added, edited and removed through the
command line's own store (what ``memobot cron list`` prints), bad input refused at its field,
"run now" fired once through the scheduler however often the form is sent, and HEARTBEAT.md
edited through the workspace's one safe door (a planted link is refused, never followed)."""

from __future__ import annotations

import argparse
import asyncio
import html
import logging
import re
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest

from bot.config import load_config
from bot.cron import commands
from bot.cron.runs import RunLog
from bot.cron.schedule import Schedule, from_iso, to_iso
from bot.cron.scheduler import Scheduler
from bot.cron.store import JobStore, new_job
from tests.helpers import Harness, write_config
from tests.helpers.web import Browser, browsing, panel_section

NO_LLM = "http://127.0.0.1:9/v1"  # nothing here calls the model
CHAT = "telegram:1001"
RUN_FORM = re.compile(
    r'action="/schedule/run">.*?name="job_id" value="([0-9a-f]+)">'
    r'<input type="hidden" name="token" value="([^"]+)">'
)


def _config(tmp_path: Path) -> Any:
    config = write_config(tmp_path, NO_LLM, web=panel_section())
    cfg, _ = load_config(config)
    return cfg, config


def cron_list(cfg: Any, capsys: pytest.CaptureFixture[str]) -> str:
    """What ``memobot cron list --all`` prints (its own function, in this process)."""
    capsys.readouterr()
    assert commands.run(argparse.Namespace(cron_command="list", all=True), cfg) == 0
    return capsys.readouterr().out


def multipart(fields: dict[str, str]) -> Any:
    """``fields`` sent as the heartbeat's form sends them (multipart/form-data)."""
    data = aiohttp.FormData()
    for name, value in fields.items():
        data.add_field(name, value, content_type="text/plain")
    return data


async def _add(browser: Browser, **fields: str) -> tuple[int, str]:
    csrf = await browser.csrf("/schedule")
    status, text, _ = await browser.post("/schedule/add", {"csrf": csrf, **fields})
    return status, text


async def test_jobs_added_edited_and_removed_in_the_panel_are_the_command_lines(
    tmp_path, capsys, caplog
):
    caplog.set_level(logging.INFO)
    cfg, config = _config(tmp_path)
    store = JobStore(cfg.agent.state_path)
    async with browsing(cfg, config) as browser:
        await browser.login()
        status, _ = await _add(browser, session=CHAT, message="water <the> plants", every="3600")
        assert status == 303
        [job] = store.load().jobs
        assert (job.session, job.message, job.schedule.every_seconds) == (
            CHAT,
            "water <the> plants",
            3600,
        )
        assert job.by_admin and job.deliver == "agent"
        listed = cron_list(cfg, capsys)
        assert job.id in listed and "every 1 h" in listed and "water <the> plants" in listed
        _, page, _ = await browser.get("/schedule")
        assert f"Job {job.id} added" in page
        assert "Channel telegram is not enabled" in page  # as `memobot cron add` warns
        assert "water &lt;the&gt; plants" in page and "water <the>" not in page
        assert f"cron job {job.id} added by web session={CHAT}" in caplog.text

        # Edit: the same job (same id), a new schedule and kind.
        _, form, _ = await browser.get(f"/schedule/job/{job.id}")
        assert 'value="3600"' in form and "water &lt;the&gt; plants</textarea>" in form
        csrf = await browser.csrf(f"/schedule/job/{job.id}")
        edit = {"csrf": csrf, "session": CHAT, "message": "stretch", "cron": "0 8 * * 1"}
        status, _, r = await browser.post(f"/schedule/job/{job.id}", {**edit, "text": "1"})
        assert status == 303 and r.headers["Location"] == "/schedule"
        [edited] = store.load().jobs
        assert edited.id == job.id and edited.schedule.cron_expr == "0 8 * * 1"
        assert edited.message == "stretch" and edited.deliver == "text"
        assert "cron '0 8 * * 1'" in cron_list(cfg, capsys)
        assert f"cron job {job.id} edited by web" in caplog.text

        csrf = await browser.csrf("/schedule")
        status, _, _ = await browser.post("/schedule/remove", {"csrf": csrf, "job_id": job.id})
        assert status == 303
        assert store.load().jobs == []
        assert "No scheduled jobs." in cron_list(cfg, capsys)
        _, page, _ = await browser.get("/schedule")
        assert f"Job {job.id} removed" in page
        assert f"cron job {job.id} removed by web" in caplog.text


REFUSED = [
    ({"session": CHAT, "every": "30"}, "every", "at most once a minute"),
    ({"session": CHAT, "every": "ten"}, "every", "whole number of seconds"),
    ({"session": CHAT, "cron": "61 * * * *"}, "cron", "is not valid"),
    ({"session": CHAT, "cron": "0 8 * *"}, "cron", "must have 5 fields"),
    ({"session": CHAT, "at": "2001-01-01T09:00"}, "at", "is in the past"),
    ({"session": CHAT, "every": "3600", "tz": "Mars/Olympus"}, "tz", "unknown time zone"),
    ({"session": CHAT, "every": "3600", "cron": "0 8 * * *"}, "when", "exactly one"),
    ({"session": CHAT}, "when", "exactly one"),
    ({"session": "cli:me", "every": "3600"}, "session", "runs no scheduled jobs"),
    ({"session": "irc:me", "every": "3600"}, "session", "no channel 'irc'"),
    ({"session": "telegram", "every": "3600"}, "session", "expected a session key"),
    ({"session": CHAT, "every": "3600", "message": ""}, "message", "message is empty"),
]


async def test_bad_input_is_refused_at_its_field_and_what_was_typed_stays(tmp_path):
    cfg, config = _config(tmp_path)
    store = JobStore(cfg.agent.state_path)
    async with browsing(cfg, config) as browser:
        await browser.login()
        for fields, at_field, words in REFUSED:
            sent = {"message": "<b>stretch</b>", **fields}
            status, page = await _add(browser, **sent)
            assert status == 400, fields
            # The reason sits at its field: the input says so and points at it.
            error = re.search(rf'<span id="f-{at_field}-error"[^>]*>([^<]*)</span>', page)
            assert error and words in html.unescape(error.group(1)), (fields, page)
            if at_field != "when":
                assert re.search(
                    rf'id="f-{at_field}"[^>]*aria-invalid="true"'
                    rf'|aria-invalid="true"[^>]*aria-describedby="f-{at_field}-error"',
                    page,
                ), fields
            if sent["message"]:
                assert "&lt;b&gt;stretch&lt;/b&gt;</textarea>" in page  # kept, escaped
        assert store.load().jobs == []
        # What the command line lets through with --force, the panel does with its box.
        status, _ = await _add(browser, session=CHAT, message="x", every="30", force="1")
        assert status == 303 and store.load().jobs[0].schedule.every_seconds == 30


async def test_heartbeat_edits_go_through_the_workspace_door_and_a_planted_link_is_refused(
    tmp_path, caplog
):
    caplog.set_level(logging.INFO)
    cfg, config = _config(tmp_path)
    workspace = cfg.agent.workspace_path
    workspace.mkdir(parents=True, exist_ok=True)
    secret = tmp_path / "secret.txt"
    secret.write_text("the owner's secret\n")
    beat = workspace / "HEARTBEAT.md"
    beat.symlink_to(secret)  # the model can do this with one command
    async with browsing(cfg, config) as browser:
        await browser.login()
        _, page, _ = await browser.get("/schedule")
        assert "symbolic link" in page and "the owner's secret" not in page
        assert 'name="content"' not in page  # no editor for a link
        csrf = await browser.csrf("/schedule")
        for version in ("", "absent"):
            form = {"csrf": csrf, "content": "- [ ] pwned", "version": version}
            status, _, _ = await browser.post("/schedule/heartbeat", form)
            assert status == 303
            _, page, _ = await browser.get("/schedule")
            assert "Not saved" in page and "symbolic link" in page
        assert secret.read_text() == "the owner's secret\n" and beat.is_symlink()

        # A real file: saved when it is the version the page showed.
        beat.unlink()
        beat.write_text("- [ ] old task\n")
        _, page, _ = await browser.get("/schedule")
        version = re.search(r'name="version" value="([0-9a-f]+)"', page)
        assert version and "- [ ] old task" in page
        form = {"csrf": csrf, "content": "- [ ] water\r\n- [x] done\r\n", "version": version[1]}
        status, _, _ = await browser.post("/schedule/heartbeat", multipart(form))
        assert status == 303 and beat.read_text() == "- [ ] water\n- [x] done\n"
        assert "HEARTBEAT.md edited by web" in caplog.text
        # Sent again (or the model changed it meanwhile): not the version shown, not saved.
        status, _, _ = await browser.post("/schedule/heartbeat", {**form, "content": "- [ ] no"})
        _, page, _ = await browser.get("/schedule")
        assert "changed since the page was opened" in page
        assert beat.read_text() == "- [ ] water\n- [x] done\n"
        # A link planted between showing the page and saving it is refused too.
        _, page, _ = await browser.get("/schedule")
        version = re.search(r'name="version" value="([0-9a-f]+)"', page)
        assert version
        beat.unlink()
        beat.symlink_to(secret)
        form = {"csrf": csrf, "content": "- [ ] pwned", "version": version[1]}
        await browser.post("/schedule/heartbeat", form)
        assert secret.read_text() == "the owner's secret\n" and beat.is_symlink()


def _reminder(cfg: Any, text: str) -> str:
    """A text reminder for CHAT, hourly, first due in an hour: its id."""
    from datetime import UTC, datetime

    store = JobStore(cfg.agent.state_path)
    every = Schedule.make(every_seconds=3600, tz="UTC")
    now = datetime.now(UTC)
    return store.update(
        lambda jobs: (
            new_job(jobs, session=CHAT, message=text, schedule=every, now=now, deliver="text").id
        )
    )


async def test_run_now_fires_the_job_once_however_often_the_form_is_sent(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    cfg, config = _config(tmp_path)
    job_id = _reminder(cfg, "stand up and stretch")
    store = JobStore(cfg.agent.state_path)
    next_run = store.load().jobs[0].next_run
    async with Harness(cfg, config, channels=("telegram",)) as harness:
        stack = harness.stack
        scheduler = Scheduler(cfg, store, stack.bus, stack.store, {"telegram"})
        gateway = SimpleNamespace(stack=stack, scheduler=scheduler)
        async with browsing(cfg, config, gateway=gateway) as browser:
            await browser.login()
            _, page, _ = await browser.get("/schedule")
            found = RUN_FORM.search(page)
            assert found and found[1] == job_id
            form = {"csrf": await browser.csrf("/schedule"), "job_id": job_id, "token": found[2]}
            # A double click: two posts at once with the same request.
            await asyncio.gather(
                browser.post("/schedule/run", form), browser.post("/schedule/run", form)
            )

            def delivered() -> list[str]:
                return [m.text for m in harness.outbox if m.final and m.chat_id == "1001"]

            for _ in range(200):
                if delivered():
                    break
                await asyncio.sleep(0.02)
            # The form sent again later (a reload of the POST): nothing more.
            status, _, _ = await browser.post("/schedule/run", form)
            assert status == 303
            _, page, _ = await browser.get("/schedule")
            assert "already run for this request" in page
            await asyncio.sleep(0.2)
            assert delivered() == ["stand up and stretch"]
            [job] = store.load().jobs
            assert job.next_run == next_run and job.firing is None  # its schedule as it was
            [run] = RunLog(cfg.agent.state_path).recent()
            assert (run.job, run.manual, run.outcome) == (job_id, True, "ok")
            assert "(run now)" in page
            assert f"cron job {job_id} run now by web" in caplog.text


async def test_run_now_without_the_gateway_says_it_needs_it(tmp_path):
    cfg, config = _config(tmp_path)
    job_id = _reminder(cfg, "x")
    async with browsing(cfg, config) as browser:
        await browser.login()
        _, page, _ = await browser.get("/schedule")
        assert "Run now needs the gateway" in page and RUN_FORM.search(page) is None
        form = {"csrf": await browser.csrf("/schedule"), "job_id": job_id, "token": "a" * 16}
        await browser.post("/schedule/run", form)
        _, page, _ = await browser.get("/schedule")
        assert "Run now needs the gateway" in page
        assert JobStore(cfg.agent.state_path).load().jobs[0].firing is None


MANUAL = "cron:{}:now-resubmitted"


async def test_a_run_now_recorded_before_a_crash_fires_once_at_the_next_start(tmp_path):
    # The gateway died between recording the occurrence and handing it over: the next
    # start's first tick hands the same occurrence over, and the schedule stays as it was.
    cfg, config = _config(tmp_path)
    job_id = _reminder(cfg, "after the crash")
    store = JobStore(cfg.agent.state_path)

    def recorded(jobs: Any) -> str | None:
        job = jobs.get(job_id)
        # "Run now" a while after the job was made: its time is not on the job's grid.
        due = to_iso(from_iso(job.created_at) + timedelta(seconds=1234))
        job.firing = {"due": due, "message_id": MANUAL.format(job_id), "manual": True}
        return job.next_run

    next_run = store.update(recorded)
    async with Harness(cfg, config, channels=("telegram",)) as harness:
        stack = harness.stack
        scheduler = Scheduler(cfg, store, stack.bus, stack.store, {"telegram"})
        for _ in range(3):
            await scheduler.tick()
        for _ in range(200):
            if any(m.final for m in harness.outbox):
                break
            await asyncio.sleep(0.02)
        assert [m.text for m in harness.outbox if m.final] == ["after the crash"]
        [job] = store.load().jobs
        assert job.firing is None and job.next_run == next_run
        assert job.last_message_id == MANUAL.format(job_id)
        # The same request sent again after the restart: refused, nothing more.
        said = await scheduler.run_now(job_id, "resubmitted")
        assert "already run for this request" in said
        assert len([m for m in harness.outbox if m.final]) == 1


async def test_a_job_a_group_member_made_stays_theirs_until_its_message_is_rewritten(tmp_path):
    from datetime import UTC, datetime

    cfg, config = _config(tmp_path)
    store = JobStore(cfg.agent.state_path)
    hourly = Schedule.make(every_seconds=3600, tz="UTC")
    job_id = store.update(
        lambda jobs: (
            new_job(
                jobs,
                session="telegram:-100123",
                message="post a summary of the chat",
                schedule=hourly,
                now=datetime.now(UTC),
            ).id
        )
    )
    async with browsing(cfg, config) as browser:
        await browser.login()
        csrf = await browser.csrf("/schedule")
        form = {"csrf": csrf, "session": "telegram:-100123", "every": "7200"}
        await browser.post(
            f"/schedule/job/{job_id}", {**form, "message": "post a summary of the chat"}
        )
        [job] = store.load().jobs
        assert job.schedule.every_seconds == 7200 and not job.by_admin  # still narrowed
        await browser.post(f"/schedule/job/{job_id}", {**form, "message": "say good morning"})
        [job] = store.load().jobs
        assert job.by_admin and job.message == "say good morning"


async def test_a_group_members_multiline_job_edited_only_in_its_time_stays_theirs(tmp_path):
    # A browser sends a textarea's line ends as CRLF: the text the page showed, sent back,
    # is not a rewrite, so the owner's edit of the time does not give the job admin rights.
    from datetime import UTC, datetime

    cfg, config = _config(tmp_path)
    store = JobStore(cfg.agent.state_path)
    text = "post a summary\nof the chat\u202e gnirts " + "x" * 5000 + "\n"  # its line end kept
    job_id = store.update(
        lambda jobs: (
            new_job(
                jobs,
                session="telegram:-100123",
                message=text,
                schedule=Schedule.make(every_seconds=3600, tz="UTC"),
                now=datetime.now(UTC),
            ).id
        )
    )
    async with browsing(cfg, config) as browser:
        await browser.login()
        _, page, _ = await browser.get("/schedule")
        assert "\u202e" not in page and "U+202E" in page  # a bidi override shown, not obeyed
        assert "x" * 5000 not in page and "4,036 more characters: Edit shows all" in page
        _, form, _ = await browser.get(f"/schedule/job/{job_id}")
        assert ">\npost a summary\nof the chat" in form  # the first line break survives parsing
        csrf = await browser.csrf("/schedule")
        sent = {"csrf": csrf, "session": "telegram:-100123", "every": "7200"}
        await browser.post(
            f"/schedule/job/{job_id}", {**sent, "message": text.replace("\n", "\r\n")}
        )
        [job] = store.load().jobs
        assert job.schedule.every_seconds == 7200
        assert not job.by_admin and job.message == text


async def test_run_now_while_shutting_down_says_it_runs_at_the_next_start(tmp_path):
    cfg, config = _config(tmp_path)
    job_id = _reminder(cfg, "later")
    store = JobStore(cfg.agent.state_path)
    async with Harness(cfg, config, channels=("telegram",)) as harness:
        stack = harness.stack
        scheduler = Scheduler(cfg, store, stack.bus, stack.store, {"telegram"})
        stack.bus.accepting = False  # intake closed: the gateway is stopping
        said = await scheduler.run_now(job_id, "shutdown-1")
        assert "shutting down" in said and "started" not in said
        [job] = store.load().jobs
        assert job.firing and job.firing["message_id"] == f"cron:{job_id}:now-shutdown-1"
        assert not [m for m in harness.outbox if m.final]
