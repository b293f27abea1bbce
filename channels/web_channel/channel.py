"""The panel's chat as a channel: the owner talks to memobot from the browser, through the bus
like every platform (sessions ``web:<name>``, one per conversation).

There is no platform: the transport is the panel. Inbound, the Chat screen hands the owner's
words (``say``; "/stop" is a Stop button) and an approval button (``press``) to this channel,
which publishes them on the bus like any channel, durable before the browser hears "sent".
Outbound, what the manager delivers (answers, notices, approval questions), the stream of an
answer being written ("direct" previews: no platform to pace) and the typing signal go to the
conversation's listeners: the screen's event streams (SSE), one per open browser tab. A
listener that falls behind loses nothing: its queue is replaced by "refresh", and the browser
reads the transcript again, which the screen takes from the session itself.

Kept here, in memory, is only what the session does not hold: the text of the answer being
written (so a page loaded meanwhile shows it) and the last few notices, messages that are not
part of the conversation ("Allowed once.", the answer to /status).

The sender is the owner: an admin, in a private chat. Only a request of a logged-in panel
session reaches ``say`` and ``press`` (the panel's guard checks its cookie, Origin and CSRF
field); the channel listens on nothing itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from bot.bus import InboundMessage, Intake, MessageBus, OutboundMessage, StreamEvent
from bot.kinds import APPROVAL_KEY, TurnKind, with_kind
from channels.base import Channel, PreviewMode
from channels.web_channel.spec import NAME

OWNER = "owner"  # the sender id of everything said in the panel's chat
# Message ids by what they are: a reply to an "m" message is the conversation's answer, kept
# in the session; every other message in the chat is a notice.
MESSAGE_PREFIX, COMMAND_PREFIX, PRESS_PREFIX = "web-m-", "web-c-", "web-p-"
NOTES_KEPT = 20  # per conversation, newest last
EVENTS_QUEUED = 64  # per listener; more, and the browser reads the transcript again instead

EventName = Literal["state", "text", "tool", "refresh"]
State = Literal["working", "waiting", "done"]


@dataclass(frozen=True, slots=True)
class Note:
    """A message of memobot's in a conversation that is not part of it."""

    at: float  # wall clock
    text: str


@dataclass(frozen=True, slots=True)
class Writing:
    """The answer being written in a conversation: the message it answers, its text so far
    (of the model's latest reply), and whether a tool call came after that text."""

    reply_to: str | None
    text: str = ""
    after_tool: bool = False


class Listener:
    """What one browser tab is to be told, in order. Only the latest "text" of a run of them
    is kept: each holds the whole reply so far (``StreamEvent``). Events are made JSON when
    taken, not when told: a reply streams in thousands of pieces, each the whole text so far,
    and all but the last of a run are dropped unread (serialising each one cost seconds of
    the loop per tab for a long answer)."""

    def __init__(self) -> None:
        self.events: deque[tuple[EventName, dict[str, Any]]] = deque()
        self.wake = asyncio.Event()

    def push(self, event: EventName, data: dict[str, Any] | None = None) -> None:
        if event == "text" and self.events and self.events[-1][0] == "text":
            self.events[-1] = (event, data or {})
        elif len(self.events) >= EVENTS_QUEUED:
            self.events.clear()
            self.events.append(("refresh", {}))
        else:
            self.events.append((event, data or {}))
        self.wake.set()

    def take(self) -> list[tuple[EventName, str]]:
        out = [(e, json.dumps(d, ensure_ascii=False)) for e, d in self.events]
        self.events.clear()
        self.wake.clear()
        return out


