"""Lean sessions (issue 17): memory holds the unconsolidated tail, loads start at the last
consolidation point, metadata lines carry changes, consolidated lines move to an archive."""

from __future__ import annotations

import errno
import gc
import json
import os
import random
import subprocess
import sys
import weakref
from pathlib import Path
from typing import Any

import pytest

import bot.session as session_mod
import bot.session.archive as archive_mod
import bot.session.store as store_mod
from bot.session import (
    Session,
    SessionStore,
    apply_changes,
    apply_list,
    archive_path,
    list_ops,
    read_metadata,
)

REPO = Path(__file__).resolve().parents[1]
KEY = "telegram:77"


def msg(role: str, text: str) -> dict[str, Any]:
    return {"role": role, "content": text, "timestamp": "2026-01-01T00:00:00.000Z"}


def pending_entry(i: int) -> dict[str, Any]:
    return {"id": f"m{i}", "sender_id": "7", "text": f"question {i}", "media": [], "metadata": {}}


def add_pending(i: int) -> Any:
    def change(meta: dict[str, Any]) -> dict[str, Any]:
        return {
            "pending": [*(meta.get("pending") or []), pending_entry(i)],
            "seen_ids": [*(meta.get("seen_ids") or []), f"m{i}"][-128:],
        }

    return change


def finish(i: int) -> Any:
    def change(meta: dict[str, Any]) -> dict[str, Any]:
        pending = [p for p in meta.get("pending") or [] if p["id"] != f"m{i}"]
        return {"pending": pending or None, "runtime_checkpoint": None}

    return change


def converse(store: SessionStore, session: Session, start: int, n: int) -> list[str]:
    """``n`` turns as the loop writes them: pending in, turn appended, pending out."""
    texts = []
    for i in range(start, start + n):
        store.append(session, metadata=add_pending(i))
        turn = [msg("user", f"question {i}"), msg("assistant", f"answer {i}")]
        store.append(session, turn, metadata=finish(i))
        texts += [f"question {i}", f"answer {i}"]
    return texts


def state(session: Session) -> dict[str, Any]:
    return {
        "metadata": session.metadata,
        "last_consolidated": session.last_consolidated,
        "base": session.base,
        "messages": session.messages,
        "wire": session.wire,
        "tokens": session.tokens,
        "offsets": session.offsets,
        "size": session.size,
        "file_base": session.file_base,
        "archived_bytes": session.archived_bytes,
        "truncate_at": session.truncate_at,
    }


def contents(messages: list[dict[str, Any]]) -> list[str]:
    return [m["content"] for m in messages]


