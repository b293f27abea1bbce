"""Context builder: a stable system prompt, the runtime block, the history window."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

from bot.context import ContextBuilder, api_messages, trim_start
from bot.session import SessionStore
from bot.tokens import estimate_text_tokens
from bot.workspace import init_workspace
from tests.fakes.llm_server import alternation_problem, history_problem


def _bump(path: Path, text: str) -> None:
    path.write_text(text)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def test_system_prompt_is_stable_and_follows_file_changes(tmp_path: Path) -> None:
    init_workspace(tmp_path)
    ctx = ContextBuilder(tmp_path)
    first = ctx.system_prompt()
    assert first is ctx.system_prompt()  # cached: same object while nothing changed
    for name in ("AGENTS.md", "SOUL.md", "USER.md", "TOOLS.md", "memory/MEMORY.md"):
        assert f"## {name}" in first
    assert "daily-notes" in first  # the skills summary
    assert "time:" not in first and "channel:" not in first  # nothing per-turn in the prefix
    _bump(tmp_path / "USER.md", "- Name: Ada\n")
    second = ctx.system_prompt()
    assert "- Name: Ada" in second and second != first
    (tmp_path / "memory" / "MEMORY.md").unlink()
    assert "## memory/MEMORY.md" not in ctx.system_prompt()


def test_runtime_block_goes_at_the_end_of_the_user_message(tmp_path: Path) -> None:
    ctx = ContextBuilder(tmp_path)
    now = datetime(2026, 11, 29, 14, 5, tzinfo=UTC)
    msg = ctx.user_message("hello", "telegram", "42", now=now)
    assert msg["role"] == "user"
    text = msg["content"]
    assert text.startswith("hello\n\n[runtime context")
    assert "time: 2026-11-29 14:05 UTC (Sunday)" in text
    assert text.endswith("channel: telegram\nchat: 42")


def test_image_media_become_image_parts(tmp_path: Path) -> None:
    img = tmp_path / "p.png"
    img.write_bytes(b"\x89PNG\r\n\x1a\nfake")
    doc = tmp_path / "doc.pdf"
    doc.write_bytes(b"%PDF")
    msg = ContextBuilder(tmp_path).user_message("see", "cli", "x", media=[str(img), str(doc)])
    parts = msg["content"]
    assert parts[0]["type"] == "text" and str(doc) in parts[0]["text"]
    assert parts[1]["image_url"]["url"].startswith("data:image/png;base64,")


def test_window_never_opens_on_a_tool_result() -> None:
    wire = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]},
        {"role": "tool", "tool_call_id": "1", "content": "x" * 400},
        {"role": "tool", "tool_call_id": "2", "content": "y"},
        {"role": "assistant", "content": "done"},
        {"role": "user", "content": "b"},
        {"role": "assistant", "content": "c"},
    ]
    tokens = [10, 10, 100, 5, 5, 5, 5]
    assert trim_start(wire, tokens, 0, 20) == 5  # opens on the next user message
    assert trim_start(wire, tokens, 0, 1000) == 0
    no_user = wire[1:5]
    assert no_user[trim_start(no_user, tokens[1:5], 0, 12)]["role"] != "tool"


def test_history_respects_last_consolidated_and_budget(tmp_path: Path) -> None:
    store = SessionStore(tmp_path)
    s = store.get("cli:h")
    msgs = []
    for i in range(50):
        msgs += [{"role": "user", "content": f"q{i} " * 20}, {"role": "assistant", "content": "a"}]
    store.append(s, msgs, last_consolidated=10)
    ctx = ContextBuilder(tmp_path)
    full = ctx.history(s, 10**9)
    assert s.base == 10 and full == s.wire and len(full) == 90
    small = ctx.history(s, 300)
    assert small[0]["role"] == "user" and len(small) < len(full)
    assert sum(s.tokens[len(s.wire) - len(small) :]) <= 300
    # Once trimmed, the window start stays put while the tail still fits (prefix stability).
    store.append(s, [{"role": "user", "content": "new"}])
    again = ctx.history(s, 300)
    assert again[: len(small)] == small


def test_a_history_in_chinese_is_trimmed_by_its_weight_not_its_characters(tmp_path: Path) -> None:
    # 200 characters of Chinese are about 300 tokens, not 50: counted as English, a window of
    # them overflowed the model's context.
    store = SessionStore(tmp_path)
    s = store.get("cli:zh")
    turn = [{"role": "user", "content": "漢字" * 100}, {"role": "assistant", "content": "好"}]
    store.append(s, turn * 20)
    window = ContextBuilder(tmp_path).history(s, 3000)
    assert 2 * 5 <= len(window) <= 2 * 10  # 300 tokens and more a turn: not all 40 turns
    assert estimate_text_tokens("漢字" * 100) == 300
    assert estimate_text_tokens("plain English words") == 5  # as before: four characters a token


def test_the_settled_history_is_cleaned_once_and_the_request_is_the_same(tmp_path: Path) -> None:
    """The per-session prefix cache never changes what is sent: every build equals
    api_messages over the whole window, also with broken tool groups in the history."""
    store = SessionStore(tmp_path)
    s = store.get("cli:cache")
    ctx = ContextBuilder(tmp_path)
    call = {"id": "c1", "type": "function", "function": {"name": "exec", "arguments": "{}"}}
    turns = [
        [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
        [
            {"role": "user", "content": "run it"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok"},
            {"role": "assistant", "content": "done"},
        ],
        [{"role": "tool", "tool_call_id": "orphan", "content": "x"}],  # damaged history
        [{"role": "user", "content": "open"}, {"role": "assistant", "tool_calls": [call]}],
        [{"role": "user", "content": "after"}, {"role": "assistant", "content": "fine"}],
    ]
    new = [{"role": "user", "content": "now?"}]
    for part in turns:
        store.append(s, part)
        for _ in range(2):  # the second build comes from the cache
            built = ctx.build(s, new, 100_000, 1000)
            assert built[1:] == api_messages([*s.wire, *new])
    assert s.api_prefix is not None and s.api_prefix.end == s.count - 2


def test_a_history_in_the_wrong_order_is_sent_alternating_and_reported_once(
    tmp_path: Path, caplog
) -> None:
    """Turns an earlier memobot stored without their answer (a failed one, a failed tool
    turn), then a reminder: each build, from the cache or not, is api_messages of the whole
    window, in an order strict chat templates take; the log says so once, as information."""
    store = SessionStore(tmp_path)
    s = store.get("cli:order")
    ctx = ContextBuilder(tmp_path)
    call = {"id": "c1", "type": "function", "function": {"name": "exec", "arguments": "{}"}}
    turns = [
        [{"role": "user", "content": "failed"}],
        [
            {"role": "user", "content": "run it"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        ],
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
        [{"role": "assistant", "content": "reminder: call Ada"}],
    ]
    new = [{"role": "user", "content": "now?"}]
    caplog.set_level("INFO", logger="bot.context")
    for part in turns:
        store.append(s, part)
        for _ in range(2):
            built = ctx.build(s, new, 100_000, 1000)
            assert built[1:] == api_messages([*s.wire, *new])
            assert alternation_problem(built) is None and history_problem(built) is None
    roles = [m["role"] for m in built[1:]]
    assert roles == [
        *("user", "assistant"),  # "failed", then a note: no answer
        *("user", "assistant", "tool", "assistant"),  # the tool turn, then the note
        *("user", "assistant", "user", "assistant"),  # a note for the person, the reminder
        "user",
    ]
    reports = [r for r in caplog.records if "cli:order" in r.getMessage()]
    assert [r.levelname for r in reports] == ["INFO"]
    assert "strict chat templates" in reports[0].getMessage()
