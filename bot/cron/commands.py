"""``memobot cron list | add | remove``: the same job store the gateway and the tool use.

A running gateway notices the change within a second or two (it watches the store file);
nothing needs a restart. Jobs made here count as an admin's (the operator's).
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime

from bot.config import Config
from bot.cron.heartbeat import private_chat
from bot.cron.schedule import (
    MIN_EVERY_SECONDS,
    Schedule,
    ScheduleError,
    describe_moment,
    describe_period,
    to_iso,
    zone,
)
from bot.cron.store import Job, Jobs, JobStore, new_job
from bot.file_errors import file_problem


def session_problem(raw: str) -> str | None:
    """Why ``raw`` cannot be a job's chat (a session key of one of the gateway's channels),
    or None. The command line and the panel refuse the same keys with the same words."""
    channel, sep, chat = raw.partition(":")
    if not (sep and channel and chat.strip()):
        return f"{raw!r}: expected a session key such as telegram:123"
    from channels.registry import specs

    # Jobs run in the gateway's channels (the configured ones): a job for any other would
    # wait for ever.
    known = [name for name, spec in specs().items() if spec.config is not None]
    if channel not in known:
        what = (
            f"the terminal ({channel}) runs no scheduled jobs"
            if channel in specs()
            else f"memobot has no channel {channel!r}"
        )
        return (
            f"{raw!r}: {what}; jobs run in the gateway's channels: {', '.join(known)} "
            "(e.g. telegram:123)"
        )
    return None


def _session_key(raw: str) -> str:
    problem = session_problem(raw)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return raw


class FieldError(ScheduleError):
    """A job's input refused, with the field it is about (``at``, ``every``, ``cron``,
    ``tz``, ``when`` for the choice between them, ``session``, ``message``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class TooOften(FieldError):
    """An agent job repeating faster than once a minute, without --force."""


def job_schedule(
    cfg: Config,
    *,
    at: str | None,
    every_seconds: int | None,
    cron_expr: str | None,
    tz: str | None,
    text: bool,
    force: bool,
    now: datetime,
) -> Schedule:
    """The schedule of a new (or edited) job, checked as ``memobot cron add`` checks it:
    FieldError naming the field at fault (TooOften for a too frequent agent job)."""
    tz_name = tz or cfg.agent.timezone or zone("").key
    try:
        zone(tz_name)
    except ScheduleError as exc:
        raise FieldError("tz", str(exc)) from None
    options = (("at", at), ("every", every_seconds), ("cron", cron_expr))
    given = [f for f, v in options if v not in (None, "")]
    field = given[0] if len(given) == 1 else "when"
    try:
        schedule = Schedule.make(
            at=at, every_seconds=every_seconds, cron_expr=cron_expr, tz=tz_name
        )
        schedule.first_run(now)  # an "at" in the past could never fire
    except ScheduleError as exc:
        raise FieldError(field, str(exc)) from None
    refused = too_often(schedule, text, force)
    if refused is not None:
        raise TooOften("every", refused)
    return schedule


def too_often(schedule: Schedule, text: bool, force: bool) -> str | None:
    """Why ``cron add`` refuses this schedule (an agent job repeating faster than once a
    minute without --force), or None."""
    every = schedule.every_seconds if schedule.kind == "every" else 0
    if text or force or not every or every >= MIN_EVERY_SECONDS:
        return None
    return (
        f"--every {every} would run a model turn every {describe_period(every)}; agent jobs "
        f"repeat at most once a minute: use --every {MIN_EVERY_SECONDS} or more, --text for "
        "a plain reminder without the model, or --force to run it this often anyway"
    )


