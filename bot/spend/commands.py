"""``memobot usage``: what the model calls of an installation took and cost, from its ledger."""

from __future__ import annotations

import argparse
import json
import sys

from bot.config import Config
from bot.memory.commands import DAY_FORMS, _day

EX_USAGE = 2


def add_parsers(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    from bot.spend.report import BY

    usage = sub.add_parser(
        "usage",
        parents=[common],
        help="model calls, tokens and cost from the usage ledger (default: this month)",
        description="Model calls, tokens (prompt, of which cached, and completion) and cost, "
        "from <state>/usage/. Days are local (agent.timezone); the default is this month up "
        "to today. A cost needs the model's price in llm.prices.",
    )
    usage.add_argument("--since", type=_day, help=f"from this day on: {DAY_FORMS}")
    usage.add_argument("--until", type=_day, help="up to this day (inclusive; default today)")
    usage.add_argument("--by", choices=BY, help="one row per session, purpose, model or day")
    usage.add_argument(
        "--json",
        action="store_true",
        help='one JSON object: "total" (calls, prompt_tokens, completion_tokens, '
        'cached_tokens, cost, ...) and with --by its "groups"',
    )


def run(args: argparse.Namespace, cfg: Config) -> int:
    from bot.cron.schedule import zone
    from bot.spend.report import report, window

    tz = zone(cfg.agent.timezone)
    since, until = window(tz, args.since, args.until)
    if since > until:
        print(
            f"memobot usage: --since {since} is after --until {until}: nothing between",
            file=sys.stderr,
        )
        return EX_USAGE
    made = report(cfg.agent.state_path, tz, since, until, args.by)
    if args.json:
        print(json.dumps(made.as_json(), indent=2))
    else:
        print("\n".join(made.table()))
    return 0
