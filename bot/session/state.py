"""A session's state as one frozen, typed value (DESIGN.md section 4; docs/sessions.md).

On disk the state is the metadata mapping of a session file's records; this module is the one
place (with ``bot.session.transitions``, which changes it) that knows its keys. Everyone else
reads ``session.state`` and changes it with ``store.apply(session, transitions.<name>(...))``.

The entries inside the lists are the JSON objects as they are stored, checked on load against
the record models (``bot.session.records``: ``PendingEntry``, ``OutboxEntry``, ``Checkpoint``,
...). They are not converted to model instances: a message costs a few appends, and building
and dumping models on each would cost more than the whole append (bench/bench_soak.py), and
would rewrite entries an older or newer memobot wrote with fields this one does not know.
Treat them as read-only: a transition replaces an entry, it never edits one in place.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, TypeAlias

# One stored entry, of the shape its record model names (read-only by convention).
Entry: TypeAlias = Mapping[str, Any]

WAITING = "waiting"  # an approval nobody has answered yet
WAIT_KEY = "wait"  # on a pending entry waiting out a model outage: {"since", "notified"}

_EMPTY: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class SessionState:
    """Everything a session records besides its messages. Which module's transitions change
    each field is in docs/sessions.md; the field's record model is named beside it."""

    key: str = ""
    created_at: str | None = None
    # Accepted turns not yet answered (``PendingEntry``), oldest first.
    pending: tuple[Entry, ...] = ()
    # Platform message ids already accepted (redeliveries are recognised), newest last.
    seen_ids: tuple[str | None, ...] = ()
    # The running turn's last phase (``Checkpoint``); stored as ``runtime_checkpoint``.
    checkpoint: Entry | None = None
    # Resume attempts of the interrupted turn (``ResumeInfo``).
    resume: Entry | None = None
    # A shutdown that cut a turn short: {"at", "reason"}.
    interrupted: Entry | None = None
    # The delivery ledger (``OutboxEntry``): answers not yet known to have gone out.
    outbox: tuple[Entry, ...] = ()
    # Preview messages a streamed answer is being edited into (``PreviewEntry``).
    previews: tuple[Entry, ...] = ()
    # Markers of messages sent once outside a turn (a pairing approval).
    notices: tuple[str, ...] = ()
    # Approvals decided or closed (``ClosedApproval``), newest last.
    approvals_closed: tuple[Entry, ...] = ()
    # Keys of the calls a person allowed "always" in this chat.
    approved_calls: tuple[str, ...] = ()
    # The name in llm.models this chat's requests use (/model NAME); None: llm's own.
    chat_model: str | None = None
    # Keys this memobot does not know (written by a newer one, or an import): kept as they are.
    extra: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)

    @classmethod
    def of(cls, meta: Mapping[str, Any]) -> SessionState:
        """The state a metadata mapping (as loaded, already shape-checked) holds."""
        kw: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for key, value in meta.items():
            name = _FIELD.get(key)
            if name is None:
                extra[key] = value
            elif value is None:
                continue
            elif name in _LISTS:
                # Anything but a list (a hand edit the loader let through) holds no entries.
                kw[name] = tuple(value) if isinstance(value, list) else ()
            else:
                kw[name] = value
        if extra:
            kw["extra"] = MappingProxyType(extra)
        return cls(**kw)

    def update_to(self, new: SessionState) -> dict[str, Any]:
        """The metadata update (keys to new values, None: remove the key) that turns this
        state's metadata into ``new``'s. Only fields that changed are in it; an empty list
        is stored as no key at all, as memobot always has."""
        out: dict[str, Any] = {}
        for name, key in _KEY_ITEMS:
            before = getattr(self, name)
            after = getattr(new, name)
            if after is before:
                continue
            if name in _LISTS:
                out[key] = list(after) or None
            else:
                out[key] = after
        if new.extra is not self.extra:
            for key in self.extra.keys() - new.extra.keys():
                out[key] = None
            for key, value in new.extra.items():
                if self.extra.get(key, _EMPTY) is not value:
                    out[key] = value
        return out

    # -- questions every reader asks ---------------------------------------------------

    def pending_entry(self, message_id: str | None) -> Entry | None:
        """The pending turn of ``message_id``, None when it is not (or no longer) pending."""
        for entry in self.pending:
            if entry.get("id") == message_id:
                return entry
        return None

    def wait_info(self, message_id: str | None) -> dict[str, Any] | None:
        """The wait record of a pending turn ({} if it never waited out an outage), None when
        it is not pending."""
        entry = self.pending_entry(message_id)
        if entry is None:
            return None
        info = entry.get(WAIT_KEY)
        return dict(info) if isinstance(info, Mapping) else {}

    def is_pending(self, message_id: str | None) -> bool:
        return self.pending_entry(message_id) is not None

    @property
    def has_work(self) -> bool:
        """Something to do after a restart: a turn to answer or resume, an answer to send."""
        return bool(self.pending or self.checkpoint or self.outbox)

    def checkpoint_of(self, message_id: str | None) -> Entry | None:
        """The checkpoint when it is ``message_id``'s turn's, else None."""
        cp = self.checkpoint
        return cp if cp is not None and cp.get("message_id") == message_id else None

    @property
    def open_approval(self) -> Entry | None:
        """The approval the checkpoint is paused on (whatever its state), if any."""
        return open_approval(self.checkpoint)

    def closed_approval(self, approval_id: str) -> Entry | None:
        """The record of a closed approval, newest first; None when it is not remembered."""
        for entry in reversed(self.approvals_closed):
            if entry.get("id") == approval_id:
                return entry
        return None

    def outbox_entry(self, delivery_id: str | None) -> Entry | None:
        for entry in self.outbox:
            if entry.get("id") == delivery_id:
                return entry
        return None

    def preview_ids(self, reply_to: str | None) -> list[str]:
        """Platform ids of the preview messages of the answer to ``reply_to``, in order (only
        ids that are text: anything else in a damaged record is never edited)."""
        for record in self.previews:
            if isinstance(record, Mapping) and record.get("reply_to") == reply_to:
                ids = record.get("ids")
                return [i for i in ids if isinstance(i, str)] if isinstance(ids, list) else []
        return []


def open_approval(checkpoint: Entry | None) -> Entry | None:
    """The approval a checkpoint is paused on (an ``awaiting_approval`` phase), if any."""
    if not checkpoint:
        return None
    record = checkpoint.get("approval")
    if checkpoint.get("phase") == "awaiting_approval" and isinstance(record, Mapping):
        return record
    return None


# Field name -> metadata key. The only spelling of the keys outside the record checks.
_KEYS: dict[str, str] = {
    f.name: ("runtime_checkpoint" if f.name == "checkpoint" else f.name)
    for f in fields(SessionState)
    if f.name != "extra"
}
_FIELD: dict[str, str] = {key: name for name, key in _KEYS.items()}
_KEY_ITEMS = tuple(_KEYS.items())
_LISTS = frozenset(
    ("pending", "seen_ids", "outbox", "previews", "notices", "approvals_closed", "approved_calls")
)
METADATA_KEYS = frozenset(_FIELD)
