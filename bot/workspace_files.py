"""The one way memobot's own process touches files in the workspace (DESIGN.md section 12).

The model can write anything in its workspace, symlinks included, so every path there is
hostile input. memobot itself is not confined by the kernel: a prompt file that is a link to
``../config.json`` or ``/proc/self/environ`` would put the keys in the next request, and a
temporary file that is a link to ``~/.ssh/authorized_keys`` would be written through. So every
read, write, listing and rename memobot does under the workspace goes through this module:

* a path is opened one component at a time beneath the workspace (``openat2`` with
  ``RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`` where the kernel has it, an ``O_NOFOLLOW`` walk
  otherwise): a symlink at any component, ``..`` or an absolute path never leads anywhere;
* a link met on the way counts as absent: :class:`LinkRefused` is a ``FileNotFoundError``, so
  callers that treat a missing file as empty keep working, and one warning names the path;
* temporary files get a random name and ``O_EXCL``, and are renamed over the target within the
  same open folder: a link planted at the destination is replaced, never written through.

The workspace folder itself comes from the owner's config and may be a link; it is resolved
once, like any trusted path. The model's own file tools do not use this module: they act
through the gate's policy and its confined threads, where links inside the workspace are fine.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import functools
import logging
import os
import secrets
import stat
from collections.abc import AsyncIterable, Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO, TypeVar

from bot import durable
from bot.file_errors import about

log = logging.getLogger(__name__)
T = TypeVar("T")

_SYS_OPENAT2 = 437  # the same number on every architecture (unified syscall table)
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_NO_SYMLINKS = 0x04
_RESOLVE_BENEATH = 0x08
_RESOLVE = _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_FILE_MODE = 0o600
_DIR_MODE = 0o700
MAX_READ_BYTES = 64 * 1024 * 1024  # the largest file memobot reads whole (history.jsonl)


class LinkRefused(FileNotFoundError):
    """A path in the workspace leads through a symlink, out of the workspace, or to a FIFO,
    socket or device: memobot treats it as absent. ``filename`` names the path."""


class _OpenHow(ctypes.Structure):
    _fields_ = (
        ("flags", ctypes.c_uint64),
        ("mode", ctypes.c_uint64),
        ("resolve", ctypes.c_uint64),
    )


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


@functools.cache
def _have_openat2() -> bool:
    """Whether the kernel has openat2 (Linux 5.6+) and lets us call it (seccomp may not)."""
    root = os.open("/", _DIR_FLAGS)
    try:
        os.close(_openat2(root, ".", _DIR_FLAGS, 0))
    except OSError:
        return False  # ENOSYS before Linux 5.6; EPERM or ENOSYS under some seccomp filters
    finally:
        os.close(root)
    return True


def _openat2(dir_fd: int, rel: str, flags: int, mode: int) -> int:
    """openat2 beneath ``dir_fd``; raises OSError as os.open does."""
    how = _OpenHow(flags | os.O_CLOEXEC, mode if flags & os.O_CREAT else 0, _RESOLVE)
    fd = _libc.syscall(
        _SYS_OPENAT2, dir_fd, os.fsencode(rel), ctypes.byref(how), ctypes.sizeof(how)
    )
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), rel)
    return int(fd)


def _parts(root: Path, path: Path | str) -> tuple[str, ...]:
    """The components of ``path`` below ``root`` (``path`` relative, or absolute under it).

    Raises LinkRefused for ``..`` or a path outside the workspace: lexically, before any I/O.
    """
    pure = PurePosixPath(path)
    if pure.is_absolute():
        try:
            pure = pure.relative_to(PurePosixPath(root))
        except ValueError:
            raise LinkRefused(errno.ENOENT, "outside the workspace", str(path)) from None
    parts = tuple(p for p in pure.parts if p not in ("", "."))
    if not parts or ".." in parts:
        raise LinkRefused(errno.ENOENT, "not a file inside the workspace", str(path))
    return parts


_reported: set[str] = set()


def _refuse(
    root: Path,
    parts: tuple[str, ...],
    exc: OSError | None = None,
    kind: str = "leads through a symlink",
) -> LinkRefused:
    """The error for a link (or a FIFO, device, socket) met on the way, logged once per path
    (not on every turn)."""
    rel = "/".join(parts)
    if rel not in _reported:
        _reported.add(rel)
        log.warning(
            "workspace: %r %s; memobot ignores it (it never follows links or opens special "
            "files in the workspace %s)",
            rel,
            kind,
            root,
        )
    refused = LinkRefused(errno.ENOENT, f"{kind}; treated as absent", rel)
    if exc is not None:
        refused.__cause__ = exc
    return refused


@functools.lru_cache(maxsize=64)
def _real_root(root: str) -> str:
    # The owner's path from the config, resolved once: a prompt build opens it a dozen times.
    return os.path.realpath(root)


@contextlib.contextmanager
def _root_fd(root: Path) -> Iterator[int]:
    fd = os.open(_real_root(str(root)), _DIR_FLAGS)
    try:
        yield fd
    finally:
        os.close(fd)


def _walk_dirs(root_fd: int, dirs: tuple[str, ...], *, create: bool) -> int:
    """Open the folders ``dirs`` beneath ``root_fd`` one by one, never following a link;
    with ``create``, make the missing ones (0700). Returns a new fd for the last one."""
    fd = os.dup(root_fd)
    try:
        for name in dirs:
            try:
                nxt = os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, _DIR_MODE, dir_fd=fd)
                nxt = os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def _is_link_error(exc: OSError) -> bool:
    # ELOOP: a link where O_NOFOLLOW or RESOLVE_NO_SYMLINKS met it; EXDEV: RESOLVE_BENEATH;
    # ENOTDIR: a link (or a file) where a folder was expected, told apart by the caller.
    return exc.errno in (errno.ELOOP, errno.EXDEV)


def _has_link(root_fd: int, parts: tuple[str, ...]) -> bool:
    """Whether a component of ``parts`` is a symlink (to tell ENOTDIR causes apart)."""
    fd = os.dup(root_fd)
    try:
        for name in parts:
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError:
                return False
            if stat.S_ISLNK(st.st_mode):
                return True
            if not stat.S_ISDIR(st.st_mode):
                return False
            nxt = os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nxt
        return False
    finally:
        os.close(fd)


def open_fd(root: Path, path: Path | str, flags: int = os.O_RDONLY, mode: int = _FILE_MODE) -> int:
    """Open ``path`` (relative to the workspace ``root``, or absolute under it) without
    following a link at any component and without leaving ``root``; return the fd.

    Raises LinkRefused (a FileNotFoundError) when a link or ``..`` is met, and the usual
    OSError otherwise (FileNotFoundError, IsADirectoryError, PermissionError, ...).
    """
    parts = _parts(root, path)
    with about(_shown(root, parts), _action(flags)):  # names the path for the command line
        return _open_regular(root, parts, path, flags, mode)


def _action(flags: int) -> str:
    if flags & os.O_DIRECTORY:
        return "open"
    return "write" if flags & (os.O_WRONLY | os.O_RDWR) else "read"


def _shown(root: Path, parts: tuple[str, ...]) -> Path:
    """The absolute path of ``parts``, for an error message (never opened by this name)."""
    return Path(root, *parts)


def _open_regular(
    root: Path, parts: tuple[str, ...], path: Path | str, flags: int, mode: int
) -> int:
    fd = _open_beneath(root, parts, flags | os.O_NONBLOCK, mode)
    if flags & os.O_DIRECTORY:
        return fd
    # O_NONBLOCK above: a FIFO the model made opens at once instead of hanging memobot's
    # thread; anything but a regular file is refused here.
    kind = os.fstat(fd).st_mode
    if not stat.S_ISREG(kind):
        os.close(fd)
        if stat.S_ISDIR(kind):
            raise IsADirectoryError(errno.EISDIR, "is a folder", str(path))
        raise _refuse(root, parts, kind="is not a regular file (a FIFO, socket or device)")
    return fd


def _open_beneath(root: Path, parts: tuple[str, ...], flags: int, mode: int) -> int:
    with _root_fd(root) as rfd:
        try:
            if _have_openat2():
                return _openat2(rfd, "/".join(parts), flags, mode)
            dfd = _walk_dirs(rfd, parts[:-1], create=False)
            try:
                return os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dfd)
            finally:
                os.close(dfd)
        except OSError as exc:
            if _is_link_error(exc) or (exc.errno == errno.ENOTDIR and _has_link(rfd, parts)):
                raise _refuse(root, parts, exc) from None
            raise


def read_bytes(root: Path, path: Path | str, limit: int = MAX_READ_BYTES) -> bytes:
    """The contents of a regular file, at most ``limit`` bytes (a sparse 50 GB file the model
    made must not fill memobot's memory). A folder raises IsADirectoryError, a FIFO or device
    OSError, rather than blocking or reading forever."""
    fd = open_fd(root, path, os.O_RDONLY)
    with os.fdopen(fd, "rb") as fh:
        return fh.read(limit)


def read_text(root: Path, path: Path | str, *, errors: str = "strict") -> str:
    return read_bytes(root, path).decode("utf-8", errors=errors)


def read_text_or_empty(root: Path, path: Path | str) -> str:
    """The text of a file, or "" when it is absent, a link or not a regular file."""
    try:
        return read_text(root, path, errors="replace")
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return ""


def lstat(root: Path, path: Path | str) -> os.stat_result:
    """The file's own status (a link at the last component is reported as a link, never
    followed); raises LinkRefused when a folder on the way is a link."""
    parts = _parts(root, path)
    if len(parts) == 1:  # the prompt files, every turn: no folder to walk
        with _root_fd(root) as rfd:
            return os.stat(parts[0], dir_fd=rfd, follow_symlinks=False)
    with _parent(root, parts, create=False) as dfd:
        return os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False)


def file_stat(root: Path, path: Path | str) -> os.stat_result | None:
    """The status of a regular file at ``path``; None when absent, a link or anything else."""
    try:
        st = lstat(root, path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    if stat.S_ISLNK(st.st_mode):
        _refuse(root, _parts(root, path))
        return None
    return st if stat.S_ISREG(st.st_mode) else None


def is_file(root: Path, path: Path | str) -> bool:
    return file_stat(root, path) is not None


def is_dir(root: Path, path: Path | str) -> bool:
    try:
        return stat.S_ISDIR(lstat(root, path).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return False


def exists(root: Path, path: Path | str) -> bool:
    """Whether anything that is not a link is at ``path``."""
    try:
        return not stat.S_ISLNK(lstat(root, path).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return False


def lexists(root: Path, path: Path | str) -> bool:
    """Whether anything, a link included, is at ``path`` (to pick a free name)."""
    try:
        lstat(root, path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    return True


def list_dir(root: Path, path: Path | str = "") -> list[tuple[str, os.stat_result]]:
    """(name, lstat) of every entry of a folder, sorted by name; links are left out (one
    warning each). An absent folder (or one reached through a link) lists as empty."""
    parts = _parts(root, path) if str(path) not in ("", ".") else ()
    with _root_fd(root) as rfd:
        try:
            dfd = _walk_dirs(rfd, parts, create=False)
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as exc:
            if _is_link_error(exc):
                _refuse(root, parts, exc)
                return []
            raise
        try:
            out = []
            for name in sorted(os.listdir(dfd)):
                try:
                    st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                except FileNotFoundError:
                    continue  # removed meanwhile
                if stat.S_ISLNK(st.st_mode):
                    _refuse(root, (*parts, name))
                    continue
                out.append((name, st))
            return out
        finally:
            os.close(dfd)


def files_matching(root: Path, folder: str, name: str) -> list[tuple[str, os.stat_result]]:
    """(``<folder>/<sub>/<name>``, its status) for every real sub-folder holding a regular
    file ``name`` (e.g. skills/*/SKILL.md), workspace-relative, sorted; hidden sub-folders
    skipped; nothing through a link."""
    out = []
    for sub, st in list_dir(root, folder):
        if sub.startswith(".") or not stat.S_ISDIR(st.st_mode):
            continue
        rel = f"{folder}/{sub}/{name}"
        found = file_stat(root, rel)
        if found is not None:
            out.append((rel, found))
    return out


def make_dirs(root: Path, path: Path | str) -> None:
    """Create the folder ``path`` and its missing parents (0700) beneath ``root``; raises
    LinkRefused when a component is a link."""
    parts = _parts(root, path)
    with about(_shown(root, parts), "create"), _root_fd(root) as rfd:
        try:
            os.close(_walk_dirs(rfd, parts, create=True))
        except OSError as exc:
            if _is_link_error(exc) or (exc.errno == errno.ENOTDIR and _has_link(rfd, parts)):
                raise _refuse(root, parts, exc) from None
            raise


@contextlib.contextmanager
def _parent(root: Path, parts: tuple[str, ...], *, create: bool) -> Iterator[int]:
    with _root_fd(root) as rfd:
        try:
            dfd = _walk_dirs(rfd, parts[:-1], create=create)
        except OSError as exc:
            if _is_link_error(exc) or (exc.errno == errno.ENOTDIR and _has_link(rfd, parts)):
                raise _refuse(root, parts, exc) from None
            raise
    try:
        yield dfd
    finally:
        os.close(dfd)


@contextlib.contextmanager
def atomic_writer(
    root: Path,
    path: Path | str,
    *,
    sync: bool = True,
    mode: int = _FILE_MODE,
    make_parents: bool = False,
    tmp: str | None = None,
) -> Iterator[BinaryIO]:
    """A binary file to write ``path``'s new contents into; on a clean exit it replaces
    ``path`` (see :func:`write_atomic`), on an exception it is removed and ``path`` is left
    as it was. For data that arrives in pieces (a download). ``tmp``: a fixed name for the
    temporary file beside the target (what is there is removed first), else a random one."""
    parts = _parts(root, path)
    # The folder was opened without a link on the way; the temporary file beside the target
    # is created with O_EXCL and O_NOFOLLOW (bot.durable), so nothing is written through (a
    # link at a fixed ``tmp`` is unlinked, never followed).
    with (
        about(_shown(root, parts), "write"),  # a full disk names no file by itself
        _parent(root, parts, create=make_parents) as dfd,
        durable.writer_in(dfd, parts[-1], mode=mode, sync=sync, tmp=tmp) as fh,
    ):
        yield fh


class _Abandoned(Exception):
    """What a writer is told ended it when the real reason is no Exception (a cancel)."""


def _abandon(stack: contextlib.ExitStack, exc: BaseException) -> None:
    """A writer's exit after ``exc`` (its temporary file removed), in a worker thread."""
    told = exc if isinstance(exc, Exception) else _Abandoned()
    try:
        stack.__exit__(type(told), told, told.__traceback__)
    except BaseException as raised:
        if raised is not told:
            raise


async def _in_thread(fn: Callable[..., T], *args: Any) -> T:
    """``asyncio.to_thread``, except that a cancel first waits for ``fn`` to return, so the
    operations on one file stay in order (no cleanup while a write into it still runs)."""
    task = asyncio.ensure_future(asyncio.to_thread(fn, *args))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        await asyncio.wait([task])
        if not task.cancelled():
            task.exception()  # seen: the cancel is what the caller gets
        raise


async def write_stream(
    root: Path,
    path: Path | str,
    blocks: AsyncIterable[bytes],
    *,
    make_parents: bool = False,
    gather: int = 1024 * 1024,
) -> int:
    """:func:`atomic_writer` for data arriving over the network; the bytes written.

    Every file operation (the walk to the folder, the writes, gathered ``gather`` bytes at a
    time, the fsyncs and the rename) runs in a worker thread, never on the event loop: the
    fsync of a 20 MB file takes a tenth of a second on a fast disk and seconds on an SD card,
    and every chat waits meanwhile. The temporary file has a fixed name beside the target
    (``.<name>.part``): what a crash or a kill left there is replaced by the next try, not
    piled up. An exception from ``blocks`` (a size cap, a timeout) or a cancel leaves
    ``path`` as it was and removes the temporary file."""
    name = PurePosixPath(str(path)).name
    stack = contextlib.ExitStack()
    writer = atomic_writer(root, path, make_parents=make_parents, tmp=f".{name}.part")
    size = 0
    try:
        # Inside the try: a cancel that lands as the file is opened still closes it.
        fh = await _in_thread(stack.enter_context, writer)
        pending = bytearray()
        async for block in blocks:
            pending += block
            size += len(block)
            if len(pending) >= gather:
                await _in_thread(fh.write, bytes(pending))
                pending.clear()
        if pending:
            await _in_thread(fh.write, bytes(pending))
    except BaseException as exc:
        await _in_thread(_abandon, stack, exc)
        raise
    await _in_thread(stack.close)
    return size


def write_atomic(
    root: Path,
    path: Path | str,
    data: bytes | str,
    *,
    sync: bool = True,
    mode: int = _FILE_MODE,
    make_parents: bool = False,
) -> None:
    """Replace ``path`` with ``data``: a new temporary file (random name, ``O_EXCL``) in the
    same folder, fsync, rename over the target, fsync of the folder. A crash leaves the old
    file or the new one; a link at the target is replaced by the file, never written through;
    a link on the way raises LinkRefused. ``sync`` False skips both fsyncs."""
    payload = data.encode("utf-8") if isinstance(data, str) else data
    with atomic_writer(root, path, sync=sync, mode=mode, make_parents=make_parents) as fh:
        fh.write(payload)


def write_link(root: Path, path: Path | str, target: str, *, make_parents: bool = False) -> None:
    """Make ``path`` a symlink to ``target`` (a revert restoring a link the history holds),
    replacing whatever is at ``path`` in one rename; nothing on the way is followed."""
    parts = _parts(root, path)
    with _parent(root, parts, create=make_parents) as dfd:
        tmp = f".{parts[-1][:64]}.{secrets.token_hex(6)}.tmp"
        os.symlink(target, tmp, dir_fd=dfd)
        try:
            durable.rename_in(dfd, tmp, dfd, parts[-1], sync=False)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            raise


def append(
    root: Path, path: Path | str, data: bytes | str, *, sync: bool = True, mode: int = _FILE_MODE
) -> int:
    """Append ``data`` to ``path`` (created with ``mode`` if missing); returns the offset the
    data starts at. A link at the path or on the way raises LinkRefused."""
    payload = data.encode("utf-8") if isinstance(data, str) else data
    fd = open_fd(root, path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, mode)
    try:
        with about(_shown(root, _parts(root, path)), "write"):  # a full disk names no file
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise OSError(errno.EINVAL, "not a regular file", str(path))
            start = st.st_size
            view = memoryview(payload)
            while view:
                view = view[os.write(fd, view) :]
            if sync:
                os.fsync(fd)
            return start
    finally:
        os.close(fd)


def unlink(root: Path, path: Path | str, *, missing_ok: bool = True, sync: bool = False) -> None:
    """Remove the file (or link) ``path`` itself; never what a link points at. ``sync``: the
    folder is fsynced after, through the descriptor the removal used."""
    parts = _parts(root, path)
    try:
        with _parent(root, parts, create=False) as dfd:
            os.unlink(parts[-1], dir_fd=dfd)
            if sync:
                os.fsync(dfd)
    except FileNotFoundError:
        if not missing_ok:
            raise


def rename(root: Path, src: Path | str, dst: Path | str, *, sync: bool = False) -> None:
    """Rename ``src`` to ``dst`` (both beneath ``root``), replacing ``dst`` itself if it is
    there; no link on either way is followed. ``sync``: both folders are fsynced after."""
    sparts, dparts = _parts(root, src), _parts(root, dst)
    with _parent(root, sparts, create=False) as sfd, _parent(root, dparts, create=False) as dfd:
        durable.rename_in(sfd, sparts[-1], dfd, dparts[-1], sync=sync)
