"""Legacy HISTORY.md migration: real files, and real SIGKILLs at each step for the crash cases."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from bot.memory.history import HistoryArchive, HistoryEntry
from bot.memory.migrate import migrate_legacy_history, parse_legacy
from tests.helpers import REPO

LOCAL_TZ = "XYZ-1"  # POSIX: one hour east of UTC, no tz database needed

LEGACY = """\
# History (old format)

[2025-03-01 09:15] Talked about the garden.
Planted tomatoes; the user wants basil next.

[2025-03-02 18:40] Booked flights to Lisbon.
[2025-03-05 07:05]
Multi-line block
  with indentation kept.
[not a stamp] stays inside the block above
"""


@pytest.fixture(autouse=True)
def local_tz(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TZ", LOCAL_TZ)
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def utc(y: int, mo: int, d: int, h: int, mi: int) -> str:
    moment = datetime(y, mo, d, h, mi).astimezone(UTC)  # local wall clock -> UTC
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def expected() -> list[tuple[str, str]]:
    """(timestamp, content) of LEGACY's blocks, in the test's local zone."""
    return [
        (
            utc(2025, 3, 1, 9, 15),
            "Talked about the garden.\nPlanted tomatoes; the user wants basil next.",
        ),
        (utc(2025, 3, 2, 18, 40), "Booked flights to Lisbon."),
        (
            utc(2025, 3, 5, 7, 5),
            "Multi-line block\n  with indentation kept.\n"
            "[not a stamp] stays inside the block above",
        ),
    ]


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    workspace = tmp_path / "ws"
    (workspace / "memory").mkdir(parents=True)
    (workspace / "memory" / "HISTORY.md").write_text(LEGACY)
    return workspace


def entries(ws: Path) -> list[HistoryEntry]:
    return HistoryArchive(ws).entries()


def cursor_file(ws: Path) -> int:
    return int((ws / "memory" / ".cursor").read_text())


def test_blocks_become_entries_with_utc_stamps(ws: Path, caplog: pytest.LogCaptureFixture):
    assert utc(2025, 3, 1, 9, 15) == "2025-03-01T08:15:00.000Z"  # the zone really is UTC+1
    assert migrate_legacy_history(ws) == 3
    got = entries(ws)
    assert [(e.timestamp, e.content) for e in got] == expected()
    assert [e.cursor for e in got] == [1, 2, 3]
    assert {e.session for e in got} == {"legacy"}
    assert cursor_file(ws) == 3
    assert "ignoring" in caplog.text  # the heading before the first block


def test_cursors_continue_after_existing_entries(ws: Path):
    archive = HistoryArchive(ws)
    archive._append_sync("telegram:1", "already here")
    archive._append_sync("telegram:1", "and this")
    assert migrate_legacy_history(ws) == 3
    assert [e.cursor for e in entries(ws)] == [1, 2, 3, 4, 5]
    assert cursor_file(ws) == 5
    # The daemon's archive carries on from there.
    assert HistoryArchive(ws)._append_sync("telegram:1", "next").cursor == 6


def test_keeps_a_backup_and_is_idempotent(ws: Path):
    memory = ws / "memory"
    assert migrate_legacy_history(ws) == 3
    assert not (memory / "HISTORY.md").exists()
    assert (memory / "HISTORY.md.bak").read_text() == LEGACY
    assert migrate_legacy_history(ws) == 0
    assert len(entries(ws)) == 3
    # The same file put back (e.g. restored from a backup) is recognised and not imported again.
    (memory / "HISTORY.md").write_text(LEGACY)
    assert migrate_legacy_history(ws) == 0
    assert len(entries(ws)) == 3
    assert not (memory / "HISTORY.md").exists()


def test_a_different_legacy_file_later_is_imported_and_kept_apart(ws: Path):
    memory = ws / "memory"
    assert migrate_legacy_history(ws) == 3
    (memory / "HISTORY.md").write_text("[2025-04-01 10:00] Another old note.\n")
    assert migrate_legacy_history(ws) == 1
    assert (memory / "HISTORY.md.bak").read_text() == LEGACY
    assert (memory / "HISTORY.md.bak.1").read_text() == "[2025-04-01 10:00] Another old note.\n"
    assert [e.cursor for e in entries(ws)] == [1, 2, 3, 4]


def test_nothing_to_do_without_a_legacy_file(tmp_path: Path):
    assert migrate_legacy_history(tmp_path) == 0
    assert not (tmp_path / "memory").exists()


def test_parse_drops_empty_blocks_and_impossible_dates():
    blocks, preamble = parse_legacy("[2025-02-30 10:00] not a date\n[2025-03-01 10:00]\n\n")
    assert blocks == []
    assert preamble == "[2025-02-30 10:00] not a date"


# ------------------------------------------------------------------ crashes


def run_until_crash(ws: Path, failpoint: str) -> None:
    """Run the migration in a child process that SIGKILLs itself at ``failpoint``."""
    code = (
        "import sys; from pathlib import Path; from bot.memory.migrate import "
        "migrate_legacy_history; migrate_legacy_history(Path(sys.argv[1]))"
    )
    env = {**os.environ, "MEMOBOT_FAILPOINTS": failpoint, "TZ": LOCAL_TZ}
    done = subprocess.run(
        [sys.executable, "-c", code, str(ws)], env=env, cwd=REPO, capture_output=True, timeout=30
    )
    assert done.returncode == -signal.SIGKILL, done.stderr


@pytest.mark.parametrize("failpoint", ["migrate.planned", "migrate.appended", "migrate.marked"])
def test_crash_at_any_step_neither_duplicates_nor_loses(ws: Path, failpoint: str):
    HistoryArchive(ws)._append_sync("telegram:1", "already here")
    run_until_crash(ws, failpoint)
    assert (ws / "memory" / "HISTORY.md").exists()  # killed before the rename
    migrate_legacy_history(ws)
    got = entries(ws)
    assert [(e.timestamp, e.content) for e in got[1:]] == expected()
    assert [e.cursor for e in got] == [1, 2, 3, 4]
    assert cursor_file(ws) == 4
    assert (ws / "memory" / "HISTORY.md.bak").read_text() == LEGACY
    assert not (ws / "memory" / "HISTORY.md").exists()
    assert migrate_legacy_history(ws) == 0
    assert len(entries(ws)) == 4


def test_crash_in_the_middle_of_the_append_resumes(ws: Path):
    run_until_crash(ws, "migrate.planned")
    # What a power cut during the one big write can leave: the first entry, then half a line.
    first = {"cursor": 1, "timestamp": expected()[0][0], "session": "legacy"}
    with open(ws / "memory" / "history.jsonl", "w") as fh:
        fh.write(json.dumps({**first, "content": expected()[0][1]}) + "\n")
        fh.write('{"cursor": 2, "timestamp": "2025-03-02T17:4')
    assert migrate_legacy_history(ws) == 2
    got = entries(ws)
    assert [(e.timestamp, e.content) for e in got] == expected()
    assert [e.cursor for e in got] == [1, 2, 3]
    assert cursor_file(ws) == 3
