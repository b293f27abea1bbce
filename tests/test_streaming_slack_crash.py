"""SIGKILL while an answer streams natively on Slack: the real gateway subprocess, slack_sdk and
the fake Slack. The stream's ts is in the delivery ledger as soon as Slack gave it, so after
the restart the resumed turn's answer lands in that same message (the stream left open is
stopped first, then updated): one permanent message per answer, in a channel thread (whose
resumed turn has no recipient ids any more, so it goes on by chat.update) and in a DM thread.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.llm_server import FakeLLM, reply
from tests.fakes.slack_api import APP_TOKEN, BOT_TOKEN, FakeSlack
from tests.fakes.threaded import ServerThread
from tests.helpers import config_dict, start_gateway, stop_gateway
from tests.helpers.slack import ALICE, CHAN, DM, dm, mention

ROOT = "1700000040.000100"
DM_THREAD = "1700000040.000500"


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
        "streamEditIntervalSeconds": 0.2,
        "rateLimits": {"channel": {"messages": 20, "perSeconds": 1, "burst": 3}},
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


def test_sigkill_mid_stream_then_restart_leaves_one_message_per_answer(tmp_path, slack):
    fake, thread = slack
    long = " ".join(f"first try, sentence {i}." for i in range(80))
    with FakeLLM.start_in_thread() as llm:
        llm.script(
            reply(long, when_user_contains="thread question", pieces=40, chunk_delay=0.15),
            reply(long, when_user_contains="dm question", pieces=40, chunk_delay=0.15),
            reply("The thread answer, resumed.", when_user_contains="thread question"),
            reply("The DM answer, resumed.", when_user_contains="dm question"),
        )
        config = _config(tmp_path, llm, fake)
        proc = start_gateway(config)
        try:
            thread.run(fake.wait_connected(1, 20))
            thread.run(fake.push_event(mention("thread question", ROOT), event_id="K1"))
            ask = dm("dm question", "1700000040.000600", thread_ts=DM_THREAD)
            thread.run(fake.push_event(ask, event_id="K2"))

            def mid_stream() -> bool:
                appended = [m for m in fake.shown_messages.values() if m.get("appends", 0) >= 2]
                return len(appended) == 2

            _wait(thread, mid_stream, 30)
            proc.kill()
            assert proc.wait(10) == -signal.SIGKILL
        finally:
            stop_gateway(proc)
        streams = {s["channel"]: s["ts"] for s in fake.streams}
        assert set(streams) == {CHAN, DM} and fake.posts == []
        for shown in fake.shown():
            assert shown["streaming"] and shown["text"].startswith("first try")  # left open

        proc = start_gateway(config)
        try:
            expected = {CHAN: "The thread answer, resumed.", DM: "The DM answer, resumed."}
            _wait(
                thread,
                lambda: (
                    sorted((m["channel"], m["text"]) for m in fake.shown())
                    == sorted(expected.items())
                ),
                40,
            )
            time.sleep(1.0)  # a second copy would arrive by now
        finally:
            stop_gateway(proc)
        assert proc.returncode == 0, (tmp_path / "gateway.log").read_text()
    # The resumed answers landed in the streamed messages themselves: one message each.
    shown = fake.shown()
    assert len(shown) == 2
    assert {m["channel"]: m["ts"] for m in shown} == streams
    assert {m["channel"]: m["text"] for m in shown} == expected
    assert not any(m["streaming"] for m in shown)
    assert fake.posts == [] and len(fake.streams) == 2
    stopped_after_restart = [ts for m, ts, _ in fake.stream_calls if m == "chat.stopStream"]
    assert set(stopped_after_restart) == set(streams.values())
