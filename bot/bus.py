"""The seam between channels and the agent: frozen message values on two asyncio queues, and
ephemeral stream events beside them."""

from __future__ import annotations

import asyncio
import enum
import re
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from bot.commands import CommandSyntax
from bot.kinds import Classified, KindPolicy, Sender, TurnKind, with_kind
from bot.media import Fetched, FileRef, not_fetched, with_fetched

Intake = Literal["accepted", "duplicate", "refused"]
IntakeHook = Callable[["InboundMessage"], Awaitable[Intake]]
StreamListener = Callable[["StreamEvent"], None]
# (channel, chat) preferred -> the owner's private chats as (channel, chat id) pairs.
OwnerChats = Callable[[str, str], Awaitable[list[tuple[str, str]]]]
# A message with files named by reference -> what became of each (bot.media).
MediaFetcher = Callable[["InboundMessage"], Awaitable[list[Fetched]]]


def session_key(channel: str, chat_id: str) -> str:
    """The one name a chat has everywhere in memobot: ``channel:chat_id``."""
    return f"{channel}:{chat_id}"


_SURROGATE = re.compile("[\ud800-\udfff]")


def no_surrogates(value: Any) -> Any:
    """``value`` with every lone surrogate in its strings (also in lists and dicts) made the
    replacement character; ``value`` itself when it has none."""
    if isinstance(value, str):
        if value.isascii() or not _SURROGATE.search(value):
            return value
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        out, same = {}, True
        for k, v in value.items():
            k2, v2 = no_surrogates(k), no_surrogates(v)
            same = same and k2 is k and v2 is v
            out[k2] = v2
        return value if same else out
    if isinstance(value, list | tuple):
        items = [no_surrogates(v) for v in value]
        return (
            value if all(a is b for a, b in zip(items, value, strict=True)) else type(value)(items)
        )
    return value


def _storable(msg: InboundMessage) -> InboundMessage:
    """``msg`` as the journal can store it. A lone surrogate (JSON's "\ud800" in a text or a
    display name, an argument or file read with surrogateescape) is no text UTF-8 can hold:
    the journal refused the whole message, and it was never taken. Shown as the replacement
    character instead, wherever in the message it is."""
    fields = {
        "text": msg.text,
        "sender_id": msg.sender_id,
        "reply_to": msg.reply_to,
        "media": msg.media,
        "metadata": msg.metadata,
    }
    changed = {k: c for k, v in fields.items() if (c := no_surrogates(v)) is not v}
    if msg.files:
        records = [f.record() for f in msg.files]
        if (clean := no_surrogates(records)) is not records:
            changed["files"] = tuple(FileRef.from_record(r) for r in clean)
    return replace(msg, **changed) if changed else msg


@dataclass(frozen=True, slots=True)
class InboundMessage:
    """A message a person sent, already let in by the channel's allowFrom check (or a due job,
    or a button press). ``classified`` is set once, by ``MessageBus.publish_inbound`` (or by
    ``bot.intake`` for a pending turn read back): what kind of turn it starts, for whom."""

    channel: str
    chat_id: str
    sender_id: str
    text: str
    media: tuple[str, ...] = ()
    message_id: str | None = None  # the platform's id; used to recognise redeliveries
    reply_to: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    classified: Classified | None = None
    # Files named but not fetched yet (bot.media): the channel fetches them before the turn
    # runs, into ``media`` (or a note in ``text`` for each one it could not).
    files: tuple[FileRef, ...] = ()

    @property
    def session_key(self) -> str:
        return session_key(self.channel, self.chat_id)

    @property
    def kind(self) -> TurnKind:
        return self.classification.kind

    @property
    def sender(self) -> Sender:
        return self.classification.sender

    @property
    def policy(self) -> KindPolicy:
        return self.classification.policy

    @property
    def classification(self) -> Classified:
        if self.classified is None:
            # A bug, not an input: everything the loop sees came through the bus or intake.
            raise RuntimeError(f"message {self.message_id} was never classified")
        return self.classified


@dataclass(frozen=True, slots=True)
class OutboundMessage:
    """Something to show in a chat. ``final`` marks the answer that ends a turn."""

    channel: str
    chat_id: str
    text: str
    media: tuple[str, ...] = ()
    reply_to: str | None = None
    final: bool = False
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def session_key(self) -> str:
        return session_key(self.channel, self.chat_id)


@dataclass(frozen=True, slots=True)
class AdminNotice:
    """A notice for the owner (a wrong API key, a missing model), not an answer to anyone:
    it goes to every channel's admins, in their private chats (the channels know where those
    are; the core does not)."""

    text: str


class Activity(enum.Enum):
    """What a turn is doing, as far as its chat should see: only ``WORKING`` shows (typing,
    a draft kept up); the others stop showing it."""

    WORKING = "working"
    WAITING_FOR_PERSON = "waiting for a person"  # an approval question is open
    WAITING_FOR_MODEL = "waiting for the model"  # a model outage: the turn waits
    DONE = "done"  # the turn has given its answer


@dataclass(frozen=True, slots=True)
class TurnActivity:
    """The one activity signal of the turn answering ``reply_to`` in a chat. The core says
    what the turn does; the channel manager alone turns that into platform calls (typing,
    drafts)."""

    channel: str
    chat_id: str
    reply_to: str | None
    activity: Activity

    @property
    def session_key(self) -> str:
        return session_key(self.channel, self.chat_id)


