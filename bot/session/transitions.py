"""The named changes of a session's state: the only way it changes.

Each function here returns a ``Transition``: a pure function of the current ``SessionState`` to
the next one, or to None when there is nothing to write (a redelivered message, an answer that
is no longer in the ledger, a press that lost the race). ``SessionStore.apply`` runs it under
the session's lock, so check-then-write is atomic, and writes only the fields that changed.

Who calls what (docs/sessions.md has the table): intake accepts; the turn checkpoints, finishes
and announces; the loop marks a turn waiting for the model and a shutdown interrupted; recovery
counts resume attempts and drops an orphaned checkpoint; delivery moves answers through the
ledger and keeps preview records; approvals decide questions and forget old "always" keys; the
nanobot importer marks where a session came from; `/model` chooses the chat's model.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import Any, TypeAlias

from bot.session.state import WAIT_KEY, WAITING, Entry, SessionState, open_approval

Transition: TypeAlias = Callable[[SessionState], SessionState | None]

# More than one getUpdates batch (at most 100 updates) from one chat: a redelivered batch is
# always recognised.
SEEN_IDS_KEPT = 128
NOTICES_KEPT = 64  # markers of once-only messages remembered per session
CLOSED_KEPT = 64  # decided approvals remembered per session (a late press is told why)
FAILED_KEPT = 20  # undeliverable answers kept per session (oldest dropped first)
PREVIEWS_KEPT = 16  # preview records per session (one per answer being written; oldest dropped)


# -- intake --------------------------------------------------------------------------------


def accept(entry: Entry) -> Transition:
    """A message becomes a pending turn, once: None when its id was seen before or is
    pending (a redelivery)."""
    message_id = entry.get("id")

    def run(state: SessionState) -> SessionState | None:
        if message_id in state.seen_ids or state.is_pending(message_id):
            return None
        return replace(
            state,
            pending=(*state.pending, entry),
            seen_ids=(*state.seen_ids, message_id)[-SEEN_IDS_KEPT:],
        )

    return run


# -- the turn ------------------------------------------------------------------------------


def checkpoint(record: Entry) -> Transition:
    """The running turn reached a phase (``Checkpoint``)."""
    return lambda state: replace(state, checkpoint=record)


def finish(message_id: str | None, answers: Iterable[Entry] = ()) -> Transition:
    """A turn ended: its question (if one still waits) closed as "stopped", its checkpoint,
    resume count and interruption cleared, its pending entry gone and its answers
    (``OutboxEntry``) in the ledger. A message accepted meanwhile stays pending."""
    added = tuple(answers)

    def run(state: SessionState) -> SessionState:
        state = close_unanswered(state)
        return replace(
            state,
            checkpoint=None,
            resume=None,
            interrupted=None,
            pending=tuple(p for p in state.pending if p.get("id") != message_id),
            outbox=(*state.outbox, *added),
        )

    return run


def announce(entry: Entry, marker: str) -> Transition:
    """A permanent message outside any turn goes into the ledger with its marker, in one
    write; None when the marker is there (it was sent, or is queued, before)."""

    def run(state: SessionState) -> SessionState | None:
        if marker in state.notices:
            return None
        return replace(
            state,
            outbox=(*state.outbox, entry),
            notices=(*state.notices, marker)[-NOTICES_KEPT:],
        )

    return run


# -- the loop ------------------------------------------------------------------------------


def waiting_for_model(
    message_id: str | None, since: str, notified: bool, restarts_counted: bool
) -> Transition:
    """A pending turn waits out a model outage since ``since`` (``notified``: the person was
    told). ``restarts_counted``: the wait is not a crash of the turn, so its resume count
    starts over."""
    wait = {"since": since, "notified": notified}

    def run(state: SessionState) -> SessionState:
        pending = tuple(
            {**p, WAIT_KEY: wait} if p.get("id") == message_id else p for p in state.pending
        )
        return replace(state, pending=pending, resume=None if restarts_counted else state.resume)

    return run


def interrupted(at: str, reason: str) -> Transition:
    """A shutdown found the session's turn running."""
    record = {"at": at, "reason": reason}
    return lambda state: replace(state, interrupted=record)


# -- recovery ------------------------------------------------------------------------------


def resume_attempt(message_id: str | None, attempts: int) -> Transition:
    """The interrupted turn of ``message_id`` is tried again, for the ``attempts``-th time."""
    record = {"message_id": message_id, "attempts": attempts}
    return lambda state: replace(state, resume=record)


def drop_checkpoint() -> Transition:
    """The checkpoint's message is gone: its work is kept as messages, the checkpoint goes."""
    return lambda state: replace(state, checkpoint=None)


# -- delivery ------------------------------------------------------------------------------


def _outbox_change(delivery_id: str, update: Mapping[str, Any] | None) -> Transition:
    """Merge ``update`` into one ledger entry (None: remove the entry; a value None: remove
    that field); None (nothing written) when the entry is gone. At most ``FAILED_KEPT``
    failed entries stay."""

    def run(state: SessionState) -> SessionState | None:
        if state.outbox_entry(delivery_id) is None:
            return None
        if update is None:
            new = [e for e in state.outbox if e.get("id") != delivery_id]
        else:
            new = [_merged(e, update) if e.get("id") == delivery_id else e for e in state.outbox]
        failed = [e for e in new if e.get("state") == "failed"]
        for old in failed[: max(0, len(failed) - FAILED_KEPT)]:
            new.remove(old)
        return replace(state, outbox=tuple(new))

    return run


