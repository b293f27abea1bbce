"""MCP servers as tools (issue 14): a real stdio server (the SDK's MCPServer) and real
Streamable HTTP and SSE ones on 127.0.0.1, driven through the real ``memobot`` command and the
scripted fake LLM; what the tools returned is read back from the next LLM request."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bot.config import ConfigError, McpServerConfig, parse_config
from bot.gate import launcher
from bot.tools.base import ToolRegistry
from bot.tools.mcp import _describe, _transport_hint, input_schema, tool_name
from tests.fakes.llm_server import FakeLLM, FakeLLMThread, call, reply, tool_step
from tests.helpers import (
    REPO,
    Harness,
    alive,
    closed_port,
    make_config,
    request_messages,
    run_memobot,
    sleepers,
    wait_for,
    write_config,
    zygote,
)

FAKE_SERVER = REPO / "tests" / "fakes" / "mcp_server.py"
RAW_SERVER = REPO / "tests" / "fakes" / "mcp_raw_server.py"
SYSTEM_PYTHON = Path("/usr/bin/python3")


@pytest.fixture
def llm() -> Iterator[FakeLLMThread]:
    with FakeLLM.start_in_thread() as server:
        yield server


def _served(folder: Path, how: str, path: str) -> Iterator[str]:
    port_file = folder / "port"
    proc = subprocess.Popen(
        [sys.executable, str(FAKE_SERVER), how, str(port_file)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=REPO,
    )
    try:
        assert wait_for(port_file.exists, 15), f"the MCP server ({how}) did not start"
        yield f"http://127.0.0.1:{port_file.read_text()}{path}"
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture(scope="module")
def http_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The fake server over Streamable HTTP; its URL."""
    yield from _served(tmp_path_factory.mktemp("mcp-http"), "--http", "/mcp")


