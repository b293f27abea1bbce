"""The typed session state and its named transitions (bot/session/state.py, transitions.py).

The transitions are pure: they are tested on values, without files. The round trip loads
session files written by memobot before the state was typed (tests/data/sessions, written by
the code of 2404285 the way its call sites wrote them) and checks that what is written now
loads back as the same state. The last test keeps every metadata key inside bot/session.
"""

from __future__ import annotations

import ast
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from bot.session import SessionState, SessionStore, read_state, transitions
from bot.session.state import METADATA_KEYS
from bot.session.transitions import (
    CLOSED_KEPT,
    FAILED_KEPT,
    PREVIEWS_KEPT,
    SEEN_IDS_KEPT,
)
from tests.helpers.source import parse

REPO = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data" / "sessions"


def pending(message_id: str, text: str = "hi") -> dict[str, Any]:
    return {"id": message_id, "sender_id": "7", "text": text, "media": [], "metadata": {}}


def answer(delivery_id: str, reply_to: str = "m1", state: str = "queued") -> dict[str, Any]:
    return {
        "id": delivery_id,
        "channel": "telegram",
        "chat_id": "42",
        "text": "done",
        "reply_to": reply_to,
        "state": state,
    }


def waiting_checkpoint(approval_id: str = "ap-1", message_id: str = "m1") -> dict[str, Any]:
    record = {"id": approval_id, "call_id": "c1", "key": "exec:ls", "state": "waiting"}
    return {
        "phase": "awaiting_approval",
        "message_id": message_id,
        "messages": [{"role": "user", "content": "hi"}],
        "approval": record,
    }


def run(state: SessionState, *steps: transitions.Transition) -> SessionState:
    for step in steps:
        new = step(state)
        assert new is not None, "the transition refused"
        state = new
    return state


# -- transitions, pure ---------------------------------------------------------------------


def test_accept_takes_a_message_once_and_remembers_its_id():
    state = run(SessionState(), transitions.accept(pending("m1")))
    assert [p["id"] for p in state.pending] == ["m1"] and state.seen_ids == ("m1",)
    assert transitions.accept(pending("m1"))(state) is None  # pending: a redelivery
    done = run(state, transitions.finish("m1"))
    assert done.pending == () and transitions.accept(pending("m1"))(done) is None  # seen


def test_seen_ids_are_bounded_oldest_first():
    state = SessionState(seen_ids=tuple(f"s{i}" for i in range(SEEN_IDS_KEPT)))
    state = run(state, transitions.accept(pending("new")))
    assert len(state.seen_ids) == SEEN_IDS_KEPT and state.seen_ids[-1] == "new"
    assert "s0" not in state.seen_ids


def test_finish_ends_one_turn_and_keeps_a_message_accepted_meanwhile():
    state = SessionState(
        pending=(pending("m1"), pending("m2")),
        checkpoint=waiting_checkpoint(),
        resume={"message_id": "m1", "attempts": 2},
        interrupted={"at": "t", "reason": "shutdown"},
        outbox=(answer("d-0", "m0"),),
    )
    done = run(state, transitions.finish("m1", [answer("d-1")]))
    assert [p["id"] for p in done.pending] == ["m2"]
    assert done.checkpoint is None and done.resume is None and done.interrupted is None
    assert [e["id"] for e in done.outbox] == ["d-0", "d-1"]
    # The question the turn still waited on is closed as "stopped" (a late press is told so).
    assert [(c["id"], c["state"]) for c in done.approvals_closed] == [("ap-1", "stopped")]


def test_announce_writes_a_marker_once():
    state = run(SessionState(), transitions.announce(answer("d-1"), "paired:9"))
    assert state.notices == ("paired:9",) and len(state.outbox) == 1
    assert transitions.announce(answer("d-2"), "paired:9")(state) is None


def test_checkpoint_resume_and_interrupted():
    cp = waiting_checkpoint()
    state = run(
        SessionState(pending=(pending("m1"),)),
        transitions.checkpoint(cp),
        transitions.resume_attempt("m1", 2),
        transitions.interrupted("t", "shutdown"),
    )
    assert state.checkpoint is cp and state.checkpoint_of("m1") is cp
    assert state.checkpoint_of("m2") is None
    assert state.resume == {"message_id": "m1", "attempts": 2}
    assert state.interrupted == {"at": "t", "reason": "shutdown"}
    assert run(state, transitions.drop_checkpoint()).checkpoint is None


