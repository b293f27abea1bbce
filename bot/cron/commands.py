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
    zone,
)
from bot.cron.store import Job, Jobs, JobStore, new_job
from bot.file_errors import file_problem


def _session_key(raw: str) -> str:
    channel, sep, chat = raw.partition(":")
    if not (sep and channel and chat.strip()):
        raise argparse.ArgumentTypeError(f"{raw!r}: expected a session key such as telegram:123")
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
        raise argparse.ArgumentTypeError(
            f"{raw!r}: {what}; jobs run in the gateway's channels: {', '.join(known)} "
            "(e.g. telegram:123)"
        )
    return raw


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
            removed = store.update(lambda jobs: _remove(jobs, args.job_id))
            if removed is None:
                print(f"memobot: no job {args.job_id} (memobot cron list)", file=sys.stderr)
                return 1
            print(f"{removed.id} removed ({removed.session}, {removed.schedule.describe()})")
            return 0
        schedule = Schedule.make(
            at=args.at,
            every_seconds=args.every,
            cron_expr=args.cron,
            tz=args.tz or cfg.agent.timezone or zone("").key,
        )
        refused = too_often(schedule, args.text, args.force)
        if refused is not None:
            print(f"memobot: {refused}", file=sys.stderr)
            return 2

        def add(jobs: Jobs) -> Job:
            return new_job(
                jobs,
                session=args.session,
                message=args.message,
                schedule=schedule,
                now=now,
                deliver="text" if args.text else "agent",
                by_admin=True,
                is_group=not private_chat(args.session),
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


def _remove(jobs: Jobs, job_id: str) -> Job | None:
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
