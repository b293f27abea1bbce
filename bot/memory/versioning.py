"""Versioned memory: the long-term memory files under git, written with dulwich (no git binary).

The repository is memobot's own: a bare repository ``<agent.stateDir>/memory.git`` that only
memobot's process opens (the state folder is out of reach of the model's tools and commands).
It records only :data:`TRACKED` (USER.md, SOUL.md, memory/MEMORY.md, each chat's
memory/chats/<chat>.md, each person's memory/people/<person>.md and everything under skills/).
The tree of each commit is built from those workspace files, read through
:mod:`bot.workspace_files` (never following a link); every other workspace file (notes, media,
scripts, history.jsonl, the cursors) is never opened, hashed or committed. Nothing of the
repository is in the workspace: no ``.git``, no index.

Rules for what a commit holds:

* regular files and symlinks under the tracked paths (a symlink is stored as its target text, it
  is never followed); folders named ``.git``, special files (FIFOs, sockets, devices) and files
  larger than :data:`MAX_FILE_BYTES` are left out, as if untracked;
* deleting a tracked file commits the deletion; empty folders are not recorded (as in git).

Migration (:meth:`MemoryRepo.migrate`): earlier versions of memobot kept this repository in
``<workspace>/.git``, and nanobot keeps its memory store there. When memobot's repository does
not exist yet, the history of such a ``.git`` is copied into it once (:mod:`bot.memory.legacy`
reads it as the hostile data it is: no link followed, no config read, in a child process with
limits), nanobot's bookkeeping files (``.gitignore``, ``memory/.dream_cursor``) leave the tree
with one commit, and the workspace's ``.git`` is never used again. A ``.git`` that tracks other
files (a person's project), or one that looks wrong, is left alone: a fresh history starts.

Revert semantics (:meth:`MemoryRepo.revert`): like ``git revert``, it undoes one commit's changes
with a new commit. For each path that commit changed, the file on disk now is compared with what
the commit wrote: unchanged since, the file goes back to its version before the commit (or is
deleted, if the commit added it); changed since, the commit's change is taken out with a
three-way line merge (:func:`merge3`) that keeps the later edits. Edits that touch the same or
adjacent lines, binary files, symlinks and add/delete clashes are conflicts: then nothing at all
is written and :class:`MemoryRepoError` names every conflicting file. The revert commit records
the reverted paths only; other uncommitted edits stay uncommitted.

Concurrency: every write takes an exclusive ``flock`` on ``<stateDir>/memory.git.lock``, so
threads and processes (the daemon and a ``memobot memory revert`` in a terminal) never
interleave; :func:`commit_async` adds a per-repository asyncio lock so waiting coroutines do not
hold threads.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import io
import logging
import os
import re
import shutil
import stat
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from difflib import SequenceMatcher
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from dulwich.errors import NotGitRepository
from dulwich.index import commit_tree
from dulwich.object_store import iter_tree_contents, tree_lookup_path
from dulwich.objects import Blob, Commit, ObjectID
from dulwich.patch import write_tree_diff
from dulwich.repo import Repo

from bot import durable, workspace_files
from bot.file_errors import file_problem
from bot.private import make_private_dirs

if TYPE_CHECKING:
    from bot.config import Config

log = logging.getLogger(__name__)

TRACKED: tuple[str, ...] = (
    "USER.md",
    "SOUL.md",
    "memory/MEMORY.md",
    "memory/chats",
    "memory/people",
    "skills",
)
DEFAULT_AUTHOR = "memobot <memobot@localhost>"
# A change a person made in the control panel: its commits say so ("by web") in the author
# and the message, so `memobot memory log` tells them from the agent's and Dream's.
WEB_AUTHOR = "memobot by web <memobot@localhost>"
MAX_FILE_BYTES = 1024 * 1024  # memory is text; a bigger file under skills/ is not versioned
SHORT_ID_LEN = 7
MIN_PREFIX_LEN = 4
BRANCH = b"main"

STATE_REPO = "memory.git"  # in agent.stateDir
_LOCK_FILE = "memory.git.lock"  # beside it: held while the repository is created, too
_STAGING = "memory.git.new"  # a repository being created (and its history copied) under the lock
_GIT_DIR = ".git"
_MODE_FILE = 0o100644
_MODE_EXEC = 0o100755
_MODE_LINK = 0o120000
_PRIVATE_DIR = 0o700
_BINARY_SNIFF = 8000
_REV = re.compile(r"^(?P<base>HEAD|@|[0-9a-fA-F]+)(?P<steps>(?:~[0-9]*|\^)*)$")
_IDENT = re.compile(r"^[^<>\n]+ <[^<>\n]*>$")


# Files nanobot's GitStore versions besides the memory files. A repository whose tree holds
# nothing else is nanobot's memory store, and memobot adopts it with its history.
NANOBOT_BOOKKEEPING: frozenset[bytes] = frozenset(
    {b".gitignore", b"memory/.dream_cursor", b"memory/.cursor"}
)


class MemoryRepoError(Exception):
    """A memory-history operation cannot be done. ``str()`` is a message for a person."""


@dataclass(frozen=True, slots=True)
class Migration:
    """What :meth:`MemoryRepo.migrate` found in a workspace's old ``.git``.

    ``state``: ``exists`` (memobot's repository was there already: nothing read), ``none`` (no
    old ``.git``, or one without commits), ``copied`` (its ``commits`` are memobot's history
    now; ``drop`` lists nanobot's bookkeeping paths one commit took out of the tree),
    ``foreign`` (it tracks other files, ``detail`` names one: a person's repository, left
    alone) or ``refused`` (``detail`` says what looked wrong). The last two start a fresh
    history; in every case the old ``.git`` is never used again.
    """

    state: Literal["exists", "none", "copied", "foreign", "refused"]
    commits: int = 0
    drop: tuple[str, ...] = ()
    detail: str = ""


@dataclass(frozen=True, slots=True)
class CommitInfo:
    """One commit of the memory history."""

    id: str
    short_id: str
    time: datetime  # commit time, timezone-aware UTC
    author: str
    message: str  # the full message, without the trailing newline

    @property
    def subject(self) -> str:
        """The first line of the message."""
        return self.message.split("\n", 1)[0]


# -- pure core: three-way line merge ---------------------------------------------------------


def merge3(base: bytes, ours: bytes, theirs: bytes) -> bytes | None:
    """Combine the changes ``ours`` and ``theirs`` each made to ``base``, line by line.

    Returns the merged text, or None when both sides changed the same stretch of ``base``
    differently (a conflict; changes to adjacent lines count as the same stretch, as in git).
    """
    b, a, t = (text.splitlines(keepends=True) for text in (base, ours, theirs))
    out: list[bytes] = []
    bi = ai = ti = 0
    for b_start, b_end, a_start, t_start in _sync_regions(b, a, t):
        chunk = _merge_chunk(b[bi:b_start], a[ai:a_start], t[ti:t_start])
        if chunk is None:
            return None
        out += chunk
        out += b[b_start:b_end]
        length = b_end - b_start
        bi, ai, ti = b_end, a_start + length, t_start + length
    return b"".join(out)


def _merge_chunk(base: list[bytes], ours: list[bytes], theirs: list[bytes]) -> list[bytes] | None:
    if ours == theirs or theirs == base:
        return ours
    if ours == base:
        return theirs
    return None


def _sync_regions(
    base: list[bytes], ours: list[bytes], theirs: list[bytes]
) -> list[tuple[int, int, int, int]]:
    """Stretches of ``base`` both sides left alone: (base start, base end, ours start, theirs
    start), in order, ending with an empty region at the ends of all three."""
    ours_blocks = SequenceMatcher(None, base, ours, autojunk=False).get_matching_blocks()
    theirs_blocks = SequenceMatcher(None, base, theirs, autojunk=False).get_matching_blocks()
    regions: list[tuple[int, int, int, int]] = []
    i = j = 0
    while i < len(ours_blocks) and j < len(theirs_blocks):
        o_base, o_at, o_len = ours_blocks[i]
        t_base, t_at, t_len = theirs_blocks[j]
        start, end = max(o_base, t_base), min(o_base + o_len, t_base + t_len)
        if start < end:
            regions.append((start, end, o_at + start - o_base, t_at + start - t_base))
        if o_base + o_len < t_base + t_len:
            i += 1
        else:
            j += 1
    regions.append((len(base), len(base), len(ours), len(theirs)))
    return regions


def _is_binary(data: bytes) -> bool:
    return b"\0" in data[:_BINARY_SNIFF]


# -- the working tree: what is tracked, read without following links -------------------------


@dataclass(frozen=True, slots=True)
class _Side:
    """One version of a path: git mode and content (a symlink's content is its target)."""

    mode: int
    data: bytes


@dataclass(frozen=True, slots=True)
class _Found:
    side: _Side
    stat: os.stat_result


# A path's version on disk now, and what a revert makes of it (None = absent).
_Plan = tuple[_Side | None, _Side | None]


class _Unusable(Exception):
    """A tracked path exists on disk but cannot be versioned (folder, special file, too big)."""


_warned: set[str] = set()


def _git_mode(st: os.stat_result) -> int:
    if stat.S_ISLNK(st.st_mode):
        return _MODE_LINK
    return _MODE_EXEC if st.st_mode & stat.S_IXUSR else _MODE_FILE


def _read_file(root: Path, rel: str) -> bytes:
    """Read a regular file without following any link, at most MAX_FILE_BYTES (else
    _Unusable)."""
    fd = workspace_files.open_fd(root, rel, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise _Unusable("is not a regular file")
        data = f.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise _Unusable(f"is larger than {MAX_FILE_BYTES} bytes")
    return data


def _read_path(root: Path, rel: str, st: os.stat_result) -> _Side:
    """The version of ``rel`` on disk (``st`` is its lstat). Raises _Unusable, OSError."""
    if stat.S_ISLNK(st.st_mode):
        return _Side(_MODE_LINK, _read_link(root, rel))
    if not stat.S_ISREG(st.st_mode):
        raise _Unusable("is a folder" if stat.S_ISDIR(st.st_mode) else "is not a regular file")
    if st.st_size > MAX_FILE_BYTES:
        raise _Unusable(f"is larger than {MAX_FILE_BYTES} bytes")
    return _Side(_git_mode(st), _read_file(root, rel))


def _read_link(root: Path, rel: str) -> bytes:
    """A link's target text, read in its folder opened without following links."""
    parent, _, name = rel.rpartition("/")
    if parent:
        fd = workspace_files.open_fd(root, parent, os.O_RDONLY | os.O_DIRECTORY)
    else:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # the owner's path
    try:
        return os.readlink(os.fsencode(name), dir_fd=fd)
    finally:
        os.close(fd)


def _parent_state(root: Path, rel: str) -> str:
    """ "ok" when every folder between ``root`` and ``rel`` is a real folder, "missing" when one
    does not exist, "blocked" when one is a file or a symlink (git never looks past a symlink)."""
    here = root
    for part in rel.split("/")[:-1]:
        here = here / part
        try:
            if not stat.S_ISDIR(os.lstat(here).st_mode):
                return "blocked"
        except FileNotFoundError:
            return "missing"
    return "ok"


def _scan(root: Path) -> dict[bytes, _Found]:
    """Every versionable file under the tracked paths, keyed by its repository path."""
    found: dict[bytes, _Found] = {}
    for rel in TRACKED:
        if _parent_state(root, rel) == "ok":
            _collect(root, rel, found)
    return found


def _collect(root: Path, rel: str, found: dict[bytes, _Found]) -> None:
    try:
        st = workspace_files.lstat(root, rel)
    except (FileNotFoundError, NotADirectoryError):
        return
    if stat.S_ISDIR(st.st_mode):
        names = [n for n in _entry_names(root, rel) if n != _GIT_DIR]
        for name in names:
            _collect(root, f"{rel}/{name}", found)
        return
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
        return  # FIFOs, sockets, devices: never opened
    try:
        side = _read_path(root, rel, st)
    except FileNotFoundError:
        return  # removed while we looked
    except _Unusable as exc:
        if rel not in _warned:
            _warned.add(rel)
            log.warning("memory history: not versioning %r: it %s", rel, exc)
        return
    found[os.fsencode(rel)] = _Found(side, st)


def is_tracked(path: bytes) -> bool:
    text = os.fsdecode(path)
    parts = text.split("/")
    if not text or any(p in ("", ".", "..", _GIT_DIR) for p in parts):
        return False
    return any(text == t or text.startswith(t + "/") for t in TRACKED)


# -- small helpers -----------------------------------------------------------------------------


class _Full(Exception):
    """A capped diff reached its limit."""


class _Capped(io.BytesIO):
    """A BytesIO that raises _Full once more than ``limit`` bytes were written (None: never)."""

    def __init__(self, limit: int | None) -> None:
        super().__init__()
        self.limit = limit

    def write(self, data: object) -> int:
        written = super().write(data)  # type: ignore[arg-type]
        if self.limit is not None and self.tell() > self.limit:
            raise _Full
        return written

    def writelines(self, lines: object) -> None:
        for line in lines:  # type: ignore[attr-defined]
            self.write(line)


def _identity(author: str) -> bytes:
    if not _IDENT.match(author):
        raise ValueError(f"author must look like 'Name <email>', got {author!r}")
    return author.encode("utf-8")


def _message_bytes(message: str) -> bytes:
    text = message.strip() or "Update memory"
    return (text + "\n").encode("utf-8")


def _local_offset(now: float) -> int:
    offset = datetime.fromtimestamp(now).astimezone().utcoffset()
    return int(offset.total_seconds()) if offset else 0


def _short(commit_id: bytes | str) -> str:
    text = commit_id.decode("ascii") if isinstance(commit_id, bytes) else commit_id
    return text[:SHORT_ID_LEN]


def _info(commit: Commit) -> CommitInfo:
    hex_id = commit.id.decode("ascii")
    return CommitInfo(
        id=hex_id,
        short_id=_short(hex_id),
        time=datetime.fromtimestamp(commit.commit_time, UTC),
        author=commit.author.decode("utf-8", "replace"),
        message=commit.message.decode("utf-8", "replace").rstrip("\n"),
    )


def _entry_names(root: Path, rel: str) -> list[str]:
    """The names in a folder, links included (git records a link as its target text)."""
    fd = workspace_files.open_fd(root, rel, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return sorted(os.listdir(fd))
    finally:
        os.close(fd)


def _atomic_write(root: Path, rel: str, side: _Side) -> None:
    """Replace ``rel`` with ``side`` in one rename: a reader sees the old or the new file.
    No link on the way is followed (the workspace is the model's); a link is written as a
    link, never through one."""
    if side.mode == _MODE_LINK:
        workspace_files.write_link(root, rel, os.fsdecode(side.data), make_parents=True)
    else:
        perm = 0o700 if side.mode == _MODE_EXEC else 0o600
        workspace_files.write_atomic(root, rel, side.data, mode=perm, make_parents=True)


# -- the repository ----------------------------------------------------------------------------


class MemoryRepo:
    """The memory history of one workspace, kept in memobot's state folder.

    Reads (:meth:`log`, :meth:`diff`, :meth:`resolve`) change nothing in the workspace;
    :meth:`commit` creates the repository on first use, and a read does too when an old
    workspace ``.git`` is there to copy (:meth:`migrate`), so ``memobot memory log`` shows the
    old history after an upgrade. Methods block on disk I/O: from asyncio, call them through
    ``asyncio.to_thread`` (or use :func:`commit_async`).
    """

    def __init__(self, workspace: Path, state_dir: Path) -> None:
        self.workspace = Path(workspace).expanduser().resolve()
        self.state_dir = Path(state_dir).expanduser().resolve()
        self.git_dir = self.state_dir / STATE_REPO
        self._repo: Repo | None = None
        self._open_lock = threading.Lock()

    # -- public API ----------------------------------------------------------------------------

    def commit(
        self,
        message: str,
        author: str = DEFAULT_AUTHOR,
        *,
        paths: tuple[str, ...] | None = None,
        prepare: Callable[[], None] | None = None,
    ) -> str | None:
        """Commit the tracked paths as they are on disk (adds, modifications, deletions).

        ``paths``: only these tracked files enter the commit (their version on disk, or their
        deletion); other uncommitted edits stay uncommitted, as after a revert. ``prepare``:
        called under the write lock before anything is read (a write that must not interleave
        with another memobot write of the memory files); what it raises is raised, with
        nothing committed.

        Returns the new commit id (hex), or None when nothing changed since the last commit.
        Raises ValueError for a malformed ``author``, MemoryRepoError when the workspace is
        missing or memobot's repository cannot be read.
        """
        ident = _identity(author)
        if not self.workspace.is_dir():
            raise MemoryRepoError(f"workspace {self.workspace} does not exist")
        with self._locked(create=True) as repo:
            if prepare is not None:
                prepare()
            head = self._head(repo)
            if paths is None:
                entries = {
                    path: (f.side.mode, self._store(repo, f.side))
                    for path, f in _scan(self.workspace).items()
                }
            else:
                entries = self._only(repo, head, paths)
            tree = commit_tree(repo.object_store, [(p, sha, m) for p, (m, sha) in entries.items()])
            if head is None and not entries:
                return None
            if head is not None and self._commit(repo, head).tree == tree:
                return None
            new_id = self._write_commit(repo, tree, head, _message_bytes(message), ident)
            return new_id.decode("ascii")

    def _only(
        self, repo: Repo, head: ObjectID | None, paths: tuple[str, ...]
    ) -> dict[bytes, tuple[int, ObjectID]]:
        """HEAD's entries with ``paths`` as they are on disk now (an absent one: deleted)."""
        entries: dict[bytes, tuple[int, ObjectID]] = {}
        if head is not None:
            tree = self._commit(repo, head).tree
            for entry in iter_tree_contents(repo.object_store, tree):
                entries[entry.path] = (entry.mode, entry.sha)
        for rel in paths:
            path = os.fsencode(rel)
            if not is_tracked(path):
                raise MemoryRepoError(f"{rel!r} is not a memory file")
            try:
                side = self._disk_side(path)
            except _Unusable as exc:
                raise MemoryRepoError(f"{rel} cannot be versioned: it {exc}") from None
            if side is None:
                entries.pop(path, None)
            else:
                entries[path] = (side.mode, self._store(repo, side))
        return entries

    def log(self, limit: int = 50) -> list[CommitInfo]:
        """Up to ``limit`` commits, newest first, following first parents. [] with no repo."""
        repo = self._open(create=False)
        head = self._head(repo) if repo else None
        out: list[CommitInfo] = []
        while repo is not None and head is not None and len(out) < limit:
            commit = repo[head]
            assert isinstance(commit, Commit)
            out.append(_info(commit))
            head = commit.parents[0] if commit.parents else None
        return out

    def info(self, rev: str | None = None) -> CommitInfo:
        """The commit ``rev`` names (default HEAD). Raises MemoryRepoError as :meth:`resolve`."""
        repo = self._require()
        return _info(self._commit(repo, self.resolve(rev or "HEAD")))

    def diff(self, rev: str | None = None, limit: int | None = None) -> str:
        """Unified diff (git headers) of ``rev`` (default HEAD) against its first parent; the
        first commit is diffed against the empty tree. Raises MemoryRepoError as :meth:`resolve`.

        ``limit``: stop once the diff is longer than that many bytes (a page shows the start
        of it; the files after are never read or diffed). The text is then a little longer
        than ``limit``, cut inside a line.
        """
        repo = self._require()
        commit = self._commit(repo, self.resolve(rev or "HEAD"))
        parent_tree = self._commit(repo, commit.parents[0]).tree if commit.parents else None
        out = _Capped(limit)
        try:
            write_tree_diff(out, repo.object_store, parent_tree, commit.tree)
        except _Full:
            pass
        return out.getvalue().decode("utf-8", "replace")

    def revert(self, rev: str, by: str = "", merged: list[str] | None = None) -> str:
        """Undo the changes of commit ``rev`` on disk and record that as a new commit.

        ``by``: who asked, when not the command line ("web": the message says "by web" and
        the author is :data:`WEB_AUTHOR`). ``merged``: when given, the paths whose later
        edits the revert kept (a three-way merge, not the version before ``rev``) are added.

        See the module docstring for the semantics. Returns the new commit id (hex). Raises
        MemoryRepoError for an unknown or ambiguous ``rev``, on conflicts (naming every file;
        nothing is written then) and when the commit's changes are already undone.
        """
        with self._locked(create=False) as repo:
            target = self._commit(repo, self.resolve(rev))
            info = _info(target)
            kept: set[bytes] = set()
            plan = self._plan_revert(repo, target, kept)
            head = self._head(repo)
            assert head is not None
            head_tree = self._commit(repo, head).tree
            entries = {
                path: (mode, sha)
                for path, mode, sha in iter_tree_contents(repo.object_store, head_tree)
            }
            for path, (_, wanted) in plan.items():
                if wanted is None:
                    entries.pop(path, None)
                else:
                    entries[path] = (wanted.mode, self._store(repo, wanted))
            tree = commit_tree(repo.object_store, [(p, s, m) for p, (m, s) in entries.items()])
            if tree == head_tree:
                raise MemoryRepoError(
                    f"nothing to revert: the changes of {info.short_id} are already undone"
                )
            self._apply_plan(plan)
            if merged is not None:
                merged += [os.fsdecode(p) for p in plan if p in kept]
            message = f"Revert {info.short_id}: {info.subject}\n\nThis reverts commit {info.id}.\n"
            author = DEFAULT_AUTHOR
            if by:
                message += f"Reverted by {by}.\n"
                author = WEB_AUTHOR if by == "web" else DEFAULT_AUTHOR
            new_id = self._write_commit(repo, tree, head, message.encode(), author.encode())
            return new_id.decode("ascii")

    def resolve(self, rev: str) -> bytes:
        """The full hex id of ``rev``: a unique prefix (>= MIN_PREFIX_LEN hex digits) of a commit
        id, ``HEAD`` or ``@``, each optionally followed by ``~N`` / ``^`` steps to ancestors.

        Raises MemoryRepoError when there is no commit yet, ``rev`` is malformed or unknown, a
        prefix matches several commits, or the steps go back past the first commit.
        """
        repo = self._require()
        m = _REV.match(rev.strip())
        if not m or (m["base"] not in ("HEAD", "@") and len(m["base"]) < MIN_PREFIX_LEN):
            raise MemoryRepoError(
                f"unknown revision {rev!r}: give a commit id (at least {MIN_PREFIX_LEN} hex "
                "digits, see `memobot memory log`), HEAD or HEAD~N"
            )
        base = m["base"]
        commit_id = self._head(repo) if base in ("HEAD", "@") else self._by_prefix(repo, rev, base)
        assert commit_id is not None
        for _ in range(_count_steps(m["steps"])):
            parents = self._commit(repo, commit_id).parents
            if not parents:
                raise MemoryRepoError(f"{rev!r} goes back past the first memory commit")
            commit_id = parents[0]
        return bytes(commit_id)

    def migrate(self, old_workspace: Path | None = None) -> Migration:
        """Create memobot's repository unless it exists, with the history of the old layout's
        ``<old_workspace>/.git`` (default: this workspace's) when that is a memory history:
        memobot's own from an earlier version, or nanobot's (whose bookkeeping files then leave
        the tree with one commit; they stay on disk). Anything else in it, or anything that
        looks wrong, starts a fresh history instead (one log line says why). Either way the old
        ``.git`` is left as it is and never used again.

        Runs once: later calls return ``Migration("exists")`` without reading anything. Raises
        MemoryRepoError when the state folder cannot be written or the copy cannot start.
        """
        old = Path(old_workspace).expanduser().resolve() if old_workspace else self.workspace
        make_private_dirs(self.state_dir)
        with self._file_lock():
            if self.git_dir.is_dir():
                return Migration("exists")
            staging = self.state_dir / _STAGING
            _init_empty(staging)  # also over a creation a crash cut short
            if not workspace_files.lexists(old, _GIT_DIR):
                result = Migration("none")  # the common case, a new workspace: nothing to copy
            else:
                result = self._copy_old_history(old, staging)
                if result.state != "copied":
                    _init_empty(staging)  # whatever a copy that failed half way left there
            durable.move(staging, self.git_dir)
        return result

    def _copy_old_history(self, old: Path, staging: Path) -> Migration:
        from bot.memory.legacy import copy_history

        try:
            result = copy_history(old, staging)
        except OSError as exc:
            raise MemoryRepoError(f"cannot copy the memory history of {old}/.git: {exc}") from exc
        where, dot_git = self.git_dir, old / _GIT_DIR
        if result.state == "copied":
            if result.drop:
                repo = Repo(str(staging), bare=True)
                try:
                    self._drop_bookkeeping(repo, result.drop)
                finally:
                    repo.close()
            # A warning: the one time the owner hears that the old folder can go.
            log.warning(
                "memory history: copied %d commit(s) of %s into %s; memobot no longer uses %s "
                "(it may be removed)", result.commits, dot_git, where, dot_git,
            )  # fmt: skip
        elif result.state == "foreign":
            log.warning(
                "memory history: %s is not a memory history (%s): left alone, not copied; "
                "memobot keeps its own in %s", dot_git, result.detail, where,
            )  # fmt: skip
        elif result.state == "refused":
            log.warning(
                "memory history: not copying %s: %s; memobot starts a fresh history in %s and "
                "no longer uses that folder", dot_git, result.detail, where,
            )  # fmt: skip
        return result

    def _drop_bookkeeping(self, repo: Repo, drop: tuple[str, ...]) -> None:
        """One commit that stops versioning nanobot's bookkeeping files (they stay on disk)."""
        head = self._head(repo)
        assert head is not None
        gone = {os.fsencode(p) for p in drop}
        keep = [
            (entry.path, entry.sha, entry.mode)
            for entry in iter_tree_contents(repo.object_store, self._commit(repo, head).tree)
            if entry.path not in gone
        ]
        tree = commit_tree(repo.object_store, keep)
        dropped = "\n".join(f"- {p}" for p in drop)
        message = (
            "memobot: adopt this memory repository\n\nIts history is kept. memobot versions "
            f"{', '.join(TRACKED)}; these stay on disk but are no longer versioned:\n"
            f"{dropped}\n"
        )
        self._write_commit(repo, tree, head, message.encode(), DEFAULT_AUTHOR.encode())

    def check(self) -> None:
        """Raise MemoryRepoError (one line naming the reason) when memobot's repository exists
        but cannot be read. Reads only; call it before changing files that will be committed."""
        if self.git_dir.exists() or self.git_dir.is_symlink():
            self._open(create=False)

    # -- opening and locking -------------------------------------------------------------------

    def _open(self, create: bool) -> Repo | None:
        with self._open_lock:
            if self._repo is not None and self.git_dir.is_dir():
                return self._repo
            self._repo = None  # never opened, or removed by hand: start over
            if not self.git_dir.is_dir():
                if not (create or workspace_files.lexists(self.workspace, _GIT_DIR)):
                    return None
                self.migrate()
            broken = MemoryRepoError(
                f"{self.git_dir} is not a git repository; move it away and memobot starts a new "
                "memory history"
            )
            if not ((self.git_dir / "objects").is_dir() and (self.git_dir / "HEAD").is_file()):
                raise broken
            try:
                self._repo = Repo(str(self.git_dir), bare=True)
            except NotGitRepository:
                raise broken from None
            return self._repo

    def _require(self) -> Repo:
        repo = self._open(create=False)
        if repo is None or self._head(repo) is None:
            raise MemoryRepoError("no memory commits yet")
        return repo

    @contextmanager
    def _file_lock(self) -> Iterator[None]:
        """An exclusive flock shared by threads and processes (one descriptor per holder)."""
        with durable.exclusive(self.state_dir / _LOCK_FILE):
            yield

    @contextmanager
    def _locked(self, create: bool) -> Iterator[Repo]:
        """The repository under the write lock."""
        repo = self._open(create=create) if create else self._require()
        assert repo is not None
        with self._file_lock():
            yield repo

    # -- objects and refs --------------------------------------------------------------------------

    @staticmethod
    def _head(repo: Repo) -> ObjectID | None:
        return repo.refs.follow(b"HEAD")[1]

    @staticmethod
    def _commit(repo: Repo, commit_id: bytes) -> Commit:
        obj = repo[commit_id]
        if not isinstance(obj, Commit):
            raise MemoryRepoError(f"{_short(commit_id)} is not a commit")
        return obj

    @staticmethod
    def _store(repo: Repo, side: _Side) -> ObjectID:
        blob = Blob.from_string(side.data)
        if blob.id not in repo.object_store:
            repo.object_store.add_object(blob)
        return blob.id

    def _by_prefix(self, repo: Repo, rev: str, prefix: str) -> ObjectID:
        prefix_bytes = prefix.lower().encode("ascii")
        matches = sorted(
            {
                sha
                for sha in repo.object_store.iter_prefix(prefix_bytes)
                if isinstance(repo[sha], Commit)
            }
        )
        if not matches:
            raise MemoryRepoError(f"unknown revision {rev!r}: no memory commit starts with it")
        if len(matches) > 1:
            shown = ", ".join(_short(m) for m in matches[:5])
            raise MemoryRepoError(
                f"ambiguous revision {rev!r}: it matches {len(matches)} commits ({shown}); "
                "give more digits"
            )
        return matches[0]

    def _write_commit(
        self, repo: Repo, tree: ObjectID, head: ObjectID | None, message: bytes, author: bytes
    ) -> ObjectID:
        now = time.time()
        offset = _local_offset(now)
        commit = Commit()
        commit.tree = tree
        commit.parents = [head] if head else []
        commit.author = author
        commit.committer = DEFAULT_AUTHOR.encode()
        commit.author_time = commit.commit_time = int(now)
        commit.author_timezone = commit.commit_timezone = offset
        commit.encoding = b"UTF-8"
        commit.message = message
        repo.object_store.add_object(commit)
        reflog = b"commit: " + message.split(b"\n", 1)[0]
        kwargs = {"committer": author, "timestamp": int(now), "timezone": offset, "message": reflog}
        branch = repo.refs.follow(b"HEAD")[0][-1]
        if head is None:
            moved = repo.refs.add_if_new(branch, commit.id, **kwargs)
        else:
            moved = repo.refs.set_if_equals(branch, head, commit.id, **kwargs)
        if not moved:
            # Only something outside memobot (a person's git) can move the branch under our lock.
            raise MemoryRepoError(f"{branch.decode()} moved during the commit; try again")
        return commit.id

    # -- revert --------------------------------------------------------------------------------

    def _plan_revert(self, repo: Repo, target: Commit, kept: set[bytes]) -> dict[bytes, _Plan]:
        """For each path ``target`` changed: its version on disk now and what it must become
        (None = absent); ``kept`` gets the paths whose later edits a merge keeps. Reads only.
        Raises MemoryRepoError naming every conflicting path."""
        parent_tree = self._commit(repo, target.parents[0]).tree if target.parents else None
        changes = repo.object_store.tree_changes(parent_tree, target.tree)
        paths = sorted({new or old for (old, new), _, _ in changes if (new or old)})
        plan: dict[bytes, _Plan] = {}
        conflicts: list[str] = []
        for path in paths:
            if not is_tracked(path):
                raise MemoryRepoError(f"commit touches {path!r}, which is not a memory file")
            before = self._tree_side(repo, parent_tree, path)
            after = self._tree_side(repo, target.tree, path)
            try:
                now = self._disk_side(path)
                plan[path] = (now, _revert_one(after, now, before))
                if now not in (after, before):
                    kept.add(path)
            except _Unusable as exc:
                conflicts.append(f"{os.fsdecode(path)} ({exc})")
        if conflicts:
            raise MemoryRepoError(
                f"cannot revert {_short(target.id)}: later edits clash with it in "
                + ", ".join(conflicts)
                + "; nothing was changed, edit the file by hand instead"
            )
        return plan

    @staticmethod
    def _tree_side(repo: Repo, tree: ObjectID | None, path: bytes) -> _Side | None:
        if tree is None:
            return None
        try:
            mode, sha = tree_lookup_path(repo.__getitem__, tree, path)
        except KeyError:
            return None
        try:
            blob = repo[sha]
        except KeyError:  # a submodule entry (a copied history may hold one): no object
            raise MemoryRepoError(
                f"{os.fsdecode(path)!r} in that commit is not a file memobot can restore "
                f"(mode {mode:o})"
            ) from None
        return _Side(mode, blob.as_raw_string()) if isinstance(blob, Blob) else None

    def _disk_side(self, path: bytes) -> _Side | None:
        """The version of tracked ``path`` on disk now (None = absent). Raises _Unusable."""
        rel = os.fsdecode(path)
        parents = _parent_state(self.workspace, rel)
        if parents == "blocked":
            raise _Unusable("a file or symlink stands where its folder should be")
        try:
            if parents == "missing":
                return None
            return _read_path(self.workspace, rel, workspace_files.lstat(self.workspace, rel))
        except (FileNotFoundError, NotADirectoryError):
            return None

    def _apply_plan(self, plan: dict[bytes, _Plan]) -> None:
        """Bring the disk to the planned versions, each file replaced atomically (its folder
        synced); a deleted file's emptied folders go too. Every path is opened through
        workspace_files: nothing on the way is followed."""
        for path, (now, wanted) in plan.items():
            rel = os.fsdecode(path)
            if now == wanted:
                continue
            if wanted is None:
                workspace_files.unlink(self.workspace, rel, missing_ok=False)
                self._sync_folder(self._prune_empty_dirs(rel.rpartition("/")[0]))
            else:
                _atomic_write(self.workspace, rel, wanted)

    def _prune_empty_dirs(self, folder: str) -> str:
        """Remove folders a revert emptied below a top tracked folder (skills/<name>/...);
        returns the nearest folder that remains (workspace-relative, "" for the workspace)."""
        while "/" in folder:
            parent, _, name = folder.rpartition("/")
            fd = workspace_files.open_fd(self.workspace, parent, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.rmdir(name, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                    break
                raise
            finally:
                os.close(fd)
            folder = parent
        return folder

    def _sync_folder(self, rel: str) -> None:
        if not rel:
            durable.fsync_dir(self.workspace)
            return
        fd = workspace_files.open_fd(self.workspace, rel, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _init_empty(path: Path) -> None:
    """A new, empty bare repository at ``path`` (0700), replacing whatever was there."""
    shutil.rmtree(path, ignore_errors=True)
    Repo.init_bare(str(path), mkdir=True, default_branch=BRANCH).close()
    os.chmod(path, _PRIVATE_DIR)


def _revert_one(after: _Side | None, now: _Side | None, before: _Side | None) -> _Side | None:
    """What a path becomes when a commit that turned ``before`` into ``after`` is undone and the
    file is ``now`` on disk. None means absent. Raises _Unusable on a conflict."""
    if now == after:
        return before
    if now == before:
        return before
    if after is None or now is None or before is None:
        raise _Unusable("added or deleted on one side, changed on the other")
    sides = (after, now, before)
    if any(s.mode == _MODE_LINK for s in sides) or any(_is_binary(s.data) for s in sides):
        raise _Unusable("changed since, and it is binary or a symlink")
    merged = merge3(after.data, now.data, before.data)
    if merged is None:
        raise _Unusable("the same lines were edited again later")
    mode = before.mode if now.mode == after.mode else now.mode
    return _Side(mode, merged)


def _count_steps(steps: str) -> int:
    total = 0
    for part in re.findall(r"~[0-9]*|\^", steps):
        total += int(part[1:] or 1) if part.startswith("~") else 1
    return total


# -- asyncio entry point -------------------------------------------------------------------------

_repos: dict[Path, MemoryRepo] = {}
_repos_lock = threading.Lock()
_async_locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[Path, asyncio.Lock]] = (
    weakref.WeakKeyDictionary()
)


def _shared_repo(workspace: Path, state_dir: Path) -> MemoryRepo:
    candidate = MemoryRepo(workspace, state_dir)
    with _repos_lock:
        repo = _repos.get(candidate.git_dir)
        if repo is None or repo.workspace != candidate.workspace:
            repo = _repos[candidate.git_dir] = candidate
        return repo


async def commit_async(workspace: Path, state_dir: Path, message: str) -> str | None:
    """:meth:`MemoryRepo.commit` in a worker thread. Calls for one repository run one at a time
    (in call order), so waiting commits do not occupy threads; same result and errors."""
    repo = _shared_repo(workspace, state_dir)
    locks = _async_locks.setdefault(asyncio.get_running_loop(), {})
    lock = locks.setdefault(repo.git_dir, asyncio.Lock())
    async with lock:
        return await asyncio.to_thread(repo.commit, message)


# -- CLI: memobot memory log / diff / revert ----------------------------------------------------


def _local_time(info: CommitInfo) -> datetime:
    return info.time.astimezone()


def _of(cfg: Config) -> MemoryRepo:
    return MemoryRepo(cfg.agent.workspace_path, cfg.agent.state_path)


def _fail(exc: Exception) -> int:
    if file_problem(exc):
        raise exc  # another user's folder, a full disk...: the command line's line, exit 78
    print(f"memobot: {exc}", file=sys.stderr)
    return 1


def cmd_log(cfg: Config, args: argparse.Namespace) -> int:
    """``memobot memory log``: one line per commit, newest first."""
    try:
        commits = _of(cfg).log(limit=getattr(args, "limit", None) or 50)
    except (MemoryRepoError, OSError) as exc:
        return _fail(exc)
    if not commits:
        print("No memory commits yet.")
        return 0
    for c in commits:
        print(f"{c.short_id}  {_local_time(c):%Y-%m-%d %H:%M}  {_shown(c.subject)}")
        for line in sourced_changes(c):
            print(f"    {_shown(line)}")
    return 0


def sourced_changes(info: CommitInfo) -> list[str]:
    """A Dream commit's changes, one line each with the history entries it comes from
    (``- USER.md: Lives in Lyon (history #5, #7)``, as ``bot.memory.dream.commit_message``
    writes them) and who allowed it under ``memory.dreamReview``; [] for any other commit."""
    if not info.subject.startswith("dream: "):
        return []
    lines = info.message.split("\n")[1:]
    return [line for line in lines if line.startswith(("- ", "Reviewed: "))]


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def shown_text(text: str) -> str:
    """History text as it may go to a terminal: the model wrote it (commit messages of a
    copied history, Dream's entries, memory files), so control characters (escape sequences
    that set the clipboard or the title, clear the screen) are shown as '?'."""
    return _CONTROL.sub("?", text)


_shown = shown_text


def cmd_diff(cfg: Config, args: argparse.Namespace) -> int:
    """``memobot memory diff [REV]``: the commit's header and what it changed."""
    repo = _of(cfg)
    try:
        info = repo.info(args.rev)
        diff = repo.diff(info.id)
    except (MemoryRepoError, OSError) as exc:
        return _fail(exc)
    message = "\n".join(f"    {line}".rstrip() for line in info.message.split("\n"))
    when = _local_time(info)
    author = _shown(info.author)
    print(f"commit {info.id}\nAuthor: {author}\nDate:   {when:%Y-%m-%d %H:%M:%S %z}\n")
    print(_shown(message) + "\n")
    sys.stdout.write(_shown(diff))
    return 0


def revert_commit(repo: MemoryRepo, rev: str, by: str = "") -> str:
    """Undo commit ``rev`` (:meth:`MemoryRepo.revert`); returns the line that says so, the
    same for ``memobot memory revert`` and the panel. Raises MemoryRepoError, OSError."""
    from bot.provenance import Provenance, Writer

    info = repo.info(rev)
    provenance = Provenance(repo.state_dir, repo.workspace)
    guests = provenance.untrusted_now()
    merged: list[str] = []
    new_id = repo.revert(info.id, by=by, merged=merged)
    for rel in [r for r in merged if r in guests]:
        # The merge kept a non-admin's later edit of a skill: still theirs, not made the
        # owner's by being written again (a clean undo to the older version is).
        try:
            provenance.carry(rel, Writer(guests[rel], False))
        except OSError as exc:  # the revert is done: say so, and this in the log
            log.error("provenance: %r not kept as %s's after a revert: %s", rel, guests[rel], exc)
    return f"Reverted {info.short_id}: {_shown(info.subject)} as {_short(new_id)}"


def cmd_revert(cfg: Config, args: argparse.Namespace) -> int:
    """``memobot memory revert REV``: undo one commit's changes with a new commit."""
    try:
        print(revert_commit(_of(cfg), args.rev))
    except (MemoryRepoError, OSError) as exc:
        return _fail(exc)
    return 0


__all__ = [
    "TRACKED",
    "WEB_AUTHOR",
    "CommitInfo",
    "MemoryRepo",
    "MemoryRepoError",
    "Migration",
    "commit_async",
    "merge3",
    "revert_commit",
]
