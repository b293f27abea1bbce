"""Usage: model calls, tokens and cost from the usage ledger, as ``memobot usage`` reports them
(the same functions, ``bot.spend.report``): today's and this month's totals, and a chosen range
of local days grouped by purpose, model, chat or day (a GET form)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import date
from typing import TYPE_CHECKING

from aiohttp import web

from bot.cron.schedule import zone
from bot.memory.commands import DAY_FORMS, parse_day
from bot.spend.report import BY, By, Recent, Report, recent, report, today, window
from bot.web.render import Html, join, tag, void
from bot.web.server import page_response
from bot.web.views import Frame, page, table

if TYPE_CHECKING:
    from pathlib import Path
    from zoneinfo import ZoneInfo

    from bot.web.server import Panel

log = logging.getLogger(__name__)

NAV = ("/usage", "Usage")
DEFAULT_BY: By = "purpose"
MAX_DAY_TEXT = 40  # what a day field may hold ("2026-12-01", "yesterday", "12w")
# The form's words for the groups: "session" is a chat to the person reading.
BY_LABELS = {"purpose": "purpose", "model": "model", "session": "chat", "day": "day"}


@dataclass(frozen=True, slots=True)
class Query:
    """The form as asked: the days (as typed, kept for the form) and the grouping."""

    since: str
    until: str
    by: By


@dataclass(frozen=True, slots=True)
class Figures:
    recent: Recent
    report: Report


def routes(panel: Panel) -> list[web.RouteDef]:
    async def show(request: web.Request) -> web.Response:
        cfg, _ = await panel.config()
        frame = panel.frame(request, await panel.gateway_running())
        tz = zone(cfg.agent.timezone)
        query = _query(request)
        problem = ""
        try:
            since, until = _days(query, tz)
        except ValueError as exc:
            problem = str(exc)
            since, until = window(tz, None, None)
        try:
            figures = await asyncio.to_thread(_read, cfg.agent.state_path, tz, since, until, query)
        except OSError as exc:
            log.error("panel: cannot read the usage ledger: %s", exc)
            body = tag("p", "The usage ledger cannot be read; see the log.", class_="error")
            return page_response(page("Usage", body, frame))
        return page_response(usage_page(query, figures, problem, frame))

    return [web.get("/usage", show)]


def _query(request: web.Request) -> Query:
    by = request.query.get("by", DEFAULT_BY)
    return Query(
        request.query.get("since", "").strip()[:MAX_DAY_TEXT],
        request.query.get("until", "").strip()[:MAX_DAY_TEXT],
        next((b for b in BY if b == by), DEFAULT_BY),
    )


def _days(query: Query, tz: ZoneInfo) -> tuple[date, date]:
    """The range asked for, as ``memobot usage --since/--until`` reads it; ValueError says
    what is wrong."""
    now = today(tz)
    since = parse_day(query.since, now) if query.since else None
    until = parse_day(query.until, now) if query.until else None
    since, until = window(tz, since, until)
    if since > until:
        raise ValueError(f"{since} is after {until}: nothing between")
    return since, until


def _read(state: Path, tz: ZoneInfo, since: date, until: date, query: Query) -> Figures:
    return Figures(recent(state, tz), report(state, tz, since, until, query.by))


def _form(query: Query, since: date, until: date) -> Html:
    def day(name: str, label: str, value: str, shown: date) -> Html:
        box = void(
            "input",
            type="text",
            name=name,
            id=f"usage-{name}",
            value=value,
            placeholder=shown.isoformat(),
            maxlength=str(MAX_DAY_TEXT),
            size="11",
        )
        return tag("label", join([label, " ", box]), for_=f"usage-{name}")

    options = join(tag("option", BY_LABELS[b], value=b, selected=b == query.by) for b in BY_LABELS)
    return tag(
        "form",
        join(
            [
                day("since", "From", query.since, since),
                day("until", "to", query.until, until),
                tag(
                    "label",
                    join(["by ", tag("select", options, name="by", id="usage-by")]),
                    for_="usage-by",
                ),
                tag("button", "Show", type="submit"),
            ]
        ),
        method="get",
        action="/usage",
        class_="filters",
    )


def usage_page(query: Query, figures: Figures, problem: str, frame: Frame) -> Html:
    seen, made = figures.recent, figures.report
    totals = tag(
        "dl",
        join(
            [
                tag("dt", "Today"),
                tag("dd", seen.today.describe()),
                tag("dt", "This month"),
                tag("dd", seen.month.describe()),
            ]
        ),
        class_="facts",
    )
    rows: list[list[object]] = [
        [
            key,
            f"{t.calls:,}",
            f"{t.prompt_tokens:,}",
            f"{t.cached_tokens:,}",
            f"{t.completion_tokens:,}",
            t.cost_text() or "-",
        ]
        for key, t in [*made.ordered(), ("total", made.total)]
    ]
    heading = BY_LABELS[query.by].capitalize()
    grid = table((heading, "Calls", "Prompt", "Cached", "Completion", "Cost"), rows)
    notes = made.notes()
    body = join(
        [
            tag(
                "p",
                "Model calls, tokens (prompt, of which cached, and completion) and cost, from "
                "the usage ledger; days are local (agent.timezone). The same figures as "
                "“memobot usage”.",
            ),
            totals,
            tag("h2", f"{made.since.isoformat()} to {made.until.isoformat()}"),
            _form(query, made.since, made.until),
            tag("p", f"{problem} (days: {DAY_FORMS})", class_="error") if problem else "",
            tag("div", grid, class_="usage-table"),
            join(tag("p", note, class_="muted") for note in notes),
        ]
    )
    return page("Usage", body, frame)
