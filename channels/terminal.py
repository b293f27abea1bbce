"""The local terminal chat: one-shot, piped and interactive modes over the same bus.

Unlike the platform channels the terminal has a single person at it, so it waits for the final
answer to each message before taking the next line; that keeps piped input answered in order.
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from typing import TextIO

from bot.bus import InboundMessage, MessageBus, OutboundMessage
from channels.base import Channel
from channels.errors import PermanentError

CHANNEL = "cli"


class TerminalChannel(Channel):
    name = CHANNEL

    def __init__(self, bus: MessageBus, chat_id: str, out: TextIO | None = None) -> None:
        super().__init__(bus)
        self.chat_id = chat_id
        self.out = out or sys.stdout
        self._waiting: dict[str, asyncio.Future[str]] = {}

    async def send_chunk(self, msg: OutboundMessage, chunk: str, plain: bool = False) -> None:
        if msg.chat_id != self.chat_id:
            # Another terminal session's answer: nobody here can read it. Raising keeps it in
            # the ledger, so `memobot agent -s cli:<that chat>` prints it next time.
            raise PermanentError(f"cli:{msg.chat_id} is not the session open in this terminal")
        self.out.write(chunk.rstrip("\n") + "\n")
        self.out.flush()
        waiter = self._waiting.get(msg.reply_to or "")
        if msg.final and waiter and not waiter.done():
            waiter.set_result(msg.text)

    async def ask(self, text: str) -> str | None:
        """Submit one line as a message and wait until its final answer has been printed.

        None when memobot did not take the message (it is shutting down).
        """
        message_id = f"cli-{uuid.uuid4().hex[:12]}"
        done: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._waiting[message_id] = done
        try:
            verdict = await self.bus.publish_inbound(
                InboundMessage(CHANNEL, self.chat_id, "user", text, message_id=message_id)
            )
            if verdict != "accepted":
                return None
            return await done
        finally:
            self._waiting.pop(message_id, None)
