"""How much disk the workspace takes, and one warning when it passes agent.workspaceWarnBytes.

Measured after a command of the agent ends, at most once a minute, in a worker thread: a plain
message costs nothing. The walk never follows a symlink (every folder is opened relative to its
parent with O_NOFOLLOW), so a link the model planted cannot send it through the disk.
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path

from bot.gate.limits import human_bytes

log = logging.getLogger(__name__)

CHECK_EVERY_SECONDS = 60.0
MAX_DEPTH = 256  # deeper folders are not counted (each level holds one open descriptor)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def measure(root: Path, stop_above: int = 0) -> tuple[int, bool]:
    """Bytes of disk the files under ``root`` take (allocated blocks, a hard-linked file once).

    Returns ``(bytes, complete)``; with ``stop_above`` the walk ends as soon as the count passes
    it (``complete`` false). Unreadable folders count as empty; a missing root is 0.
    """
    seen: set[tuple[int, int]] = set()
    total = 0

    def scan(fd: int) -> list[str]:
        nonlocal total
        folders = []
        try:
            with os.scandir(fd) as entries:
                for entry in entries:
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if stat.S_ISDIR(st.st_mode):
                        folders.append(entry.name)
                    elif st.st_nlink > 1:
                        if (st.st_dev, st.st_ino) in seen:
                            continue
                        seen.add((st.st_dev, st.st_ino))
                    total += st.st_blocks * 512
        except OSError:
            pass
        return folders

    try:
        top = os.open(root, _DIR_FLAGS)
    except OSError:
        return 0, True
    stack = [(top, scan(top))]
    try:
        while stack:
            if stop_above and total > stop_above:
                return total, False
            fd, folders = stack[-1]
            if not folders:
                os.close(fd)
                stack.pop()
                continue
            try:
                child = os.open(folders.pop(), _DIR_FLAGS, dir_fd=fd)
            except OSError:
                continue  # replaced by a link, or gone
            if len(stack) >= MAX_DEPTH:
                os.close(child)
                continue
            stack.append((child, scan(child)))
    finally:
        for fd, _ in stack:
            os.close(fd)
    return total, True


def describe(size: int, complete: bool, warn_bytes: int) -> str:
    """``12.3 MB (warns above 2 GB)``, or ``over 2 GB, past agent.workspaceWarnBytes``."""
    if not warn_bytes:
        return f"{human_bytes(size)} (no size warning: agent.workspaceWarnBytes is 0)"
    if size > warn_bytes:
        shown = f"over {human_bytes(warn_bytes)}" if not complete else human_bytes(size)
        return f"{shown}, past agent.workspaceWarnBytes ({human_bytes(warn_bytes)})"
    return f"{human_bytes(size)} (warns above {human_bytes(warn_bytes)})"


class WorkspaceUsage:
    """Watches the workspace's size; :meth:`poke` after each command of the agent.

    Logs a warning once when the size passes ``warn_bytes``, and a line when it is back under
    (then a later crossing warns again). ``clock`` is injectable for tests.
    """

    def __init__(
        self,
        root: Path,
        warn_bytes: int,
        *,
        every: float = CHECK_EVERY_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.root = root
        self.warn_bytes = warn_bytes
        self.every = every
        self._clock = clock
        self._last: float | None = None
        self._task: asyncio.Task[None] | None = None
        self.over = False
        self.size: int | None = None

    def poke(self) -> None:
        """Start a measurement in a worker thread unless one ran within ``every`` seconds or
        still runs. Call from the event loop; returns at once."""
        if not self.warn_bytes or (self._task is not None and not self._task.done()):
            return
        now = self._clock()
        if self._last is not None and now - self._last < self.every:
            return
        self._last = now
        self._task = asyncio.get_running_loop().create_task(self._check(), name="workspace-size")

    async def settle(self) -> None:
        """Wait for a running measurement (tests, shutdown)."""
        if self._task is not None:
            await self._task

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _check(self) -> None:
        started = time.monotonic()
        size, complete = await asyncio.to_thread(measure, self.root, self.warn_bytes)
        over = size > self.warn_bytes
        if over and not self.over:
            log.warning(
                "workspace %s holds %s (measured in %.1f s); free some space or raise "
                "agent.workspaceWarnBytes",
                self.root,
                describe(size, complete, self.warn_bytes),
                time.monotonic() - started,
            )
        elif self.over and not over:
            log.info("workspace %s is back under agent.workspaceWarnBytes: %s", self.root,
                     describe(size, complete, self.warn_bytes))  # fmt: skip
        self.over = over
        self.size = size
