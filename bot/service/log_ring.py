"""The last lines of the gateway's log, in memory, for the panel's Logs page.

A ``LogRing`` is one more handler on the root logger: each record, redacted by the same
``SecretFilter`` and formatted as the text log line, is kept in a bounded ring (the oldest
leaves first) and handed to the pages watching it. It sets no timer and polls nothing: with no
page open, a record costs one format and one append. Records come from any thread (SDK
threads, ``asyncio.to_thread`` workers); a watcher's queue is fed on its own event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from bot.gate.question import marked_invisible
from bot.service.logs import SECRETS, TEXT_FORMAT, session_of

RING_LINES = 2000
# Warnings and errors are also kept apart, so a flood of ordinary lines (the model can make
# many: a line per tool call) cannot push them out of the Overview or the WARNING view.
PROBLEM_LINES = 200
# Of those, the newest few from one place in the code: the model can repeat a warning (a tool
# refused in a group, call after call), and its repeats must not push out the others.
SAME_PLACE = 5
# Lines a slow watcher may have waiting; past that it misses lines (and is told so), never
# holding memory for a page that stopped reading.
WATCH_BACKLOG = 1000


@dataclass(frozen=True, slots=True)
class LogLine:
    seq: int  # 1, 2, ... in the order the records came
    levelno: int
    session: str | None  # the session the line names (``session=<key>``), if any
    text: str  # as the text log writes it, redacted


Watcher = tuple[asyncio.AbstractEventLoop, "asyncio.Queue[LogLine]"]


class LogRing(logging.Handler):
    def __init__(self, size: int = RING_LINES) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter(TEXT_FORMAT))
        # The one filter every handler of memobot's has: a secret never reaches the ring.
        self.addFilter(SECRETS)
        self._lines: deque[LogLine] = deque(maxlen=size)
        self._problems: deque[tuple[tuple[str, int], LogLine]] = deque(maxlen=PROBLEM_LINES)
        self._seq = 0
        self._watchers: list[Watcher] = []

    def emit(self, record: logging.LogRecord) -> None:
        # Called under the handler's lock (logging.Handler.handle).
        try:
            text = self.format(record)
        except Exception:  # as every logging handler: a bad record must not break the caller
            self.handleError(record)
            return
        self._seq += 1
        line = LogLine(self._seq, record.levelno, session_of(record), readable(text))
        self._lines.append(line)
        if record.levelno >= logging.WARNING:
            place = (record.pathname, record.lineno)
            same = [entry for entry in self._problems if entry[0] == place]
            if len(same) >= SAME_PLACE:
                self._problems.remove(same[0])
            self._problems.append((place, line))
        for watcher in list(self._watchers):
            loop, queue = watcher
            try:
                loop.call_soon_threadsafe(_offer, queue, line)
            except RuntimeError:  # its loop is closed: the page is gone
                self._watchers.remove(watcher)

    def recent(self, level: int = logging.NOTSET) -> list[LogLine]:
        """The lines in the ring of ``level`` or above, oldest first (WARNING and above: also
        those ordinary lines pushed out of the ring since, up to ``PROBLEM_LINES``, at most
        ``SAME_PLACE`` from one line of code)."""
        with self.lock:  # type: ignore[union-attr]  # created by logging.Handler.__init__
            lines = [line for line in self._lines if line.levelno >= level]
            if level < logging.WARNING or not self._lines:
                return lines
            first = self._lines[0].seq
            gone = [ln for _, ln in self._problems if ln.seq < first and ln.levelno >= level]
            return gone + lines

    def problems(self) -> list[LogLine]:
        """The last warnings and errors, oldest first: up to ``PROBLEM_LINES``, at most
        ``SAME_PLACE`` of them from one line of code (the Overview's)."""
        with self.lock:  # type: ignore[union-attr]
            return [line for _, line in self._problems]

    @contextmanager
    def watch(self) -> Iterator[asyncio.Queue[LogLine]]:
        """A queue of the lines logged from now on (a reader too slow misses some: a gap in
        ``seq``); call it on the event loop that reads the queue."""
        queue: asyncio.Queue[LogLine] = asyncio.Queue(WATCH_BACKLOG)
        watcher: Watcher = (asyncio.get_running_loop(), queue)
        with self.lock:  # type: ignore[union-attr]
            self._watchers.append(watcher)
        try:
            yield queue
        finally:
            with self.lock:  # type: ignore[union-attr]
                if watcher in self._watchers:
                    self._watchers.remove(watcher)

    @property
    def watching(self) -> int:
        return len(self._watchers)


def readable(text: str) -> str:
    """A formatted record as one line of the log page: its own lines after the first
    indented (a message or a name holding a line break cannot pass for a line of its own),
    every invisible or control character by its code point (an ESC, a CR, a bidi override)."""
    return marked_invisible(text).replace("\n", "\n    ")


def _offer(queue: asyncio.Queue[LogLine], line: LogLine) -> None:
    if queue.full():
        return  # the reader sees a gap in the sequence numbers
    queue.put_nowait(line)
