"""The panel's Tasks screen, in-process (a real panel server and an HTTP client that keeps its
cookies): every task listed with its chat, starter, state and model use; a task's page with
its text, transcript and result; Cancel through /stop ID's own path (the task's process
killed, reported "stopped", logged "by web"); with `memobot web` alone, what `memobot tasks
cancel` does, said as such."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import pytest

from bot.config import load_config
from bot.kinds import Sender
from bot.privacy import PrivacyScope
from bot.tasks import TaskRecord, TaskStore
from tests.fakes.llm_server import FakeLLM, reply, tool_step
from tests.helpers import alive, write_config
from tests.helpers.web import browsing, chatting, panel_section

TASK = "TASKTEXT: count the <b>files</b>"
HOLD = "echo $$ > task.pid; while [ ! -e go ]; do sleep 0.01; done; echo counted"


async def until(check, seconds: float = 15.0):
    deadline = time.monotonic() + seconds
    while not (value := check()):
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)
    return value


async def test_the_tasks_screen_shows_a_running_task_and_cancel_stops_it_by_web(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ws = tmp_path / "ws"
    async with FakeLLM() as llm:
        llm.script(
            tool_step(("exec", {"command": HOLD}), when_user_contains="TASKTEXT"),
            reply("never reached", when_user_contains="TASKTEXT"),
        )
        path = write_config(tmp_path, llm.base_url, web=panel_section())
        cfg, _ = load_config(path)
        async with chatting(cfg, path) as (gateway, browser):
            await browser.login()
            scope = PrivacyScope("owner", "web:first", True, True, None)
            owner = Sender("owner", True, False)
            board = gateway.stack.loop.tasks
            rec = await board.start("web:first", owner, TASK, "count", scope, None, False)
            assert isinstance(rec, TaskRecord)
            await until(lambda: (ws / "task.pid").exists() and (ws / "task.pid").read_text())
            pid = int((ws / "task.pid").read_text())

            status, listing, _ = await browser.get("/tasks")
            assert status == 200
            assert f'href="/tasks/view?id={rec.id}"' in listing and "count" in listing
            assert 'href="/chats/view?key=web%3Afirst"' in listing  # the chat it reports to
            assert "owner (admin)" in listing and "running" in listing
            assert "1 model call" in listing  # its use so far, from the usage ledger
            assert "No gateway runs in this process" not in listing

            status, text, _ = await browser.get(f"/tasks/view?id={rec.id}")
            assert status == 200
            # Its text, escaped (the model's words), and its transcript: the call under way.
            assert "count the &lt;b&gt;files&lt;/b&gt;" in text and "<b>files" not in text
            assert "while [ ! -e go ]" in text and "Running: its result is posted" in text
            assert (await browser.get("/tasks/view?id=nope"))[0] == 404

            _, overview, _ = await browser.get("/")
            assert '<a href="/tasks">1 running</a>' in overview

            csrf = await browser.csrf("/tasks")
            assert (await browser.post("/tasks/cancel", {"id": rec.id}))[0] == 403  # no token
            with caplog.at_level(logging.INFO):
                status, _, r = await browser.post("/tasks/cancel", {"id": rec.id, "csrf": csrf})
            assert status == 303 and r.headers["Location"] == f"/tasks/view?id={rec.id}"
            assert f"task stop asked id={rec.id} session=web:first by web" in caplog.text
            await until(lambda: TaskStore(tmp_path / "state").load()[rec.id].state == "stopped")
            await until(lambda: not alive(pid), 5)  # killed as any stopped turn's process
            _, text, _ = await browser.get(f"/tasks/view?id={rec.id}")
            assert f"Stopping task {rec.id}." in text  # the notice
            assert f"Task {rec.id} (count) stopped." in text and "Cancel</button>" not in text


async def test_without_the_gateway_cancel_is_asked_in_the_task_store_and_said_so(
    tmp_path: Path,
) -> None:
    path = write_config(tmp_path, "http://127.0.0.1:9/v1", web=panel_section())
    cfg, _ = load_config(path)
    store = TaskStore(tmp_path / "state")
    store.put(TaskRecord("abcd", "telegram:1", "u1", "long", "running", time.time() - 300))
    store.put(TaskRecord("beef", "telegram:1", "u1", "old", "done", 1.0, 2.0))
    async with browsing(cfg, path) as browser:
        await browser.login()
        _, listing, _ = await browser.get("/tasks")
        assert "No gateway runs in this process" in listing and "5 min" in listing
        assert listing.count("Cancel</button>") == 1  # the running one only
        _, overview, _ = await browser.get("/")
        assert '<a href="/tasks">1 running</a>' in overview
        csrf = await browser.csrf("/tasks")
        status, _, _ = await browser.post("/tasks/cancel", {"id": "abcd", "csrf": csrf})
        assert status == 303
        assert store.load()["abcd"].cancel  # what `memobot tasks cancel` writes
        _, text, _ = await browser.get("/tasks/view?id=abcd")
        assert "asked in the task store; no gateway runs now" in text
        assert "running (cancel asked)" in text
        status, _, _ = await browser.post("/tasks/cancel", {"id": "beef", "csrf": csrf})
        _, text, _ = await browser.get("/tasks/view?id=beef")
        assert "Task beef has already ended (done)." in text
        assert not store.load()["beef"].cancel