def test_waiting_for_the_model_marks_the_entry_and_may_restart_the_resume_count():
    state = SessionState(pending=(pending("m1"), pending("m2")), resume={"message_id": "m1"})
    assert state.wait_info("m1") == {} and state.wait_info("gone") is None
    kept = run(state, transitions.waiting_for_model("m1", "t0", False, False))
    assert kept.wait_info("m1") == {"since": "t0", "notified": False}
    assert kept.wait_info("m2") == {} and kept.resume == {"message_id": "m1"}
    reset = run(state, transitions.waiting_for_model("m1", "t0", True, True))
    assert reset.wait_info("m1") == {"since": "t0", "notified": True} and reset.resume is None


def test_a_piece_goes_out_through_the_ledger():
    state = SessionState(outbox=(answer("d-1"), answer("d-2")))
    sending = run(state, transitions.piece_sending("d-1", 1, ["a", "b"]))
    entry = sending.outbox_entry("d-1")
    assert entry is not None and (entry["state"], entry["next"], entry["pieces"]) == (
        "sending",
        1,
        ["a", "b"],
    )
    back = run(sending, transitions.postponed("d-1", 1))
    assert back.outbox_entry("d-1")["state"] == "queued"  # type: ignore[index]
    sent = run(sending, transitions.delivered("d-1", "m1", True))
    assert [e["id"] for e in sent.outbox] == ["d-2"]
    # An answer no longer in the ledger: nothing to write.
    assert transitions.piece_sending("d-1", 0)(sent) is None
    assert transitions.postponed("d-1", 0)(sent) is None
    assert transitions.delivered("d-1", "m1", True)(sent) is None


def test_a_refused_answer_is_kept_failed_and_only_the_newest_failures_stay():
    state = SessionState(outbox=tuple(answer(f"d-{i}") for i in range(FAILED_KEPT + 2)))
    for i in range(FAILED_KEPT + 2):
        state = run(state, transitions.delivery_failed(f"d-{i}", "blocked", 0, at=1.0))
    assert len(state.outbox) == FAILED_KEPT
    last = state.outbox[-1]
    assert last["id"] == f"d-{FAILED_KEPT + 1}" and last["state"] == "failed"
    assert last["reason"] == "blocked" and "pieces" not in last


def test_previews_are_recorded_replaced_and_dropped_with_their_final_answer():
    state = run(SessionState(), transitions.previewing("m1", ["1"]))
    state = run(state, transitions.previewing("m1", ["1", "2"]), transitions.previewing("m2", []))
    assert state.preview_ids("m1") == ["1", "2"] and len(state.previews) == 2
    # A progress note (not final) keeps the record; the final answer drops it.
    assert transitions.delivered(None, "m1", False)(state) is None
    assert run(state, transitions.delivered(None, "m1", True)).preview_ids("m1") == []
    for i in range(PREVIEWS_KEPT + 1):
        state = run(state, transitions.previewing(f"r{i}", ["x"]))
    assert len(state.previews) == PREVIEWS_KEPT


def test_an_approval_is_decided_once_and_always_remembers_its_key():
    state = SessionState(checkpoint=waiting_checkpoint())
    assert state.open_approval is not None and state.open_approval["state"] == "waiting"
    always = run(state, transitions.decide_approval("ap-1", "always", by="7", press="p1"))
    assert always.open_approval["state"] == "always"  # type: ignore[index]
    assert always.approved_calls == ("exec:ls",)
    assert always.closed_approval("ap-1")["press"] == "p1"  # type: ignore[index]
    # First writer wins: a second press, a timeout, another id change nothing.
    assert transitions.decide_approval("ap-1", "deny")(always) is None
    assert transitions.decide_approval("ap-2", "once")(state) is None
    again = replace(always, checkpoint=waiting_checkpoint())
    assert run(again, transitions.decide_approval("ap-1", "always")).approved_calls == ("exec:ls",)
    closed = SessionState(approvals_closed=tuple({"id": f"a{i}"} for i in range(CLOSED_KEPT)))
    closed = replace(closed, checkpoint=waiting_checkpoint())
    assert len(run(closed, transitions.decide_approval("ap-1", "once")).approvals_closed) == (
        CLOSED_KEPT
    )
    forgot = run(
        SessionState(approved_calls=("tool:exec", "exec:ls")),
        transitions.forget_approved_calls(lambda k: k.startswith("tool:")),
    )
    assert forgot.approved_calls == ("exec:ls",)