@pytest.fixture(scope="module")
def sse_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The fake server over the older SSE transport; its URL."""
    yield from _served(tmp_path_factory.mktemp("mcp-sse"), "--sse", "/sse")


def stdio_server(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    """The SDK server over stdio. The venv's interpreter is outside what Landlock lets a
    confined process read, so these run with the sandbox off (restricted environment kept);
    the confined case uses the stdlib server below."""
    return {
        "command": sys.executable,
        "args": [str(FAKE_SERVER), "--start-file", str(tmp_path / "starts")],
        **extra,
    }


def mcp_config(tmp_path: Path, llm: FakeLLMThread, servers: dict[str, Any], **tools: Any) -> Path:
    return write_config(
        tmp_path,
        llm.base_url,
        tools={"exec": {"sandbox": "off"}, "mcpServers": servers, **tools},
    )


def results(llm: FakeLLMThread, request: int) -> dict[str, str]:
    messages = request_messages(llm.requests[request])
    return {m["tool_call_id"]: m["content"] for m in messages if m["role"] == "tool"}


def tools_of(llm: FakeLLMThread, request: int) -> list[str]:
    return [t["function"]["name"] for t in llm.requests[request]["body"].get("tools", [])]


# -- pure parts ---------------------------------------------------------------------------------


def test_tool_names_fit_the_function_name_charset() -> None:
    assert tool_name("fs", "read_file") == "mcp_fs_read_file"
    assert tool_name("my-srv", "get.item/v2") == "mcp_my-srv_get_item_v2"
    assert len(tool_name("s", "x" * 200)) == 64
    assert input_schema(None) == {"type": "object", "properties": {}}


def test_config_keys_are_nanobots() -> None:
    cfg = parse_config(
        {
            "tools": {
                "mcpServers": {
                    "fs": {"command": "npx", "args": ["-y", "srv"], "env": {"A": "1"}},
                    "web": {
                        "url": "https://x.example/mcp",
                        "headers": {"Authorization": "Bearer t"},
                        "toolTimeout": 5,
                        "enabledTools": ["search"],
                    },
                }
            }
        }
    )
    web = cfg.tools.mcp_servers["web"]
    assert web.transport == "http" and web.tool_timeout == 5 and web.enabled_tools == ["search"]
    assert cfg.tools.mcp_servers["fs"].enabled_tools == ["*"]


def test_replacing_a_group_keeps_the_cached_schemas_when_nothing_changed() -> None:
    from bot.tools.message import MessageTool
    from bot.tools.search import WebSearchTool

    reg = ToolRegistry()
    reg.register(MessageTool())
    first = reg.schemas()
    cfg = parse_config({}).tools.web
    assert reg.replace_group("mcp", [WebSearchTool(cfg)])
    second = reg.schemas()
    assert second is not first and [s["function"]["name"] for s in second] == [
        "message",
        "web_search",
    ]
    assert not reg.replace_group("mcp", [WebSearchTool(cfg)])
    assert reg.schemas() is second  # the same list object: byte-identical requests


# -- through the real command -------------------------------------------------------------------


def test_stdio_tools_results_and_a_stable_prompt_across_turns(
    tmp_path: Path, llm: FakeLLMThread, http_server: str
) -> None:
    secret = f"secret-{uuid.uuid4().hex}"
    servers = {
        "fake": stdio_server(tmp_path, env={"FAKE_SETTING": "on"}),
        "remote": {"url": http_server, "enabledTools": ["add", "mcp_remote_echo"]},
    }
    cfg = mcp_config(tmp_path, llm, servers)
    llm.script(
        tool_step(
            call("mcp_fake_echo", {"text": "hi"}, id="echo"),
            call("mcp_fake_picture", {}, id="picture"),
            call("mcp_fake_fail", {"why": "x"}, id="fail"),
            call("mcp_fake_read", {"path": "/proc/self/environ"}, id="env"),
            call("mcp_remote_add", {"a": 2, "b": 3}, id="add"),
        ),
        reply("first done"),
        reply("second done"),
    )
    done = run_memobot(
        "agent", config=cfg, stdin="first\nsecond\n", env={"MEMOBOT_TEST_SECRET": secret}
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["first done", "second done"]
    out = results(llm, 1)
    assert out["echo"] == "echo: hi"
    assert out["picture"].startswith("[image image/png, ")
    assert out["fail"].startswith("Error:") and "failed on purpose: x" in out["fail"]
    assert "FAKE_SETTING=on" in out["env"] and "MEMOBOT_GATE=" in out["env"]
    assert secret not in out["env"] and "test-key" not in out["env"]
    assert out["add"] == "5"
    names = tools_of(llm, 0)
    mcp = [n for n in names if n.startswith("mcp_")]
    assert names[-len(mcp) :] == mcp  # after the built-in tools
    assert mcp == [
        *(f"mcp_fake_{t}" for t in ("add", "crash", "echo", "fail", "hang", "picture")),
        "mcp_fake_read",
        "mcp_fake_spawn",
        "mcp_remote_add",
        "mcp_remote_echo",
    ]
    # Byte-identical tools in every request of both turns (the provider's prompt cache).
    bodies = [json.dumps(r["body"]["tools"]) for r in llm.requests]
    assert len(bodies) == 3 and len(set(bodies)) == 1


def test_an_sse_server_as_nanobot_configures_one(
    tmp_path: Path, llm: FakeLLMThread, sse_server: str
) -> None:
    """nanobot's ``{"url": ".../sse"}`` (or ``"type": "sse"``) pastes in and works: the
    tools are listed and called over the SSE stream, once for each of the two spellings."""
    servers = {
        "legacy": {"url": sse_server, "toolTimeout": 10},
        # A key in the url, as some hosted servers take it: never printed by mcp list.
        "typed": {"type": "sse", "url": sse_server + "?key=${MCP_KEY}", "enabledTools": ["echo"]},
    }
    cfg = mcp_config(tmp_path, llm, servers)
    env = {"MCP_KEY": "s3cret-in-url"}
    llm.script(
        tool_step(
            call("mcp_legacy_add", {"a": 2, "b": 3}, id="add"),
            call("mcp_typed_echo", {"text": "over sse"}, id="echo"),
        ),
        reply("done"),
    )
    done = run_memobot("agent", "-m", "go", config=cfg, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "done"
    assert results(llm, 1) == {"add": "5", "echo": "echo: over sse"}
    listed = run_memobot("mcp", "list", config=cfg, env=env)
    assert f"legacy (sse: {sse_server}): connected" in listed.stdout, listed.stdout
    assert f"typed (sse: {sse_server}?key=" in listed.stdout
    assert "connected, 1 tool(s)" in listed.stdout
    assert "s3cret-in-url" not in listed.stdout + listed.stderr + done.stderr


def test_an_sse_server_that_goes_away_is_one_line_not_a_traceback(
    tmp_path: Path, llm: FakeLLMThread
) -> None:
    """The SDK logs every dropped SSE stream as an error with a 65-line traceback; memobot
    says it in one line and reconnects."""
    with contextlib.contextmanager(_served)(tmp_path, "--sse", "/sse") as url:
        cfg = mcp_config(tmp_path, llm, {"legacy": {"url": url}})
        llm.script(tool_step(call("mcp_legacy_crash", {}, id="crash")), reply("noted"))
        done = run_memobot("agent", "-m", "go", config=cfg)
    assert done.returncode == 0, done.stderr
    assert results(llm, 1)["crash"].startswith("Error: MCP server 'legacy'")
    assert "Traceback" not in done.stderr and "sse_reader" not in done.stderr, done.stderr


def test_a_transport_mismatch_says_what_to_try() -> None:
    refused = Exception("Client error '405 Method Not Allowed' for url 'x'\nFor more: https://y")
    assert _describe(refused) == "Exception: Client error '405 Method Not Allowed' for url 'x'"
    inferred = McpServerConfig.model_validate({"url": "https://h/sse"})
    assert '"type": "streamableHttp"' in _transport_hint(inferred, refused)
    typed = McpServerConfig.model_validate({"url": "https://h/sse", "type": "streamableHttp"})
    assert '"type": "sse"' in _transport_hint(typed, Exception("Server returned an error"))
    assert _transport_hint(McpServerConfig.model_validate({"url": "https://h/mcp"}), refused) == ""


def test_the_transport_is_read_as_nanobot_reads_it() -> None:
    def transport(**server: Any) -> str:
        return McpServerConfig.model_validate(server).transport

    assert transport(url="https://h/sse") == "sse"
    assert transport(url="https://h/sse/") == "sse"
    assert transport(url="https://h/sse?key=k") == "http"  # nanobot reads the whole url
    assert transport(url="https://h/mcp") == "http"
    assert transport(url="https://h/sse", type="streamableHttp") == "http"
    assert transport(url="https://h/events", type="sse") == "sse"
    assert transport(command="x") == "stdio"
    with pytest.raises(ValueError, match='type "sse" needs a url'):
        McpServerConfig.model_validate({"type": "sse", "command": "x"})


def test_a_crash_and_a_hang_give_errors_and_the_server_comes_back(
    tmp_path: Path, llm: FakeLLMThread
) -> None:
    cfg = mcp_config(tmp_path, llm, {"fake": stdio_server(tmp_path, toolTimeout=1)})
    llm.script(
        tool_step(call("mcp_fake_crash", {}, id="crash")),
        tool_step(call("mcp_fake_echo", {"text": "back"}, id="after_crash")),
        tool_step(call("mcp_fake_hang", {"seconds": 30}, id="hang")),
        tool_step(call("mcp_fake_echo", {"text": "again"}, id="after_hang")),
        reply("done"),
    )
    started = time.monotonic()
    done = run_memobot("agent", "-m", "go", config=cfg)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "done\n"
    assert results(llm, 1)["crash"].startswith(
        "Error: MCP server 'fake' closed the connection during the call"
    )
    assert results(llm, 2)["after_crash"] == "echo: back"
    assert results(llm, 3)["hang"] == (
        "Error: MCP server 'fake' did not answer hang within 1 s (toolTimeout); the server "
        "is being restarted."
    )
    assert results(llm, 4)["after_hang"] == "echo: again"
    assert len((tmp_path / "starts").read_text().split()) == 3  # two restarts
    assert time.monotonic() - started < 20


def test_a_missing_server_never_stops_the_answer(tmp_path: Path, llm: FakeLLMThread) -> None:
    servers = {
        "gone": {"command": "/nonexistent/mcp-server"},
        "down": {"url": "http://127.0.0.1:9/mcp"},
    }
    cfg = mcp_config(tmp_path, llm, servers)
    llm.script(reply("fine without them"))
    started = time.monotonic()
    done = run_memobot("agent", "-m", "hello", config=cfg)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "fine without them\n"
    assert time.monotonic() - started < 15
    assert not [n for n in tools_of(llm, 0) if n.startswith("mcp_")]
    assert "mcp server gone:" in done.stderr and "/nonexistent/mcp-server" in done.stderr
    assert "mcp server down:" in done.stderr
    listed = run_memobot("mcp", "list", config=cfg)
    assert listed.returncode == 1
    assert "gone (stdio: /nonexistent/mcp-server): failed" in listed.stdout
    assert "down (http: http://127.0.0.1:9/mcp): failed" in listed.stdout


async def test_a_server_that_appears_later_is_picked_up_once(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Missing at start: turns go on without it; once it answers, its tools are registered
    once and stay byte-identical from then on."""
    import asyncio

    async with FakeLLM() as llm:
        port_file = tmp_path / "port"
        # A free port, then the server on it only after memobot has tried once.
        port = closed_port()
        url = f"http://127.0.0.1:{port}/mcp"
        cfg = make_config(tmp_path, llm.base_url, tools={"mcpServers": {"late": {"url": url}}})
        async with Harness(cfg, tmp_path / "config.json") as h:
            h.stack.mcp.start()
            await h.stack.mcp.wait_ready(30)  # a refused port fails at once; a loaded CI is slow
            assert h.stack.mcp.servers[0].state == "failed"
            assert (await h.ask("one")).startswith("echo:")
            launcher_code = (
                "import socket,sys,uvicorn\n"
                f"sys.path.insert(0, {str(REPO)!r})\n"
                "from tests.fakes.mcp_server import server\n"
                f"s=socket.socket(); s.bind(('127.0.0.1',{port}))\n"
                "uvicorn.Server(uvicorn.Config(server.streamable_http_app(),"
                "log_level='warning')).run(sockets=[s])\n"
            )
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-c",
                launcher_code,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            try:
                for _ in range(600):  # the server's interpreter imports the MCP SDK first
                    if h.stack.mcp.servers[0].state == "connected":
                        break
                    await asyncio.sleep(0.1)
                assert h.stack.mcp.servers[0].state == "connected"
                assert "mcp: 1 server(s) (1 connected), 8 tool(s)" in await h.ask("/status")
                await h.ask("two")
                await h.ask("three")
            finally:
                proc.terminate()
                await proc.wait()
        tools = [[t["function"]["name"] for t in r["body"].get("tools", [])] for r in llm.requests]
        assert "mcp_late_echo" not in tools[0] and "mcp_late_echo" in tools[1]
        assert json.dumps(llm.requests[1]["body"]["tools"]) == json.dumps(
            llm.requests[2]["body"]["tools"]
        )
    del port_file


