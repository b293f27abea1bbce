"""Tasks: the background tasks the model started with ``spawn`` (``bot.tasks``), as
``memobot tasks`` lists them: each one's chat, starter, state, age and model use, its own
page with its task text, its transcript (its ``task:<id>`` session) and its result, and a
Cancel button.

Cancel is the one path of ``/stop ID``: with the gateway in this process its running turn is
stopped at once (its processes killed as any turn's) and it reports "stopped"; with
``memobot web`` alone it is what ``memobot tasks cancel`` does, a request in the task store
that a gateway running elsewhere sees within a second and one started later finds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from aiohttp import web

from bot.context import said_by_person
from bot.gate.question import marked_invisible
from bot.session.reading import content_text, read_page
from bot.tasks import TaskRecord, TaskStore, age, report_text, result_of, usage_words
from bot.tasks_commands import show_lines
from bot.web.render import Html, join, tag
from bot.web.server import page_response
from bot.web.transcript import SHOWN_MESSAGES, answer, messages_html
from bot.web.views import EMPTY, Frame, page, post_button, table

if TYPE_CHECKING:
    from bot.config import Config
    from bot.session import SessionStore
    from bot.spend.report import Totals
    from bot.web.server import Panel

log = logging.getLogger(__name__)
NAV = ("/tasks", "Tasks")

ALONE = (
    "No gateway runs in this process: Cancel asks for it in the task store, as "
    "“memobot tasks cancel” does. A gateway running as its own service stops the task within "
    "a second; if none runs, the task ends “stopped” when the next one starts."
)


@dataclass(frozen=True, slots=True)
class TaskView:
    """One task's page: its record, what its session holds, and its model use."""

    rec: TaskRecord
    text: str  # the task as the model wrote it
    messages: list[dict[str, Any]]  # the session's newest, and the running turn's work
    left_out: int  # older messages not in ``messages`` (the Chats screen has them all)
    used: str


def routes(panel: Panel) -> list[web.RouteDef]:
    def store() -> TaskStore:
        return TaskStore(panel.state_dir)

    def sessions() -> SessionStore:
        from bot.session import SessionStore

        # The gateway's own store (its cache holds what a turn just wrote); alone, the files.
        return panel.gateway.stack.store if panel.gateway else SessionStore(panel.state_dir)

    async def listing(request: web.Request) -> web.Response:
        cfg, _ = await panel.config()
        frame = panel.frame(request, await panel.gateway_running())
        try:
            records = await asyncio.to_thread(store().load)
        except (OSError, ValueError) as exc:
            return page_response(unreadable_page(exc, frame))
        usage = await asyncio.to_thread(_usage, cfg)
        return page_response(tasks_page(list(records.values()), usage, frame, panel.gateway))

    async def view(request: web.Request) -> web.Response:
        cfg, _ = await panel.config()
        frame = panel.frame(request, await panel.gateway_running())
        try:
            records = await asyncio.to_thread(store().load)
        except (OSError, ValueError) as exc:
            return page_response(unreadable_page(exc, frame))
        rec = records.get(request.query.get("id", ""))
        if rec is None:
            raise web.HTTPNotFound(text="No such task (an ended one leaves the list in time).")
        usage = await asyncio.to_thread(_usage, cfg)
        data = await asyncio.to_thread(read_task, sessions(), rec, usage)
        return page_response(await asyncio.to_thread(task_page, data, frame, panel.gateway))

    async def cancel(request: web.Request) -> web.Response:
        task_id = str((await request.post()).get("id", ""))
        back = task_link(task_id)
        try:
            rec = (await asyncio.to_thread(store().load)).get(task_id)
        except (OSError, ValueError) as exc:
            return panel.back("/tasks", f"The task store cannot be read: {exc}")
        if rec is None:
            return panel.back("/tasks", f"No task {task_id[:20]!r}.")
        if panel.gateway is not None:
            # /stop ID's own path: the turn stopped here and now, its processes killed.
            text = await panel.gateway.stack.loop.cancel_task(rec, "web")
            return panel.back(back, text)
        try:
            asked = await asyncio.to_thread(store().request_cancel, task_id)
        except (OSError, ValueError) as exc:
            return panel.back(back, f"The cancel could not be written: {exc}")
        if asked is None:
            return panel.back(back, f"Task {task_id} has already ended ({rec.state}).")
        log.info("task stop asked id=%s session=%s by web (in the task store)", rec.id, rec.parent)
        running = await panel.gateway_running()
        where = (
            "the running gateway stops it within a second"
            if running
            else "no gateway runs now: it ends “stopped” when one starts"
        )
        return panel.back(back, f"Cancel of task {task_id} asked in the task store; {where}.")

    return [
        web.get("/tasks", listing),
        web.get("/tasks/view", view),
        web.post("/tasks/cancel", cancel),
    ]


def _usage(cfg: Config) -> dict[str, Totals]:
    """This month's model use by session; {} when the ledger cannot be read (the list
    still helps without the figures)."""
    from bot.cron.schedule import zone
    from bot.tasks import usage_by_task

    try:
        return usage_by_task(cfg.agent.state_path, zone(cfg.agent.timezone))
    except OSError as exc:
        log.error("cannot read the usage ledger: %s", exc)
        return {}


