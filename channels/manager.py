"""Routes outbound messages to their channel, recording each answer in the delivery ledger."""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from bot import failpoints
from bot.bus import MessageBus, OutboundMessage
from channels.base import Channel

log = logging.getLogger(__name__)


class Ledger(Protocol):
    def sending(self, msg: OutboundMessage) -> bool: ...
    def sent(self, msg: OutboundMessage) -> None: ...
    def failed(self, msg: OutboundMessage) -> None: ...


class ChannelManager:
    def __init__(self, bus: MessageBus, ledger: Ledger, channels: list[Channel]) -> None:
        self.bus = bus
        self.ledger = ledger
        self.channels = {c.name: c for c in channels}
        self._pump: asyncio.Task[None] | None = None

    async def start(self) -> None:
        for channel in self.channels.values():
            await channel.start()
        self._pump = asyncio.create_task(self._run(), name="outbound")

    async def stop(self) -> None:
        if self._pump:
            self._pump.cancel()
            await asyncio.gather(self._pump, return_exceptions=True)
        for channel in self.channels.values():
            await channel.stop()

    async def flush(self, wait_seconds: float = 10.0) -> None:
        """Wait until everything queued so far has been handed to its channel."""
        try:
            await asyncio.wait_for(self.bus.outbound.join(), wait_seconds)
        except TimeoutError:
            log.warning("outbound queue not empty after %.0f s", wait_seconds)

    async def _run(self) -> None:
        while True:
            msg = await self.bus.consume_outbound()
            try:
                await self.deliver(msg)
            finally:
                self.bus.outbound.task_done()

    async def deliver(self, msg: OutboundMessage) -> None:
        channel = self.channels.get(msg.channel)
        if channel is None:
            log.warning(
                "no running channel %r session=%s; a final answer stays queued for the next start",
                msg.channel,
                msg.session_key,
            )
            return
        if not self.ledger.sending(msg):
            return
        try:
            await channel.send(msg)
        except Exception as exc:
            log.error("send failed session=%s: %s", msg.session_key, exc)
            self.ledger.failed(msg)
            return
        failpoints.hit("after_send")
        self.ledger.sent(msg)
