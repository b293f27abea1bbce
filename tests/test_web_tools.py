"""The panel's Tools screen with a gateway built in process: a built-in tool turned off and on
and the exec allowlist edited (the config file changed with the rest of it kept, the running
gateway's tools and approval policy changed by its reload path), and an MCP server (the
stdlib stdio one of tests/fakes) added, restarted and removed; its env value never shown."""

from __future__ import annotations

import json
import logging
import stat
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from bot.config import load_config
from bot.gateway import Gateway
from tests.helpers import REPO, config_dict
from tests.helpers.web import Browser, browsing, panel_section

NO_LLM = "http://127.0.0.1:9/v1"
RAW_SERVER = REPO / "tests" / "fakes" / "mcp_raw_server.py"
ENV_SECRET = "rawSECRETvalue77"


@asynccontextmanager
async def gateway_panel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **tools: Any
) -> AsyncIterator[tuple[Gateway, Browser, Path]]:
    monkeypatch.setenv("MEMOBOT_TEST_KEY", "test-key-from-env")
    data = config_dict(tmp_path, NO_LLM, web=panel_section())
    data["llm"]["apiKey"] = "${MEMOBOT_TEST_KEY}"  # a reference the edits must keep as written
    # The venv's python is outside what Landlock lets a confined server read (as test_mcp).
    data["tools"]["exec"]["sandbox"] = "off"
    data["tools"].update(tools)
    config = tmp_path / "config.json"
    config.write_text(json.dumps(data))
    config.chmod(0o600)
    cfg, _ = load_config(config)
    gateway = Gateway(cfg, config)
    gateway.stack.mcp.start()  # as Gateway.run does
    try:
        async with browsing(cfg, config, gateway=gateway) as b:
            await b.login()
            yield gateway, b, config
    finally:
        await gateway.stack.close()


async def post(b: Browser, path: str, **fields: str) -> str:
    """The notice the action left on the page it went back to."""
    status, _, r = await b.post(path, {"csrf": await b.csrf("/tools"), **fields})
    assert status == 303 and r.headers["Location"] == "/tools"
    _, text, _ = await b.get("/tools")
    return text.split('<p class="notice" role="status">', 1)[1].split("</p>", 1)[0]


async def test_a_tool_switched_off_and_the_allowlist_reach_the_running_gateway(
    tmp_path, monkeypatch, caplog
):
    caplog.set_level(logging.INFO)
    async with gateway_panel(tmp_path, monkeypatch) as (gateway, b, config):
        tools = gateway.stack.loop.turns.tools
        assert "exec" in tools.names
        _, text, _ = await b.get("/tools")
        assert "offered to the model" in text
        before = json.loads(config.read_text())

        notice = await post(b, "/tools/switch", section="exec", on="0")
        assert "The running gateway took it" in notice
        after = json.loads(config.read_text())
        assert after["tools"]["exec"]["enabled"] is False
        after["tools"]["exec"].pop("enabled")
        assert after == before  # everything else as written, the ${VAR} reference too
        assert stat.S_IMODE(config.stat().st_mode) == 0o600
        assert "exec" not in tools.names and "web_fetch" in tools.names
        assert gateway.cfg.tools.exec.enabled is False
        assert "tools: exec turned off by web" in caplog.text

        caplog.clear()
        await post(b, "/tools/switch", section="exec", on="1")
        assert "exec" in tools.names
        assert "exec confinement: none" in caplog.text  # said again, as at start
        assert "exec limits: " in caplog.text

        notice = await post(b, "/tools/allow/add", pattern="make test")
        assert "make test" in json.loads(config.read_text())["tools"]["exec"]["allow"]
        assert "make test" in gateway.stack.loop.approvals.policy.exec_allow
        notice = await post(b, "/tools/allow/add", pattern="rm -rf *;")
        assert notice.startswith("Not saved:") and "tools.exec.allow" in notice
        assert "rm -rf" not in config.read_text()
        await post(b, "/tools/allow/remove", pattern="make test")
        assert "make test" not in gateway.stack.loop.approvals.policy.exec_allow

        notice = await post(b, "/tools/switch", section="nope", on="0")
        assert notice == "No such tool."


