"""The seam between channels and the agent: frozen message values on two asyncio queues."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any


def session_key(channel: str, chat_id: str) -> str:
    """The one name a chat has everywhere in memobot: ``channel:chat_id``."""
    return f"{channel}:{chat_id}"


@dataclass(frozen=True, slots=True)
class InboundMessage:
    """A message a person sent, already let in by the channel's allowFrom check."""

    channel: str
    chat_id: str
    sender_id: str
    text: str
    media: tuple[str, ...] = ()
    message_id: str | None = None  # the platform's id; used to recognise redeliveries
    reply_to: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def session_key(self) -> str:
        return session_key(self.channel, self.chat_id)


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


class MessageBus:
    """Inbound and outbound queues shared by every channel and the one agent loop."""

    def __init__(self) -> None:
        self.inbound: asyncio.Queue[InboundMessage] = asyncio.Queue()
        self.outbound: asyncio.Queue[OutboundMessage] = asyncio.Queue()

    async def publish_inbound(self, msg: InboundMessage) -> None:
        await self.inbound.put(msg)

    async def publish_outbound(self, msg: OutboundMessage) -> None:
        await self.outbound.put(msg)

    async def consume_inbound(self) -> InboundMessage:
        return await self.inbound.get()

    async def consume_outbound(self) -> OutboundMessage:
        return await self.outbound.get()
