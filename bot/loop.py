"""The agent loop: the one consumer of the inbound queue.

Turns of one chat run in order (one worker per busy session); different chats run in parallel,
at most ``agent.maxConcurrentTurns`` at once. Every accepted message gets exactly one ``final``
outbound message, whatever happens to its turn: an answer, an error message, or "stopped".

Durability (DESIGN.md section 5): a message is a *pending* entry in its session's metadata
before the channel confirms it to the platform; each phase of its turn is checkpointed; the
answer enters the delivery ledger in the same write that appends the turn. After a crash,
``recover`` turns all of that back into work: repaired history, resumed turns, re-sent answers.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from bot import failpoints
from bot.bus import InboundMessage, Intake, MessageBus, OutboundMessage
from bot.commands import HELP_TEXT, Command, format_duration, parse_command
from bot.config import Config
from bot.context import ContextBuilder
from bot.delivery import DELIVERY_KEY, DeliveryLedger, outbox_entry
from bot.gate import Gate, ProcessScope
from bot.llm import LLMError, LLMProvider, LLMUnavailable
from bot.memory.consolidate import Consolidator
from bot.memory.dream import Dream, budget_lines
from bot.memory.files import memory_stamp
from bot.memory.history import HistoryArchive
from bot.outage import NOTICE_TEXT, Outage, mark_waiting, wait_info, wall_seconds
from bot.runner import Runner, close_open_tool_calls
from bot.session import ANSWERED_BY_KEY, Session, SessionStore, now_iso
from bot.tokens import estimate_text_tokens
from bot.tools.base import ToolContext, ToolRegistry

if TYPE_CHECKING:
    from bot.tools.mcp import McpManager

log = logging.getLogger(__name__)

STOPPED_TEXT = "Stopped."
# A final answer's metadata says how its turn ended: "ok", "failed" (the model could not be
# reached or refused, or the turn crashed) or "stopped" (/stop, Ctrl-C).
OUTCOME_KEY = "outcome"
Outcome = Literal["ok", "failed", "stopped"]
# More than one getUpdates batch (at most 100 updates) from one chat, so a redelivered batch
# is always recognised.
SEEN_IDS_KEPT = 128
MAX_RESUME_ATTEMPTS = 3
AUDIO_SUFFIXES = frozenset({".ogg", ".oga", ".opus", ".mp3", ".m4a", ".wav", ".webm", ".flac"})
IMMEDIATE = ("/stop", "/help", "/status", "/dream")
GAVE_UP_TEXT = (
    "I was interrupted {n} times while answering your message and could not finish it. "
    "Please send it again if you still need an answer."
)


@dataclass(slots=True)
class _Job:
    msg: InboundMessage
    resume: bool = False  # finish an interrupted turn (checkpoint or pending from a crash)
    turn: list[dict[str, Any]] | None = None  # a turn that waited for the model: go on with it


@dataclass(slots=True)
class _SessionWork:
    queue: deque[_Job] = field(default_factory=deque)
    worker: asyncio.Task[None] | None = None
    turn: asyncio.Task[None] | None = None
    turn_sender: str = ""
    stop_requested: bool = False
    # Set by a turn that every model failed: the worker waits for the model (outside a slot).
    waiting: list[dict[str, Any]] | None = None
    wait: asyncio.Task[bool] | None = None


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
        gate: Gate | None = None,
        *,
        mcp: McpManager | None = None,
        wait_for_model: bool = False,
    ) -> None:
        """``wait_for_model``: when every model fails, turns wait for one to come back (the
        daemon) instead of being answered with the error (a one-shot terminal run)."""
        self.cfg = cfg
        self.gate = gate
        self.mcp = mcp
        self.bus = bus
        self.store = store
        self.provider = provider
        self.tools = tools
        self.context = context
        self.archive = archive
        self.ledger = DeliveryLedger(store)
        self.runner = Runner(
            provider, tools, cfg.agent.max_tool_iterations, cfg.agent.max_tool_calls_per_turn
        )
        self.consolidator = Consolidator(cfg.memory, store, provider, archive)
        self.dream = Dream(cfg.memory, cfg.agent.workspace_path, provider, archive)
        self._last_active: dict[str, float] = {}
        self._work: dict[str, _SessionWork] = {}
        self._slots = asyncio.Semaphore(cfg.agent.max_concurrent_turns)
        # (registry version, estimate): recounted only when MCP servers change the tools.
        self._tools_estimate = (-1, 0)
        self._draining = False
        self._background: set[asyncio.Task[None]] = set()
        self.started_at = time.monotonic()
        self.outage = Outage(provider.probe, cfg.llm.outage) if wait_for_model else None
        bus.set_intake(self.accept)

    def _tools_tokens(self) -> int:
        version, tokens = self._tools_estimate
        if version != self.tools.version:
            tokens = estimate_text_tokens(str(self.tools.schemas()))
            self._tools_estimate = (self.tools.version, tokens)
        return tokens

    # -- intake ----------------------------------------------------------------------------

    async def accept(self, msg: InboundMessage) -> Intake:
        """Make ``msg`` durable as a pending turn; recognise redeliveries by message id."""
        command = parse_command(msg.text)
        if command and command.name in IMMEDIATE:
            return "accepted"  # answered at once, nothing to make durable
        if self._draining:
            return "refused"
        try:
            # In a worker thread: the load of a long session and the fsync stay off the loop.
            return await asyncio.to_thread(self._store_pending, msg)
        except OSError as exc:
            log.error("cannot store message session=%s: %s", msg.session_key, exc)
            await self._publish(
                msg,
                f"I could not store your message ({exc.strerror or exc}), so I did not process "
                "it. Please try again later.",
                final=True,
            )
            return "refused"

    def _store_pending(self, msg: InboundMessage) -> Intake:
        session = self.store.get(msg.session_key)
        entry = {
            "id": msg.message_id,
            "sender_id": msg.sender_id,
            "text": msg.text,
            "media": list(msg.media),
            "reply_to": msg.reply_to,
            "metadata": msg.metadata,
            "received_at": now_iso(),
        }

        def add_pending(meta: dict[str, Any]) -> dict[str, Any] | None:
            # Checked and written under the session's lock: two deliveries of one message
            # racing each other still produce one pending turn.
            pending = meta.get("pending") or []
            seen = meta.get("seen_ids") or []
            if msg.message_id in seen or any(p["id"] == msg.message_id for p in pending):
                return None
            return {
                "pending": [*pending, entry],
                "seen_ids": [*seen, msg.message_id][-SEEN_IDS_KEPT:],
            }

        if not self.store.append(session, metadata=add_pending):
            log.info("duplicate message ignored session=%s id=%s", msg.session_key, msg.message_id)
            return "duplicate"
        failpoints.hit("after_intake")
        return "accepted"

    async def run(self, schedule_dream: bool = False) -> None:
        """Consume the inbound queue until cancelled.

        Idle compaction runs alongside; with ``schedule_dream`` (the daemon) so does Dream,
        every ``memory.dream.intervalMinutes``.
        """
        background = []
        if self.cfg.memory.idle_compact_minutes > 0:
            background.append(asyncio.create_task(self._idle_compactor(), name="idle-compaction"))
        if schedule_dream and self.cfg.memory.dream.enabled:
            background.append(asyncio.create_task(self._dream_schedule(), name="dream-schedule"))
        try:
            while True:
                msg = await self.bus.consume_inbound()
                try:
                    self.dispatch(msg)
                except Exception:
                    log.exception("dispatch failed session=%s", msg.session_key)
        finally:
            for task in background:
                task.cancel()

    async def _dream_schedule(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.memory.dream.interval_minutes * 60)
            try:
                result = await self.dream.run()
                log.info("scheduled %s", result.describe())
            except Exception:
                log.exception("scheduled dream failed")

    async def _idle_compactor(self) -> None:
        idle_seconds = self.cfg.memory.idle_compact_minutes * 60
        keep = self.cfg.memory.keep_recent_messages
        while True:
            await asyncio.sleep(min(60.0, max(1.0, idle_seconds / 4)))
            now = time.monotonic()
            for key, last in list(self._last_active.items()):
                if now - last < idle_seconds or key in self.running_keys():
                    continue
                del self._last_active[key]  # once per idle period
                if self.store.get(key).unconsolidated > keep:
                    log.info("idle compaction session=%s", key)
                    await self.consolidator.consolidate(key, keep=keep)

    def dispatch(self, msg: InboundMessage, resume: bool = False) -> None:
        """Route one accepted message: immediate commands now, everything else to its session."""
        command = parse_command(msg.text)
        if command and command.name in IMMEDIATE and not resume:
            self._spawn(self._immediate(msg, command))
            return
        work = self._work.setdefault(msg.session_key, _SessionWork())
        work.queue.append(_Job(msg, resume))
        if work.worker is None or work.worker.done():
            work.worker = asyncio.create_task(
                self._drain(msg.session_key, work), name=f"session:{msg.session_key}"
            )

    async def _immediate(self, msg: InboundMessage, command: Command) -> None:
        if command.name == "/help":
            text = HELP_TEXT
        elif command.name == "/dream" and not msg.metadata.get("is_admin", True):
            text = "Only an admin of this bot may run /dream."
        elif command.name == "/dream":
            if self.dream.running:
                text = "Dream is already running."
            else:
                await self._publish(msg, "Dreaming: distilling the history archive...", final=False)
                text = (await self.dream.run()).describe()
        elif command.name == "/status":
            text = self.status_text(msg.session_key)
        elif not self._may_stop(msg):
            text = "Only the person who asked, or an admin, may stop this answer."
        elif self.stop(msg.session_key):
            text = "Stopping the current answer."
        else:
            text = "Nothing is running in this chat."
        await self._publish(msg, text, final=True)

    def _may_stop(self, msg: InboundMessage) -> bool:
        work = self._work.get(msg.session_key)
        if work is None or not msg.metadata.get("is_group"):
            return True
        return work.turn_sender == msg.sender_id or bool(msg.metadata.get("is_admin", True))

    def stop(self, key: str) -> bool:
        """Cancel the running turn of one chat (``/stop``); other chats are untouched."""
        work = self._work.get(key)
        if work is not None and work.wait is not None and not work.wait.done():
            work.stop_requested = True
            work.wait.cancel()
            return True
        if work is None or work.turn is None or work.turn.done():
            return False
        work.stop_requested = True
        work.turn.cancel()
        return True

    async def wait_idle(self, key: str) -> None:
        """Wait until the session has no queued or running turn."""
        work = self._work.get(key)
        while work is not None and work.worker is not None and not work.worker.done():
            await asyncio.wait([work.worker])

    def running_keys(self) -> list[str]:
        return [k for k, w in self._work.items() if w.turn is not None and not w.turn.done()]

    async def _drain(self, key: str, work: _SessionWork) -> None:
        while work.queue and not self._draining:
            job = work.queue.popleft()
            if self.outage is not None and self.outage.active and job.turn is None:
                # The model is known to be down: wait without spending a slot on retries.
                if parse_command(job.msg.text) is None:
                    await self._wait_for_model(key, work, job, None)
                    continue
            async with self._slots:
                if self._draining:
                    return  # shutting down: the job stays pending on disk for the next start
                work.stop_requested = False
                work.turn_sender = job.msg.sender_id
                work.turn = asyncio.create_task(self._process(job), name=f"turn:{key}")
                try:
                    await asyncio.shield(work.turn)
                except asyncio.CancelledError:
                    if not work.turn.done():  # the loop itself is being cancelled
                        work.turn.cancel()
                        raise
                except Exception:
                    log.exception("turn crashed session=%s", key)
                    await self._fail_turn(job.msg)
                finally:
                    work.turn = None
            if work.waiting is not None:
                turn, work.waiting = work.waiting, None
                await self._wait_for_model(key, work, job, turn)

    # -- one turn --------------------------------------------------------------------------

    async def _process(self, job: _Job) -> None:
        msg = job.msg
        command = parse_command(msg.text)
        if command and command.name == "/new":
            await self._new_session(msg)
            return
        session = self.store.get(msg.session_key)
        if job.turn is not None:
            await self._run_turn(session, msg, job.turn)
            return
        turn = None
        if job.resume:
            turn = await self._resume_turn(session, msg)
            if turn is None:
                return  # already finished: the final write landed before the crash
        if turn is not None and turn.phase == "final_response":
            await self._finish(session, msg, turn.messages, turn.messages[-1]["content"] or "")
            return
        if turn is not None and turn.gave_up:
            await self._finish(
                session, msg, turn.messages, GAVE_UP_TEXT.format(n=MAX_RESUME_ATTEMPTS)
            )
            return
        messages = turn.messages if turn else [await self._user_message(msg)]
        await self._run_turn(session, msg, messages)

    def _private(self, msg: InboundMessage) -> bool:
        """May this chat see the owner's memory? Private chats yes; groups only if shared."""
        return not msg.metadata.get("is_group") or self.cfg.memory.share_in_groups

    async def _user_message(self, msg: InboundMessage) -> dict[str, Any]:
        text = msg.text
        model = self.cfg.llm.transcription_model
        for path in msg.media if model else ():
            if Path(path).suffix.lower() not in AUDIO_SUFFIXES:
                continue
            try:
                said = await self.provider.transcribe(path, model)
                text += f"\n[voice message transcript: {said}]"
            except LLMError as exc:
                log.warning("transcription failed session=%s: %s", msg.session_key, exc)
                text += "\n[a voice message could not be transcribed]"
        return self.context.user_message(text, msg.channel, msg.chat_id, msg.media)

    async def _run_turn(
        self, session: Session, msg: InboundMessage, turn: list[dict[str, Any]]
    ) -> None:
        ctx = ToolContext(
            workspace=self.cfg.agent.workspace_path,
            restrict_to_workspace=self.cfg.tools.restrict_to_workspace,
            channel=msg.channel,
            chat_id=msg.chat_id,
            session_key=msg.session_key,
            send=lambda text: self._publish(msg, text, final=False),
            extra={"private": self._private(msg)},
            gate=self.gate,
            processes=ProcessScope(),
        )

        async def checkpoint(phase: str, turn_so_far: list[dict[str, Any]]) -> None:
            await self.store.append_async(
                session,
                metadata={
                    "runtime_checkpoint": {
                        "phase": phase,
                        "message_id": msg.message_id,
                        "messages": turn_so_far,
                        "at": now_iso(),
                    }
                },
            )
            failpoints.hit(phase)

        def build(t: list[dict[str, Any]]) -> list[dict[str, Any]]:
            return self.context.build(
                session,
                t,
                self.cfg.llm.context_window_tokens,
                self.cfg.llm.max_tokens,
                self._tools_tokens(),
                private=ctx.extra["private"],
            )

        started = time.monotonic()
        stamp = memory_stamp(self.cfg.agent.workspace_path)
        await self.bus.publish_outbound(
            OutboundMessage(msg.channel, msg.chat_id, "", metadata={"typing": True})
        )
        failpoints.hit("before_llm")
        try:
            try:
                result = await self.runner.run(build, turn, ctx, checkpoint)
            finally:
                # No process outlives its turn: background jobs end with the answer.
                assert ctx.processes is not None
                await asyncio.shield(ctx.processes.close())
        except asyncio.CancelledError:
            work = self._work.get(msg.session_key)
            if work is None or not work.stop_requested:
                raise  # shutdown: the checkpoint stays and the next start resumes the turn
            closed = close_open_tool_calls(turn)
            log.info("turn stopped session=%s interrupted_tools=%d", msg.session_key, closed)
            await self._finish(session, msg, turn, STOPPED_TEXT, "stopped")
            return
        log.info(
            "turn done session=%s status=%s iterations=%d in %.0f ms",
            msg.session_key,
            result.status,
            result.iterations,
            (time.monotonic() - started) * 1000,
        )
        if self.outage is not None and _outage_error(result.error):
            # Not answered: the turn stays pending and waits for the model (bot.outage).
            self.outage.begin(str(result.error))
            work = self._work.get(msg.session_key)
            if work is not None:
                work.waiting = turn
                return
        # On an LLM failure the user's message (and any finished tool work) stays in history.
        outcome: Outcome = "failed" if result.status == "llm_error" else "ok"
        await self._finish(session, msg, turn, result.text, outcome)
        if memory_stamp(self.cfg.agent.workspace_path) != stamp:
            self._spawn(self._commit_memory(msg.session_key))

    async def _wait_for_model(
        self, key: str, work: _SessionWork, job: _Job, turn: list[dict[str, Any]] | None
    ) -> None:
        """Hold the chat's turn until the model is back, then queue it first again.

        The notice goes out once per pending message: "notified" is durable before it is
        sent (a crash in between loses the notice, never doubles it). ``/stop`` and
        ``llm.outage.maxWaitMinutes`` end the wait with an answer.
        """
        assert self.outage is not None
        msg = job.msg
        session = self.store.get(key)
        info = wait_info(session.metadata.get("pending") or [], msg.message_id)
        if info is None:
            return  # no longer pending: nothing to answer
        since = info.get("since") or now_iso()
        tell = not info.get("notified") and key not in self.outage.notified
        if not info.get("since") or tell:
            notified = bool(info.get("notified")) or tell
            await self.store.append_async(
                session,
                metadata=lambda meta: {
                    "pending": mark_waiting(
                        meta.get("pending") or [], msg.message_id, since, notified
                    )
                },
            )
        if tell:
            self.outage.notified.add(key)
            await self._publish(msg, NOTICE_TEXT, final=False)
        started = wall_seconds(since) or time.time()
        deadline = started + self.outage.cfg.max_wait_minutes * 60
        work.stop_requested = False
        work.wait = asyncio.create_task(
            self.outage.wait(key, started, deadline), name=f"wait:{key}"
        )
        try:
            back = await asyncio.shield(work.wait)
        except asyncio.CancelledError:
            if not work.wait.done():  # shutdown: the turn stays pending for the next start
                work.wait.cancel()
                raise
            back = None  # /stop
        finally:
            work.wait = None
        if back:
            work.queue.appendleft(_Job(msg, job.resume, turn))
            return
        if turn is None:
            turn = await self._answerable_turn(session, msg)
        close_open_tool_calls(turn)
        if back is None:
            log.info("waiting turn stopped session=%s", key)
            await self._finish(session, msg, turn, STOPPED_TEXT, "stopped")
        else:
            log.error(
                "turn waited llm.outage.maxWaitMinutes (%g) for the model session=%s",
                self.outage.cfg.max_wait_minutes,
                key,
            )
            await self._finish(session, msg, turn, LLMUnavailable.user_message, "failed")

    async def _answerable_turn(self, session: Session, msg: InboundMessage) -> list[dict[str, Any]]:
        """What a turn that never reached the model leaves in history: its checkpoint's work
        if it has one (a resumed turn), else the user's message."""
        checkpoint = session.metadata.get("runtime_checkpoint")
        if checkpoint and checkpoint.get("message_id") == msg.message_id:
            return list(checkpoint.get("messages") or [])
        return [await self._user_message(msg)]

    async def _commit_memory(self, key: str) -> None:
        from bot.memory.versioning import commit_async

        try:
            commit = await commit_async(
                self.cfg.agent.workspace_path, f"agent: memory edited in session {key}\n"
            )
            if commit:
                log.info("memory committed %s session=%s", commit[:8], key)
        except Exception:
            log.exception("memory commit failed session=%s", key)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _finish(
        self,
        session: Session,
        msg: InboundMessage,
        turn: list[dict[str, Any]],
        text: str,
        outcome: Outcome = "ok",
    ) -> None:
        """One write: the turn's messages, the answer into the ledger, pending and checkpoint
        cleared. Then the answer goes out, its ``outcome`` in the metadata (the terminal turns
        it into an exit code)."""
        delivery_id = f"d-{uuid.uuid4().hex[:12]}"
        out = OutboundMessage(
            msg.channel,
            msg.chat_id,
            text,
            reply_to=msg.message_id,
            final=True,
            metadata={DELIVERY_KEY: delivery_id, OUTCOME_KEY: outcome},
        )
        entry = outbox_entry(delivery_id, out)

        def finished(meta: dict[str, Any]) -> dict[str, Any]:
            # Derived under the session lock: a message accepted meanwhile stays pending.
            pending = [p for p in meta.get("pending") or [] if p["id"] != msg.message_id]
            return {
                "runtime_checkpoint": None,
                "resume": None,
                "interrupted": None,
                "pending": pending or None,
                "outbox": [*(meta.get("outbox") or []), entry],
            }

        await self.store.append_async(session, turn, metadata=finished)
        failpoints.hit("before_delivery")
        await self.bus.publish_outbound(out)
        self._last_active[msg.session_key] = time.monotonic()
        self.consolidator.schedule(msg.session_key)

    async def _fail_turn(self, msg: InboundMessage) -> None:
        """A bug or an I/O error ended the turn: tell the person, keep the loop alive."""
        text = "Something went wrong while answering; see the logs."
        try:
            session = self.store.get(msg.session_key)
            await self._finish(session, msg, [], text, "failed")
        except Exception:
            log.exception("could not record the failed turn session=%s", msg.session_key)
            await self.bus.publish_outbound(
                OutboundMessage(
                    msg.channel,
                    msg.chat_id,
                    text,
                    reply_to=msg.message_id,
                    final=True,
                    metadata={OUTCOME_KEY: "failed"},
                )
            )

    async def _publish(self, msg: InboundMessage, text: str, final: bool) -> None:
        await self.bus.publish_outbound(
            OutboundMessage(msg.channel, msg.chat_id, text, reply_to=msg.message_id, final=final)
        )

    # -- recovery --------------------------------------------------------------------------

    def recover(self, keys: list[str] | None = None, channels: set[str] | None = None) -> int:
        """Queue every interrupted turn and undelivered answer; returns how many sessions.

        Called once at start, before any new message is taken, so a session carrying a
        checkpoint is repaired before anything else touches it. ``channels`` limits recovery
        to the sessions of those channels (the gateway leaves ``cli:`` sessions to the
        terminal).
        """
        resumed = 0
        for key in self.store.keys() if keys is None else keys:
            if channels is not None and key.partition(":")[0] not in channels:
                continue
            # One session's damage must not keep the others (or the daemon) from starting.
            try:
                resumed += self._recover_session(key)
            except OSError as exc:
                log.error("cannot recover session=%s: %s", key, exc)
            except Exception:
                log.exception("recovery failed session=%s; the other sessions go on", key)
        return resumed

    def _recover_session(self, key: str) -> int:
        """Recover one session; 1 if it had pending turns to resume."""
        meta = self.store.peek_metadata(key)
        if not meta or not (
            meta.get("pending") or meta.get("runtime_checkpoint") or meta.get("outbox")
        ):
            return 0
        session = self.store.get(key)
        for out in self.ledger.recover(key):
            log.info("re-sending undelivered answer session=%s", key)
            self.bus.outbound.put_nowait(out)
        pending = session.metadata.get("pending") or []
        checkpoint = session.metadata.get("runtime_checkpoint")
        if checkpoint and not any(p["id"] == checkpoint.get("message_id") for p in pending):
            # A checkpoint whose message is gone cannot be answered; keep its work.
            self._repair_orphan_checkpoint(session)
        for p in pending:
            self.dispatch(_inbound_from_pending(key, p), resume=True)
        if pending:
            log.info("resuming session=%s pending=%d", key, len(pending))
        return 1 if pending else 0

    def _repair_orphan_checkpoint(self, session: Session) -> None:
        turn = list(session.metadata["runtime_checkpoint"].get("messages") or [])
        close_open_tool_calls(turn)
        self.store.append(session, turn, metadata={"runtime_checkpoint": None})

    async def _resume_turn(self, session: Session, msg: InboundMessage) -> _Resumed | None:
        """Turn a checkpoint back into messages; count the attempt durably before trying."""
        meta = session.metadata
        resume = meta.get("resume") or {}
        attempts = resume.get("attempts", 0) if resume.get("message_id") == msg.message_id else 0
        attempts += 1
        checkpoint = meta.get("runtime_checkpoint")
        if checkpoint and checkpoint.get("message_id") != msg.message_id:
            checkpoint = None
        if not checkpoint and not _pending(session, msg.message_id):
            return None
        messages = list(checkpoint["messages"]) if checkpoint else [await self._user_message(msg)]
        phase = checkpoint["phase"] if checkpoint else "intake"
        if phase == "final_response":
            return _Resumed(messages, phase)
        interrupted = _unfinished_calls(messages)
        close_open_tool_calls(messages)
        if attempts > MAX_RESUME_ATTEMPTS:
            log.error(
                "giving up on interrupted turn session=%s after %d attempts",
                msg.session_key,
                attempts - 1,
            )
            return _Resumed(messages, phase, gave_up=True)
        self.store.append(
            session, metadata={"resume": {"message_id": msg.message_id, "attempts": attempts}}
        )
        log.info(
            "resuming turn session=%s phase=%s attempt=%d interrupted_tools=%d",
            msg.session_key,
            phase,
            attempts,
            len(interrupted),
        )
        if checkpoint:
            # In the person's own message, after its runtime block: the last thing the model
            # reads stays the tool results of their question, not a note it would answer.
            note = resume_note(interrupted)
            if messages and messages[0].get("role") == "user":
                messages[0] = with_note(messages[0], note)
            else:  # not the shape memobot writes; still tell the model
                messages.append({"role": "user", "content": note})
        return _Resumed(messages, phase)

    # -- shutdown --------------------------------------------------------------------------

    async def shutdown(self, drain_seconds: float) -> None:
        """Stop intake, mark running sessions interrupted, let turns finish, cancel the rest."""
        self._draining = True
        self.bus.accepting = False
        running = self.running_keys()
        for key in running:
            self.store.append(
                self.store.get(key),
                metadata={"interrupted": {"at": now_iso(), "reason": "shutdown"}},
            )
        turns = [w.turn for w in self._work.values() if w.turn is not None and not w.turn.done()]
        if turns:
            log.info("draining %d running turn(s) for up to %.0f s", len(turns), drain_seconds)
            _, late = await asyncio.wait(turns, timeout=drain_seconds)
            for t in late:
                t.cancel()  # no stop_requested: the checkpoint stays for the next start
            if late:
                await asyncio.wait(late, timeout=5)
                log.warning("%d turn(s) did not finish; they resume at the next start", len(late))
        workers = [w.worker for w in self._work.values() if w.worker and not w.worker.done()]
        for w in workers:
            w.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        if self.outage is not None:
            await self.outage.close()
        await self.consolidator.cancel()

    # -- commands --------------------------------------------------------------------------

    async def _new_session(self, msg: InboundMessage) -> None:
        session = self.store.get(msg.session_key)
        count = session.unconsolidated
        if not await self.consolidator.compact_all(msg.session_key):
            await self._finish(
                session,
                msg,
                [],
                "I could not save this conversation to the memory archive (a disk problem; see "
                "the logs), so I kept it as it is. Nothing was lost; try /new again later.",
            )
            return
        log.info("session reset session=%s archived=%d", msg.session_key, count)
        await self._finish(
            session,
            msg,
            [],
            "New conversation started."
            + (f" The previous {count} messages were archived to memory." if count else ""),
        )

    def status_text(self, key: str) -> str:
        session = self.store.get(key)
        live = session.unconsolidated
        tokens = session.estimated_tokens(session.last_consolidated)
        work = self._work.get(key)
        running = work is not None and work.turn is not None and not work.turn.done()
        waiting = work is not None and work.wait is not None and not work.wait.done()
        answered_by = next(
            (
                m[ANSWERED_BY_KEY]
                for m in reversed(session.messages)
                if m.get("role") == "assistant" and m.get(ANSWERED_BY_KEY)
            ),
            "",
        )
        outage = self.outage.describe() if self.outage else ""
        return "\n".join(
            [
                f"model: {self.cfg.llm.model}"
                + (
                    f" (+{len(self.cfg.llm.fallbacks)} fallbacks)" if self.cfg.llm.fallbacks else ""
                ),
                *([f"last answer by: {answered_by}"] if answered_by else []),
                *([f"outage: {outage}"] if outage else []),
                f"session: {key}",
                f"conversation: {live} messages, ~{tokens:,} tokens "
                f"(context window {self.cfg.llm.context_window_tokens:,})",
                f"archived messages: {session.last_consolidated}",
                "memory: "
                + ", ".join(budget_lines(self.cfg.agent.workspace_path, self.cfg.memory.max_chars)),
                f"answer in progress: {'yes' if running else 'no'}"
                + (" (waiting for the model)" if waiting else ""),
                *([f"mcp: {self.mcp.summary()}"] if self.mcp and self.mcp.servers else []),
                f"uptime: {format_duration(time.monotonic() - self.started_at)}",
            ]
        )


