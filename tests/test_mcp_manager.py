"""McpManager's bookkeeping when restarts and reloads meet (the panel's Restart button, a
second click, a reload removing the server meanwhile): every server it starts is one it
holds, so every one is stopped. The servers are stand-ins (no process): the point is which
ones start and stop, and in what order."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, ClassVar

import pytest

from bot.config import parse_config
from bot.tools import mcp
from bot.tools.base import ToolRegistry


class StandIn:
    """An McpServer as the manager sees it: start, a stop that waits to be let go, tools."""

    made: ClassVar[list[StandIn]] = []

    def __init__(self, name: str, cfg: Any, tools_cfg: Any, **_: Any) -> None:
        self.name, self.cfg, self.tools_cfg = name, cfg, tools_cfg
        self.tools: list[Any] = []
        self.running = False
        self.stopping = False
        self.let_go = asyncio.Event()
        StandIn.made.append(self)

    def start(self) -> None:
        assert not self.stopping
        self.running = True

    async def stop(self) -> None:
        self.stopping = True
        await self.let_go.wait()  # a stdio server's process takes a moment to end
        self.running = False


@pytest.fixture
def manager(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> mcp.McpManager:
    StandIn.made = []
    monkeypatch.setattr(mcp, "McpServer", StandIn)
    tools = parse_config({"tools": {"mcpServers": {"a": {"command": "a-server"}}}}).tools
    m = mcp.McpManager(tools, ToolRegistry(), gate=None, workspace=tmp_path)
    m.start()
    return m


def running(m: mcp.McpManager) -> list[StandIn]:
    return [s for s in StandIn.made if s.running]


async def test_two_restarts_at_once_leave_one_server_running(manager):
    first = manager.servers[0]
    one = asyncio.create_task(manager.restart("a"))
    two = asyncio.create_task(manager.restart("a"))
    await asyncio.sleep(0)  # both are waiting for a stop now
    for s in StandIn.made:
        s.let_go.set()
    assert await one and await two
    assert running(manager) == manager.servers and len(manager.servers) == 1
    assert manager.servers[0] is not first and not first.running
    await manager.stop()
    assert running(manager) == []


async def test_a_restart_meeting_a_reload_that_removes_the_server_starts_nothing(manager):
    restarting = asyncio.create_task(manager.restart("a"))
    await asyncio.sleep(0)
    assert manager.apply(parse_config({}).tools) == ["-a"]
    for s in StandIn.made:
        s.let_go.set()
    assert await restarting
    await manager.stop()
    assert manager.servers == [] and running(manager) == []


async def test_a_call_cut_by_the_servers_removal_does_not_say_it_reconnects(tmp_path, caplog):
    tools = parse_config({"tools": {"mcpServers": {"a": {"command": "a-server"}}}}).tools
    server = mcp.McpServer(
        "a", tools.mcp_servers["a"], tools, gate=None, workspace=tmp_path, log_dir=None,
        on_tools=lambda: None,
    )  # fmt: skip
    await server.stop()  # removed by a reload while a call was under way
    server.restart("the connection closed during search")  # what the cut call reports
    assert server.state == "stopped" and "reconnecting" not in caplog.text


async def test_a_reload_that_turns_confinement_on_starts_stdio_servers_afresh(
    monkeypatch, tmp_path
):
    """A stdio server's confinement is set when it starts: one started while the workspace
    was unrestricted stayed unconfined after a reload restricted it. A url server has no
    process of ours to confine and keeps its connection."""
    StandIn.made = []
    monkeypatch.setattr(mcp, "McpServer", StandIn)
    servers = {"local": {"command": "a-server"}, "remote": {"url": "https://mcp.example.org/mcp"}}
    loose = parse_config({"tools": {"restrictToWorkspace": False, "mcpServers": servers}}).tools
    m = mcp.McpManager(loose, ToolRegistry(), gate=None, workspace=tmp_path)
    m.start()
    local, remote = m.servers
    loose.restrict_to_workspace = True  # as a reload assigns it, in place
    for s in StandIn.made:
        s.let_go.set()
    assert m.apply(loose) == ["~local"]
    for _ in range(3):  # the old one stops (let go already), then the new one starts
        await asyncio.sleep(0)
    assert m.servers[1] is remote and m.servers[0] is not local and m.servers[0].running
    assert m.apply(loose) == []  # nothing changed since
    for s in StandIn.made:
        s.let_go.set()
    await m.stop()
    assert running(m) == []


async def test_a_call_under_way_when_its_server_is_removed_says_so(tmp_path):
    """The transport fails under the call because the server is being stopped (a reload
    removed it): the model is told that, not that the server crashed and is reconnecting."""
    from bot.tools.base import ToolError

    tools = parse_config({"tools": {"mcpServers": {"a": {"command": "a-server"}}}}).tools
    server = mcp.McpServer(
        "a", tools.mcp_servers["a"], tools, gate=None, workspace=tmp_path, log_dir=None,
        on_tools=lambda: None,
    )  # fmt: skip

    class Cut:
        async def call_tool(self, *args: Any, **kw: Any) -> Any:
            await server.stop()  # the reload removes the server meanwhile
            raise ConnectionError("the stream closed")

    server.client, server.state = Cut(), "connected"  # type: ignore[assignment]
    server._connected.set()
    with pytest.raises(ToolError) as cut:
        await server.call("search", {}, "telegram:1")
    assert "was stopped during the call" in str(cut.value)
    assert "reconnect" not in str(cut.value)


async def test_a_renewed_server_starts_once_the_old_one_has_stopped(manager):
    """Never two processes of one server at once: they share its log file and folder. A
    reload that changes its settings, a restart and a second restart meeting it all wait for
    every older one of the name to stop."""
    old = manager.servers[0]
    servers = {"a": {"command": "a-server", "args": ["-v"]}}
    changed = parse_config({"tools": {"mcpServers": servers}})
    assert manager.apply(changed.tools) == ["~a"]
    renewed = manager.servers[0]
    restarting = asyncio.create_task(manager.restart("a"))
    await asyncio.sleep(0)
    newest = manager.servers[0]
    await asyncio.sleep(0)
    assert old.running and not renewed.running and not newest.running
    renewed.let_go.set()
    for _ in range(3):
        await asyncio.sleep(0)
    assert not newest.running  # the first one is still stopping
    old.let_go.set()
    assert await restarting
    await asyncio.sleep(0)
    assert running(manager) == [newest] == manager.servers
    newest.let_go.set()
    await manager.stop()