def test_an_update_names_only_what_changed_and_an_empty_list_is_no_key():
    state = SessionState.of({"key": "k", "pending": [pending("m1")], "x-newer": 1})
    assert state.extra == {"x-newer": 1}
    done = run(state, transitions.finish("m1", [answer("d-1")]))
    update = state.update_to(done)
    assert update == {"pending": None, "outbox": [answer("d-1")]}
    cp = waiting_checkpoint()
    assert state.update_to(run(state, transitions.checkpoint(cp))) == {"runtime_checkpoint": cp}
    marked = run(state, transitions.imported("nanobot:x", "2025"))
    assert state.update_to(marked) == {"created_at": "2025", "imported_from": "nanobot:x"}


def test_a_metadata_mapping_and_its_state_carry_the_same_things():
    meta = {
        "key": "k",
        "created_at": "t",
        "pending": [pending("m1")],
        "seen_ids": ["m1"],
        "runtime_checkpoint": waiting_checkpoint(),
        "resume": {"message_id": "m1", "attempts": 1},
        "interrupted": {"at": "t", "reason": "shutdown"},
        "outbox": [answer("d-1")],
        "previews": [{"reply_to": "m1", "ids": ["1"]}],
        "notices": ["n"],
        "approvals_closed": [{"id": "a", "state": "once"}],
        "approved_calls": ["exec:ls"],
        "from-a-newer-memobot": {"x": 1},
    }
    state = SessionState.of(meta)
    assert SessionState().update_to(state) == meta
    assert SessionState.of(SessionState().update_to(state)) == state
    assert SessionState.of({"pending": None, "outbox": "junk"}) == SessionState()


# -- round trip through files --------------------------------------------------------------


def planted(tmp_path: Path, fixture: str, key: str) -> SessionStore:
    store = SessionStore(tmp_path / "state")
    shutil.copy(DATA / fixture, store.path_for(key))
    return store


def loaded_both_ways(tmp_path: Path, key: str) -> SessionState:
    """The state a fresh store loads, from the last full record and from the whole file (the
    two must agree)."""
    store = SessionStore(tmp_path / "state")
    whole = store._load(key, from_snapshot=False).state
    assert store._load(key).state == whole
    assert read_state(store.path_for(key)) == whole
    return whole


def test_a_file_of_change_records_written_before_the_typed_state_loads_into_it(tmp_path):
    key = "telegram:42"
    store = planted(tmp_path, "changes.jsonl", key)
    state = store.get(key).state
    assert state.key == key
    assert [p["id"] for p in state.pending] == ["m2", "m3"]
    assert state.seen_ids == ("m1", "m2", "m3")
    assert state.checkpoint is None and state.resume is None and state.interrupted is None
    (entry,) = state.outbox
    assert (entry["id"], entry["state"], entry["next"], entry["pieces"]) == (
        "d-1",
        "sending",
        1,
        ["do", "ne"],
    )
    assert state.preview_ids("m2") == ["501", "502"]
    assert state.notices == ("paired:telegram:9",)
    assert [(c["id"], c["state"]) for c in state.approvals_closed] == [
        ("ap-0123456789ab", "always")
    ]
    assert state.approved_calls == ("exec:rm x",)
    assert state.extra == {"future_key": {"kept": True}}
    assert loaded_both_ways(tmp_path, key) == state

    # Written now (change records and a full record after a consolidation), read back the same.
    session = store.get(key)
    assert store.apply(session, transitions.accept(pending("m4")))
    assert store.apply(session, transitions.delivered("d-1", "m2", True), fsync=False)
    store.apply(
        session,
        transitions.finish("m2", [answer("d-2", "m2")]),
        [
            {"role": "user", "content": "and this"},
            {"role": "assistant", "content": "done"},
        ],
    )
    store.append(session, last_consolidated=session.count)
    assert store.apply(session, transitions.piece_sending("d-2", 0))
    now = session.state
    assert [p["id"] for p in now.pending] == ["m3", "m4"] and now.previews == ()
    assert [(e["id"], e["state"]) for e in now.outbox] == [("d-2", "sending")]
    assert loaded_both_ways(tmp_path, key) == now


