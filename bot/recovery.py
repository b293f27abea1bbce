"""Recovery: after a crash or restart, every interrupted turn is finished and every answer sent.

DESIGN.md section 5. At start, before any new message is taken, each session's metadata is
turned back into work: undelivered answers from the ledger are re-sent, an orphaned checkpoint is
repaired into history, and every pending message is queued again as a resumed turn. When the
resumed turn runs, ``resume`` turns its checkpoint back into messages (every unfinished tool call
gets an interrupted-tool result) and counts the attempt durably, so a turn that crashes memobot each
time is given up after ``MAX_RESUME_ATTEMPTS`` instead of looping for ever.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from typing import Any

from bot.bus import InboundMessage, MessageBus
from bot.delivery import DeliveryLedger
from bot.intake import inbound_from_pending
from bot.runner import close_open_tool_calls, close_turn
from bot.session import Session, SessionStore, transitions
from bot.session.state import WAITING, open_approval

log = logging.getLogger(__name__)

MAX_RESUME_ATTEMPTS = 3
GAVE_UP_TEXT = (
    "I was interrupted {n} times while answering your message and could not finish it. "
    "Please send it again if you still need an answer."
)


@dataclass(slots=True)
class Resumed:
    """An interrupted turn, ready to go on: its messages and the phase it had reached."""

    messages: list[dict[str, Any]]
    phase: str
    gave_up: bool = False
    approval: dict[str, Any] | None = None  # a paused turn's open question: wait again


class Recovery:
    def __init__(
        self,
        store: SessionStore,
        ledger: DeliveryLedger,
        bus: MessageBus,
        user_message: Callable[[InboundMessage], Awaitable[dict[str, Any]]],
        resumable: Callable[[], Collection[str]] = frozenset,
    ) -> None:
        """``resumable``: the names of the tools whose interrupted calls are run again
        (``Effects.resumable``) rather than marked interrupted."""
        self.store = store
        self.ledger = ledger
        self.bus = bus
        self.user_message = user_message
        self.resumable = resumable

    def recover(
        self,
        queue: Callable[[InboundMessage], None],
        keys: list[str] | None = None,
        channels: set[str] | None = None,
    ) -> int:
        """Queue every interrupted turn (``queue`` puts a pending message back in its
        session's queue, as a resume) and undelivered answer; returns how many sessions.

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
                resumed += self._recover_session(key, queue)
            except OSError as exc:
                log.error("cannot recover session=%s: %s", key, exc)
            except Exception:
                log.exception("recovery failed session=%s; the other sessions go on", key)
        return resumed

    def _recover_session(self, key: str, queue: Callable[[InboundMessage], None]) -> int:
        """Recover one session; 1 if it had pending turns to resume."""
        peeked = self.store.peek_state(key)
        if peeked is None or not peeked.has_work:
            return 0
        session = self.store.get(key)
        for out in self.ledger.recover(key):
            log.info("re-sending undelivered answer session=%s", key)
            self.bus.outbound.put_nowait(out)
        pending = session.state.pending
        checkpoint = session.state.checkpoint
        if checkpoint and not session.state.is_pending(checkpoint.get("message_id")):
            # A checkpoint whose message is gone cannot be answered; keep its work.
            turn = list(checkpoint.get("messages") or [])
            close_turn(turn)  # kept without its answer: closed, as a failed turn is
            self.store.apply(session, transitions.drop_checkpoint(), turn)
        for p in pending:
            queue(inbound_from_pending(key, p))
        if pending:
            log.info("resuming session=%s pending=%d", key, len(pending))
        return 1 if pending else 0

    async def resume(self, session: Session, msg: InboundMessage) -> Resumed | None:
        """Turn a checkpoint back into messages; count the attempt durably before trying.

        None when the message is no longer pending (its answer landed before the crash).
        """
        state = session.state
        resume = state.resume or {}
        attempts = resume.get("attempts", 0) if resume.get("message_id") == msg.message_id else 0
        attempts += 1
        checkpoint = state.checkpoint_of(msg.message_id)
        if not checkpoint and not state.is_pending(msg.message_id):
            return None
        messages = list(checkpoint["messages"]) if checkpoint else [await self.user_message(msg)]
        phase = checkpoint["phase"] if checkpoint else "intake"
        if phase == "final_response":
            return Resumed(messages, phase)
        paused = open_approval(checkpoint)
        if paused is not None and paused.get("state") == WAITING:
            # A pause, not an interruption: the question stays open (its buttons still work)
            # and the batch goes on once it is answered. Not counted as a resume attempt.
            log.info("resuming paused turn session=%s approval=%s", msg.session_key, paused["id"])
            return Resumed(messages, phase, approval=paused)
        # A resumable call (spawn) is left open: the resumed turn runs it again, and run
        # again for the same call it does nothing twice. Not once the turn is given up.
        keep = frozenset(self.resumable()) if attempts <= MAX_RESUME_ATTEMPTS else frozenset()
        interrupted = [name for name in unfinished_calls(messages) if name not in keep]
        close_open_tool_calls(messages, keep)
        if attempts > MAX_RESUME_ATTEMPTS:
            log.error(
                "giving up on interrupted turn session=%s after %d attempts",
                msg.session_key,
                attempts - 1,
            )
            return Resumed(messages, phase, gave_up=True)
        self.store.apply(session, transitions.resume_attempt(msg.message_id, attempts))
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
        return Resumed(messages, phase)


def unfinished_calls(turn: list[dict[str, Any]]) -> list[str]:
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
