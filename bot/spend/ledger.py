"""The usage ledger: one JSON line per answered model call, ``<state>/usage/YYYY-MM.jsonl``.

Written once before the caller goes on: the provider awaits :meth:`UsageLedger.record` before it
hands the answer back, so a turn's checkpoint (which marks the answer as had) comes after the
record is in the file. A SIGKILL between the two leaves the record and no checkpoint: the
resumed turn asks the model again, and that new call is a new record, so every call the
provider answered is counted exactly once. A call is never recorded from a checkpoint, so a
restored answer is not counted again.

A record is one ``write`` on the month's ``O_APPEND`` file, made on the event loop (a line to
the page cache takes microseconds; a hop to a worker thread would cost ten times that): once
it returned, only a power cut can lose it. The fsync is shared: a flusher syncs the file at
most once every ``SYNC_SECONDS``, only while records wait for it (no timer when idle), and at
shutdown, so a power cut loses at most about the last second of records. Opening a month's
file, writing again after a failure, and writing while another process holds the file's flock
(the loop only tries it) go to a worker thread. One file per UTC month keeps
every read bounded: a report reads only the months it covers. A torn last line (a crash
mid-write) is skipped by readers and cut off by the next write (:class:`bot.durable.Appender`);
a damaged line elsewhere is skipped and logged.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bot import durable, failpoints
from bot.spend.record import CallRecord

log = logging.getLogger(__name__)

FOLDER = "usage"
# The longest a written record waits for its fsync (what a power cut may cost).
SYNC_SECONDS = 1.0


def usage_folder(state_dir: Path) -> Path:
    return state_dir / FOLDER


def month_file(state_dir: Path, month: str) -> Path:
    """The ledger of one UTC month, "2026-12"."""
    return usage_folder(state_dir) / f"{month}.jsonl"


class UsageLedger:
    """Appends call records for one process; ``record`` is the provider's meter."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self._queue: list[CallRecord] = []  # handed in, not yet written
        self._writer: asyncio.Task[None] | None = None  # a write in a worker thread
        self._file: durable.Appender | None = None  # this month's, kept open
        self._month = ""  # of self._file
        self._retired: list[durable.Appender] = []  # past months': synced, then closed
        self._failing = False
        self._unsynced = False  # written since the flusher's last fsync began
        self._flusher: asyncio.Task[None] | None = None
        self._synced_at = float("-inf")  # loop time of the last fsync's start
        self._wake: asyncio.Future[None] | None = None  # the flusher's wait, to cut short
        self._sync_failing = False
        # Told of each record as it comes (the API channel: a turn's usage for its answer).
        self.listeners: list[Callable[[CallRecord], None]] = []

    async def record(self, rec: CallRecord) -> None:
        """Write ``rec`` to the file and return; never raises an I/O error (it is logged,
        and the record is tried again with the next one)."""
        for listener in self.listeners:
            try:
                listener(rec)
            except Exception:  # a listener's bug must not lose the record (or the answer)
                log.exception("usage listener failed session=%s", rec.session)
        self._queue.append(rec)
        file = self._file
        if (
            len(self._queue) == 1
            and rec.month == self._month
            and file is not None
            and file.warm
            and (self._writer is None or self._writer.done())
            and self._write_queued_here(file)
        ):
            failpoints.hit("usage_recorded")
            return
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(
                self._write_queued(), name="usage-ledger"
            )
        # A cancelled caller (/stop) leaves its record to be written all the same.
        await asyncio.shield(self._writer)
        failpoints.hit("usage_recorded")

    async def flush(self) -> None:
        """Wait until every record handed in so far was written, or tried once more (one
        that failed before waits for the next write: here, at the latest), and fsynced."""
        if self._queue and (self._writer is None or self._writer.done()):
            self._writer = asyncio.get_running_loop().create_task(self._write_queued())
        while self._writer is not None and not self._writer.done():
            await asyncio.shield(self._writer)
        if self._unsynced or self._retired:
            self._unsynced = True
            self._synced_at = float("-inf")  # now, not a second after the last
            if self._wake is not None and not self._wake.done():
                self._wake.set_result(None)
            self._start_flusher()
        while self._flusher is not None and not self._flusher.done():
            await asyncio.shield(self._flusher)

    async def aclose(self) -> None:
        await self.flush()
        if self._queue:
            log.error("usage ledger: %d record(s) could not be written", len(self._queue))
        self.close()

    def _write_queued_here(self, file: durable.Appender) -> bool:
        """The queue's one record, written on the event loop to this month's warm file. False:
        another process (``memobot dream``, ``memobot agent``) holds the file's lock, maybe
        stopped with it held; the record stays queued for a worker thread, which may wait."""
        batch, self._queue = self._queue, []
        try:
            file.append(batch[0].line(), sync=False, wait=False)
        except BlockingIOError:
            self._queue[:0] = batch
            return False
        except OSError as exc:
            self._failed(batch, exc)
            return True
        self._written()
        return True

    async def _write_queued(self) -> None:
        while self._queue:
            batch, self._queue = self._queue, []
            left, exc, retired = await asyncio.to_thread(self._append, batch)
            self._retired += retired  # the flusher syncs them, then closes them
            if exc is not None:
                self._failed(left, exc)
                return
            self._written()

    def _failed(self, left: list[CallRecord], exc: OSError) -> None:
        # Kept for the next write: the records are not lost to a full disk meanwhile.
        self._queue[:0] = left
        if not self._failing:
            log.error("usage ledger: cannot write %d record(s): %s", len(left), exc)
        self._failing = True

    def _written(self) -> None:
        if self._failing:
            log.info("usage ledger: writing again")
            self._failing = False
        self._unsynced = True
        self._start_flusher()

    def _start_flusher(self) -> None:
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(
                self._sync_written(), name="usage-ledger-sync"
            )

    async def _sync_written(self) -> None:
        """fsync the written records, at most once every SYNC_SECONDS; ends when nothing is
        left to sync (the next record starts it again)."""
        loop = asyncio.get_running_loop()
        while self._unsynced or self._retired:
            delay = self._synced_at + SYNC_SECONDS - loop.time()
            if delay > 0:
                self._wake = wake = loop.create_future()
                timer = loop.call_later(delay, _resolve, wake)
                try:
                    await wake
                finally:
                    timer.cancel()
                    self._wake = None
            self._unsynced = False
            self._synced_at = loop.time()
            retired, self._retired = self._retired, []
            exc = await asyncio.to_thread(_sync, self._file, retired)
            if exc is not None and not self._sync_failing:
                log.error(
                    "usage ledger: cannot fsync (a power cut may lose the last records): %s",
                    exc,
                )
            self._sync_failing = exc is not None

    def _append(
        self, batch: list[CallRecord]
    ) -> tuple[list[CallRecord], OSError | None, list[durable.Appender]]:
        """Write ``batch`` (in a worker thread), one append per month it spans. Returns the
        records not written on a failure (a month written before it stays written) and the
        error, and the files of months past it left (still to sync)."""
        by_month: dict[str, list[CallRecord]] = {}
        for rec in batch:
            by_month.setdefault(rec.month, []).append(rec)
        written: set[str] = set()
        retired = []
        for month, records in by_month.items():
            if self._file is None or self._month != month:
                if self._file is not None:
                    retired.append(self._file)
                self._file = durable.Appender(month_file(self.state_dir, month))
                self._month = month
            try:
                self._file.append(b"".join(rec.line() for rec in records), sync=False)
            except OSError as exc:
                return [r for r in batch if r.month not in written], exc, retired
            written.add(month)
        return [], None, retired

    def close(self) -> None:
        """Close the files (the next record opens its month's again). After :meth:`flush`,
        or with nothing written: close does not sync."""
        for file in [*self._retired, self._file]:
            if file is not None:
                file.close()
        self._retired, self._file, self._month = [], None, ""


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _sync(current: durable.Appender | None, retired: list[durable.Appender]) -> OSError | None:
    """fsync the month's file and the past months' (closing those); the first error."""
    error = None
    for file in [*retired, current]:
        if file is None:
            continue
        try:
            file.sync()
        except OSError as exc:
            error = error or exc
        if file is not current:
            file.close()
    return error