class WebChannel(Channel):
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
        self._listeners: dict[str, set[Listener]] = {}
        self._writing: dict[str, Writing] = {}
        self._notes: dict[str, deque[Note]] = {}

    async def start(self) -> None:
        self.set_state("connected")

    # -- what the panel reads --

    @contextlib.contextmanager
    def listen(self, chat_id: str) -> Iterator[Listener]:
        """A listener of conversation ``chat_id`` for as long as the block runs."""
        listener = Listener()
        self._listeners.setdefault(chat_id, set()).add(listener)
        try:
            yield listener
        finally:
            listeners = self._listeners.get(chat_id, set())
            listeners.discard(listener)
            if not listeners:
                self._listeners.pop(chat_id, None)

    def writing(self, chat_id: str) -> Writing | None:
        return self._writing.get(chat_id)

    def notes(self, chat_id: str) -> list[Note]:
        return list(self._notes.get(chat_id, ()))

    # -- inbound: the owner, in the panel --

    async def say(self, chat_id: str, text: str, once: str | None = None) -> Intake:
        """Publish the owner's ``text`` (a message, or a command such as "/stop").

        ``once``: the id the page's form gave this message, so that the same form posted
        twice is one message ("duplicate" the second time), as a platform's redelivery is;
        None: a new id."""
        msg = with_kind(self._from_owner(chat_id, text, {}))
        prefix = MESSAGE_PREFIX if msg.kind is TurnKind.MESSAGE else COMMAND_PREFIX
        return await self._publish(replace(msg, message_id=f"{prefix}{once or _new_id()}"))

    async def press(self, chat_id: str, approval_id: str, choice: str) -> Intake:
        """Answer approval question ``approval_id`` as a platform's button would."""
        press = {APPROVAL_KEY: {"id": approval_id, "choice": choice}}
        msg = self._from_owner(chat_id, "", press)
        return await self._publish(replace(msg, message_id=f"{PRESS_PREFIX}{_new_id()}"))

    @staticmethod
    def _from_owner(chat_id: str, text: str, metadata: dict[str, Any]) -> InboundMessage:
        owner = {"is_admin": True, "is_group": False, **metadata}
        return InboundMessage(NAME, chat_id, OWNER, text, metadata=owner)

    async def _publish(self, msg: InboundMessage) -> Intake:
        self.touch()
        return await self.bus.publish_inbound(msg)

    # -- outbound: to the browser tabs --

    def _tell(self, chat_id: str, event: EventName, data: dict[str, Any] | None = None) -> None:
        for listener in self._listeners.get(chat_id, ()):
            listener.push(event, data)

    def preview_mode(self, chat_id: str) -> PreviewMode:
        return "direct"

    def show_stream(self, event: StreamEvent) -> None:
        chat = event.chat_id
        if event.kind == "done":
            return
        live = self._writing.get(chat)
        if live is None or live.reply_to != event.reply_to:
            live = Writing(event.reply_to)
        if event.kind == "tool":
            self._writing[chat] = replace(live, after_tool=True)
            self._tell(chat, "tool", {"line": event.text})
            return
        if live.after_tool:
            # The model's next reply: the one before and its tool calls are in the session's
            # checkpoint by now (written before the tools ran), where the transcript shows them.
            self._tell(chat, "refresh")
        self._writing[chat] = Writing(event.reply_to, event.text)
        self._tell(chat, "text", {"text": event.text})

    async def send_typing(self, chat_id: str) -> None:
        self._tell(chat_id, "state", {"state": "working"})

    async def send_chunk(
        self, msg: OutboundMessage, chunk: str, plain: bool = False, *, first: bool = False
    ) -> None:
        chat = msg.chat_id
        if APPROVAL_KEY in msg.metadata:
            self._tell(chat, "state", {"state": "waiting"})
        elif msg.final and (msg.reply_to or "").startswith(MESSAGE_PREFIX):
            live = self._writing.get(chat)
            if live is not None and live.reply_to == msg.reply_to:
                del self._writing[chat]
            self._tell(chat, "state", {"state": "done"})
        else:
            notes = self._notes.setdefault(chat, deque(maxlen=NOTES_KEPT))
            notes.append(Note(time.time(), chunk))
        # The question, the answer or the notice is shown from the session and the notes.
        self._tell(chat, "refresh")


def _new_id() -> str:
    return uuid.uuid4().hex[:16]