# What the core hands the channel manager on the outbound queue. An ``OutboundMessage`` is an
# answer (``final``: kept in the delivery ledger, exactly once) or a notice (shown once, or
# an approval question); stream deltas go beside the queue (``publish_stream``), never on it.
Outbound = OutboundMessage | TurnActivity | AdminNotice


@dataclass(frozen=True, slots=True)
class StreamEvent:
    """Ephemeral news of an answer being written (DESIGN.md section 11): it may be dropped or
    coalesced, and is never the answer itself (the ``final`` OutboundMessage is).

    ``kind`` "text": ``text`` is the whole text of the model's reply so far (not a delta: the
    latest event alone says everything, so coalescing loses nothing); a text that does not go
    on from the one before with no "tool" event between is the same request retried, and
    replaces it; "tool": a tool call starts (or was tried: each reply that made calls has
    one), ``text`` names it; "done": the model has written the answer, the final message
    follows (a preview now would only spend a send the answer needs). ``reply_to`` is the
    message the turn answers, as in the final.
    """

    channel: str
    chat_id: str
    reply_to: str | None
    kind: Literal["text", "tool", "done"]
    text: str

    @property
    def session_key(self) -> str:
        return session_key(self.channel, self.chat_id)


class MessageBus:
    """Inbound and outbound queues shared by every channel and the one agent loop.

    The agent installs an intake hook that makes each inbound message durable before
    ``publish_inbound`` returns, so a channel may confirm receipt to its platform (Telegram
    offset, Slack ack) exactly when ``publish_inbound`` answers "accepted" or "duplicate".
    """

    def __init__(self) -> None:
        self.inbound: asyncio.Queue[InboundMessage] = asyncio.Queue()
        self.outbound: asyncio.Queue[Outbound] = asyncio.Queue()
        self._intake: IntakeHook | None = None
        self._stream: StreamListener | None = None
        self._owner_chats: OwnerChats | None = None
        self._fetch_media: MediaFetcher | None = None
        # Channels (by name) that show answers as they are written: their turns stream.
        self.streaming: set[str] = set()
        # How each channel (by name) writes commands, for its /help (default: "/name").
        self.command_syntax: dict[str, CommandSyntax] = {}
        self.accepting = True

    def set_intake(self, hook: IntakeHook) -> None:
        self._intake = hook

    async def publish_inbound(self, msg: InboundMessage) -> Intake:
        """Hand a message to the agent.

        "accepted": stored and queued; "duplicate": seen before (already answered or queued),
        ignored; "refused": memobot is shutting down and did not store it, so the channel must
        not confirm it to the platform (it will be redelivered after the restart).
        """
        if not self.accepting:
            return "refused"
        if msg.message_id is None:  # sources without ids still need one for the ledger
            msg = replace(msg, message_id=f"local-{uuid.uuid4().hex[:12]}")
        msg = _storable(msg)
        msg = with_kind(msg)  # the one place a published message gets its kind
        verdict: Intake = await self._intake(msg) if self._intake else "accepted"
        if verdict == "accepted":
            await self.inbound.put(msg)
        return verdict

    async def publish_outbound(self, msg: Outbound) -> None:
        await self.outbound.put(msg)

    def on_stream(self, listener: StreamListener | None) -> None:
        """Who receives stream events (the channel manager); without one they are dropped."""
        self._stream = listener

    def on_owner_chats(self, finder: OwnerChats | None) -> None:
        """Who knows where the owner can be asked (the channel manager: the channels know
        their admins' private chats; the core does not)."""
        self._owner_chats = finder

    def on_fetch_media(self, fetcher: MediaFetcher | None) -> None:
        """Who fetches the files a message names (the channel manager: each message's own
        channel does, ``Channel.fetch_media``)."""
        self._fetch_media = fetcher

    async def fetch_media(self, msg: InboundMessage) -> InboundMessage:
        """``msg`` with the files it names fetched (``bot.media.with_fetched``); ``msg`` itself
        when it names none. Never raises for a file: one that cannot be had is a note."""
        if not msg.files:
            return msg
        if self._fetch_media is None:
            results = not_fetched(msg.files, f"no {msg.channel} channel is running here")
        else:
            results = await self._fetch_media(msg)
        return with_fetched(msg, results)

    async def owner_chats(self, channel: str, chat_id: str) -> list[tuple[str, str]]:
        """The admins' private chats to ask an unattended turn's question in, preferring
        ``channel`` (and the chat ``chat_id`` itself when it is one of them); [] when there
        is none, or nobody to ask (no channels)."""
        if self._owner_chats is None:
            return []
        return await self._owner_chats(channel, chat_id)

    def publish_stream(self, event: StreamEvent) -> None:
        """Hand a stream event over at once, never waiting: no queue, so a slow platform can
        never make the model's stream (or memory) wait; the listener keeps the latest."""
        if self._stream is not None:
            self._stream(event)

    async def consume_inbound(self) -> InboundMessage:
        return await self.inbound.get()

    async def consume_outbound(self) -> Outbound:
        return await self.outbound.get()
