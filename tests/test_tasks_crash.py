"""A background task survives a SIGKILL of the gateway while its tool runs: after the restart
it resumes from its checkpoint (its finished tool not run again, the unfinished one marked
interrupted), no process of the killed run is left, and its report reaches the Telegram chat
that started it exactly once."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bot.runner import INTERRUPTED_TOOL_RESULT
from bot.session import SessionStore
from bot.tasks import TaskStore
from tests.fakes.llm_server import FakeLLM, FakeLLMThread, reply, tool_step
from tests.fakes.telegram_api import FakeBotAPI
from tests.helpers import alive, config_dict
from tests.helpers.gateway import Gateway

ALICE = 1001  # in allowFrom, so an admin: her turn (and its task) may run commands


@pytest.fixture
def llm() -> Iterator[FakeLLMThread]:
    with FakeLLM.start_in_thread() as server:
        yield server


@pytest.fixture
def api() -> Iterator[Any]:
    with FakeBotAPI.start_in_thread() as server:
        yield server


def texts(api: Any) -> list[str]:
    return [c.params.get("text", "") for c in api.sent(ALICE)]


def test_sigkill_while_a_tasks_tool_runs_resumes_it_and_reports_once(
    tmp_path: Path, llm: FakeLLMThread, api: Any
) -> None:
    telegram = {
        "enabled": True,
        "token": api.token,
        "baseUrl": api.base_url,
        "allowFrom": [str(ALICE)],
        "pollTimeoutSeconds": 1,
    }
    data = config_dict(
        tmp_path, llm.base_url, channels={"telegram": telegram}, heartbeat={"intervalMinutes": 0}
    )
    config = tmp_path / "config.json"
    config.write_text(json.dumps(data))
    ws = tmp_path / "ws"
    task = "TASKTEXT: count the files"
    llm.script(
        tool_step(("spawn", {"task": task, "label": "count"}), when_user_contains="research"),
        reply("I started it.", when_user_contains="research"),
        tool_step(("exec", {"command": "echo first >> runs.log"}), when_user_contains="TASKTEXT"),
        # Killed here: the command says it runs, then waits far longer than the test.
        tool_step(
            ("exec", {"command": "echo second >> runs.log; echo $$ > task.pid; sleep 60"}),
            when_user_contains="TASKTEXT",
        ),
        reply("There are 42 files.", when_user_contains="TASKTEXT"),
    )
    first = Gateway(config)
    try:
        first.wait_running()
        api.private_text("research please", user_id=ALICE)
        api.wait_for(lambda: "I started it." in texts(api), 20)  # the parent answers at once
        api.wait_for(lambda: (ws / "task.pid").exists() and bool((ws / "task.pid").read_text()))
        pid = int((ws / "task.pid").read_text())
        first.kill()
    finally:
        first.kill()
    second = Gateway(config)
    try:
        second.wait_running()
        # The restart's reaper sends SIGKILL before "running"; the kernel ends the process a
        # moment later (it was seen alive once in eight runs when asked at once).
        deadline = time.monotonic() + 5
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not alive(pid), "the killed run's command was left running"
        api.wait_for(lambda: any(t.startswith("Task ") for t in texts(api)), 30)
    finally:
        second.stop()
    reports = [t for t in texts(api) if t.startswith("Task ")]
    [rec] = TaskStore(tmp_path / "state").load().values()
    assert reports == [f"Task {rec.id} (count) finished:\n\nThere are 42 files."], texts(api)
    assert rec.state == "done"
    assert (ws / "runs.log").read_text().splitlines() == ["first", "second"]  # none run twice
    history = SessionStore(tmp_path / "state").history(rec.session_key)
    results = [m["content"] for m in history if m.get("role") == "tool"]
    assert len(results) == 2 and results[1] == INTERRUPTED_TOOL_RESULT, results
    chat = SessionStore(tmp_path / "state").history(f"telegram:{ALICE}")
    assert sum("There are 42 files." in str(m.get("content")) for m in chat) == 1
