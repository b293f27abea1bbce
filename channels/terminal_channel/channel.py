"""The local terminal chat: one-shot, piped and interactive modes over the same bus.

Unlike the platform channels the terminal has a single person at it, so it waits for the final
answer to each message before taking the next line; that keeps piped input answered in order.

Streaming: the answer is printed as the model writes it; the final answer then adds only what
was not printed yet (normally its line end), so stdout carries each answer once. While tools
run, an interactive terminal shows one dim line per tool call (on stdout, which is the
terminal then; never in piped output).

Markdown: an interactive terminal shows each answer rendered
(``channels.terminal_channel.live``), as it is written. On a terminal the model's text is
stripped of control characters (an escape sequence from a hostile web page must not reach
the terminal); pipes get it byte for byte.
Without colour (``NO_COLOR``, ``TERM=dumb``: ``colour_allowed``) no escape sequence is written
at all, and answers are printed as the model wrote them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any, TextIO

from bot.bus import InboundMessage, MessageBus, OutboundMessage, StreamEvent
from bot.gate.question import QuestionView, question_plain
from channels.base import Channel, PreviewMode
from channels.errors import PermanentError
from channels.formatting import markdown_to_ansi, strip_controls
from channels.terminal_channel.live import LiveMarkdown, cursor_rows, erase_rows, terminal_columns

CHANNEL = "cli"
OUTCOME_KEY = "outcome"  # bot.turn.OUTCOME_KEY: channels do not import the core's loop
THINKING = "thinking..."
APPROVAL_PROMPT = "allow? [y]es once / [a]lways in this chat / [N]o: "
PRESS_PREFIX = "cli-press-"  # the message ids of approval answers typed here
APPROVAL_ANSWERS = {"y": "once", "yes": "once", "a": "always", "always": "always"}
# Reads one answer line (the prompt is shown first); None at the end of input.
ReadAnswer = Callable[[str], Awaitable[str | None]]
ERASE_LINE = "\r\x1b[K"  # carriage return, then erase to the end of the line
DIM, RESET = "\x1b[2m", "\x1b[0m"
TOOL_LINE = "  ↳ {call}"


def colour_allowed(environ: Mapping[str, str]) -> bool:
    """Whether a terminal may get escape sequences: not when ``NO_COLOR`` is set to anything
    but the empty string (https://no-color.org), nor on a ``TERM=dumb`` terminal."""
    return not environ.get("NO_COLOR") and environ.get("TERM") != "dumb"


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
        markdown: bool = False,
        ansi: bool = True,
        clean: bool = False,
        clean_err: bool = False,
        columns: Callable[[], int] | None = None,
    ) -> None:
        """``thinking``: show a "thinking…" line while an answer is worked on (a terminal
        only: the line is erased when the answer comes). ``streaming``: print answers as they
        are written. ``show_tools``: a dim line per tool call (a terminal only).
        ``markdown``: render answers as Markdown (needs ``ansi``, the terminal taking escape
        sequences; without it nothing writes one). ``clean``, ``clean_err``: strip control
        characters from the model's text on stdout, on stderr (each when it is a terminal:
        an approval question must show the command as it will run). ``columns``: the
        terminal's width (default: asked)."""
        super().__init__(bus)
        self.chat_id = chat_id
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.thinking = thinking
        self.streaming = streaming
        self.show_tools = show_tools
        self.ansi = ansi
        self.markdown = markdown and ansi
        self.clean = clean
        self.clean_err = clean_err
        self.columns = columns or (lambda: terminal_columns(self.out))
        self._live: LiveMarkdown | None = None  # the answer being rendered as it is written
        self._live_base = 0  # where its text starts in the streamed text
        self._waiting: dict[str, asyncio.Future[OutboundMessage]] = {}
        # The status line on screen under the prompt while an answer is awaited ("" for
        # none): "thinking...", or a retry notice in its place.
        self._status = ""
        self._status_timer: asyncio.TimerHandle | None = None
        self._printed: dict[str | None, str] = {}  # streamed text on stdout, per answer
        self._streamed: dict[str | None, str] = {}  # the model's text behind it, per answer
        # (answer, its streamed text on the screen's last rows, from the start of their first
        # row) while nothing else was written below it: what a retry erases (plain output;
        # the Markdown view, ``_live``, knows its own rows).
        self._block: tuple[str | None, str] | None = None
        self._live_reply: str | None = None  # the answer ``_live`` shows
        self._after_tool: set[str | None] = set()  # answers whose next text is a new reply
        self._thread = threading.get_ident()  # the event loop's: the only one that redraws
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
        if not self._status:
            self._write_status(THINKING)

    def show_status(self, text: str, lasts: float = 0.0) -> bool:
        """Show ``text`` (one line: a retry notice) in place of "thinking..." while an answer
        is awaited and none of it is on screen yet; "thinking..." comes back after ``lasts``
        seconds. False when it is not shown (not a terminal, the answer is being printed,
        or not the event loop's thread): the caller says it some other way."""
        if (
            not self.thinking
            or not self._waiting
            or self._printed
            or self._mid_line
            or self.closed
            or threading.get_ident() != self._thread
        ):
            return False
        line = strip_controls(" ".join(text.split()))[: max(20, self.columns() - 1)]
        try:
            self._erase_thinking()
            self._write_status(line)
        except BrokenPipeError:
            self.closed = True
            return True
        if lasts > 0:
            self._status_timer = asyncio.get_running_loop().call_later(
                lasts, self._status_over, line
            )
        return True

    def _status_over(self, line: str) -> None:
        """A notice's time is up (the retry is running): "thinking..." again."""
        if self._status != line or self.closed:
            return
        try:
            self._erase_thinking()
            self._write_status(THINKING)
        except BrokenPipeError:
            self.closed = True

    def _write_status(self, line: str) -> None:
        self.out.write(line)
        self.out.flush()
        self._status = line

    def _erase_thinking(self) -> None:
        if self._status_timer is not None:
            self._status_timer.cancel()
            self._status_timer = None
        if self._status:
            self.out.write(ERASE_LINE if self.ansi else f"\r{' ' * len(self._status)}\r")
            self._status = ""

    def _clean(self, text: str, stream: TextIO | None = None) -> str:
        clean = self.clean_err if stream is not None and stream is self.err else self.clean
        return strip_controls(text) if clean else text

    def _shown_text(self, reply_to: str | None, raw: str) -> str:
        """The streamed text as this terminal shows it: cleaned one delta at a time (cleaning
        the whole text per event made a long answer quadratic) and without leading
        whitespace, which the stored answer will not have either (the runner strips it)."""
        before = self._streamed.get(reply_to, "")
        shown = self._printed.get(reply_to, "")
        if before and raw.startswith(before):
            shown += self._clean(raw[len(before) :])
        else:  # the first text, or the model's next request (after tools): from the start
            shown = self._clean(raw)
        self._streamed[reply_to] = raw
        return shown.lstrip()

    @staticmethod
    def _after(text: str, printed: str) -> str | None:
        """What the final ``text`` adds to the ``printed`` stream; None when it does not go
        on from it. The stored answer lost the stream's trailing whitespace (stripped, or
        the stop mark put after it), so that may differ."""
        for shown in (printed, printed.rstrip()):
            if shown and text.startswith(shown):
                return text[len(shown) :]
        return None

    def preview_mode(self, chat_id: str) -> PreviewMode:
        return "direct"

    def _end_line(self) -> None:
        if self._live is not None:
            self._live.finish()  # what is left raw on screen is rendered, the line ended
            self._live = None
        elif self._mid_line:
            self.out.write("\n")
        self._mid_line = False

    def show_stream(self, event: StreamEvent) -> None:
        if event.chat_id != self.chat_id or self.closed or event.kind == "done":
            return
        try:
            self._erase_thinking()
            if event.kind == "tool":
                # The model's next request (its text from "" again) is a new reply.
                self._after_tool.add(event.reply_to)
                if self.show_tools:
                    self._end_line()
                    self._block = None
                    line = TOOL_LINE.format(call=strip_controls(event.text))
                    self.out.write((DIM + line + RESET if self.ansi else line) + "\n")
                    self.out.flush()
                return
            printed = self._printed.get(event.reply_to, "")
            text = self._shown_text(event.reply_to, event.text)
            # A text that does not go on from what this reply showed, with no tool call in
            # between, is the same request sent again (a stream cut by an error, retried):
            # it replaces what was shown (llm.TextSink), where escape sequences can erase it.
            retry = event.reply_to not in self._after_tool and not text.startswith(printed)
            self._after_tool.discard(event.reply_to)
            if self.markdown:
                self._stream_rendered(event.reply_to, text, printed, retry)
            else:
                self._stream_plain(event.reply_to, text, printed, retry)
            self._printed[event.reply_to] = text
        except BrokenPipeError:
            self.closed = True

    def _stream_plain(self, reply_to: str | None, text: str, printed: str, retry: bool) -> None:
        block = self._block[1] if self._block and self._block[0] == reply_to else None
        if text.startswith(printed):
            new = text[len(printed) :]
        elif retry and self.ansi and block is not None:
            self._erase_block(block)  # the retried request's text is written where it was
            self._mid_line, block, new = False, "", text
        else:  # the model's next request (after tools), or a retry we cannot erase
            self._end_line()
            block, new = "", text
        if new:
            self.out.write(new)
            self.out.flush()
            self._mid_line = not text.endswith("\n")
        self._block = (reply_to, (block or "") + new)

    def _erase_block(self, block: str) -> None:
        self.out.write(erase_rows(cursor_rows(block.expandtabs(), self.columns())))

    def _stream_rendered(self, reply_to: str | None, text: str, printed: str, retry: bool) -> None:
        if self._live is not None and retry:
            self._live.erase()  # the retried request's text is written where it was
            self._live, self._live_base = LiveMarkdown(self.out, self.columns), 0
        elif self._live is None or not text.startswith(printed):
            # A fresh line: the first text, the model's next request (after tools).
            # After tools the text may go on from what was shown: only the rest is new.
            base = len(printed) if self._live is None and text.startswith(printed) else 0
            self._end_line()
            self._live, self._live_base = LiveMarkdown(self.out, self.columns), base
        self._live_reply = reply_to
        self._live.write(text[self._live_base :])
        self._mid_line = self._live.mid_line

    @contextlib.contextmanager
    def above_the_answer(self) -> Iterator[None]:
        """Around writing something else to this terminal's screen (a log line, when stderr
        is the same terminal): the answer being streamed is taken off the screen first and
        written again below it, so the line does not land inside the text and the answer
        stays whole on the last rows, where a retried request can replace it. Written as it
        comes outside a stream, without escape sequences, or from another thread."""
        live, block = self._live, self._block
        status = self._status
        if self.closed or threading.get_ident() != self._thread:
            live = block = None
            status = ""
        elif not self.ansi:
            live = block = None
        try:
            if status:
                # Only the line is taken away: the notice's timer keeps running.
                self.out.write(ERASE_LINE if self.ansi else f"\r{' ' * len(status)}\r")
                self.out.flush()
            elif live is not None:
                live.erase()
            elif block is not None:
                self._erase_block(block[1])
                self.out.flush()
        except BrokenPipeError:
            self.closed, live, block = True, None, None
        try:
            yield
        finally:
            try:
                if status:
                    self.out.write(status)
                    self.out.flush()
                elif live is not None:
                    raw = self._printed.get(self._live_reply, "")[self._live_base :]
                    self._live = LiveMarkdown(self.out, self.columns)
                    self._live.write(raw)
                elif block is not None:
                    self.out.write(block[1])
                    self.out.flush()
            except BrokenPipeError:
                self.closed = True

    def _show_rendered(self, text: str, printed: str) -> None:
        """The final answer on stdout, rendered: it completes what was streamed."""
        rest = self._after(text, printed)
        if rest is not None:
            if self._live is not None:
                self._live.write(printed[self._live_base :] + rest)
                self._end_line()
                return
            text = rest.strip("\n")
            if not text.strip():
                return
        self._end_line()
        self.out.write(markdown_to_ansi(text.rstrip("\n")) + "\n")
        self.out.flush()

    def _show_plain(self, text: str, printed: str, stream: TextIO) -> None:
        rest = self._after(text, printed)
        if rest is not None:
            text = rest  # the rest of what was streamed (a stop mark...)
            if stream is self.err:
                text = text.strip()
            elif not rest.strip() and not self._mid_line:
                self.out.flush()
                return  # all of it is on screen, its line ended
        elif printed or self._mid_line:
            self._end_line()
        if stream is self.err:
            self._end_line()
        self.out.flush()
        if text.strip() or stream is self.out:
            stream.write(text.rstrip("\n") + "\n")
        self._mid_line = False
        stream.flush()

    def render_question(self, view: QuestionView) -> tuple[str, bool]:
        # No length limit here: the whole text, every line of it behind the gutter.
        return question_plain(view)

    async def send_chunk(
        self, msg: OutboundMessage, chunk: str, plain: bool = False, *, first: bool = False
    ) -> None:
        if msg.chat_id != self.chat_id:
            # Another terminal session's answer: nobody here can read it. Raising keeps it in
            # the ledger, so `memobot agent -s cli:<that chat>` prints it next time.
            raise PermanentError(f"cli:{msg.chat_id} is not the session open in this terminal")
        # A turn that failed or was stopped says so on stderr: stdout carries answers only.
        request = msg.metadata.get("approval")
        ok = msg.metadata.get(OUTCOME_KEY, "ok") == "ok" and request is None
        stream = self.out if ok else self.err
        printed = self._printed.pop(msg.reply_to, "") if msg.final else ""
        if msg.final:
            self._streamed.pop(msg.reply_to, None)
            self._after_tool.discard(msg.reply_to)
        self._block = None  # what is written now goes below the streamed text
        if (msg.reply_to or "").startswith(PRESS_PREFIX):
            stream = self.err  # "Allowed once.": about the prompt, not an answer
        text = self._clean(chunk, stream)
        if not self.closed:
            try:
                self._erase_thinking()
                if self.markdown and stream is self.out:
                    self._show_rendered(text, printed)
                else:
                    self._show_plain(text, printed, stream)
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
                message_id=f"{PRESS_PREFIX}{uuid.uuid4().hex[:12]}",
                metadata={"approval": {"id": approval_id, "choice": choice}},
            )
        )

    async def stop(self) -> None:
        for task in list(self._prompts):
            task.cancel()
        await asyncio.gather(*self._prompts, return_exceptions=True)

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


class LogsAboveTheAnswer(logging.Handler):
    """Hands each record to ``inner`` inside ``terminal.above_the_answer()`` when ``inner``
    writes to the terminal's own screen (``same_screen``): a log line comes above the answer
    being streamed and above the status line, never glued to it. A record that carries a
    retry notice (``bot.llm.RetryNotice``) becomes the status line instead, while it can be
    shown there; on the same screen the log line would only say it again."""

    def __init__(
        self, inner: logging.Handler, terminal: TerminalChannel, same_screen: bool = True
    ) -> None:
        super().__init__(inner.level)
        self.inner = inner
        self.terminal = terminal
        self.same_screen = same_screen

    def handle(self, record: logging.LogRecord) -> bool | logging.LogRecord:
        notice = getattr(record, "retry_notice", None)
        if notice is not None and self.inner.level <= record.levelno:
            shown = self.terminal.show_status(notice.status_line(), notice.delay)
            if shown and self.same_screen:
                return True
        if not self.same_screen:
            return self.inner.handle(record)
        with self.terminal.above_the_answer():
            return self.inner.handle(record)

    def emit(self, record: logging.LogRecord) -> None:
        self.inner.emit(record)
