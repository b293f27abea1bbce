"""Durable intake: an accepted message is a pending turn on disk before its platform hears "ok".

DESIGN.md section 5, step 1. The channel confirms a message to its platform (Telegram offset,
Slack ack) only when ``accept`` answers "accepted" or "duplicate"; by then the message is a
pending turn in its session's state (``transitions.accept``), keyed by the platform's message
id, so a redelivered message is recognised and answered once, and a crash after intake resumes
it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from typing import Any

from bot import failpoints
from bot.bus import InboundMessage, Intake
from bot.kinds import Classified, classify, no_more_than
from bot.media import FileRef
from bot.session import SessionStore, now_iso, transitions

log = logging.getLogger(__name__)


class DurableIntake:
    """The bus's intake hook. ``closed`` (set at shutdown) refuses new messages."""

    def __init__(
        self, store: SessionStore, reply: Callable[[InboundMessage, str], Awaitable[None]]
    ) -> None:
        self.store = store
        self.reply = reply  # a final answer to a message that could not be stored
        self.closed = False

    async def accept(self, msg: InboundMessage) -> Intake:
        """Make ``msg`` durable as a pending turn; recognise redeliveries by message id."""
        if not msg.classification.durable:
            return "accepted"  # answered at once (an immediate command), nothing to store
        if self.closed:
            return "refused"
        try:
            # In a worker thread: the load of a long session and the fsync stay off the loop.
            return await asyncio.to_thread(self._store_pending, msg)
        except OSError as exc:
            log.error("cannot store message session=%s: %s", msg.session_key, exc)
            await self.reply(
                msg,
                f"I could not store your message ({exc.strerror or exc}), so I did not process "
                "it. Please try again later.",
            )
            return "refused"

    def _store_pending(self, msg: InboundMessage) -> Intake:
        session = self.store.get(msg.session_key)
        # Checked and written under the session's lock: two deliveries of one message racing
        # each other still produce one pending turn.
        if not self.store.apply(session, transitions.accept(pending_entry(msg))):
            log.info("duplicate message ignored session=%s id=%s", msg.session_key, msg.message_id)
            return "duplicate"
        failpoints.hit("after_intake")
        return "accepted"


def pending_entry(msg: InboundMessage) -> dict[str, Any]:
    """The on-disk form of a pending turn (the inverse of ``inbound_from_pending``)."""
    entry: dict[str, Any] = {
        "id": msg.message_id,
        "sender_id": msg.sender_id,
        "text": msg.text,
        "media": list(msg.media),
        "reply_to": msg.reply_to,
        "metadata": msg.metadata,
        "received_at": now_iso(),
        # The turn resumed after a crash is of the kind it was accepted as.
        "kind": msg.classification.record(),
    }
    if msg.files:  # fetched by the channel when the turn runs (bot.media)
        entry["files"] = [f.record() for f in msg.files]
    return entry


def inbound_from_pending(key: str, p: Mapping[str, Any]) -> InboundMessage:
    """The pending turn ``p`` of session ``key`` as a message, with the classification it was
    stored with; an entry of an older memobot (no ``kind``) is classified as it was then."""
    channel, _, chat_id = key.partition(":")
    msg = InboundMessage(
        channel,
        chat_id,
        str(p.get("sender_id", "")),
        str(p.get("text", "")),
        media=tuple(p.get("media") or ()),
        message_id=p["id"],
        reply_to=p.get("reply_to"),
        metadata=dict(p.get("metadata") or {}),
        files=tuple(FileRef.from_record(f) for f in p.get("files") or ()),
    )
    fresh = classify(msg)
    stored = Classified.from_record(p.get("kind"))
    if stored is not None and not no_more_than(stored, fresh):
        log.warning("pending turn %s: stored kind not believed, classified again", msg.message_id)
        stored = None
    return replace(msg, classified=stored or fresh)
