"""Overview: what runs and how it is, as ``memobot status`` says it (the same functions)."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aiohttp import web

from bot import __version__
from bot.config import Config
from bot.status import ChannelLine
from bot.web.render import Html, fill, join, tag
from bot.web.server import page_response
from bot.web.views import Frame, page, table

if TYPE_CHECKING:
    from bot.service.log_ring import LogLine
    from bot.web.server import Panel

NAV = ("/", "Overview")
WARNINGS_SHOWN = 8


def routes(panel: Panel) -> list[web.RouteDef]:
    async def show(request: web.Request) -> web.Response:
        cfg, _ = await panel.config()
        data = await asyncio.to_thread(overview, cfg)
        frame = panel.frame(request, panel.in_gateway or data.gateway_running)
        ring = getattr(panel.gateway, "logs", None)
        problems = recent_problems(ring.problems()) if ring is not None else None
        return page_response(overview_page(data, frame, problems))

    return [web.get("/", show)]


@dataclass(frozen=True, slots=True)
class Overview:
    version: str
    model: str
    gateway: str
    gateway_running: bool
    uptime: str
    answering: str  # whether the model answers, as the running gateway saw it
    channels: list[ChannelLine]
    sessions: int
    chats_today: int
    memory: list[str]  # each budgeted memory file's size against its budget
    mcp: str
    unsent: str
    schedule: str  # the jobs and the next one due, as ``memobot status`` says it
    open_approvals: int
    running_tasks: int | None  # background tasks running (None: the task store is unreadable)


def overview(cfg: Config) -> Overview:
    from bot.approvals import open_approvals
    from bot.cron.commands import status_line as cron_status_line
    from bot.gateway import read_status
    from bot.memory.dream import budget_lines
    from bot.session import SessionStore
    from bot.status import (
        answering_line,
        channel_lines,
        chats_since,
        gateway_line,
        mcp_line,
        model_line,
        sessions_count,
        undelivered_line,
        uptime_line,
    )

    state = cfg.agent.state_path
    live = read_status(state)
    return Overview(
        version=__version__,
        model=model_line(cfg),
        gateway=gateway_line(live, state),
        gateway_running=live is not None,
        uptime=uptime_line(live),
        answering=answering_line(live),
        channels=channel_lines(cfg, live),
        sessions=sessions_count(cfg),
        chats_today=chats_since(cfg, _midnight()),
        memory=budget_lines(cfg.agent.workspace_path, cfg.memory.max_chars),
        mcp=mcp_line(cfg, live),
        unsent=undelivered_line(cfg),
        schedule=cron_status_line(cfg),
        # The count only: a waiting call's summary is the model's text, shown where it is
        # answered (its chat), not here.
        open_approvals=len(open_approvals(SessionStore(state))),
        running_tasks=_running_tasks(cfg),
    )


def _running_tasks(cfg: Config) -> int | None:
    from bot.tasks import TaskStore

    try:
        records = TaskStore(cfg.agent.state_path).load()
    except (OSError, ValueError):
        return None
    return sum(r.state == "running" for r in records.values())


def recent_problems(lines: list[LogLine], most: int = WARNINGS_SHOWN) -> list[LogLine]:
    """The last warnings and errors of the running gateway's log, newest first."""
    return [ln for ln in reversed(lines) if ln.levelno >= logging.WARNING][:most]


def _problems(problems: list[LogLine] | None) -> Html:
    if problems is None:
        return tag("p", "Shown while the gateway runs (its log is its own).", class_="muted")
    if not problems:
        return tag("p", "None since the gateway started.", class_="muted")
    items = join(tag("li", tag("code", ln.text)) for ln in problems)
    more = tag("a", "All of the log", href="/logs?level=WARNING")
    return join([tag("ul", items, class_="problems"), tag("p", more)])


def overview_page(data: Overview, frame: Frame, problems: list[LogLine] | None = None) -> Html:
    rows: list[list[object]] = [[c.name, c.state, _why(c)] for c in data.channels]
    channels = (
        table(("Channel", "State", "Why"), rows)
        if rows
        else tag("p", "No channel is enabled.", class_="muted")
    )
    body = fill(
        "overview.html",
        version=data.version,
        model=data.model,
        gateway=data.gateway,
        uptime=data.uptime,
        answering=data.answering,
        sessions=data.sessions,
        chats_today=data.chats_today,
        memory=join(data.memory, "; "),
        mcp=data.mcp,
        unsent=data.unsent,
        schedule=data.schedule,
        approvals=data.open_approvals,
        tasks=tag(
            "a",
            "the task store cannot be read"
            if data.running_tasks is None
            else f"{data.running_tasks} running",
            href="/tasks",
        ),
        channels=channels,
        problems=_problems(problems),
    )
    return page("Overview", body, frame)


def _midnight() -> float:
    """Today's local midnight, as a time stamp."""
    now = time.localtime()
    return time.mktime((now.tm_year, now.tm_mon, now.tm_mday, 0, 0, 0, 0, 0, -1))


def _why(c: ChannelLine) -> str:
    if c.state == "not running":
        return "the gateway is not running"
    parts = [c.reason, *c.features_off, f"last event {c.last_event}"]
    return "; ".join(p for p in parts if p)
