"""What ``memobot status`` shows, one function per line, so the panel's overview and the
command read the same things the same way (and never disagree)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bot.config import Config
from bot.invocation import command_for
from bot.urls import redact_url
from bot.wording import counted


@dataclass(frozen=True, slots=True)
class ChannelLine:
    """One enabled channel as status shows it: its state, why, and the last event."""

    name: str
    state: str  # "connected", "failed", ...; "not running" while no gateway runs
    reason: str  # why it is in that state (a refused token, a reconnect's cause), or ""
    features_off: tuple[str, ...]  # "streaming off (why)"
    last_event: str  # local time, or "never"

    def __str__(self) -> str:
        if self.state == "not running":
            return self.name
        detail = f" ({self.reason})" if self.reason else ""
        off = "".join(f", {f}" for f in self.features_off)
        return f"{self.name}: {self.state}{detail}{off}, last event {self.last_event}"


def channel_lines(cfg: Config, live: dict[str, Any] | None) -> list[ChannelLine]:
    """Each enabled channel, with the running gateway's view of it when one runs."""
    from bot.gateway import enabled_channels

    out = []
    for name in enabled_channels(cfg):
        if not live:
            out.append(ChannelLine(name, "not running", "", (), ""))
            continue
        info = live["channels"].get(name, {})
        when = info.get("last_event_at")
        last = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(when)) if when else "never"
        off = tuple(f"{f} off ({why})" for f, why in info.get("features_off", {}).items())
        reason = str(info.get("detail") or "")
        out.append(ChannelLine(name, str(info.get("state", "?")), reason, off, last))
    return out


def sessions_count(cfg: Config) -> int:
    folder = cfg.agent.state_path / "sessions"
    return len(list(folder.glob("*.jsonl"))) if folder.is_dir() else 0


def chats_since(cfg: Config, since: float) -> int:
    """Sessions written to since ``since`` (a time stamp): the chats active today."""
    folder = cfg.agent.state_path / "sessions"
    if not folder.is_dir():
        return 0
    count = 0
    for path in folder.glob("*.jsonl"):
        try:
            count += path.stat().st_mtime >= since
        except OSError:
            continue  # gone between the listing and the look
    return count


