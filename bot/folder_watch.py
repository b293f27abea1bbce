"""Wake when a file in one of memobot's state folders is written or replaced by anyone (another
memobot process, a command): the kernel's inotify on Linux, so a waiter costs nothing until
something changes and hears of it at once. Where inotify is missing (another system, the
limit of watches reached) it falls back to asking every ``poll`` seconds, and says so once.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

# <sys/inotify.h>
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_TO = 0x00000080
IN_DELETE = 0x00000200
IN_ONLYDIR = 0x01000000
IN_DONT_FOLLOW = 0x02000000
# A replace (durable.replace_file renames over the file), a write in place, a removal.
MASK = IN_CLOSE_WRITE | IN_MOVED_TO | IN_DELETE | IN_ONLYDIR | IN_DONT_FOLLOW


class FolderWatch:
    """Open inside a running event loop; :meth:`changed` returns once something in ``folder``
    changed since the watch opened or since the last call returned. Close it when done."""

    def __init__(self, folder: Path, poll: float = 1.0) -> None:
        self.folder = folder
        self.poll = poll
        self._fd: int | None = None
        self._event = asyncio.Event()
        try:
            self._fd = _inotify(folder)
        except (OSError, AttributeError) as exc:  # AttributeError: no inotify in this libc
            log.warning("cannot watch %s (%s): it is read every %g s instead", folder, exc, poll)
            return
        asyncio.get_running_loop().add_reader(self._fd, self._readable)

    @property
    def polling(self) -> bool:
        return self._fd is None

    def _readable(self) -> None:
        assert self._fd is not None
        try:
            while os.read(self._fd, 65536):  # what changed does not matter: drain it
                pass
        except BlockingIOError:
            pass
        self._event.set()

    async def changed(self) -> None:
        if self._fd is None:
            await asyncio.sleep(self.poll)
            return
        await self._event.wait()
        self._event.clear()

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            asyncio.get_running_loop().remove_reader(fd)
            os.close(fd)


def _inotify(folder: Path) -> int:
    """A non-blocking inotify descriptor watching ``folder`` (not through a link)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = int(libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    if libc.inotify_add_watch(fd, os.fsencode(folder), MASK) < 0:
        err = ctypes.get_errno()
        os.close(fd)
        raise OSError(err, os.strerror(err), str(folder))
    return fd
