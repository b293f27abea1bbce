"""Folders and files that only memobot's user may read, whatever the process umask.

The state folder holds every chat's transcript, the search index holds the same text, and the
line history of the terminal chat holds what was typed. ``mkdir(mode=0o700)`` protects only
the last folder (``parents=True`` creates the others with the umask's mode), and libraries
such as SQLite create files 0644; so folders are created one level at a time and files are
created 0600 before anyone else opens them.
"""

from __future__ import annotations

import os
from pathlib import Path

from bot import durable

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600


def make_private_dirs(path: Path) -> None:
    """Create ``path`` and every missing parent with mode 0700 (folders that already exist
    are left as they are: ``memobot doctor`` reports loose modes)."""
    missing: list[Path] = []
    current = path
    while not current.exists():
        missing.append(current)
        if current.parent == current:
            break
        current = current.parent
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=PRIVATE_DIR)
        except FileExistsError:
            continue  # made meanwhile by another process; its mode is its creator's business
        os.chmod(folder, PRIVATE_DIR)  # mkdir's mode passed through the umask


def create_private_file(path: Path) -> None:
    """Make sure ``path`` exists; a new file gets mode 0600 from its first byte."""
    make_private_dirs(path.parent)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, PRIVATE_FILE)
    except FileExistsError:
        return
    os.close(fd)


def replace_durably(path: Path, text: str, sync: bool = True) -> None:
    """Replace ``path`` (mode 0600) with ``text``: tmp, fsync, rename, fsync of the folder. A
    crash or power cut leaves the old file or the new one, never half, and the rename itself
    survives (state files whose old version coming back would repeat or lose something).
    ``sync`` False: tmp and rename only, for state an older version of which is harmless."""
    durable.replace_file(path, text, mode=PRIVATE_FILE, sync=sync)
