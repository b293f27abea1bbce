"""The panel's Logs screen with a gateway built in process: its log ring on the root logger,
the page filtered by level and session, a secret from the config never shown, and new lines
streamed to an open page (SSE); ``memobot web`` alone says where the log is."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from bot.config import load_config
from bot.gateway import Gateway
from tests.helpers import config_dict, write_config
from tests.helpers.web import Browser, browsing, panel_section

NO_LLM = "http://127.0.0.1:9/v1"
SECRET = "plainSECRETvalue42"  # no token shape: hidden because the config names it
log = logging.getLogger("bot.test_logs")


@asynccontextmanager
async def gateway_panel(tmp_path: Path) -> AsyncIterator[tuple[Gateway, Browser]]:
    data = config_dict(tmp_path, NO_LLM, web=panel_section())
    data["llm"]["apiKey"] = SECRET
    config = tmp_path / "config.json"
    config.write_text(json.dumps(data))
    cfg, _ = load_config(config)
    gateway = Gateway(cfg, config)
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.INFO)
    root.addHandler(gateway.logs)  # as Gateway.run does
    try:
        async with browsing(cfg, config, gateway=gateway) as b:
            await b.login()
            yield gateway, b
    finally:
        root.removeHandler(gateway.logs)
        root.setLevel(level)
        await gateway.stack.close()


async def test_the_page_filters_by_level_and_session_and_hides_secrets(tmp_path):
    async with gateway_panel(tmp_path) as (_, b):
        log.info("turn started session=telegram:1001")
        log.warning("model slow session=slack:C1 key %s", SECRET)
        log.info("a line about <script>alert(1)</script>")
        _, text, _ = await b.get("/logs")
        assert "turn started session=telegram:1001" in text
        assert "model slow session=slack:C1 key ***" in text
        assert SECRET not in text
        assert "&lt;script&gt;alert(1)" in text and "<script>alert" not in text
        assert '<script src="/static/logs.js" defer></script>' in text
        _, text, _ = await b.get("/logs", params={"level": "WARNING"})
        assert "model slow" in text and "turn started" not in text
        _, text, _ = await b.get("/logs", params={"session": "telegram:1001"})
        assert "turn started" in text and "model slow" not in text and "about" not in text
        status, body, r = await b.get("/static/logs.js")
        assert status == 200 and r.content_type == "text/javascript" and "textContent" in body


async def read_event(response: Any) -> dict[str, Any]:
    while True:
        line = (await response.content.readline()).decode()
        if line.startswith("data: "):
            return json.loads(line[6:])


async def test_a_new_line_reaches_an_open_page(tmp_path):
    async with asyncio.timeout(20):  # the panel's stop ends the stream (no 60 s shutdown wait)
        async with gateway_panel(tmp_path) as (gateway, b):
            log.info("before the page session=telegram:1")
            last = gateway.logs.recent()[-1].seq
            query = {"level": "INFO", "session": "telegram:1", "after": str(last)}
            async with b.http.get(b.base + "/logs/stream", params=query) as r:
                assert r.status == 200 and r.content_type == "text/event-stream"
                log.info("other chat session=telegram:2")
                log.debug("too low session=telegram:1")
                log.warning("new line session=telegram:1 with %s", SECRET)
                event = await read_event(r)
                assert event["level"] == "WARNING" and event["seq"] > last
                assert event["text"].endswith("new line session=telegram:1 with ***")
                assert gateway.logs.watching == 1
                # Logged out in another tab: the stream ends at its next line.
                status, _, _ = await b.post("/logout", {"csrf": await b.csrf("/logs")})
                assert status == 303
                log.warning("after logout session=telegram:1")
                rest = await r.content.read()
                assert b"after logout" not in rest
                assert gateway.logs.watching == 0


async def test_alone_the_page_says_where_the_log_is(tmp_path):
    data = config_dict(tmp_path, NO_LLM, web=panel_section())
    config = tmp_path / "config.json"
    config.write_text(json.dumps(data))
    cfg, _ = load_config(config)
    async with browsing(cfg, config) as b:
        await b.login()
        status, text, _ = await b.get("/logs")
        assert status == 200 and "journalctl -u memobot -f" in text
        assert "The gateway is not running" in text
        status, _, _ = await b.get("/logs/stream")
        assert status == 404


async def test_the_overview_shows_the_last_warnings_and_errors(tmp_path):
    async with gateway_panel(tmp_path) as (_, b):
        log.info("an ordinary line")
        log.warning("channel telegram reconnecting: <timeout> key %s", SECRET)
        log.error("a turn failed session=telegram:1001")
        _, text, _ = await b.get("/")
        shown = text.split("Recent warnings and errors", 1)[1]
        assert shown.index("a turn failed") < shown.index("reconnecting: &lt;timeout&gt; key ***")
        assert "an ordinary line" not in shown and SECRET not in text
    (tmp_path / "alone").mkdir()
    config = write_config(tmp_path / "alone", NO_LLM, web=panel_section())
    cfg, _ = load_config(config)
    async with browsing(cfg, config) as b:
        await b.login()
        _, text, _ = await b.get("/")
        assert "Shown while the gateway runs" in text


async def test_the_stream_ends_when_its_session_expires(tmp_path):
    """An open stream is no use of the panel: past the session's idle time, no more lines."""
    async with asyncio.timeout(20), gateway_panel(tmp_path) as (gateway, b):
        last = gateway.logs.recent()[-1].seq if gateway.logs.recent() else 0
        query = {"level": "INFO", "after": str(last)}
        async with b.http.get(b.base + "/logs/stream", params=query) as r:
            assert r.status == 200
            sessions = b.panel.sessions
            now = sessions.clock()
            sessions.clock = lambda: now + sessions.idle_seconds + 1
            log.warning("after expiry session=telegram:1")
            assert b"after expiry" not in await r.content.read()
