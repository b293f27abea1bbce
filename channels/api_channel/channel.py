"""The OpenAI-compatible API as a channel: a program's request goes through the bus like a
platform's message, and its answer comes back through the delivery ledger like any answer.

There is no platform: the transport is the API's routes (``bot.web.api``), which hand this
channel one new user message per request (``ask``) and wait on the answer (``waiting``).
Inbound, a request is published on the bus, so it is a pending turn in its session before the
turn runs. Outbound, the stream of the answer being written ("direct" previews) and the final
answer go to the request's waiters; a waiter that left (a client that disconnected) misses
nothing that matters: the answer is in the session, and for a request with an
``Idempotency-Key`` in this channel's records (``Records``) too, where a retry finds it.

A request's message id is made from its key's name and its Idempotency-Key, so a retry after
a disconnect or a crash is the same message: the intake recognises it ("duplicate"), and the
turn runs once.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
import uuid
from collections import deque
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from bot import durable
from bot.bus import InboundMessage, Intake, MessageBus, OutboundMessage, StreamEvent
from bot.kinds import Classified, Sender, TurnKind
from channels.api_channel.spec import NAME
from channels.base import Channel, PreviewMode

log = logging.getLogger(__name__)

PREFIX = "api-"  # of a request's message id
OUTCOME_KEY = "outcome"  # bot.turn.OUTCOME_KEY: channels do not import the core's loop
# Purposes of a model call that answer a person's turn (bot.spend.record TURN, TOOL_ITERATION).
TURN_PURPOSES = frozenset({"turn", "tool_iteration"})
RECORDS_KEPT = 500  # per key, newest last
RECORDS_SECONDS = 24 * 3600.0  # a retry after a day is a new request


@dataclass(frozen=True, slots=True)
class Caller:
    """Who a request speaks for: its key's name, and that key's person."""

    key: str
    sender_id: str
    is_admin: bool


@dataclass(frozen=True, slots=True)
class Answer:
    """A turn's final answer as the API returns it."""

    text: str
    outcome: str  # "ok", "failed", "stopped" (bot.turn.Outcome)
    prompt_tokens: int = 0
    completion_tokens: int = 0


Event = tuple[Literal["text", "tool"], str]


class Waiter:
    """What one request is to be told, in order: the stream's events (only the latest of a run
    of "text" events is kept: each holds the whole reply so far), then its answer."""

    def __init__(self) -> None:
        self.events: deque[Event] = deque()
        self.answer: Answer | None = None
        self.wake = asyncio.Event()

    def push(self, event: Event) -> None:
        if event[0] == "text" and self.events and self.events[-1][0] == "text":
            self.events[-1] = event
        else:
            self.events.append(event)
        self.wake.set()

    def done(self, answer: Answer) -> None:
        self.answer = answer
        self.wake.set()

    async def next(self) -> list[Event]:
        """The events since the last call (waiting for one, or for the answer)."""
        await self.wake.wait()
        self.wake.clear()
        out = list(self.events)
        self.events.clear()
        return out


def message_id(key: str, idempotency_key: str | None) -> str:
    """The message id of a request: the same for every retry with one Idempotency-Key of one
    key (keys never share one), a new one without."""
    if idempotency_key is None:
        return f"{PREFIX}{uuid.uuid4().hex[:24]}"
    digest = hashlib.sha256(f"{key}\0{idempotency_key}".encode()).hexdigest()
    return f"{PREFIX}i-{digest[:32]}"


class Records:
    """The requests made with an Idempotency-Key and their answers, one file per key
    (``<state>/api/<key>.json``), replaced whole (``bot.durable``) at each change: a request
    is recorded before it is published, its answer before the delivery ledger lets it go."""

    def __init__(self, folder: Path, clock: Any = time.time) -> None:
        self.folder = folder
        self.clock = clock
        self._keys: dict[str, dict[str, dict[str, Any]]] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    def _path(self, key: str) -> Path:
        return self.folder / f"{key}.json"

    async def load(self, key: str) -> dict[str, dict[str, Any]]:
        """The key's records (read from disk once)."""
        if key not in self._keys:
            found = await asyncio.to_thread(_read_records, self._path(key))
            self._keys.setdefault(key, found)
        return self._keys[key]

    def get(self, key: str, mid: str) -> dict[str, Any] | None:
        """A loaded key's record of request ``mid``."""
        return self._keys.get(key, {}).get(mid)

    async def claim(self, key: str, mid: str, record: dict[str, Any]) -> dict[str, Any]:
        """Record request ``mid`` unless it is recorded already; the record that stands (two
        requests racing with one Idempotency-Key: the first one's)."""
        async with self._locks.setdefault(key, asyncio.Lock()):
            records = await self.load(key)
            if mid in records:
                return records[mid]
            await self._store(key, records, mid, record)
            return record

    async def put(self, key: str, mid: str, record: dict[str, Any]) -> None:
        async with self._locks.setdefault(key, asyncio.Lock()):
            await self._store(key, await self.load(key), mid, record)

    async def _store(
        self, key: str, records: dict[str, dict[str, Any]], mid: str, record: dict[str, Any]
    ) -> None:
        records.pop(mid, None)
        records[mid] = record  # newest last
        now = self.clock()
        for old in [m for m, r in records.items() if now - r.get("at", 0) > RECORDS_SECONDS]:
            del records[old]
        while len(records) > RECORDS_KEPT:
            del records[next(iter(records))]
        # Made off the event loop too: 500 answers of up to 40,000 characters (a longer one
        # is cut, bot.long_answers) are 20 MB of JSON, 160 ms to make. Nothing changes
        # ``records`` meanwhile: every change is made under the key's lock, held here.
        await asyncio.to_thread(self._write, key, records)

    def _write(self, key: str, records: dict[str, dict[str, Any]]) -> None:
        payload = json.dumps(records, ensure_ascii=False)
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        durable.replace_file(self._path(key), payload, mode=0o600)


