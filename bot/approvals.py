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
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from bot import failpoints
from bot.bus import InboundMessage, MessageBus, OutboundMessage, typing_notice
from bot.config import Config
from bot.cron.scheduler import HEARTBEAT_KEY
from bot.gate.approval import (
    APPROVAL_ID,
    CHOICE_LABELS,
    CHOICES,
    DM_DEFAULT_TOOLS,
    WAITING,
    ApprovalPolicy,
    closed_state,
    decide_update,
    denied_result,
    group_tool_names,
    limited_tool_names,
    may_answer,
    new_record,
    open_record,
    question_for,
    request_text,
)
from bot.llm import ToolCall
from bot.privacy import NARROWED_KEY, PrivacyScope, sender_is_admin
from bot.runner import Approver
from bot.session import Session, SessionStore

log = logging.getLogger(__name__)

TERMINAL = "cli"  # channels.terminal.CHANNEL (the core does not import channels)
APPROVAL_KEY = "approval"  # OutboundMessage metadata: a request; InboundMessage: a press
# Typed answers, for chats without buttons: "/allow ap-…", "/always ap-…", "/deny ap-…".
ANSWER_COMMANDS = {"/allow": "once", "/always": "always", "/deny": "deny"}
Checkpoint = Callable[[str, list[dict[str, Any]], dict[str, Any] | None], Awaitable[None]]

PRESS_REPLIES = {
    "once": "Allowed once.",
    "always": "Allowed. This command will run without asking again in this chat.",
    "deny": "Denied.",
}
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
    cfg: Config, msg: InboundMessage, names: list[str], scope: PrivacyScope
) -> set[str] | None:
    """The tools a turn may use, by its privacy scope: None (all) for the owner; in groups
    ``groupTools`` (all for an admin's own turn with ``groupAdminTools``); in a non-admin's
    private chat ``dmTools``. A chat without channel settings gets the defaults."""
    if msg.metadata.get(NARROWED_KEY):
        # An unattended turn a non-admin shaped: the default group tools, whatever the config.
        return group_tool_names(names, None, cfg.tools.safe_mcp_tools)
    if scope.is_owner:
        return None
    channel = getattr(cfg.channels, msg.channel, None)
    safe_mcp = cfg.tools.safe_mcp_tools
    if scope.audience == "group":
        if channel is not None and channel.group_admin_tools and scope.admin:
            return None
        return group_tool_names(names, channel.group_tools if channel else None, safe_mcp)
    configured = channel.dm_tools if channel is not None else None
    return limited_tool_names(names, configured, DM_DEFAULT_TOOLS, safe_mcp)


def press_from_command(name: str, args: str) -> dict[str, str] | None:
    """``/allow ap-…`` and friends as a press; None when it is not one."""
    choice = ANSWER_COMMANDS.get(name)
    approval_id = args.split()[0] if args.split() else ""
    if choice is None or not APPROVAL_ID.match(approval_id):
        return None
    return {"id": approval_id, "choice": choice}