def test_a_sigkilled_memobot_leaves_no_server_and_no_child(
    tmp_path: Path, llm: FakeLLMThread
) -> None:
    tag = f"{4000 + uuid.uuid4().int % 50000}.{uuid.uuid4().int % 1000}"
    cfg = mcp_config(tmp_path, llm, {"fake": stdio_server(tmp_path)})
    llm.script(
        tool_step(call("mcp_fake_spawn", {"tag": tag})),
        tool_step(call("mcp_fake_hang", {"seconds": 60})),
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    agent = zygote.popen(
        ["--config", str(cfg), "agent", "-m", "go"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
        cwd=REPO,
    )  # fmt: skip
    try:
        assert wait_for(lambda: len(llm.requests) >= 2 and sleepers(tag), 20), "no child"
        server = int((tmp_path / "starts").read_text().split()[0])
        assert alive(server)
        agent.kill()
        agent.wait(10)
    finally:
        agent.kill()
        agent.communicate()
    gone = wait_for(lambda: not alive(server) and not sleepers(tag), 10)
    for pid in sleepers(tag):
        os.kill(pid, signal.SIGKILL)
    assert gone, "the MCP server or its child outlived memobot"


@pytest.mark.skipif(launcher.landlock_abi() < 1, reason="needs Landlock")
@pytest.mark.skipif(not SYSTEM_PYTHON.exists(), reason="needs /usr/bin/python3")
def test_a_confined_stdio_server_cannot_read_the_config(tmp_path: Path, llm: FakeLLMThread) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    shutil.copy(RAW_SERVER, ws / "server.py")
    (ws / "note.txt").write_text("inside")
    server = {"command": str(SYSTEM_PYTHON), "args": ["-I", str(ws / "server.py")]}
    cfg = write_config(tmp_path, llm.base_url, tools={"mcpServers": {"raw": server}})
    llm.script(
        tool_step(
            call("mcp_raw_read", {"path": str(cfg)}, id="config"),
            call("mcp_raw_read", {"path": str(ws / "note.txt")}, id="note"),
        ),
        reply("done"),
    )
    done = run_memobot("agent", "-m", "go", config=cfg)
    assert done.returncode == 0, done.stderr
    out = results(llm, 1)
    assert out["config"] == "cannot read: Permission denied"
    assert out["note"] == "inside"


PLANTED = "import os, sys\nopen({marker!r}, 'w').write(repr(dict(os.environ)))\nsys.exit(1)\n"
NODE_PLANTED = "#!/bin/sh\nenv > {marker}\n"


def plant_modules(ws: Path) -> Path:
    """What a model could write into its workspace for a server started as ``python -m
    memotest_srv`` or ``npx memotest-planted``: code that hands the server's environment
    (its ``env`` secrets) to the model. Returns the marker file it writes."""
    marker = ws / "planted.txt"
    (ws / "memotest_srv.py").write_text(PLANTED.format(marker=str(marker)))
    bin_dir = ws / "node_modules" / ".bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "memotest-planted").write_text(NODE_PLANTED.format(marker=marker))
    (bin_dir / "memotest-planted").chmod(0o755)
    return marker


def test_a_stdio_server_never_starts_in_the_workspace(tmp_path: Path, llm: FakeLLMThread) -> None:
    ws, lib = tmp_path / "ws", tmp_path / "lib"
    ws.mkdir()
    lib.mkdir()
    shutil.copy(RAW_SERVER, lib / "memotest_srv.py")  # the real server, on its PYTHONPATH
    marker = plant_modules(ws)
    secret = f"secret-{uuid.uuid4().hex}"
    env = {"PYTHONPATH": str(lib), "SERVER_SECRET": secret}
    py = {"command": sys.executable, "args": ["-m", "memotest_srv"], "env": env}
    # The control: started in the workspace, python imports the planted module first.
    argv = [sys.executable, "-m", "memotest_srv"]
    subprocess.run(argv, cwd=ws, env=env, stdin=subprocess.DEVNULL, capture_output=True)
    assert secret in marker.read_text()
    marker.unlink()
    offline = {"SERVER_SECRET": secret, "npm_config_offline": "true"}
    node = {"command": "npx", "args": ["--no", "memotest-planted"], "env": offline}
    servers: dict[str, Any] = {"py": py}
    if shutil.which("npx"):  # the same control: npx runs the workspace's node_modules
        home = {"PATH": os.environ["PATH"], "HOME": str(tmp_path / "npm"), **offline}
        subprocess.run(["npx", *node["args"]], cwd=ws, env=home, capture_output=True)
        assert secret in marker.read_text()
        marker.unlink()
        servers["node"] = node
    cfg = mcp_config(tmp_path, llm, servers)
    llm.script(
        tool_step(call("mcp_py_read", {"path": "/proc/self/environ"}, id="env")), reply("done")
    )
    done = run_memobot("agent", "-m", "go", config=cfg, env={"NODE_PATH": str(ws / "node_modules")})
    assert done.returncode == 0, done.stderr
    assert not marker.exists()
    environ = results(llm, 1)["env"].split("\0")
    own = tmp_path / "state" / "mcp" / "py"
    assert f"HOME={own}" in environ and "PYTHONSAFEPATH=1" in environ
    assert not [v for v in environ if v.startswith("NODE_PATH=")]
    assert own.is_dir() and (own.stat().st_mode & 0o777) == 0o700


@pytest.mark.skipif(launcher.landlock_abi() < 1, reason="needs Landlock")
@pytest.mark.skipif(not SYSTEM_PYTHON.exists(), reason="needs /usr/bin/python3")
def test_a_servers_own_cwd_is_honoured(tmp_path: Path, llm: FakeLLMThread) -> None:
    """With ``cwd`` it starts there (confined, it may read it) and imports from it: the
    owner chose that folder."""
    ws, project = tmp_path / "ws", tmp_path / "project"
    ws.mkdir()
    project.mkdir()
    marker = plant_modules(ws)
    shutil.copy(RAW_SERVER, project / "memotest_srv.py")
    (project / "note.txt").write_text("from the project")
    server = {"command": str(SYSTEM_PYTHON), "args": ["-m", "memotest_srv"], "cwd": str(project)}
    cfg = write_config(tmp_path, llm.base_url, tools={"mcpServers": {"proj": server}})
    llm.script(
        tool_step(
            call("mcp_proj_read", {"path": "note.txt"}, id="note"),
            call("mcp_proj_read", {"path": "/proc/self/environ"}, id="env"),
        ),
        reply("done"),
    )
    done = run_memobot("agent", "-m", "go", config=cfg)
    assert done.returncode == 0, done.stderr
    out = results(llm, 1)
    assert out["note"] == "from the project"
    environ = out["env"].split("\0")
    assert f"HOME={tmp_path / 'state' / 'mcp' / 'proj'}" in environ
    assert "PYTHONSAFEPATH=1" not in environ
    assert not marker.exists()


def test_a_relative_cwd_is_refused_with_its_path() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"tools": {"mcpServers": {"x": {"command": "srv", "cwd": "srv/data"}}}})
    assert "tools.mcpServers.x.cwd" in str(err.value) and "absolute" in str(err.value)
    parse_config({"tools": {"mcpServers": {"x": {"command": "srv", "cwd": "~/srv"}}}})


def test_doctor_and_status_report_each_server(tmp_path: Path, llm: FakeLLMThread) -> None:
    from bot.config import load_config
    from bot.service.doctor import check_mcp

    servers = {"fake": stdio_server(tmp_path), "gone": {"command": "/nonexistent/mcp-server"}}
    path = mcp_config(tmp_path, llm, servers)
    (tmp_path / "ws").mkdir()
    cfg, _ = load_config(path)
    checks = {c.text.split(":")[0]: c for c in check_mcp(cfg, path)}
    assert checks["mcp server fake"].status == "ok"
    assert "starts, 8 tool(s): mcp_fake_add, mcp_fake_crash" in checks["mcp server fake"].text
    gone = checks["mcp server gone"]
    assert gone.status == "fail" and "/nonexistent/mcp-server" in gone.text
    assert str(tmp_path / "state" / "mcp" / "gone.log") in gone.fix
    status = run_memobot("status", config=path)
    assert "mcp        2 server(s) configured; states while the gateway runs" in status.stdout
