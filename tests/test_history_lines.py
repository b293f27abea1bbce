"""The archive's one line reader: a line too long (the model can write history.jsonl) is
skipped with one warning by every reader (search, the panel's archive and the CLI through
dated_history, Dream), never held in memory, and never cut away by a compaction."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from bot.memory import history
from bot.memory.history import HistoryArchive, read_lines
from bot.memory.search import MemoryIndex, dated_history

OLD = "2020-01-01T10:00:00.000Z"


def line(cursor: int, content: str, ts: str = OLD) -> bytes:
    record = {"cursor": cursor, "timestamp": ts, "session": "telegram:1", "content": content}
    return (json.dumps(record) + "\n").encode()


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    (tmp_path / "memory").mkdir()
    return tmp_path


def test_a_long_line_and_a_sparse_one_of_gigabytes_are_skipped_by_every_reader(
    ws: Path, caplog: pytest.LogCaptureFixture
):
    path = ws / "memory" / "history.jsonl"
    with path.open("wb") as fh:
        fh.write(line(1, "falcon one"))
        fh.write(b'{"cursor": 2, "content": "' + b"x" * (3 * history.MAX_LINE_BYTES) + b'"}\n')
        fh.write(line(3, "falcon three"))
        fh.write(b'{"cursor": 4, "content": "')  # then a hole of gigabytes: read as zeros
        fh.truncate(8 * 1024**3)
        fh.seek(0, 2)
        fh.write(b'"}\n' + line(5, "falcon five"))
    with caplog.at_level(logging.WARNING, logger="bot.memory.history"):
        assert [e.cursor for e in HistoryArchive(ws).entries()] == [1, 3, 5]  # Dream's read
    assert len(caplog.records) == 1  # one warning for the file, not one per line
    assert [e.cursor for _, e, _ in dated_history(ws)] == [1, 3, 5]  # the panel, the CLI
    index = MemoryIndex(ws, ws / "state")
    assert sorted(h.source for h in index.search("falcon")) == [
        "memory/history.jsonl#1",
        "memory/history.jsonl#3",
        "memory/history.jsonl#5",
    ]
    assert HistoryArchive(ws).entries(after=1, limit=1)[0].cursor == 3  # Dream's batch


def test_read_lines_sizes_add_up_and_a_torn_long_line_at_the_end_is_passed(tmp_path: Path):
    path = tmp_path / "h.jsonl"
    path.write_bytes(b"ab\n" + b"y" * 50 + b"\ncd\n" + b"z" * 40)
    with path.open("rb") as fh:
        got = list(read_lines(fh.fileno(), "h", limit=10))
    assert got == [(b"ab\n", 3), (None, 51), (b"cd\n", 3), (None, 40)]
    assert sum(size for _, size in got) == path.stat().st_size


def test_compaction_never_cuts_a_file_it_cannot_hold(ws: Path):
    path = ws / "memory" / "history.jsonl"
    with path.open("wb") as fh:
        fh.write(line(1, "old and digested"))
        fh.truncate(65 * 1024**2)  # more than memobot reads whole: the rewrite would cut it
        fh.seek(0, 2)
        fh.write(b"\n" + line(2, "the newest entry"))
    assert HistoryArchive(ws)._compact_sync(digested_upto=1, keep_days=1) == 0
    assert [e.cursor for e in HistoryArchive(ws).entries()] == [1, 2]
    # A file it can hold, with one line too long: also left whole.
    path.write_bytes(line(1, "old") + b"x" * (history.MAX_LINE_BYTES + 1) + b"\n" + line(2, "new"))
    before = path.read_bytes()
    assert HistoryArchive(ws)._compact_sync(digested_upto=1, keep_days=1) == 0
    assert path.read_bytes() == before
    # And one without: the digested old entry moves to its month's file.
    path.write_bytes(line(1, "old") + line(2, "new", ts="2999-01-01T00:00:00Z"))
    assert HistoryArchive(ws)._compact_sync(digested_upto=1, keep_days=1) == 1
    assert [e.cursor for e in HistoryArchive(ws).entries()] == [2]
