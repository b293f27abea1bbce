"""Issue 9, item 4: damaged or hostile state never stops the daemon.

The agent can write into its own session files through ``exec``, and a disk or a hand edit can
damage them. Each attack below is a wrong-shaped record (or a folder where a file belongs)
planted on disk, then the real ``memobot agent`` or the real gateway is started as a
subprocess against the fake LLM (and the fake Telegram Bot API). It must answer, set the bad
record aside in a ``.corrupt-*`` copy, and keep every good record.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bot.config import parse_config
from bot.context import ContextBuilder, api_messages
from bot.records import check_record, clean_metadata
from bot.runner import INTERRUPTED_TOOL_RESULT
from bot.service.doctor import check_sessions, scan_session
from bot.session import SessionStore
from tests.fakes.llm_server import FakeLLM, FakeLLMThread, history_problem
from tests.fakes.telegram_api import FakeBotAPI
from tests.helpers import (
    REPO,
    Harness,
    config_dict,
    make_config,
    request_messages,
    run_memobot,
    write_config,
)

KEY = "cli:victim"


@pytest.fixture
def llm() -> Iterator[FakeLLMThread]:
    with FakeLLM.start_in_thread() as server:
        yield server


def session_path(tmp_path: Path, key: str = KEY) -> Path:
    return SessionStore(tmp_path / "state").path_for(key)


def last_metadata(path: Path) -> dict[str, Any]:
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    return [r for r in lines if r.get("_type") == "metadata"][-1]


def append_lines(path: Path, *records: Any) -> None:
    """What ``echo '...' >> file`` through the agent's shell does."""
    with path.open("a") as fh:
        for r in records:
            fh.write(json.dumps(r) + "\n")


def corrupt_copies(path: Path) -> list[Path]:
    return sorted(path.parent.glob(f"{path.name}.corrupt-*"))


def texts(tmp_path: Path, key: str = KEY) -> list[str]:
    session = SessionStore(tmp_path / "state").get(key)
    return [str(m.get("content")).split("\n\n[runtime context", 1)[0] for m in session.messages]


def with_meta(**fields: Any) -> Callable[[Path], list[Any]]:
    """An attack: a metadata record like the last one, with ``fields`` replaced."""

    def attack(path: Path) -> list[Any]:
        record = last_metadata(path)
        record["metadata"].update(fields)
        return [record]

    return attack


def with_record(bad: Any) -> Callable[[Path], list[Any]]:
    """An attack: a bad line in the middle of the file (a good metadata line follows it)."""

    def attack(path: Path) -> list[Any]:
        return [bad, last_metadata(path)]

    return attack


def with_pointer(value: Any) -> Callable[[Path], list[Any]]:
    def attack(path: Path) -> list[Any]:
        return [{**last_metadata(path), "last_consolidated": value}]

    return attack


GOOD_PENDING = {
    "id": "m-queued",
    "sender_id": "user",
    "text": "queued question",
    "media": [],
    "reply_to": None,
    "metadata": {},
    "received_at": "2026-01-01T00:00:00.000Z",
}

ATTACKS: dict[str, Callable[[Path], list[Any]]] = {
    "pending entry without id": with_meta(pending=[GOOD_PENDING, {"text": "no id here"}]),
    "pending as a string": with_meta(pending="x"),
    "outbox entry without channel": with_meta(
        outbox=[{"id": "d-1", "chat_id": "victim", "text": "t", "state": "queued"}]
    ),
    "last_consolidated not a number": with_pointer("abc"),
    "last_consolidated negative": with_pointer(-3),
    "seen_ids a number": with_meta(seen_ids=5),
    "runtime_checkpoint a string": with_meta(runtime_checkpoint="x"),
    "runtime_checkpoint without messages": with_meta(
        runtime_checkpoint={"phase": "final_response", "message_id": "m", "messages": []}
    ),
    "resume attempts a string": with_meta(resume={"message_id": "m", "attempts": "many"}),
    "metadata not an object": with_record({"_type": "metadata", "metadata": [1, 2]}),
    "message line a JSON list": with_record([1, 2, 3]),
    "message line a JSON number": with_record(5),
    "message line a JSON string": with_record("just text"),
    "message with an unknown role": with_record({"role": "wizard", "content": "obey"}),
    "message without a role": with_record({"content": "who said this"}),
    "tool message without tool_call_id": with_record({"role": "tool", "content": "result"}),
    "tool_calls not a list": with_record({"role": "assistant", "content": "", "tool_calls": 7}),
    "tool call without function": with_record(
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]}
    ),
}


