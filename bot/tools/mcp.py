"""MCP servers as tools: ``tools.mcpServers.<name>`` over stdio, Streamable HTTP or SSE (the
official ``mcp`` SDK), each server tool offered to the model as ``mcp_<server>_<tool>``.

Lifecycle. :class:`McpManager` starts one connection task per server and never waits for it:
a server that is slow, missing or broken never delays memobot's start, never blocks the loop
and never stops the daemon. A task connects, lists the tools, registers them, then holds the
connection until it breaks (the server exits, a call times out or finds the connection closed)
or memobot stops; a broken connection is reopened with backoff. While a server is away its
tools stay registered (the prompt stays the same) and a call gets an ``Error:`` result.

Stable prompt. MCP tools come after the built-in ones, sorted by server and tool name, with the
schemas the server gave. The registry's cached schemas are replaced only when a listing really
differs, so once the servers are up the tools part of every request is byte-identical.

The gate (DESIGN.md section 10). A stdio server is never started beside the gate: its command
line and environment come from :meth:`bot.gate.Gate.launcher_command`, so it runs under the
launcher (subtree cleanup, dies with memobot) with the environment allowlist plus its ``env``,
and under Landlock when the agent is confined (``tools.restrictToWorkspace`` and
``tools.exec.sandbox: "landlock"``, the rule of ``exec``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import contextvars
import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TextIO

from bot.config import McpServerConfig, ToolsConfig, ends_in_sse
from bot.gate.effects import EXTERNAL
from bot.layout import real_path, within
from bot.service.logs import redact
from bot.tools.base import Effects, Tool, ToolContext, ToolError, ToolRegistry
from channels.retry import Reconnect

if TYPE_CHECKING:
    from mcp import Client
    from mcp_types import CallToolResult
    from mcp_types import Tool as RemoteTool

    from bot.gate import Gate

log = logging.getLogger(__name__)

GROUP = "mcp"
MAX_NAME = 64  # the OpenAI function-name limit
CONNECT_TIMEOUT_SECONDS = 30.0
SSE_SILENCE_SECONDS = 300.0  # the SDK's default; SSE servers ping every 15 s or so
# How long a call made while its server reconnects waits for it (at most its toolTimeout).
RECONNECT_WAIT_SECONDS = 10.0
WATCH_SECONDS = 0.5  # how often a live connection is checked for a server that went away
_NAME_CHARS = re.compile(r"[^A-Za-z0-9_-]")
# Interpreters told not to import from the current folder: Python 3.11+ leaves it (and a
# script's folder) off sys.path. NODE_PATH is never passed (not on the gate's allowlist).
SAFE_IMPORTS: dict[str, str] = {"PYTHONSAFEPATH": "1"}

State = Literal["connecting", "connected", "failed", "stopped"]

# The SDK's HTTP transports log why a connection cannot work (an SSE message endpoint on
# another origin, a refused POST) and then wait until memobot's connect timeout: the reason
# is kept for that server's state, told apart by the connection task the record comes from.
TRANSPORT_LOGGERS = ("mcp.client.sse", "mcp.client.streamable_http")
_CONNECTING: contextvars.ContextVar[McpServer | None] = contextvars.ContextVar(
    "mcp_connecting", default=None
)


class _TransportTrouble(logging.Filter):
    """Keeps the first warning or error an SDK transport logs during a connection attempt;
    passes every record on (its level is another filter's business)."""

    def filter(self, record: logging.LogRecord) -> bool:
        server = _CONNECTING.get()
        if server is None or server.trouble or record.levelno < logging.WARNING:
            return True
        try:  # unlike a handler's, a filter's exception would raise at the SDK's log call
            message = record.getMessage().strip()
            text = message.splitlines()[0] if message else ""
            exc = record.exc_info[1] if record.exc_info else None
            if exc is not None:
                text = f"{text}: {_describe(exc)}" if text else _describe(exc)
            server.trouble = text[:300]
        except Exception:
            server.trouble = "(a log record that could not be read)"
        return True


def _watch_transport_logs() -> None:
    for name in TRANSPORT_LOGGERS:
        sdk = logging.getLogger(name)
        if not any(isinstance(f, _TransportTrouble) for f in sdk.filters):
            sdk.filters.insert(0, _TransportTrouble())  # before any filter that drops records


def tool_name(server: str, tool: str) -> str:
    """``mcp_<server>_<tool>`` in the OpenAI function-name charset, at most 64 characters."""
    return _NAME_CHARS.sub("_", f"mcp_{server}_{tool}")[:MAX_NAME]


def enabled(server: str, tool: str, patterns: list[str]) -> bool:
    """Whether ``enabledTools`` lets ``tool`` through: ``"*"``, its own name or its full
    ``mcp_<server>_<tool>`` name (nanobot accepts both)."""
    return "*" in patterns or tool in patterns or tool_name(server, tool) in patterns


def input_schema(schema: dict[str, Any] | None) -> dict[str, Any]:
    """The server's schema as a Chat Completions ``parameters`` object (always an object)."""
    out = dict(schema or {})
    if out.get("type") != "object":
        out = {"type": "object", "properties": {}}
    out.setdefault("properties", {})
    return out


def render_result(result: CallToolResult) -> str:
    """Text for the model: text blocks as they are, other blocks as a short note; an
    ``isError`` result starts with ``Error:``."""
    parts: list[str] = []
    for block in result.content:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)  # type: ignore[union-attr]
        elif kind in ("image", "audio"):
            size = len(base64.b64decode(block.data, validate=False))  # type: ignore[union-attr]
            parts.append(
                f"[{kind} {block.mime_type}, {size} bytes: not shown, the model "  # type: ignore[union-attr]
                "cannot receive it as a tool result]"
            )
        elif kind == "resource_link":
            parts.append(f"[resource {block.uri}]")  # type: ignore[union-attr]
        elif kind == "resource":
            res = block.resource  # type: ignore[union-attr]
            text = getattr(res, "text", None)
            parts.append(text if text is not None else f"[resource {res.uri}: binary, not shown]")
        else:
            parts.append(f"[{kind or 'unknown'} content, not shown]")
    if not parts and result.structured_content is not None:
        import json

        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    text = "\n".join(parts) or "(no output)"
    if result.is_error:
        return text if text.startswith("Error:") else f"Error: {text}"
    return text