def uptime_line(live: dict[str, Any] | None, now: float | None = None) -> str:
    """How long the running gateway has run."""
    if live is None or not isinstance(live.get("started_at"), int | float):
        return "not running"
    seconds = max(0.0, (now or time.time()) - float(live["started_at"]))
    days, rest = divmod(int(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    shown = f"{days} d {hours} h" if days else f"{hours} h {rest // 60} min"
    started = time.strftime("%Y-%m-%d %H:%M", time.localtime(float(live["started_at"])))
    return f"{shown} (since {started})"


def answering_line(live: dict[str, Any] | None) -> str:
    """Whether the model answers, as the running gateway saw its last calls."""
    if live is None:
        return "unknown: the gateway is not running"
    if live.get("outage"):
        return outage_line(live)
    return "yes (no outage seen)"


def model_line(cfg: Config) -> str:
    llm = cfg.llm
    endpoint = redact_url(llm.resolved_base_url()) or (
        "api.openai.com" if llm.resolved_api_key() else ""
    )
    return f"{llm.model} @ {endpoint}" if endpoint else f"{llm.model} (no LLM configured)"


def status_rows(cfg: Config, config_path: Path) -> list[tuple[str, str]]:
    """``memobot status``'s rows, (name, text) in order."""
    from bot.cron.commands import status_line as cron_status_line
    from bot.gateway import read_status
    from bot.memory.dream import budget_lines

    state = cfg.agent.state_path
    live = read_status(state)
    channels = [str(c) for c in channel_lines(cfg, live)]
    exists = (
        ""
        if config_path.exists()
        else f" (missing: defaults in use; run {command_for(config_path, 'onboard')})"
    )
    return [
        ("config", f"{config_path}{exists}"),
        ("workspace", workspace_line(cfg)),
        ("state", str(state)),
        ("model", model_line(cfg)),
        ("sessions", str(sessions_count(cfg))),
        ("memory", ", ".join(budget_lines(cfg.agent.workspace_path, cfg.memory.max_chars))),
        ("dream", dream_line(cfg)),
        ("channels", "; ".join(channels) if channels else "none enabled"),
        ("exec", exec_line(cfg)),
        ("limits", limits_line(cfg, live)),
        ("mcp", mcp_line(cfg, live)),
        ("gateway", gateway_line(live, state)),
        ("outage", outage_line(live)),
        ("cron", cron_status_line(cfg)),
        ("unsent", undelivered_line(cfg)),
        ("approvals", approvals_line(cfg)),
        ("usage", usage_line(cfg)),
        ("budget", budget_status_line(cfg)),
        ("panel", panel_line(cfg, live)),
    ]


def dream_line(cfg: Config) -> str:
    """How far Dream digested, and the proposal that waits for an admin (dreamReview)."""
    from bot.memory.dream import read_dream_cursor
    from bot.memory.review import waiting_line

    line = f"digested up to history cursor {read_dream_cursor(cfg.agent.workspace_path)}"
    waiting = waiting_line(cfg.agent.state_path)
    return f"{line}; {waiting}" if waiting else line


def usage_line(cfg: Config) -> str:
    """Today's and this month's model calls, tokens and cost (local days), from the ledger."""
    from bot.cron.schedule import zone
    from bot.file_errors import file_problem
    from bot.spend.report import status_text

    try:
        return status_text(cfg.agent.state_path, zone(cfg.agent.timezone))
    except OSError as exc:  # the other lines are still worth showing
        return f"cannot read the usage ledger: {file_problem(exc) or exc}"


def budget_status_line(cfg: Config) -> str:
    """The limits in force, their use and what is paused (bot.spend.budget)."""
    from bot.cron.schedule import zone
    from bot.spend.budget import budget_line

    return budget_line(cfg, zone(cfg.agent.timezone))


def panel_line(cfg: Config, live: dict[str, Any] | None) -> str:
    """Where the control panel is, as the running gateway says (bot.web)."""
    if not cfg.web.enabled:
        return "off (web.enabled is false)"
    if live is None:
        return "no gateway serves it now; `memobot web` serves it alone"
    url = live.get("web")
    if not url:
        return "the running gateway does not serve it (its log says why)"
    return f"{url} (`memobot web` prints a login link)"


def exec_line(cfg: Config) -> str:
    from bot.gate import describe_confinement

    tools = cfg.tools
    if not tools.exec.enabled:
        return "disabled"
    return describe_confinement(
        tools.restrict_to_workspace, tools.exec.sandbox, tools.exec.network
    ).summary


def limits_line(cfg: Config, live: dict[str, Any] | None) -> str:
    """The running gateway's limits (its cgroup may differ from this shell's), else ours."""
    from bot.app import exec_limits_line

    if not cfg.tools.exec.enabled:
        return "exec disabled"
    shown = (live or {}).get("exec_limits")
    if isinstance(shown, str):
        return f"{shown} (in the running gateway)"
    return f"{exec_limits_line(cfg)} (for a gateway started from here)"


def workspace_line(cfg: Config) -> str:
    from bot.gate.usage import describe, measure

    path = cfg.agent.workspace_path
    if not path.is_dir():
        return str(path)
    warn = cfg.agent.workspace_warn_bytes
    return f"{path} ({describe(*measure(path), warn)})"


def mcp_line(cfg: Config, live: dict[str, Any] | None) -> str:
    servers = cfg.tools.mcp_servers
    if not servers:
        return "no servers configured"
    shown = (live or {}).get("mcp")
    if not isinstance(shown, dict):
        return f"{len(servers)} server(s) configured; states while the gateway runs"
    up = sum(1 for s in shown.values() if s.get("state") == "connected")
    tools = sum(int(s.get("tools", 0)) for s in shown.values())
    parts = [f"{name}: {info.get('state', '?')}" for name, info in sorted(shown.items())]
    return f"{len(shown)} server(s), {up} connected, {tools} tool(s) ({', '.join(parts)})"


def gateway_line(live: dict[str, Any] | None, state: Path) -> str:
    """Whether a gateway runs, and whether what its status file says is current: a file
    left by a killed gateway, or one a live gateway stopped writing, is said to be old."""
    from bot.gateway import STALE_AFTER_SECONDS, left_status, status_age

    now = time.time()
    if live is None:
        left = left_status(state)
        if left is None:
            return "not running"
        age = status_age(left, now)
        when = f", {_ago(age)}" if age is not None else ""
        return (
            f"not running (pid {left.get('pid')} stopped without cleaning up{when}; what its "
            "status file said is out of date)"
        )
    age = status_age(live, now)
    if age is not None and age > STALE_AFTER_SECONDS:
        return (
            f"running (pid {live['pid']}), but its status was last written {_ago(age)}: it may "
            "be stuck (see its log); the channel states above are from then"
        )
    return f"running (pid {live['pid']})"


def _ago(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.0f} h ago"


def outage_line(live: dict[str, Any] | None) -> str:
    """The running gateway's model outage, if there is one, and how many turns wait for it."""
    outage = (live or {}).get("outage")
    if not outage:
        return "none"
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(outage.get("since", 0)))
    n = outage.get("waiting", 0)
    return (
        f"every model failing since {since}, {counted(n, 'turn')} waiting "
        f"({outage.get('reason', '')})"
    )


def approvals_line(cfg: Config) -> str:
    """Tool calls waiting for a person's answer (tools.approval), read from the sessions."""
    from bot.approvals import describe_open

    lines = describe_open(cfg.agent.state_path)
    return f"{len(lines)} open: " + "; ".join(lines) if lines else "none open"


def undelivered_line(cfg: Config) -> str:
    """Answers still in a delivery ledger: refused for good (with why), or waiting to be sent."""
    from bot.delivery import undelivered

    entries = list(undelivered(cfg.agent.state_path))
    if not entries:
        return "none"
    failed = [(k, e) for k, e in entries if e.get("state") == "failed"]
    parts = [f"{k} {e.get('id')}: {e.get('reason')}" for k, e in failed[-5:]]
    waiting = len(entries) - len(failed)
    head = f"{len(failed)} could not be delivered" + (f" ({'; '.join(parts)})" if parts else "")
    return head + (f", {waiting} waiting to be sent" if waiting else "")
