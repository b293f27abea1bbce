"""``memobot service install`` and ``memobot doctor``: argument parsing and dispatch.

Both run before the config is loaded by the CLI: ``doctor`` reports a broken config as one of
its checks, and ``service install`` picks its own default config for a system unit.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parsers(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    service = sub.add_parser("service", parents=[common], help="run memobot under systemd")
    ssub = service.add_subparsers(dest="service_command", metavar="SUBCOMMAND", required=True)
    install = ssub.add_parser(
        "install",
        parents=[common],
        help="write the systemd unit for this installation",
        description="Write memobot.service for this installation: the path of this memobot, "
        "the config (a system unit defaults to /etc/memobot/config.json) and its workspace. "
        "System units go to /etc/systemd/system (needs root), user units to "
        "~/.config/systemd/user. A unit that differs is only replaced with --force.",
    )
    install.add_argument(
        "--user", action="store_true", help="a user unit (systemctl --user) instead of a system one"
    )
    install.add_argument(
        "--dry-run", action="store_true", help="print the unit and where it would go; write nothing"
    )
    install.add_argument("--force", action="store_true", help="replace a unit that differs")
    doctor = sub.add_parser(
        "doctor",
        parents=[common],
        help="check the config, files, LLM, channels, MCP servers and service; explain each "
        "problem",
        description="Check that memobot can run: one line per check, with a fix for each "
        "failure; each MCP server is started once and its tools listed. Exits 1 when "
        "anything failed. Warnings (e.g. no network to a chat platform) "
        "do not fail.",
    )
    doctor.add_argument(
        "--fix",
        action="store_true",
        help="apply the safe fixes: file modes, and repair of damaged session files",
    )


def run(args: argparse.Namespace) -> int:
    config: Path | None = getattr(args, "config", None)
    if args.command == "service":
        from bot.service.install import cmd_service_install

        kind = "user" if args.user else "system"
        return cmd_service_install(kind, config, dry_run=args.dry_run, force=args.force)
    from bot.service.doctor import cmd_doctor

    return cmd_doctor(config, fix=args.fix)
