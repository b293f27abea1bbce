"""Tools: the built-in tools on or off, the exec allowlist, and the MCP servers with their
state, tools and errors (add, remove, restart one).

Every change edits the config file through ``bot.config`` (``read_raw``/``set_options``: the
rest of the file kept as written, validated as a load validates it, mode 0600), is logged
"by web", and then goes through the gateway's reload path (what SIGHUP does), so a running
gateway takes it at once; served by ``memobot web`` alone, it counts at the next start. No
secret reaches the page: an MCP server's env values and headers are shown as set or unset.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web

from bot.config import Config, ConfigError, McpServerConfig, load_config, read_raw, set_options
from bot.service.logs import redact
from bot.tools import SWITCHABLE
from bot.urls import redact_url
from bot.web.render import Html, join, tag, void
from bot.web.server import page_response
from bot.web.views import Frame, csrf_field, page, post_button, table

if TYPE_CHECKING:
    from bot.tools.mcp import ServerStatus
    from bot.web.server import Panel

log = logging.getLogger(__name__)
NAV = ("/tools", "Tools")
MAX_FIELD = 4000  # characters of one form field


def routes(panel: Panel) -> list[web.RouteDef]:
    # One edit of the file at a time: each reads it, changes it and writes it whole, so two
    # at once (two tabs, a double click) kept only the second's change, both "Saved".
    editing = asyncio.Lock()

    async def show(request: web.Request) -> web.Response:
        cfg, problem = await panel.config()
        live = None
        running: set[str] = set()
        if panel.gateway is not None:
            live = {s.name: s for s in panel.gateway.stack.mcp.statuses()}
            running = set(panel.gateway.stack.loop.turns.tools.names)
        frame = panel.frame(request, await panel.gateway_running())
        return page_response(tools_page(cfg, live, running, frame, problem))

    async def change(what: str, edit: Callable[[dict[str, Any], Config], Changes]) -> str:
        """Edit the config file by ``edit`` (the file's JSON and the config it loads as) and
        have a running gateway reload it; the notice to show."""

        def write() -> None:
            cfg, _ = load_config(panel.config_path)
            raw = read_raw(panel.config_path)
            set_options(panel.config_path, raw, edit(raw, cfg))

        try:
            async with editing:
                await asyncio.to_thread(write)
        except Refused as exc:
            return str(exc)
        except ConfigError as exc:
            return f"Not saved: {exc}"
        except OSError as exc:
            return f"Not saved: {panel.config_path}: {exc.strerror or exc}"
        log.info("tools: %s by web", what)
        if panel.gateway is None:
            return f"Saved: {what}. It counts when the gateway starts."
        panel.gateway.service.reload()  # the SIGHUP path: what it cannot apply, it logs
        return f"Saved: {what}. The running gateway took it."

    async def form(request: web.Request) -> dict[str, str]:
        data = await request.post()
        return {k: str(v)[:MAX_FIELD] for k, v in data.items() if isinstance(v, str)}

    async def switch(request: web.Request) -> web.Response:
        f = await form(request)
        section, on = f.get("section", ""), f.get("on") == "1"
        if section not in SWITCHABLE:
            return panel.back("/tools", "No such tool.")
        what = f"{section} turned {'on' if on else 'off'}"
        return panel.back(
            "/tools", await change(what, lambda raw, cfg: {("tools", section, "enabled"): on})
        )

    async def allow_add(request: web.Request) -> web.Response:
        pattern = (await form(request)).get("pattern", "").strip()
        if not pattern:
            return panel.back("/tools", "Give a command pattern.")

        def edit(raw: dict[str, Any], cfg: Config) -> Changes:
            allow = list(cfg.tools.exec.allow)
            if pattern in allow:
                raise Refused(f"{pattern} is in the allowlist already.")
            return {("tools", "exec", "allow"): [*allow, pattern]}

        what = f"exec allowlist: {pattern!r} added"
        return panel.back("/tools", await change(what, edit))

    async def allow_remove(request: web.Request) -> web.Response:
        pattern = (await form(request)).get("pattern", "")

        def edit(raw: dict[str, Any], cfg: Config) -> Changes:
            allow = list(cfg.tools.exec.allow)
            if pattern not in allow:
                raise Refused(f"{pattern} is not in the allowlist.")
            return {("tools", "exec", "allow"): [p for p in allow if p != pattern]}

        what = f"exec allowlist: {pattern!r} removed"
        return panel.back("/tools", await change(what, edit))

    async def mcp_add(request: web.Request) -> web.Response:
        f = await form(request)
        name = f.get("name", "").strip()
        try:
            server = server_definition(f)
        except Refused as exc:
            return panel.back("/tools", str(exc))

        def edit(raw: dict[str, Any], cfg: Config) -> Changes:
            if name in cfg.tools.mcp_servers:
                raise Refused(f"There is an MCP server {name} already: remove it first.")
            return {("tools", _mcp_key(raw), name): server}

        return panel.back("/tools", await change(f"mcp server {name} added", edit))

    async def mcp_remove(request: web.Request) -> web.Response:
        name = (await form(request)).get("name", "")

        def edit(raw: dict[str, Any], cfg: Config) -> Changes:
            key = _mcp_key(raw)
            servers = dict((raw.get("tools") or {}).get(key) or {})
            if name not in servers:
                raise Refused(f"There is no MCP server {name} in the config.")
            del servers[name]
            return {("tools", key): servers}

        return panel.back("/tools", await change(f"mcp server {name} removed", edit))

    async def mcp_restart(request: web.Request) -> web.Response:
        name = (await form(request)).get("name", "")
        if panel.gateway is None:
            return panel.back("/tools", "The gateway is not running: there is nothing to restart.")
        if not await panel.gateway.stack.mcp.restart(name):
            return panel.back("/tools", f"The running gateway has no MCP server {name}.")
        log.info("mcp server %s restarted by web", name)
        return panel.back("/tools", f"MCP server {name} restarted: it is connecting again.")

    return [
        web.get("/tools", show),
        web.post("/tools/switch", switch),
        web.post("/tools/allow/add", allow_add),
        web.post("/tools/allow/remove", allow_remove),
        web.post("/tools/mcp/add", mcp_add),
        web.post("/tools/mcp/remove", mcp_remove),
        web.post("/tools/mcp/restart", mcp_restart),
    ]


Changes = dict[tuple[str, ...], Any]


class Refused(Exception):
    """A change that is not made, and why (shown as it is)."""


def _mcp_key(raw: dict[str, Any]) -> str:
    """``mcpServers`` as the file spells it (a nanobot config may say ``mcp_servers``)."""
    tools = raw.get("tools")
    return "mcp_servers" if isinstance(tools, dict) and "mcp_servers" in tools else "mcpServers"


def _pairs(text: str, sep: str, what: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        key, found, value = line.partition(sep)
        if not found or not key.strip():
            raise Refused(f"Each {what} line is NAME{sep}VALUE.")
        out[key.strip()] = value.strip()
    return out


def server_definition(f: dict[str, str]) -> dict[str, Any]:
    """An MCP server's config entry from the add form (the config validates it)."""
    command, url = f.get("command", "").strip(), f.get("url", "").strip()
    server: dict[str, Any] = {}
    if command:
        server["command"] = command
        args = [a for a in f.get("args", "").splitlines() if a.strip()]
        if args:
            server["args"] = args
        env = _pairs(f.get("env", ""), "=", "environment")
        if env:
            server["env"] = env
    if url:
        server["url"] = url
        headers = _pairs(f.get("headers", ""), ":", "header")
        if headers:
            server["headers"] = headers
    tools = [t.strip() for t in f.get("tools", "").split(",") if t.strip()]
    if tools:
        server["enabledTools"] = tools
    return server


# -- the page ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Builtin:
    section: str
    tools: tuple[str, ...]
    on: bool  # as the config file says
    running: bool | None  # in the running gateway's tool list (None: no gateway here)


def _builtins(cfg: Config, running: set[str], live: bool) -> list[Builtin]:
    return [
        Builtin(
            section,
            names,
            getattr(cfg.tools, section).enabled,
            all(n in running for n in names) if live else None,
        )
        for section, names in SWITCHABLE.items()
    ]


def _switch_row(b: Builtin, csrf: str) -> list[object]:
    label = "Turn off" if b.on else "Turn on"
    button = post_button("/tools/switch", label, csrf, section=b.section, on="0" if b.on else "1")
    now = "—" if b.running is None else ("offered to the model" if b.running else "not offered")
    return [
        tag("code", b.section),
        join([tag("code", t) for t in b.tools], ", "),
        "on" if b.on else "off",
        now,
        button,
    ]


def _secret_names(values: dict[str, str]) -> Html:
    if not values:
        return tag("span", "none", class_="muted")
    return join(
        [join([tag("code", k), " (set)" if v else " (unset)"]) for k, v in sorted(values.items())],
        ", ",
    )


def _target(cfg: McpServerConfig) -> Html:
    if cfg.command:
        # An argument may carry a token (--api-key=...): the log's filter hides what it knows.
        return tag("code", redact(" ".join([cfg.command, *cfg.args])))
    return tag("code", redact_url(cfg.url))


def _server(
    name: str, cfg: McpServerConfig | None, st: ServerStatus | None, csrf: str, live: bool
) -> Html:
    facts: list[Html] = []
    if cfg is not None:
        secrets = cfg.env if cfg.command else cfg.headers
        facts += [
            tag("dt", "Runs" if cfg.command else "At"),
            tag("dd", join([_target(cfg), f" ({cfg.transport})"])),
            tag("dt", "Environment" if cfg.command else "Headers"),
            tag("dd", _secret_names(secrets)),
            tag("dt", "Tools offered"),
            tag("dd", ", ".join(cfg.enabled_tools)),
        ]
    if st is not None:
        tools = join([tag("code", t) for t in st.tools], ", ") if st.tools else "none yet"
        facts += [
            tag("dt", "State"),
            tag("dd", join([tag("strong", st.state), f": {st.detail}" if st.detail else ""])),
            tag("dt", "Its tools"),
            tag("dd", tools),
        ]
    elif cfg is not None:
        why = "not running here" if not live else "not started yet (the reload is pending)"
        facts += [tag("dt", "State"), tag("dd", why)]
    if cfg is None:
        facts += [tag("dt", "Config"), tag("dd", "no longer in the config: it stops on reload")]
    buttons = [post_button("/tools/mcp/remove", "Remove", csrf, name=name)] if cfg else []
    if live and st is not None:
        buttons.insert(0, post_button("/tools/mcp/restart", "Restart", csrf, name=name))
    title = tag("h3", name)
    return tag(
        "section",
        join([title, tag("dl", join(facts), class_="facts"), join(buttons, " ")]),
        class_="server",
        aria_label=f"MCP server {name}",
    )


def _field(label: str, control: Html) -> Html:
    return tag("label", join([tag("span", label), control]))


def _add_form(csrf: str) -> Html:
    def text(name: str, hint: str = "") -> Html:
        return void("input", type="text", name=name, placeholder=hint, maxlength=str(MAX_FIELD))

    def area(name: str, hint: str) -> Html:
        return tag("textarea", "", name=name, rows="2", placeholder=hint)

    fields = [
        csrf_field(csrf),
        _field("Name (letters, digits, _ and -)", text("name", "github")),
        tag("p", "A command (stdio), or a url (Streamable HTTP or SSE):", class_="muted"),
        _field("Command", text("command", "npx")),
        _field("Arguments, one a line", area("args", "-y\n@modelcontextprotocol/server-github")),
        _field("Environment, NAME=value a line", area("env", "GITHUB_TOKEN=${GITHUB_TOKEN}")),
        _field("Url", text("url", "https://mcp.example.org/mcp")),
        _field("Headers, Name: value a line", area("headers", "Authorization: Bearer ${TOKEN}")),
        _field("Tools offered (comma-separated, * for all)", text("tools", "*")),
        tag("button", "Add", type="submit", class_="primary"),
    ]
    return tag("form", join(fields), method="post", action="/tools/mcp/add", class_="stack")


def tools_page(
    cfg: Config,
    live: dict[str, ServerStatus] | None,
    running: set[str],
    frame: Frame,
    problem: str = "",
) -> Html:
    csrf = frame.csrf
    parts: list[Html] = []
    if problem:
        parts.append(tag("p", problem, class_="banner", role="alert"))
    here = live is not None
    after = (
        "A change is saved in the config and the running gateway takes it at once."
        if here
        else "A change is saved in the config and counts when the gateway starts."
    )
    parts.append(tag("p", after))
    rows = [_switch_row(b, csrf) for b in _builtins(cfg, running, here)]
    parts += [
        tag("h2", "Built-in tools"),
        table(("Section", "Tools", "Config", "Now", ""), rows),
    ]
    allow = cfg.tools.exec.allow
    allow_rows: list[list[object]] = [
        [tag("code", p), post_button("/tools/allow/remove", "Remove", csrf, pattern=p)]
        for p in allow
    ]
    add_pattern = tag(
        "form",
        join(
            [
                csrf_field(csrf),
                void(
                    "input",
                    type="text",
                    name="pattern",
                    placeholder="git status*",
                    aria_label="Command pattern",
                    maxlength=str(MAX_FIELD),
                ),
                " ",
                tag("button", "Add", type="submit"),
            ]
        ),
        method="post",
        action="/tools/allow/add",
        class_="search",
    )
    parts += [
        tag("h2", "exec allowlist"),
        tag(
            "p",
            join(
                [
                    "Commands that run without asking while ",
                    tag("code", "tools.approval"),
                    f" is “risky” (it is “{cfg.tools.approval}”). A pattern matches the whole "
                    "command, * for any text.",
                ]
            ),
        ),
        table(("Pattern", ""), allow_rows)
        if allow_rows
        else tag("p", "None: every command asks.", class_="muted"),
        add_pattern,
    ]
    parts.append(tag("h2", "MCP servers"))
    names = sorted(set(cfg.tools.mcp_servers) | set(live or {}))
    if not names:
        parts.append(tag("p", "No MCP server is configured.", class_="muted"))
    for name in names:
        parts.append(
            _server(name, cfg.tools.mcp_servers.get(name), (live or {}).get(name), csrf, here)
        )
    parts += [tag("h3", "Add an MCP server"), _add_form(csrf)]
    return page("Tools", join(parts), frame)
