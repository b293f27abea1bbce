"""The local terminal chat: one-shot, piped and interactive modes over the same bus.

Unlike the platform channels the terminal has a single person at it, so it waits for the final
answer to each message before taking the next line; that keeps piped input answered in order.
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import Callable
from typing import TextIO

from bot.bus import InboundMessage, MessageBus, OutboundMessage

CHANNEL = "cli"


class TerminalChannel:
    name = CHANNEL

    def __init__(self, bus: MessageBus, chat_id: str, out: TextIO | None = None) -> None:
        self.bus = bus
        self.chat_id = chat_id
        self.out = out or sys.stdout
        self._waiting: dict[str, asyncio.Future[str]] = {}
        self._pump: asyncio.Task[None] | None = None
        self.printer: Callable[[str], None] = self._print

    def _print(self, text: str) -> None:
        self.out.write(text.rstrip("\n") + "\n")
        self.out.flush()

    async def start(self) -> None:
        self._pump = asyncio.create_task(self._deliver(), name="terminal-outbound")

    async def stop(self) -> None:
        if self._pump:
            self._pump.cancel()
            await asyncio.gather(self._pump, return_exceptions=True)

    async def _deliver(self) -> None:
        while True:
            msg: OutboundMessage = await self.bus.consume_outbound()
            if msg.chat_id != self.chat_id or msg.channel != CHANNEL:
                continue  # another session's resumed turn; nobody is here to read it
            self.printer(msg.text)
            waiter = self._waiting.get(msg.reply_to or "")
            if msg.final and waiter and not waiter.done():
                waiter.set_result(msg.text)

    async def send(self, text: str) -> str:
        """Submit one line as a message and wait until its final answer has been printed."""
        message_id = f"cli-{uuid.uuid4().hex[:12]}"
        done: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._waiting[message_id] = done
        try:
            await self.bus.publish_inbound(
                InboundMessage(CHANNEL, self.chat_id, "user", text, message_id=message_id)
            )
            return await done
        finally:
            self._waiting.pop(message_id, None)
