"""Paused turns and the answers that resume them (tools.approval; DESIGN.md sections 10, 11).

The gate decides which call needs a person's yes (:mod:`bot.gate.approval`); this desk asks,
waits and records. A question is durable before it is shown: the turn's checkpoint becomes
``awaiting_approval`` with the approval record, so a restart finds the pause and waits again
(the old buttons keep working). An answer is durable before the call runs: the press (or the
timeout, or ``/stop``) rewrites the record under the session lock, first writer wins, so a call
is never run twice and a late press after the timeout is told "expired".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bot import failpoints
from bot.bus import Activity, InboundMessage, MessageBus, OutboundMessage, TurnActivity
from bot.config import Config
from bot.gate.approval import (
    CHOICES,
    MAX_REVIEW_CHARS,
    SHOW,
    WAITING,
    ApprovalPolicy,
    Question,
    answer_hint,
    asked_call,
    denied_result,
    describe_call,
    group_tool_names,
    legacy_keys,
    limited_tool_names,
    may_answer,
    new_record,
    no_buttons_result,
    no_owner_result,
    question_for,
    too_long_result,
)
from bot.gate.effects import Effects
from bot.gate.question import QuestionView, full_text, one_line, question_markdown
from bot.kinds import APPROVAL_KEY, TERMINAL, TurnKind
from bot.llm import ToolCall
from bot.privacy import PrivacyScope
from bot.runner import Approver
from bot.session import Session, SessionState, SessionStore, transitions
from bot.session.state import Entry
from bot.tools.base import ToolRegistry
from channels import registry

if TYPE_CHECKING:
    from bot.memory.review import DreamReview

log = logging.getLogger(__name__)

Checkpoint = Callable[[str, list[dict[str, Any]], dict[str, Any] | None], Awaitable[None]]

PRESS_REPLIES = {
    "once": "Allowed once.",
    "always": "Allowed. This exact call will run without asking again in {where}.",
    "deny": "Denied.",
}
WHERE_KEPT = 256  # approval id -> session, for presses from another chat (unattended turns)
EXPIRED = "This approval has expired; nothing was run."
STOPPED = "This approval was cancelled (/stop); nothing was run."
ANSWERED = "This approval was already answered."


def policy_for(cfg: Config) -> ApprovalPolicy:
    tools = cfg.tools
    return ApprovalPolicy(
        mode=tools.approval,
        exec_allow=tuple(tools.exec.allow),
        safe_mcp=tuple(tools.safe_mcp_tools),
        workspace=cfg.agent.workspace_path,
        restrict_to_workspace=tools.restrict_to_workspace,
        timeout_seconds=tools.approval_timeout_minutes * 60,
    )


def offered_tools(
    cfg: Config, msg: InboundMessage, tools: Mapping[str, Effects], scope: PrivacyScope
) -> set[str] | None:
    """The tools a turn may use, by its privacy scope: None (all) for the owner; in groups
    ``groupTools`` (all for an admin's own turn with ``groupAdminTools``); in a non-admin's
    private chat ``dmTools``. A chat without channel settings gets the defaults, chosen by
    each tool's declared effects (:func:`bot.gate.approval.offered_by_default`)."""
    if msg.classification.narrowed:
        # An unattended turn a non-admin shaped: the default group tools, whatever the config.
        return group_tool_names(tools, None, cfg.tools.safe_mcp_tools)
    if scope.is_owner:
        return None
    channel = registry.settings_for(cfg, msg.session_key)
    safe_mcp = cfg.tools.safe_mcp_tools
    if scope.audience == "group":
        if channel is not None and channel.group_admin_tools and scope.admin:
            return None
        return group_tool_names(tools, channel.group_tools if channel else None, safe_mcp)
    configured = channel.dm_tools if channel is not None else None
    return limited_tool_names(tools, configured, safe_mcp, scoped_files=True)


def elsewhere(record: dict[str, Any], msg: InboundMessage) -> bool:
    """Whether ``msg`` may answer ``record`` from outside the session that waits: any chat for
    an unattended turn's question (an admin answers it), the chat that started it for a
    background task's question (its starter answers it)."""
    if record.get("owner"):
        return True
    asked_in = {(str(c[0]), str(c[1])) for c in record.get("asked_in") or []}
    return (msg.channel, msg.chat_id) in asked_in


def owner_channel(msg: InboundMessage) -> tuple[str, str]:
    """(channel, chat) an unattended turn belongs to: where its owner is looked for first
    (the heartbeat's answers go to ``heartbeat.deliverTo``: there)."""
    if msg.kind is TurnKind.HEARTBEAT:
        channel, _, chat = (msg.classification.deliver_to or "").partition(":")
        return channel, chat
    return msg.channel, msg.chat_id


def question_view(
    record: dict[str, Any], question: Question, timeout_minutes: float
) -> QuestionView:
    return QuestionView(
        record["id"], question.intro, question.subject, answer_hint(record["id"], timeout_minutes)
    )


def choices(question: Question) -> dict[str, str]:
    """The answers a question's buttons offer: choice -> label."""
    return {"once": "Allow once", "always": question.always_label, "deny": "Deny"}


@dataclass(frozen=True, slots=True)
class OpenQuestion:
    """A question that waits for its answer, as its chat shows it (the panel's chat)."""

    record: Entry
    question: Question
    view: QuestionView


class ApprovalDesk:
    """Asks, waits for and records the answers of one agent loop's paused turns."""

    def __init__(
        self,
        cfg: Config,
        store: SessionStore,
        bus: MessageBus,
        tools: ToolRegistry,
        slots: asyncio.Semaphore | None = None,
    ) -> None:
        self.policy = policy_for(cfg)
        self.cfg = cfg
        # The tools the turns run: their declared effects decide what is asked.
        self.tools = tools
        self.timeout_minutes = cfg.tools.approval_timeout_minutes
        self.store = store
        self.bus = bus
        self._waiting: dict[str, asyncio.Future[str]] = {}
        # The session of each recent approval: an unattended turn's question is answered in
        # an admin's private chat, not in the session that waits.
        self._where: OrderedDict[str, str] = OrderedDict()
        # The loop's turn slots (agent.maxConcurrentTurns): a question may wait for half an
        # hour, and its slot is better used by other chats meanwhile.
        self.slots = slots
        # Dream's proposals (memory.dreamReview): questions of this desk kept in the state
        # folder, not in a turn's checkpoint; a press of one of their ids goes there.
        self.review: DreamReview | None = None

    def approver(
        self,
        session: Session,
        msg: InboundMessage,
        checkpoint: Checkpoint,
        restored: dict[str, Any] | None = None,
    ) -> Approver:
        """The runner's ``approve`` for one turn. ``restored``: the waiting approval of a turn
        resumed after a restart (asked before; it is waited for again, not asked again)."""

        async def approve(call: ToolCall, turn: list[dict[str, Any]]) -> str | None:
            nonlocal restored
            record = restored if restored and restored.get("call_id") == call.id else None
            restored = None
            if record is None:
                allowed_here = list(session.state.approved_calls)
                question = self.question(call, allowed_here)
                if question is None:
                    return None
                await self._forget_legacy(session, allowed_here)
                if len(question.subject) > MAX_REVIEW_CHARS:
                    log.warning(
                        "approval refused session=%s tool=%s: %d characters, too long to review",
                        msg.session_key,
                        call.name,
                        len(question.subject),
                    )
                    return too_long_result(len(question.subject))
                # A person's turn (or their background task's) where nobody can press a
                # button is decided here; an unattended turn asks an admin elsewhere.
                where = msg.session_key
                if msg.kind is TurnKind.TASK:
                    where = msg.classification.deliver_to or where
                unasked = "ask" if msg.policy.unattended else registry.approvals(self.cfg, where)
                if unasked != "ask":
                    log.warning(
                        "approval %s unasked session=%s tool=%s: nobody there can answer",
                        "given" if unasked == "allow" else "refused",
                        msg.session_key,
                        call.name,
                    )
                    return None if unasked == "allow" else no_buttons_result()
                owners = await self._owner_chats(msg) if msg.policy.unattended else None
                if owners == []:
                    log.warning(
                        "approval refused session=%s tool=%s: an unattended turn, and no "
                        "admin's private chat to ask in",
                        msg.session_key,
                        call.name,
                    )
                    return no_owner_result()
                record = new_record(
                    call.id,
                    call.name,
                    question,
                    msg.sender_id,
                    msg.sender.is_group,
                    self.policy.timeout_seconds,
                    owner_chats=owners,
                )
                if msg.kind is TurnKind.TASK:
                    # Nobody reads the task's own session: asked of its starter, in the chat
                    # that started it (the task's deliver_to).
                    channel, _, chat = (msg.classification.deliver_to or "").partition(":")
                    record["asked_in"] = [[channel, chat]]
                await checkpoint("awaiting_approval", turn, record)
                log.info(
                    "approval asked session=%s id=%s tool=%s%s",
                    msg.session_key,
                    record["id"],
                    call.name,
                    f" in {len(owners)} admin chat(s)" if owners else "",
                )
                ask = True
            else:
                question = describe_call(call.name, call.arguments, self._effects(call.name))
                # A terminal's question dies with its process: ask again. Platforms keep
                # the old buttons, which still work; asking there again would only repeat.
                ask = msg.channel == TERMINAL
            await self._activity(msg, Activity.WAITING_FOR_PERSON)
            if ask:
                await self._ask(msg, record, question)
            outcome = await self._wait(session, msg, record)
            log.info("approval %s session=%s id=%s", outcome, msg.session_key, record["id"])
            if outcome != "stopped":  # the turn goes on (a stopped one is ending)
                await self._activity(msg, Activity.WORKING)
            if outcome in ("once", "always"):
                failpoints.hit("approval_recorded")
                return None
            return denied_result(outcome, self.timeout_minutes)

        return approve

    def question(self, call: ToolCall, allowed_here: list[str]) -> Question | None:
        """What to ask before ``call`` runs (None: it runs unasked), by the policy and the
        effects its tool declared."""
        return question_for(
            self.policy, self._effects(call.name), call.name, call.arguments, allowed_here
        )

    def _effects(self, name: str) -> Effects | None:
        tool = self.tools.get(name)
        return tool.effects if tool is not None else None

    async def _forget_legacy(self, session: Session, allowed_here: list[str]) -> None:
        """Drop "always" entries of an older memobot that allowed a tool whatever its
        arguments (``tool:<name>``): they allow nothing now, and are removed once, logged."""
        old = legacy_keys(allowed_here)
        if not old:
            return
        log.warning(
            "approvals: ignoring and removing %d old 'always allow' entr%s of session=%s that "
            "allowed a whole tool whatever its arguments (%s); such calls are asked again",
            len(old),
            "y" if len(old) == 1 else "ies",
            session.key,
            ", ".join(k.removeprefix("tool:") for k in old),
        )
        forget = transitions.forget_approved_calls(lambda k: k.startswith("tool:"))
        await self.store.apply_async(session, forget)

    async def _owner_chats(self, msg: InboundMessage) -> list[tuple[str, str]]:
        channel, chat = owner_channel(msg)
        try:
            return await self.bus.owner_chats(channel, chat)
        except Exception:
            log.exception("cannot find the admins' chats session=%s", msg.session_key)
            return []

    async def _activity(self, msg: InboundMessage, activity: Activity) -> None:
        if msg.policy.shows_typing:  # a heartbeat's turn never shows typing
            await self.bus.publish_outbound(
                TurnActivity(msg.channel, msg.chat_id, msg.message_id, activity)
            )

    def _chats(
        self, msg: InboundMessage, record: dict[str, Any]
    ) -> list[tuple[str, str, str | None]]:
        """Where the question is shown: (channel, chat, the message it replies to)."""
        if not record.get("asked_in"):
            return [(msg.channel, msg.chat_id, msg.message_id)]
        chats = []
        for channel, chat_id in record.get("asked_in") or []:
            here = (channel, chat_id) == (msg.channel, msg.chat_id)
            chats.append((str(channel), str(chat_id), msg.message_id if here else None))
        return chats

    async def _ask(self, msg: InboundMessage, record: dict[str, Any], question: Question) -> None:
        """The question, shown once: an ephemeral message with the buttons' choices. The
        text is the whole question in Markdown; a channel with a length limit fits it into
        one message from ``APPROVAL_KEY`` (``bot.gate.question.fit_question``)."""
        view = question_view(record, question, self.timeout_minutes)
        text, _ = question_markdown(view)
        request = {
            "id": record["id"],
            "choices": choices(question),
            "intro": view.intro,
            "subject": view.subject,
            "outro": view.outro,
        }
        for channel, chat_id, reply_to in self._chats(msg, record):
            await self.bus.publish_outbound(
                OutboundMessage(
                    channel, chat_id, text, reply_to=reply_to, metadata={APPROVAL_KEY: request}
                )
            )

    def _remember(self, approval_id: str, key: str) -> None:
        self._where[approval_id] = key
        self._where.move_to_end(approval_id)
        while len(self._where) > WHERE_KEPT:
            self._where.popitem(last=False)

    async def _wait(self, session: Session, msg: InboundMessage, record: dict[str, Any]) -> str:
        approval_id = record["id"]
        answered: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._waiting[approval_id] = answered
        if record.get("asked_in"):  # answered in another chat, not in this session
            self._remember(approval_id, session.key)
        try:
            # Registered first, read second: a press recorded before this wait (after a
            # restart, before the resumed turn got here) is seen here, a later one resolves
            # the future.
            current = session.state.open_approval
            if current is None or current.get("id") != approval_id:
                return "stopped"
            if current.get("state") != WAITING:
                return str(current["state"])
            remaining = max(0.0, float(current["deadline"]) - time.time())
            try:
                async with self.outside_slot(), asyncio.timeout(remaining):
                    return await asyncio.shield(answered)
            except TimeoutError:
                pass
            timed_out = await self.store.apply_async(
                session, transitions.decide_approval(approval_id, "timeout")
            )
            if not timed_out:  # a press won the race
                current = session.state.open_approval or {}
                return str(current.get("state", "stopped"))
            for channel, chat_id, reply_to in self._chats(msg, record):
                await self.bus.publish_outbound(
                    OutboundMessage(
                        channel,
                        chat_id,
                        f"No answer within {self.timeout_minutes:g} min: not run.",
                        reply_to=reply_to,
                    )
                )
            return "timeout"
        finally:
            self._waiting.pop(approval_id, None)

    @contextlib.asynccontextmanager
    async def outside_slot(self) -> AsyncIterator[None]:
        """Give the waiting turn's slot back for a wait on something other than the model (a
        person, a background task); take one again before it goes on
        (in line with every other turn). Shielded: a turn cancelled while it queues for a
        slot still ends up holding one, which its worker then releases, so the count stays
        right."""
        slots = self.slots
        if slots is None:
            yield
            return
        slots.release()
        try:
            yield
        finally:
            await asyncio.shield(slots.acquire())

    async def _locate(self, approval_id: str, msg: InboundMessage) -> Session:
        """The session whose approval ``approval_id`` is: the press's own chat, or (for an
        unattended turn's question, answered by an admin elsewhere) the one the desk saw it
        wait in; after a restart, before the turn waits again, found on disk."""
        key = self._where.get(approval_id)
        if key is not None:
            return self.store.get(key)
        own = self.store.get(msg.session_key)
        record = own.state.open_approval
        if (record is not None and record.get("id") == approval_id) or not msg.sender.is_admin:
            return own
        for key, record in await asyncio.to_thread(open_approvals, self.store):
            if record.get("id") == approval_id and record.get("owner"):
                return self.store.get(key)
        return own

    async def press(self, msg: InboundMessage) -> str | None:
        """Record one press (a button or a typed answer); the reply for the chat, None when
        it is a redelivery of a press already recorded. "show" asks for the whole text of
        the question: the reply is that text."""
        press = msg.classification.press
        approval_id, choice = (press.id, press.choice) if press else ("", "")
        if choice not in CHOICES and choice != SHOW:
            return "That is not an answer to an approval."
        if await self._dreams(approval_id):
            assert self.review is not None
            return await self.review.press(msg)
        session = await self._locate(approval_id, msg)
        record = session.state.open_approval
        if record is not None and session.key != msg.session_key and not elsewhere(record, msg):
            record = None  # a person's question is answered in its own chat
        if record is None or record.get("id") != approval_id or record["state"] != WAITING:
            return self._late(session.state, approval_id, msg.message_id, record)
        if not may_answer(record, msg.sender_id, msg.sender.is_admin):
            log.info(
                "approval press refused session=%s id=%s sender=%s",
                msg.session_key,
                approval_id,
                msg.sender_id,
            )
            if record.get("owner"):
                return "Only an admin of this bot may answer this approval."
            who = "the person who asked" + (", or an admin," if record.get("is_group") else "")
            return f"Only {who} may answer this approval."
        if choice == SHOW:
            return self._whole_text(session, record)
        where = "this chat" if session.key == msg.session_key else f"{session.key}'s turns"
        return await self._decide(
            session, record, choice, msg.sender_id, msg.message_id or "", where
        )

    async def answer_as_owner(
        self, key: str, approval_id: str, choice: str, by: str, press: str
    ) -> str | None:
        """The owner's answer given outside the chats (the control panel): the same record,
        the same first-writer-wins decision and the same waiting turn as a button press, for
        any waiting question of session ``key`` (the owner may answer every one). ``press``
        names the request: the same one again returns None (recorded already). The chats the
        question was shown in are told that it was answered, and how."""
        if choice not in CHOICES:
            return "That is not an answer to an approval."
        if await self._dreams(approval_id):
            assert self.review is not None
            asked_in = await asyncio.to_thread(self.review.asked_in, approval_id)
            reply = await self.review.answer(approval_id, choice, by, True, press)
            await self._tell_answered(approval_id, reply, asked_in)
            return reply
        # Any session the panel names: maybe not cached, so loaded off the event loop.
        session = await asyncio.to_thread(self.store.get, key)
        record = session.state.open_approval
        if record is None or record.get("id") != approval_id or record["state"] != WAITING:
            return self._late(session.state, approval_id, press, record)
        shown_in = [(str(c[0]), str(c[1])) for c in record.get("asked_in") or []]
        if not record.get("asked_in"):
            shown_in = [(key.partition(":")[0], key.partition(":")[2])]
        reply = await self._decide(session, record, choice, by, press, f"{key}'s turns")
        await self._tell_answered(approval_id, reply, shown_in)
        return reply

    async def _tell_answered(
        self, approval_id: str, reply: str | None, shown_in: list[tuple[str, str]]
    ) -> None:
        """Tell the chats a question was shown in that the panel answered it, and how."""
        if reply in (None, EXPIRED, ANSWERED, STOPPED):
            return
        for channel, chat_id in shown_in:
            note = f"Approval {approval_id} was answered in the control panel: {reply}"
            await self.bus.publish_outbound(OutboundMessage(channel, chat_id, note))

    async def _dreams(self, approval_id: str) -> bool:
        """Whether ``approval_id`` is one of Dream's proposals (open or answered)."""
        if self.review is None:
            return False
        return await asyncio.to_thread(self.review.owns, approval_id)

    async def _decide(
        self,
        session: Session,
        record: Entry,
        choice: str,
        by: str,
        press: str,
        where: str,
    ) -> str | None:
        """Record ``choice`` for the waiting ``record`` (first writer wins: a press, the
        timeout, /stop, the panel) and let its turn go on; the reply for whoever answered."""
        approval_id = str(record["id"])
        outcome = "timeout" if time.time() >= float(record["deadline"]) else choice
        decide = transitions.decide_approval(approval_id, outcome, by=by, press=press)
        if not await self.store.apply_async(session, decide):
            return self._late(session.state, approval_id, press, None)
        waiter = self._waiting.get(approval_id)
        if waiter is not None and not waiter.done():
            waiter.set_result(outcome)
        if outcome == "timeout":
            return EXPIRED
        return PRESS_REPLIES[outcome].format(where=where)

    def _whole_text(self, session: Session, record: dict[str, Any]) -> str:
        """The "Show all" answer, rebuilt from the call in the checkpoint (the record keeps
        no copy of what may be 100,000 characters)."""
        question = self._asked(session.state, record)
        if question is None:
            return "I cannot find the text of this approval any more."
        log.info("approval whole text shown session=%s id=%s", session.key, record["id"])
        return full_text(record["id"], question.subject)

    def _asked(self, state: SessionState, record: Entry) -> Question | None:
        """The question ``record`` asks, rebuilt from the call in the checkpoint (the record
        keeps no copy of what may be 100,000 characters); None when the checkpoint lacks it."""
        found = asked_call(state.checkpoint, record)
        if found is None:
            return None
        name, arguments = found
        return describe_call(name, arguments, self._effects(name))

    def _late(
        self,
        state: SessionState,
        approval_id: str,
        press: str | None,
        record: Entry | None,
    ) -> str | None:
        if record is not None and record.get("id") == approval_id:
            closed: Entry | None = {"state": record.get("state"), "press": record.get("press")}
        else:
            closed = state.closed_approval(approval_id)
        if closed is None or closed.get("state") == "timeout":
            return EXPIRED
        if press and closed.get("press") == press:
            return None  # the same press delivered again after a restart
        if closed.get("state") == "stopped":
            return STOPPED
        return ANSWERED

    def open_question(self, state: SessionState) -> OpenQuestion | None:
        """The question a session's turn waits on; None when none waits or the checkpoint
        does not hold its call."""
        record = state.open_approval
        if record is None or record.get("state") != WAITING:
            return None
        question = self._asked(state, record)
        if question is None:
            return None
        return OpenQuestion(
            record, question, question_view(dict(record), question, self.timeout_minutes)
        )

    def open_ids(self) -> list[str]:
        return sorted(self._waiting)


def open_approvals(store: SessionStore) -> list[tuple[str, Entry]]:
    """Every waiting approval on disk: (session key, record), oldest first."""
    found = []
    for key in store.keys():
        state = store.peek_state(key)
        record = state.open_approval if state is not None else None
        if record is not None and record.get("state") == WAITING:
            found.append((key, record))
    return sorted(found, key=lambda kr: kr[1].get("asked_at", 0))


def describe_open(state_dir: Path) -> list[str]:
    """One line per waiting approval, for ``memobot status``."""
    lines = []
    now = time.time()
    for key, record in open_approvals(SessionStore(state_dir)):
        left = float(record.get("deadline", now)) - now
        when = f"{left / 60:.0f} min left" if left > 0 else "expired, not yet closed"
        summary = one_line(str(record.get("summary", "")), 80)
        lines.append(f"{key} {record['id']}: {summary} ({when})")
    return lines
