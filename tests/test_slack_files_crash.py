"""SIGKILL between Slack's ack of a message with a file and the file's download, then during
the download: the real gateway subprocess, slack_sdk and the fake Slack. The message is a
pending turn naming its file from the ack on, so each restart fetches the file again and the
message is answered exactly once, with its file.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bot.session import SessionState, SessionStore
from tests.fakes.llm_server import FakeLLM, reply
from tests.fakes.slack_api import APP_TOKEN, BOT_TOKEN, FakeSlack
from tests.fakes.threaded import ServerThread
from tests.helpers import config_dict, request_messages, start_gateway, stop_gateway
from tests.helpers.slack import ALICE, DM, dm

FIRST = "1700000050.000100"
WITH_FILE = "1700000050.000200"


@pytest.fixture
def slack() -> Iterator[tuple[FakeSlack, ServerThread]]:
    fake = FakeSlack(users={ALICE: {"id": ALICE, "profile": {"display_name": "alice"}}})
    thread = ServerThread(fake.start, fake.stop, "fake-slack")
    try:
        yield fake, thread
    finally:
        thread.stop()


def _config(tmp_path: Path, llm: Any, fake: FakeSlack) -> Path:
    settings = {
        "enabled": True,
        "botToken": BOT_TOKEN,
        "appToken": APP_TOKEN,
        "apiUrl": fake.api_url,
        "allowFrom": [ALICE],
        "streaming": False,
    }
    config = tmp_path / "config.json"
    config.write_text(json.dumps(config_dict(tmp_path, llm.base_url, channels={"slack": settings})))
    return config


def _wait(thread: ServerThread, predicate: Callable[[], bool], seconds: float) -> None:
    async def check() -> bool:  # on the fake's loop, where its state changes
        return predicate()

    deadline = time.monotonic() + seconds
    while not thread.run(check()):
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


def _kill(proc: Any) -> None:
    proc.kill()
    assert proc.wait(10) == -signal.SIGKILL


def _state(tmp_path: Path) -> SessionState:
    """The DM's session state as on disk now (a fresh read: the gateway writes it)."""
    state = SessionStore(tmp_path / "state").peek_state(f"slack:{DM}")
    assert state is not None
    return state


def _texts(fake: FakeSlack) -> list[str]:
    return [p.text for p in fake.posts]


def test_sigkill_after_the_ack_and_during_the_download_answers_once_with_the_file(tmp_path, slack):
    fake, thread = slack
    url = fake.add_file("plan.txt", b"step one, step two\n")
    attached = {"id": "F50", "name": "plan.txt", "size": 19, "url_private": url}
    with FakeLLM.start_in_thread() as llm:
        # The chat's first message keeps the model busy, so the second (with the file) is
        # taken and acknowledged but waits, its file not fetched, when memobot is killed.
        llm.script(reply("never seen", when_user_contains="first", delay=30.0))
        config = _config(tmp_path, llm, fake)
        proc = start_gateway(config)
        try:
            thread.run(fake.wait_connected(1, 20))
            thread.run(fake.push_event(dm("first", FIRST), event_id="E1"))
            _wait(thread, lambda: len(llm.requests) == 1, 20)
            ask = dm("what is the plan?", WITH_FILE, subtype="file_share", files=[attached])
            thread.run(fake.wait_ack(thread.run(fake.push_event(ask, event_id="E2"))))
            pending = _state(tmp_path)
            assert pending.pending_entry(WITH_FILE)["files"]
            assert fake.file_auth == []  # acknowledged; the download has not begun
            _kill(proc)
        finally:
            stop_gateway(proc)

        # Second start: the first message is answered, the file's download begins and is
        # held by the file server; killed while it is under way.
        fake.file_delay = 60.0
        proc = start_gateway(config)
        try:
            _wait(thread, lambda: len(fake.file_auth) == 1, 30)
            _wait(thread, lambda: _texts(fake) == ["echo: first"], 10)
            assert _state(tmp_path).pending_entry(WITH_FILE) is not None
            deadline = time.monotonic() + 10
            while _state(tmp_path).outbox:
                assert time.monotonic() < deadline, "the first answer is never marked sent"
                time.sleep(0.02)
            _kill(proc)
        finally:
            stop_gateway(proc)

        fake.file_delay = 0.0
        proc = start_gateway(config)
        try:
            _wait(thread, lambda: len(fake.posts) == 2, 30)
            time.sleep(1.0)  # a second copy would arrive by now
        finally:
            stop_gateway(proc)
        assert proc.returncode == 0, (tmp_path / "gateway.log").read_text()
        requests = list(llm.requests)
    assert _texts(fake) == ["echo: first", "echo: what is the plan?"]
    saved = tmp_path / "ws" / "media" / "slack" / DM / "F50-plan.txt"
    assert saved.read_bytes() == b"step one, step two\n"
    asked = [m for m in request_messages(requests[-1]) if m["role"] == "user"][-1]["content"]
    assert str(saved) in json.dumps(asked)
    assert fake.file_auth == [f"Bearer {BOT_TOKEN}"] * 2  # killed once, then fetched
    assert all(attempt == 0 for _, _, attempt in fake.deliveries)  # acked: never redelivered
    final = _state(tmp_path)
    assert final.pending == () and final.outbox == ()
