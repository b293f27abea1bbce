"""An SSE MCP server that connects but cannot be used says why, not only "no answer".

The SDK's SSE transport refuses a message endpoint on another origin and logs a failed POST,
then waits; memobot used to report only its own connect timeout. Here a small aiohttp server
on 127.0.0.1 plays the broken server (the working SSE path is in test_mcp.py)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from bot.config import parse_config
from bot.tools import mcp as mcp_module
from bot.tools.mcp import probe_servers


async def _sse_endpoint(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    endpoint = request.app["endpoint"].replace("KEY", request.query.get("key", ""))
    await response.write(f"event: endpoint\ndata: {endpoint}\n\n".encode())
    with_pings = asyncio.Event()
    await with_pings.wait()  # held open, as a real server holds its stream
    return response


async def _refused(request: web.Request) -> web.Response:
    request.app["posts"] += 1
    return web.Response(status=404, text="no such session")


@pytest.fixture
async def broken_sse() -> AsyncIterator[web.Application]:
    app = web.Application()
    app["posts"] = 0
    app.router.add_get("/sse", _sse_endpoint)
    app.router.add_post("/messages", _refused)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    app["url"] = f"http://127.0.0.1:{runner.addresses[0][1]}/sse"
    yield app
    await runner.cleanup()


async def _probe(tmp_path: Path, url: str) -> mcp_module.ServerStatus:
    # Settled as soon as the first try ends (~1.5 s); the margin is for a loaded machine.
    server = {"type": "sse", "url": url}
    cfg = parse_config({"tools": {"mcpServers": {"remote": server}}}, str(tmp_path / "c.json"))
    [status] = await probe_servers(
        cfg.tools, gate=None, workspace=tmp_path, log_dir=None, seconds=15.0
    )
    return status


@pytest.fixture(autouse=True)
def short_connect_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mcp_module, "CONNECT_TIMEOUT_SECONDS", 1.5)


async def test_a_message_endpoint_on_another_origin_is_named(tmp_path, broken_sse, caplog):
    broken_sse["endpoint"] = "http://127.0.0.2:9/messages?session_id=1"
    caplog.set_level(logging.INFO)
    status = await _probe(tmp_path, broken_sse["url"])
    assert status.state == "failed"
    assert "no answer within 1.5 s" in status.detail
    assert "origin does not match" in status.detail, status.detail
    assert "127.0.0.2:9" in status.detail
    assert broken_sse["posts"] == 0  # nothing was sent to the other origin


async def test_a_refused_message_post_is_named(tmp_path, broken_sse):
    broken_sse["endpoint"] = "/messages?session_id=1"
    status = await _probe(tmp_path, broken_sse["url"])
    assert status.state == "failed"
    assert "404" in status.detail, status.detail
    assert broken_sse["posts"] >= 1


async def test_a_key_the_transport_quotes_is_hidden(tmp_path, broken_sse, monkeypatch):
    # doctor and status.json show the detail as it is: a ${VAR} key in the url that the
    # server echoes into its message endpoint (quoted in the 404) must not be in it.
    monkeypatch.setenv("MCP_KEY", "s3cret-in-the-url-42")
    broken_sse["endpoint"] = "/messages?session_id=1&key=KEY"
    status = await _probe(tmp_path, broken_sse["url"] + "?key=${MCP_KEY}")
    assert "404" in status.detail and "key=***" in status.detail, status.detail
    assert "s3cret-in-the-url-42" not in status.detail


def test_a_log_record_that_cannot_be_formatted_does_not_raise():
    # A logging filter's exception would raise at the SDK's own log call.
    server = mcp_module.McpServer.__new__(mcp_module.McpServer)
    server.trouble = ""
    record = logging.LogRecord("mcp.client.sse", logging.ERROR, __file__, 1, "%d", ("x",), None)
    token = mcp_module._CONNECTING.set(server)
    try:
        assert mcp_module._TransportTrouble().filter(record) is True
    finally:
        mcp_module._CONNECTING.reset(token)
    assert server.trouble == "(a log record that could not be read)"