def months_between(first: str, last: str) -> list[str]:
    """The months "YYYY-MM" from ``first`` to ``last``, both included."""
    year, month = int(first[:4]), int(first[5:7])
    out = []
    while f"{year:04d}-{month:02d}" <= last:
        out.append(f"{year:04d}-{month:02d}")
        year, month = (year + 1, 1) if month == 12 else (year, month + 1)
    return out


def read_records(state_dir: Path, start: str, end: str) -> Iterator[CallRecord]:
    """The records with ``start <= at < end`` (UTC, as the records write it), reading only the
    months in between. A torn last line is skipped (a crash, or a write under way); a damaged
    line elsewhere is skipped and logged with its file and line number."""
    if end <= start:
        return
    for month in months_between(start[:7], end[:7]):
        path = month_file(state_dir, month)
        try:
            text = durable.read_regular(path).decode("utf-8", "replace")
        except FileNotFoundError:
            continue
        lines = text.split("\n")
        lines.pop()  # after the last newline: empty, or a torn line
        damaged = []
        for number, obj in enumerate(_parsed(lines), 1):
            rec = CallRecord.from_json(obj)
            if rec is None:
                if lines[number - 1].strip():
                    damaged.append(number)
                continue
            if start <= rec.at < end:
                yield rec
        if damaged:
            log.warning(
                "usage ledger %s: skipped damaged line(s) %s",
                path,
                ", ".join(map(str, damaged[:10])),
            )


def _parsed(lines: list[str]) -> list[Any]:
    """Each line's JSON value (None where it is not JSON): the whole file in one parse when
    every line is whole, as they are but after a crash or a hand edit."""
    try:
        whole = json.loads("[" + ",".join(lines) + "]")
        if len(whole) == len(lines):
            return whole
    except ValueError:
        pass
    values = []
    for line in lines:
        try:
            values.append(json.loads(line))
        except ValueError:
            values.append(None)
    return values