@pytest.mark.parametrize("attack", list(ATTACKS), ids=list(ATTACKS))
def test_wrong_shaped_record_is_set_aside_and_the_agent_answers(
    tmp_path: Path, llm: FakeLLMThread, attack: str
) -> None:
    cfg = write_config(tmp_path, llm.base_url)
    first = run_memobot("agent", "-m", "remember this", "-s", KEY, config=cfg)
    assert first.returncode == 0, first.stderr
    path = session_path(tmp_path)
    bad = ATTACKS[attack](path)
    append_lines(path, *bad)
    planted = path.read_bytes()

    done = run_memobot("agent", "-m", "still there?", "-s", KEY, config=cfg)

    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout.splitlines()[-1] == "echo: still there?"
    # The bad record is in a copy of the file as it was, and named in one log line.
    [aside] = corrupt_copies(path)
    assert aside.read_bytes() == planted
    errors = [line for line in done.stderr.splitlines() if "wrong-shaped" in line]
    assert len(errors) == 1 and KEY in errors[0] and str(path) in errors[0]
    bad_line = planted.decode().splitlines().index(json.dumps(bad[0])) + 1
    assert f"line {bad_line}:" in errors[0]
    # Every good message survived, and the live file is clean: the next start is quiet.
    said = texts(tmp_path)
    assert said[:2] == ["remember this", "echo: remember this"]
    assert said[-2:] == ["still there?", "echo: still there?"]
    data = path.read_bytes()
    assert scan_session(data).misshapen == [] and scan_session(data).bad_lines == []
    again = run_memobot("agent", "-m", "and now?", "-s", KEY, config=cfg)
    assert again.returncode == 0 and "wrong-shaped" not in again.stderr
    assert len(corrupt_copies(path)) == 1
    # Every request the model saw was valid for the API (the fake LLM answers 400 otherwise).
    for entry in llm.requests:
        assert history_problem(request_messages(entry)) is None


def test_good_entries_of_a_damaged_list_are_kept_and_answered(
    tmp_path: Path, llm: FakeLLMThread
) -> None:
    """The good pending entry next to a bad one is resumed: a bad field loses only itself."""
    cfg = write_config(tmp_path, llm.base_url)
    assert run_memobot("agent", "-m", "hello", "-s", KEY, config=cfg).returncode == 0
    path = session_path(tmp_path)
    append_lines(path, *ATTACKS["pending entry without id"](path))
    done = run_memobot("agent", "-m", "next", "-s", KEY, config=cfg)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["echo: queued question", "echo: next"]
    assert "queued question" in texts(tmp_path)


def test_bad_pointer_keeps_the_previous_one(tmp_path: Path, llm: FakeLLMThread) -> None:
    cfg = write_config(tmp_path, llm.base_url)
    assert run_memobot("agent", "-m", "one", "-s", KEY, config=cfg).returncode == 0
    store = SessionStore(tmp_path / "state")
    store.append(store.get(KEY), last_consolidated=2)
    path = session_path(tmp_path)
    append_lines(path, *with_pointer("abc")(path))
    done = run_memobot("agent", "-m", "two", "-s", KEY, config=cfg)
    assert done.returncode == 0, done.stderr
    assert SessionStore(tmp_path / "state").get(KEY).last_consolidated == 2
    # The archived messages stay out of the prompt: the pointer did not fall back to 0.
    sent = [m.get("content") for m in request_messages(llm.requests[-1])]
    assert not any(isinstance(c, str) and c.startswith("one\n") for c in sent)


# -- folders where files belong, files where folders belong ------------------------------------


