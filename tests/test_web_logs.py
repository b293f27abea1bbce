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


async def test_a_closed_page_ends_its_quiet_stream_and_open_streams_are_bounded(
    tmp_path, monkeypatch
):
    """A stream whose filter no line passes never wrote, so a closed tab's stream waited
    forever (each one more watcher fed every line); now a quiet stream writes a comment now
    and then, and the first write to a closed page ends it. At most MAX_STREAMS at once."""
    from bot.web.screens import logs as screen

    monkeypatch.setattr(screen, "KEEPALIVE_SECONDS", 0.05)
    monkeypatch.setattr(screen, "MAX_STREAMS", 2)
    async with asyncio.timeout(20), gateway_panel(tmp_path) as (gateway, b):
        quiet = {"session": "telegram:nobody"}
        async with b.http.get(b.base + "/logs/stream", params=quiet) as r:
            assert r.status == 200
            assert await r.content.readline() == b": still here\n"
            async with b.http.get(b.base + "/logs/stream", params=quiet) as second:
                assert second.status == 200 and gateway.logs.watching == 2
                status, text, _ = await b.get("/logs/stream")
                assert status == 503 and "refresh" in text
            r.connection.transport.close()  # the tab is closed
        for _ in range(500):  # within a keep-alive or two
            if not gateway.logs.watching:
                break
            await asyncio.sleep(0.01)
        assert gateway.logs.watching == 0


async def test_a_logged_name_cannot_forge_a_line_nor_flood_out_the_warnings(tmp_path):
    """The model names the tools it calls, and the runner logs that name: a line break, a CR,
    an ESC or a bidi override in it must not make a line of its own on the page; and as many
    ordinary lines as the ring holds must not push a warning out of the Overview."""
    from bot.service.log_ring import RING_LINES

    forged = "x\n2026-12-06 18:00:00,000 ERROR bot.gate: fake\rover\x1b[2J\u202eesrever"
    async with gateway_panel(tmp_path) as (gateway, b):
        log.warning("tool %s refused session=%s: not offered", forged, "telegram:1")
        text = gateway.logs.recent()[-1].text
        assert gateway.logs.recent()[-1].session == "telegram:1"  # not "telegram:1:"
        assert "\n    2026-12-06 18:00:00,000 ERROR" in text
        assert "fake⟨U+000D⟩over⟨U+001B⟩[2J⟨U+202E⟩esrever" in text
        assert not any(line.startswith("2026") for line in text.splitlines()[1:])
        for i in range(RING_LINES + 10):
            log.info("an ordinary line %d", i)
        assert all(line.levelno == logging.INFO for line in gateway.logs.recent())
        _, page, _ = await b.get("/")
        assert "ERROR bot.gate: fake" in page.split("Recent warnings and errors", 1)[1]
        _, page, _ = await b.get("/logs", params={"level": "WARNING"})
        assert "ERROR bot.gate: fake" in page and "an ordinary line" not in page
        for i in range(RING_LINES + 10):  # one warning the model can repeat, call after call
            log.warning("tool x%d refused session=telegram:1: not offered in this chat", i)
        _, page, _ = await b.get("/")
        shown = page.split("Recent warnings and errors", 1)[1]
        assert "ERROR bot.gate: fake" in shown and shown.count("not offered in this chat") == 5


async def test_a_tool_name_the_model_writes_cannot_file_its_line_under_another_chat(
    tmp_path, caplog
):
    """The runner logs the name of each call the model makes, whether the tool exists and is
    offered or not; a name holding " session=<the owner's chat>" filed the line there."""
    from bot.llm import ToolCall
    from bot.runner import Runner
    from bot.service.logs import session_of
    from bot.tools.base import ToolContext, ToolRegistry

    runner = Runner(None, ToolRegistry(), max_iterations=1)  # type: ignore[arg-type]
    ctx = ToolContext(tmp_path, session_key="telegram:-100group")
    name = "x session=telegram:1001\nforged"
    caplog.set_level(logging.INFO, logger="bot.runner")
    for offered in ({"message"}, None):  # refused as not offered; run (an unknown tool)
        await runner._run_calls([ToolCall("c1", name, "{}")], [], ctx, 0, offered, None)
    records = [r for r in caplog.records if r.name == "bot.runner"]
    assert len(records) == 2
    for record in records:
        assert session_of(record) == "telegram:-100group" and "\n" not in record.getMessage()


async def test_a_stream_ends_when_its_session_expires(tmp_path):
    """An open stream is not use: a tab left open past the 12 idle hours gets no more lines
    (it kept streaming the log to a session that had expired)."""
    from bot.web.sessions import IDLE_SECONDS

    async with asyncio.timeout(20), gateway_panel(tmp_path) as (gateway, b):
        now = [b.panel.sessions.clock()]
        b.panel.sessions.clock = lambda: now[0]
        query = {"session": "telegram:1", "after": str(gateway.logs.recent()[-1].seq)}
        async with b.http.get(b.base + "/logs/stream", params=query) as r:
            log.warning("first session=telegram:1")
            assert (await read_event(r))["text"].endswith("first session=telegram:1")
            now[0] += IDLE_SECONDS + 1
            log.warning("after the idle hours session=telegram:1")
            assert b"after the idle hours" not in await r.content.read()
        assert gateway.logs.watching == 0
