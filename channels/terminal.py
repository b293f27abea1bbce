"""The local terminal chat: one-shot, piped and interactive modes over the same bus.

Unlike the platform channels the terminal has a single person at it, so it waits for the final
answer to each message before taking the next line; that keeps piped input answered in order.

Streaming: the answer is printed as the model writes it; the final answer then adds only what
was not printed yet (normally its line end), so stdout carries each answer once. While tools
run, an interactive terminal shows one dim line per tool call (on stdout, which is the
terminal then; never in piped output).
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TextIO

from bot.bus import InboundMessage, MessageBus, OutboundMessage, StreamEvent
from channels.base import Channel, PreviewMode
from channels.errors import PermanentError

CHANNEL = "cli"
OUTCOME_KEY = "outcome"  # bot.turn.OUTCOME_KEY: channels do not import the core's loop
THINKING = "thinking..."
APPROVAL_PROMPT = "allow? [y]es once / [a]lways in this chat / [N]o: "
APPROVAL_ANSWERS = {"y": "once", "yes": "once", "a": "always", "always": "always"}
# Reads one answer line (the prompt is shown first); None at the end of input.
ReadAnswer = Callable[[str], Awaitable[str | None]]
ERASE_LINE = "\r\x1b[K"  # carriage return, then erase to the end of the line
DIM, RESET = "\x1b[2m", "\x1b[0m"
TOOL_LINE = DIM + "  ↳ {call}" + RESET + "\n"


class TerminalChannel(Channel):
    name = CHANNEL

    def __init__(
        self,
        bus: MessageBus,
        chat_id: str,
        out: TextIO | None = None,
        err: TextIO | None = None,
        thinking: bool = False,
        streaming: bool = True,
        show_tools: bool = False,
    ) -> None:
        """``thinking``: show a "thinking…" line while an answer is worked on (a terminal
        only: the line is erased with a control sequence when the answer comes).
        ``streaming``: print answers as they are written. ``show_tools``: a dim line per
        tool call (a terminal only)."""
        super().__init__(bus)
        self.chat_id = chat_id
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.thinking = thinking
        self.streaming = streaming
        self.show_tools = show_tools
        self._waiting: dict[str, asyncio.Future[OutboundMessage]] = {}
        self._thinking_shown = False
        self._printed: dict[str | None, str] = {}  # streamed text on stdout, per answer
        self._mid_line = False  # stdout's last line is not finished
        self.closed = False  # stdout's reader went away
        # Set by the CLI: how an approval question is answered (y/N from stdin or a prompt).
        self.read_answer: ReadAnswer | None = None
        self._prompts: set[asyncio.Task[None]] = set()

    async def send_typing(self, chat_id: str) -> None:
        if not self.thinking or chat_id != self.chat_id or not self._waiting:
            return
        if self._printed or self._mid_line:
            return  # the answer is being printed: "thinking..." would land inside it
        if not self._thinking_shown:
            self.out.write(THINKING)
            self.out.flush()
            self._thinking_shown = True

    def _erase_thinking(self) -> None:
        if self._thinking_shown:
            self.out.write(ERASE_LINE)
            self._thinking_shown = False

    def preview_mode(self, chat_id: str) -> PreviewMode:
        return "direct"

    def _end_line(self) -> None:
        if self._mid_line:
            self.out.write("\n")
            self._mid_line = False

    def show_stream(self, event: StreamEvent) -> None:
        if event.chat_id != self.chat_id or self.closed or event.kind == "done":
            return
        try:
            self._erase_thinking()
            if event.kind == "tool":
                if self.show_tools:
                    self._end_line()
                    self.out.write(TOOL_LINE.format(call=event.text))
                    self.out.flush()
                return
            printed = self._printed.get(event.reply_to, "")
            if event.text.startswith(printed):
                new = event.text[len(printed) :]
            else:  # the model's next request (after tools), or a retry: a fresh line
                self._end_line()
                new = event.text
            if new:
                self.out.write(new)
                self.out.flush()
                self._mid_line = not event.text.endswith("\n")
            self._printed[event.reply_to] = event.text
        except BrokenPipeError:
            self.closed = True

    async def send_chunk(self, msg: OutboundMessage, chunk: str, plain: bool = False) -> None:
        if msg.chat_id != self.chat_id:
            # Another terminal session's answer: nobody here can read it. Raising keeps it in
            # the ledger, so `memobot agent -s cli:<that chat>` prints it next time.
            raise PermanentError(f"cli:{msg.chat_id} is not the session open in this terminal")
        # A turn that failed or was stopped says so on stderr: stdout carries answers only.
        request = msg.metadata.get("approval")
        ok = msg.metadata.get(OUTCOME_KEY, "ok") == "ok" and request is None
        stream = self.out if ok else self.err
        printed = self._printed.pop(msg.reply_to, "") if msg.final else ""
        if printed and chunk.startswith(printed):
            chunk = chunk[len(printed) :]  # the rest of what was streamed (a stop mark...)
            if stream is self.err:
                chunk = chunk.strip()
        elif printed or self._mid_line:
            self._end_line_safely()
        if not self.closed:
            try:
                self._erase_thinking()
                if stream is self.err:
                    self._end_line()
                self.out.flush()
                if chunk.strip() or stream is self.out:
                    stream.write(chunk.rstrip("\n") + "\n")
                self._mid_line = False
                stream.flush()
            except BrokenPipeError:
                # The reader went away (`| head`): it read what it wanted. The answer counts
                # as delivered (printing it again next time would surprise), and the CLI
                # ends quietly.
                self.closed = True
        waiter = self._waiting.get(msg.reply_to or "")
        if msg.final and waiter and not waiter.done():
            waiter.set_result(msg)
        if isinstance(request, dict):
            self._start_prompt(request)

    # -- approval questions --

    def _start_prompt(self, request: dict[str, Any]) -> None:
        """Ask y/N in the background: the send worker must stay free for the timeout notice."""
        task = asyncio.create_task(self._prompt(str(request.get("id", ""))))
        self._prompts.add(task)
        task.add_done_callback(self._prompts.discard)

    async def _prompt(self, approval_id: str) -> None:
        if self.read_answer is None:
            return  # nobody can answer here: the question times out (a deny)
        try:
            line = await self.read_answer(APPROVAL_PROMPT)
        except (EOFError, KeyboardInterrupt):
            line = None
        choice = APPROVAL_ANSWERS.get((line or "").strip().lower(), "deny")
        await self.bus.publish_inbound(
            InboundMessage(
                CHANNEL,
                self.chat_id,
                "user",
                "",
                message_id=f"cli-press-{uuid.uuid4().hex[:12]}",
                metadata={"approval": {"id": approval_id, "choice": choice}},
            )
        )

    async def stop(self) -> None:
        for task in list(self._prompts):
            task.cancel()
        await asyncio.gather(*self._prompts, return_exceptions=True)

    def _end_line_safely(self) -> None:
        try:
            self._end_line()
        except BrokenPipeError:
            self.closed = True

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
