"""A file or folder memobot cannot use (the config, the state folder, the workspace), told in
one line: the path, its owner and mode, what went wrong and what to do.

Files owned by another user (``onboard`` run with sudo, memobot run as yourself), a folder
where a file belongs, a full disk or a read-only file system: each is a setup problem, not a
bug. The command line turns any such ``OSError`` into that line and exit code 78 (EX_CONFIG,
on which the systemd unit stops restarting); ``doctor`` reports it as a failed check.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pwd
import stat
from collections.abc import Iterator
from pathlib import Path

# The errors of a file's place, permissions or file system, never of its absence: a missing
# file is something each caller expects and handles.
SETUP_ERRNOS = frozenset(
    {
        errno.EACCES,
        errno.EPERM,
        errno.EISDIR,
        errno.ENOTDIR,
        errno.ENOSPC,
        errno.EDQUOT,
        errno.EROFS,
    }
)
_WRITES = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})
_ACTION = "memobot_action"  # set by about() on the OSError it marks


class FileAccessError(OSError):
    """An ``OSError`` of ``SETUP_ERRNOS`` with the path and what memobot was doing (``action``:
    "read", "write", "create", "open"); ``str()`` is the line for a person. Still an OSError
    with the same errno, so code that handles OSError goes on handling it."""

    def __init__(self, err: int, path: Path | str | None, action: str) -> None:
        super().__init__(err, os.strerror(err), None if path is None else str(path))
        self.action = action

    def __str__(self) -> str:
        return "{}. {}".format(*self.explained)

    @property
    def explained(self) -> tuple[str, str]:
        """(what could not be done with which path and why, what to do)."""
        return describe(self.errno or 0, self.filename, self.action)


def file_problem(exc: BaseException) -> FileAccessError | None:
    """``exc`` (or the OSError it was raised from) as a FileAccessError when it is about a
    file's place, permissions or file system; None for anything else (a network error, a
    missing file, a bug)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, FileAccessError):
            return current
        if isinstance(current, OSError) and current.errno in SETUP_ERRNOS:
            path = current.filename
            if path is not None or current.errno in _WRITES:
                path = os.fsdecode(path) if path is not None else None
                action = getattr(current, _ACTION, None) or _guess_action(current.errno, path)
                return FileAccessError(current.errno, path, action)
        # Only what it was raised from: an error met while handling one is another error.
        current = current.__cause__
    return None


@contextlib.contextmanager
def about(path: Path | str, action: str | None = None) -> Iterator[None]:
    """Mark a setup error in the block as being about ``path`` (when it names no file, or a
    name relative to an open folder) and ``action`` ("read", "write", "create", "open"; None:
    told from the path's permissions). The exception keeps its type (a PermissionError stays
    one, for the code that handles it)."""
    try:
        yield
    except OSError as exc:
        if exc.errno in SETUP_ERRNOS:
            if not exc.filename or not os.path.isabs(os.fsdecode(exc.filename)):
                exc.filename = str(path)
            if action is not None and not hasattr(exc, _ACTION):
                setattr(exc, _ACTION, action)
        raise


def _guess_action(err: int, path: str | None) -> str:
    if err in _WRITES:
        return "write"
    if path is None:
        return "use"
    with contextlib.suppress(OSError):
        if stat.S_ISDIR(os.stat(path).st_mode):
            return "open"
        return "read" if not os.access(path, os.R_OK) else "write"
    return "open"


def owner_and_mode(path: Path | str) -> str:
    """ "owner root, mode 0600" for ``path`` (a uid without a name is shown as a number)."""
    st = os.lstat(path)
    try:
        owner = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        owner = str(st.st_uid)
    return f"owner {owner}, mode {stat.S_IMODE(st.st_mode):04o}"


def _blocking_folder(path: Path) -> Path | None:
    """The outermost folder on the way to ``path`` that this process may not enter."""
    for folder in reversed(path.parents):
        try:
            st = os.stat(folder)
        except OSError:
            return folder.parent if folder.parent != folder else None
        if stat.S_ISDIR(st.st_mode) and not os.access(folder, os.X_OK):
            return folder
    return None


def _file_in_the_way(path: Path) -> Path | None:
    """The first component of ``path`` that is there but not a folder."""
    for candidate in reversed(path.parents):
        with contextlib.suppress(OSError):
            if not stat.S_ISDIR(os.stat(candidate).st_mode):
                return candidate
    return None


def _shown(path: Path) -> str:
    try:
        return f"{path} ({owner_and_mode(path)})"
    except OSError:
        return str(path)


def describe(err: int, filename: str | None, action: str) -> tuple[str, str]:
    """What memobot could not do with which path and why; and what to do about it."""
    if filename is None:
        what = f"cannot {action} a file"
        path = None
    else:
        path = Path(os.path.abspath(filename))
        if action == "read" and err in (errno.EACCES, errno.EPERM) and os.path.isdir(path):
            action = "open"  # the folder on the way to the file
        what = f"cannot {action} {path}"
    if err in (errno.EACCES, errno.EPERM) and path is not None:
        folder = _blocking_folder(path)
        if folder is None and not os.path.lexists(path):
            # Nothing there, every folder on the way open: the one above may not be written.
            folder, what = path.parent, f"cannot create {path}"
        if folder is not None and folder != path:
            return (
                f"{what}: permission denied by the folder {_shown(folder)}",
                "Run memobot as the owner of that folder, or fix its permissions (chown/chmod).",
            )
        kind = "folder" if os.path.isdir(path) else "file"
        return (
            f"{what} ({_describe_owner(path)}): permission denied",
            f"Run memobot as the owner of that {kind}, or fix its permissions (chown/chmod).",
        )
    if err == errno.EISDIR and path is not None:
        return (
            f"{what}: it is a folder where a file should be ({_describe_owner(path)})",
            "Move it away; memobot creates the file it needs.",
        )
    if err == errno.ENOTDIR and path is not None:
        blocker = _file_in_the_way(path) or path
        return (
            f"{what}: {_shown(blocker)} is a file where a folder should be",
            "Move it away; memobot creates the folders it needs.",
        )
    if err in (errno.ENOSPC, errno.EDQUOT):
        why = "no space left on the device" if err == errno.ENOSPC else "disk quota exceeded"
        return f"{what}: {why}", "Free some space there, then start memobot again."
    if err == errno.EROFS:
        return (
            f"{what}: the file system is read-only",
            "Put memobot's folders on a writable one, or under systemd list the folder in "
            "ReadWritePaths= of the unit.",
        )
    return f"{what}: {os.strerror(err).lower()}", "Check the path and its permissions."


def _describe_owner(path: Path) -> str:
    try:
        return owner_and_mode(path)
    except OSError:
        return "owner and mode unknown"
