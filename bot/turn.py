"""One turn: from a person's message to the one ``final`` answer, checkpointed at each phase.

DESIGN.md section 5, steps 4 and 5. The runner talks to the model and the tools; this module
gives it the turn's context (tools confined by the gate, one process scope per turn), stores a
``runtime_checkpoint`` at each phase, and ends every turn with ``finish``: one write that
appends the turn's messages, puts the answer into the delivery ledger and clears the pending
entry, after which the answer is published.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from bot import failpoints, workspace_files
from bot.approvals import ApprovalDesk, offered_tools
from bot.bus import Activity, AdminNotice, InboundMessage, MessageBus, OutboundMessage, TurnActivity
from bot.config import Config
from bot.context import ContextBuilder
from bot.cron import heartbeat
from bot.cron.runs import RunLog
from bot.delivery import DELIVERY_KEY, LEDGER_SESSION_KEY, outbox_entry
from bot.gate import Gate, ProcessScope
from bot.gate.effects import Effects
from bot.images import stored_form
from bot.kinds import TurnKind, sender_name
from bot.llm import LLMError, LLMProvider, LLMUnavailable
from bot.long_answers import spill
from bot.long_messages import (
    cut_message,
    message_char_limit,
    message_file,
    too_long_notice,
)
from bot.memory.consolidate import Consolidator
from bot.memory.dream import chat_memory_file
from bot.memory.files import memory_stamp
from bot.memory.people import Speaker, clean_name, ensure_file
from bot.privacy import PrivacyScope, scope_for_person, scope_for_unattended
from bot.provenance import Provenance, Stamps, turn_is_trusted, watched_stamps
from bot.runner import (
    CLOSING_NOTES,
    NO_ANSWER_NOTE,
    Runner,
    close_open_tool_calls,
    close_turn,
)
from bot.session import Session, SessionStore, now_iso, transitions
from bot.spend.budget import BudgetSpent
from bot.spend.record import HEARTBEAT, JOB, TASK, TURN
from bot.streaming import TurnStream, stopped_answer
from bot.tasks import scope_from_record, task_info, task_model, task_tools
from bot.tokens import estimate_text_tokens, message_size
from bot.tools.base import ToolContext, ToolRegistry

log = logging.getLogger(__name__)

STOPPED_TEXT = "Stopped."
FAILED_TEXT = "Something went wrong while answering; see the logs."
# A final answer's metadata says how its turn ended: "ok", "failed" (the model could not be
# reached or refused, or the turn crashed) or "stopped" (/stop, Ctrl-C).
OUTCOME_KEY = "outcome"
Outcome = Literal["ok", "failed", "stopped"]
SCHEDULED = frozenset({TurnKind.JOB, TurnKind.REMINDER, TurnKind.HEARTBEAT})  # in the run log
# A final_response checkpoint's file holding the whole answer, when it was too long for a chat.
ANSWER_FILE_KEY = "answer_file"
# What the usage ledger records a turn's model calls as (bot.spend.record), by its kind.
USAGE_PURPOSES = {TurnKind.HEARTBEAT: HEARTBEAT, TurnKind.JOB: JOB, TurnKind.TASK: TASK}
BUDGET_NOTE = "[memobot: this message was not sent to the model: a spending budget was used up.]"
AUDIO_SUFFIXES = frozenset({".ogg", ".oga", ".opus", ".mp3", ".m4a", ".wav", ".webm", ".flac"})

Spawn = Callable[[Coroutine[Any, Any, None]], None]


def turn_speaker(msg: InboundMessage, scope: PrivacyScope) -> Speaker | None:
    """Who wrote a person's message in a chat that is not the owner's (a group, someone who is
    not an admin), named in its runtime block; None for the owner and for turns nobody wrote.
    (bench/bench_recall.py stores its conversation's messages as turns do, through this.)"""
    if msg.kind is not TurnKind.MESSAGE or scope.is_owner:
        return None
    return Speaker(msg.channel, msg.sender.id, clean_name(sender_name(msg)))


class Turns:
    """Runs and ends turns; shared by every session (the loop decides which turn runs when)."""

    def __init__(
        self,
        cfg: Config,
        bus: MessageBus,
        store: SessionStore,
        provider: LLMProvider,
        tools: ToolRegistry,
        context: ContextBuilder,
        consolidator: Consolidator,
        gate: Gate | None,
        spawn: Spawn,
        approvals: ApprovalDesk,
    ) -> None:
        self.cfg = cfg
        self.bus = bus
        self.store = store
        self.provider = provider
        self.tools = tools
        self.context = context
        self.consolidator = consolidator
        self.gate = gate
        self.spawn = spawn
        self.runner = Runner(
            provider,
            tools,
            cfg.agent.max_tool_iterations,
            cfg.agent.max_tool_calls_per_turn,
            cfg.llm.max_tokens,
            cfg.agent.max_tokens_per_turn,
        )
        # Asks, waits for and records the answers to approval questions (tools.approval).
        self.approvals = approvals
        self.provenance = Provenance(cfg.agent.state_path, cfg.agent.workspace_path)
        self.runs = RunLog(cfg.agent.state_path)  # how scheduled turns ended (the panel)
        # When each session last finished a turn (the idle compactor's clock).
        self.last_active: dict[str, float] = {}
        # (registry version, estimate): recounted only when MCP servers change the tools.
        self._tools_estimate = (-1, 0)
        self._tool_effects: tuple[int, Mapping[str, Effects]] = (-1, {})

    def _tools_tokens(self) -> int:
        version, tokens = self._tools_estimate
        if version != self.tools.version:
            tokens = estimate_text_tokens(str(self.tools.schemas()))
            self._tools_estimate = (self.tools.version, tokens)
        return tokens

    def _effects(self) -> Mapping[str, Effects]:
        """The registry's tool effects, rebuilt only when MCP servers change the tools."""
        version, effects = self._tool_effects
        if version != self.tools.version:
            effects = self.tools.effects()
            self._tool_effects = (self.tools.version, effects)
        return effects

    def scope(self, msg: InboundMessage) -> PrivacyScope:
        """What of the owner's data this turn may show, decided once when it starts: by the
        sender for a person's message, by the chat for a scheduled job or the heartbeat."""
        if msg.policy.unattended:
            return scope_for_unattended(msg, self.cfg.memory)
        return scope_for_person(msg, self.cfg.memory)

    async def user_message(self, msg: InboundMessage) -> dict[str, Any]:
        """The person's message as the model sees it (voice messages transcribed)."""
        text = msg.text
        model = self.cfg.llm.transcription_model
        for path in msg.media if model else ():
            if Path(path).suffix.lower() not in AUDIO_SUFFIXES:
                continue
            try:
                # A media file is in the workspace, which the model writes: never via a link.
                data = await asyncio.to_thread(
                    workspace_files.read_bytes, self.cfg.agent.workspace_path, path
                )
                said = await self.provider.transcribe(Path(path).name, data, model, msg.session_key)
                text += f"\n[voice message transcript: {said}]"
            except (LLMError, OSError) as exc:
                log.warning("transcription failed session=%s: %s", msg.session_key, exc)
                text += "\n[a voice message could not be transcribed]"
        text = await self._fit_message(msg, text)
        speaker = self.speaker(msg)
        return self.context.user_message(text, msg.channel, msg.chat_id, msg.media, speaker=speaker)

    def speaker(self, msg: InboundMessage) -> Speaker | None:
        return turn_speaker(msg, self.scope(msg))

    async def _fit_message(self, msg: InboundMessage, text: str) -> str:
        """``text``, or for a message too long for the model's window its head and tail
        around a marker, the whole of it kept in the workspace and the person told
        (bot.long_messages)."""
        llm = self.cfg.llm
        limit = message_char_limit(llm.context_window_tokens, llm.max_tokens)
        if message_size(text) <= limit:
            return text
        path = message_file(msg.channel, msg.chat_id, msg.message_id or uuid.uuid4().hex[:12])
        try:
            await asyncio.to_thread(
                workspace_files.write_atomic,
                self.cfg.agent.workspace_path,
                path,
                text,
                make_parents=True,
            )
            kept_in = str(path)
        except OSError as exc:
            log.error("cannot keep a long message session=%s: %s", msg.session_key, exc)
            kept_in = "(not saved: the workspace could not be written)"
        cut = cut_message(text, limit, kept_in)
        log.warning(
            "message of %d characters cut to %d for the model's window (%d tokens) session=%s;"
            " the whole message is %s",
            len(text),
            len(cut),
            llm.context_window_tokens,
            msg.session_key,
            kept_in,
        )
        if msg.policy.sends:
            notice = too_long_notice(len(text), len(cut), kept_in)
            # Not an answer: the terminal shows it beside the answers (stderr), not among them.
            await self.bus.publish_outbound(
                OutboundMessage(
                    msg.channel,
                    msg.chat_id,
                    notice,
                    reply_to=msg.message_id,
                    metadata={OUTCOME_KEY: "notice"},
                )
            )
        return cut

    async def answerable_turn(self, session: Session, msg: InboundMessage) -> list[dict[str, Any]]:
        """What a turn that never reached the model leaves in history: its checkpoint's work
        if it has one (a resumed turn), else the user's message."""
        checkpoint = session.state.checkpoint_of(msg.message_id)
        if checkpoint:
            return list(checkpoint.get("messages") or [])
        return [await self.user_message(msg)]

    async def run(
        self,
        session: Session,
        msg: InboundMessage,
        turn: list[dict[str, Any]],
        *,
        stop_requested: Callable[[], bool],
        wait_for_model: bool,
        approval: dict[str, Any] | None = None,
    ) -> LLMUnavailable | None:
        """Run the turn to its answer. When every model was unavailable and ``wait_for_model``,
        returns that error instead of answering: ``turn`` (extended in place with whatever
        finished) waits with the caller until the model is back.

        A cancellation with ``stop_requested()`` is ``/stop``: the turn ends "stopped". Any
        other cancellation (shutdown) propagates and leaves the checkpoint for the next start.
        ``approval``: the open question of a turn paused before a restart (asked again? no:
        waited for again, its old buttons still work).
        """
        scope = self.scope(msg)
        task = task_info(msg) if msg.kind is TurnKind.TASK else None
        if task is None:
            offered = offered_tools(self.cfg, msg, self._effects(), scope)
        else:
            # The rights of the turn that started it, stored with it; never more.
            scope = scope_from_record(task.get("scope"), scope)
            stored = task.get("tools")
            offered = task_tools(
                None if stored is None else {str(n) for n in stored}, set(self._effects())
            )
        ctx = ToolContext(
            workspace=self.cfg.agent.workspace_path,
            restrict_to_workspace=self.cfg.tools.restrict_to_workspace,
            channel=msg.channel,
            chat_id=msg.chat_id,
            session_key=msg.session_key,
            # A heartbeat turn has no chat of its own: it speaks only through its answer.
            send=(lambda t: self.publish(msg, t, False)) if msg.policy.sends else None,
            sender=msg.sender,
            # The chat's model, for a task it spawns (a task's own: its parent chat's).
            extra={"offered": offered, "model": turn_model(session, msg)},
            turn_id=msg.message_id,
            gate=self.gate,
            processes=ProcessScope(),
            scope=scope,
        )

        # Memory changes only through tools: the stamp is taken before the first tool runs,
        # so a plain answer costs no stat calls.
        stamp: tuple[tuple[str, int, int], ...] | None = None
        watched: Stamps | None = None  # HEARTBEAT.md and skills: who wrote them is recorded

        async def checkpoint(
            phase: str,
            turn_so_far: list[dict[str, Any]],
            pending_approval: dict[str, Any] | None = None,
        ) -> None:
            nonlocal stamp, watched
            if phase == "awaiting_tools" and stamp is None:
                stamp = memory_stamp(self.cfg.agent.workspace_path)
                watched = watched_stamps(self.cfg.agent.workspace_path)
                if not turn_is_trusted(msg):
                    # Written ahead: what this turn writes counts as its own from now on,
                    # for turns running meanwhile and after a crash, not only once it ends.
                    await asyncio.to_thread(self.provenance.open_turn, watched, msg.session_key)
            answer_file = None
            if phase == "final_response":
                answer_file = await self._cut_final(session, turn_so_far)
            record: dict[str, Any] = {
                "phase": phase,
                "message_id": msg.message_id,
                "messages": stored_form(turn_so_far),  # images go to the model, not to disk
                "at": now_iso(),
            }
            if pending_approval is not None:
                record["approval"] = pending_approval
            if answer_file is not None:
                record[ANSWER_FILE_KEY] = answer_file
            update = transitions.checkpoint(record)
            if phase == "final_response":
                # finish() follows at once and fsyncs this line with its own. Until then a
                # killed process still finds the answer (the page cache keeps it), and after a
                # power cut asking the model again loses nothing: nothing was sent yet.
                self.store.apply(session, update, fsync=False)
            else:
                # Before a tool runs (and after): what it did must survive a power cut.
                await self.store.apply_async(session, update)
            failpoints.hit(phase)

        # A task sees the memory of the chat that started it (its scope's session).
        home = scope.session_key if task is not None else msg.session_key
        owner = heartbeat.owner_chat(self.cfg, home) and not msg.classification.narrowed
        chat_memory = None if owner else chat_memory_file(home)
        # The speaker's own file (bot.memory.people) when their scope opens it to this turn.
        person = self.speaker(msg) if task is None and scope.person else None
        if person is not None and person.file == scope.person:
            try:
                if await asyncio.to_thread(ensure_file, self.cfg.agent.workspace_path, person):
                    log.info("memory: %s started for %s", person.file, msg.session_key)
            except OSError as exc:
                log.warning("memory: cannot start %s: %s", person.file, exc)
        else:
            person = None

        def build(t: list[dict[str, Any]]) -> list[dict[str, Any]]:
            return self.context.build(
                session,
                t,
                self.cfg.llm.context_window_tokens,
                self.cfg.llm.max_tokens,
                self._tools_tokens(),
                scope=scope,
                chat_memory=chat_memory,
                person=person,
            )

        started = time.monotonic()
        # A turn resumed on its open question goes back to waiting for the person: typing
        # comes once the question is answered.
        if msg.policy.shows_typing and approval is None:
            await self.bus.publish_outbound(
                TurnActivity(msg.channel, msg.chat_id, msg.message_id, Activity.WORKING)
            )
        failpoints.hit("before_llm")
        stream = None
        if msg.channel in self.bus.streaming:  # the chat shows answers while they are written
            stream = TurnStream(self.bus, msg.channel, msg.chat_id, msg.message_id)
        try:
            try:
                approve = self.approvals.approver(session, msg, checkpoint, approval)
                result = await self.runner.run(
                    build,
                    turn,
                    ctx,
                    checkpoint,
                    stream=stream,
                    approve=approve,
                    purpose=USAGE_PURPOSES.get(msg.kind, TURN),
                    model=turn_model(session, msg),
                )
            finally:
                # No process outlives its turn: background jobs end with the answer.
                assert ctx.processes is not None
                await asyncio.shield(ctx.processes.close())
                if watched is not None:
                    await asyncio.shield(self._record_writes(msg, watched))
                elif not turn_is_trusted(msg) and self.provenance.has_open(msg.session_key):
                    # Resumed after a crash past its tools: close what it opened back then.
                    await asyncio.shield(self._record_writes(msg, {}))
        except asyncio.CancelledError:
            if not stop_requested():
                raise  # shutdown: the checkpoint stays and the next start resumes the turn
            closed = close_open_tool_calls(turn)
            log.info("turn stopped session=%s interrupted_tools=%d", msg.session_key, closed)
            # What was streamed stays, marked stopped: the chat keeps what was read, and so
            # does the history (the model's own words), unless it is the text of a reply
            # already in the turn (stopped while its tools ran).
            streamed = stopped_answer(stream.text) if stream else None
            if streamed and not _in_turn(turn, stream.text if stream else ""):
                turn.append({"role": "assistant", "content": streamed})
            await self.finish(session, msg, turn, streamed or STOPPED_TEXT, "stopped")
            return None
        log.info(
            "turn done session=%s scope=%s status=%s iterations=%d in %.0f ms",
            msg.session_key,
            scope.audience,
            result.status,
            result.iterations,
            (time.monotonic() - started) * 1000,
        )
        if wait_for_model and isinstance(result.error, LLMUnavailable):
            # Every model was unavailable (not refused): not answered, the turn waits.
            return result.error
        # On an LLM failure the user's message (and any finished tool work) stays in history.
        outcome: Outcome = "failed" if result.status == "llm_error" else "ok"
        if isinstance(result.error, BudgetSpent):
            # What the model reads later: not a failure of its own, and no error to repeat.
            close_turn(turn, BUDGET_NOTE)
        await self.finish(session, msg, turn, result.text, outcome)
        if stamp is not None and memory_stamp(self.cfg.agent.workspace_path) != stamp:
            self.spawn(self._commit_memory(msg.session_key))
        return None

    async def _record_writes(self, msg: InboundMessage, before: Stamps) -> None:
        """Remember who changed HEARTBEAT.md or a skill in this turn (bot.provenance)."""
        workspace = self.cfg.agent.workspace_path
        trusted = turn_is_trusted(msg)
        try:
            after = await asyncio.to_thread(watched_stamps, workspace)
            await asyncio.to_thread(self.provenance.record, before, after, msg.session_key, trusted)
        except OSError:
            log.exception("provenance: cannot record writes session=%s", msg.session_key)

    async def _cut_final(self, session: Session, turn: list[dict[str, Any]]) -> str | None:
        """A final answer too long for a chat is written to its file once, and ``turn``'s
        last message becomes the cut text (bot.long_answers); the file's path, or None."""
        final = turn[-1]
        long = await spill(self.cfg.agent.state_path, session.path.name, final["content"] or "")
        if long is None:
            return None
        turn[-1] = {**final, "content": long.text}
        log.warning(
            "answer of %d characters cut for the chat session=%s; the whole answer is %s",
            len(final["content"]),
            session.key,
            long.path,
        )
        return str(long.path)

    async def _fit(
        self, session: Session, msg: InboundMessage, turn: list[dict[str, Any]], text: str
    ) -> tuple[str, tuple[str, ...]]:
        """The answer's text for the chat and the files sent with it: the cut a final_response
        checkpoint made (this turn's, or one resumed after a restart), or a cut made now for
        a long text that came another way (a stopped stream, a reminder)."""
        checkpoint = session.state.checkpoint_of(msg.message_id) or {}
        kept = checkpoint.get(ANSWER_FILE_KEY)
        if kept and turn:
            return str(turn[-1].get("content") or ""), (str(kept),)
        long = await spill(self.cfg.agent.state_path, session.path.name, text)
        if long is None:
            return text, ()
        if turn and turn[-1].get("role") == "assistant" and turn[-1].get("content") == text:
            turn[-1] = {**turn[-1], "content": long.text}
        return long.text, (str(long.path),)

    async def _commit_memory(self, key: str) -> None:
        from bot.memory.versioning import commit_async

        try:
            commit = await commit_async(
                self.cfg.agent.workspace_path,
                self.cfg.agent.state_path,
                f"agent: memory edited in session {key}\n",
            )
            if commit:
                log.info("memory committed %s session=%s", commit[:8], key)
        except Exception:
            log.exception("memory commit failed session=%s", key)

    async def finish(
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
        text, media = await self._fit(session, msg, turn, text)
        # A turn kept without its answer (failed, stopped, given up) still ends with the
        # assistant, so the history alternates as strict chat templates require.
        close_turn(turn, CLOSING_NOTES.get(outcome, NO_ANSWER_NOTE))
        out: OutboundMessage | None = self.answer(msg, text, outcome, {DELIVERY_KEY: delivery_id})
        if msg.kind is TurnKind.HEARTBEAT:
            out = _heartbeat_answer(msg, text, outcome, delivery_id)
        elif msg.kind is TurnKind.TASK:
            out = None  # a task's result is told by its report (bot.tasks), in its chat
        if out is not None and media:
            out = replace(out, media=media)
        entries = [outbox_entry(delivery_id, out)] if out is not None else []
        # Derived under the session lock: a message accepted meanwhile stays pending, and a
        # question still open (/stop) is closed.
        finished = transitions.finish(msg.message_id, entries)
        await self.store.apply_async(session, finished, stored_form(turn))
        failpoints.hit("before_delivery")
        if out is None and msg.kind is TurnKind.HEARTBEAT:
            log.info("heartbeat: nothing to tell session=%s", msg.session_key)
        else:
            await self.bus.publish_outbound(out)
        if msg.policy.shows_typing:
            await self.bus.publish_outbound(
                TurnActivity(msg.channel, msg.chat_id, msg.message_id, Activity.DONE)
            )
        self.last_active[msg.session_key] = time.monotonic()
        self.consolidator.schedule(msg.session_key)
        if msg.kind in SCHEDULED and msg.message_id:
            told = " (nothing to tell)" if out is None and outcome == "ok" else ""
            await asyncio.to_thread(
                self.runs.append, "finished", msg.message_id, outcome=outcome + told
            )

    async def announce_once(self, channel: str, chat_id: str, text: str, marker: str) -> bool:
        """A permanent message outside any turn (a pairing approval), exactly once: its
        ledger entry and ``marker`` are one write, so a marker already there means it was
        sent (or is queued) before. False when it was."""
        delivery_id = f"d-{uuid.uuid4().hex[:12]}"
        out = OutboundMessage(
            channel, chat_id, text, final=True, metadata={DELIVERY_KEY: delivery_id}
        )
        entry = outbox_entry(delivery_id, out)
        session = self.store.get(out.session_key)
        if not await self.store.apply_async(session, transitions.announce(entry, marker)):
            return False
        await self.bus.publish_outbound(out)
        return True

    async def tell_admins(self, text: str) -> None:
        """A notice to the admins' private chats (bot.bus.AdminNotice), logged."""
        log.warning("admin notice: %s", text)
        await self.bus.publish_outbound(AdminNotice(text))

    async def deliver_text(self, session: Session, msg: InboundMessage) -> None:
        """A reminder (a ``deliver: "text"`` job): its text is the answer, through the same
        finish and ledger as any answer, so a crash cannot send it twice; no model call."""
        if session.state.is_pending(msg.message_id):
            said = [{"role": "assistant", "content": msg.text}]
            await self.finish(session, msg, said, msg.text)

    async def fail(self, msg: InboundMessage) -> None:
        """A bug or an I/O error ended the turn: tell the person, keep the loop alive."""
        try:
            await self.finish(self.store.get(msg.session_key), msg, [], FAILED_TEXT, "failed")
        except Exception:
            log.exception("could not record the failed turn session=%s", msg.session_key)
            await self.bus.publish_outbound(self.answer(msg, FAILED_TEXT, "failed"))

    @staticmethod
    def answer(
        msg: InboundMessage, text: str, outcome: Outcome, extra: dict[str, Any] | None = None
    ) -> OutboundMessage:
        """The ``final`` outbound message that answers ``msg``."""
        return OutboundMessage(
            msg.channel,
            msg.chat_id,
            text,
            reply_to=msg.message_id,
            final=True,
            metadata={**(extra or {}), OUTCOME_KEY: outcome},
        )

    async def publish(self, msg: InboundMessage, text: str, final: bool) -> None:
        """Something to show in ``msg``'s chat that is not kept in the delivery ledger."""
        await self.bus.publish_outbound(
            OutboundMessage(msg.channel, msg.chat_id, text, reply_to=msg.message_id, final=final)
        )


def turn_model(session: Session, msg: InboundMessage) -> str | None:
    """The model a turn asks (a name in llm.models; None: llm.model): its chat's ``/model``
    choice, or for a background task the choice of the chat that spawned it, kept with the
    task (its own session has no choice of its own)."""
    if msg.kind is TurnKind.TASK:
        return task_model(msg)
    return session.state.chat_model


def _in_turn(turn: list[dict[str, Any]], text: str) -> bool:
    """Whether ``text`` is the content of the turn's last assistant message."""
    last = next((m for m in reversed(turn) if m.get("role") == "assistant"), None)
    return last is not None and str(last.get("content") or "").strip() == text.strip()


def _heartbeat_answer(
    msg: InboundMessage, text: str, outcome: Outcome, delivery_id: str
) -> OutboundMessage | None:
    """A heartbeat turn's answer, addressed to ``heartbeat.deliverTo`` and kept in the
    heartbeat session's outbox; None when it says there is nothing to tell (or failed: a
    model outage must not message the owner every interval)."""
    tell = heartbeat.worth_telling(text) if outcome == "ok" else None
    if tell is None:
        if outcome != "ok":
            log.warning("heartbeat turn %s session=%s; nothing sent", outcome, msg.session_key)
        return None
    channel, _, chat_id = (msg.classification.deliver_to or "").partition(":")
    return OutboundMessage(
        channel,
        chat_id,
        tell,
        reply_to=msg.message_id,
        final=True,
        metadata={
            DELIVERY_KEY: delivery_id,
            OUTCOME_KEY: outcome,
            LEDGER_SESSION_KEY: msg.session_key,
        },
    )