def add_parsers(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    cron = sub.add_parser(
        "cron",
        parents=[common],
        help="scheduled jobs: list, add, remove (a running gateway picks changes up)",
        description="Reminders and recurring tasks, kept in <state>/cron/jobs.json. A running "
        "gateway picks a change up within a second or two.",
    )
    csub = cron.add_subparsers(dest="cron_command", metavar="SUBCOMMAND", required=True)
    ls = csub.add_parser(
        "list",
        parents=[common],
        help="one line per job: id, session, schedule, next run (local time), message",
    )
    ls.add_argument(
        "--all",
        action="store_true",
        help="also jobs whose channel is not enabled in the config (they wait)",
    )
    add = csub.add_parser(
        "add",
        parents=[common],
        help="add a job; prints its id first",
        description="Add a job to a chat. By default it runs an agent turn in that chat with "
        "the message as the task; --text sends the message as it is.",
    )
    when = add.add_mutually_exclusive_group(required=True)
    when.add_argument("--at", help='once, at a local ISO date-time, e.g. "2026-12-24T09:00"')
    when.add_argument("--every", type=int, metavar="SECONDS", help="repeat every SECONDS")
    when.add_argument("--cron", metavar="EXPR", help='5-field cron expression, e.g. "0 8 * * 1"')
    add.add_argument("--tz", help="IANA time zone (default: agent.timezone, else the system's)")
    add.add_argument(
        "-s", "--session", required=True, type=_session_key, help="the chat, e.g. telegram:123"
    )
    add.add_argument("-m", "--message", required=True, help="the task, or with --text the text")
    add.add_argument("--text", action="store_true", help="send the message as it is, no model")
    add.add_argument(
        "--force",
        action="store_true",
        help=f"allow an agent job with --every under {MIN_EVERY_SECONDS} seconds",
    )
    rm = csub.add_parser("remove", parents=[common], help="remove a job by its id")
    rm.add_argument("job_id")


def run(args: argparse.Namespace, cfg: Config) -> int:
    store = JobStore(cfg.agent.state_path)
    now = datetime.now(UTC)
    try:
        if args.cron_command == "list":
            # The scheduler brings the session store and the bus: only `list` needs it, and
            # every command line builds this module's parsers.
            from bot.cron.scheduler import describe_jobs

            jobs = store.load().jobs
            enabled = {name for name, c in cfg.channels if c.enabled}
            shown = [j for j in jobs if args.all or j.session.partition(":")[0] in enabled]
            for line in describe_jobs(shown, now):
                print(line)
            if len(shown) < len(jobs):
                print(f"({len(jobs) - len(shown)} more for channels not enabled; --all shows them)")
            elif not jobs:
                print("No scheduled jobs.")
            return 0
        if args.cron_command == "remove":
            removed = store.update(lambda jobs: remove_job(jobs, args.job_id))
            if removed is None:
                print(f"memobot: no job {args.job_id} (memobot cron list)", file=sys.stderr)
                return 1
            print(f"{removed.id} removed ({removed.session}, {removed.schedule.describe()})")
            return 0
        try:
            schedule = job_schedule(
                cfg,
                at=args.at,
                every_seconds=args.every,
                cron_expr=args.cron,
                tz=args.tz,
                text=args.text,
                force=args.force,
                now=now,
            )
        except TooOften as exc:
            print(f"memobot: {exc}", file=sys.stderr)
            return 2

        def add(jobs: Jobs) -> Job:
            return owner_job(
                jobs,
                session=args.session,
                message=args.message,
                schedule=schedule,
                text=args.text,
                now=now,
            )

        job = store.update(add)
    except ScheduleError as exc:
        print(f"memobot: {exc}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as exc:
        if file_problem(exc):
            raise  # another user's file, a full disk...: the command line's one line, exit 78
        print(f"memobot: cannot use the job store {store.path}: {exc}", file=sys.stderr)
        return 1
    assert job.next_moment is not None
    print(
        f"{job.id} scheduled for {job.session}: {schedule.describe()}; next run "
        f"{describe_moment(job.next_moment, schedule.zone, now)}"
    )
    channel = job.session.partition(":")[0]
    if not getattr(cfg.channels, channel).enabled:
        print(
            f"warning: channel {channel} is not enabled (channels.{channel}.enabled in "
            f"the config): the job waits, and runs once the gateway starts with {channel} on",
            file=sys.stderr,
        )
    return 0


def owner_job(
    jobs: Jobs, *, session: str, message: str, schedule: Schedule, text: bool, now: datetime
) -> Job:
    """A job the operator adds (the command line, the panel): it counts as an admin's; its
    turns see the owner's memory only in a provably private chat."""
    return new_job(
        jobs,
        session=session,
        message=message,
        schedule=schedule,
        now=now,
        deliver="text" if text else "agent",
        by_admin=True,
        is_group=not private_chat(session),
    )


class JobBusy(ValueError):
    """The job's occurrence is being handed over right now: it cannot change this moment."""


def edit_job(
    jobs: Jobs,
    job_id: str,
    *,
    session: str,
    message: str,
    schedule: Schedule,
    text: bool,
    now: datetime,
) -> Job | None:
    """Job ``job_id`` changed in place (same id), its next run counted again from ``now``;
    None when there is no such job. JobBusy while an occurrence of it is being handed over
    (the scheduler recorded it and is about to move the job on).

    Rights follow provenance: a job a non-admin made stays theirs (its turns narrowed) when
    only its schedule, chat or kind change; the operator who rewrites its message makes it
    the operator's."""
    job = jobs.get(job_id)
    if job is None:
        return None
    if job.firing:
        raise JobBusy(f"job {job_id} is being run this moment; try again in a few seconds")
    owned = job.by_admin or message != job.message
    job.session = session
    job.message = message
    job.schedule = schedule
    job.deliver = "text" if text else "agent"
    job.by_admin = owned
    # A non-admin's job runs as a group member's whatever its chat (scheduler.job_message).
    job.is_group = not private_chat(session) if owned else True
    job.next_run = to_iso(schedule.first_run(now))
    return job


def remove_job(jobs: Jobs, job_id: str) -> Job | None:
    job = jobs.get(job_id)
    if job is not None:
        jobs.jobs.remove(job)
    return job


def status_line(cfg: Config) -> str:
    """For ``memobot status``: how many jobs, and the next one due."""
    try:
        jobs = JobStore(cfg.agent.state_path).load()
    except (OSError, ValueError) as exc:
        return f"cannot read the job store: {exc}"
    nxt = jobs.next_due()
    if nxt is None or nxt.next_moment is None:
        return f"{len(jobs.jobs)} job(s)"
    when = describe_moment(nxt.next_moment, nxt.schedule.zone, datetime.now(UTC))
    return f"{len(jobs.jobs)} job(s); next: {nxt.id} ({nxt.session}) {when}"
