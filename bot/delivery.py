"""The delivery ledger: every final answer is on disk before and after it reaches the platform.

An answer enters the session's ``outbox`` (metadata) in the same write that appends the turn's
messages, in state "queued". Just before the channel sends it, it becomes "sending" (written
with no await before the send, fsynced right after); once the channel returns it leaves the
outbox. After a crash, "queued" answers are sent again (the
platform cannot have them) and "sending" ones are dropped and logged: the platform may already
show them, and a second copy is worse than none.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from bot.bus import OutboundMessage
from bot.session import SessionStore

log = logging.getLogger(__name__)

DELIVERY_KEY = "delivery_id"


def outbox_entry(delivery_id: str, msg: OutboundMessage) -> dict[str, Any]:
    return {
        "id": delivery_id,
        "channel": msg.channel,
        "chat_id": msg.chat_id,
        "text": msg.text,
        "reply_to": msg.reply_to,
        "state": "queued",
    }


def outbound_from_entry(entry: dict[str, Any]) -> OutboundMessage:
    return OutboundMessage(
        entry["channel"],
        entry["chat_id"],
        entry["text"],
        reply_to=entry.get("reply_to"),
        final=True,
        metadata={DELIVERY_KEY: entry["id"]},
    )


def _set_state(delivery_id: str, state: str | None) -> Any:
    """A metadata change (see SessionStore.append) moving one outbox entry to ``state``
    (None: remove it); nothing is written when the entry is gone."""

    def change(meta: dict[str, Any]) -> dict[str, Any] | None:
        outbox = meta.get("outbox") or []
        if not any(e.get("id") == delivery_id for e in outbox):
            return None
        if state is None:
            new = [e for e in outbox if e.get("id") != delivery_id]
        else:
            new = [{**e, "state": state} if e.get("id") == delivery_id else e for e in outbox]
        return {"outbox": new or None}

    return change


class DeliveryLedger:
    def __init__(self, store: SessionStore) -> None:
        self.store = store
        self._syncing: set[asyncio.Task[None]] = set()

    async def _update(self, msg: OutboundMessage, state: str | None, fsync: bool = True) -> bool:
        delivery_id = msg.metadata.get(DELIVERY_KEY)
        if not delivery_id:
            return False

        session = self.store.get(msg.session_key)
        return await self.store.append_async(
            session, metadata=_set_state(delivery_id, state), fsync=fsync
        )

    async def sending(self, msg: OutboundMessage) -> bool:
        """Record that the send starts. False: not (or no longer) in the ledger; do not send.

        The mark is written here, on the event loop, with no await between it and the
        caller's send: a process killed after the mark has (all but) started sending, so
        dropping a "sending" answer at the next start is right. The fsync, which only matters
        for a power cut, follows in a worker thread instead of standing in that gap.
        """
        delivery_id = msg.metadata.get(DELIVERY_KEY)
        if not delivery_id:
            return True  # not a ledgered message (progress notes, command answers)
        session = self.store.get(msg.session_key)
        if not self.store.append(session, metadata=_set_state(delivery_id, "sending"), fsync=False):
            return False
        task = asyncio.create_task(asyncio.to_thread(self.store.fsync, session))
        self._syncing.add(task)
        task.add_done_callback(self._syncing.discard)
        return True

    async def sent(self, msg: OutboundMessage) -> None:
        # No fsync: if this line is lost, the entry reads "sending" after a crash and is
        # dropped, not re-sent, which is the right outcome for an answer that went out.
        await self._update(msg, None, fsync=False)

    async def failed(self, msg: OutboundMessage) -> None:
        """The platform refused it for good: back to "queued" so the next start tries again."""
        await self._update(msg, "queued")

    def recover(self, key: str) -> list[OutboundMessage]:
        """Answers of ``key`` to send again after a restart; in-flight ones are dropped."""
        session = self.store.get(key)
        outbox = session.metadata.get("outbox") or []
        if not outbox:
            return []
        resend = []
        for entry in outbox:
            if entry.get("state") == "sending":
                log.warning(
                    "delivery %s session=%s was being sent when memobot stopped; not sending it "
                    "again (the chat may already show it)",
                    entry.get("id"),
                    key,
                )
            else:
                resend.append(entry)
        if len(resend) != len(outbox):
            self.store.append(session, metadata={"outbox": resend or None})
        return [outbound_from_entry(e) for e in resend]
