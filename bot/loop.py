"""The agent loop: the one consumer of the inbound queue.

Turns of one chat run in order (one worker per busy session); different chats run in parallel,
at most ``agent.maxConcurrentTurns`` at once. Every accepted message gets exactly one ``final``
outbound message, whatever happens to its turn: an answer, an error message, or "stopped".
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from bot.bus import InboundMessage, MessageBus, OutboundMessage
from bot.commands import HELP_TEXT, Command, format_duration, parse_command
from bot.config import Config
from bot.context import ContextBuilder
from bot.llm import LLMProvider
from bot.memory.history import HistoryArchive, format_raw
from bot.runner import Runner, close_open_tool_calls
from bot.session import Session, SessionStore
from bot.tokens import estimate_text_tokens
from bot.tools.base import ToolContext, ToolRegistry

log = logging.getLogger(__name__)

STOPPED_TEXT = "Stopped."
SEEN_IDS_KEPT = 256


@dataclass(slots=True)
class _SessionWork:
    queue: deque[InboundMessage] = field(default_factory=deque)
    worker: asyncio.Task[None] | None = None
    turn: asyncio.Task[None] | None = None
    stop_requested: bool = False


class AgentLoop:
    def __init__(
        self,
        cfg: Config,
        bus: MessageBus,
        store: SessionStore,
        provider: LLMProvider,
        tools: ToolRegistry,
        context: ContextBuilder,
        archive: HistoryArchive,
    ) -> None:
        self.cfg = cfg
        self.bus = bus
        self.store = store
        self.provider = provider
        self.tools = tools
        self.context = context
        self.archive = archive
        self.runner = Runner(provider, tools, cfg.agent.max_tool_iterations)
        self._work: dict[str, _SessionWork] = {}
        self._slots = asyncio.Semaphore(cfg.agent.max_concurrent_turns)
        self._tools_tokens = estimate_text_tokens(str(tools.schemas()))
        self.started_at = time.monotonic()

    # -- intake ----------------------------------------------------------------------------

    async def run(self) -> None:
        """Consume the inbound queue until cancelled."""
        while True:
            msg = await self.bus.consume_inbound()
            try:
                await self.dispatch(msg)
            except Exception:
                log.exception("dispatch failed session=%s", msg.session_key)

    async def dispatch(self, msg: InboundMessage) -> None:
        """Route one inbound message: immediate commands now, everything else to its session."""
        if msg.message_id is None:
            msg = _with_id(msg)
        command = parse_command(msg.text)
        if command and command.name in ("/stop", "/help", "/status"):
            await self._immediate(msg, command)
            return
        work = self._work.setdefault(msg.session_key, _SessionWork())
        work.queue.append(msg)
        if work.worker is None or work.worker.done():
            work.worker = asyncio.create_task(
                self._drain(msg.session_key, work), name=f"session:{msg.session_key}"
            )

    async def _immediate(self, msg: InboundMessage, command: Command) -> None:
        if command.name == "/help":
            text = HELP_TEXT
        elif command.name == "/status":
            text = self.status_text(msg.session_key)
        else:
            text = (
                "Stopping the current answer."
                if self.stop(msg.session_key)
                else ("Nothing is running in this chat.")
            )
        await self._reply(msg, text)

    def stop(self, key: str) -> bool:
        """Cancel the running turn of one chat (``/stop``); other chats are untouched."""
        work = self._work.get(key)
        if work is None or work.turn is None or work.turn.done():
            return False
        work.stop_requested = True
        work.turn.cancel()
        return True

    def busy(self) -> bool:
        return any(w.worker is not None and not w.worker.done() for w in self._work.values())

    async def _drain(self, key: str, work: _SessionWork) -> None:
        while work.queue:
            msg = work.queue.popleft()
            async with self._slots:
                work.stop_requested = False
                work.turn = asyncio.create_task(self._process(msg), name=f"turn:{key}")
                try:
                    await asyncio.shield(work.turn)
                except asyncio.CancelledError:
                    if not work.turn.done():  # the loop itself is shutting down
                        work.turn.cancel()
                        raise
                except Exception:
                    log.exception("turn crashed session=%s", key)
                    await self._reply(msg, "Something went wrong while answering; see the logs.")
                finally:
                    work.turn = None

    # -- one turn --------------------------------------------------------------------------

    async def _process(self, msg: InboundMessage) -> None:
        command = parse_command(msg.text)
        if command and command.name == "/new":
            await self._new_session(msg)
            return
        session = self.store.get(msg.session_key)
        user = self.context.user_message(msg.text, msg.channel, msg.chat_id, msg.media)
        turn: list[dict[str, Any]] = [user]
        ctx = ToolContext(
            workspace=self.cfg.agent.workspace_path,
            restrict_to_workspace=self.cfg.tools.restrict_to_workspace,
            channel=msg.channel,
            chat_id=msg.chat_id,
            session_key=msg.session_key,
            send=lambda text: self.bus.publish_outbound(
                OutboundMessage(msg.channel, msg.chat_id, text, reply_to=msg.message_id)
            ),
        )

        async def checkpoint(phase: str, turn_so_far: list[dict[str, Any]]) -> None:
            await self._write(
                session,
                metadata={
                    "runtime_checkpoint": {
                        "phase": phase,
                        "message_id": msg.message_id,
                        "messages": turn_so_far,
                    }
                },
            )

        def build(t: list[dict[str, Any]]) -> list[dict[str, Any]]:
            return self.context.build(
                session,
                t,
                self.cfg.llm.context_window_tokens,
                self.cfg.llm.max_tokens,
                self._tools_tokens,
            )

        started = time.monotonic()
        try:
            result = await self.runner.run(build, turn, ctx, checkpoint)
        except asyncio.CancelledError:
            work = self._work.get(msg.session_key)
            if work is None or not work.stop_requested:
                raise
            closed = close_open_tool_calls(turn)
            await self._write(session, turn, metadata={"runtime_checkpoint": None})
            log.info("turn stopped session=%s interrupted_tools=%d", msg.session_key, closed)
            await self._reply(msg, STOPPED_TEXT)
            return
        # On an LLM failure the user's message (and any finished tool work) stays in history.
        await self._write(session, turn, metadata={"runtime_checkpoint": None})
        log.info(
            "turn done session=%s status=%s iterations=%d in %.0f ms",
            msg.session_key,
            result.status,
            result.iterations,
            (time.monotonic() - started) * 1000,
        )
        await self._reply(msg, result.text)

    async def _write(
        self,
        session: Session,
        messages: list[dict[str, Any]] = (),  # type: ignore[assignment]
        metadata: dict[str, Any] | None = None,
        last_consolidated: int | None = None,
    ) -> None:
        self.store.append(session, list(messages), metadata, last_consolidated)

    async def _reply(self, msg: InboundMessage, text: str) -> None:
        await self.bus.publish_outbound(
            OutboundMessage(msg.channel, msg.chat_id, text, reply_to=msg.message_id, final=True)
        )

    # -- commands --------------------------------------------------------------------------

    async def _new_session(self, msg: InboundMessage) -> None:
        session = self.store.get(msg.session_key)
        tail = session.messages[session.last_consolidated :]
        if tail:
            try:
                await self.archive.append(msg.session_key, format_raw(tail))
            except OSError as exc:
                log.error("archive failed session=%s: %s", msg.session_key, exc)
                await self._reply(
                    msg,
                    f"I could not archive this conversation ({exc.strerror}), so I kept it. "
                    "Nothing was lost; try /new again once the disk problem is fixed.",
                )
                return
        await self._write(session, last_consolidated=len(session.messages))
        log.info("session reset session=%s archived=%d", msg.session_key, len(tail))
        await self._reply(
            msg,
            "New conversation started."
            + (f" The previous {len(tail)} messages were archived to memory." if tail else ""),
        )

    def status_text(self, key: str) -> str:
        session = self.store.get(key)
        live = session.unconsolidated
        tokens = session.estimated_tokens(session.last_consolidated)
        work = self._work.get(key)
        running = work is not None and work.turn is not None and not work.turn.done()
        return "\n".join(
            [
                f"model: {self.cfg.llm.model}",
                f"session: {key}",
                f"conversation: {live} messages, ~{tokens:,} tokens "
                f"(context window {self.cfg.llm.context_window_tokens:,})",
                f"archived messages: {session.last_consolidated}",
                f"answer in progress: {'yes' if running else 'no'}",
                f"uptime: {format_duration(time.monotonic() - self.started_at)}",
            ]
        )


def _with_id(msg: InboundMessage) -> InboundMessage:
    from dataclasses import replace

    return replace(msg, message_id=f"local-{uuid.uuid4().hex[:12]}")