def test_load_from_the_consolidation_point_equals_a_full_read(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(archive_mod, "COMPACT_AFTER_BYTES", 10**9)  # the lines stay where written
    monkeypatch.setattr(store_mod, "READ_WHOLE_BELOW", 0)  # small files load from offsets too
    store = SessionStore(tmp_path)
    s = store.get(KEY)
    texts = converse(store, s, 0, 30)
    store.append(s, last_consolidated=40)
    store.append(s, metadata=add_pending(100))  # a change record after the full one
    texts += converse(store, s, 30, 5)
    assert s.base == 40 and len(s.messages) == 30

    fast = SessionStore(tmp_path)._load(KEY)
    full = SessionStore(tmp_path)._load(KEY, from_snapshot=False)
    assert state(fast) == state(full)
    assert fast.snap == full.snap == s.snap
    assert contents(fast.messages) == texts[40:]
    assert [p["id"] for p in fast.metadata["pending"]] == ["m100"]
    assert fast.metadata["seen_ids"][-1] == "m34" and len(fast.metadata["seen_ids"]) == 36
    # It did start in the middle: the consolidated lines before tail_at were never parsed.
    assert fast.offsets[0] > 0
    assert state(fast) == state(s) | {"truncate_at": None}


def test_a_bad_offset_falls_back_to_reading_the_whole_file(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(archive_mod, "COMPACT_AFTER_BYTES", 10**9)  # the lines stay where written
    monkeypatch.setattr(store_mod, "READ_WHOLE_BELOW", 0)  # small files load from offsets too
    store = SessionStore(tmp_path)
    s = store.get(KEY)
    texts = converse(store, s, 0, 10)
    store.append(s, last_consolidated=6)
    texts += converse(store, s, 10, 3)
    good = s.path.read_bytes()
    expected = state(SessionStore(tmp_path)._load(KEY, from_snapshot=False))
    assert contents(expected["messages"]) == texts[6:]
    lines = good.split(b"\n")
    snapshot_line = max(i for i, raw in enumerate(lines) if b'"hot"' in raw)
    gen = json.loads(lines[snapshot_line])["hot"]["gen"]
    tail_at = json.loads(lines[snapshot_line])["hot"]["tail_at"]

    def variant(data: bytes) -> dict[str, Any]:
        s.path.write_bytes(data)
        loaded = state(SessionStore(tmp_path).get(KEY))
        assert loaded == state(SessionStore(tmp_path)._load(KEY, from_snapshot=False))
        return {k: v for k, v in loaded.items() if k not in ("offsets", "size")}

    expected = {k: v for k, v in expected.items() if k not in ("offsets", "size")}

    # The change records name a generation that is not there: the file was rewritten.
    assert variant(good.replace(gen.encode(), b"deadbeef", 1)) == expected
    # The full record's tail_at lands inside a line, or on the line before or after.
    starts = [sum(len(raw) + 1 for raw in lines[:i]) for i in range(len(lines))]
    i = starts.index(tail_at)
    for wrong in (tail_at + 3, starts[i - 1], starts[i + 1], starts[i + 2]):
        bad = good.replace(f'"tail_at":{tail_at},'.encode(), f'"tail_at":{wrong},'.encode())
        assert bad != good
        assert variant(bad) == expected
    # The last change record points into the middle of a line.
    last = json.loads(lines[-2])
    moved = {**last, "snap": [last["snap"][0] + 5, last["snap"][1]]}
    data = b"\n".join([*lines[:-2], json.dumps(moved, separators=(",", ":")).encode(), b""])
    assert variant(data) == expected
    # A file from before offsets were kept (full records only) is read whole and works.
    old_style, meta = [], {}
    for raw in filter(None, lines):
        record = json.loads(raw)
        if record.get("_type") == "metadata":
            meta = (
                apply_changes(meta, record["changes"])
                if "changes" in record
                else record["metadata"]
            )
            record = {"_type": "metadata", "metadata": meta, "last_consolidated": 6}
        old_style.append(json.dumps(record).encode())
    s.path.write_bytes(b"\n".join(old_style) + b"\n")
    old = SessionStore(tmp_path).get(KEY)
    assert contents(old.messages) == texts[6:] and old.last_consolidated == 6


def test_change_records_stay_small_as_pending_grows(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(archive_mod, "COMPACT_AFTER_BYTES", 10**9)  # every record stays
    store = SessionStore(tmp_path)
    s = store.get(KEY)
    for i in range(150):
        store.append(s, metadata=add_pending(i))
    changes = [raw for raw in s.path.read_bytes().split(b"\n") if b'"changes"' in raw]
    # One pending entry and one seen id each, not all 150 of them.
    assert changes and max(map(len, changes)) < 400
    reloaded = SessionStore(tmp_path).get(KEY)
    assert [p["id"] for p in reloaded.metadata["pending"]] == [f"m{i}" for i in range(150)]
    assert reloaded.metadata["seen_ids"] == [f"m{i}" for i in range(22, 150)]
    assert read_metadata(s.path) == reloaded.metadata
    for i in range(150):
        store.append(s, metadata=finish(i))
    again = SessionStore(tmp_path).get(KEY)
    assert "pending" not in again.metadata and len(again.metadata["seen_ids"]) == 128


def test_list_changes_rebuild_the_list_exactly() -> None:
    rng = random.Random(7)
    for _ in range(500):
        old = [{"id": f"x{i}", "v": rng.randint(0, 3)} for i in rng.sample(range(30), 12)]
        new = [dict(e) for e in old if rng.random() > 0.3]
        for e in new:
            if rng.random() < 0.2:
                e["v"] = 9
        new += [{"id": f"y{i}", "v": 0} for i in range(rng.randint(0, 3))]
        ops = list_ops(old, new)
        if ops is not None:
            assert apply_list(old, ops) == new
    seen = [f"s{i}" for i in range(128)]
    assert list_ops(seen, [*seen[1:], "s128"]) == {"drop": ["s0"], "add": ["s128"]}


def test_idle_sessions_leave_memory_and_a_held_one_is_never_copied(tmp_path: Path) -> None:
    store = SessionStore(tmp_path, max_cached=2)
    held = store.get("cli:held")
    store.append(held, [msg("user", "mine")], metadata=add_pending(1))
    idle = weakref.ref(store.get("cli:idle"))
    for key in ("cli:a", "cli:b", "cli:c"):
        store.append(store.get(key), [msg("user", key)])
    gc.collect()
    assert store.loaded() == 2
    assert idle() is None  # evicted and held by nobody: gone from memory
    # Evicted from the cache while a turn still holds it: the same object comes back, with
    # everything written through it, and a write through either handle is seen by both.
    again = store.get("cli:held")
    assert again is held
    store.append(again, metadata=add_pending(2))
    store.append(held, [msg("assistant", "yours")], metadata=finish(1))
    assert [p["id"] for p in held.metadata["pending"]] == ["m2"]
    del held, again
    gc.collect()
    for key in ("cli:a", "cli:b", "cli:c"):
        store.get(key)
    fresh = SessionStore(tmp_path).get("cli:held")
    assert [p["id"] for p in fresh.metadata["pending"]] == ["m2"]
    assert contents(fresh.messages) == ["mine", "yours"]


def test_the_cache_holds_a_bounded_number_of_message_bytes(tmp_path: Path) -> None:
    """Many busy chats: the least recently used tails leave memory once the loaded messages
    pass the byte bound, and come back whole from disk when their chat speaks again."""
    texts = ["x" * 399 + str(i) for i in range(10)]
    probe = SessionStore(tmp_path / "probe")
    probe.append(probe.get("cli:probe"), [msg("user", t) for t in texts])
    lines = probe.path_for("cli:probe").read_bytes().splitlines(keepends=True)[:10]
    one = session_mod.MESSAGE_BYTES + len(lines[0])  # a message and its line, held
    assert {len(line) for line in lines} == {len(lines[0])}

    store = SessionStore(tmp_path, max_cached_bytes=30 * one)
    for k in range(8):  # eight chats of ten messages each: 80 messages against room for 30
        session = store.get(f"cli:{k}")
        store.append(session, [msg("user", t) for t in texts])
    del session
    gc.collect()
    assert store.loaded() == 3
    assert sum(store.get(f"cli:{k}").held_bytes for k in (5, 6, 7)) == 30 * one
    # The first chat was evicted; it loads again from its file, every message there, and
    # counts the same loaded as it did appended.
    first = store.get("cli:0")
    assert [m["content"] for m in first.messages] == texts
    assert first.held_bytes == 10 * one
    gc.collect()
    assert store.loaded() == 3
    # One session bigger than the whole bound still stays while it is the one in use.
    big = store.get("cli:big")
    store.append(big, [msg("user", t) for t in texts * 4])
    assert store.get("cli:big") is big and store.loaded() == 1
    # Consolidated messages leave memory and the session's share with them.
    store.append(big, last_consolidated=35)
    assert big.held_bytes == 5 * one
    # An inlined image counts at its size, not at its token estimate.
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 200_000}}
    pic = store.get("cli:pic")
    store.append(pic, [{"role": "user", "content": [{"type": "text", "text": "look"}, image]}])
    assert pic.held_bytes > 200_000
    assert store.loaded() == 1  # the picture's chat alone is over the bound


def test_a_compaction_recounts_the_held_bytes_from_the_lines_it_writes(tmp_path: Path) -> None:
    """A file written with other spacing (by hand, an older version) is counted as read, and
    after the compaction rewrites it, as written."""
    store = SessionStore(tmp_path)
    path = store.path_for(KEY)
    spaced = [json.dumps(msg("user", f"line {i}")) + "\n" for i in range(6)]  # ", " and ": "
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(spaced))
    session = store.get(KEY)
    n = session_mod.MESSAGE_BYTES * 6
    assert session.held_bytes == n + sum(len(line) for line in spaced)
    store.compact(session)
    lines = path.read_bytes().splitlines(keepends=True)[:6]
    assert sum(map(len, lines)) < sum(len(line) for line in spaced)
    assert session.held_bytes == n + sum(map(len, lines))


