"""The usage ledger: one JSON line per answered model call, ``<state>/usage/YYYY-MM.jsonl``.

Written once, durably, before the caller goes on: the provider awaits :meth:`UsageLedger.record`
before it hands the answer back, so a turn's checkpoint (which marks the answer as had) comes
after the record is on disk. A SIGKILL between the two leaves the record and no checkpoint: the
resumed turn asks the model again, and that new call is a new record, so every call the
provider answered is counted exactly once. A call is never recorded from a checkpoint, so a
restored answer is not counted again.

Records of calls made at the same moment (many chats) share one write and one fsync (a group
commit). One file per UTC month keeps every read bounded: a report reads only the months it
covers. A torn last line (a crash mid-write) is skipped by readers and cut off by the next
write (:class:`bot.durable.Appender`); a damaged line elsewhere is skipped and logged.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bot import durable, failpoints
from bot.spend.record import CallRecord

log = logging.getLogger(__name__)

FOLDER = "usage"


def usage_folder(state_dir: Path) -> Path:
    return state_dir / FOLDER


def month_file(state_dir: Path, month: str) -> Path:
    """The ledger of one UTC month, "2026-12"."""
    return usage_folder(state_dir) / f"{month}.jsonl"


class UsageLedger:
    """Appends call records for one process; ``record`` is the provider's meter."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self._queue: list[CallRecord] = []
        self._done: asyncio.Future[None] | None = None  # of the batch being gathered
        self._writer: asyncio.Task[None] | None = None
        self._file: durable.Appender | None = None  # this month's, kept open
        self._failing = False

    async def record(self, rec: CallRecord) -> None:
        """Put ``rec`` on disk (fsynced) and return; never raises an I/O error (it is
        logged, and the record is tried again with the next one)."""
        loop = asyncio.get_running_loop()
        self._queue.append(rec)
        if self._done is None:
            self._done = loop.create_future()
        done = self._done
        if self._writer is None or self._writer.done():
            self._writer = loop.create_task(self._write_queued(), name="usage-ledger")
        # A cancelled caller (/stop) leaves its record to be written all the same.
        await asyncio.shield(done)
        failpoints.hit("usage_recorded")

    async def flush(self) -> None:
        """Wait until every record handed in so far was written, or tried once more (one
        that failed before waits for the next write: here, at the latest)."""
        if self._queue and (self._writer is None or self._writer.done()):
            self._writer = asyncio.get_running_loop().create_task(self._write_queued())
        while self._writer is not None and not self._writer.done():
            await asyncio.shield(self._writer)

    async def aclose(self) -> None:
        await self.flush()
        if self._queue:
            log.error("usage ledger: %d record(s) could not be written", len(self._queue))
        self.close()

    async def _write_queued(self) -> None:
        while self._queue:
            batch, self._queue = self._queue, []
            done, self._done = self._done, None
            try:
                left, exc = await asyncio.to_thread(self._append, batch)
            finally:
                # Its callers go on: a record that failed is written with a later one.
                if done is not None and not done.done():
                    done.set_result(None)
            if exc is not None:
                # Kept for the next write: the records are not lost to a full disk meanwhile.
                self._queue[:0] = left
                if not self._failing:
                    log.error("usage ledger: cannot write %d record(s): %s", len(left), exc)
                self._failing = True
                return
            if self._failing:
                log.info("usage ledger: writing again")
                self._failing = False

    def _append(self, batch: list[CallRecord]) -> tuple[list[CallRecord], OSError | None]:
        """Write ``batch``, one append per month it spans; on a failure, the records not
        written (a month written before it stays written) and the error."""
        by_month: dict[str, list[CallRecord]] = {}
        for rec in batch:
            by_month.setdefault(rec.month, []).append(rec)
        written: set[str] = set()
        for month, records in by_month.items():
            path = month_file(self.state_dir, month)
            if self._file is None or self._file.path != path:
                if self._file is not None:
                    self._file.close()
                self._file = durable.Appender(path)
            try:
                self._file.append(b"".join(rec.line() for rec in records))
            except OSError as exc:
                return [r for r in batch if r.month not in written], exc
            written.add(month)
        return [], None

    def close(self) -> None:
        """Close the month's file (the next record opens it again)."""
        if self._file is not None:
            self._file.close()
            self._file = None


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
            text = path.read_bytes().decode("utf-8", "replace")
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