@pytest.mark.parametrize(
    "where",
    ["session file", "sessions folder", "state folder", "MEMORY.md", "USER.md", "history.jsonl"],
)
def test_wrong_kind_of_path_is_one_line_and_a_non_zero_exit(
    tmp_path: Path, llm: FakeLLMThread, where: str
) -> None:
    cfg = write_config(tmp_path, llm.base_url)
    assert run_memobot("agent", "-m", "set up", "-s", "cli:other", config=cfg).returncode == 0
    state, ws = tmp_path / "state", tmp_path / "ws"
    target = {
        "session file": session_path(tmp_path),
        "sessions folder": state / "sessions",
        "state folder": state,
        "MEMORY.md": ws / "memory" / "MEMORY.md",
        "USER.md": ws / "USER.md",
        "history.jsonl": ws / "memory" / "history.jsonl",
    }[where]
    if target.is_dir():
        os.rename(target, tmp_path / "moved")
        target.write_text("a file where a folder belongs\n")
    else:
        target.unlink(missing_ok=True)
        (target / "inside").mkdir(parents=True)
    done = run_memobot("agent", "-m", "hi", "-s", KEY, config=cfg)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    [line] = done.stderr.strip().splitlines()
    assert str(target) in line
    assert done.stdout == ""
    assert llm.requests[1:] == []


def test_doctor_names_a_folder_where_a_session_file_belongs(tmp_path: Path) -> None:
    cfg = parse_config(config_dict(tmp_path, "http://127.0.0.1:9/v1"))
    path = SessionStore(tmp_path / "state").path_for("cli:x")
    path.mkdir()
    [check] = [c for c in check_sessions(cfg, fix=True) if str(path) in c.text]
    assert check.status == "fail" and "not a regular file" in check.text


# -- the gateway: one bad session never stops the others ---------------------------------------

ALICE = 1001


def _stop(proc: subprocess.Popen[bytes]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait(10)


def test_gateway_recovers_and_answers_around_damaged_sessions(tmp_path: Path) -> None:
    store = SessionStore(tmp_path / "state")
    # A hostile metadata record with a good pending turn inside: that turn is still answered.
    hostile = store.get("telegram:2001")
    store.append(hostile, [{"role": "user", "content": "old"}])
    append_lines(
        hostile.path, *with_meta(pending=[GOOD_PENDING, {"no": "id"}], seen_ids=5)(hostile.path)
    )
    # A good undelivered answer next to a bad one: the good one is sent again.
    outbox = store.get("telegram:2003")
    good = {"id": "d-good", "channel": "telegram", "chat_id": "2003", "text": "kept answer"}
    store.append(outbox, metadata={"outbox": [good]})
    append_lines(
        outbox.path, with_meta(outbox=[{"id": "d-bad", "text": "x"}, good])(outbox.path)[0]
    )
    # A folder where a session file belongs.
    folder = store.path_for("telegram:2002")
    (folder / "inside").mkdir(parents=True)
    # A session whose history is broken for the API (no wrong shape: orphan tool result,
    # unanswered call, object content).
    broken = store.get(f"telegram:{ALICE}")
    store.append(
        broken,
        [
            {"role": "tool", "tool_call_id": "nobody", "content": "orphan"},
            {"role": "user", "content": {"odd": "content"}},
            {"role": "assistant", "content": None, "tool_calls": [_call("c1")]},
        ],
    )
    with FakeLLM.start_in_thread() as llm, FakeBotAPI.start_in_thread() as api:
        for chat in (2001, 2003):  # chats the bot has talked to before
            api._chats[chat] = api.private_chat(chat)
        telegram = {
            "enabled": True,
            "token": api.token,
            "baseUrl": api.base_url,
            "allowFrom": [str(ALICE)],
            "pollTimeoutSeconds": 1,
        }
        cfg = write_config(tmp_path, llm.base_url, channels={"telegram": telegram})
        err_path = tmp_path / "gateway.err"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "MEMOBOT_"))}
        with err_path.open("wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "bot", "--config", str(cfg), "gateway"],
                cwd=REPO,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        try:
            api.wait_for(
                lambda: (
                    {c.params.get("text") for c in api.sent()}
                    >= {
                        "echo: queued question",
                        "kept answer",
                    }
                ),
                timeout=30,
            )
            api.private_text("are you alive?", user_id=ALICE)
            api.wait_for(
                lambda: "echo: are you alive?" in {c.params.get("text") for c in api.sent()},
                timeout=30,
            )
            assert proc.poll() is None, err_path.read_text()
        finally:
            rc = _stop(proc)
        log = err_path.read_text()
        assert rc == 0, log
        assert "Traceback" not in log, log
        assert str(folder) in log
        for entry in llm.requests:
            assert history_problem(request_messages(entry)) is None
    assert corrupt_copies(hostile.path) and corrupt_copies(outbox.path)
    assert not any(c.params.get("text") == "x" for c in api.sent())


# -- the history sent to the model: a pure function -------------------------------------------


def _call(call_id: str, name: str = "exec") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": "{}"}}


VALID: list[dict[str, Any]] = [
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": None, "tool_calls": [_call("a"), _call("b")]},
    {"role": "tool", "tool_call_id": "a", "name": "exec", "content": "ok"},
    {"role": "tool", "tool_call_id": "b", "name": "exec", "content": "ok"},
    {"role": "assistant", "content": "done"},
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "look"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        ],
    },
]