@dataclass(frozen=True, slots=True)
class ServerStatus:
    """What ``memobot mcp list``, ``/status`` and ``doctor`` show about one server."""

    name: str
    transport: Literal["stdio", "http", "sse"]
    state: State
    detail: str
    tools: tuple[str, ...]  # the names the model sees


class McpTool(Tool):
    """One tool of one server, as the model sees it."""

    name: ClassVar[str]
    description: ClassVar[str]
    parameters: ClassVar[dict[str, Any]]
    # Another program's tool: what it does is unknown (a server's annotations are its own
    # claims and are not read); tools.safeMcpTools is the owner vouching for it.
    effects: ClassVar[Effects] = EXTERNAL

    def __init__(self, server: McpServer, remote: RemoteTool) -> None:
        self.server = server
        self.remote_name = remote.name
        # Per instance: each server tool has its own name, description and schema.
        self.name = tool_name(server.name, remote.name)  # type: ignore[misc]
        self.description = (  # type: ignore[misc]
            remote.description or remote.title or f"{remote.name} (MCP server {server.name})"
        )
        self.parameters = input_schema(remote.input_schema)  # type: ignore[misc]

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        return await self.server.call(self.remote_name, args, ctx.session_key)


class McpServer:
    """One configured server: its connection task, its state and its tools."""

    def __init__(
        self,
        name: str,
        cfg: McpServerConfig,
        tools_cfg: ToolsConfig,
        *,
        gate: Gate | None,
        workspace: Path,
        log_dir: Path | None,
        on_tools: Any,
    ) -> None:
        self.name = name
        self.cfg = cfg
        self.tools_cfg = tools_cfg
        self.gate = gate
        self.workspace = workspace
        self.log_dir = log_dir
        self._on_tools = on_tools
        self.state: State = "connecting"
        self.detail = "not started"
        self.tools: list[McpTool] = []
        self.client: Client | None = None
        self.attempted = asyncio.Event()  # the first connection attempt is over
        self._connected = asyncio.Event()
        self._broken = asyncio.Event()
        self._stopping = False
        self._stop_event = asyncio.Event()
        self._was_up = False
        self.trouble = ""  # what the transport logged during this connection attempt
        self.task: asyncio.Task[None] | None = None

    def status(self) -> ServerStatus:
        return ServerStatus(
            self.name,
            self.cfg.transport,
            self.state,
            self.detail,
            tuple(t.name for t in self.tools),
        )

    def start(self) -> None:
        self.task = asyncio.create_task(self._run(), name=f"mcp:{self.name}")

    async def stop(self) -> None:
        self._stopping = True
        self._stop_event.set()
        self._broken.set()
        if self.task is None:
            self.state, self.detail = "stopped", "stopped"
            return
        try:
            # The SDK's own shutdown: stdin closed, a grace, then the process group killed.
            async with asyncio.timeout(8.0):
                await asyncio.shield(self.task)
        except TimeoutError:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        self.state = "stopped"

    @property
    def stopping(self) -> bool:
        return self._stopping

    def restart(self, why: str) -> None:
        """Drop the connection (the task reconnects with backoff); nothing once stopping (a
        call cut by a reload that removed the server must not say it reconnects)."""
        if self._stopping:
            return
        if not self._broken.is_set():
            log.warning("mcp server %s: %s; reconnecting", self.name, why)
        self._connected.clear()
        self.state, self.detail = "connecting", redact(f"reconnecting: {why}")
        self._broken.set()

    # -- the connection task ----------------------------------------------------------------

    async def _run(self) -> None:
        # The channels' policy (x1.5 up to 30 s), but a timed-out connect waits too: it is a
        # failure shown in status, not a lost long poll.
        reconnect = Reconnect(timeouts_at_once=False)
        while not self._stopping:
            self._broken.clear()
            self._was_up = False
            cause: Exception = ConnectionError("the connection closed")
            failed = ""
            try:
                await self._session()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                cause = exc
                why = _describe(exc) + _transport_hint(self.cfg, exc)
                if self.trouble and self.trouble not in why:
                    why += f"; the transport said: {self.trouble}"
                last = self._last_stderr_line()
                if last:
                    why += f"; its stderr said: {last}"
                # Shown by doctor and status.json too, and an SDK message may quote a url
                # with a ${VAR} key in it.
                why = redact(why)
                if self.state != "connected" or not self._broken.is_set():
                    self.state, self.detail = "failed", why
                    failed = why
            finally:
                self.client = None
                self._connected.clear()
                self.attempted.set()
            if self._stopping:
                break
            if self._was_up:
                reconnect.succeeded()  # it worked: a new failure starts afresh
            delay = reconnect.wait_after(cause) or 0.0  # no token here to be refused
            if failed:
                log.warning("mcp server %s: %s (retry in %.0f s)", self.name, failed, delay)
            with contextlib.suppress(TimeoutError):  # a stop ends the wait at once
                async with asyncio.timeout(delay):
                    await self._stop_event.wait()
        self.state, self.detail = "stopped", "stopped"

    async def _session(self) -> None:
        from mcp import Client

        self.state = "connecting"
        self.trouble = ""
        _CONNECTING.set(self)  # this task's context: the SDK's tasks for it inherit it
        async with contextlib.AsyncExitStack() as stack:
            errlog = self._errlog(stack)
            transport = self._transport(errlog)
            async with asyncio.timeout(CONNECT_TIMEOUT_SECONDS):
                client = await stack.enter_async_context(Client(transport, mode="legacy"))
                remote = await _list_tools(client)
            tools = [
                McpTool(self, t)
                for t in sorted(remote, key=lambda t: t.name)
                if enabled(self.name, t.name, self.cfg.enabled_tools)
            ]
            self.client, self.tools = client, tools
            self.state = "connected"
            self.detail = f"{len(tools)} tool(s)"
            self._connected.set()
            self._was_up = True
            self.attempted.set()
            log.info("mcp server %s connected: %d tool(s)", self.name, len(tools))
            self._on_tools()
            await self._hold(client)
            if not self._stopping and self.state == "connected":
                self.state, self.detail = "connecting", "reconnecting: the connection closed"
                log.warning("mcp server %s: the connection closed; reconnecting", self.name)

    async def _hold(self, client: Client) -> None:
        """Until the connection breaks, a call reports it broken, or memobot stops."""
        while not self._broken.is_set():
            if _closed(client):
                return
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(WATCH_SECONDS):
                    await self._broken.wait()

    def _errlog(self, stack: contextlib.ExitStack[Any] | contextlib.AsyncExitStack) -> TextIO:
        """Where a stdio server's stderr goes: ``<state>/mcp/<name>.log`` (0600, new at each
        start), else nowhere."""
        if self.log_dir is None:
            return stack.enter_context(open(os.devnull, "w"))
        from bot.private import make_private_dirs

        make_private_dirs(self.log_dir)
        path = self.log_dir / f"{self.name}.log"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        return stack.enter_context(os.fdopen(fd, "w", encoding="utf-8"))

    def _last_stderr_line(self) -> str:
        if self.log_dir is None or self.cfg.transport != "stdio":
            return ""
        try:
            with open(self.log_dir / f"{self.name}.log", "rb") as fh:
                fh.seek(0, 2)
                fh.seek(max(fh.tell() - 2000, 0))
                lines = fh.read().decode(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return lines[-1].strip()[:300] if lines else ""

    def _transport(self, errlog: TextIO) -> Any:
        if self.cfg.transport == "http":
            from mcp.client.streamable_http import streamable_http_client
            from mcp.shared._httpx_utils import create_mcp_http_client

            http = create_mcp_http_client(headers=dict(self.cfg.headers) or None)
            return _owning(http, streamable_http_client(self.cfg.url, http_client=http))
        if self.cfg.transport == "sse":
            from mcp.client.sse import sse_client

            # A stream silent this long is taken for a dead connection (reconnected, with
            # backoff); servers send a ping well within it.
            return sse_client(
                self.cfg.url,
                headers=dict(self.cfg.headers) or None,
                timeout=CONNECT_TIMEOUT_SECONDS,
                sse_read_timeout=SSE_SILENCE_SECONDS,
            )
        from mcp.client.stdio import StdioServerParameters, stdio_client

        from bot.gate import GateRefused, install_roots

        if self.gate is None:
            raise GateRefused("no process gate here: stdio MCP servers cannot be started")
        restrict = self.tools_cfg.restrict_to_workspace
        search_path = self.cfg.env.get("PATH") or os.environ.get("PATH")
        # The owner installed this server: it may read its own installation (a venv).
        read_also = install_roots(self.cfg.command, search_path)
        folder = self._own_folder()
        imports = {} if self.cfg.cwd else SAFE_IMPORTS
        if self.cfg.cwd:
            cwd = Path(self.cfg.cwd).expanduser()
            if not cwd.is_dir():
                raise FileNotFoundError(2, "its working folder does not exist", str(cwd))
            if cwd not in (Path("/"), Path.home()):  # as install_roots: never all of it
                read_also.append(cwd)
        else:
            cwd = folder
        command, env = self.gate.launcher_command(
            [self.cfg.command, *self.cfg.args],
            confine=restrict and self.tools_cfg.exec.sandbox == "landlock",
            network=self.tools_cfg.exec.network,
            restrict=restrict,
            extra_env={**imports, **self.cfg.env},
            stdio=True,
            read_also=read_also,
            home=folder,
        )
        params = StdioServerParameters(command=command[0], args=command[1:], env=env, cwd=cwd)
        return stdio_client(params, errlog=errlog)

    def _own_folder(self) -> Path:
        """The server's working folder (unless its ``cwd`` says otherwise) and, when the agent
        is restricted, its ``HOME``: ``<state>/mcp/<name>/``, kept across starts (an ``npx``
        cache), out of reach of the agent's tools and commands. Never the workspace, where
        the model could plant a module, a ``node_modules`` or a dotfile the server would
        load with its ``env`` secrets."""
        assert self.gate is not None
        if self.log_dir is None:
            return self.gate.private_folder(f"mcp-{self.name}")
        from bot.private import make_private_dirs

        folder = self.log_dir / self.name
        make_private_dirs(folder)
        return folder

    # -- calls ------------------------------------------------------------------------------

    async def call(self, tool: str, args: dict[str, Any], session_key: str) -> str:
        from mcp.shared.exceptions import MCPError
        from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT

        timeout = self.cfg.tool_timeout
        deadline = time.monotonic() + RECONNECT_WAIT_SECONDS
        while (
            self.state == "connecting"
            and not self._connected.is_set()
            and time.monotonic() < deadline
        ):
            # Reconnecting after a crash: a short wait beats an error the model must retry.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.1):
                    await self._connected.wait()
        client = self.client
        if client is None or not self._connected.is_set():
            raise ToolError(
                f"MCP server '{self.name}' is not available ({self.detail}). memobot keeps "
                "trying to reconnect it; try again later or do without it."
            )
        started = time.monotonic()
        try:
            try:
                # The SDK's own read timeout first; ours is the backstop for a stuck transport.
                async with asyncio.timeout(timeout + 2.0):
                    result = await client.call_tool(tool, args, read_timeout_seconds=timeout)
            except Exception:
                if not self._stopping:
                    raise
                # Stopped under the call (a reload removed the server, a restart, memobot's
                # stop): not a crash, and nothing reconnects it.
                raise _StoppedUnderCall() from None
        except _StoppedUnderCall:
            raise ToolError(
                f"MCP server '{self.name}' was stopped during the call (removed or restarted "
                "by the owner, or memobot is stopping); the call did not finish."
            ) from None
        except TimeoutError:
            self.restart(f"{tool} did not answer within {timeout:g} s")
            raise ToolError(self._timeout_text(tool, timeout)) from None
        except MCPError as exc:
            if exc.code == REQUEST_TIMEOUT:
                self.restart(f"{tool} did not answer within {timeout:g} s")
                raise ToolError(self._timeout_text(tool, timeout)) from None
            if exc.code == CONNECTION_CLOSED:
                self.restart(f"the connection closed during {tool}")
                raise ToolError(
                    f"MCP server '{self.name}' closed the connection during the call (it may "
                    "have crashed); memobot is reconnecting it."
                ) from None
            raise ToolError(f"MCP server '{self.name}' refused the call: {exc}") from None
        except Exception as exc:  # the transport failed under the call
            self.restart(_describe(exc))
            raise ToolError(
                f"MCP server '{self.name}' failed during the call: {_describe(exc)}"
            ) from None
        log.debug(
            "mcp call %s.%s session=%s in %.0f ms",
            self.name,
            tool,
            session_key,
            (time.monotonic() - started) * 1000,
        )
        return render_result(result)

    def _timeout_text(self, tool: str, timeout: float) -> str:
        return (
            f"MCP server '{self.name}' did not answer {tool} within {timeout:g} s "
            f"(toolTimeout); the server is being restarted."
        )


class _StoppedUnderCall(Exception):
    """A call's transport went away because its server was being stopped."""


class McpManager:
    """Every configured MCP server; registers their tools in the turn's registry."""

    def __init__(
        self,
        tools_cfg: ToolsConfig,
        registry: ToolRegistry,
        *,
        gate: Gate | None,
        workspace: Path,
        log_dir: Path | None = None,
    ) -> None:
        self.registry = registry
        self.tools_cfg = tools_cfg
        self.gate = gate
        self.workspace = workspace
        self.log_dir = log_dir
        self.started = False
        self.restricted = tools_cfg.restrict_to_workspace  # as the servers were started
        # Servers taken away by a reload or a restart, still shutting down: stop() waits.
        self._leaving: set[asyncio.Future[None]] = set()
        self._stops: dict[str, asyncio.Future[None]] = {}  # each name's latest stop
        self.servers = [
            self._server(name, cfg) for name, cfg in sorted(tools_cfg.mcp_servers.items())
        ]

    def _server(self, name: str, cfg: McpServerConfig) -> McpServer:
        _watch_transport_logs()
        if cfg.cwd and within(real_path(Path(cfg.cwd).expanduser()), real_path(self.workspace)):
            log.warning(
                "mcp server %s: its cwd %s lies in the workspace, where the model can plant "
                "a module or node_modules the server would load; pass the workspace as an "
                "argument instead",
                name,
                cfg.cwd,
            )
        return McpServer(
            name,
            cfg,
            self.tools_cfg,
            gate=self.gate,
            workspace=self.workspace,
            log_dir=self.log_dir,
            on_tools=self._tools_changed,
        )

    def start(self) -> None:
        """Begin connecting every server in the background; returns at once."""
        self.started = True
        for server in self.servers:
            server.start()

    def apply(self, tools_cfg: ToolsConfig) -> list[str]:
        """Make the servers those of ``tools_cfg`` (a reload): a new one starts, one taken
        away stops, one whose settings changed starts afresh; the others keep their
        connection. Returns what changed (``+name``, ``-name``, ``~name``). On the loop."""
        self.tools_cfg = tools_cfg
        wanted = tools_cfg.mcp_servers
        # A stdio server is confined as tools.restrictToWorkspace said when it started (the
        # launcher's rules are set then): a reload that changes it starts each one afresh,
        # or one started unconfined would stay so after the owner turned confinement on.
        reconfine = tools_cfg.restrict_to_workspace != self.restricted
        self.restricted = tools_cfg.restrict_to_workspace

        def same(server: McpServer) -> bool:
            unchanged = wanted.get(server.name) == server.cfg
            return unchanged and not (reconfine and server.cfg.transport == "stdio")

        have = {s.name: s for s in self.servers if same(s)}
        changed = []
        kept = []
        for server in self.servers:
            if server.name in have:
                server.tools_cfg = tools_cfg
                kept.append(server)
            else:
                self._retire(server)
                changed.append(("~" if server.name in wanted else "-") + server.name)
        known = {s.name for s in self.servers}
        for name, cfg in sorted(wanted.items()):
            if name in have:
                continue
            if name not in known:
                changed.append("+" + name)
            kept.append(self._follow(self._server(name, cfg)))
        self.servers = sorted(kept, key=lambda s: s.name)
        if changed:
            self._tools_changed()
        return changed

    async def restart(self, name: str) -> bool:
        """Stop server ``name`` (a stdio server's process ends) and start it afresh, at once
        (no backoff wait); False when there is no such server."""
        old = next((s for s in self.servers if s.name == name), None)
        if old is None:
            return False
        # The new server takes the old one's place at once, so whatever happens to that place
        # meanwhile (a second restart, a reload that removes or renews it) acts on the new
        # one. (Replacing after the wait started a server that no list held: never stopped.)
        new = self._server(name, old.cfg)
        self.servers = [new if s is old else s for s in self.servers]
        self._tools_changed()  # its tools come back when it has listed them again
        stopped = self._retire(old)
        self._follow(new)
        await asyncio.shield(stopped)
        return True

    def _follow(self, server: McpServer) -> McpServer:
        """Start ``server`` (when the manager runs) once the server it replaces, if one of
        its name is still stopping, has stopped: never two processes of one server at once
        (they share its log file and folder). It starts only if it still holds its place."""
        if not self.started:
            return server
        before = self._stops.get(server.name)
        if before is None or before.done():
            server.start()
        else:
            before.add_done_callback(lambda _: self._start_if_held(server))
        return server

    def _start_if_held(self, server: McpServer) -> None:
        if server in self.servers and not server.stopping:
            server.start()

    def _retire(self, server: McpServer) -> asyncio.Future[None]:
        """Stop ``server`` in the background; the future is done when it and every server of
        its name stopped before it are."""
        before = self._stops.get(server.name)

        async def stop() -> None:
            await server.stop()
            if before is not None:
                await before

        task = asyncio.ensure_future(stop())
        self._leaving.add(task)
        task.add_done_callback(self._leaving.discard)
        self._stops[server.name] = task
        return task

    async def wait_ready(self, seconds: float) -> None:
        """Wait until every server has connected or failed once, at most ``seconds``."""
        waits = [asyncio.create_task(s.attempted.wait()) for s in self.servers]
        if not waits:
            return
        _, late = await asyncio.wait(waits, timeout=seconds)
        for task in late:
            task.cancel()
        if late:
            names = [s.name for s in self.servers if not s.attempted.is_set()]
            log.warning(
                "mcp servers not ready after %.0f s (still connecting): %s",
                seconds,
                ", ".join(names),
            )

    async def stop(self) -> None:
        await asyncio.gather(*(s.stop() for s in self.servers), *self._leaving)

    def statuses(self) -> list[ServerStatus]:
        return [s.status() for s in self.servers]

    def summary(self) -> str:
        """One line for ``/status``: ``2 servers (1 connected), 5 tools``."""
        if not self.servers:
            return "none configured"
        up = sum(s.state == "connected" for s in self.servers)
        count = sum(len(s.tools) for s in self.servers)
        return f"{len(self.servers)} server(s) ({up} connected), {count} tool(s)"

    def _tools_changed(self) -> None:
        tools: list[Tool] = [t for s in self.servers for t in s.tools]
        if self.registry.replace_group(GROUP, tools):
            log.info("mcp tools now: %d", len(tools))


# -- helpers ----------------------------------------------------------------------------------


async def _list_tools(client: Client) -> list[RemoteTool]:
    tools: list[RemoteTool] = []
    cursor: str | None = None
    for _ in range(100):  # a paginator that never ends must not hang the connect
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if cursor is None:
            break
    return tools


def _closed(client: Client) -> bool:
    """Whether the SDK's dispatcher saw the end of the connection (the server exited)."""
    dispatcher = getattr(client.session, "_dispatcher", None)
    return bool(getattr(dispatcher, "_closed", False))


def _describe(exc: BaseException) -> str:
    """A short reason for a log line or a tool result, from whatever the SDK raised."""
    if isinstance(exc, BaseExceptionGroup):
        inner = exc.exceptions[0] if exc.exceptions else exc
        return _describe(inner)
    if isinstance(exc, TimeoutError):
        return f"no answer within {CONNECT_TIMEOUT_SECONDS:g} s"
    if isinstance(exc, FileNotFoundError):
        return f"cannot start: {exc.strerror}: {exc.filename}"
    if type(exc).__name__ == "MCPError" and "closed" in str(exc).lower():
        return "the server closed the connection (it exited)"
    # One line: httpx adds "For more information check: <MDN link>" on a second one.
    text = (str(exc).strip() or type(exc).__name__).splitlines()[0]
    return f"{type(exc).__name__}: {text}"[:300]


def _transport_hint(cfg: McpServerConfig, exc: BaseException) -> str:
    """What to try when the server may speak the other HTTP transport: a url ending in /sse
    is read as SSE (as nanobot reads it), and a Streamable HTTP server refuses the SSE GET."""
    if cfg.transport == "sse" and cfg.type is None and re.search(r"\b40[056]\b", str(exc)):
        return '; the url ends in /sse, so it is read as SSE: set "type": "streamableHttp" if not'
    if cfg.transport == "http" and cfg.type == "streamableHttp" and ends_in_sse(cfg.url):
        return '; the url ends in /sse: set "type": "sse" if this is an SSE server'
    return ""


@contextlib.asynccontextmanager
async def _owning(http: Any, transport: Any) -> Any:
    """The Streamable HTTP transport with its own httpx client, closed together."""
    async with http, transport as streams:
        yield streams


async def probe_servers(
    tools_cfg: ToolsConfig,
    *,
    gate: Gate | None,
    workspace: Path,
    log_dir: Path | None,
    seconds: float = CONNECT_TIMEOUT_SECONDS + 2,
) -> list[ServerStatus]:
    """Start every server once, list its tools, stop it: ``memobot mcp list`` and ``doctor``.

    The wait ends a little after the connection's own timeout, so a server that never answers
    is reported with that reason rather than as still connecting."""
    manager = McpManager(tools_cfg, ToolRegistry(), gate=gate, workspace=workspace, log_dir=log_dir)
    manager.start()
    try:
        await manager.wait_ready(seconds)
        return manager.statuses()
    finally:
        await manager.stop()
