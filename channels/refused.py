"""Senders refused recently, per channel: who wrote and was not let in, with the id memobot
saw, so the owner can let them in without reading the log (the panel's Access screen).

A small bounded record, ``<state>/refused/<channel>.json`` (mode 0600): the last
:data:`MAX_KEPT` senders, one entry each (the latest refusal), newest first. The access check
calls :meth:`RefusedSenders.note` on the event loop at most once per sender per hour (when it
logs the refusal); the file is written in a worker thread, so the check never waits on a disk,
and by one write at a time that takes every refusal noted meanwhile: a crowd of strangers
(each new id a refusal) costs a few writes, never a worker thread each.
Only the gateway writes it; the panel reads it.

What a stranger chose is kept only as text to show: the name cut short, without control or
format characters (a right-to-left override that reverses what follows, a zero-width space);
the id is the one memobot checks allowFrom against.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from bot.private import replace_durably

log = logging.getLogger(__name__)

FOLDER = "refused"
MAX_KEPT = 20
MAX_NAME = 100  # a display name is the stranger's to choose: kept short
Chat = Literal["private", "group", "button", "command"]


@dataclass(frozen=True, slots=True)
class Refused:
    sender_id: str
    name: str  # as the platform gave it ("@eve"), may be ""
    chat: str  # where they wrote: private, group, button (an approval button), command
    at: float  # time.time() of the latest refusal
    paired: bool = False  # they were given a pairing code (dmPolicy "pairing")

    @property
    def who(self) -> str:
        return shown_who(self.sender_id, self.name)


class RefusedSenders:
    """The record of one channel."""

    def __init__(
        self, state_dir: Path, channel: str, clock: Callable[[], float] = time.time
    ) -> None:
        self.channel = channel
        self.path = state_dir / FOLDER / f"{channel}.json"
        self.clock = clock
        self._lock = threading.Lock()  # guards _pending and _writing
        self._pending: dict[str, Refused] = {}  # noted, not yet written; oldest first
        self._writing = False  # a writer is at work: it takes what is noted meanwhile
        self._writes: set[asyncio.Future[None]] = set()

    def note(self, sender_id: str, name: str, chat: Chat, paired: bool = False) -> None:
        """Record a refusal; in a worker thread when called on an event loop."""
        entry = Refused(sender_id, shown_name(name), chat, self.clock(), paired)
        with self._lock:
            self._pending.pop(entry.sender_id, None)
            self._pending[entry.sender_id] = entry
            while len(self._pending) > MAX_KEPT:  # older ones would not be kept anyway
                del self._pending[next(iter(self._pending))]
            if self._writing:
                return
            self._writing = True
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._drain()
            return
        try:
            write = loop.run_in_executor(None, self._drain)
        except RuntimeError as exc:  # the loop's executor is shut down: a stop under way
            with self._lock:
                self._writing = False
            log.debug("channel %s: refused sender not recorded: %s", self.channel, exc)
            return
        self._writes.add(write)
        write.add_done_callback(self._written)

    def _drain(self) -> None:
        """Write what is noted, until nothing more is (the one writer at a time)."""
        try:
            while True:
                with self._lock:
                    batch = list(self._pending.values())
                    self._pending.clear()
                    if not batch:
                        self._writing = False
                        return
                self._write(batch)
        except BaseException:
            with self._lock:
                self._writing = False
            raise

    def _written(self, write: asyncio.Future[None]) -> None:
        self._writes.discard(write)
        if not write.cancelled() and (exc := write.exception()) is not None:
            log.error(
                "channel %s: cannot record a refused sender in %s: %s", self.channel, self.path, exc
            )

    async def settled(self) -> None:
        """Every write started so far has ended (tests, and a stop that flushes)."""
        await asyncio.gather(*self._writes, return_exceptions=True)

    def _write(self, batch: list[Refused]) -> None:
        """``batch`` (oldest first) put before what the file holds."""
        new = {r.sender_id for r in batch}
        kept = [r for r in self.listing() if r.sender_id not in new]
        rows = [*reversed(batch), *kept][:MAX_KEPT]
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        replace_durably(self.path, json.dumps([_row(r) for r in rows], indent=1), sync=False)

    def listing(self) -> list[Refused]:
        """The senders refused, newest first; [] when none was (or the file is unreadable:
        it is a convenience, never a reason to refuse or admit anyone)."""
        try:
            rows = json.loads(self.path.read_text(encoding="utf-8"))
            return [
                Refused(
                    str(r["id"]),
                    str(r.get("name", "")),
                    str(r.get("chat", "")),
                    float(r["at"]),
                    bool(r.get("paired", False)),
                )
                for r in rows
            ]
        except FileNotFoundError:
            return []
        except (OSError, ValueError, TypeError, KeyError) as exc:
            log.warning(
                "refused senders of %s cannot be read (%s): shown as none", self.channel, exc
            )
            return []


def shown_name(name: str) -> str:
    """A stranger's display name as the panel may show it: no control or format characters
    (bidi overrides, zero-width ones), whitespace as single spaces, cut to MAX_NAME."""
    kept = "".join(
        " " if c.isspace() else c
        for c in name
        if unicodedata.category(c) not in ("Cc", "Cf") or c.isspace()
    )
    return " ".join(kept.split())[:MAX_NAME]


def shown_who(sender_id: str, name: str) -> str:
    """A person as the owner is shown them: ``2002 (@eve)``, or the id alone."""
    return f"{sender_id} ({name})" if name else sender_id


def _row(r: Refused) -> dict[str, Any]:
    return {"id": r.sender_id, "name": r.name, "chat": r.chat, "at": r.at, "paired": r.paired}
