"""Memory search: real files, a real SQLite FTS5 index, the tool and the CLI as a user runs it."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import UTC, date, datetime
from pathlib import Path

import pytest

from bot.config import ToolsConfig
from bot.memory import search as search_module
from bot.memory.search import (
    RANK_WINDOW,
    Chunk,
    MemoryIndex,
    SearchHit,
    build_queries,
    chunk_markdown,
    format_hit,
    iter_history,
)
from bot.tools import ToolContext, build_default_tools
from tests.helpers import run_memobot

LOCAL_TZ = "XYZ-1"  # POSIX: one hour east of UTC, no tz database needed


@pytest.fixture(autouse=True)
def local_tz(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Run in a zone other than UTC so local-day handling is really exercised."""
    monkeypatch.setenv("TZ", LOCAL_TZ)
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def stamp(y: int, mo: int, d: int, h: int = 12, mi: int = 0) -> str:
    """The archive's UTC timestamp for a local wall-clock time."""
    moment = datetime(y, mo, d, h, mi).astimezone(UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def add_entries(ws: Path, *entries: tuple[int, str, str, str], name: str = "history.jsonl") -> None:
    path = ws / "memory" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as fh:
        for cursor, ts, session, content in entries:
            record = {"cursor": cursor, "timestamp": ts, "session": session, "content": content}
            fh.write(json.dumps(record) + "\n")


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    workspace = tmp_path / "ws"
    (workspace / "memory").mkdir(parents=True)
    return workspace


@pytest.fixture
def index(ws: Path, tmp_path: Path) -> MemoryIndex:
    return MemoryIndex(ws, tmp_path / "state")


def sources(hits: list[SearchHit]) -> list[str]:
    return [h.source for h in hits]


# ------------------------------------------------------------------ the index


def test_word_from_the_middle_of_an_entry_is_found_and_cited(ws: Path, index: MemoryIndex):
    add_entries(
        ws,
        (1, stamp(2026, 11, 1), "telegram:1", "Talked about the garden and tomatoes."),
        (
            2,
            stamp(2026, 11, 2),
            "telegram:1",
            "We planned the trip. Kestrel agreed to drive. Done.",
        ),
    )
    hits = index.search("kestrel")
    assert sources(hits) == ["memory/history.jsonl#2"]
    hit = hits[0]
    assert "[Kestrel]" in hit.snippet
    assert (hit.timestamp, hit.session) == (stamp(2026, 11, 2), "telegram:1")
    assert hit.score > 0


def test_entry_with_more_matches_ranks_first(ws: Path, index: MemoryIndex):
    add_entries(
        ws,
        (1, stamp(2026, 11, 1), "s", "The budget came up once among many other things today."),
        (2, stamp(2026, 11, 2), "s", "Budget, budget, budget: the budget review moved again."),
        (3, stamp(2026, 11, 3), "s", "Nothing about money here."),
    )
    hits = index.search("budget")
    assert sources(hits) == ["memory/history.jsonl#2", "memory/history.jsonl#1"]
    assert hits[0].score > hits[1].score


def test_all_words_first_then_any_word(ws: Path, index: MemoryIndex):
    add_entries(
        ws,
        (1, stamp(2026, 11, 1), "s", "Lisbon flights are booked."),
        (2, stamp(2026, 11, 2), "s", "Lisbon hotel is booked, flights too."),
        (3, stamp(2026, 11, 3), "s", "The hotel in Porto was lovely."),
    )
    assert sources(index.search("lisbon hotel")) == ["memory/history.jsonl#2"]
    assert set(sources(index.search("porto lisbon"))) == {
        f"memory/history.jsonl#{i}" for i in (1, 2, 3)
    }
    # The last word may still be being typed.
    assert sources(index.search("porto hot")) == ["memory/history.jsonl#3"]
    assert sources(index.search("flig*")) == ["memory/history.jsonl#1", "memory/history.jsonl#2"]


def test_diacritics_do_not_matter(ws: Path, index: MemoryIndex):
    add_entries(ws, (1, stamp(2026, 11, 1), "s", "Meet Zoë at the café in Kraków."))
    assert sources(index.search("zoe cafe krakow")) == ["memory/history.jsonl#1"]
    assert sources(index.search("CAFÉ")) == ["memory/history.jsonl#1"]


def test_memory_files_cited_by_line(ws: Path, index: MemoryIndex):
    (ws / "USER.md").write_text(
        "<!-- hints for the assistant -->\n# User\n\n- Name: Sam\n- Allergic to peanuts,\n"
        "  and to shellfish\n\n## Preferences\nLikes long walks.\nPrefers tea to coffee.\n"
    )
    (ws / "memory" / "MEMORY.md").write_text("# Memory\n\n## Projects\n- Falcon ships in March\n")
    skill = ws / "skills" / "daily-notes" / "SKILL.md"
    skill.parent.mkdir(parents=True)
    skill.write_text("---\nname: daily-notes\n---\n# Daily notes\n\n1. Open the notes file.\n")
    (ws / "SOUL.md").write_text("Be brief.\n")
    (ws / "AGENTS.md").write_text("Shellfish are not indexed from here.\n")

    assert sources(index.search("shellfish")) == ["USER.md#5"]
    assert sources(index.search("tea")) == ["USER.md#9"]
    assert sources(index.search("falcon")) == ["memory/MEMORY.md#4"]
    assert sources(index.search("notes file")) == ["skills/daily-notes/SKILL.md#6"]
    assert sources(index.search("brief")) == ["SOUL.md#1"]
    hit = index.search("peanuts")[0]
    assert (hit.timestamp, hit.session) == (None, None)
    assert hit.snippet == "- Allergic to [peanuts], and to shellfish"
    assert index.search("hints assistant") == []  # a template comment is not a fact


def test_edited_memory_file_is_indexed_again(ws: Path, index: MemoryIndex):
    user = ws / "USER.md"
    user.write_text("- Lives in Oslo\n")
    assert sources(index.search("oslo")) == ["USER.md#1"]
    user.write_text("# User\n\n- Moved to Bergen\n")
    os.utime(user, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert index.search("oslo") == []
    assert sources(index.search("bergen")) == ["USER.md#3"]
    user.unlink()
    assert index.search("bergen") == []


def test_a_huge_memory_file_is_indexed_only_up_to_its_limit(ws: Path, index: MemoryIndex):
    # The model may plant a sparse file of gigabytes: a search must not read it all.
    user = ws / "USER.md"
    user.write_bytes(b"- Lives in Oslo\n" + b" " * (search_module.MAX_MARKDOWN_BYTES - 17) + b"\n")
    with user.open("ab") as f:
        f.write(b"- Owns a falcon\n")
        f.truncate(4 * 1024**3)
    assert sources(index.search("oslo")) == ["USER.md#1"]
    assert index.search("falcon") == []  # past the limit: not read


def test_chunks_are_paragraphs_bullets_headings_and_fences():
    text = (
        "# Title\nintro line one\n#not-a-heading\n\n- a\n  continued\n* b\n1. c\n\n"
        "```\ncode\n\nmore code\n```\nafter\n"
    )
    assert chunk_markdown(text) == [
        Chunk(1, "# Title"),
        Chunk(2, "intro line one\n#not-a-heading"),
        Chunk(5, "- a\n  continued"),
        Chunk(7, "* b"),
        Chunk(8, "1. c"),
        Chunk(10, "```\ncode\n\nmore code\n```"),
        Chunk(15, "after"),
    ]


def test_date_range_filters_history_and_leaves_out_memory_files(ws: Path, index: MemoryIndex):
    add_entries(
        ws,
        (1, stamp(2026, 11, 27, 23, 30), "s", "report draft"),
        (2, stamp(2026, 11, 28, 0, 30), "s", "report review"),
        (3, stamp(2026, 11, 29, 23, 59), "s", "report sent"),
        (4, stamp(2026, 11, 30, 0, 0), "s", "report praised"),
    )
    (ws / "USER.md").write_text("- Writes a weekly report\n")
    cite = "memory/history.jsonl#{}".format
    assert len(index.search("report")) == 5
    got = index.search("report", since=date(2026, 11, 28), until=date(2026, 11, 29))
    assert sorted(sources(got)) == [cite(2), cite(3)]
    assert sorted(sources(index.search("report", since=date(2026, 11, 29)))) == [cite(3), cite(4)]
    assert sources(index.search("report", until=date(2026, 11, 27))) == [cite(1)]
    assert index.search("report", since=date(2026, 12, 1)) == []


@pytest.mark.parametrize(
    "query",
    [
        '"',
        "*",
        "AND (",
        "-",
        "NEAR",
        "NEAR(a b)",
        "a OR",
        '"unbalanced',
        "body:x",
        "^x",
        "{a b}",
        "a AND",
        "NOT",
        ")(",
        "''",
        "x*y",
        "***",
        "",
        "   ",
        "-report",
        'report"s',
    ],
)
def test_hostile_queries_do_not_crash(ws: Path, index: MemoryIndex, query: str):
    add_entries(ws, (1, stamp(2026, 11, 1), "s", "and or not near report a x y"))
    hits = index.search(query)
    assert all(h.source == "memory/history.jsonl#1" for h in hits)


def test_query_words_are_quoted():
    assert build_queries('say "hi" NEAR(x)') == [
        '"say" AND """hi""" AND "NEAR(x)"',
        '"say" AND """hi""" AND "NEAR(x)"*',
        '"say" OR """hi""" OR "NEAR(x)"*',
    ]
    assert build_queries("- * ( ") == []


def test_new_entries_are_indexed_incrementally(ws: Path, index: MemoryIndex):
    add_entries(ws, (1, stamp(2026, 11, 1), "s", "first note about herons"))
    assert len(index.search("herons")) == 1
    add_entries(ws, (2, stamp(2026, 11, 2), "s", "second note about herons"))
    # A line still being written (no newline yet) waits for its newline.
    with open(ws / "memory" / "history.jsonl", "a") as fh:
        fh.write('{"cursor": 3, "timestamp": "2026-11-03T10:00:00.000Z", "session": "s", "con')
    assert sources(index.search("herons")) == ["memory/history.jsonl#1", "memory/history.jsonl#2"]
    with open(ws / "memory" / "history.jsonl", "a") as fh:
        fh.write('tent": "third note about herons"}\n')
    assert len(index.search("herons")) == 3
    with sqlite3.connect(index.path) as conn:
        assert conn.execute("SELECT count(*) FROM doc").fetchone() == (3,)  # nothing twice


def test_rewritten_history_is_indexed_again(ws: Path, index: MemoryIndex):
    add_entries(
        ws,
        (1, stamp(2026, 11, 1), "s", "old walrus entry"),
        (2, stamp(2026, 11, 2), "s", "old walrus entry two"),
        (3, stamp(2026, 11, 3), "s", "kept walrus entry"),
    )
    assert len(index.search("walrus")) == 3
    history = ws / "memory" / "history.jsonl"
    kept = history.read_text().splitlines(keepends=True)[2]
    history.write_text(kept)  # compaction: shorter, different first bytes
    assert sources(index.search("walrus")) == ["memory/history.jsonl#3"]
    assert index.search("old") == []
    # Rewritten to a longer file whose indexed bytes differ: also noticed.
    history.write_text("")
    add_entries(ws, (3, stamp(2026, 11, 3), "s", "rewritten walrus entry with more words"))
    assert [h.snippet for h in index.search("walrus")] == [
        "rewritten [walrus] entry with more words"
    ]


def test_archive_files_are_searched_and_cited(ws: Path, index: MemoryIndex):
    add_entries(ws, (1, stamp(2026, 10, 5), "s", "october otter"), name="history-2026-10.jsonl")
    add_entries(ws, (2, stamp(2026, 11, 5), "s", "november otter"))
    assert sorted(sources(index.search("otter"))) == [
        "memory/history-2026-10.jsonl#1",
        "memory/history.jsonl#2",
    ]
    (ws / "memory" / "history-2026-10.jsonl").unlink()
    assert sources(index.search("otter")) == ["memory/history.jsonl#2"]


def test_deleted_index_is_rebuilt(ws: Path, index: MemoryIndex):
    add_entries(ws, (1, stamp(2026, 11, 1), "s", "the lynx was seen"))
    assert len(index.search("lynx")) == 1
    for suffix in ("", "-wal", "-shm"):
        Path(f"{index.path}{suffix}").unlink(missing_ok=True)
    assert len(index.search("lynx")) == 1
    with sqlite3.connect(index.path) as conn:  # an older schema counts as missing too
        conn.execute("PRAGMA user_version = 0")
    assert len(index.search("lynx")) == 1


@pytest.mark.parametrize("damage", ["garbage", "truncated", "zeroed pages"])
def test_corrupt_index_is_rebuilt(ws: Path, index: MemoryIndex, damage: str):
    add_entries(
        ws, *((i, stamp(2026, 11, 1), "s", f"lynx number {i} seen") for i in range(1, 2000))
    )
    assert len(index.search("lynx")) == 10
    with sqlite3.connect(index.path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = index.path.read_bytes()
    data = {
        "garbage": b"this is not an sqlite database" * 200,
        "truncated": data[: len(data) // 3],
        "zeroed pages": data[:8192] + bytes(len(data) - 8192),
    }[damage]
    index.path.write_bytes(data)
    assert sources(index.search("lynx 1999")) == ["memory/history.jsonl#1999"]


def test_index_lives_in_the_state_folder(ws: Path, index: MemoryIndex, tmp_path: Path):
    add_entries(ws, (1, stamp(2026, 11, 1), "s", "heron"))
    index.search("heron")
    assert index.path == tmp_path / "state" / "index" / "memory.sqlite"
    assert index.path.exists()
    assert not any(p.suffix == ".sqlite" for p in ws.rglob("*"))


def test_parallel_searches_while_history_grows(ws: Path, index: MemoryIndex):
    add_entries(ws, (1, stamp(2026, 11, 1), "s", "shared word puffin"))
    errors: list[BaseException] = []

    def searcher() -> None:
        try:
            for _ in range(15):
                assert index.search("puffin")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=searcher) for _ in range(6)]
    for t in threads:
        t.start()
    for cursor in range(2, 30):
        add_entries(ws, (cursor, stamp(2026, 11, 2), "s", f"puffin sighting {cursor}"))
    for t in threads:
        t.join()
    assert errors == []
    assert len(MemoryIndex(ws, index.path.parents[1]).search("puffin", limit=50)) == 29


def test_very_common_words_rank_the_newest_window(ws: Path, index: MemoryIndex):
    n = RANK_WINDOW + 50
    add_entries(ws, *((i, stamp(2026, 1, 1), "s", f"common words {i}") for i in range(1, n + 1)))
    (ws / "USER.md").write_text("- common words about the user\n")
    hits = index.search("common words", limit=100)
    assert len(hits) == 100
    cursors = [int(h.source.split("#")[1]) for h in hits if h.source.startswith("memory/h")]
    assert min(cursors) > n - RANK_WINDOW
    assert "USER.md#1" in sources(index.search("common words user"))


def test_history_is_merged_in_cursor_order(ws: Path):
    add_entries(ws, (1, stamp(2026, 9, 1), "s", "a"), (2, stamp(2026, 9, 2), "s", "b"),
                name="history-2026-09.jsonl")  # fmt: skip
    add_entries(ws, (3, stamp(2026, 10, 1), "s", "c"), name="history-2026-10.jsonl")
    # An interrupted compaction can leave an entry in both files: shown once.
    add_entries(ws, (3, stamp(2026, 10, 1), "s", "c"), (4, stamp(2026, 11, 1), "s", "d"))
    order = [(rel, e.cursor) for rel, e in iter_history(ws)]
    assert order == [
        ("memory/history-2026-09.jsonl", 1),
        ("memory/history-2026-09.jsonl", 2),
        ("memory/history-2026-10.jsonl", 3),
        ("memory/history.jsonl", 4),
    ]


# ------------------------------------------------------------------ the tool


@pytest.fixture
def registry(ws: Path, tmp_path: Path):
    return build_default_tools(ToolsConfig(), ws, tmp_path / "state")


async def call(registry, ws: Path, **args: object) -> str:
    return await registry.execute("memory_search", json.dumps(args), ToolContext(workspace=ws))


async def test_tool_lists_hits_with_source_date_and_chat(ws: Path, registry):
    add_entries(
        ws,
        (41, stamp(2026, 11, 27), "cli:direct", "Nothing to see."),
        (42, stamp(2026, 11, 28, 0, 30), "telegram:123", "We chose Friday for the deploy."),
    )
    (ws / "memory" / "MEMORY.md").write_text("# Memory\n\n- Deploys happen on Friday\n")
    out = await call(registry, ws, query="friday deploy")
    assert out == (
        "1. [memory/history.jsonl#42, 2026-11-28, telegram:123] We chose [Friday] for the [deploy]."
    )
    out = await call(registry, ws, query="friday", limit=1, since="2026-11-28")
    assert out.startswith("1. [memory/history.jsonl#42, 2026-11-28, telegram:123] ")
    out = await call(registry, ws, query="friday", limit=99)
    assert out.splitlines()[1].startswith("2. [")
    assert "[memory/MEMORY.md#3] - Deploys happen on [Friday]" in out


async def test_tool_says_when_nothing_matches(ws: Path, registry):
    assert await call(registry, ws, query="zebra") == "No matches for 'zebra'."
    out = await call(registry, ws, query="zebra", since="2026-01-01", until="2026-02-01")
    assert out == "No matches for 'zebra' between 2026-01-01 and 2026-02-01."


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"query": "x", "since": "28.11.2026"}, "since must be a date as YYYY-MM-DD"),
        ({"query": "x", "until": "2026-13-01"}, "until must be a date as YYYY-MM-DD"),
        ({"query": "x", "since": "2026-11-02", "until": "2026-11-01"}, "is after until"),
        ({"query": "x", "limit": 0}, "limit must be between 1 and 20"),
        ({"query": " - "}, "query must contain at least one word"),
        ({"query": "x", "limit": "5"}, "must be of type integer"),
        ({}, "missing required argument 'query'"),
    ],
)
async def test_tool_argument_errors(ws: Path, registry, args: dict, message: str):
    out = await registry.execute("memory_search", json.dumps(args), ToolContext(workspace=ws))
    assert out.startswith("Error: ")
    assert message in out


