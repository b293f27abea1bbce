"""The ``cron`` tool: the model schedules reminders and recurring tasks for the current chat.

nanobot's argument names, so skills written for it carry over. Jobs go to the same store the
command line uses (bot.cron.store); the running scheduler picks a change up within a second.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any, ClassVar

from bot.config import CronConfig
from bot.cron.schedule import MIN_EVERY_SECONDS, Schedule, ScheduleError, describe_moment, zone
from bot.cron.scheduler import describe_jobs
from bot.cron.store import Job, Jobs, JobStore, new_job
from bot.tools.base import Effects, Tool, ToolContext, ToolError


class CronTool(Tool):
    name: ClassVar[str] = "cron"
    # Jobs it adds run later as turns of this chat, with this chat's rights.
    effects: ClassVar[Effects] = Effects(side_effects=True)
    description: ClassVar[str] = (
        "Schedule reminders and recurring tasks in this chat. action=add with message and "
        "one of: at (local ISO date-time, e.g. 2026-12-24T09:00), every_seconds, cron_expr "
        "(5 fields, e.g. '0 8 * * 1' = Mondays 08:00); optional tz (IANA name). By default "
        "you get the message as a task when it is due and your answer is sent here; "
        'deliver="text" sends the message as it is. action=list shows the jobs; '
        "action=remove with job_id deletes one."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "action": {"type": "string", "enum": ["add", "list", "remove"]},
            "message": {"type": "string", "description": "the reminder text or the task"},
            "at": {"type": "string", "description": "one-off: local ISO date-time"},
            "every_seconds": {"type": "integer", "description": "repeat every N seconds"},
            "cron_expr": {"type": "string", "description": "5-field cron expression"},
            "tz": {"type": "string", "description": "IANA time zone (default: memobot's)"},
            "job_id": {"type": "string", "description": "for remove"},
            "all": {
                "type": "boolean",
                "description": "list: every chat's jobs (an admin's private chat only)",
            },
            "deliver": {
                "type": "string",
                "enum": ["agent", "text"],
                "description": "agent (default): you do the task; text: send message as is",
            },
        },
        "required": ["action"],
    }

    def __init__(self, store: JobStore, cfg: CronConfig, timezone: str) -> None:
        self.store = store
        self.cfg = cfg
        self.timezone = timezone

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        if not ctx.session_key or ctx.channel == "cli":
            raise ToolError(
                "scheduled jobs run in the gateway and are delivered to a chat app; this "
                "terminal chat cannot receive them"
            )
        if ctx.sender is None:
            raise ToolError("scheduled jobs are made in a chat, for its sender")
        sender = ctx.sender
        action = args["action"]
        now = datetime.now(UTC)
        admin = sender.is_admin
        if action == "list":
            jobs = await asyncio.to_thread(self.store.load)
            if args.get("all"):
                # Other chats' reminders are private: never listed into a group.
                if not admin or sender.is_group:
                    raise ToolError("only an admin's private chat may list every chat's jobs")
                if not jobs.jobs:
                    return "No scheduled jobs."
                return "Scheduled jobs:\n" + "\n".join(describe_jobs(jobs.jobs, now))
            mine = jobs.of_session(ctx.session_key)
            if not mine:
                return "No scheduled jobs in this chat."
            return "Scheduled jobs in this chat:\n" + "\n".join(describe_jobs(mine, now))
        if action == "remove":
            job_id = str(args.get("job_id") or "").strip()
            if not job_id:
                raise ToolError("job_id is required for remove")
            removed = await asyncio.to_thread(
                self.store.update, lambda jobs: _remove(jobs, job_id, ctx.session_key, admin)
            )
            if removed is None:
                raise ToolError(f"no job {job_id} in this chat (action=list shows them)")
            return f"Removed job {job_id} ({removed.schedule.describe()})."
        message = str(args.get("message") or "").strip()
        if not message:
            raise ToolError("message is required for add")
        try:
            schedule = Schedule.make(
                at=args.get("at"),
                every_seconds=args.get("every_seconds"),
                cron_expr=args.get("cron_expr"),
                tz=args.get("tz") or self.timezone or zone("").key,
            )
        except ScheduleError as exc:
            raise ToolError(str(exc)) from None
        if schedule.kind == "every" and schedule.every_seconds < MIN_EVERY_SECONDS and not admin:
            raise ToolError(f"every_seconds must be at least {MIN_EVERY_SECONDS} in this chat")

        def add(jobs: Jobs) -> Job:
            if len(jobs.of_session(ctx.session_key)) >= self.cfg.max_jobs_per_chat:
                raise ToolError(
                    f"this chat already has {self.cfg.max_jobs_per_chat} jobs "
                    "(cron.maxJobsPerChat); remove one first"
                )
            try:
                return new_job(
                    jobs,
                    session=ctx.session_key,
                    message=message,
                    schedule=schedule,
                    now=now,
                    deliver="text" if args.get("deliver") == "text" else "agent",
                    by_admin=admin,
                    is_group=sender.is_group,
                )
            except ScheduleError as exc:
                raise ToolError(str(exc)) from None

        job = await asyncio.to_thread(self.store.update, add)
        assert job.next_moment is not None
        return (
            f"Scheduled job {job.id}: {schedule.describe()}; next run "
            f"{describe_moment(job.next_moment, schedule.zone, now)}."
        )


def _remove(jobs: Jobs, job_id: str, session: str, admin: bool) -> Job | None:
    job = jobs.get(job_id)
    if job is None or (job.session != session and not admin):
        return None
    jobs.jobs.remove(job)
    return job
