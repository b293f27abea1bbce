"""``memobot memory ...`` and ``memobot dream``: the person's window into long-term memory."""

from __future__ import annotations

import argparse
import asyncio
import re
from datetime import date, timedelta

from bot.config import Config

_SPAN = re.compile(r"^(\d+)\s*([dw])$")
DAY_FORMS = "YYYY-MM-DD, today, yesterday, Nd (N days ago) or Nw (N weeks ago)"


def parse_day(text: str, today: date | None = None) -> date:
    """A local calendar day from ``YYYY-MM-DD``, ``today``, ``yesterday``, ``7d`` or ``2w``.

    Raises ValueError naming the accepted forms.
    """
    today = today or date.today()
    word = text.strip().lower()
    if word == "today":
        return today
    if word == "yesterday":
        return today - timedelta(days=1)
    if m := _SPAN.match(word):
        return today - timedelta(days=int(m.group(1)) * (7 if m.group(2) == "w" else 1))
    try:
        return date.fromisoformat(word)
    except ValueError:
        raise ValueError(f"expected {DAY_FORMS}; got {text!r}") from None


def _day(text: str) -> date:
    try:
        return parse_day(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


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
        "search",
        parents=[common],
        help="search history and memory files (by words; by meaning too with memory.embeddings)",
    )
    search.add_argument("query", nargs="+")
    search.add_argument("--since", type=_day, help=f"only history from this day on: {DAY_FORMS}")
    search.add_argument("--until", type=_day, help="only history up to this day (inclusive)")
    search.add_argument("-n", "--limit", type=int, default=10)
    history = msub.add_parser("history", parents=[common], help="print the archive by day")
    history.add_argument("--since", type=_day, help=f"from this day on: {DAY_FORMS}")
    history.add_argument("--until", type=_day, help="up to this day (inclusive)")
    from bot.memory.people_commands import add_parser as add_people

    add_people(msub, common)

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
    if name == "people":
        from bot.memory.people_commands import cmd_people

        return cmd_people(cfg, args)
    from bot.memory import search

    return {"search": search.cmd_search, "history": search.cmd_history}[name](cfg, args)
