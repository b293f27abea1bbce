"""``memobot tasks [list|show ID|cancel ID]``: the background tasks of an installation, from
``<state>/tasks/`` (bot.tasks); a cancel is picked up by the running gateway."""

from __future__ import annotations

import argparse
import sys
import time

from bot.config import Config
from bot.tasks import TaskRecord, TaskStore, describe, usage_by_task

EX_NOT_FOUND = 1


def add_parsers(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    tasks = sub.add_parser(
        "tasks",
        parents=[common],
        help="list, show or cancel background tasks (the spawn tool)",
        description="Background tasks started by the model's spawn tool (see docs/tasks.md).",
    )
    tasks_sub = tasks.add_subparsers(dest="tasks_command", metavar="SUBCOMMAND")
    tasks_sub.add_parser("list", parents=[common], help="every task: id, state, age, label")
    show = tasks_sub.add_parser("show", parents=[common], help="one task's record")
    show.add_argument("id")
    cancel = tasks_sub.add_parser(
        "cancel", parents=[common], help="stop a running task (the gateway stops it)"
    )
    cancel.add_argument("id")


def show_lines(rec: TaskRecord) -> list[str]:
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(rec.started))
    lines = [
        f"id: {rec.id}",
        f"label: {rec.label or '-'}",
        f"state: {rec.state}"
        + (" (cancel asked)" if rec.cancel and rec.state == "running" else ""),
        f"chat: {rec.parent}",
        f"started by: {rec.starter}" + (" (admin)" if rec.admin else ""),
        f"started: {started}",
        f"session: {rec.session_key}",
        f"model: {rec.model or 'llm.model (the default)'}",
    ]
    if rec.ended is not None:
        lines.append(f"ended: {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(rec.ended))}")
    return lines


def run(args: argparse.Namespace, cfg: Config) -> int:
    try:
        return _run(args, cfg)
    except (OSError, ValueError) as exc:  # a damaged tasks.json: said in one line, left as is
        print(f"memobot tasks: cannot read the task store: {exc}", file=sys.stderr)
        return EX_NOT_FOUND


def _run(args: argparse.Namespace, cfg: Config) -> int:
    store = TaskStore(cfg.agent.state_path)
    action = args.tasks_command or "list"
    if action == "list":
        records = list(store.load().values())
        if not records:
            print("No background tasks.")
            return 0
        from bot.cron.schedule import zone

        usage = usage_by_task(cfg.agent.state_path, zone(cfg.agent.timezone))
        lines = describe(records, time.time(), usage)
        for rec, line in zip(sorted(records, key=lambda r: r.started), lines, strict=True):
            print(f"{line}  ({rec.parent})")
        return 0
    if action == "show":
        rec = store.load().get(args.id)
        if rec is None:
            print(f"memobot tasks: no task {args.id}", file=sys.stderr)
            return EX_NOT_FOUND
        print("\n".join(show_lines(rec)))
        return 0
    rec = store.request_cancel(args.id)
    if rec is None:
        print(f"memobot tasks: no running task {args.id}", file=sys.stderr)
        return EX_NOT_FOUND
    print(
        f"cancel asked for task {rec.id}: a running gateway stops it within a second (else at its "
        "next start) and reports it stopped in its chat"
    )
    return 0