def test_a_file_of_whole_records_without_offsets_loads_into_the_state(tmp_path):
    key = "telegram:43"
    store = planted(tmp_path, "whole.jsonl", key)
    session = store.get(key)
    state = session.state
    assert (state.key, state.created_at) == (key, "2025-01-01T00:00:00Z")
    assert [p["id"] for p in state.pending] == ["o1"] and state.seen_ids == ("o0", "o1")
    assert state.outbox[0]["state"] == "failed" and state.approved_calls == ("exec:ls",)
    assert [m["content"] for m in session.messages] == ["old hi", "old hello"]
    store.apply(session, transitions.finish("o1"), [{"role": "assistant", "content": "x"}])
    assert loaded_both_ways(tmp_path, key) == session.state
    assert session.state.pending == () and session.state.seen_ids == ("o0", "o1")


def test_a_refused_transition_writes_nothing(tmp_path):
    store = SessionStore(tmp_path / "state")
    session = store.get("telegram:1")
    assert store.apply(session, transitions.accept(pending("m1")))
    size = store.path_for("telegram:1").stat().st_size
    turn = [{"role": "user", "content": "hi"}]
    assert not store.apply(session, transitions.accept(pending("m1")), turn)
    assert store.path_for("telegram:1").stat().st_size == size and session.count == 0


# -- one package knows the keys ------------------------------------------------------------

# The keys of a session's metadata (the state's fields as stored, and one an older memobot
# wrote), apart from "key" and "created_at", which are too common a word to look for.
SESSION_KEYS = (METADATA_KEYS - {"key", "created_at"}) | {"paired_notice"}
# Strings equal to a session key that are something else: (file, string) -> what it is.
NOT_SESSION_METADATA = {
    ("bot/pairing.py", "pending"): "the pairing store's own file: its list of unused codes",
}


def session_keys_named(root: Path) -> list[str]:
    """Every string literal equal to a session metadata key in bot/ and channels/ outside
    bot/session/ (docstrings apart), as "path:line: 'key'"."""
    found = []
    for folder in ("bot", "channels"):
        for path in sorted((root / folder).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel.startswith("bot/session/") or rel == "bot/session.py":
                continue
            if not any(key in path.read_text(encoding="utf-8") for key in SESSION_KEYS):
                continue  # no such string anywhere in the file, so no such literal
            tree = parse(path)
            docstrings = {
                id(node.body[0].value)
                for node in ast.walk(tree)
                if isinstance(
                    node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
                )
                and node.body
                and isinstance(node.body[0], ast.Expr)
                and isinstance(node.body[0].value, ast.Constant)
            }
            for node in ast.walk(tree):
                if (
                    isinstance(node, ast.Constant)
                    and isinstance(node.value, str)
                    and node.value in SESSION_KEYS
                    and id(node) not in docstrings
                    and (rel, node.value) not in NOT_SESSION_METADATA
                ):
                    found.append(f"{rel}:{node.lineno}: {node.value!r}")
    return found


def test_no_module_outside_the_session_package_names_a_session_metadata_key():
    assert session_keys_named(REPO) == []


@pytest.mark.parametrize("line", ['meta.get("outbox")', 'update = {"runtime_checkpoint": None}'])
def test_the_key_check_finds_a_key_named_outside_the_package(tmp_path, line):
    (tmp_path / "bot").mkdir()
    (tmp_path / "channels").mkdir()
    (tmp_path / "bot" / "x.py").write_text(f'"""Mentions "outbox" in prose."""\n{line}\n')
    assert len(session_keys_named(tmp_path)) == 1