def test_a_valid_history_is_returned_untouched() -> None:
    out = api_messages(VALID)
    assert out == VALID and all(a is b for a, b in zip(out, VALID, strict=True))


def test_orphan_tool_results_are_dropped() -> None:
    orphan = {"role": "tool", "tool_call_id": "zzz", "content": "who asked?"}
    out = api_messages([VALID[0], orphan, *VALID[1:4], {**VALID[2]}, *VALID[4:]])
    assert orphan not in out and out == VALID  # the second answer to call "a" went too
    assert history_problem(out) is None


def test_unanswered_calls_get_the_interrupted_result() -> None:
    history = [VALID[0], VALID[1], VALID[2], {"role": "user", "content": "next"}]
    out = api_messages(history)
    assert out[3] == {
        "role": "tool",
        "tool_call_id": "b",
        "name": "exec",
        "content": INTERRUPTED_TOOL_RESULT,
    }
    assert history_problem(out) is None and len(history) == 4  # the input is not modified


@pytest.mark.parametrize(
    ("content", "text"),
    [
        ({"a": 1}, '{"a": 1}'),
        (42, "42"),
        (None, ""),
        ([{"type": "text", "text": "x"}, {"type": "text", "text": "y"}], None),
        ([{"type": "image_url"}], '[{"type": "image_url"}]'),
        ([{"text": "a"}, {"text": "b"}], "a\nb"),
        ([], "[]"),
    ],
)
def test_content_the_api_refuses_becomes_text(content: Any, text: str | None) -> None:
    [out] = api_messages([{"role": "user", "content": content}])
    assert out["content"] == (content if text is None else text)
    assert history_problem([out]) is None


def test_unknown_roles_and_malformed_calls_are_dropped() -> None:
    history = [
        {"role": "wizard", "content": "x"},
        "not a message",
        {"role": "assistant", "content": "hm", "tool_calls": [{"id": "c"}, _call("d")]},
        {"role": "tool", "tool_call_id": "c", "content": "for the malformed call"},
        {"role": "assistant", "content": "no calls left", "tool_calls": "x"},
    ]
    out = api_messages(history)
    assert [m["role"] for m in out] == ["assistant", "tool", "assistant"]
    assert out[0]["tool_calls"] == [_call("d")] and out[1]["content"] == INTERRUPTED_TOOL_RESULT
    assert "tool_calls" not in out[2]
    assert history_problem(out) is None


def test_context_builder_sends_the_repaired_history_and_keeps_its_prefix(tmp_path: Path) -> None:
    store = SessionStore(tmp_path)
    session = store.get("cli:x")
    store.append(session, [{"role": "tool", "tool_call_id": "x", "content": "orphan"}, *VALID])
    ctx = ContextBuilder(tmp_path / "ws")
    turn = [{"role": "user", "content": "now"}]
    first = ctx.build(session, turn, 100_000, 1000)
    assert history_problem(first) is None and first[1:] == [*VALID, *turn]
    store.append(session, [*turn, {"role": "assistant", "content": "ok"}])
    second = ctx.build(session, [{"role": "user", "content": "again"}], 100_000, 1000)
    assert second[: len(first)] == first  # byte-identical prefix turn after turn


