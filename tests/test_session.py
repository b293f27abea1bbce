"""Session files: append-only JSONL, torn-tail repair, quarantine of bad lines, compaction."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from bot.session import SessionStore, filename_to_key, key_to_filename
from bot.session import archive as archive_mod


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize(
    "key",
    ["telegram:12345", "slack:C123:1700000000.000100", "cli:../../etc", "discord:é🙂", "a b/c"],
)
def test_filenames_are_safe_and_reversible(key: str) -> None:
    name = key_to_filename(key)
    assert "/" not in name and ":" not in name and not name.startswith(".")
    assert filename_to_key(name) == key


def test_append_only_and_last_metadata_wins(tmp_path: Path) -> None:
    store = SessionStore(tmp_path)
    s = store.get("cli:a")
    store.append(s, [{"role": "user", "content": "hi"}], metadata={"x": 1})
    size_after_first = s.path.stat().st_size
    first_bytes = s.path.read_bytes()
    store.append(s, [{"role": "assistant", "content": "hello"}], metadata={"x": 2, "y": "z"})
    store.append(s, metadata={"y": None}, last_consolidated=1)
    # Appending never rewrites what is already there.
    assert s.path.read_bytes()[:size_after_first] == first_bytes
    records = _lines(s.path)
    assert [r.get("_type") for r in records] == [None, "metadata", None, "metadata", "metadata"]
    assert all("timestamp" in r for r in records if "role" in r)

    store2 = SessionStore(tmp_path)
    reloaded = store2.get("cli:a")
    # In memory: the unconsolidated tail only; the whole conversation is still on disk.
    assert [m["content"] for m in reloaded.messages] == ["hello"]
    assert [m["content"] for m in store2.history("cli:a")] == ["hi", "hello"]
    assert reloaded.metadata["x"] == 2 and "y" not in reloaded.metadata
    assert reloaded.last_consolidated == 1
    # The request form drops our bookkeeping keys.
    assert reloaded.wire == [{"role": "assistant", "content": "hello"}]


def test_torn_last_line_is_ignored_then_cut_before_next_append(tmp_path: Path) -> None:
    store = SessionStore(tmp_path)
    s = store.get("cli:t")
    store.append(s, [{"role": "user", "content": "one"}, {"role": "assistant", "content": "1"}])
    good = s.path.read_bytes()
    with open(s.path, "ab") as fh:  # a crash in the middle of writing a line
        fh.write(b'{"role":"user","content":"tw')
    fresh = SessionStore(tmp_path)
    s2 = fresh.get("cli:t")
    assert [m["content"] for m in s2.messages] == ["one", "1"]
    assert not list(tmp_path.glob("sessions/*.corrupt-*"))  # a torn tail is not corruption
    fresh.append(s2, [{"role": "user", "content": "two"}])
    data = s2.path.read_bytes()
    assert data.startswith(good)
    assert b'"tw' not in data.replace(b'"two"', b"")
    assert [m["content"] for m in SessionStore(tmp_path).get("cli:t").messages] == [
        "one",
        "1",
        "two",
    ]


@pytest.mark.parametrize("cut", ["mid_line", "line_end"])
def test_half_written_append_is_dropped_as_a_whole(tmp_path: Path, cut: str) -> None:
    store = SessionStore(tmp_path)
    s = store.get("cli:h")
    store.append(s, [{"role": "user", "content": "one"}], metadata={"pending": [{"id": "m1"}]})
    good = s.path.read_bytes()
    turn = [{"role": "user", "content": "two"}, {"role": "assistant", "content": "2"}]
    store.append(s, turn, metadata={"pending": None})
    written = s.path.read_bytes()[len(good) :]
    # A crash cut the turn's write short: its message lines are there, its metadata is not.
    end = written.index(b"\n", written.index(b'"2"')) + 1
    s.path.write_bytes(good + written[: end + 10 if cut == "mid_line" else end])
    fresh = SessionStore(tmp_path)
    s2 = fresh.get("cli:h")
    assert [m["content"] for m in s2.messages] == ["one"]
    assert s2.metadata["pending"] == [{"id": "m1"}]  # so the turn is written again, once
    fresh.append(s2, turn, metadata={"pending": None})
    assert s2.path.read_bytes().startswith(good)
    assert [m["content"] for m in SessionStore(tmp_path).get("cli:h").messages] == [
        "one",
        "two",
        "2",
    ]


def test_messages_are_always_committed_by_a_metadata_line(tmp_path: Path) -> None:
    store = SessionStore(tmp_path)
    s = store.get("cli:m")
    store.append(s, [{"role": "user", "content": "no metadata given"}])
    assert [r.get("_type") for r in _lines(s.path)] == [None, "metadata"]
    assert [m["content"] for m in SessionStore(tmp_path).get("cli:m").messages] == [
        "no metadata given"
    ]


def test_unparsable_complete_last_line_is_treated_as_torn(tmp_path: Path) -> None:
    store = SessionStore(tmp_path)
    s = store.get("cli:t")
    store.append(s, [{"role": "user", "content": "one"}])
    with open(s.path, "ab") as fh:
        fh.write(b"\x00\x00\x00garbage\n")
    s2 = SessionStore(tmp_path).get("cli:t")
    assert [m["content"] for m in s2.messages] == ["one"]
    SessionStore(tmp_path).append(s2, [{"role": "assistant", "content": "ok"}])
    assert b"garbage" not in s2.path.read_bytes()


def test_bad_middle_line_is_quarantined_and_good_lines_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = SessionStore(tmp_path)
    s = store.get("telegram:42")
    store.append(s, [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}])
    lines = s.path.read_bytes().split(b"\n")
    damaged = b"\n".join([lines[0], b"{not json", lines[1], b""])
    s.path.write_bytes(damaged)
    with caplog.at_level(logging.ERROR):
        s2 = SessionStore(tmp_path).get("telegram:42")
    assert [m["content"] for m in s2.messages] == ["a", "b"]
    aside = list((tmp_path / "sessions").glob("*.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == damaged
    assert "unparsable" in caplog.text and "telegram:42" in caplog.text
    # The live file no longer carries the bad line, so the next load is clean.
    assert b"{not json" not in s2.path.read_bytes()
    assert [m["content"] for m in SessionStore(tmp_path).get("telegram:42").messages] == ["a", "b"]


def test_compaction_folds_superseded_metadata(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(archive_mod, "COMPACT_AFTER_LINES", 10)
    store = SessionStore(tmp_path)
    s = store.get("cli:c")
    store.append(s, [{"role": "user", "content": "keep me"}])
    for i in range(25):
        store.append(s, metadata={"n": i})
    records = _lines(s.path)
    metas = [r for r in records if r.get("_type") == "metadata"]
    assert len(metas) < 11  # compacted at least once
    assert [r["content"] for r in records if "role" in r] == ["keep me"]
    reloaded = SessionStore(tmp_path).get("cli:c")
    assert reloaded.metadata["n"] == 24
    assert not list((tmp_path / "sessions").glob(".*.tmp"))


def test_each_message_is_held_once_and_given_back_as_stored(tmp_path: Path, monkeypatch) -> None:
    """In memory a message is one dict in the API's form; its bookkeeping (timestamp, the
    model that answered) is kept apart and put back for whoever needs the stored form, so
    compaction writes exactly the records it read. Strings that repeat on every line (roles,
    the answering model) are one shared copy across messages and sessions."""
    monkeypatch.setattr(archive_mod, "COMPACT_AFTER_LINES", 4)
    by = "fake-model @ http://127.0.0.1:1/v1"
    stored = [
        {"role": "user", "content": "q1", "timestamp": "2026-12-01T10:00:00.000Z"},
        {
            "role": "assistant",
            "content": "a1",
            "answered_by": by,
            "timestamp": "2026-12-01T10:00:01.000Z",
        },
        {"role": "user", "content": "odd", "timestamp": None, "name": "kept"},
        {"role": "tool", "tool_call_id": "c1", "content": "r", "answered_by": None},
    ]
    folder = tmp_path / "sessions"
    folder.mkdir()
    for key in ("cli:one", "cli:two"):
        (folder / key_to_filename(key)).write_text("".join(json.dumps(m) + "\n" for m in stored))
    one, two = (SessionStore(tmp_path).get(k) for k in ("cli:one", "cli:two"))
    assert one.messages == stored
    assert one.stored(1, 3) == stored[1:3]
    assert all(not {"timestamp", "answered_by"} & set(w) for w in one.wire)
    assert one.wire[2] == {"role": "user", "content": "odd", "name": "kept"}
    assert one.wire[0]["role"] is two.wire[2]["role"]  # one "user" string, not one per line
    assert one.messages[1]["answered_by"] is two.messages[1]["answered_by"]

    store = SessionStore(tmp_path)
    s = store.get("cli:one")
    for i in range(6):  # stale metadata lines: the file is rewritten from memory
        store.append(s, metadata={"n": i})
    assert s.stale_meta_lines < 4
    assert [r for r in _lines(s.path) if r.get("_type") != "metadata"] == stored
    assert SessionStore(tmp_path).get("cli:one").messages == stored


def test_keys_lists_sessions(tmp_path: Path) -> None:
    store = SessionStore(tmp_path)
    for key in ("cli:b", "telegram:1", "slack:C1:17.1"):
        store.append(store.get(key), [{"role": "user", "content": "x"}])
    (tmp_path / "sessions" / "notes.txt").write_text("not a session")
    assert store.keys() == ["cli:b", "slack:C1:17.1", "telegram:1"]
