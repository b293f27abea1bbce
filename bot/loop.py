"""The agent loop: the one consumer of the inbound queue, and the scheduler of turns.

Turns of one chat run in order (one worker per busy session); different chats run in parallel,
at most ``agent.maxConcurrentTurns`` at once. Every accepted message gets exactly one ``final``
outbound message, whatever happens to its turn: an answer, an error message, or "stopped".

The walk of a message (DESIGN.md sections 1 and 5): ``bot.intake`` makes it a durable pending
turn before the platform is told it arrived; ``dispatch`` queues it on its session; the worker
has the message's channel fetch the files it names, if any (``bot.media``), then
takes a slot and runs it with ``bot.turn`` (checkpoints, the one final answer through the
delivery ledger); ``bot.recovery`` turns whatever a crash left into resumed turns at start.
This module keeps what is between them: order and concurrency, chat commands, ``/stop``,
waiting out a model outage, and the ordered shutdown.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Coroutine
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING, Any

from bot.backoff import Backoff
from bot.bus import Activity, InboundMessage, Intake, MessageBus, TurnActivity
from bot.commands import CommandRouter, CommandSyntax, format_duration, help_text
from bot.config import DEFAULT_MODEL, Config
from bot.cron.schedule import zone
from bot.cron.scheduler import describe_jobs
from bot.cron.store import JobStore
from bot.delivery import DeliveryLedger
from bot.intake import DurableIntake
from bot.kinds import TurnKind
from bot.llm import LLMUnavailable
from bot.media import not_fetched, with_fetched
from bot.memory.consolidate import Consolidator
from bot.memory.dream import Dream, DreamResult, budget_lines
from bot.outage import NOTICE_TEXT, Outage, wall_seconds
from bot.pairing import approve_code
from bot.recovery import GAVE_UP_TEXT, MAX_RESUME_ATTEMPTS, Recovery
from bot.runner import close_open_tool_calls
from bot.session import ANSWERED_BY_KEY, SessionStore, now_iso, transitions
from bot.spend.budget import Budget
from bot.spend.report import chat_text
from bot.tasks import (
    TaskBoard,
    TaskRecord,
    TaskStore,
    describe,
    result_of,
    task_info,
    usage_by_task,
)
from bot.turn import STOPPED_TEXT, Turns, turn_model
from bot.wording import counted

if TYPE_CHECKING:
    from bot.tools.mcp import McpManager

log = logging.getLogger(__name__)


def _cancelling() -> bool:
    """Whether the running task itself has been asked to stop (a cancel that reached it through
    a shielded inner task's ending does not count)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


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
    fetch: asyncio.Task[InboundMessage] | None = None  # the files of the next turn, fetched
    # A background task's turn stopped by /stop ID or its timeout: how its report says it ended.
    ended_as: str | None = None


class Background:
    """Tasks started beside the turns (an immediate command, a memory commit, a notice to the
    admins): held until they end, so none is collected half-way."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


class AgentLoop:
    """Built by the composition root (``bot.app.build_loop``), which wires every collaborator;
    the loop only keeps order, slots and its command table."""

    def __init__(
        self,
        cfg: Config,
        bus: MessageBus,
        store: SessionStore,
        *,
        turns: Turns,
        intake: DurableIntake,
        recovery: Recovery,
        ledger: DeliveryLedger,
        jobs: JobStore,
        consolidator: Consolidator,
        dream: Dream,
        slots: asyncio.Semaphore,
        background: Background,
        outage: Outage | None,
        budget: Budget,
        mcp: McpManager | None = None,
    ) -> None:
        """``slots``: agent.maxConcurrentTurns, shared with the approval desk (a turn waiting
        for a person holds none). ``outage``: set in the daemon, where turns wait for a model
        to come back instead of being answered with the error (a one-shot terminal run)."""
        self.cfg = cfg
        self.mcp = mcp
        self.bus = bus
        self.store = store
        self.ledger = ledger
        self.jobs = jobs
        self.consolidator = consolidator
        self.dream = dream
        self.turns = turns
        self.runner = turns.runner
        self.approvals = turns.approvals
        self.intake = intake
        self.recovery = recovery
        self.outage = outage
        self.budget = budget
        self.dream_backoff = Backoff()
        self._work: dict[str, _SessionWork] = {}
        self._slots = slots
        self._draining = False
        self._background = background
        self.started_at = time.monotonic()
        self.started_wall = time.time()
        agent = cfg.agent
        self.tasks = TaskBoard(
            TaskStore(agent.state_path),
            max_tasks=agent.max_tasks,
            max_per_chat=agent.max_tasks_per_chat,
            timeout_seconds=agent.task_timeout_minutes * 60,
            accept=intake.accept,
            dispatch=self.dispatch,
            outside_slot=self.approvals.outside_slot,
            result=self._task_result,
        )
        # Every command the loop answers, by name; /allow and friends are presses (accept).
        self.commands = CommandRouter(
            {
                "/new": self._new_session,
                "/stop": self._stop_command,
                "/status": self._status_command,
                "/dream": self._dream_command,
                "/approve": self._approve_pairing,
                "/cron": self._cron_command,
                "/usage": self._usage_command,
                "/tasks": self._tasks_command,
                "/budget": self._budget_command,
                "/model": self._model_command,
                "/help": self._help_command,
            }
        )

    async def accept(self, msg: InboundMessage) -> Intake:
        """The bus's intake: approval answers (buttons, ``/allow ID``...) are recorded here,
        durable before the channel confirms them, and never queued as turns; everything else
        goes through the durable intake."""
        if msg.kind is not TurnKind.APPROVAL:
            return await self.intake.accept(msg)
        command = msg.classification.command
        if msg.classification.press is None and command is not None:
            await self._publish(msg, f"Usage: {command.name} ID (the id in the request)", False)
            return "duplicate"
        try:
            reply = await self.approvals.press(msg)
        except OSError as exc:
            log.error("cannot record an approval answer session=%s: %s", msg.session_key, exc)
            reply = "I could not record your answer (a disk problem); please answer again."
        if reply:
            await self._publish(msg, reply, final=False)
        return "duplicate"  # handled: confirm it to the platform, queue nothing

    def resume_review(self) -> None:
        """At the gateway's start: finish or ask about a proposal of Dream's left from before
        (``DreamReview.resume``), in the background."""
        if self.approvals.review is not None:
            self._spawn(self.approvals.review.resume())

    async def announce_once(self, channel: str, chat_id: str, text: str, marker: str) -> bool:
        """A permanent message outside any turn, sent exactly once (``Turns.announce_once``)."""
        return await self.turns.announce_once(channel, chat_id, text, marker)

    def recover(self, keys: list[str] | None = None, channels: set[str] | None = None) -> int:
        """Queue every interrupted turn and undelivered answer (``bot.recovery``); tasks that
        ended before their report was taken are reported (``reconcile_tasks``)."""
        resumed = self.recovery.recover(lambda msg: self.dispatch(msg, resume=True), keys, channels)
        if keys is None:
            self._spawn(self.reconcile_tasks())
        return resumed

    async def reconcile_tasks(self) -> None:
        """A task recorded running whose session has no work left ended while memobot
        stopped before its report was taken (or before its pending turn was written): report
        it now. The report's id makes a second report a duplicate."""
        try:
            records = await self.tasks.records()
        except (OSError, ValueError) as exc:
            log.error("cannot read the task store: %s", exc)
            return
        for rec in records.values():
            if rec.state != "running" or rec.started >= self.started_wall:
                continue  # ended, or started by this run (its pending turn is being written)
            # One step with a resumed spawn call queueing a task the crash left unqueued.
            if not await self.tasks.unqueued(rec.id, partial(self._has_work, rec.session_key)):
                continue  # resumed by recovery (or queued by its spawn call); it reports
            result = await self._task_result(rec.session_key)
            log.info("task %s ended while memobot was down: reporting it now", rec.id)
            await self.tasks.ended(rec.id, "done" if result else "failed", result)

    async def _has_work(self, key: str) -> bool:
        peeked = await asyncio.to_thread(self.store.peek_state, key)
        return peeked is not None and peeked.has_work

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
            await self.dream_tick()

    async def dream_tick(self) -> None:
        """One scheduled Dream, unless it is backing off after failures in a row (doubling,
        capped: bot.backoff); the admins are told once when it starts backing off."""
        if not self.dream_backoff.ready():
            log.info(
                "scheduled dream skipped: backing off %.0f s more after %d failures",
                self.dream_backoff.wait_left(),
                self.dream_backoff.failures,
            )
            return
        try:
            result = await self.dream.run()
            log.info("scheduled %s", result.describe())
        except Exception as exc:
            log.exception("scheduled dream failed")
            result = DreamResult("failed", detail=str(exc) or type(exc).__name__)
        if result.status == "paused":
            return  # a spent budget: neither a failure nor a success
        if result.status != "failed":
            self.dream_backoff.succeeded()
            return
        if self.dream_backoff.failed():
            await self.turns.tell_admins(
                f"Dream failed {self.dream_backoff.failures} times in a row ({result.detail}); "
                f"the scheduled runs wait {format_duration(self.dream_backoff.delay())} now, "
                "doubling after each further failure. /dream runs it at once."
            )

    async def _idle_compactor(self) -> None:
        idle_seconds = self.cfg.memory.idle_compact_minutes * 60
        keep = self.cfg.memory.keep_recent_messages
        last_active = self.turns.last_active
        while True:
            await asyncio.sleep(min(60.0, max(1.0, idle_seconds / 4)))
            now = time.monotonic()
            for key, last in list(last_active.items()):
                if now - last < idle_seconds or key in self.running_keys():
                    continue
                del last_active[key]  # once per idle period
                if self.store.get(key).unconsolidated > keep:
                    log.info("idle compaction session=%s", key)
                    await self.consolidator.consolidate(key, keep=keep)

    def dispatch(self, msg: InboundMessage, resume: bool = False) -> None:
        """Route one accepted message: immediate commands now, everything else to its session."""
        if msg.classification.immediate and not resume:
            self._spawn(self._immediate(msg))
            return
        work = self._work.setdefault(msg.session_key, _SessionWork())
        work.queue.append(_Job(msg, resume))
        if work.worker is None or work.worker.done():
            work.worker = asyncio.create_task(
                self._drain(msg.session_key, work), name=f"session:{msg.session_key}"
            )

    async def _immediate(self, msg: InboundMessage) -> None:
        """A command answered at once, beside a running turn; its answer is not kept in the
        delivery ledger (it was never stored)."""
        text = await self.commands.route(msg)
        if text is not None:
            await self._publish(msg, text, final=True)

    async def _help_command(self, msg: InboundMessage, args: str) -> str:
        return help_text(self.bus.command_syntax.get(msg.channel, CommandSyntax()))

    async def _dream_command(self, msg: InboundMessage, args: str) -> str:
        if not msg.sender.is_admin:
            return "Only an admin of this bot may run /dream."
        if self.dream.running:
            return "Dream is already running."
        await self._publish(msg, "Dreaming: distilling the history archive...", final=False)
        result = await self.dream.run()
        if result.status not in ("failed", "paused"):
            self.dream_backoff.succeeded()  # the schedule need not wait any longer
        return result.describe()

    async def _status_command(self, msg: InboundMessage, args: str) -> str:
        return self.status_text(msg.session_key)

    async def _stop_command(self, msg: InboundMessage, args: str) -> str:
        if args.strip():
            return await self._stop_task_command(msg, args.strip().split()[0])
        if not self._may_stop(msg):
            return "Only the person who asked, or an admin, may stop this answer."
        if self.stop(msg.session_key):
            return "Stopping the current answer."
        return "Nothing is running in this chat."

    async def _approve_pairing(self, msg: InboundMessage, code: str) -> str:
        if not msg.sender.is_admin:
            return "Only an admin of this bot may approve pairing codes."
        if not code.strip():
            return "Usage: /approve CODE (the code the new person was given)"
        approved = await asyncio.to_thread(approve_code, self.cfg.agent.state_path, code)
        if approved is None:
            return "No waiting pairing code like that (codes expire after 1 hour)."
        log.info(
            "pairing approved from chat session=%s channel=%s id=%s",
            msg.session_key,
            approved.channel,
            approved.sender_id,
        )
        name = f" ({approved.name})" if approved.name else ""
        return f"Approved {approved.channel} user {approved.sender_id}{name}. They will be told."

    async def _cron_command(self, msg: InboundMessage, args: str) -> str:
        key = msg.session_key
        try:
            jobs = (await asyncio.to_thread(self.jobs.load)).of_session(key)
        except (OSError, ValueError) as exc:
            log.error("cannot read the job store session=%s: %s", key, exc)
            return "I could not read the scheduled jobs; see the logs."
        if not jobs:
            return "No scheduled jobs in this chat."
        lines = describe_jobs(jobs, datetime.now(UTC))
        return "Scheduled jobs in this chat:\n" + "\n".join(lines)

    async def _usage_command(self, msg: InboundMessage, args: str) -> str:
        """This chat's figures; an admin's, in a private chat, every chat's (in a group the
        others would read which chats exist and what they spent)."""
        everyone = msg.sender.is_admin and not msg.sender.is_group
        tz = zone(self.cfg.agent.timezone)
        try:
            return await asyncio.to_thread(
                chat_text,
                self.cfg.agent.state_path,
                tz,
                None if everyone else msg.session_key,
            )
        except OSError as exc:
            log.error("cannot read the usage ledger session=%s: %s", msg.session_key, exc)
            return "I could not read the usage ledger; see the logs."

    async def _stop_task_command(self, msg: InboundMessage, task_id: str) -> str:
        """``/stop ID``: this chat's task, by the person who started it or an admin. A task
        of another chat is not found here (its id tells nothing about it)."""
        try:
            rec = (await self.tasks.records()).get(task_id)
        except (OSError, ValueError) as exc:
            log.error("cannot read the task store session=%s: %s", msg.session_key, exc)
            return "I could not read the background tasks; see the logs."
        if rec is None or rec.parent != msg.session_key:
            return f"No background task {task_id} in this chat (see /tasks)."
        if rec.starter != msg.sender_id and not msg.sender.is_admin:
            log.info("task stop refused id=%s by=%s session=%s", rec.id, msg.sender_id, rec.parent)
            return f"Only the person who started task {rec.id}, or an admin, may stop it."
        return await self.cancel_task(rec, f"{msg.session_key}/{msg.sender_id}")

    async def cancel_task(self, rec: TaskRecord, by: str) -> str:
        """Stop a task, as ``/stop ID`` and the panel do (who may was checked by the caller):
        its running turn is stopped as ``/stop`` stops any (its processes killed), and it
        reports "stopped"; what to tell the one who asked."""
        if rec.state != "running":
            return f"Task {rec.id} has already ended ({rec.state})."
        log.info("task stop asked id=%s session=%s by %s", rec.id, rec.parent, by)
        if self._stop_task(rec.session_key, "stopped"):
            return f"Stopping task {rec.id}."
        # Queued for a turn slot, or between a restart and its resume: asked durably, and
        # it ends "stopped" when its turn comes (``_process``).
        await asyncio.to_thread(self.tasks.store.request_cancel, rec.id)
        return f"Task {rec.id} is waiting to run; it stops as soon as its turn comes."

    def _stop_task(self, key: str, reason: str) -> bool:
        work = self._work.get(key)
        if work is not None:
            work.ended_as = reason
        log.info("task %s session=%s", reason, key)
        return self.stop(key)

    async def _task_result(self, key: str) -> str:
        """A task's result: the last answer of its session ``key``."""
        session = await asyncio.to_thread(self.store.get, key)
        return result_of(session.messages)

    async def _task_ended(self, key: str, msg: InboundMessage, work: _SessionWork) -> None:
        """A task's turn is over (its answer written, its pending entry gone): report it."""
        session = self.store.get(key)
        if session.state.is_pending(msg.message_id):
            return  # not over: a shutdown interrupted it, and it resumes at the next start
        state, work.ended_as = work.ended_as or "done", None
        task_id = str(task_info(msg).get("id") or key.partition(":")[2])
        await self.tasks.ended(task_id, state, result_of(session.messages))

    async def _ended_before_its_turn(self, msg: InboundMessage) -> str | None:
        """How this task ended before its turn came: "stopped" (``memobot tasks cancel``,
        ``/stop ID`` of a queued task), "timed out" (its time, counted from its start, ran out
        before a resume); None: it runs."""
        task_id = str(task_info(msg).get("id") or "")
        try:
            rec = (await self.tasks.records()).get(task_id)
        except (OSError, ValueError) as exc:  # the task runs; a cancel is seen once mended
            log.error("cannot read the task store session=%s: %s", msg.session_key, exc)
            rec = None
        if rec is not None and rec.cancel:
            return "stopped"
        if self.tasks.left(rec) <= 0:  # the record just read: not the store again
            return "timed out"
        return None

    async def _tasks_command(self, msg: InboundMessage, args: str) -> str:
        try:
            records = await self.tasks.records()
        except (OSError, ValueError) as exc:
            log.error("cannot read the task store session=%s: %s", msg.session_key, exc)
            return "I could not read the background tasks; see the logs."
        here = [r for r in records.values() if r.parent == msg.session_key]
        if not here:
            return "No background tasks in this chat."
        tz = zone(self.cfg.agent.timezone)
        try:
            usage = await asyncio.to_thread(usage_by_task, self.cfg.agent.state_path, tz)
        except OSError as exc:  # the list still helps without the figures
            log.error("cannot read the usage ledger session=%s: %s", msg.session_key, exc)
            usage = {}
        lines = describe(here, time.time(), usage)
        return "Background tasks in this chat:\n" + "\n".join(lines)

    async def _budget_command(self, msg: InboundMessage, args: str) -> str:
        """The limits and their use; an admin may raise, lift or restore one (recorded in
        the state folder, logged with who did it)."""
        if not msg.sender.is_admin:
            return "Only an admin of this bot may see or change the budget."
        return await self.budget.command(args, f"{msg.session_key}/{msg.sender_id}")

    async def _model_command(self, msg: InboundMessage, args: str) -> str:
        """The named models and this chat's; ``/model NAME`` switches this chat's (kept in its
        session), ``/model default`` back to llm's own. Who may switch: llm.modelSwitch."""
        provider = self.runner.provider
        models = self.cfg.llm.models
        session = self.store.get(msg.session_key)
        current = session.state.chat_model if session.state.chat_model in models else None
        name = args.strip()
        if not name:
            lines = [f"{'*' if current is None else '-'} default: {self.cfg.llm.model}"]
            lines += [
                f"{'*' if n == current else '-'} {n}: {models[n].model}" for n in provider.models
            ]
            return "Models (* this chat's; /model NAME to switch):\n" + "\n".join(lines)
        if self.cfg.llm.model_switch == "admins" and not msg.sender.is_admin:
            return "Only an admin of this bot may switch the model."
        if name != DEFAULT_MODEL and name not in models:
            named = ", ".join([DEFAULT_MODEL, *provider.models])
            return f"No model named {name[:60]!r}. Named: {named}."
        chosen = None if name == DEFAULT_MODEL else name
        await self.store.apply_async(session, transitions.choose_model(chosen))
        log.info(
            "chat model set to %s (%s) session=%s by=%s",
            name,
            provider.describe(chosen),
            msg.session_key,
            msg.sender_id,
        )
        model = self.cfg.llm.model if chosen is None else models[name].model
        return f"This chat now uses {name} ({model}) from the next message on."

    def _may_stop(self, msg: InboundMessage) -> bool:
        work = self._work.get(msg.session_key)
        if work is None or not msg.sender.is_group:
            return True
        return work.turn_sender == msg.sender_id or msg.sender.is_admin

    def stop(self, key: str) -> bool:
        """Cancel the running turn of one chat (``/stop``); other chats are untouched."""
        work = self._work.get(key)
        # Not a turn yet, but what its chat waits for: the model's return, or its files.
        for task in (work.wait, work.fetch) if work is not None else ():
            if task is not None and not task.done():
                assert work is not None
                work.stop_requested = True
                task.cancel()
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

    @property
    def sessions_at_work(self) -> int:
        """Sessions with a queued, running or waiting turn; idle ones are not kept."""
        return len(self._work)

    def running_keys(self) -> list[str]:
        return [k for k, w in self._work.items() if w.turn is not None and not w.turn.done()]

    async def _drain(self, key: str, work: _SessionWork) -> None:
        try:
            await self._work_through(key, work)
        finally:
            # Nothing left for this chat: its bookkeeping goes, so memory follows the chats
            # active now, not every chat seen since the start.
            if not work.queue and self._work.get(key) is work:
                del self._work[key]

    async def _work_through(self, key: str, work: _SessionWork) -> None:
        while work.queue and not self._draining:
            job = work.queue.popleft()
            if job.msg.files:
                # Outside a slot (a download is no model turn) and in the chat's order.
                # Cancelled by a shutdown, the turn stays pending with its files named, and
                # they are fetched at the next start.
                fetched = await self._with_media(key, work, job)
                if fetched is None:
                    continue  # /stop while its files came: answered "Stopped."
                job = fetched
            if self.outage is not None and self.outage.active and job.turn is None:
                # The model is known to be down: wait without spending a slot on retries.
                if job.msg.policy.waits_for_model and not self._on_own_model(key, job.msg):
                    await self._wait_for_model(key, work, job, None)
                    if job.msg.kind is TurnKind.TASK:
                        await self._task_ended(key, job.msg, work)  # unless it waits again
                    continue
            async with self._slots:
                if self._draining:
                    return  # shutting down: the job stays pending on disk for the next start
                work.stop_requested = False
                work.turn_sender = job.msg.sender_id
                info = task_info(job.msg)
                task_id = str(info.get("id") or "")
                if job.msg.kind is TurnKind.TASK and isinstance(info.get("parent"), str):
                    self.budget.charge_to(key, info["parent"])  # its calls: its chat's budget
                # Counted from the task's start: a restart does not give it its whole time again.
                left = await self.tasks.time_left(task_id) if job.msg.kind is TurnKind.TASK else 0
                work.turn = asyncio.create_task(self._process(job, work), name=f"turn:{key}")
                timer = unwatch = None
                if job.msg.kind is TurnKind.TASK:
                    # None left: _process ends it "timed out" without running it.
                    timer = asyncio.get_running_loop().call_later(
                        max(left, 1.0), self._stop_task, key, "timed out"
                    )
                    unwatch = self.tasks.watch(task_id, lambda: self._stop_task(key, "stopped"))
                try:
                    await asyncio.shield(work.turn)
                except asyncio.CancelledError:
                    # The worker itself is being cancelled (shutdown), even if the turn ended
                    # in the same loop pass; otherwise the turn ended cancelled and is done.
                    if _cancelling() or not work.turn.done():
                        work.turn.cancel()
                        raise
                except Exception:
                    log.exception("turn crashed session=%s", key)
                    work.ended_as = work.ended_as or "failed"
                    await self.turns.fail(job.msg)
                finally:
                    work.turn = None
                    if timer is not None:
                        timer.cancel()
                    if unwatch is not None:
                        unwatch()
            if job.msg.kind is TurnKind.TASK and work.waiting is None:
                await self._task_ended(key, job.msg, work)
            if work.waiting is not None:
                turn, work.waiting = work.waiting, None
                await self._wait_for_model(key, work, job, turn)
                if job.msg.kind is TurnKind.TASK:
                    await self._task_ended(key, job.msg, work)  # stopped or given up waiting

    async def _with_media(self, key: str, work: _SessionWork, job: _Job) -> _Job | None:
        """``job`` with the files its message names fetched by its channel (``bot.media``).
        Not for a turn whose user message is already written: a checkpoint's, or one that
        waited out a model outage, or a command's (no user message at all). None: ``/stop``
        ended it meanwhile, and it is answered "Stopped." (a download may take minutes)."""
        msg = job.msg
        if job.turn is not None or not msg.policy.uses_model:
            return job
        if self.store.get(key).state.checkpoint_of(msg.message_id):
            return job
        work.stop_requested = False
        work.turn_sender = msg.sender_id
        work.fetch = asyncio.create_task(self.bus.fetch_media(msg), name=f"fetch:{key}")
        try:
            fetched = await asyncio.shield(work.fetch)
        except asyncio.CancelledError:
            if _cancelling() or not work.fetch.done():
                work.fetch.cancel()  # shutdown: fetched again at the next start
                raise
            log.info("fetching files stopped session=%s id=%s", key, msg.message_id)
            stopped = with_fetched(msg, not_fetched(msg.files, "stopped before it came"))
            session = self.store.get(key)
            turn = await self.turns.answerable_turn(session, stopped)
            await self.turns.finish(session, stopped, turn, STOPPED_TEXT, "stopped")
            return None
        finally:
            work.fetch = None
        log.info(
            "files fetched session=%s id=%s saved=%d of %d",
            key,
            msg.message_id,
            len(fetched.media) - len(msg.media),
            len(msg.files),
        )
        return replace(job, msg=fetched)

    # -- one turn --------------------------------------------------------------------------

    async def _process(self, job: _Job, work: _SessionWork) -> None:
        msg = job.msg
        session = self.store.get(msg.session_key)
        if msg.kind is TurnKind.COMMAND:
            # In order with the chat's turns (/new); a handler that answers itself says None.
            text = await self.commands.route(msg)
            if text is not None:
                await self.turns.finish(session, msg, [], text)
            return
        if msg.kind in (TurnKind.REMINDER, TurnKind.REPORT):
            await self.turns.deliver_text(session, msg)
            return
        if msg.kind is TurnKind.TASK and (ended := await self._ended_before_its_turn(msg)):
            work.ended_as = ended
            turn = await self.turns.answerable_turn(session, msg)
            close_open_tool_calls(turn)
            await self.turns.finish(session, msg, turn, STOPPED_TEXT, "stopped")
            return
        turn = job.turn
        paused = None
        if turn is None and job.resume:
            resumed = await self.recovery.resume(session, msg)
            if resumed is None:
                return  # already finished: the final write landed before the crash
            if resumed.phase == "final_response":
                text = resumed.messages[-1]["content"] or ""
                await self.turns.finish(session, msg, resumed.messages, text)
                return
            if resumed.gave_up:
                text = GAVE_UP_TEXT.format(n=MAX_RESUME_ATTEMPTS)
                await self.turns.finish(session, msg, resumed.messages, text)
                return
            turn = resumed.messages
            paused = resumed.approval
        if turn is None:
            turn = [await self.turns.user_message(msg)]
        unavailable = await self.turns.run(
            session,
            msg,
            turn,
            stop_requested=lambda: work.stop_requested,
            wait_for_model=self.outage is not None and not self._on_own_model(msg.session_key, msg),
            approval=paused,
        )
        if unavailable is not None:
            assert self.outage is not None
            self.outage.begin(str(unavailable), unavailable.rate_limited, unavailable.retry_after)
            work.waiting = turn  # the worker waits for the model outside its slot

    def _on_own_model(self, key: str, msg: InboundMessage) -> bool:
        """The chat uses a model of llm.models (``/model``). An outage is watched on llm.model
        (its probe): such a chat's turns neither wait for it nor begin one (when its model and
        the fallbacks stay unavailable, the turn is answered with the error), else a chat on
        a dead endpoint would hold every chat's turns, again and again, while llm.model works."""
        return turn_model(self.store.get(key), msg) in self.cfg.llm.models

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
        info = session.state.wait_info(msg.message_id)
        if info is None:
            return  # no longer pending: nothing to answer
        since = info.get("since") or now_iso()
        # The heartbeat has no chat to tell; its turn just waits.
        tell = not info.get("notified") and key not in self.outage.notified and msg.policy.sends
        # A restart while the turn waited counted as a resume attempt; waiting is not a crash
        # of the turn, so the count starts over (else three restarts in an outage give up).
        resumed = (session.state.resume or {}).get("message_id") == msg.message_id
        if not info.get("since") or tell or resumed:
            notified = bool(info.get("notified")) or tell
            await self.store.apply_async(
                session, transitions.waiting_for_model(msg.message_id, since, notified, resumed)
            )
        if tell:
            self.outage.notified.add(key)
            await self._publish(msg, NOTICE_TEXT, final=False)
        if msg.policy.shows_typing:
            # Waiting is not working: the turn shows typing again when it runs again.
            await self.bus.publish_outbound(
                TurnActivity(msg.channel, msg.chat_id, msg.message_id, Activity.WAITING_FOR_MODEL)
            )
        started = wall_seconds(since) or time.time()
        deadline = started + self.outage.cfg.max_wait_minutes * 60
        work.stop_requested = False
        work.wait = asyncio.create_task(
            self.outage.wait(key, started, deadline), name=f"wait:{key}"
        )
        try:
            back = await asyncio.shield(work.wait)
        except asyncio.CancelledError:
            if _cancelling() or not work.wait.done():
                work.wait.cancel()  # shutdown: the turn stays pending for the next start
                raise
            back = None  # /stop cancelled the wait
        finally:
            work.wait = None
        if back:
            work.queue.appendleft(_Job(msg, job.resume, turn))
            return
        if turn is None:
            turn = await self.turns.answerable_turn(session, msg)
        close_open_tool_calls(turn)
        if back is None:
            log.info("waiting turn stopped session=%s", key)
            await self.turns.finish(session, msg, turn, STOPPED_TEXT, "stopped")
        else:
            log.error(
                "turn waited llm.outage.maxWaitMinutes (%g) for the model session=%s",
                self.outage.cfg.max_wait_minutes,
                key,
            )
            await self.turns.finish(session, msg, turn, LLMUnavailable.user_message, "failed")

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        self._background.spawn(coro)

    async def _publish(self, msg: InboundMessage, text: str, final: bool) -> None:
        await self.turns.publish(msg, text, final)

    # -- shutdown --------------------------------------------------------------------------

    async def shutdown(self, drain_seconds: float) -> None:
        """Stop intake, mark running sessions interrupted, let turns finish, cancel the rest."""
        self._draining = True
        self.intake.closed = True
        self.bus.accepting = False
        running = self.running_keys()
        for key in running:
            self.store.apply(self.store.get(key), transitions.interrupted(now_iso(), "shutdown"))
        turns = [w.turn for w in self._work.values() if w.turn is not None and not w.turn.done()]
        for key in running:
            turn = self._work[key].turn
            if turn is not None and self.store.get(key).state.open_approval is not None:
                # Waiting for a person: nothing to drain. The pause stays in the checkpoint.
                turn.cancel()
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

    async def _new_session(self, msg: InboundMessage, args: str) -> None:
        """``/new``: in order with the chat's turns; it ends its own turn (through the ledger)."""
        session = self.store.get(msg.session_key)
        count = session.unconsolidated
        if not await self.consolidator.compact_all(msg.session_key):
            await self.turns.finish(
                session,
                msg,
                [],
                "I could not save this conversation to the memory archive (a disk problem; see "
                "the logs), so I kept it as it is. Nothing was lost; try /new again later.",
            )
            return
        log.info("session reset session=%s archived=%d", msg.session_key, count)
        await self.turns.finish(
            session,
            msg,
            [],
            "New conversation started."
            + (
                f" The previous {counted(count, 'message')} "
                f"{'was' if count == 1 else 'were'} archived to memory."
                if count
                else ""
            ),
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
        chosen = self.cfg.llm.models.get(session.state.chat_model or "")
        model = f"{session.state.chat_model} ({chosen.model})" if chosen else self.cfg.llm.model
        return "\n".join(
            [
                f"model: {model}"
                + (
                    f" (+{counted(len(self.cfg.llm.fallbacks), 'fallback')})"
                    if self.cfg.llm.fallbacks
                    else ""
                ),
                *([f"last answer by: {answered_by}"] if answered_by else []),
                *([f"outage: {outage}"] if outage else []),
                f"session: {key}",
                f"conversation: {counted(live, 'message')}, ~{tokens:,} tokens "
                f"(context window {self.cfg.llm.context_window_tokens:,})",
                f"archived messages: {session.last_consolidated}",
                "memory: "
                + ", ".join(budget_lines(self.cfg.agent.workspace_path, self.cfg.memory.max_chars)),
                f"answer in progress: {'yes' if running else 'no'}"
                + (" (waiting for the model)" if waiting else "")
                + (" (waiting for an approval)" if session.state.open_approval else ""),
                *([f"mcp: {self.mcp.summary()}"] if self.mcp and self.mcp.servers else []),
                *(
                    [f"budget paused: {', '.join(paused)}"]
                    if (paused := self.budget.paused())
                    else []
                ),
                f"uptime: {format_duration(time.monotonic() - self.started_at)}",
            ]
        )