# -- the shape check and the doctor ------------------------------------------------------------


def test_shape_check_keeps_good_records_as_they_are() -> None:
    message = {"role": "assistant", "content": None, "tool_calls": [_call("a")], "extra": 1}
    assert check_record(message).record is message and not check_record(message).problems
    meta = {"pending": [GOOD_PENDING], "seen_ids": ["a"], "custom": {"x": 1}}
    assert clean_metadata(meta) == (meta, [])


def test_shape_check_drops_only_the_bad_parts_of_metadata() -> None:
    meta = {"pending": [GOOD_PENDING, {"text": "no id"}], "seen_ids": 5, "key": "cli:x"}
    clean, problems = clean_metadata(meta)
    assert clean == {"pending": [GOOD_PENDING], "key": "cli:x"}
    assert problems == [
        "metadata.pending[1]: id: Field required",
        "metadata.seen_ids is a JSON int, not a list",
    ]


def _doctor(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_memobot(
        "doctor",
        *args,
        config=tmp_path / "config.json",
        env={"MEMOBOT_UNIT_DIR": str(tmp_path / "units")},
    )


def test_doctor_reports_shape_errors_and_fix_repairs_them(
    tmp_path: Path, llm: FakeLLMThread
) -> None:
    cfg = write_config(tmp_path, llm.base_url)
    assert run_memobot("agent", "-m", "keep me", "-s", KEY, config=cfg).returncode == 0
    path = session_path(tmp_path)
    append_lines(path, *with_record({"role": "wizard", "content": "x"})(path))
    append_lines(path, *with_meta(seen_ids=5)(path))
    n = len(path.read_text().splitlines())

    report = _doctor(tmp_path)
    assert report.returncode == 1
    assert (
        f"✗ session {KEY} ({path}): line {n - 2}: message role: Input should be 'system', "
        "'user', 'assistant' or 'tool'; "
        f"line {n}: metadata.seen_ids is a JSON int, not a list"
    ) in report.stdout
    assert not corrupt_copies(path)  # reading only

    fixed = _doctor(tmp_path, "--fix")
    assert f"✓ session {KEY} ({path}): repaired (2 messages kept)" in fixed.stdout
    assert len(corrupt_copies(path)) == 1
    assert texts(tmp_path) == ["keep me", "echo: keep me"]
    assert "sessions: all 1 file(s) parse" in _doctor(tmp_path).stdout


async def test_a_failure_while_recovering_one_session_leaves_the_others(
    tmp_path: Path, llm: FakeLLMThread, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    cfg = make_config(tmp_path, llm.base_url)
    store = SessionStore(tmp_path / "state")
    for key in ("cli:a", "cli:b", "cli:c"):
        pending = {**GOOD_PENDING, "id": key, "text": f"queued in {key}"}
        store.append(store.get(key), metadata={"pending": [pending]})
    harness = Harness(cfg, tmp_path / "config.json")
    real = harness.stack.store.peek_metadata

    def peek(key: str) -> dict[str, Any] | None:
        if key == "cli:b":
            raise RuntimeError("a bug met while recovering")
        return real(key)

    monkeypatch.setattr(harness.stack.store, "peek_metadata", peek)
    answers = [harness.expect("cli:a"), harness.expect("cli:c")]
    async with harness:
        done = await asyncio.wait_for(asyncio.gather(*answers), 15)
    assert [m.text for m in done] == ["echo: queued in cli:a", "echo: queued in cli:c"]
    assert "recovery failed session=cli:b" in caplog.text


def test_gateway_with_a_file_where_the_sessions_folder_belongs_says_so_in_one_line(
    tmp_path: Path, llm: FakeLLMThread
) -> None:
    cfg = write_config(tmp_path, llm.base_url)
    sessions = tmp_path / "state" / "sessions"
    sessions.parent.mkdir()
    sessions.write_text("not a folder\n")
    done = run_memobot("gateway", config=cfg, timeout=30)
    assert done.returncode == 78  # EX_CONFIG: systemd does not restart-loop on it
    assert "Traceback" not in done.stderr
    [line] = [x for x in done.stderr.splitlines() if str(sessions) in x]
    assert "must be a folder" in line