class ApprovalDesk:
    """Asks, waits for and records the answers of one agent loop's paused turns."""

    def __init__(self, cfg: Config, store: SessionStore, bus: MessageBus) -> None:
        self.policy = policy_for(cfg)
        self.timeout_minutes = cfg.tools.approval_timeout_minutes
        self.store = store
        self.bus = bus
        self._waiting: dict[str, asyncio.Future[str]] = {}
        # The loop's turn slots (agent.maxConcurrentTurns), set by the loop: a question may
        # wait for half an hour, and its slot is better used by other chats meanwhile.
        self.slots: asyncio.Semaphore | None = None

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
                allowed_here = list(session.metadata.get("approved_calls") or [])
                question = question_for(self.policy, call.name, call.arguments, allowed_here)
                if question is None:
                    return None
                record = new_record(
                    call.id,
                    call.name,
                    question,
                    msg.sender_id,
                    bool(msg.metadata.get("is_group")),
                    self.policy.timeout_seconds,
                )
                await checkpoint("awaiting_approval", turn, record)
                log.info(
                    "approval asked session=%s id=%s tool=%s",
                    msg.session_key,
                    record["id"],
                    call.name,
                )
                ask = True
            else:
                # A terminal's question dies with its process: ask again. Platforms keep
                # the old buttons, which still work; asking there again would only repeat.
                ask = msg.channel == TERMINAL
            await self._typing(msg, on=False)  # waiting for the person is not working
            if ask:
                await self._ask(msg, record)
            outcome = await self._wait(session, msg, record)
            log.info("approval %s session=%s id=%s", outcome, msg.session_key, record["id"])
            if outcome != "stopped":  # the turn goes on (a stopped one is ending)
                await self._typing(msg, on=True)
            if outcome in ("once", "always"):
                failpoints.hit("approval_recorded")
                return None
            return denied_result(outcome, self.timeout_minutes)

        return approve

    async def _typing(self, msg: InboundMessage, on: bool) -> None:
        if HEARTBEAT_KEY not in msg.metadata:  # a heartbeat's turn never shows typing
            await self.bus.publish_outbound(
                typing_notice(msg.channel, msg.chat_id, msg.message_id, on=on)
            )

    async def _ask(self, msg: InboundMessage, record: dict[str, Any]) -> None:
        """The question, shown once: an ephemeral message with the buttons' choices."""
        text = request_text(record, self.timeout_minutes)
        text += (
            f"\n(or reply /allow {record['id']}, /always {record['id']} or /deny {record['id']})"
        )
        await self.bus.publish_outbound(
            OutboundMessage(
                msg.channel,
                msg.chat_id,
                text,
                reply_to=msg.message_id,
                metadata={
                    APPROVAL_KEY: {
                        "id": record["id"],
                        "choices": {c: CHOICE_LABELS[c] for c in CHOICES},
                    }
                },
            )
        )

    async def _wait(self, session: Session, msg: InboundMessage, record: dict[str, Any]) -> str:
        approval_id = record["id"]
        answered: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._waiting[approval_id] = answered
        try:
            # Registered first, read second: a press recorded before this wait (after a
            # restart, before the resumed turn got here) is seen here, a later one resolves
            # the future.
            current = open_record(session.metadata)
            if current is None or current.get("id") != approval_id:
                return "stopped"
            if current.get("state") != WAITING:
                return str(current["state"])
            remaining = max(0.0, float(current["deadline"]) - time.time())
            try:
                async with self._outside_slot(), asyncio.timeout(remaining):
                    return await asyncio.shield(answered)
            except TimeoutError:
                pass
            timed_out = await self.store.append_async(
                session, metadata=lambda meta: decide_update(meta, approval_id, "timeout")
            )
            if not timed_out:  # a press won the race
                current = open_record(session.metadata) or {}
                return str(current.get("state", "stopped"))
            await self.bus.publish_outbound(
                OutboundMessage(
                    msg.channel,
                    msg.chat_id,
                    f"No answer within {self.timeout_minutes:g} min: not run.",
                    reply_to=msg.message_id,
                )
            )
            return "timeout"
        finally:
            self._waiting.pop(approval_id, None)

    @contextlib.asynccontextmanager
    async def _outside_slot(self) -> AsyncIterator[None]:
        """Give the waiting turn's slot back for the wait; take one again before it goes on
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

    async def press(self, msg: InboundMessage) -> str | None:
        """Record one press (a button or a typed answer); the reply for the chat, None when
        it is a redelivery of a press already recorded."""
        info = msg.metadata.get(APPROVAL_KEY) or {}
        approval_id, choice = str(info.get("id", "")), str(info.get("choice", ""))
        if choice not in CHOICES:
            return "That is not an answer to an approval."
        session = self.store.get(msg.session_key)
        record = open_record(session.metadata)
        if record is None or record.get("id") != approval_id or record["state"] != WAITING:
            return self._late(session.metadata, approval_id, msg.message_id, record)
        if not may_answer(record, msg.sender_id, sender_is_admin(msg)):
            log.info(
                "approval press refused session=%s id=%s sender=%s",
                msg.session_key,
                approval_id,
                msg.sender_id,
            )
            who = "the person who asked" + (", or an admin," if record.get("is_group") else "")
            return f"Only {who} may answer this approval."
        if time.time() >= float(record["deadline"]):
            outcome = "timeout"
        else:
            outcome = choice
        recorded = await self.store.append_async(
            session,
            metadata=lambda meta: decide_update(
                meta, approval_id, outcome, by=msg.sender_id, press=msg.message_id or ""
            ),
        )
        if not recorded:
            return self._late(session.metadata, approval_id, msg.message_id, open_record({}))
        waiter = self._waiting.get(approval_id)
        if waiter is not None and not waiter.done():
            waiter.set_result(outcome)
        return EXPIRED if outcome == "timeout" else PRESS_REPLIES[outcome]

    def _late(
        self,
        meta: dict[str, Any],
        approval_id: str,
        press: str | None,
        record: dict[str, Any] | None,
    ) -> str | None:
        if record is not None and record.get("id") == approval_id:
            closed: dict[str, Any] | None = {
                "state": record.get("state"),
                "press": record.get("press"),
            }
        else:
            closed = closed_state(meta, approval_id)
        if closed is None or closed.get("state") == "timeout":
            return EXPIRED
        if press and closed.get("press") == press:
            return None  # the same press delivered again after a restart
        if closed.get("state") == "stopped":
            return STOPPED
        return ANSWERED

    def open_ids(self) -> list[str]:
        return sorted(self._waiting)


def open_approvals(store: SessionStore) -> list[tuple[str, dict[str, Any]]]:
    """Every waiting approval on disk: (session key, record), oldest first."""
    found = []
    for key in store.keys():
        meta = store.peek_metadata(key)
        record = open_record(meta or {})
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
        lines.append(f"{key} {record['id']}: {record.get('summary', '')[:80]} ({when})")
    return lines
