"""``memobot memory people [list | show WHO | edit WHO]``: the owner's window on every person's
memory file (bot.memory.people). Reading and saving go through :mod:`bot.memory.editing`, as the
panel's Memory screen does, so both refuse the same files and commit the same way."""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bot.config import Config

# Building the command line imports this module: what reads and commits (dulwich) is imported
# only when the command runs.


def add_parser(msub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    people = msub.add_parser(
        "people", parents=[common], help="list, show or edit what memobot keeps about each person"
    )
    psub = people.add_subparsers(dest="people_command", metavar="ACTION")
    psub.add_parser("list", parents=[common], help="every person's file (the default)")
    for name, what in (
        ("show", "print one person's file"),
        ("edit", "edit one person's file in $VISUAL or $EDITOR, then commit it"),
    ):
        action = psub.add_parser(name, parents=[common], help=what)
        action.add_argument(
            "who", help="telegram-1001, telegram:1001, the file's path or the name in its header"
        )


def cmd_people(cfg: Config, args: argparse.Namespace) -> int:
    from bot.memory.editing import EditError, read_current
    from bot.memory.people import find, listing
    from bot.memory.versioning import shown_text as _shown

    workspace = cfg.agent.workspace_path
    action = getattr(args, "people_command", None) or "list"
    if action == "list":
        files = listing(workspace)
        if not files:
            print("No person's memory file yet (memory/people/ is empty).")
        for f in files:
            who = _shown(f.speaker.shown)
            print(f"{f.rel}  {who}  {f.size:,} bytes")
        return 0
    rel = find(workspace, args.who)
    if rel is None:
        print(f"memobot: no person's file for {args.who!r}: see `memobot memory people`")
        return 1
    try:
        current = read_current(workspace, rel)
    except EditError as exc:
        print(f"memobot: {exc}", file=sys.stderr)
        return 1
    if action == "show":
        sys.stdout.write(_shown(current.text))
        return 0
    return _edit(cfg, rel, current.text, current.digest)


def _edit(cfg: Config, rel: str, text: str, seen: str) -> int:
    from bot.memory.editing import EditError, Stale, save

    editor = os.environ.get("VISUAL") or os.environ.get("EDITOR") or "vi"
    with tempfile.TemporaryDirectory(prefix="memobot-person-") as folder:
        copy = Path(folder) / Path(rel).name
        copy.write_text(text, encoding="utf-8")
        # The owner's own editor, on a private copy: the workspace file is written only by
        # save(), which refuses it when it changed meanwhile.
        done = subprocess.run([*shlex.split(editor), str(copy)], check=False)
        if done.returncode != 0:
            print(f"memobot: the editor ended with status {done.returncode}; nothing was saved")
            return 1
        new = copy.read_text(encoding="utf-8")
    try:
        saved = save(cfg.agent.workspace_path, cfg.agent.state_path, rel, new, seen, by="cli")
    except Stale as exc:
        print(f"memobot: {exc}", file=sys.stderr)
        return 1
    except (EditError, OSError) as exc:
        print(f"memobot: {exc}", file=sys.stderr)
        return 1
    if not saved.written:
        print(f"{rel} is unchanged: nothing to save.")
    elif saved.commit is None:
        print(f"Saved {rel}: it is as its last commit has it again.")
    else:
        print(f"Saved {rel}: commit {saved.commit[:7]}.")
    return 0
