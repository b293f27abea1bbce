"""A session as memobot holds it in memory: its state and the unconsolidated tail."""

from __future__ import annotations

import sys
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bot.images import stored_form
from bot.session.journal import dumps_line
from bot.session.state import SessionState
from bot.tokens import estimate_message_tokens

# What one loaded message costs beyond its line's bytes (its dict, the side lists, the
# allocator's share), measured with tracemalloc over a soak's sessions.
MESSAGE_BYTES = 512

# The model that wrote an assistant answer ("model @ endpoint"), kept for /status.
ANSWERED_BY_KEY = "answered_by"
# Keys of a stored message that are ours, never sent to the model.
BOOKKEEPING_KEYS = frozenset({"timestamp", ANSWERED_BY_KEY})


def to_wire(message: dict[str, Any]) -> dict[str, Any]:
    """The message as the Chat Completions API takes it (our bookkeeping keys removed)."""
    if not BOOKKEEPING_KEYS.intersection(message):
        return message
    return {k: v for k, v in message.items() if k not in BOOKKEEPING_KEYS}


# A bookkeeping key the message does not have (its value may be anything, null included).
_ABSENT: Any = object()


@dataclass(slots=True, weakref_slot=True)
class Session:
    """One chat as memobot holds it in memory: its metadata and the unconsolidated tail.

    ``messages[0]`` is message number ``base`` of the whole conversation (counted from its
    first message ever); ``base`` is ``last_consolidated`` once loaded, so memory does not grow
    with history. Indices handed around (``last_consolidated``, ``window_start``, the cut of a
    consolidation) are absolute; ``rel`` turns one into a position in these lists.
    """

    key: str
    path: Path
    # Each message once, in the form the API takes (``to_wire``); its bookkeeping values apart,
    # in lists of the same length (``_ABSENT`` where it has none). ``messages`` puts them back.
    wire: list[dict[str, Any]] = field(default_factory=list)
    stamps: list[Any] = field(default_factory=list)
    answered: list[Any] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    # Each message's line in the file, in bytes, and their sum: what its text costs held (an
    # inlined image's data URL included, which a token estimate leaves out).
    sizes: array[int] = field(default_factory=lambda: array("q"))
    held_size: int = 0
    # Byte offset of each message line in the hot file (where a snapshot's ``tail_at`` points).
    offsets: array[int] = field(default_factory=lambda: array("q"))
    base: int = 0
    # The metadata as its records say (``bot.session.state`` reads it; only the store
    # replaces it, never in place). Outside the session package: ``state``.
    metadata: dict[str, Any] = field(default_factory=dict)
    last_consolidated: int = 0
    # Bookkeeping for compaction and torn-tail repair.
    stale_meta_lines: int = 0
    stale_meta_bytes: int = 0
    metadata_written: bool = False
    last_meta_size: int = 0
    truncate_at: int | None = None
    compact_after: float = 0.0  # monotonic time before which a failed compaction is not retried
    size: int = 0  # committed bytes of the hot file: where the next append lands
    file_base: int = 0  # number of the hot file's first message line
    archived_bytes: int = 0  # bytes of the archive that are committed (the hot file says so)
    # The last full metadata record: (its offset, its generation). Change records name it, so
    # a load can start there; None until one is written in this file.
    snap: tuple[int, str] | None = None
    # Where the prompt's history window was last trimmed to. In memory only: a cache choice
    # (keep one prefix across turns), not session state.
    window_start: int = 0
    # The context builder's API form of the window's settled part (bot.context); it lives and
    # goes with the session.
    api_prefix: Any = None
    # ``state`` of the ``metadata`` object it was read from (rebuilt when that is replaced).
    state_cache: tuple[dict[str, Any], SessionState] | None = None

    @property
    def state(self) -> SessionState:
        """The session's state (``bot.session.state``); change it with ``SessionStore.apply``."""
        cached = self.state_cache
        meta = self.metadata
        if cached is None or cached[0] is not meta:
            cached = self.state_cache = (meta, SessionState.of(meta))
        return cached[1]

    def add_loaded(
        self, message: dict[str, Any], offset: int, size: int, owned: bool = False
    ) -> None:
        """Hold one more message. ``owned``: the dict is the session's to keep (parsed from
        its file), so its bookkeeping keys are taken out of it rather than copying it.
        ``offset`` and ``size``: where its line is in the hot file and how long.

        The same few strings repeat on every line (roles, "model @ endpoint"); a message read
        from disk keeps the one shared copy instead of its own."""
        role = message.get("role")
        if type(role) is str and len(role) < 256:
            message["role"] = sys.intern(role)
        if owned:
            if type(message.get("content")) is list:
                # Written before images were sent once only (bot.images): their data URLs
                # would go out with every request and stay in memory.
                stripped = stored_form([message])[0]
                if stripped is not message:
                    message, size = stripped, len(dumps_line(stripped))  # what memory holds
            stamp = message.pop("timestamp", _ABSENT)
            answered = message.pop(ANSWERED_BY_KEY, _ABSENT)
            wire = message
        else:
            stamp = message.get("timestamp", _ABSENT)
            answered = message.get(ANSWERED_BY_KEY, _ABSENT)
            wire = to_wire(message)
        if type(answered) is str and len(answered) < 256:
            answered = sys.intern(answered)
        self.wire.append(wire)
        self.stamps.append(stamp)
        self.answered.append(answered)
        self.tokens.append(estimate_message_tokens(wire))
        self.offsets.append(offset)
        self.sizes.append(size)
        self.held_size += size

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The in-memory tail as stored (bookkeeping keys included), built when asked: for
        compaction, consolidation and /status, never on a turn's path."""
        return self.stored(0, len(self.wire))

    def stored(self, start: int, end: int) -> list[dict[str, Any]]:
        """Messages ``start``..``end`` (positions in the in-memory tail) as stored."""
        out = []
        for wire, answered, stamp in zip(
            self.wire[start:end], self.answered[start:end], self.stamps[start:end], strict=True
        ):
            if answered is _ABSENT and stamp is _ABSENT:
                out.append(wire)
                continue
            message = dict(wire)
            if answered is not _ABSENT:
                message[ANSWERED_BY_KEY] = answered
            if stamp is not _ABSENT:
                message["timestamp"] = stamp
            out.append(message)
        return out

    @property
    def count(self) -> int:
        """Messages in the whole conversation, archived ones included."""
        return self.base + len(self.wire)

    @property
    def unconsolidated(self) -> int:
        return self.count - self.last_consolidated

    def rel(self, index: int) -> int:
        """Position of absolute message ``index`` in the in-memory lists (0 if older)."""
        return max(0, index - self.base)

    @property
    def held_bytes(self) -> int:
        """Roughly what the in-memory tail costs."""
        return MESSAGE_BYTES * len(self.wire) + self.held_size

    def estimated_tokens(self, start: int = 0) -> int:
        return sum(self.tokens[self.rel(start) :])

    def drop_before(self, index: int) -> None:
        """Forget the messages before absolute ``index`` (they are consolidated)."""
        n = min(self.rel(index), len(self.wire))
        if n:
            self.held_size -= sum(self.sizes[:n])
            del self.wire[:n], self.stamps[:n], self.answered[:n], self.tokens[:n]
            del self.offsets[:n], self.sizes[:n]
            self.base += n
