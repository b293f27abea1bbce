"""How this process was started, so a hint names a command the person can paste as it is."""

from __future__ import annotations

import os
import shlex
import shutil
import sys


def _as_typed(path: str) -> str:
    """``path`` as the person would type it: the bare name when PATH finds this very file,
    else the path as it was given."""
    name = os.path.basename(path)
    found = shutil.which(name)
    if found and os.path.realpath(found) == os.path.realpath(path):
        return name
    return path


def program() -> str:
    """The command that runs memobot here: ``memobot``, ``.venv/bin/memobot`` or
    ``python -m bot`` (with the interpreter that ran it), shell-quoted."""
    argv0 = sys.argv[0] if sys.argv and sys.argv[0] else "memobot"
    if os.path.basename(argv0) in ("__main__.py", "-m", "-c"):
        return f"{shlex.quote(_as_typed(sys.executable))} -m bot"
    if os.sep not in argv0:
        return shlex.quote(argv0)
    return shlex.quote(_as_typed(argv0))


def command_for(config_path: str | os.PathLike[str], subcommand: str) -> str:
    """``<program> [--config PATH] SUBCOMMAND``: ``--config`` only when it is not the default."""
    from bot.config import default_config_path

    path = os.path.abspath(os.path.expanduser(config_path))
    if path == str(default_config_path()):
        return f"{program()} {subcommand}"
    return f"{program()} --config {shlex.quote(path)} {subcommand}"