def old_format_file(path: Path, n: int, lc: int) -> list[dict[str, Any]]:
    """A session file as memobot wrote it before issue 17: full metadata records only."""
    messages = [msg("user" if i % 2 == 0 else "assistant", f"line {i}") for i in range(n)]
    lines = []
    for i, m in enumerate(messages):
        lines.append(m)
        if i % 2 == 1:
            meta = {"key": KEY, "seen_ids": [f"m{j}" for j in range(i)]}
            lines.append({"_type": "metadata", "metadata": meta, "last_consolidated": 0})
    lines.append({"_type": "metadata", "metadata": {"key": KEY}, "last_consolidated": lc})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join((json.dumps(r) + "\n").encode() for r in lines))
    return messages


def archive_contents(path: Path) -> list[str]:
    return [json.loads(raw)["content"] for raw in archive_path(path).read_bytes().splitlines()]


def test_archive_migration_keeps_every_message_line_once_in_order(tmp_path: Path) -> None:
    store = SessionStore(tmp_path)
    path = store.path_for(KEY)
    original = old_format_file(path, 40, 30)
    s = store.get(KEY)
    assert s.base == 30 and contents(s.messages) == contents(original[30:])
    store.compact(s)
    assert archive_contents(path) == contents(original[:30])
    hot = [json.loads(raw) for raw in path.read_bytes().splitlines()]
    assert contents([r for r in hot if "role" in r]) == contents(original[30:])
    assert len(hot) == 11  # the tail and one full record
    texts = contents(original) + converse(store, s, 0, 10)
    store.append(s, last_consolidated=52)
    store.compact(s)
    reloaded = SessionStore(tmp_path)
    assert contents(reloaded.history(KEY)) == texts
    assert archive_contents(path) == texts[:52]
    assert contents(reloaded.get(KEY).messages) == texts[52:]
    store.compact(s)  # nothing more to move: the archive is left as it is
    assert archive_contents(path) == texts[:52]