@dataclass(slots=True)
class _Resumed:
    messages: list[dict[str, Any]]
    phase: str
    gave_up: bool = False


def _outage_error(error: LLMError | None) -> bool:
    """Every model was unavailable (not refused, not unconfigured): worth waiting for."""
    return isinstance(error, LLMUnavailable)


def _pending(session: Session, message_id: str | None) -> bool:
    return any(p["id"] == message_id for p in session.metadata.get("pending") or [])


def _unfinished_calls(turn: list[dict[str, Any]]) -> list[str]:
    done = {m.get("tool_call_id") for m in turn if m.get("role") == "tool"}
    return [
        c.get("function", {}).get("name", "?")
        for m in turn
        if m.get("role") == "assistant"
        for c in m.get("tool_calls") or []
        if c.get("id") not in done
    ]


def with_note(message: dict[str, Any], note: str) -> dict[str, Any]:
    """``message`` (a user message) with ``note`` added at the end of its text."""
    content = message.get("content")
    if isinstance(content, list):
        return {**message, "content": [*content, {"type": "text", "text": note}]}
    return {**message, "content": f"{content or ''}\n\n{note}"}


def resume_note(interrupted: list[str]) -> str:
    """The note the model sees when a turn is resumed after memobot was stopped mid-way."""
    text = (
        "[memobot: your previous run on this message was interrupted (memobot was restarted). "
        "The tool results that follow are what finished."
    )
    if interrupted:
        text += (
            f" These tool calls did not finish: {', '.join(interrupted)}. Do not repeat a "
            "call with side effects unless you have checked it is safe to run again."
        )
    return text + " Continue answering this message.]"


def _inbound_from_pending(key: str, p: dict[str, Any]) -> InboundMessage:
    channel, _, chat_id = key.partition(":")
    return InboundMessage(
        channel,
        chat_id,
        str(p.get("sender_id", "")),
        str(p.get("text", "")),
        media=tuple(p.get("media") or ()),
        message_id=p["id"],
        reply_to=p.get("reply_to"),
        metadata=dict(p.get("metadata") or {}),
    )
