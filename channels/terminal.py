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
OUTCOME_KEY = "outcome"  # bot.turn.OUTCOME_KEY: channels do not import the core's loop
THINKING = "thinking..."
ERASE_LINE = "\r\x1b[K"  # carriage return, then erase to the end of the line


class TerminalChannel(Channel):
    name = CHANNEL

    def __init__(
        self,
        bus: MessageBus,
        chat_id: str,
        out: TextIO | None = None,
        err: TextIO | None = None,
        thinking: bool = False,
    ) -> None:
        """``thinking``: show a "thinking…" line while an answer is worked on (a terminal
        only: the line is erased with a control sequence when the answer comes)."""
        super().__init__(bus)
        self.chat_id = chat_id
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.thinking = thinking
        self._waiting: dict[str, asyncio.Future[OutboundMessage]] = {}
        self._thinking_shown = False
        self.closed = False  # stdout's reader went away

    async def send_typing(self, chat_id: str) -> None:
        if not self.thinking or chat_id != self.chat_id or not self._waiting:
            return
        if not self._thinking_shown:
            self.out.write(THINKING)
            self.out.flush()
            self._thinking_shown = True

    def _erase_thinking(self) -> None:
        if self._thinking_shown:
            self.out.write(ERASE_LINE)
            self._thinking_shown = False

    async def send_chunk(self, msg: OutboundMessage, chunk: str, plain: bool = False) -> None:
        if msg.chat_id != self.chat_id:
            # Another terminal session's answer: nobody here can read it. Raising keeps it in
            # the ledger, so `memobot agent -s cli:<that chat>` prints it next time.
            raise PermanentError(f"cli:{msg.chat_id} is not the session open in this terminal")
        # A turn that failed or was stopped says so on stderr: stdout carries answers only.
        stream = self.out if msg.metadata.get(OUTCOME_KEY, "ok") == "ok" else self.err
        if not self.closed:
            try:
                self._erase_thinking()
                self.out.flush()
                stream.write(chunk.rstrip("\n") + "\n")
                stream.flush()
            except BrokenPipeError:
                # The reader went away (`| head`): it read what it wanted. The answer counts
                # as delivered (printing it again next time would surprise), and the CLI
                # ends quietly.
                self.closed = True
        waiter = self._waiting.get(msg.reply_to or "")
        if msg.final and waiter and not waiter.done():
            waiter.set_result(msg)

    async def ask(self, text: str) -> OutboundMessage | None:
        """Submit one line as a message and wait until its final answer has been printed.

        The answer's ``metadata["outcome"]`` says how the turn ended ("ok" when absent). None
        when memobot did not take the message (it is shutting down).
        """
        message_id = f"cli-{uuid.uuid4().hex[:12]}"
        done: asyncio.Future[OutboundMessage] = asyncio.get_running_loop().create_future()
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
            if not self.closed:
                self._erase_thinking()