async def server_pid(gateway: Gateway) -> int:
    """The raw server's own pid, as its ``read`` tool reads /proc/self/stat."""
    tool = gateway.stack.loop.turns.tools.get("mcp_raw_read")
    assert tool is not None
    text = await tool.server.call("read", {"path": "/proc/self/stat"}, "test:1")  # type: ignore[attr-defined]
    return int(text.split()[0])


async def test_an_mcp_server_added_restarted_and_removed(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO)
    async with gateway_panel(tmp_path, monkeypatch) as (gateway, b, config):
        mcp = gateway.stack.mcp
        notice = await post(
            b,
            "/tools/mcp/add",
            name="raw",
            command=sys.executable,
            args=str(RAW_SERVER),
            env=f"RAW_TOKEN={ENV_SECRET}\nEMPTY=",
        )
        assert "mcp server raw added" in notice
        written = json.loads(config.read_text())["tools"]["mcpServers"]["raw"]
        assert written["env"] == {"RAW_TOKEN": ENV_SECRET, "EMPTY": ""}
        await mcp.wait_ready(15)
        [status] = mcp.statuses()
        assert status.state == "connected" and status.tools == ("mcp_raw_read",)
        _, text, _ = await b.get("/tools")
        assert "<code>mcp_raw_read</code>" in text and "<strong>connected</strong>" in text
        assert "<code>RAW_TOKEN</code> (set)" in text and "<code>EMPTY</code> (unset)" in text
        assert ENV_SECRET not in text

        first = await server_pid(gateway)
        notice = await post(b, "/tools/mcp/restart", name="raw")
        assert "restarted" in notice and "mcp server raw restarted by web" in caplog.text
        await mcp.wait_ready(15)
        assert await server_pid(gateway) != first

        notice = await post(b, "/tools/mcp/add", name="../x", command="true")
        assert notice.startswith("Not saved:") and "tools.mcpServers" in notice
        notice = await post(b, "/tools/mcp/add", name="raw", command="true")
        assert "already" in notice

        [server] = mcp.servers
        notice = await post(b, "/tools/mcp/remove", name="raw")
        assert "mcp server raw removed" in notice
        assert json.loads(config.read_text())["tools"]["mcpServers"] == {}
        assert mcp.servers == [] and "mcp_raw_read" not in gateway.stack.loop.turns.tools.names
        assert server.task is not None
        await server.task  # it stops (its process ends with it)
        assert server.state == "stopped"
        notice = await post(b, "/tools/mcp/restart", name="raw")
        assert "no MCP server raw" in notice


async def test_alone_a_change_counts_at_the_next_start(tmp_path):
    data = config_dict(tmp_path, NO_LLM, web=panel_section())
    config = tmp_path / "config.json"
    config.write_text(json.dumps(data))
    cfg, _ = load_config(config)
    async with browsing(cfg, config) as b:
        await b.login()
        notice = await post(b, "/tools/switch", section="web", on="0")
        assert "counts when the gateway starts" in notice
        assert json.loads(config.read_text())["tools"]["web"] == {"enabled": False}
        notice = await post(b, "/tools/mcp/restart", name="x")
        assert "not running" in notice


async def test_two_edits_at_once_both_count(tmp_path, monkeypatch):
    """Each edit reads the file, changes it and writes it whole: two at once (two tabs)
    kept only the second's change, and both said "Saved". Here both reach the write
    together unless the screen takes them one at a time."""
    import asyncio
    import threading

    from bot.web.screens import tools as screen

    both = threading.Barrier(2)
    real = screen.set_options

    def together(*args: Any) -> Any:
        try:
            both.wait(timeout=0.3)
        except threading.BrokenBarrierError:
            pass  # one at a time: the other is not coming
        return real(*args)

    monkeypatch.setattr(screen, "set_options", together)
    data = config_dict(tmp_path, NO_LLM, web=panel_section())
    config = tmp_path / "config.json"
    config.write_text(json.dumps(data))
    cfg, _ = load_config(config)
    async with browsing(cfg, config) as b:
        await b.login()
        csrf = await b.csrf("/tools")
        adds = [
            b.post("/tools/allow/add", {"csrf": csrf, "pattern": p}) for p in ("make a", "make b")
        ]
        assert [status for status, _, _ in await asyncio.gather(*adds)] == [303, 303]
    assert {"make a", "make b"} <= set(json.loads(config.read_text())["tools"]["exec"]["allow"])