def read_task(sessions: SessionStore, rec: TaskRecord, usage: dict[str, Totals]) -> TaskView:
    """What the task's session holds (in a worker thread: it reads the files)."""
    key = rec.session_key
    used = usage_words(usage.get(key))
    state = sessions.peek_state(key)
    if state is None:  # recorded, never written (a crash between the two)
        return TaskView(rec, "", [], 0, used)
    shown = read_page(key, sessions.path_for(key), None, SHOWN_MESSAGES)
    messages = [m for _, m in shown.messages if m is not None]
    checkpoint = state.checkpoint or {}
    if state.is_pending(checkpoint.get("message_id")):
        messages += list(checkpoint.get("messages") or ())  # the turn under way
    text = next((str(p.get("text") or "") for p in state.pending), "")
    if not text:
        first = next((m for m in messages if m.get("role") == "user"), None)
        text = said_by_person(content_text(first.get("content"))) if first else ""
    return TaskView(rec, text, messages, shown.start, used)


def task_link(task_id: str) -> str:
    return "/tasks/view?" + urlencode({"id": task_id})


def _chat_link(key: str) -> Html:
    return tag("a", key, href="/chats/view?" + urlencode({"key": key}))


def _state(rec: TaskRecord) -> str:
    if rec.state == "running" and rec.cancel:
        return "running (cancel asked)"
    return rec.state


def _cancel(rec: TaskRecord, csrf: str) -> Html:
    if rec.state != "running":
        return EMPTY
    return post_button("/tasks/cancel", "Cancel", csrf, id=rec.id)


def unreadable_page(exc: Exception, frame: Frame) -> Html:
    text = f"The task store cannot be read ({exc}); it is left as it is for you to mend."
    return page("Tasks", tag("p", text, class_="notice"), frame)


def tasks_page(
    records: list[TaskRecord], usage: dict[str, Totals], frame: Frame, gateway: object
) -> Html:
    parts: list[Html] = []
    if gateway is None:
        parts.append(tag("p", ALONE, class_="muted"))
    if not records:
        parts.append(tag("p", "No background tasks.", class_="muted"))
        return page("Tasks", join(parts), frame)
    now = time.time()
    rows: list[list[object]] = []
    for r in sorted(records, key=lambda r: r.started, reverse=True):
        rows.append(
            [
                tag("a", r.id, href=task_link(r.id)),
                marked_invisible(r.label) or "—",
                _chat_link(r.parent),
                r.starter + (" (admin)" if r.admin else ""),
                _state(r),
                age((r.ended or now) - r.started),
                usage_words(usage.get(r.session_key)) or "—",
                _cancel(r, frame.csrf),
            ]
        )
    running = sum(r.state == "running" for r in records)
    parts += [
        tag("p", f"{running} running, {len(records) - running} ended (the last ones kept)."),
        tag(
            "div",
            table(("Task", "Label", "Chat", "Started by", "State", "Age", "Model use", ""), rows),
            class_="tasks-table",
        ),
    ]
    return page("Tasks", join(parts), frame)


def task_page(data: TaskView, frame: Frame, gateway: object) -> Html:
    rec = data.rec
    facts = [line.split(": ", 1) for line in show_lines(rec)]
    facts.append(["model use (this month)", data.used or "—"])
    rows: list[list[object]] = [
        [name, _chat_link(value) if name == "chat" else marked_invisible(value)]
        for name, value in facts
    ]
    parts: list[Html] = [
        tag("p", tag("a", "All tasks", href="/tasks")),
        table(("", ""), rows),
    ]
    if rec.state == "running":
        parts.append(_cancel(rec, frame.csrf))
        if gateway is None:
            parts.append(tag("p", ALONE, class_="muted"))
    parts += [tag("h2", "Task"), tag("pre", marked_invisible(data.text) or "—", class_="wrap")]
    parts.append(tag("h2", "Result"))
    result = result_of(data.messages)
    if rec.state == "running":
        parts.append(
            tag("p", "Running: its result is posted in its chat when it ends.", class_="muted")
        )
    else:
        told = {
            "turn": "returned to the turn that waited for it",
            "chat": "posted in its chat",
        }.get(rec.told, "returned to the turn that waited for it or posted in its chat")
        parts.append(tag("p", f"Ended {rec.state}; {told}:", class_="muted"))
        parts.append(answer(report_text(rec, rec.state, result)))
    parts.append(tag("h2", "Transcript"))
    if data.left_out:
        href = "/chats/view?" + urlencode({"key": rec.session_key})
        whole = tag("a", "the whole transcript", href=href)
        earlier = join([f"{data.left_out:,} earlier messages are not shown: ", whole])
        parts.append(tag("p", earlier, class_="muted"))
    shown = messages_html(data.messages)
    parts += shown or [tag("p", "Nothing yet.", class_="muted")]
    return page(f"Task {rec.id}", join(parts), frame)
