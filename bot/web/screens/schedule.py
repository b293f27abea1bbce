"""Schedule: the jobs (add, edit, remove, run now), the heartbeat's HEARTBEAT.md and the
recent runs with how they ended.

Jobs go through the command line's own functions and the one job store with its lock
(``bot.cron.commands``: the same checks as ``memobot cron add``, the same document
``memobot cron list`` reads); a running gateway picks a change up within a second or two.
"Run now" is the running scheduler's (``Scheduler.run_now``): a recorded occurrence like a
due one, fired once whatever is clicked twice or resubmitted; with ``memobot web`` alone
there is no scheduler, and the page says so. HEARTBEAT.md is the model's file in the
hostile workspace: read and written only through ``bot.workspace_files`` (a link planted
there is refused, never followed), and written only when it is still the version the page
showed.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo

from aiohttp import web

from bot import workspace_files
from bot.config import Config
from bot.cron import heartbeat
from bot.cron.commands import (
    FieldError,
    JobBusy,
    edit_job,
    owner_job,
    remove_job,
    session_problem,
)
from bot.cron.runs import Run, RunLog
from bot.cron.schedule import ScheduleError, describe_moment, from_iso, zone
from bot.cron.store import Job, Jobs, JobStore
from bot.gate.question import visible
from bot.web.form_fields import as_sent, field, form, hidden
from bot.web.render import Html, join, tag
from bot.web.server import page_response
from bot.web.views import Frame, page, post_button

if TYPE_CHECKING:
    from bot.web.server import Panel

log = logging.getLogger(__name__)
NAV = ("/schedule", "Schedule")
MESSAGE_PIECES = 1_000  # of a job's message in the list (characters, or markers)
MAX_HEARTBEAT_BYTES = 48 * 1024  # edited in one form (the panel takes 64 KiB a request)
NEEDS_GATEWAY = (
    "Run now needs the gateway's scheduler, and this panel is not served by a gateway: start "
    "it with “memobot gateway” (with web.enabled), or wait for the job's next run."
)


def routes(panel: Panel) -> list[web.RouteDef]:
    store = JobStore(panel.state_dir)

    async def show(request: web.Request) -> web.Response:
        return await _page(panel, request, {}, {})

    async def add(request: web.Request) -> web.Response:
        form_data = _fields(await request.post())
        cfg, _ = await panel.config()
        now = datetime.now(UTC)
        try:
            checked = _checked(cfg, form_data, now)
            job = await asyncio.to_thread(
                store.update, lambda jobs: owner_job(jobs, now=now, **checked)
            )
        except FieldError as exc:
            return await _page(panel, request, form_data, {exc.field: str(exc)}, status=400)
        except (OSError, ValueError) as exc:
            return panel.back("/schedule", f"Cannot use the job store: {exc}")
        log.info("cron job %s added by web session=%s (%s)", job.id, job.session, _what(job))
        notes = await asyncio.to_thread(_notes, cfg, job)
        return panel.back("/schedule", f"Job {job.id} added: {_what(job)}.{notes}")

    async def edit_page(request: web.Request) -> web.Response:
        job_id = request.match_info["job_id"]
        jobs = await asyncio.to_thread(store.load)
        job = jobs.get(job_id)
        if job is None:
            return panel.back("/schedule", f"There is no job {job_id} (any more).")
        return await _edit_page(panel, request, job_id, _job_fields(job), {})

    async def edit(request: web.Request) -> web.Response:
        job_id = request.match_info["job_id"]
        form_data = _fields(await request.post())
        cfg, _ = await panel.config()
        now = datetime.now(UTC)

        def change(jobs: Jobs) -> Job | None:
            shown = jobs.get(job_id)
            if shown is not None and as_sent(shown.message) == checked["message"]:
                # The text the page showed, as a browser sends it back (CRLF line ends, no
                # NUL): not rewritten, so a non-admin's job stays theirs, its text unchanged.
                checked["message"] = shown.message
            return edit_job(jobs, job_id, now=now, **checked)

        try:
            checked = _checked(cfg, form_data, now)
            job = await asyncio.to_thread(store.update, change)
        except FieldError as exc:
            errors = {exc.field: str(exc)}
            return await _edit_page(panel, request, job_id, form_data, errors, status=400)
        except JobBusy as exc:
            return await _edit_page(panel, request, job_id, form_data, {"when": str(exc)}, 409)
        except (OSError, ValueError) as exc:
            return panel.back("/schedule", f"Cannot use the job store: {exc}")
        if job is None:
            return panel.back("/schedule", f"There is no job {job_id} (any more).")
        log.info("cron job %s edited by web session=%s (%s)", job.id, job.session, _what(job))
        notes = await asyncio.to_thread(_notes, cfg, job)
        return panel.back("/schedule", f"Job {job.id} changed: {_what(job)}.{notes}")

    async def remove(request: web.Request) -> web.Response:
        job_id = str((await request.post()).get("job_id", ""))
        try:
            removed = await asyncio.to_thread(store.update, lambda jobs: remove_job(jobs, job_id))
        except (OSError, ValueError) as exc:
            return panel.back("/schedule", f"Cannot use the job store: {exc}")
        if removed is None:
            return panel.back("/schedule", f"There is no job {job_id} (any more).")
        log.info("cron job %s removed by web session=%s", removed.id, removed.session)
        return panel.back("/schedule", f"Job {removed.id} removed ({_what(removed)}).")

    async def run_now(request: web.Request) -> web.Response:
        data = await request.post()
        job_id, token = str(data.get("job_id", "")), str(data.get("token", ""))
        gateway = panel.gateway
        if gateway is None:
            return panel.back("/schedule", NEEDS_GATEWAY)
        said = await gateway.scheduler.run_now(job_id, token)
        log.info("cron job %s run now by web: %s", job_id, said)
        return panel.back("/schedule", said)

    async def save_heartbeat(request: web.Request) -> web.Response:
        data = await request.post()
        text = str(data.get("content", "")).replace("\r\n", "\n")
        shown = str(data.get("version", ""))
        workspace = panel.cfg.agent.workspace_path
        notice = await asyncio.to_thread(_write_heartbeat, workspace, text, shown)
        if notice is not None:
            return panel.back("/schedule#heartbeat", notice)
        log.info("heartbeat: %s edited by web (%d bytes)", heartbeat.FILE, len(text.encode()))
        await _commit_if_versioned(panel, workspace)
        return panel.back("/schedule#heartbeat", f"{heartbeat.FILE} saved.")

    return [
        web.get("/schedule", show),
        web.post("/schedule/add", add),
        web.get("/schedule/job/{job_id}", edit_page),
        web.post("/schedule/job/{job_id}", edit),
        web.post("/schedule/remove", remove),
        web.post("/schedule/run", run_now),
        web.post("/schedule/heartbeat", save_heartbeat),
    ]


# -- checking a job's form ---------------------------------------------------------------------

FIELDS = ("session", "message", "at", "every", "cron", "tz", "text", "force")


def _fields(data: Mapping[str, object]) -> dict[str, str]:
    return {name: as_sent(str(data.get(name, ""))) for name in FIELDS}


def _checked(cfg: Config, f: Mapping[str, str], now: datetime) -> dict[str, object]:
    """The job's session, message, schedule and kind from the form, checked as ``memobot
    cron add`` checks them; FieldError at the first field at fault."""
    from bot.cron.commands import job_schedule

    problem = session_problem(f["session"])
    if problem is not None:
        raise FieldError("session", problem)
    if not f["message"]:
        raise FieldError("message", "What should memobot do (or say)? The message is empty.")
    every: int | None = None
    if f["every"]:
        try:
            every = int(f["every"])
        except ValueError:
            raise FieldError("every", "a whole number of seconds, e.g. 3600") from None
    schedule = job_schedule(
        cfg,
        at=f["at"] or None,
        every_seconds=every,
        cron_expr=f["cron"] or None,
        tz=f["tz"] or None,
        text=bool(f["text"]),
        force=bool(f["force"]),
        now=now,
    )
    return {
        "session": f["session"],
        "message": f["message"],
        "schedule": schedule,
        "text": bool(f["text"]),
    }


def _job_fields(job: Job) -> dict[str, str]:
    s = job.schedule
    return {
        "session": job.session,
        "message": job.message,
        "at": s.at if s.kind == "at" else "",
        "every": str(s.every_seconds) if s.kind == "every" else "",
        "cron": s.cron_expr if s.kind == "cron" else "",
        "tz": s.tz,
        "text": "1" if job.deliver == "text" else "",
        "force": "1" if s.kind == "every" and s.every_seconds < 60 else "",
    }


def _what(job: Job) -> str:
    kind = "reminder" if job.deliver == "text" else "task"
    return f"{kind} for {job.session}, {job.schedule.describe()}"


def _notes(cfg: Config, job: Job) -> str:
    """What the person should know about where the job goes (as ``cron add`` warns)."""
    from bot.session import SessionStore

    channel = job.session.partition(":")[0]
    section = getattr(cfg.channels, channel, None)
    if section is None or not section.enabled:
        return (
            f" Channel {channel} is not enabled (channels.{channel}.enabled): the job waits, "
            f"and runs once the gateway starts with {channel} on."
        )
    if job.session not in SessionStore(cfg.agent.state_path).keys():
        return (
            f" memobot has not talked in {job.session} yet: check the id (on Telegram a bot "
            "may write only to people who wrote to it first)."
        )
    return ""


# -- HEARTBEAT.md --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HeartbeatFile:
    text: str | None  # None: not editable here (see ``problem``)
    problem: str
    version: str  # what the form sends back: the file may not change in between

    @property
    def tasks(self) -> list[str]:
        return heartbeat.open_tasks(self.text or "")


def _version(data: bytes | None) -> str:
    return "absent" if data is None else hashlib.sha256(data).hexdigest()


def read_heartbeat(workspace: Path) -> HeartbeatFile:
    """HEARTBEAT.md as the workspace has it, never through a link."""
    link = (
        f"{heartbeat.FILE} in the workspace is a symbolic link (the model, or someone, made "
        "it); memobot never follows one. Remove it from the workspace to edit the file here."
    )
    try:
        st = workspace_files.lstat(workspace, heartbeat.FILE)
    except workspace_files.LinkRefused:
        return HeartbeatFile(None, link, "")
    except (FileNotFoundError, NotADirectoryError):
        return HeartbeatFile("", "", _version(None))
    if stat.S_ISLNK(st.st_mode):
        return HeartbeatFile(None, link, "")
    if not stat.S_ISREG(st.st_mode):
        return HeartbeatFile(None, f"{heartbeat.FILE} is not a regular file.", "")
    try:
        data = workspace_files.read_bytes(workspace, heartbeat.FILE, MAX_HEARTBEAT_BYTES + 1)
    except workspace_files.LinkRefused:
        return HeartbeatFile(None, link, "")
    except FileNotFoundError:
        return HeartbeatFile("", "", _version(None))
    if len(data) > MAX_HEARTBEAT_BYTES:
        big = f"{heartbeat.FILE} is larger than {MAX_HEARTBEAT_BYTES // 1024} KiB: edit it by hand."
        return HeartbeatFile(None, big, "")
    return HeartbeatFile(data.decode("utf-8", errors="replace"), "", _version(data))


def _write_heartbeat(workspace: Path, text: str, shown: str) -> str | None:
    """Write HEARTBEAT.md if it is still the version the page showed; why not, or None."""
    current = read_heartbeat(workspace)
    if current.text is None:
        return f"Not saved: {current.problem}"
    if shown != current.version:
        return (
            f"Not saved: {heartbeat.FILE} changed since the page was opened (the heartbeat may "
            "have ticked a task). Here it is as it is now; make your change again."
        )
    if len(text.encode("utf-8")) > MAX_HEARTBEAT_BYTES:
        return f"Not saved: more than {MAX_HEARTBEAT_BYTES // 1024} KiB."
    try:
        # A link planted meanwhile is replaced by the file, never written through.
        workspace_files.write_atomic(workspace, heartbeat.FILE, text)
    except workspace_files.LinkRefused:
        return "Not saved: a folder on the way is a symbolic link."
    except OSError as exc:
        return f"Not saved: {exc.strerror or exc}"
    return None


async def _commit_if_versioned(panel: Panel, workspace: Path) -> None:
    """Commit the edit when the memory history versions this file (it does not today:
    HEARTBEAT.md is outside ``TRACKED``; kept so the two never disagree)."""
    from bot.memory.versioning import commit_async, is_tracked

    if not is_tracked(heartbeat.FILE.encode()):
        return
    try:
        await commit_async(workspace, panel.state_dir, f"web: {heartbeat.FILE} edited by web\n")
    except Exception:
        log.exception("heartbeat: cannot commit %s edited by web", heartbeat.FILE)


# -- the page --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ScheduleData:
    jobs: list[Job]
    problem: str
    chats: list[str]
    runs: list[Run]
    file: HeartbeatFile
    interval_minutes: float
    deliver_to: str | None
    heartbeat_next: str | None
    shaped_by: str | None
    tz: ZoneInfo  # agent.timezone, the heartbeat's


def schedule_data(cfg: Config, workspace: Path) -> ScheduleData:
    """What the page shows. ``workspace``: the one this process started with (the running
    gateway's heartbeat reads that one until a restart)."""
    from bot.provenance import Provenance
    from bot.session import SessionStore

    state = cfg.agent.state_path
    problem = ""
    try:
        jobs = JobStore(state).load()
    except (OSError, ValueError) as exc:
        jobs, problem = None, f"Cannot read the job store: {exc}"
    chats = [k for k in SessionStore(state).keys() if session_problem(k) is None]
    return ScheduleData(
        jobs=sorted(jobs.jobs, key=lambda j: j.next_run or "9") if jobs else [],
        problem=problem,
        chats=sorted(chats),
        runs=RunLog(state).recent(),
        file=read_heartbeat(workspace),
        interval_minutes=cfg.heartbeat.interval_minutes,
        deliver_to=heartbeat.deliver_to(cfg),
        heartbeat_next=(jobs.heartbeat.get("next_run") if jobs else None),
        shaped_by=(
            Provenance(state, workspace).untrusted(heartbeat.FILE) if workspace.is_dir() else None
        ),
        tz=_zone(cfg.agent.timezone),
    )


def _zone(name: str) -> ZoneInfo:
    try:
        return zone(name)
    except ScheduleError:
        return ZoneInfo("UTC")


async def _page(
    panel: Panel,
    request: web.Request,
    form_data: Mapping[str, str],
    errors: Mapping[str, str],
    status: int = 200,
) -> web.Response:
    cfg, problem = await panel.config()
    data = await asyncio.to_thread(schedule_data, cfg, panel.cfg.agent.workspace_path)
    frame = panel.frame(request, await panel.gateway_running())
    body = schedule_page(data, frame, form_data, errors, panel.gateway is not None, problem)
    return page_response(body, status)


async def _edit_page(
    panel: Panel,
    request: web.Request,
    job_id: str,
    form_data: Mapping[str, str],
    errors: Mapping[str, str],
    status: int = 200,
) -> web.Response:
    cfg, _ = await panel.config()
    data = await asyncio.to_thread(schedule_data, cfg, panel.cfg.agent.workspace_path)
    frame = panel.frame(request, await panel.gateway_running())
    body = join(
        [
            tag("p", tag("a", "← Back to the schedule", href="/schedule")),
            _job_form(f"/schedule/job/{job_id}", "Save", frame.csrf, form_data, errors, data),
        ]
    )
    return page_response(page(f"Edit job {job_id}", body, frame), status)


def _cells(row: list[tuple[str, object]]) -> Html:
    return tag("tr", join(tag("td", value, data_label=label) for label, value in row))


def _table(headers: tuple[str, ...], rows: list[list[object]], label: str) -> Html:
    head = tag("thead", tag("tr", join(tag("th", h) for h in headers)))
    body = tag("tbody", join(_cells(list(zip(headers, row, strict=True))) for row in rows))
    return tag("table", join([head, body]), class_="stacked", aria_label=label)


def _jobs(data: ScheduleData, csrf: str, live: bool, now: datetime) -> Html:
    if not data.jobs:
        return tag("p", "No scheduled jobs.", class_="muted")
    rows: list[list[object]] = []
    for job in data.jobs:
        moment = job.next_moment
        when = describe_moment(moment, job.schedule.zone, now) if moment else "nothing left"
        run = (
            post_button("/schedule/run", "Run now", csrf, job_id=job.id, token=_token())
            if live
            else tag("span", "", class_="muted")
        )
        actions = join(
            [
                tag("a", "Edit", href=f"/schedule/job/{job.id}", class_="button"),
                " ",
                run,
                " ",
                post_button("/schedule/remove", "Remove", csrf, job_id=job.id),
            ]
        )
        kind = "reminder (text)" if job.deliver == "text" else "task (model)"
        rows.append(
            [
                tag("code", job.id),
                job.session,
                join([job.schedule.describe(), tag("br"), tag("small", kind, class_="muted")]),
                when,
                _message(job.message),
                actions,
            ]
        )
    headers = ("Job", "Chat", "Schedule", "Next run", "Message", "")
    return _table(headers, rows, "Scheduled jobs")


def _message(text: str) -> Html:
    """A job's message in the list: a non-admin's (or the model's) text too, so every
    invisible character shows by its code point (a bidi override cannot disguise what the
    job asks), and a long one is cut visibly (the job's Edit page has all of it)."""
    shown, left = visible(text).head(MESSAGE_PIECES)
    more = f" … ({left:,} more characters: Edit shows all)" if left else ""
    return tag("span", shown + more, class_="message")


def _token() -> str:
    """One "run now" request: a second click or a resubmitted form sends the same one."""
    return secrets.token_urlsafe(12)


def _job_form(
    action: str,
    submit: str,
    csrf: str,
    f: Mapping[str, str],
    errors: Mapping[str, str],
    data: ScheduleData,
) -> Html:
    chats = tag("datalist", join(tag("option", value=c) for c in data.chats), id="known-chats")
    when_error = errors.get("when", "")
    when = tag(
        "fieldset",
        join(
            [
                tag("legend", "When (one of the three)"),
                field(
                    "at",
                    "Once, at (local date and time)",
                    f.get("at", ""),
                    errors,
                    kind="datetime-local",
                    step="1",
                ),
                field(
                    "every",
                    "Or every … seconds",
                    f.get("every", ""),
                    errors,
                    kind="number",
                    min="1",
                    hint="3600 is hourly; at least 60 for a task, unless forced",
                ),
                field(
                    "cron",
                    "Or a cron expression",
                    f.get("cron", ""),
                    errors,
                    hint="5 fields: minute hour day month weekday, e.g. 0 8 * * 1",
                ),
                field(
                    "tz",
                    "Time zone",
                    f.get("tz", ""),
                    errors,
                    hint="an IANA name such as Europe/Berlin; empty: memobot's",
                ),
                tag("span", when_error, id="f-when-error", class_="field-error", role="alert")
                if when_error
                else "",
            ]
        ),
        aria_describedby="f-when-error" if when_error else None,
    )
    body = join(
        [
            field(
                "session",
                "Chat",
                f.get("session", ""),
                errors,
                list="known-chats",
                required=True,
                hint="a session key, e.g. telegram:12345",
            ),
            chats,
            field(
                "message",
                "Message",
                f.get("message", ""),
                errors,
                kind="textarea",
                rows="3",
                required=True,
                hint="the task the model does when it is due, or the reminder's text",
            ),
            when,
            field(
                "text",
                "Send the message as it is (a reminder, no model)",
                f.get("text", ""),
                kind="checkbox",
            ),
            field(
                "force",
                "Allow a task more often than once a minute",
                f.get("force", ""),
                kind="checkbox",
            ),
        ]
    )
    return form(action, csrf, body, submit)


def _heartbeat(data: ScheduleData, csrf: str, now: datetime) -> Html:
    minutes = data.interval_minutes
    every = f"every {minutes:g} min" if minutes > 0 else "off (heartbeat.intervalMinutes is 0)"
    nxt = "—"
    if minutes > 0 and data.heartbeat_next:
        nxt = describe_moment(from_iso(data.heartbeat_next), data.tz, now)
    facts = tag(
        "dl",
        join(
            [
                tag("dt", "Runs"),
                tag("dd", every),
                tag("dt", "Tells"),
                tag("dd", data.deliver_to or "nobody: set heartbeat.deliverTo"),
                tag("dt", "Next look"),
                tag("dd", nxt),
                tag("dt", "Open tasks"),
                tag("dd", str(len(data.file.tasks))),
            ]
        ),
        class_="facts",
    )
    parts = [tag("h2", "Heartbeat", id="heartbeat"), facts]
    if data.shaped_by:
        parts.append(
            tag(
                "p",
                f"This version of {heartbeat.FILE} was written in {data.shaped_by}, not by an "
                "admin: it runs without exec, file writes or your memory. Saving it here "
                "makes it yours.",
                class_="banner",
                role="status",
            )
        )
    if data.file.text is None:
        parts.append(tag("p", data.file.problem, class_="banner", role="alert"))
    else:
        area = field(
            "content",
            heartbeat.FILE,
            data.file.text,
            kind="textarea",
            rows="10",
            hint="a list item is a task; a ticked one (- [x]) is done",
        )
        parts.append(
            form(
                "/schedule/heartbeat",
                csrf,
                join([area, hidden(version=data.file.version)]),
                f"Save {heartbeat.FILE}",
                enctype="multipart/form-data",
            )
        )
    return tag("section", join(parts), aria_labelledby="heartbeat")


def _runs(data: ScheduleData, now: datetime) -> Html:
    if not data.runs:
        return tag("p", "No run yet.", class_="muted")
    rows: list[list[object]] = []
    for run in data.runs:
        when = describe_moment(from_iso(run.at), data.tz)
        what = run.job + (" (run now)" if run.manual else "")
        rows.append([when, what, run.session, run.outcome])
    return _table(("When", "Job", "Chat", "Outcome"), rows, "Recent runs")


def schedule_page(
    data: ScheduleData,
    frame: Frame,
    form_data: Mapping[str, str],
    errors: Mapping[str, str],
    live: bool,
    problem: str = "",
) -> Html:
    now = datetime.now(UTC)
    parts: list[object] = [
        tag(
            "p",
            "Reminders and recurring tasks, as “memobot cron list” shows them. A running "
            "gateway picks a change up within a second or two.",
        )
    ]
    for trouble in (problem, data.problem):
        if trouble:
            parts.append(tag("p", trouble, class_="banner", role="alert"))
    if not live:
        parts.append(tag("p", NEEDS_GATEWAY, class_="muted"))
    if errors:
        parts.append(
            tag(
                "p",
                "The job was not added: see the field marked below.",
                role="alert",
                class_="field-error",
            )
        )
    parts += [
        tag("h2", "Jobs"),
        _jobs(data, frame.csrf, live, now),
        tag("h2", "Add a job", id="add"),
        _job_form("/schedule/add", "Add the job", frame.csrf, form_data, errors, data),
        _heartbeat(data, frame.csrf, now),
        tag("h2", "Recent runs"),
        _runs(data, now),
    ]
    return page("Schedule", join(parts), frame)
