"""The one path policy for everything that acts for the model (DESIGN.md section 10).

The agent may read and write its workspace and a private temporary folder, read (and run) the
system, and touch nothing else: never the config file, memobot's state folder or the home
folder, even where they lie inside a readable system folder (``/etc/memobot/config.json``).
The file tools check paths against this policy; ``exec`` hands the same lists to the kernel.
"""

from __future__ import annotations

import glob
import os
import stat
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from bot.layout import real_path, within

# Read and execute only.
SYSTEM_READ_ROOTS: tuple[str, ...] = (
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt", "/sys",
)  # fmt: skip
# Secrets of the system itself, under the readable folders: unreadable to a memobot that is
# not root anyway, and not to be handed to the model by one that is.
SYSTEM_SECRETS: tuple[str, ...] = (
    "/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-", "/etc/sudoers",
    "/etc/sudoers.d", "/etc/ssl/private", "/etc/credstore", "/etc/credstore.encrypted",
    "/etc/ssh/ssh_host_*_key", "/etc/memobot",
)  # fmt: skip
# Readable by confined processes only: the kernel's ptrace rules keep them out of memobot's
# /proc/<pid>/environ, mem and fds. memobot's own file tools never read /proc (its
# /proc/self is memobot, secrets included).
CONFINED_READ_ROOTS: tuple[str, ...] = ("/proc",)
# Read, write and ioctl, but no other file under /dev (disks, memory, terminals of others).
DEVICES: tuple[str, ...] = (
    "/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty",
)  # fmt: skip


def carve(
    roots: Iterable[Path],
    denied: Iterable[Path],
    listdir: Callable[[Path], list[str]] = os.listdir,
) -> list[Path]:
    """Cover ``roots`` with folders and files that contain none of ``denied``.

    A kernel allowlist cannot say "all of /etc except /etc/memobot", so a root holding a denied
    path is replaced by its entries, recursively, leaving the denied ones out. Entries are
    resolved first: a symlink inside a root that points at a denied path is not granted.
    Pure apart from ``listdir``; the result is sorted and free of duplicates.
    """
    # On strings and sets: a Path comparison costs microseconds, and a root such as /etc holds
    # hundreds of entries, each compared with every denied path.
    deny = {os.path.realpath(d) for d in denied}
    under_denied = tuple(d if d.endswith("/") else d + "/" for d in deny)
    holders = {parent for d in deny for parent in _parents(d)}  # folders holding a denied path
    out: set[str] = set()
    todo = [os.path.realpath(r) for r in roots]
    while todo:
        path = todo.pop()
        if path in deny or (under_denied and path.startswith(under_denied)):
            continue
        if path not in holders:
            out.add(path)
            continue
        try:
            names = listdir(Path(path))
        except OSError:
            continue
        todo.extend(_real_entry(path, name) for name in names)
    # /bin -> /usr/bin on merged-/usr systems: keep only the outermost folders (shallowest
    # first, so each path meets its kept ancestors; a set lookup per ancestor, not per pair).
    kept: set[str] = set()
    for path in sorted(out, key=lambda p: p.count("/") + (p != "/")):  # "/" has depth 1
        if not any(parent in kept for parent in _parents(path)):
            kept.add(path)
    # In Path order (component by component), sorted as strings split the same way.
    return [Path(p) for p in sorted(kept, key=lambda p: p.split("/"))]


def _real_entry(folder: str, name: str) -> str:
    """The real path of ``name`` in ``folder``, itself a real path: only the entry can be a
    link (one lstat, where realpath would lstat every component again)."""
    path = os.path.join(folder, name)
    try:
        if not stat.S_ISLNK(os.lstat(path).st_mode):
            return path
    except OSError:
        return path  # gone meanwhile: as realpath gives it, as written
    return os.path.realpath(path)


def _parents(path: str) -> Iterator[str]:
    while path not in ("/", ""):
        path = path.rpartition("/")[0] or "/"
        yield path


@dataclass(frozen=True, slots=True)
class PathPolicy:
    """Where the agent may read and write. Build it with :meth:`for_agent`.

    ``protected`` paths (the config file, the state folder) are refused everywhere, also where
    a layout mistake put them inside a writable folder. ``read_roots`` are already carved so
    they hold no protected or private path (the home folder).
    """

    workspace: Path
    temp: Path | None = None
    read_roots: tuple[Path, ...] = ()  # read and execute, beyond the writable folders
    protected: tuple[Path, ...] = ()

    @classmethod
    def for_agent(
        cls,
        workspace: Path,
        temp: Path | None,
        *,
        protected: Iterable[Path] = (),
        private: Iterable[Path] = (),
    ) -> PathPolicy:
        """The policy of a confined agent: workspace and ``temp`` writable, the system readable
        except ``protected`` (never reachable) and ``private`` (not readable through the system
        folders, e.g. a home folder under /etc or /opt; the workspace may lie inside it)."""
        keep_out = tuple(real_path(p) for p in protected)
        roots = [Path(r) for r in SYSTEM_READ_ROOTS if os.path.lexists(r)]
        secrets = [Path(p) for pattern in SYSTEM_SECRETS for p in glob.glob(pattern)]
        read_roots = tuple(carve(roots, (*keep_out, *private, *secrets)))
        return cls(real_path(workspace), temp and real_path(temp), read_roots, keep_out)

    @property
    def writable(self) -> tuple[Path, ...]:
        return (self.workspace,) if self.temp is None else (self.workspace, self.temp)

    @property
    def readable(self) -> tuple[Path, ...]:
        return (*self.writable, *self.read_roots)

    def allows(self, path: Path, *, write: bool) -> bool:
        """Whether the real path ``path`` may be read (or written, with ``write``)."""
        if any(within(path, p) for p in self.protected):
            return False
        return any(within(path, root) for root in (self.writable if write else self.readable))