def test_tool_registered_only_with_workspace_and_state(tmp_path: Path):
    assert "memory_search" not in build_default_tools(ToolsConfig()).names
    assert "memory_search" in build_default_tools(ToolsConfig(), tmp_path, tmp_path).names


def test_format_hit_without_date_or_session():
    assert (
        format_hit(3, SearchHit("USER.md#4", "- [tea]", 1.0, None, None))
        == "3. [USER.md#4] - [tea]"
    )


# ------------------------------------------------------------------ the command line


def memobot(tmp_path: Path, ws: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cfg = tmp_path / "config.json"
    agent = {"workspace": str(ws), "stateDir": str(tmp_path / "state")}
    cfg.write_text(json.dumps({"agent": agent}))
    return run_memobot("memory", *args, config=cfg, env={"TZ": LOCAL_TZ})


@pytest.fixture
def cli_ws(ws: Path) -> Path:
    add_entries(
        ws,
        (1, stamp(2026, 11, 27, 23, 50), "cli:direct", "Booked the ferry to Hydra."),
        (
            2,
            stamp(2026, 11, 28, 0, 10),
            "telegram:123",
            "Ferry moved.\nNew time 9:00.\nBring bikes.\nFourth line is cut.",
        ),
    )
    add_entries(ws, (3, stamp(2026, 11, 29, 14, 2), "slack:C1", "Ferry tickets printed."))
    return ws


def test_cli_search(tmp_path: Path, cli_ws: Path):
    done = memobot(tmp_path, cli_ws, "search", "ferry", "hydra")
    assert done.returncode == 0, done.stderr
    assert (
        done.stdout
        == "1. [memory/history.jsonl#1, 2026-11-27, cli:direct] Booked the [ferry] to [Hydra].\n"
    )
    done = memobot(
        tmp_path, cli_ws, "search", "ferry", "--since", "2026-11-28", "--until", "2026-11-28"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "1. [memory/history.jsonl#2, 2026-11-28, telegram:123] [Ferry] moved. New time 9:00. "
        "Bring bikes. Fourth line is cut."
    ]
    done = memobot(tmp_path, cli_ws, "search", "ferry", "-n", "1")
    assert len(done.stdout.splitlines()) == 1
    done = memobot(tmp_path, cli_ws, "search", "unicorn", "AND", "(")
    assert (done.returncode, done.stdout) == (0, "No matches for 'unicorn AND ('.\n")
    done = memobot(tmp_path, cli_ws, "search", "x", "--since", "last tuesday")
    assert done.returncode == 2
    assert "YYYY-MM-DD, today, yesterday" in done.stderr


def test_cli_history_by_local_day(tmp_path: Path, cli_ws: Path):
    done = memobot(tmp_path, cli_ws, "history")
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        "== 2026-11-27 (Friday) ==\n"
        "23:50  cli:direct  Booked the ferry to Hydra.\n"
        "\n"
        "== 2026-11-28 (Saturday) ==\n"
        "00:10  telegram:123  Ferry moved.\n"
        "                     New time 9:00.\n"
        "                     Bring bikes. …\n"
        "\n"
        "== 2026-11-29 (Sunday) ==\n"
        "14:02  slack:C1  Ferry tickets printed.\n"
    )
    done = memobot(tmp_path, cli_ws, "history", "--since", "2026-11-28", "--until", "2026-11-28")
    assert done.stdout.splitlines()[0] == "== 2026-11-28 (Saturday) =="
    assert len(done.stdout.splitlines()) == 4
    done = memobot(tmp_path, cli_ws, "history", "--since", "2026-12-01")
    assert (done.returncode, done.stdout) == (0, "No history entries in that range.\n")


def test_search_of_one_session_sees_only_its_history(
    ws: Path, index: MemoryIndex, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The chat's own entry is the oldest match; the owner's newer ones (and USER.md) must
    # neither show nor push it out of the rank window.
    monkeypatch.setattr(search_module, "RANK_WINDOW", 5)
    (ws / "USER.md").write_text("- The owner likes a picnic\n")
    add_entries(
        ws,
        (1, stamp(2026, 1, 1), "telegram:-100", "the group planned a picnic"),
        *[(n, stamp(2026, 1, n), "telegram:1001", f"owner picnic {n}") for n in range(2, 22)],
    )
    hits = index.search("picnic", 10, session="telegram:-100")
    assert [(h.session, h.snippet) for h in hits] == [
        ("telegram:-100", "the group planned a [picnic]")
    ]
    owner = index.search("picnic", 50)  # the owner's search: every chat and the memory files
    assert {h.session for h in owner} >= {"telegram:1001", None}
