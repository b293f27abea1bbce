"""Append-only JSONL sessions (DESIGN.md section 4; the file format is in docs/sessions.md).

The package is the only code that knows a session's metadata keys. Everyone else reads
``session.state`` (a frozen ``SessionState``) and changes it through a named transition:
``store.apply(session, transitions.accept(entry))``.

- ``journal``: file names, the line format, torn tails, damaged lines and the copy aside.
- ``changes``: change records (``set`` / ``unset`` / ``lists``).
- ``snapshot``: full records (``hot``) and loading from the last one.
- ``archive``: the ``.archive`` sibling and compaction.
- ``model`` and ``store``: the in-memory session, the store and its cache.
- ``records``: the shape check of every record read from a file.
- ``state`` and ``transitions``: the typed state and its named changes.
- ``reading``: read-only, streamed reading for people (the panel's pages, search, exports).
"""

from bot.session import transitions
from bot.session.archive import (
    ARCHIVE_AFTER_BYTES,
    ARCHIVE_SUFFIX,
    COMPACT_AFTER_BYTES,
    COMPACT_AFTER_LINES,
    archive_path,
)
from bot.session.changes import apply_changes, apply_list, list_ops, metadata_changes
from bot.session.journal import (
    SUFFIX,
    SessionPathError,
    StateLayoutError,
    check_folder,
    check_session_path,
    filename_to_key,
    key_to_filename,
    now_iso,
    parse_json_line,
    parse_line,
)
from bot.session.model import ANSWERED_BY_KEY, BOOKKEEPING_KEYS, MESSAGE_BYTES, Session, to_wire
from bot.session.snapshot import read_metadata, read_state
from bot.session.state import SessionState
from bot.session.store import MAX_CACHED, MAX_CACHED_BYTES, READ_WHOLE_BELOW, SessionStore
from bot.session.transitions import Transition

__all__ = [
    "ANSWERED_BY_KEY",
    "ARCHIVE_AFTER_BYTES",
    "ARCHIVE_SUFFIX",
    "BOOKKEEPING_KEYS",
    "COMPACT_AFTER_BYTES",
    "COMPACT_AFTER_LINES",
    "MAX_CACHED",
    "MAX_CACHED_BYTES",
    "MESSAGE_BYTES",
    "READ_WHOLE_BELOW",
    "SUFFIX",
    "Session",
    "SessionPathError",
    "SessionState",
    "SessionStore",
    "StateLayoutError",
    "Transition",
    "apply_changes",
    "apply_list",
    "archive_path",
    "check_folder",
    "check_session_path",
    "filename_to_key",
    "key_to_filename",
    "list_ops",
    "metadata_changes",
    "now_iso",
    "parse_json_line",
    "parse_line",
    "read_metadata",
    "read_state",
    "to_wire",
    "transitions",
]
