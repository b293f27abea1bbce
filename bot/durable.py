"""The one way memobot replaces a file: a temporary file beside it, fsync, rename over the
target, fsync of the folder (DESIGN.md section 4). A crash or a power cut leaves the old file
or the new one, never half of one, and once a write returned, the rename survives too.

Every rename in ``bot/`` and ``channels/`` goes through here (ruff bans ``os.replace`` and
``os.rename`` elsewhere, and ``tests/test_durable.py`` walks the sources). Two ways in:

* :func:`writer_in` and :func:`rename_in` work inside a folder the caller opened. The workspace
  is the model's, so :mod:`bot.workspace_files` opens its folders without following a link and
  hands the descriptor here; the temporary file then gets a random name, ``O_EXCL`` and
  ``O_NOFOLLOW``, so a link planted in the folder is replaced, never written through.
* :func:`writer`, :func:`replace_file` and :func:`move` take paths memobot itself chose (the
  state folder, the config file): the folder is opened as the owner configured it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from bot.file_errors import about

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def fsync_dir(path: Path) -> None:
    """Make the entries of the folder ``path`` durable (a rename, a new or removed file). For
    a folder memobot chose; a workspace folder is fsynced by :mod:`bot.workspace_files`."""
    fd = os.open(path, _DIR_FLAGS)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def stamp(path: Path) -> tuple[int, int, int] | None:
    """What changes whenever ``path`` is replaced or written (inode, mtime, size); None when
    it is absent. Cheap enough to ask on every read of a file another process may replace."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def read_regular(path: Path) -> bytes:
    """The bytes of a state file (a month's usage ledger, budget.json, tasks.json): the one
    reader of files another process or a hand may have put in the state folder. OSError when
    ``path`` is a link (never followed), a FIFO (whose open would wait for a writer: the
    gateway's start, which reads these, would hang) or anything but a regular file;
    FileNotFoundError when it is absent."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    with os.fdopen(fd, "rb") as fh:
        return fh.read()


@contextlib.contextmanager
def writer_in(
    dir_fd: int,
    name: str,
    *,
    mode: int = 0o600,
    chmod: int | None = None,
    sync: bool = True,
    tmp: str | None = None,
) -> Iterator[BinaryIO]:
    """A binary file for the new contents of ``name`` in the open folder ``dir_fd``. On a clean
    exit it is fsynced and renamed over ``name`` and the folder is fsynced; on an exception it
    is removed and ``name`` is left as it was.

    ``mode``: the new file's mode (through the umask); ``chmod``: a mode set exactly before the
    rename. ``sync`` False skips both fsyncs (state an older version of which is harmless).
    ``tmp``: a fixed temporary name, for a folder only memobot writes (a crash's leftover is
    replaced, not piled up); None: a random one. Either is created exclusively, never through
    a link.
    """
    if tmp is None:
        tmp = f".{name[:64]}.{secrets.token_hex(6)}.tmp"
    else:
        # A crash's leftover goes first: reopened, it would keep its old mode.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=dir_fd)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, mode, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            if chmod is not None:
                os.fchmod(fh.fileno(), chmod)
            if sync:
                os.fsync(fh.fileno())
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
    if sync:
        os.fsync(dir_fd)


def rename_in(src_dir_fd: int, src: str, dst_dir_fd: int, dst: str, *, sync: bool = True) -> None:
    """Rename ``src`` (in the open folder ``src_dir_fd``) to ``dst`` (in ``dst_dir_fd``),
    replacing ``dst`` itself (a link there is replaced, not followed); with ``sync``, both
    folders are fsynced after."""
    os.replace(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)
    if sync:
        os.fsync(dst_dir_fd)
        if src_dir_fd != dst_dir_fd:
            os.fsync(src_dir_fd)


@contextlib.contextmanager
def writer(
    path: Path,
    *,
    mode: int = 0o600,
    chmod: int | None = None,
    sync: bool = True,
    unique: bool = False,
) -> Iterator[BinaryIO]:
    """:func:`writer_in` for a path memobot chose. The temporary file is ``.<name>.tmp``
    beside it; ``unique``: a random name instead (several writers may race for one file)."""
    # A full or read-only disk names no file, or only the temporary one: name the target.
    with about(path, "write"):
        dir_fd = os.open(path.parent, _DIR_FLAGS)
        try:
            tmp = None if unique else f".{path.name}.tmp"
            with writer_in(dir_fd, path.name, mode=mode, chmod=chmod, sync=sync, tmp=tmp) as fh:
                yield fh
        finally:
            os.close(dir_fd)


def replace_file(
    path: Path,
    data: bytes | str,
    *,
    mode: int = 0o600,
    chmod: int | None = None,
    sync: bool = True,
    unique: bool = False,
) -> None:
    """Replace ``path`` with ``data`` (text is written as UTF-8); see :func:`writer`."""
    payload = data.encode("utf-8") if isinstance(data, str) else data
    with writer(path, mode=mode, chmod=chmod, sync=sync, unique=unique) as fh:
        fh.write(payload)


def move(src: Path, dst: Path, *, sync: bool = True) -> None:
    """Rename ``src`` to ``dst`` (a file or a folder), replacing a file at ``dst``; with
    ``sync``, the folders of both are fsynced after."""
    os.replace(src, dst)
    if sync:
        fsync_dir(dst.parent)
        if src.parent != dst.parent:
            fsync_dir(src.parent)


@contextlib.contextmanager
def exclusive(lock: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``lock`` (created 0600; its folder 0700 when missing):
    a read-change-write of a state file by the gateway and a command at once, one at a time.
    One descriptor per holder, so threads exclude each other too; closing it releases."""
    lock.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