def test_a_big_consolidated_prefix_moves_out_on_its_own(tmp_path: Path) -> None:
    store = SessionStore(tmp_path)
    s = store.get(KEY)
    big = "x" * 4000
    texts = []
    for i in range(80):
        store.append(s, [msg("user", f"{i} {big}")])
        texts.append(f"{i} {big}")
        if i % 10 == 9:
            store.append(s, last_consolidated=s.count - 2)
    assert archive_path(s.path).exists()
    assert s.path.stat().st_size < 360 * 1024
    assert contents(SessionStore(tmp_path).history(KEY)) == texts


CRASHER = """
import json, sys
from pathlib import Path
from bot.session import SessionStore
store = SessionStore(Path(sys.argv[1]))
s = store.get(sys.argv[2])
store.compact(s)
print("compacted")
"""


@pytest.mark.parametrize("point", ["mid_archive", "after_archive", "before_compact_rename"])
def test_sigkill_during_the_archive_move_loses_and_repeats_nothing(
    tmp_path: Path, point: str
) -> None:
    store = SessionStore(tmp_path)
    path = store.path_for(KEY)
    original = old_format_file(path, 40, 30)
    first = store.get(KEY)
    store.compact(first)  # an archive already there: the crash hits the second move
    texts = contents(original) + converse(store, first, 0, 6)
    store.append(first, last_consolidated=46)
    before = path.read_bytes()
    env = {**os.environ, "MEMOBOT_FAILPOINTS": point, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", CRASHER, str(tmp_path), KEY],
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == -9, done.stderr.decode()
    assert path.read_bytes() == before  # the hot file is only ever replaced whole
    assert point == "mid_archive" or len(archive_contents(path)) > 30
    after = SessionStore(tmp_path)
    assert contents(after.history(KEY)) == texts
    s = after.get(KEY)
    assert contents(s.messages) == texts[46:]
    after.compact(s)  # the next move cuts what the interrupted one left, then writes it once
    assert archive_contents(path) == texts[:46]
    assert contents(SessionStore(tmp_path).history(KEY)) == texts


def test_a_failed_partial_append_is_cut_off_before_the_next_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk two thirds into an append: the next append must not fuse with the torn
    bytes (it would be lost on load), and disk and memory agree afterwards."""

    store = SessionStore(tmp_path)
    s = store.get(KEY)
    store.append(s, [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"}])
    real = os.write

    def full_disk(fd: int, data: Any) -> int:
        real(fd, bytes(data[: len(data) * 2 // 3]))
        monkeypatch.setattr(store_mod.os, "write", real)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store_mod.os, "write", full_disk)
    with pytest.raises(OSError):
        store.append(s, [{"role": "user", "content": "q2"}, {"role": "assistant", "content": "a2"}])
    store.append(s, metadata={"note": 1})  # e.g. intake's pending entry, reported "accepted"
    assert SessionStore(tmp_path).get(KEY).metadata.get("note") == 1
    store.append(s, metadata={"other": 2})
    again = SessionStore(tmp_path).get(KEY)
    assert contents(again.messages) == contents(s.messages) == ["q1", "a1"]


def test_an_archive_that_cannot_be_written_does_not_fail_committed_appends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:

    monkeypatch.setattr(archive_mod, "ARCHIVE_AFTER_BYTES", 2000)
    store = SessionStore(tmp_path)
    s = store.get(KEY)
    archive_path(s.path).mkdir()  # as good as EACCES or ENOSPC on the archive
    for i in range(10):
        store.append(s, [{"role": "user", "content": f"m{i} " + "x" * 300}])
    store.append(s, last_consolidated=8)
    for i in range(5):
        store.append(s, [{"role": "user", "content": f"n{i}"}])  # none raises
    on_disk = contents(SessionStore(tmp_path).get(KEY).messages)
    assert on_disk[-5:] == ["n0", "n1", "n2", "n3", "n4"]
    failures = [r for r in caplog.records if "cannot compact" in r.getMessage()]
    assert len(failures) == 1  # tried once, then left alone for a while
