"""The delivery ledger: every final answer is on disk before and after it reaches the platform,
piece by piece.

An answer enters the session's ``outbox`` (metadata) in the same write that appends the turn's
messages, in state "queued". The channel splits it into pieces (its length limit); just before
piece k is sent the entry becomes "sending" with ``next`` = k (and, for more than one piece,
the pieces themselves, so every later attempt splits identically). The mark is written with no
await before the send and fsynced right after; once the last piece went out the entry leaves
the outbox. After a crash:

* "queued" answers are sent again from piece ``next`` (the platform cannot have it);
* "sending" piece k may already show in the chat, and a second copy is worse than none: it is
  skipped with a log line, and delivery resumes at piece k + 1 (at most once for piece k, and
  nothing after it is lost). Entries written before pieces were recorded are dropped whole.
* "failed" answers (the platform refused them for good; the user was told) stay in the outbox,
  with the reason, for ``memobot status``; they are not sent again.

Old entries (no ``next``/``pieces``) read as "from the first piece", so old session files still
deliver.

Streamed answers (DESIGN.md section 11): a preview message that is being edited while the
answer is written is recorded under ``previews`` (the platform's message ids, by the message
the turn answers) and fsynced as soon as the platform gave its id. The final answer's pieces
then *edit* those messages (piece k edits preview k; extra previews are deleted, extra pieces
sent), also when it is delivered after a restart or by a resumed turn, so a chat never shows a
preview next to a copy of the answer. Editing is idempotent, so a piece that was an edit is
done again after a crash instead of skipped. The record leaves with the outbox entry.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bot.bus import OutboundMessage
from bot.long_answers import ANSWERS_DIR
from bot.session import SUFFIX, SessionState, SessionStore, filename_to_key, read_state, transitions
from bot.session.state import Entry

log = logging.getLogger(__name__)

DELIVERY_KEY = "delivery_id"
# The session whose outbox holds the answer, when that is not the chat it goes to (the
# heartbeat's answers live in its own session and go to heartbeat.deliverTo).
LEDGER_SESSION_KEY = "ledger_session"


def outbox_entry(delivery_id: str, msg: OutboundMessage) -> dict[str, Any]:
    entry = {
        "id": delivery_id,
        "channel": msg.channel,
        "chat_id": msg.chat_id,
        "text": msg.text,
        "reply_to": msg.reply_to,
        "state": "queued",
    }
    if msg.media:
        entry["media"] = list(msg.media)  # files sent after the text, one step each
    return entry


def outbound_from_entry(entry: Entry, session: str | None = None) -> OutboundMessage:
    msg = OutboundMessage(
        entry["channel"],
        entry["chat_id"],
        entry["text"],
        media=tuple(entry.get("media") or ()),
        reply_to=entry.get("reply_to"),
        final=True,
        metadata={DELIVERY_KEY: entry["id"]},
    )
    if session is not None and session != msg.session_key:
        msg.metadata[LEDGER_SESSION_KEY] = session
    return msg


def ledger_session(msg: OutboundMessage) -> str:
    """The session whose outbox holds ``msg``."""
    return str(msg.metadata.get(LEDGER_SESSION_KEY) or msg.session_key)


def preview_ids_in(state: SessionState, reply_to: str | None) -> list[str]:
    """The platform ids of the preview messages of the answer to ``reply_to``, in order."""
    return state.preview_ids(reply_to)


class DeliveryLedger:
    def __init__(self, store: SessionStore) -> None:
        self.store = store

    def _entry(self, msg: OutboundMessage) -> Entry | None:
        delivery_id = msg.metadata.get(DELIVERY_KEY)
        return self.store.get(ledger_session(msg)).state.outbox_entry(delivery_id)

    def progress(self, msg: OutboundMessage) -> tuple[list[str] | None, int] | None:
        """``(pieces, next)`` to continue ``msg`` from: the recorded pieces (None: not split
        yet, or a single piece) and the first piece not yet sent. None: not (or no longer) in
        the ledger, or given up on; do not send. A message that is not ledgered (progress
        notes, command answers) gives ``(None, 0)``."""
        if not msg.metadata.get(DELIVERY_KEY):
            return None, 0
        entry = self._entry(msg)
        if entry is None or entry.get("state") == "failed":
            return None
        pieces = entry.get("pieces")
        start = entry.get("next", 0)
        if not isinstance(pieces, list) or not all(isinstance(p, str) for p in pieces):
            pieces = None
        return pieces, start if isinstance(start, int) and start >= 0 else 0

    async def sending(
        self, msg: OutboundMessage, pieces: list[str] | None = None, index: int = 0
    ) -> bool:
        """Record that piece ``index`` of ``pieces`` is about to be sent. False: not (or no
        longer) in the ledger; do not send.

        The mark is durable (fsynced) before this returns, so a power cut after the send can
        never leave the entry "queued" and send it twice. The price is the at-most-once
        window DESIGN.md section 11 chooses: a process killed between the mark and the send
        skips piece ``index`` at the next start and logs it. The mark also says every piece
        before ``index`` went out.
        """
        delivery_id = msg.metadata.get(DELIVERY_KEY)
        if not delivery_id:
            return True  # not a ledgered message (progress notes, command answers)
        # Files are the steps after the pieces: the pieces are kept to keep the count.
        keep = pieces if pieces is not None and (len(pieces) > 1 or msg.media) else None
        session = self.store.get(ledger_session(msg))
        sending = transitions.piece_sending(delivery_id, index, keep)
        if not self.store.apply(session, sending, fsync=False):
            return False
        await asyncio.to_thread(self.store.fsync, session)
        return True

    async def sent(self, msg: OutboundMessage) -> None:
        """Every piece went out (and its preview record, if any, is done with). No fsync: if
        this line is lost, the entry reads "sending" its last piece after a crash, which is
        skipped (or, an edit, done again), never sent as a second copy."""
        delivery_id = msg.metadata.get(DELIVERY_KEY)
        if not msg.final and not delivery_id:
            # A progress note or notice answering the same message: the answer's preview is
            # still being written, and its record must stay for a restart to finish it.
            return
        # Unsynced, so written here: a thread hop cost more than the write.
        kept_in = ledger_session(msg)
        if delivery_id and kept_in != msg.session_key:
            # Kept in another session's outbox (a heartbeat's answer): it leaves that one.
            done = transitions.delivered(delivery_id, None, False)
            self.store.apply(self.store.get(kept_in), done, fsync=False)
            delivery_id = None
        session = self.store.get(msg.session_key)
        self.store.apply(
            session, transitions.delivered(delivery_id, msg.reply_to, msg.final), fsync=False
        )

    def preview_ids(self, key: str, reply_to: str | None) -> list[str]:
        """The platform ids of the preview messages of the answer to ``reply_to``, in order
        (none when the session cannot be read: its own delivery reports that)."""
        try:
            state = self.store.peek_state(key)
        except OSError:
            return []
        return state.preview_ids(reply_to) if state is not None else []

    async def previewing(self, key: str, reply_to: str | None, ids: list[str]) -> None:
        """Record (durably: fsynced before this returns) that the answer to ``reply_to`` is
        being previewed in the messages ``ids``; the final answer will edit them."""
        session = self.store.get(key)
        await self.store.apply_async(session, transitions.previewing(reply_to, ids))

    async def postponed(self, msg: OutboundMessage, index: int = 0) -> None:
        """Piece ``index`` did not go out (the platform kept failing, or the channel failed):
        "queued" from that piece, so the next start sends the rest."""
        delivery_id = msg.metadata.get(DELIVERY_KEY)
        if delivery_id:
            session = self.store.get(ledger_session(msg))
            await self.store.apply_async(session, transitions.postponed(delivery_id, index))

    async def failed(self, msg: OutboundMessage, reason: str = "", index: int = 0) -> None:
        """The platform refused piece ``index`` for good: "failed", kept with the reason (for
        ``memobot status``) and not sent again."""
        delivery_id = msg.metadata.get(DELIVERY_KEY)
        if delivery_id:
            session = self.store.get(ledger_session(msg))
            failed = transitions.delivery_failed(
                delivery_id, reason or "refused by the platform", index, time.time()
            )
            await self.store.apply_async(session, failed)

    def recover(self, key: str) -> list[OutboundMessage]:
        """Answers of ``key`` to send again after a restart, each from its first unsent piece;
        a piece that was in flight is skipped (see the module docstring)."""
        session = self.store.get(key)
        outbox = list(session.state.outbox)
        if not outbox:
            return []
        kept: list[Entry] = []
        resend: list[Entry] = []
        for entry in outbox:
            state = entry.get("state")
            pieces = entry.get("pieces")
            index = entry.get("next", 0)
            if state == "failed":
                kept.append(entry)
                continue
            if state != "sending":
                resend.append(entry)
                continue
            count = (len(pieces) if isinstance(pieces, list) else 1) + len(entry.get("media") or ())
            if not isinstance(index, int) or index < 0:
                index = 0
            if index < len(session.state.preview_ids(entry.get("reply_to"))):
                # That piece was an edit of a preview message: doing it again cannot copy it.
                log.info(
                    "delivery %s session=%s: editing piece %d of %d again after the restart",
                    entry.get("id"),
                    key,
                    index + 1,
                    count,
                )
                resend.append({**entry, "state": "queued", "next": index})
                continue
            rest = count - index - 1
            log.warning(
                "delivery %s session=%s: piece %d of %d was being sent when memobot stopped; "
                "not sending it again (the chat may already show it)%s",
                entry.get("id"),
                key,
                index + 1,
                count,
                f", sending the {rest} after it" if rest > 0 else "",
            )
            if rest > 0:
                resend.append({**entry, "state": "queued", "next": index + 1})
        if kept + resend != outbox:
            self.store.apply(session, transitions.ledger_recovered(kept + resend))
        return [outbound_from_entry(self._own_files(e, key), key) for e in resend]

    def _own_files(self, entry: Entry, key: str) -> Entry:
        """``entry`` with only the files memobot wrote for it: whatever else a damaged or
        edited session file names is not uploaded to a chat."""
        media = entry.get("media") or []
        answers = self.store.dir.parent / ANSWERS_DIR
        own = [
            p
            for p in media
            if isinstance(p, str) and Path(os.path.normpath(p)).parent.parent == answers
        ]
        if len(own) == len(media):
            return entry
        log.error(
            "delivery %s session=%s: not sending %d file(s) outside %s",
            entry.get("id"),
            key,
            len(media) - len(own),
            answers,
        )
        return {**entry, "media": own}


def undelivered(state_dir: Path) -> Iterator[tuple[str, Entry]]:
    """``(session key, outbox entry)`` for every answer not (yet) delivered, for ``status``.

    Read-only (it never repairs or sets aside a damaged file, unlike loading a session): the
    metadata as the file's records say, read from its last full record."""
    folder = state_dir / "sessions"
    if not folder.is_dir():
        return
    for path in sorted(folder.glob(f"*{SUFFIX}")):
        try:
            key = filename_to_key(path.name)
            # Through the session opener: a FIFO planted here must not hang `status`.
            state = read_state(path)
        except (OSError, ValueError, UnicodeDecodeError):
            continue
        for entry in state.outbox if state is not None else ():
            if isinstance(entry, dict):
                yield key, entry