def _merged(entry: Entry, update: Mapping[str, Any]) -> dict[str, Any]:
    out = {**entry, **update}
    return {k: v for k, v in out.items() if v is not None}


def piece_sending(delivery_id: str, index: int, pieces: list[str] | None = None) -> Transition:
    """Piece ``index`` of an answer is about to be sent (every piece before it went out).
    ``pieces``: the answer as split, kept while it goes out piece by piece."""
    update: dict[str, Any] = {"state": "sending", "next": index}
    if pieces is not None:
        update["pieces"] = pieces
    return _outbox_change(delivery_id, update)


def postponed(delivery_id: str, index: int) -> Transition:
    """Piece ``index`` did not go out: queued from there for the next start."""
    return _outbox_change(delivery_id, {"state": "queued", "next": index})


def delivery_failed(
    delivery_id: str, reason: str, index: int, at: float | None = None
) -> Transition:
    """The platform refused piece ``index`` for good: kept as "failed", never sent again."""
    return _outbox_change(
        delivery_id,
        {
            "state": "failed",
            "next": index,
            "reason": reason,
            "failed_at": time.time() if at is None else at,
            "pieces": None,  # the text stays; the pieces only matter while sending
        },
    )


def delivered(delivery_id: str | None, reply_to: str | None, final: bool) -> Transition:
    """An answer went out: its ledger entry (if ``delivery_id``) goes, and, for a final
    answer, the preview record of ``reply_to``. None when neither was there."""
    remove = _outbox_change(delivery_id, None) if delivery_id else None

    def run(state: SessionState) -> SessionState | None:
        new = state
        if final:
            kept = tuple(p for p in state.previews if p.get("reply_to") != reply_to)
            if len(kept) != len(state.previews):
                new = replace(new, previews=kept)
        if remove is not None:
            new = remove(new) or new
        return None if new is state else new

    return run


def previewing(reply_to: str | None, ids: list[str]) -> Transition:
    """The answer to ``reply_to`` is being previewed in the platform messages ``ids``."""
    record = {"reply_to": reply_to, "ids": list(ids)}

    def run(state: SessionState) -> SessionState:
        others = tuple(p for p in state.previews if p.get("reply_to") != reply_to)
        return replace(state, previews=(*others, record)[-PREVIEWS_KEPT:])

    return run


def ledger_recovered(entries: Iterable[Entry]) -> Transition:
    """After a restart: the ledger as it is to be sent again (``entries``, in order)."""
    kept = tuple(entries)
    return lambda state: replace(state, outbox=kept)


# -- approvals -----------------------------------------------------------------------------


def closed_entry(record: Entry, outcome: str, by: str = "", press: str = "") -> dict[str, Any]:
    return {"id": record["id"], "state": outcome, "by": by, "press": press, "at": time.time()}


def close_unanswered(state: SessionState) -> SessionState:
    """``state`` with a still-waiting approval closed as "stopped" (its turn ended some
    other way: ``/stop``, a failure); ``state`` itself when none waits."""
    record = open_approval(state.checkpoint)
    if record is None or record.get("state") != WAITING:
        return state
    closed = (*state.approvals_closed, closed_entry(record, "stopped"))
    return replace(state, approvals_closed=closed[-CLOSED_KEPT:])


def decide_approval(approval_id: str, outcome: str, by: str = "", press: str = "") -> Transition:
    """Record ``outcome`` for a waiting approval; None when it is not (or no longer) waiting:
    decided, timed out, stopped, or another turn's. First writer wins. "always" also adds the
    question's key to the chat's approved calls."""

    def run(state: SessionState) -> SessionState | None:
        record = open_approval(state.checkpoint)
        if record is None or record.get("id") != approval_id or record.get("state") != WAITING:
            return None
        assert state.checkpoint is not None
        decided = {**record, "state": outcome, "by": by, "press": press}
        new = replace(
            state,
            checkpoint={**state.checkpoint, "approval": decided},
            approvals_closed=(
                *state.approvals_closed,
                closed_entry(record, outcome, by, press),
            )[-CLOSED_KEPT:],
        )
        if outcome == "always" and record["key"] not in state.approved_calls:
            new = replace(new, approved_calls=(*state.approved_calls, record["key"]))
        return new

    return run


def forget_approved_calls(drop: Callable[[str], bool]) -> Transition:
    """The chat's "always" keys without those ``drop`` picks."""

    def run(state: SessionState) -> SessionState:
        return replace(state, approved_calls=tuple(k for k in state.approved_calls if not drop(k)))

    return run


# -- the chat's model ----------------------------------------------------------------------


def choose_model(name: str | None) -> Transition:
    """The chat's requests use the model ``name`` of llm.models from now on (None: llm's
    own); None to write when it already does."""

    def run(state: SessionState) -> SessionState | None:
        return None if state.chat_model == name else replace(state, chat_model=name)

    return run


# -- memory --------------------------------------------------------------------------------


def unchanged(state: SessionState) -> SessionState:
    """No state change: for a write that only moves ``last_consolidated`` (consolidation)."""
    return state


# -- import --------------------------------------------------------------------------------


def imported(source: str, created_at: str | None = None) -> Transition:
    """A session brought over from another assistant (``source`` says which file)."""

    def run(state: SessionState) -> SessionState:
        new = replace(state, extra=MappingProxyType({**state.extra, "imported_from": source}))
        return replace(new, created_at=created_at) if created_at is not None else new

    return run
