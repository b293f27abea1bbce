"""One-time import of a legacy ``memory/HISTORY.md`` into ``memory/history.jsonl``.

The legacy file is a run of blocks, each starting with a line ``[YYYY-MM-DD HH:MM] text`` (local
time) and running to the next such line. Every block becomes one history entry with session
``"legacy"``, the cursors continuing after the archive's last one; then HISTORY.md is renamed to
HISTORY.md.bak.

Crash safety: progress is recorded in ``memory/.migrated`` (JSON, keyed by the SHA-256 of the
HISTORY.md bytes). Before appending, the plan (first cursor, number of entries) is written there;
after the append is fsynced and ``.cursor`` moved, the record is marked done; then the file is
renamed. A run that finds HISTORY.md again resumes from whatever state it finds: a done record
means only the rename is left; a started record means the entries already in the archive are
counted and only the rest are appended. So a crash at any point neither duplicates nor loses
an entry.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bot import failpoints, workspace_files
from bot.memory.history import HistoryArchive, HistoryEntry

log = logging.getLogger(__name__)

LEGACY_FILE = "HISTORY.md"
MARKER_FILE = ".migrated"
LEGACY_SESSION = "legacy"

_HEADER = re.compile(r"^\[(\d{4}-\d{2}-\d{2}) (\d{2}:\d{2})\][ \t]?(.*)$")


@dataclass(frozen=True, slots=True)
class LegacyBlock:
    line: int  # 1-based line of the header in HISTORY.md
    timestamp: str  # ISO UTC with Z
    content: str


def parse_legacy(text: str) -> tuple[list[LegacyBlock], str]:
    """The blocks of a legacy HISTORY.md, and the text before the first block (stripped).

    A header whose date or time does not exist (e.g. 2026-02-30) does not start a block; it
    stays part of the block before it. Blocks with no text are dropped.
    """
    blocks: list[LegacyBlock] = []
    preamble: list[str] = []
    current: tuple[int, str, list[str]] | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        header = _parse_header(line)
        if header is None:
            (current[2] if current else preamble).append(line)
            continue
        if current:
            blocks.append(_block(*current))
        stamp, rest = header
        current = (number, stamp, [rest])
    if current:
        blocks.append(_block(*current))
    return [b for b in blocks if b.content], "\n".join(preamble).strip()


def _parse_header(line: str) -> tuple[str, str] | None:
    """(ISO UTC timestamp, text after the stamp) for a block header line, else None."""
    match = _HEADER.match(line)
    if not match:
        return None
    try:
        local = datetime.strptime(f"{match.group(1)} {match.group(2)}", "%Y-%m-%d %H:%M")
    except ValueError:
        return None
    # Naive means local time: astimezone() applies this machine's zone (and its DST rules).
    moment = local.astimezone(UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z"), match.group(3)


def _block(line: int, stamp: str, lines: list[str]) -> LegacyBlock:
    return LegacyBlock(line, stamp, "\n".join(lines).strip())


def migrate_legacy_history(workspace: Path) -> int:
    """Import ``memory/HISTORY.md`` into the history archive; returns how many entries this call
    appended (0 when there is nothing to import or it was imported before).

    Call it at start, before the daemon's own ``HistoryArchive`` has read its cursor (the
    archive caches the last cursor). Safe to call any number of times and after a crash at any
    point (see the module docstring). Raises OSError when the files cannot be read or written.
    """
    memory = workspace / "memory"
    legacy = memory / LEGACY_FILE
    try:
        data = workspace_files.read_bytes(workspace, legacy)
    except FileNotFoundError:
        return 0
    digest = hashlib.sha256(data).hexdigest()
    markers = _load_markers(workspace, memory / MARKER_FILE)
    record = markers.get(digest, {})
    if record.get("state") == "done":
        log.info("migrate: %s was imported before; finishing the rename", legacy)
        _retire(workspace, legacy)
        return 0
    blocks, preamble = parse_legacy(data.decode("utf-8", errors="replace"))
    if not blocks:
        log.warning("migrate: %s has no [YYYY-MM-DD HH:MM] blocks; nothing to import", legacy)
    if preamble:
        log.warning(
            "migrate: ignoring %d chars before the first [YYYY-MM-DD HH:MM] block of %s",
            len(preamble),
            legacy,
        )
    archive = HistoryArchive(workspace)
    if record.get("state") == "started":
        done = _already_imported(archive, int(record["first_cursor"]), blocks)
        log.info("migrate: resuming %s: %d of %d entries already in", legacy, done, len(blocks))
    else:
        done = 0
        record = {"state": "started", "first_cursor": archive.last_cursor() + 1}
        record.update(entries=len(blocks), started=_now())
        _save_markers(workspace, memory / MARKER_FILE, {**markers, digest: record})
        failpoints.hit("migrate.planned")
    written = _append_batch(archive, blocks[done:])
    failpoints.hit("migrate.appended")
    record = {**record, "state": "done", "finished": _now()}
    _save_markers(workspace, memory / MARKER_FILE, {**markers, digest: record})
    failpoints.hit("migrate.marked")
    _retire(workspace, legacy)
    log.info("migrate: imported %d entries from %s", len(written), legacy)
    return len(written)


def _already_imported(archive: HistoryArchive, first: int, blocks: list[LegacyBlock]) -> int:
    """How many leading blocks are in the archive already (legacy entries from ``first`` on,
    in order). A torn last line from the crash does not parse and is not counted."""
    done = 0
    for entry in archive.entries(after=first - 1):
        if done == len(blocks):
            break
        block = blocks[done]
        if entry.session == LEGACY_SESSION and entry.content == block.content:
            done += 1
    return done


def _append_batch(archive: HistoryArchive, blocks: list[LegacyBlock]) -> list[HistoryEntry]:
    """All blocks in one archive write, each with the timestamp of its legacy header."""
    return archive.append_batch_sync([(b.timestamp, LEGACY_SESSION, b.content) for b in blocks])


def _retire(workspace: Path, legacy: Path) -> None:
    """Rename HISTORY.md to HISTORY.md.bak (a free ``.bak.N`` name if that one is taken by a
    different file; an identical .bak means the copy is simply dropped)."""
    target = legacy.with_name(legacy.name + ".bak")
    n = 1
    while workspace_files.lexists(workspace, target):
        if _same_file_data(workspace, target, legacy):
            workspace_files.unlink(workspace, legacy, sync=True)
            return
        target = legacy.with_name(f"{legacy.name}.bak.{n}")
        n += 1
    workspace_files.rename(workspace, legacy, target, sync=True)


def _same_file_data(workspace: Path, a: Path, b: Path) -> bool:
    try:
        return workspace_files.read_bytes(workspace, a) == workspace_files.read_bytes(workspace, b)
    except OSError:
        return False  # a link or a folder at the .bak name: never the same, take the next name


def _load_markers(workspace: Path, path: Path) -> dict[str, dict[str, Any]]:
    try:
        data = json.loads(workspace_files.read_text(workspace, path))
    except FileNotFoundError:
        return {}
    except ValueError:
        # Written atomically, so this is a hand edit; refusing is safer than re-importing.
        raise OSError(f"{path} is not valid JSON; fix or remove it to migrate HISTORY.md") from None
    return data if isinstance(data, dict) else {}


def _save_markers(workspace: Path, path: Path, markers: dict[str, dict[str, Any]]) -> None:
    text = json.dumps(markers, indent=2, sort_keys=True) + "\n"
    workspace_files.write_atomic(workspace, path, text)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
