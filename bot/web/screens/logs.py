"""Logs: the running gateway's last log lines (``bot.service.log_ring``), redacted as the log
is, filtered by level and session; live with script (SSE), a refresh link without."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING
from urllib.parse import urlencode

from aiohttp import web

from bot.service.log_ring import RING_LINES, LogLine, LogRing
from bot.web.render import Html, join, tag, void
from bot.web.server import page_response
from bot.web.sessions import COOKIE
from bot.web.views import Frame, page

if TYPE_CHECKING:
    from bot.web.server import Panel

NAV = ("/logs", "Logs")
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
SHOWN = 1000  # lines on the page, the newest
MAX_SESSION = 200
# Live pages open at once (each browser tab of the Logs page is one); more are refused, and
# the page falls back to its refresh link.
MAX_STREAMS = 16
# A quiet stream writes a comment this often: a page closed meanwhile is noticed (a write to
# it fails) instead of its stream waiting for a line that passes its filters, maybe forever.
KEEPALIVE_SECONDS = 20.0
SCRIPT = Html('<script src="/static/logs.js" defer></script>')


def routes(panel: Panel) -> list[web.RouteDef]:
    def ring() -> LogRing | None:
        return panel.gateway.logs if panel.gateway is not None else None

    async def show(request: web.Request) -> web.Response:
        level, session = _filters(request)
        frame = panel.frame(request, await panel.gateway_running())
        logs = ring()
        if logs is None:
            return page_response(page("Logs", _no_gateway(), frame))
        lines = list(matching(logs.recent(_number(level)), level, session))[-SHOWN:]
        return page_response(logs_page(lines, level, session, logs.recent(), frame))

    async def stream(request: web.Request) -> web.StreamResponse:
        """Server-sent events: each new line that passes the filters, as JSON."""
        logs = ring()
        if logs is None:
            raise web.HTTPNotFound(text="The gateway is not running here: no live log.")
        if logs.watching >= MAX_STREAMS:
            raise web.HTTPServiceUnavailable(
                text=f"{MAX_STREAMS} live log pages are open already: refresh this one instead."
            )
        level, session = _filters(request)
        # A reconnecting EventSource says what it saw last; a first one, the page's last line.
        after = request.headers.get("Last-Event-ID") or request.query.get("after", "")
        seen = int(after) if after.isdigit() and len(after) < 12 else 0
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "X-Accel-Buffering": "no"}
        )
        await response.prepare(request)
        with logs.watch() as queue:
            closing = asyncio.ensure_future(panel.closing.wait())
            try:
                # Lines logged between the page and this request come from the ring first.
                for line in matching(logs.recent(_number(level)), level, session):
                    if line.seq > seen:
                        await response.write(_event(line))
                while not closing.done():
                    got = asyncio.ensure_future(queue.get())
                    await asyncio.wait(
                        {got, closing},
                        timeout=KEEPALIVE_SECONDS,
                        return_when=asyncio.FIRST_COMPLETED,
                    )
                    if not got.done():
                        got.cancel()
                    if closing.done():
                        break
                    if not panel.sessions.alive(request.cookies.get(COOKIE)):
                        break  # logged out (in another tab) or expired: no more lines here
                    if not got.done() or got.cancelled():
                        await response.write(b": still here\n\n")  # fails once the page is gone
                    elif (line := got.result()).seq > seen and _passes(line, level, session):
                        await response.write(_event(line))
            except ConnectionError:  # the page was closed
                pass
            finally:
                closing.cancel()
        return response

    return [web.get("/logs", show), web.get("/logs/stream", stream)]


def _filters(request: web.Request) -> tuple[str, str]:
    level = request.query.get("level", "INFO").upper()
    return (level if level in LEVELS else "INFO"), request.query.get("session", "").strip()[
        :MAX_SESSION
    ]


def _number(level: str) -> int:
    return int(logging.getLevelName(level))


def _passes(line: LogLine, level: str, session: str) -> bool:
    return line.levelno >= _number(level) and (not session or line.session == session)


def matching(lines: Iterable[LogLine], level: str, session: str) -> Iterable[LogLine]:
    return (line for line in lines if _passes(line, level, session))


def _event(line: LogLine) -> bytes:
    data = json.dumps(
        {"seq": line.seq, "level": logging.getLevelName(line.levelno), "text": line.text}
    )
    return f"id: {line.seq}\ndata: {data}\n\n".encode()


def _no_gateway() -> Html:
    return join(
        [
            tag(
                "p",
                "There is no live log here: this panel is served by “memobot web” alone, and "
                "the gateway is not running. When it runs, its log goes to:",
            ),
            tag(
                "ul",
                join(
                    [
                        tag(
                            "li",
                            join([tag("code", "journalctl -u memobot -f"), " (system service)"]),
                        ),
                        tag(
                            "li",
                            join(
                                [tag("code", "journalctl --user -u memobot -f"), " (user service)"]
                            ),
                        ),
                        tag(
                            "li", "the terminal it was started in (memobot gateway logs to stderr)"
                        ),
                    ]
                ),
            ),
        ]
    )


def _line(line: LogLine) -> Html:
    level = logging.getLevelName(line.levelno).lower()
    return tag("div", line.text, class_=f"line {level}", data_seq=str(line.seq))


def _form(level: str, session: str, sessions: list[str]) -> Html:
    options = join(tag("option", name, value=name, selected=name == level) for name in LEVELS)
    select = tag("select", options, name="level", id="log-level")
    box = void(
        "input",
        type="text",
        name="session",
        value=session,
        id="log-session",
        list="log-sessions",
        maxlength=str(MAX_SESSION),
        placeholder="telegram:12345",
    )
    known = tag("datalist", join(tag("option", value=s) for s in sessions), id="log-sessions")
    return tag(
        "form",
        join(
            [
                tag("label", join(["Level at least ", select]), for_="log-level"),
                tag("label", join(["Session ", box]), for_="log-session"),
                known,
                tag("button", "Show", type="submit"),
            ]
        ),
        method="get",
        action="/logs",
        class_="filters",
    )


def logs_page(
    lines: list[LogLine], level: str, session: str, ring: list[LogLine], frame: Frame
) -> Html:
    query = urlencode({"level": level, "session": session})
    last = ring[-1].seq if ring else 0
    sessions = sorted({line.session for line in ring if line.session})
    refresh = tag("a", "refresh", href=f"/logs?{query}")
    intro = tag(
        "p",
        join(
            [
                f"The gateway's last {len(ring):,} log lines (it keeps {RING_LINES:,}), secrets "
                "hidden as in the log. New lines appear as they are logged; without script, ",
                refresh,
                ".",
            ]
        ),
    )
    log = tag(
        "div",
        join(_line(line) for line in lines)
        if lines
        else tag("p", "No line matches.", class_="muted empty"),
        id="log",
        class_="log",
        data_stream=f"/logs/stream?{query}&after={last}",
        role="log",
        aria_live="polite",
    )
    parts = [intro, _form(level, session, sessions), log]
    return page("Logs", join(parts), frame, head=SCRIPT)