def _read_records(path: Path) -> dict[str, dict[str, Any]]:
    try:
        data = json.loads(durable.read_regular(path))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        # Not silently: a retry of a request in it would run the turn again.
        log.error("api: cannot read %s (%s); its idempotency records are lost", path, exc)
        return {}
    return (
        {str(k): v for k, v in data.items() if isinstance(v, dict)}
        if isinstance(data, dict)
        else {}
    )


class ApiChannel(Channel):
    name = NAME
    streaming = True
    platform = False

    def __init__(
        self,
        bus: MessageBus,
        section: Any = None,
        workspace: Path | None = None,
        state_dir: Path | None = None,
    ) -> None:
        super().__init__(bus)
        self.records = Records((state_dir or Path(".")) / "api")
        self._waiters: dict[str, set[Waiter]] = {}
        # Tokens of the model calls of each session's turn under way (its answer takes them).
        self._usage: dict[str, tuple[int, int]] = {}

    async def start(self) -> None:
        self.set_state("connected")

    # -- inbound: a program's request --

    async def ask(self, caller: Caller, session_id: str, text: str, mid: str) -> Intake:
        """Publish ``text`` as the new user message of session ``api:<key>:<session_id>``:
        always a person's message (never a chat command, whatever it starts with)."""
        self.touch()
        sender = Sender(caller.sender_id, caller.is_admin, False)
        msg = InboundMessage(
            NAME,
            f"{caller.key}:{session_id}",
            caller.sender_id,
            text,
            message_id=mid,
            metadata={"is_admin": caller.is_admin, "is_group": False},
            classified=Classified(TurnKind.MESSAGE, sender),
        )
        return await self.bus.publish_inbound(msg)

    @contextlib.contextmanager
    def waiting(self, mid: str) -> Iterator[Waiter]:
        """A waiter of request ``mid``'s stream and answer for as long as the block runs."""
        waiter = Waiter()
        self._waiters.setdefault(mid, set()).add(waiter)
        try:
            yield waiter
        finally:
            waiters = self._waiters.get(mid, set())
            waiters.discard(waiter)
            if not waiters:
                self._waiters.pop(mid, None)

    def wake_all(self) -> None:
        """Every waiting request looks up (the server stops)."""
        for waiters in self._waiters.values():
            for waiter in waiters:
                waiter.wake.set()

    def answered(self, key: str, mid: str) -> Answer | None:
        """The recorded answer of request ``mid`` (of a loaded key), if it has one."""
        record = self.records.get(key, mid)
        answer = record.get("answer") if record else None
        return Answer(**answer) if isinstance(answer, dict) else None

    # -- outbound: to the waiting requests --

    def preview_mode(self, chat_id: str) -> PreviewMode:
        return "direct"

    def show_stream(self, event: StreamEvent) -> None:
        if event.kind == "done":
            return
        for waiter in self._waiters.get(event.reply_to or "", ()):
            waiter.push((event.kind, event.text))

    def count_usage(self, session: str, purpose: str, prompt: int, completion: int) -> None:
        """A model call was counted (bot.spend): a turn's calls are its answer's usage."""
        if session.startswith(f"{NAME}:") and purpose in TURN_PURPOSES:
            p, c = self._usage.get(session, (0, 0))
            self._usage[session] = (p + prompt, c + completion)

    async def send_chunk(
        self, msg: OutboundMessage, chunk: str, plain: bool = False, *, first: bool = False
    ) -> None:
        mid = msg.reply_to or ""
        if not (msg.final and mid.startswith(PREFIX) and first):
            # A notice (a long message cut, an outage begun) or the note after a long answer
            # of where its whole text is kept: nobody reads those here; the answer is one piece.
            log.debug("api: not an answer, not shown session=%s", msg.session_key)
            return
        prompt, completion = self._usage.pop(msg.session_key, (0, 0))
        outcome = str(msg.metadata.get(OUTCOME_KEY) or "ok")
        answer = Answer(msg.text, outcome, prompt, completion)
        key = msg.chat_id.partition(":")[0]
        await self.records.load(key)
        record = self.records.get(key, mid)
        if record is not None and record.get("answer") is None:
            # Before the ledger lets the answer go: a retry finds it, after a crash too.
            await self.records.put(key, mid, {**record, "answer": asdict(answer)})
        for waiter in self._waiters.get(mid, ()):
            waiter.done(answer)
