"""The panel with the rest of memobot: a pairing code approved in the browser lets the
stranger in on the (fake) Telegram; a gateway whose panel address is taken runs on without
it; ``memobot web`` alone serves the panel and prints only the link into a pipe."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bot.config import load_config
from bot.pairing import ALPHABET, announce_approvals, stores
from tests.fakes.llm_server import FakeLLM, FakeLLMThread
from tests.fakes.telegram_api import FakeBotAPI
from tests.helpers import (
    REPO,
    run_memobot,
    start_gateway,
    stop_gateway,
    telegram_in_process,
    wait_for,
    write_config,
    zygote,
)
from tests.helpers.telegram import ALICE as OWNER
from tests.helpers.telegram import settings as telegram_settings
from tests.helpers.web import browsing, panel_section

STRANGER = 2002
CODE = re.compile(rf"code: ([{ALPHABET}]{{8}})\n")


async def test_a_code_approved_in_the_panel_lets_the_stranger_in(tmp_path, llm, api, caplog):
    caplog.set_level(logging.INFO, logger="bot.web")
    telegram = telegram_settings(api, dmPolicy="pairing")  # the owner is Alice
    web = panel_section()
    config = write_config(tmp_path, llm.base_url, channels={"telegram": telegram}, web=web)
    cfg, _ = load_config(config)
    async with (
        telegram_in_process(cfg, config) as (stack, _channel, _manager),
        browsing(cfg, config, in_gateway=True) as browser,
    ):
        announcer = asyncio.create_task(
            announce_approvals(
                stores(cfg.agent.state_path, ["telegram"]), stack.loop.announce_once, every=0.1
            )
        )
        try:
            api.private_text("hello?", user_id=STRANGER, username="eve")
            await api.wait_sent_async(1, STRANGER, 30)
            [code] = [m[1] for c in api.sent(STRANGER) if (m := CODE.search(c.params["text"]))]
            assert llm.requests == []  # refused: nothing the stranger said was processed
            await browser.login()
            _, page, _ = await browser.get("/access")
            assert code in page and f"{STRANGER} (@eve)" in page
            csrf = await browser.csrf()
            status, _, r = await browser.post("/access/approve", {"code": code, "csrf": csrf})
            assert status == 303 and r.headers["Location"] == "/access"
            _, page, _ = await browser.get("/access")
            assert f"Approved telegram user {STRANGER} (@eve)" in page
            assert code not in page  # no longer waiting
            assert f"telegram user {STRANGER} approved by web" in caplog.text
            await api.wait_for_async(
                lambda: any("approved" in c.params["text"] for c in api.sent(STRANGER)), 30
            )
            api.private_text("now?", user_id=STRANGER, username="eve")
            await api.wait_for_async(
                lambda: any("echo: now?" in c.params["text"] for c in api.sent(STRANGER)), 30
            )
        finally:
            announcer.cancel()
            await asyncio.gather(announcer, return_exceptions=True)


@pytest.fixture
def llm_thread() -> Iterator[FakeLLMThread]:
    with FakeLLM.start_in_thread() as server:
        yield server


@pytest.fixture
def api_thread() -> Iterator[Any]:
    with FakeBotAPI.start_in_thread() as server:
        yield server


async def _overview_through(link: str) -> str:
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        async with http.get(link) as r:
            assert r.status == 200
        async with http.get(link.split("/login")[0] + "/") as r:
            return await r.text()


def test_a_taken_panel_address_is_one_log_line_and_the_gateway_runs_on(
    tmp_path: Path, llm_thread: FakeLLMThread, api_thread: Any
):
    """Then, the address free and the gateway started again, it serves the panel and
    ``memobot web``'s link (another process's) logs in to it."""
    telegram = telegram_settings(api_thread, pollTimeoutSeconds=1)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = write_config(
            tmp_path,
            llm_thread.base_url,
            channels={"telegram": telegram},
            web={"enabled": True, "listen": f"127.0.0.1:{port}"},
            heartbeat={"intervalMinutes": 0},
        )
        gateway = start_gateway(config)
        try:
            status = tmp_path / "state" / "gateway.json"
            assert wait_for(status.exists, 30), (tmp_path / "gateway.log").read_text()
            api_thread.private_text("still there?", user_id=OWNER)
            api_thread.wait_for(
                lambda: any("echo: still there?" in c.params["text"] for c in api_thread.sent()),
                30,
            )
            assert gateway.poll() is None
            log = (tmp_path / "gateway.log").read_text()
            lines = [line for line in log.splitlines() if "web panel" in line]
            assert len(lines) == 1, log
            assert f"cannot listen on 127.0.0.1:{port}" in lines[0]
            assert "web.listen" in lines[0] and "runs on without it" in lines[0]
            assert json.loads(status.read_text())["web"] is None
            # memobot web says so, instead of printing a link nothing answers.
            said = run_memobot("web", config=config)
            assert said.returncode == 1 and said.stdout == ""
            assert "without the panel" in said.stderr and "address was taken" in said.stderr
            status_said = run_memobot("status", config=config).stdout
            assert "panel      the running gateway does not serve it" in status_said
        finally:
            stop_gateway(gateway)
    gateway = start_gateway(config)
    try:
        assert wait_for(lambda: bool(status.exists() and json.loads(status.read_text())["web"]), 30)
        said = run_memobot("web", config=config)
        assert said.returncode == 0, said.stderr
        page = asyncio.run(_overview_through(said.stdout.strip()))
        assert f"running (pid {gateway.pid})" in page and "not running" not in page
        assert re.search(r"<td>telegram</td><td>connected</td>", page), page
    finally:
        stop_gateway(gateway)


async def test_memobot_web_alone_serves_the_panel_and_prints_only_the_link(tmp_path):
    config = write_config(tmp_path, "http://127.0.0.1:9/v1", web=panel_section())
    proc = zygote.popen(
        ["--config", str(config), "web"],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        line = (await asyncio.to_thread(proc.stdout.readline)).decode()
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/login\?token=[\w-]{40,}\n", line), line
        jar = aiohttp.CookieJar(unsafe=True)
        async with aiohttp.ClientSession(cookie_jar=jar) as http:
            async with http.get(line.strip()) as r:
                assert r.status == 200
            async with http.get(line.split("/login")[0] + "/") as r:
                page = await r.text()
            assert "<title>Overview" in page and "The gateway is not running" in page
            async with http.get(line.strip()) as r:
                assert r.status == 403  # once
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 20) == 0
        assert proc.stdout.read() == b""  # the link was all
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


async def test_the_overview_says_how_long_memobot_runs_whether_the_model_answers_and_more(
    tmp_path,
):
    """The lines the overview adds to ``memobot status``'s, from the running gateway's status
    file: uptime, the model's outage, today's chats, memory budgets, MCP servers."""
    import os
    import time

    from bot.gateway import STATUS_FILE, write_status

    config = write_config(tmp_path, "http://127.0.0.1:9/v1", web=panel_section())
    cfg, _ = load_config(config)
    state = cfg.agent.state_path
    (state / "sessions").mkdir(parents=True, exist_ok=True)
    (state / "sessions" / "telegram_1.jsonl").write_text("{}\n")
    old = state / "sessions" / "telegram_2.jsonl"
    old.write_text("{}\n")
    os.utime(old, (time.time() - 3 * 86400,) * 2)
    memory = cfg.agent.workspace_path / "memory"
    memory.mkdir(parents=True, exist_ok=True)
    (memory / "MEMORY.md").write_text("x" * 1234)
    now = time.time()
    live = {"pid": os.getpid(), "started_at": now - 2 * 86400 - 3 * 3600 - 60, "updated_at": now}
    write_status(state / STATUS_FILE, {**live, "channels": {}, "outage": None})
    async with browsing(cfg, config) as b:
        await b.login()
        _, text, _ = await b.get("/")
        assert "2 d 3 h" in text
        assert "yes (no outage seen)" in text
        assert "2 (1 active today)" in text
        assert "MEMORY.md 1,234/" in text
        assert "no servers configured" in text
        outage = {"since": now - 60, "waiting": 2, "reason": "HTTP 503 from the model"}
        write_status(state / STATUS_FILE, {**live, "channels": {}, "outage": outage})
        _, text, _ = await b.get("/")
        assert "every model failing since" in text and "2 turns waiting" in text
        (state / STATUS_FILE).unlink()
        _, text, _ = await b.get("/")
        assert "unknown: the gateway is not running" in text


async def test_the_gateway_panel_is_built_at_its_first_connection_and_not_before(tmp_path):
    """A bound socket until someone connects (a taken port is said at the start); the first
    connection, waiting in the backlog, is answered by the panel built for it."""
    from types import SimpleNamespace

    from bot.web.listener import DeferredPanel

    config = write_config(tmp_path, "http://127.0.0.1:9/v1", web=panel_section())
    cfg, _ = load_config(config)
    deferred = DeferredPanel(cfg, config, SimpleNamespace())  # type: ignore[arg-type]
    assert deferred.start() is None
    try:
        assert deferred.panel is None
        taken = DeferredPanel(cfg, config, SimpleNamespace())  # type: ignore[arg-type]
        assert "cannot listen on" in (taken.start() or "")
        async with aiohttp.ClientSession() as http:
            async with http.get(deferred.base_url + "/", allow_redirects=False) as r:
                assert r.status == 303 and r.headers["Location"] == "/login"
        assert deferred.panel is not None and deferred.panel.gateway is not None
    finally:
        await deferred.stop()
    idle = DeferredPanel(cfg, config, SimpleNamespace())  # type: ignore[arg-type]
    assert idle.start() is None  # the address is free again after stop
    await idle.stop()
    assert idle.start() is None  # and after a stop with no connection ever
    await idle.stop()