class Appender:
    """Appends whole lines to one JSON Lines file, each append one ``O_APPEND`` write under an
    ``flock`` of the file (another memobot process may append too), fsynced at once or, with
    ``sync=False``, by a later :meth:`sync` (one fsync for many appends). Once an append
    returned its bytes are in the kernel: a SIGKILL cannot lose them, only a power cut before
    their fsync. The file stays open between appends.

    A torn last line (a crash mid-write left bytes after the last newline) is cut off before
    the next append, so it can never fuse with the new first line; so is whatever part of an
    append of this object's own landed before it failed (a full disk), so a retried append is
    not in the file twice. Creates the file 0600 (its folder 0700) and fsyncs the folder when
    it is new. Not thread-safe: one caller at a time (the ledger has one writer task).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self._end: int | None = None  # where this object's last append ended
        self._cut_at: int | None = None  # where an append that failed began
        self._new = False  # created by this object, its folder not yet fsynced

    @property
    def warm(self) -> bool:
        """Open, with its last append whole: the next append costs a few system calls and no
        wait on the disk (an ``fsync`` of a folder, a cut of a torn line)."""
        return self._fd is not None and self._end is not None and self._cut_at is None

    def append(self, payload: bytes, sync: bool = True, wait: bool = True) -> tuple[int, int]:
        """Append ``payload`` (lines, each ending in a newline), fsynced unless ``sync`` is
        false; returns (offset, end). ``wait=False``: raise BlockingIOError, having written
        nothing, when another holds the lock (an event loop must not wait on another process)."""
        with about(self.path, "write"):
            fd = self._open()
            fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
            try:
                size = os.fstat(fd).st_size
                if self._cut_at is not None and self._cut_at < size:
                    size = self._cut_at  # what landed of a failed append goes before its retry
                    os.ftruncate(fd, size)
                elif size != self._end and size and os.pread(fd, 1, size - 1) != b"\n":
                    size = _last_line_end(fd, size)
                    os.ftruncate(fd, size)
                self._cut_at = size  # until this append is whole and synced
                view = memoryview(payload)
                while view:
                    view = view[os.write(fd, view) :]
                if sync:
                    os.fsync(fd)
                self._cut_at = None
                self._end = size + len(payload)
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
            return size, self._end

    def _open(self) -> int:
        if self._fd is None:
            if not self.path.exists():
                self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                self._new = True
            # Never through a link, nor into a FIFO or a device (a write could block, or land
            # elsewhere): a regular file, or an error.
            flags = os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW
            fd = os.open(self.path, flags | os.O_NONBLOCK, 0o600)
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                raise OSError(errno.EINVAL, "not a regular file", str(self.path))
            os.set_blocking(fd, True)
            self._fd = fd
        if self._new:  # until the folder's fsync succeeded once
            fsync_dir(self.path.parent)
            self._new = False
        return self._fd

    def sync(self) -> None:
        """fsync what was appended so far. May run in a worker thread while the event loop
        appends (the kernel orders the two); never beside :meth:`close`."""
        if self._fd is not None:
            with about(self.path, "write"):
                os.fsync(self._fd)

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)


def _last_line_end(fd: int, size: int) -> int:
    """The offset just after the last newline of the open file (0 when it has none)."""
    end = size
    while end > 0:
        start = max(0, end - 65536)
        found = os.pread(fd, end - start, start).rfind(b"\n")
        if found >= 0:
            return start + found + 1
        end = start
    return 0
