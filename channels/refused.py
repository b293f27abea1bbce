"""Senders refused recently, per channel: who wrote and was not let in, with the id memobot
saw, so the owner can let them in without reading the log (the panel's Access screen).

A small bounded record, ``<state>/refused/<channel>.json`` (mode 0600): the last
:data:`MAX_KEPT` senders, one entry each (the latest refusal), newest first. The access check
calls :meth:`RefusedSenders.note` on the event loop at most once per sender per hour (when it
logs the refusal); the file is written in a worker thread, so the check never waits on a disk.
Only the gateway writes it; the panel reads it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
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
        return f"{self.sender_id} ({self.name})" if self.name else self.sender_id


class RefusedSenders:
    """The record of one channel."""

    def __init__(
        self, state_dir: Path, channel: str, clock: Callable[[], float] = time.time
    ) -> None:
        self.channel = channel
        self.path = state_dir / FOLDER / f"{channel}.json"
        self.clock = clock
        self._lock = threading.Lock()  # two writes from worker threads never interleave
        self._writes: set[asyncio.Future[None]] = set()

    def note(self, sender_id: str, name: str, chat: Chat, paired: bool = False) -> None:
        """Record a refusal; in a worker thread when called on an event loop."""
        entry = Refused(sender_id, name[:MAX_NAME], chat, self.clock(), paired)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._write(entry)
            return
        write = loop.run_in_executor(None, self._write, entry)
        self._writes.add(write)
        write.add_done_callback(self._written)

    def _written(self, write: asyncio.Future[None]) -> None:
        self._writes.discard(write)
        if not write.cancelled() and (exc := write.exception()) is not None:
            log.error(
                "channel %s: cannot record a refused sender in %s: %s", self.channel, self.path, exc
            )

    async def settled(self) -> None:
        """Every write started so far has ended (tests, and a stop that flushes)."""
        await asyncio.gather(*self._writes, return_exceptions=True)

    def _write(self, entry: Refused) -> None:
        with self._lock:
            kept = [r for r in self.listing() if r.sender_id != entry.sender_id]
            rows = [entry, *kept][:MAX_KEPT]
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


def _row(r: Refused) -> dict[str, Any]:
    return {"id": r.sender_id, "name": r.name, "chat": r.chat, "at": r.at, "paired": r.paired}
