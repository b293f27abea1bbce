"""Issue 16: fallback models, and turns that wait for the model instead of failing."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from bot.outage import NOTICE_TEXT, Outage
from bot.recovery import MAX_RESUME_ATTEMPTS
from bot.session import SessionStore
from tests.fakes.llm_server import FakeLLM, disconnect, error, reply
from tests.fakes.telegram_api import FakeBotAPI
from tests.helpers import (
    FAST_OUTAGE,
    Harness,
    closed_port,
    config_dict,
    llm_settings,
    make_config,
    request_messages,
    zygote,
)
from tests.helpers.crash import REPO, wait_until


def _harness(tmp_path: Path, llm: dict[str, Any], wait: bool = False) -> Harness:
    h = Harness(make_config(tmp_path, llm["baseUrl"], llm=llm), tmp_path / "config.json")
    if wait:  # the gateway's behaviour (the harness builds the terminal's by default)
        h.stack.loop.outage = Outage(h.stack.provider.probe, h.cfg.llm.outage)
    return h


@pytest.fixture
async def primary():
    async with FakeLLM() as server:
        yield server


@pytest.fixture
async def fallback():
    async with FakeLLM() as server:
        yield server


# -- failover ---------------------------------------------------------------------------------


async def test_failover_on_connection_refused(tmp_path: Path, fallback: FakeLLM) -> None:
    dead = f"http://127.0.0.1:{closed_port()}/v1"
    async with _harness(tmp_path, llm_settings(dead, fallback.base_url)) as h:
        assert await h.ask("hi") == "echo: hi"
        status = h.stack.loop.status_text("cli:t")
    [req] = fallback.requests
    assert req["body"]["model"] == "fallback-model"
    assert "last answer by: fallback-model @ " + fallback.base_url in status
    stored = SessionStore(tmp_path / "state").get("cli:t")
    assert stored.messages[-1]["answered_by"] == f"fallback-model @ {fallback.base_url}"
    assert "answered_by" not in stored.wire[-1]  # never sent to a model


async def test_failover_on_500_keeps_the_request_bytes(
    tmp_path: Path, primary: FakeLLM, fallback: FakeLLM
) -> None:
    primary.script(reply("first"))
    async with _harness(tmp_path, llm_settings(primary.base_url, fallback.base_url)) as h:
        assert await h.ask("one") == "first"
        primary.script(error(500), error(500))
        assert await h.ask("two") == "echo: two"
        primary.script(reply("back"))
        assert await h.ask("three") == "back"
    assert [r["status"] for r in primary.requests] == [200, 500, 500, 200]
    failed, answered = primary.requests[2], fallback.requests[0]
    # The same system prompt and history, byte for byte: only the model name differs.
    assert json.dumps(request_messages(failed)) == json.dumps(request_messages(answered))
    # The fallback's answer is in the next request's history without our bookkeeping.
    third = request_messages(primary.requests[3])
    assert {"role": "assistant", "content": "echo: two"} in third
    assert json.dumps(third).startswith(json.dumps(request_messages(failed))[:-1])


async def test_429_retry_after_is_honoured_before_failing_over(
    tmp_path: Path, primary: FakeLLM, fallback: FakeLLM
) -> None:
    primary.script(error(429, retry_after=0.5), error(429, retry_after=0.5))
    async with _harness(tmp_path, llm_settings(primary.base_url, fallback.base_url)) as h:
        assert await h.ask("hi") == "echo: hi"
    first, second = primary.requests
    assert second["time"] - first["time"] >= 0.45  # waited as asked, on the primary
    assert fallback.requests[0]["time"] >= second["time"]


@pytest.mark.parametrize("status", [400, 401])
async def test_no_failover_on_a_refused_request(
    tmp_path: Path, primary: FakeLLM, fallback: FakeLLM, status: int, caplog: Any
) -> None:
    primary.script(error(status), error(status))
    async with _harness(
        tmp_path, llm_settings(primary.base_url, fallback.base_url), wait=True
    ) as h:
        answer = await h.ask("hi")
        assert f"refused the request ({status}" in answer  # answered, not waiting
        await h.ask("again")
    assert fallback.requests == []
    refused = [r for r in caplog.records if "refused the request" in r.getMessage()]
    assert all(primary.base_url in r.getMessage() for r in refused)
    if status == 401:  # a wrong key is an ERROR once per endpoint, not once per message
        assert [r.levelname for r in refused] == ["ERROR"]


# -- waiting out an outage --------------------------------------------------------------------


async def test_outage_with_several_chats(tmp_path: Path, primary: FakeLLM) -> None:
    primary.configure(mode="strict")  # every unscripted request: HTTP 500
    llm = llm_settings(primary.base_url, outage=FAST_OUTAGE)
    async with _harness(tmp_path, llm, wait=True) as h:
        futures = {}
        for n in range(3):
            for chat in ("a", "b", "c", "d"):
                futures[(chat, n)] = await h.send(f"{chat}{n}", chat=chat)
        await _until(lambda: sum(m.text == NOTICE_TEXT for m in h.outbox) == 4)
        assert h.stack.loop.outage is not None and h.stack.loop.outage.active
        assert "outage: model outage since" in h.stack.loop.status_text("cli:a")
        await asyncio.sleep(0.5)
        assert not any(f.done() for f in futures.values())
        primary.configure(mode="echo")
        answers = {k: (await asyncio.wait_for(f, 10)).text for k, f in futures.items()}
        await asyncio.sleep(0.3)  # a duplicate would have been sent by now
    assert answers == {(chat, n): f"echo: {chat}{n}" for chat, n in futures}
    finals = [m for m in h.outbox if m.final]
    assert len(finals) == 12  # nothing answered twice
    notices = Counter(m.chat_id for m in h.outbox if m.text == NOTICE_TEXT)
    assert notices == {"a": 1, "b": 1, "c": 1, "d": 1}
    for chat in "abcd":
        order = [m.text for m in finals if m.chat_id == chat]
        assert order == [f"echo: {chat}{n}" for n in range(3)]
    for chat in "abcd":
        meta = SessionStore(tmp_path / "state").get(f"cli:{chat}").metadata
        assert not meta.get("pending") and not meta.get("runtime_checkpoint")


async def test_a_waiting_turn_is_answered_with_the_error_after_the_maximum_wait(
    tmp_path: Path, primary: FakeLLM
) -> None:
    primary.configure(mode="strict")
    llm = llm_settings(primary.base_url, outage={"probeMaxSeconds": 5, "maxWaitMinutes": 0.01})
    async with _harness(tmp_path, llm, wait=True) as h:
        started = time.monotonic()
        answer = await h.ask("still there?")
        assert 0.5 <= time.monotonic() - started < 5
    assert "unavailable" in answer
    assert [m.text for m in h.outbox if not m.final and m.text] == [NOTICE_TEXT]
    session = SessionStore(tmp_path / "state").get("cli:t")
    assert "still there?" in session.messages[0]["content"]  # the question stays in history
    assert not session.metadata.get("pending")


async def test_stop_ends_a_waiting_turn(tmp_path: Path, primary: FakeLLM) -> None:
    primary.script(disconnect(), disconnect())
    primary.configure(mode="strict")
    async with _harness(
        tmp_path, llm_settings(primary.base_url, outage=FAST_OUTAGE), wait=True
    ) as h:
        waiting = await h.send("wait for me")
        await _until(lambda: any(m.text == NOTICE_TEXT for m in h.outbox))
        stop = await h.send("/stop")
        assert (await asyncio.wait_for(stop, 5)).text == "Stopping the current answer."
        assert (await asyncio.wait_for(waiting, 5)).text == "Stopped."
        primary.configure(mode="echo")
        assert await h.ask("and now?") == "echo: and now?"
    assert not SessionStore(tmp_path / "state").get("cli:t").metadata.get("pending")


async def test_shutdown_as_the_model_comes_back_keeps_the_turn_for_the_next_start(
    tmp_path: Path, primary: FakeLLM
) -> None:
    """The worker is cancelled (shutdown) in the same loop pass as the wait ends: that is not
    /stop, so no "Stopped." answer; the question stays pending for the next start."""
    primary.configure(mode="strict")
    async with _harness(
        tmp_path, llm_settings(primary.base_url, outage=FAST_OUTAGE), wait=True
    ) as h:
        loop, outage = h.stack.loop, h.stack.loop.outage
        assert outage is not None
        back = asyncio.Event()

        async def wait_for_back(key: str, arrived: float, deadline: float) -> bool:
            await back.wait()
            return True

        outage.wait = wait_for_back  # type: ignore[method-assign]
        waiting = await h.send("wait for me")
        await _until(lambda: loop._work.get("cli:t") is not None and loop._work["cli:t"].wait)
        back.set()  # the wait ends in the next loop pass...
        await loop.shutdown(0)  # ...the same pass as the worker's cancel
        assert not waiting.done()
    assert not [m for m in h.outbox if m.final]
    meta = SessionStore(tmp_path / "state").get("cli:t").metadata
    assert [p["text"] for p in meta.get("pending") or []] == ["wait for me"]


async def _until(predicate: Any, timeout: float = 10) -> None:  # noqa: ASYNC109
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


# -- a SIGKILL during the outage (the real gateway) -------------------------------------------

ALICE = 1001
BOB = 1002


def _gateway(config: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ}
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "MEMOBOT_FAILPOINTS", "MEMOBOT_CONFIG"):
        env.pop(name, None)
    with open(config.parent / "gateway.log", "ab") as log:
        return zygote.popen(
            ["--config", str(config), "-v", "gateway"],
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )


def _texts(api: Any, chat: int) -> list[str]:
    return [str(c.params.get("text")) for c in api.sent(chat) if c.status == 200]


def test_sigkill_during_the_outage_keeps_turns_waiting(tmp_path: Path) -> None:
    """Killed more often than MAX_RESUME_ATTEMPTS while waiting: a wait is not a crash of
    the turn, so the questions are still answered for real, not given up."""
    with FakeLLM.start_in_thread(mode="strict") as llm, FakeBotAPI.start_in_thread() as api:
        settings = {
            "enabled": True,
            "token": api.token,
            "baseUrl": api.base_url,
            "allowFrom": [str(ALICE), str(BOB)],
            "pollTimeoutSeconds": 1,
        }
        data = config_dict(tmp_path, llm.base_url, channels={"telegram": settings})
        data["llm"]["outage"] = FAST_OUTAGE
        config = tmp_path / "config.json"
        config.write_text(json.dumps(data))
        first = _gateway(config)
        second = None
        log = tmp_path / "gateway.log"
        try:
            api.private_text("alice one", user_id=ALICE)
            api.private_text("bob one", user_id=BOB)
            api.private_text("alice two", user_id=ALICE)
            wait_until(
                lambda: all(NOTICE_TEXT in _texts(api, u) for u in (ALICE, BOB)), 20, "notices"
            )
            for _ in range(MAX_RESUME_ATTEMPTS + 1):
                failed = log.read_text().count("model outage: every model failed")
                (second or first).send_signal(signal.SIGKILL)
                assert (second or first).wait(10) == -signal.SIGKILL
                second = _gateway(config)
                wait_until(
                    lambda n=failed: log.read_text().count("model outage: every model failed") > n
                )
                time.sleep(0.3)  # both chats' turns are waiting again
            llm.configure(mode="echo")
            want = {ALICE: ["echo: alice one", "echo: alice two"], BOB: ["echo: bob one"]}
            wait_until(
                lambda: all(
                    [t for t in _texts(api, u) if t.startswith("echo:")] == w
                    for u, w in want.items()
                ),
                20,
                "answers after the outage",
            )
            time.sleep(0.5)  # a duplicate would have been sent by now
        finally:
            for proc in (first, second):
                if proc is not None and proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
                    proc.wait(20)
        for user, answers in want.items():
            texts = _texts(api, user)
            assert texts.count(NOTICE_TEXT) == 1, texts  # not repeated after the restart
            assert [t for t in texts if t != NOTICE_TEXT] == answers


def test_a_wrong_api_key_is_reported_once_to_the_admins(tmp_path: Path) -> None:
    """401 does not fail over and is not waited out: each asker gets the refusal, and the
    admins' private chats get one notice naming the setting (never the key)."""
    with (
        FakeLLM.start_in_thread(api_key="the-right-key") as llm,
        FakeBotAPI.start_in_thread() as api,
    ):
        settings = {
            "enabled": True,
            "token": api.token,
            "baseUrl": api.base_url,
            "allowFrom": [str(ALICE), str(BOB)],
            "admins": [str(ALICE)],
            "pollTimeoutSeconds": 1,
        }
        data = config_dict(tmp_path, llm.base_url, channels={"telegram": settings})
        data["llm"]["apiKey"] = "sk-wrong-secret-1234"
        data["llm"]["outage"] = FAST_OUTAGE
        config = tmp_path / "config.json"
        config.write_text(json.dumps(data))
        gateway = _gateway(config)
        try:
            api.private_text("alice one", user_id=ALICE)
            api.private_text("bob one", user_id=BOB)
            wait_until(lambda: len(_texts(api, ALICE)) >= 2 and _texts(api, BOB), 20, "answers")
            api.private_text("alice two", user_id=ALICE)
            wait_until(lambda: len(_texts(api, ALICE)) >= 3, 20, "the second answer")
            time.sleep(0.5)  # a second notice would have been sent by now
        finally:
            gateway.send_signal(signal.SIGTERM)
            gateway.wait(20)
    alice, bob = _texts(api, ALICE), _texts(api, BOB)
    notices = [t for t in alice if t.startswith("memobot: the model endpoint")]
    assert len(notices) == 1, alice
    assert "401" in notices[0] and "llm.apiKey" in notices[0] and llm.base_url in notices[0]
    assert "sk-wrong-secret" not in notices[0]
    assert [t for t in alice if t not in notices] == [
        "The model service refused the request (401: the API key was rejected; check llm.apiKey).",
    ] * 2
    assert bob == [alice[-1]]  # refused too, but not an admin: no notice
