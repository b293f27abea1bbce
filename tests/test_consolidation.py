"""Consolidation into memory/history.jsonl: budgets, cursors, failures, /new, idle compaction."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from bot.memory.consolidate import choose_cut
from bot.memory.history import HistoryArchive
from bot.session import SessionStore
from tests.fakes.llm_server import FakeLLM, error, reply, tool_step
from tests.helpers import Harness, make_config, request_messages

SUMMARY_PROMPT = "Conversation excerpt"


@pytest.fixture
async def llm():
    async with FakeLLM() as server:
        yield server


def summary_step(text: str, **opts) -> dict:
    return tool_step(
        ("save_summary", {"summary": text, "facts": []}), when_user_contains=SUMMARY_PROMPT, **opts
    )


def history(tmp_path: Path) -> list[dict]:
    path = tmp_path / "ws" / "memory" / "history.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def chat_requests(llm: FakeLLM) -> list[dict]:
    return [r for r in llm.requests if SUMMARY_PROMPT not in (r["last_user"] or "")]


def budget(**over) -> dict:
    return {"consolidateAtMessages": 6, "keepRecentMessages": 2, **over}


async def test_consolidation_triggers_at_budget_and_prompt_shrinks(
    tmp_path: Path, llm: FakeLLM
) -> None:
    llm.script(*[summary_step(f"summary {i}") for i in range(5)])
    cfg = make_config(tmp_path, llm.base_url, memory=budget())
    async with Harness(cfg, tmp_path / "c.json") as h:
        for i in range(6):
            await h.ask(f"message {i}")
            await h.stack.loop.consolidator.wait()
    entries = history(tmp_path)
    assert entries and entries[0]["content"].endswith("summary 0")
    assert entries[0]["content"].startswith("[20")  # the excerpt's time span leads the entry
    session = SessionStore(tmp_path / "state").get("cli:t")
    assert session.last_consolidated > 0
    assert session.unconsolidated <= 6
    sizes = [r["n_messages"] for r in chat_requests(llm)]
    assert max(sizes) <= 9 and sizes[-1] < 2 + 2 * 5  # the prompt stopped growing
    # Nothing was deleted from the session's files; only the pointer moved.
    assert session.count == 12
    assert len(SessionStore(tmp_path / "state").history("cli:t")) == 12


async def test_llm_failure_archives_raw_text_and_loses_nothing(
    tmp_path: Path, llm: FakeLLM
) -> None:
    llm.script(*[error(500, when_user_contains=SUMMARY_PROMPT) for _ in range(3)])
    cfg = make_config(tmp_path, llm.base_url, memory=budget())
    async with Harness(cfg, tmp_path / "c.json") as h:
        for i in range(4):
            await h.ask(f"fact number {i}")
        await h.stack.loop.consolidator.wait()
    [entry] = history(tmp_path)
    assert entry["content"].startswith("[RAW]")
    session = SessionStore(tmp_path / "state").get("cli:t")
    archived = SessionStore(tmp_path / "state").history("cli:t")[: session.last_consolidated]
    for m in archived:  # every archived message is findable in the raw entry
        assert m["content"].split("\n")[0] in entry["content"]


async def test_new_with_unwritable_archive_keeps_the_session(tmp_path: Path, llm: FakeLLM) -> None:
    cfg = make_config(tmp_path, llm.base_url)
    async with Harness(cfg, tmp_path / "c.json") as h:
        await h.ask("remember: blue")
        (tmp_path / "ws" / "memory" / "history.jsonl").mkdir(parents=True)
        answer = await h.ask("/new")
        assert "could not save" in answer and "Nothing was lost" in answer
        await h.ask("what colour?")
    assert SessionStore(tmp_path / "state").get("cli:t").last_consolidated == 0
    last = request_messages(chat_requests(llm)[-1])
    assert any("remember: blue" in str(m["content"]) for m in last)


async def test_cursors_increase_across_sessions_and_restarts(tmp_path: Path, llm: FakeLLM) -> None:
    cfg = make_config(tmp_path, llm.base_url, memory=budget())
    for _round in range(2):  # the second round is a restart on the same files
        async with Harness(cfg, tmp_path / "c.json") as h:
            futs = [await h.send(f"hello {i}", chat=f"c{i}") for i in range(5)]
            await asyncio.gather(*futs)
            results = await asyncio.gather(*[h.ask("/new", chat=f"c{i}") for i in range(5)])
            assert all("archived" in r for r in results)
    cursors = [e["cursor"] for e in history(tmp_path)]
    assert cursors == list(range(1, 11))
    assert (tmp_path / "ws" / "memory" / ".cursor").read_text().strip() == "10"


async def test_one_session_never_consolidates_twice_at_once(tmp_path: Path, llm: FakeLLM) -> None:
    llm.script(summary_step("slow summary", delay=0.5), summary_step("second"))
    cfg = make_config(tmp_path, llm.base_url, memory=budget(consolidateAtMessages=100))
    async with Harness(cfg, tmp_path / "c.json") as h:
        for i in range(4):
            await h.ask(f"m{i}")
        consolidator = h.stack.loop.consolidator
        runs = await asyncio.gather(*[consolidator.consolidate("cli:t", keep=2) for _ in range(3)])
    assert sorted(r.archived for r in runs if r) == [0, 0, 6]
    assert SessionStore(tmp_path / "state").get("cli:t").last_consolidated == 6
    # Without the per-session lock all three would have summarised and archived one chunk.
    assert len([r for r in llm.requests if SUMMARY_PROMPT in (r["last_user"] or "")]) == 1
    assert [e["content"][-12:] for e in history(tmp_path)] == ["slow summary"]


async def test_background_runs_wait_for_a_free_slot(tmp_path: Path, llm: FakeLLM) -> None:
    """Many chats over the threshold at once: at most maxConcurrentConsolidations summarise
    together (memory and model calls of a burst stay bounded); every chat still gets its run."""
    chats, slots, delay = 6, 2, 0.6
    llm.script(*[summary_step(f"summary {i}", delay=delay) for i in range(chats)])
    memory = budget(consolidateAtMessages=6, maxConcurrentConsolidations=slots)
    cfg = make_config(tmp_path, llm.base_url, memory=memory)
    async with Harness(cfg, tmp_path / "c.json") as h:
        for i in range(4):
            await asyncio.gather(*(h.ask(f"m{i}", chat=f"c{c}") for c in range(chats)))
        await h.stack.loop.consolidator.wait()
    started = sorted(r["time"] for r in llm.requests if SUMMARY_PROMPT in (r["last_user"] or ""))
    assert len(started) == chats
    # A run starts only when one of the ``slots`` before it has finished.
    gaps = [b - a for a, b in zip(started, started[slots:], strict=False)]
    assert min(gaps) >= delay * 0.9, gaps
    assert len(history(tmp_path)) == chats


async def test_idle_session_is_compacted(tmp_path: Path, llm: FakeLLM) -> None:
    llm.script(summary_step("idle summary"))
    cfg = make_config(
        tmp_path, llm.base_url, memory=budget(consolidateAtMessages=100, idleCompactMinutes=0.02)
    )
    async with Harness(cfg, tmp_path / "c.json") as h:
        for i in range(5):
            await h.ask(f"m{i}")
        # Until the pointer moved too: it moves after the archive write, and leaving the
        # harness in between would cancel the consolidation half-way.
        for _ in range(100):
            if history(tmp_path) and h.stack.loop.store.get("cli:t").unconsolidated == 2:
                break
            await asyncio.sleep(0.1)
    assert history(tmp_path)[0]["content"].endswith("idle summary")
    session = SessionStore(tmp_path / "state").get("cli:t")
    assert session.unconsolidated == 2  # keepRecentMessages


async def test_chat_is_not_blocked_by_a_slow_summary(tmp_path: Path, llm: FakeLLM) -> None:
    llm.script(summary_step("slow", delay=2))
    cfg = make_config(tmp_path, llm.base_url, memory=budget())
    async with Harness(cfg, tmp_path / "c.json") as h:
        for i in range(4):
            await h.ask(f"m{i}")
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert await h.ask("quick?") == "echo: quick?"
        assert loop.time() - started < 1.0  # answered while the summary call still runs
        await h.stack.loop.consolidator.wait()
    assert history(tmp_path)[0]["content"].endswith("slow")


def test_cut_never_splits_a_tool_group() -> None:
    wire = [
        {"role": "user"},
        {"role": "assistant", "tool_calls": [{}]},
        {"role": "tool"},
        {"role": "tool"},
        {"role": "assistant"},
        {"role": "user"},
        {"role": "assistant"},
    ]
    assert choose_cut(wire, 0, 3) == 1  # not between a call and its results: before the call
    assert choose_cut(wire, 0, 6) == 5
    assert choose_cut(wire, 0, 7) == 7
    no_users = [{"role": "assistant", "tool_calls": [{}]}, {"role": "tool"}, {"role": "assistant"}]
    assert choose_cut(no_users, 0, 2) == 2  # the call and its result stay together
    assert choose_cut([{"role": "assistant", "tool_calls": [{}]}, {"role": "tool"}], 0, 1) == 0


async def test_archive_recovers_cursor_after_crash_between_writes(tmp_path: Path) -> None:
    archive = HistoryArchive(tmp_path)
    await archive.append("cli:a", "one")
    # A crash after the history line but before .cursor moved: the archive is ahead.
    path = tmp_path / "memory" / "history.jsonl"
    line = json.dumps({"cursor": 2, "timestamp": "t", "session": "s", "content": "two"})
    path.write_text(path.read_text() + line + "\n")
    entry = await HistoryArchive(tmp_path).append("cli:a", "three")
    assert entry.cursor == 3


async def test_reply_to_plain_text_summary(tmp_path: Path, llm: FakeLLM) -> None:
    # A model that ignores the forced tool and answers in text still produces a summary.
    llm.script(reply("plain text summary", when_user_contains=SUMMARY_PROMPT))
    cfg = make_config(tmp_path, llm.base_url)
    async with Harness(cfg, tmp_path / "c.json") as h:
        await h.ask("hello")
        await h.ask("/new")
    assert history(tmp_path)[0]["content"].endswith("plain text summary")
