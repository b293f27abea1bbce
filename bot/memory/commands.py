"""``memobot memory ...`` and ``memobot dream``: the person's window into long-term memory."""

from __future__ import annotations

import argparse
import asyncio
from datetime import date

from bot.config import Config


def _day(text: str) -> date:
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a date as YYYY-MM-DD, got {text!r}") from None


def add_parsers(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    memory = sub.add_parser(
        "memory", parents=[common], help="look at, search and undo changes to memory"
    )
    msub = memory.add_subparsers(dest="memory_command", metavar="SUBCOMMAND", required=True)
    msub.add_parser("log", parents=[common], help="list the commits to the memory files")
    diff = msub.add_parser(
        "diff", parents=[common], help="show what a commit changed (default: the last one)"
    )
    diff.add_argument("rev", nargs="?", help="commit id (or a unique prefix)")
    revert = msub.add_parser(
        "revert", parents=[common], help="undo one commit's changes with a new commit"
    )
    revert.add_argument("rev", help="commit id (or a unique prefix)")
    search = msub.add_parser(
        "search", parents=[common], help="full-text search over history and memory files"
    )
    search.add_argument("query", nargs="+")
    search.add_argument("--since", type=_day, help="only history from this day (YYYY-MM-DD)")
    search.add_argument("--until", type=_day, help="only history up to this day (YYYY-MM-DD)")
    search.add_argument("-n", "--limit", type=int, default=10)
    history = msub.add_parser("history", parents=[common], help="print the archive by day")
    history.add_argument("--since", type=_day)
    history.add_argument("--until", type=_day)

    sub.add_parser(
        "dream", parents=[common], help="distil the history archive into long-term memory now"
    )


def run(args: argparse.Namespace, cfg: Config) -> int:
    if args.command == "dream":
        from bot.memory.dream import run_dream_command

        return asyncio.run(run_dream_command(cfg, args))
    name = args.memory_command
    if name in ("log", "diff", "revert"):
        from bot.memory import versioning

        return {
            "log": versioning.cmd_log,
            "diff": versioning.cmd_diff,
            "revert": versioning.cmd_revert,
        }[name](cfg, args)
    from bot.memory import search

    return {"search": search.cmd_search, "history": search.cmd_history}[name](cfg, args)
