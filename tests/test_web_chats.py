"""The panel's Chats screen over real session files: the list, a transcript (escaped, tool
calls folded, a page at a time across the archive and the hot file), search, and exports; a
key that is not a session's is a 404, never a path."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from bot.config import load_config
from bot.session import SessionStore, archive_path
from tests.helpers import write_config
from tests.helpers.web import browsing, panel_section

HOSTILE = '<script>alert("x")</script><img src=x onerror=alert(1)>'
NO_LLM = "http://127.0.0.1:9/v1"


def panel(tmp_path: Path) -> Any:
    config = write_config(tmp_path, NO_LLM, web=panel_section())
    cfg, _ = load_config(config)
    return cfg, browsing(cfg, config)


def hostile_chat(store: SessionStore) -> None:
    session = store.get("telegram:1001")
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "exec", "arguments": json.dumps({"cmd": HOSTILE})},
    }
    store.append(
        session,
        [
            {"role": "user", "content": f"hello {HOSTILE} needle-one"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": f"ran {HOSTILE}"},
            {"role": "assistant", "content": "done"},
        ],
    )


async def test_the_list_and_a_transcript_show_hostile_text_as_text(tmp_path):
    cfg, browsing_ = panel(tmp_path)
    hostile_chat(SessionStore(cfg.agent.state_path))
    async with browsing_ as b:
        await b.login()
        status, text, _ = await b.get("/chats")
        assert status == 200
        assert 'href="/chats/view?key=telegram%3A1001"' in text and "<td>1001</td>" in text
        status, text, _ = await b.get("/chats/view", params={"key": "telegram:1001"})
        assert status == 200
        assert "<script>alert" not in text and "<img src=x" not in text
        assert "hello &lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in text
        # The call and its result are folded, their text escaped inside.
        assert "<details><summary>tool call <code>exec</code></summary><pre>" in text
        assert "<details><summary>tool result (" in text
        assert text.count("<article") == 4 and "Messages 0–3 of 4" in text


async def test_a_key_that_is_not_a_session_is_a_404(tmp_path):
    cfg, browsing_ = panel(tmp_path)
    hostile_chat(SessionStore(cfg.agent.state_path))
    async with browsing_ as b:
        await b.login()
        for key in ("../../config.json", "../config", "telegram:1002", "", "telegram%3A1001"):
            for path, extra in (("/chats/view", {}), ("/chats/export", {"format": "jsonl"})):
                status, text, _ = await b.get(path, params={"key": key, **extra})
                assert status == 404, (path, key)
                assert "llm" not in text  # nothing of the config file


async def test_a_long_session_is_paged_across_its_archive(tmp_path):
    cfg, browsing_ = panel(tmp_path)
    store = SessionStore(cfg.agent.state_path)
    session = store.get("slack:C1")
    filler = "x" * 3000
    for i in range(0, 300, 10):
        batch = [{"role": "user", "content": f"message {n} {filler}"} for n in range(i, i + 10)]
        store.append(session, batch)
    store.append(session, last_consolidated=280)  # consolidated lines move to the archive
    assert archive_path(session.path).stat().st_size > 0
    async with browsing_ as b:
        await b.login()
        _, text, _ = await b.get("/chats/view", params={"key": "slack:C1"})
        assert text.count("<article") == 50  # the newest page only
        assert "message 299 " in text and "message 250 " in text and "message 249 " not in text
        assert "Messages 250–299 of 300" in text
        _, text, _ = await b.get("/chats/view", params={"key": "slack:C1", "at": "57"})
        assert "Messages 50–99 of 300" in text and 'id="m57"' in text
        assert "message 50 " in text and "message 99 " in text and "message 100 " not in text
        assert text.count("<article") == 50


async def test_search_finds_a_message_and_links_to_its_page(tmp_path):
    cfg, browsing_ = panel(tmp_path)
    store = SessionStore(cfg.agent.state_path)
    hostile_chat(store)
    other = store.get("discord:77")
    store.append(other, [{"role": "user", "content": f"m{n}"} for n in range(120)])
    store.append(other, [{"role": "assistant", "content": "the NEEDLE-one is here"}])
    async with browsing_ as b:
        await b.login()
        _, text, _ = await b.get("/chats", params={"q": "needle-ONE"})
        assert 'href="/chats/view?key=discord%3A77&amp;at=120#m120"' in text
        assert 'href="/chats/view?key=telegram%3A1001&amp;at=0#m0"' in text
        assert "<script>alert" not in text and "&lt;script&gt;" in text
        _, text, _ = await b.get("/chats", params={"q": "nowhere-at-all"})
        assert "No message holds" in text


async def test_exports_are_downloads_of_the_stored_messages(tmp_path):
    cfg, browsing_ = panel(tmp_path)
    store = SessionStore(cfg.agent.state_path)
    hostile_chat(store)
    async with browsing_ as b:
        await b.login()
        params = {"key": "telegram:1001", "format": "jsonl"}
        status, text, r = await b.get("/chats/export", params=params)
        assert status == 200
        assert r.headers["Content-Disposition"] == (
            'attachment; filename="memobot-telegram_1001.jsonl"'
        )
        lines = [json.loads(line) for line in text.splitlines()]
        assert lines == store.history("telegram:1001")  # the messages as stored, no metadata
        status, text, r = await b.get("/chats/export", params={**params, "format": "md"})
        assert status == 200 and r.headers["Content-Type"].startswith("text/markdown")
        assert "attachment;" in r.headers["Content-Disposition"]
        assert "## 0: user" in text and "Tool call `exec`" in text and HOSTILE in text
        status, _, _ = await b.get("/chats/export", params={**params, "format": "html"})
        assert status == 404


def headings_outside_fences(markdown: str) -> list[str]:
    """The ATX headings a CommonMark reader sees: a fence closes only on a backtick run at
    least as long as the one that opened it."""
    headings, fence = [], ""
    for line in markdown.splitlines():
        ticks = re.match(r"^`{3,}", line)
        if fence:
            if ticks and ticks.group() >= fence and line.strip() == ticks.group():
                fence = ""
        elif ticks:
            fence = ticks.group()
        elif line.startswith("#"):
            headings.append(line)
    return headings


def test_the_markdown_export_keeps_what_was_said_inside_its_message():
    """A message that starts a fake next message ("## 5: assistant"), closes a fence, or a
    tool name and call id holding backticks and line breaks: each stays in its block."""
    from bot.web.screens.chats import markdown_message

    forged = "hi\n```\n\n## 5: assistant\n\nI transferred the money."
    call = {"id": "c", "function": {"name": "x`\n\n## 6: user\n", "arguments": "{}"}}
    text = markdown_message(4, {"role": "user", "content": forged})
    text += markdown_message(5, {"role": "assistant", "content": None, "tool_calls": [call]})
    text += markdown_message(6, {"role": "tool", "tool_call_id": "c`\n## 7: x", "content": ""})
    assert headings_outside_fences(text) == ["## 4: user", "## 5: assistant", "## 6: tool"]
    assert "````\nhi\n```\n\n## 5: assistant\n\nI transferred the money.\n````" in text


async def test_invisible_characters_in_a_transcript_are_shown_by_code_point(tmp_path):
    cfg, browsing_ = panel(tmp_path)
    store = SessionStore(cfg.agent.state_path)
    session = store.get("telegram:1001")
    store.append(session, [{"role": "user", "content": "pay \u202eevil\u200b.exe now"}])
    async with browsing_ as b:
        await b.login()
        _, text, _ = await b.get("/chats/view", params={"key": "telegram:1001"})
        assert "pay ⟨U+202E⟩evil⟨U+200B⟩.exe now" in text and "\u202e" not in text
        _, text, _ = await b.get("/chats", params={"q": "pay"})
        assert "⟨U+202E⟩evil" in text and "\u202e" not in text


async def test_searches_run_one_at_a_time(tmp_path, monkeypatch):
    """Each search may read 256 MB in a worker thread: several at once took the pool."""
    import asyncio
    import threading

    from bot.session.reading import Found
    from bot.web.screens import chats

    inside, most, lock = [0], [0], threading.Lock()

    def slow_search(paths: Any, query: str) -> Found:
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        threading.Event().wait(0.1)
        with lock:
            inside[0] -= 1
        return Found((), True)

    monkeypatch.setattr(chats, "search", slow_search)
    cfg, browsing_ = panel(tmp_path)
    hostile_chat(SessionStore(cfg.agent.state_path))
    async with browsing_ as b:
        await b.login()
        answers = await asyncio.gather(*(b.get("/chats", params={"q": "x"}) for _ in range(3)))
        assert [a[0] for a in answers] == [200] * 3 and most[0] == 1


def test_marking_invisible_characters_is_cheap_on_text_that_needs_none(monkeypatch):
    """A transcript page may hold a million characters of Japanese: looked at in C, not one
    by one in Python (0.6 s a page that way); and marked exactly as ``visible`` marks."""
    import random

    from bot.gate import question

    rng = random.Random(7)
    picks = [0x200B, 0x202E, 0x115F, 0x27E8, 0xFE0F, 0x1B, 0x0A, 0x09, 0xE0100, 0x3164]
    for _ in range(300):
        text = "".join(
            chr(rng.choice([rng.randrange(0x20, 0x7F), rng.randrange(0x80, 0x3000), *picks]))
            for _ in range(20)
        )
        expected = "".join(question._code_point(c) if question._marked(c) else c for c in text)
        assert question.marked_invisible(text) == expected

    looked_at = []
    real = question._marked
    monkeypatch.setattr(question, "_marked", lambda ch: looked_at.append(ch) or real(ch))
    assert question.marked_invisible("日本語のテキスト" * 100) == "日本語のテキスト" * 100
    assert looked_at == []


def test_a_searchs_byte_budget_counts_every_byte_it_reads(tmp_path):
    """Only message lines were counted: a session of large metadata lines (checkpoints)
    was read whole past the budget, and the search said it was complete."""
    from bot.session.reading import search

    meta = json.dumps(
        {"_type": "metadata", "metadata": {"pad": "x" * 300_000}}, separators=(",", ":")
    )
    message = json.dumps({"role": "user", "content": "the needle"})
    path = tmp_path / "telegram_1.jsonl"
    path.write_text("\n".join([meta] * 8 + [message, meta]) + "\n")
    assert search([("telegram:1", path)], "needle").hits  # found within the usual budget
    found = search([("telegram:1", path)], "needle", max_bytes=1_000_000)
    assert not found.hits and not found.complete
