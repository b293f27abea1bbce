"""``memobot import nanobot [PATH]``: the command line of the importer."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bot.config import ConfigError
from bot.file_errors import file_problem
from bot.invocation import command_for


def add_parsers(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    imp = sub.add_parser(
        "import",
        parents=[common],
        help="adopt another assistant's workspace, sessions and config (nanobot)",
    )
    isub = imp.add_subparsers(dest="import_source", metavar="SOURCE", required=True)
    nano = isub.add_parser(
        "nanobot",
        parents=[common],
        help="adopt a nanobot installation (default ~/.nanobot)",
        description="Adopt a nanobot installation: its workspace (in place, or copied with "
        "--copy), its memory and history as they are, its git history, its sessions (into "
        "memobot's state folder) and its config.json (written as a memobot config at --config). "
        "Prints what was adopted, converted or left alone.",
    )
    nano.add_argument(
        "path",
        nargs="?",
        default="~/.nanobot",
        help="nanobot's home folder (with config.json) or a nanobot workspace (default ~/.nanobot)",
    )
    nano.add_argument(
        "--copy",
        action="store_true",
        help="copy the workspace instead of using it in place (nanobot keeps its own)",
    )
    nano.add_argument(
        "--workspace",
        type=Path,
        help="with --copy: where the copy goes (default: workspace/ next to the config file)",
    )
    nano.add_argument(
        "--force",
        action="store_true",
        help="replace an existing memobot config (the old one is kept as .bak-<time>)",
    )


def run(args: argparse.Namespace, config_path: Path) -> int:
    from bot.importer.nanobot import ImportRefused, Options, run_import
    from bot.memory.versioning import MemoryRepoError

    if args.workspace and not args.copy:
        print(
            "memobot: --workspace goes with --copy (without it the workspace stays in place)",
            file=sys.stderr,
        )
        return 2
    opts = Options(
        source=Path(args.path).expanduser(),
        config_path=config_path.expanduser().absolute(),
        copy=args.copy,
        copy_to=args.workspace,
        force=args.force,
    )
    try:
        plan, written = run_import(opts)
    except ImportRefused as exc:
        print(f"memobot: {exc}", file=sys.stderr)
        return exc.code
    except (OSError, MemoryRepoError, ConfigError) as exc:
        if file_problem(exc):
            raise  # another user's file, a full disk...: the command line's one line, exit 78
        print(
            f"memobot: the import stopped part way: {exc}. Fix that and run it again (with "
            "--force if the config was written): what is done is kept, nothing is done twice",
            file=sys.stderr,
        )
        return 1
    source = plan.source.home or plan.source.workspace
    print(f"Imported nanobot from {source}:")
    print(plan.report.render())
    print(
        f"\nNext: {command_for(written, 'status')}, then {command_for(written, 'agent')} "
        f"(or gateway). {command_for(written, 'doctor')} checks file modes and the LLM."
    )
    return 0
