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
    await response.write(f"event: endpoint\ndata: {request.app['endpoint']}\n\n".encode())
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
    cfg = parse_config({"tools": {"mcpServers": {"remote": {"url": url}}}}, tmp_path / "c.json")
    [status] = await probe_servers(
        cfg.tools, gate=None, workspace=tmp_path, log_dir=None, seconds=5.0
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
