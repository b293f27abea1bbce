"""A workspace nanobot wrote, used by memobot as it is (issue 10, "Coming from nanobot").

* history entries with ``session_key`` or no session at all are read everywhere (search, Dream,
  ``memory history``, doctor) and never rewritten;
* nanobot's git repository (it tracks .gitignore and memory/.dream_cursor): its history is
  copied into memobot's own repository (in the state folder) and the workspace's .git is left
  as it is; a person's repository is left alone and memobot starts its own history; a memory
  repository memobot cannot read stops Dream and onboard before they change a file, with one
  line and no traceback.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from dulwich import porcelain

from bot.config import parse_config
from bot.llm import LLMProvider
from bot.memory.dream import Dream, read_dream_cursor
from bot.memory.history import HistoryArchive, parse_entry
from bot.memory.search import MemoryIndex, iter_history
from bot.memory.versioning import MemoryRepo
from bot.service.doctor import check_history
from tests.fakes.llm_server import FakeLLM, FakeLLMThread, tool_step
from tests.helpers import config_dict, request_messages, run_memobot, write_config
from tests.helpers.nanobot_shapes import (
    HISTORY_LINES,
    NANOBOT_AUTHOR,
    nanobot_git,
    write_history,
    write_memory_files,
)


@pytest.fixture
def llm() -> Iterator[FakeLLMThread]:
    with FakeLLM.start_in_thread() as server:
        yield server


def _dream_steps() -> list[dict]:
    return [
        tool_step(("add_entry", {"file": "USER.md", "entry": "Keeps bees"})),
        tool_step(("finish", {"summary": "one fact"})),
    ]


# -- history entries without "session" ------------------------------------------------------


def test_entries_without_session_parse_as_they_are() -> None:
    with_key, bare = (json.dumps(HISTORY_LINES[i]) for i in (0, 1))
    first, second = parse_entry(with_key), parse_entry(bare)
    assert first is not None and first.session == "telegram:123456789"
    assert second is not None and second.session == "" and second.cursor == 2
    assert parse_entry('{"cursor": 3, "content": "no timestamp"}') is not None
    assert parse_entry('{"cursor": 3, "timestamp": "x"}') is None  # no content: not an entry


def test_search_history_and_doctor_see_nanobot_entries(tmp_path: Path) -> None:
    cfg_path = write_config(tmp_path, "http://127.0.0.1:1/v1")
    ws = tmp_path / "ws"
    write_history(ws)
    before = (ws / "memory" / "history.jsonl").read_bytes()
    assert [e.cursor for _, e in iter_history(ws)] == [1, 2, 3]
    assert [e.cursor for e in HistoryArchive(ws).entries()] == [1, 2, 3]

    found = run_memobot("memory", "search", "Lisbon", config=cfg_path)
    assert found.returncode == 0, found.stderr
    assert "memory/history.jsonl#1" in found.stdout and "telegram:123456789" in found.stdout
    bees = run_memobot("memory", "search", "bees", config=cfg_path)
    assert "memory/history.jsonl#2" in bees.stdout

    listing = run_memobot("memory", "history", config=cfg_path)
    assert listing.returncode == 0, listing.stderr
    assert "No history entries" not in listing.stdout
    assert "Lisbon" in listing.stdout and "British English" in listing.stdout

    cfg = parse_config(config_dict(tmp_path, "http://127.0.0.1:1/v1"))
    check = check_history(cfg)
    assert check.status == "ok", check
    assert (ws / "memory" / "history.jsonl").read_bytes() == before  # never rewritten


def test_an_index_built_before_the_fix_is_rebuilt(tmp_path: Path) -> None:
    """An index that skipped nanobot's lines must not keep skipping them: the file did not
    change, so only a new index schema brings them in."""
    import sqlite3

    ws, state = tmp_path / "ws", tmp_path / "state"
    write_history(ws)
    index = MemoryIndex(ws, state)
    assert index.search("Lisbon")
    with sqlite3.connect(index.path) as conn:  # what the old code left: the lines skipped
        conn.execute("DELETE FROM doc WHERE file = 'memory/history.jsonl'")
        conn.execute("PRAGMA user_version = 1")
    assert MemoryIndex(ws, state).search("Lisbon")


async def test_dream_digests_entries_without_session(tmp_path: Path) -> None:
    async with FakeLLM() as server:
        cfg = parse_config(config_dict(tmp_path, server.base_url))
        ws = cfg.agent.workspace_path
        write_memory_files(ws)
        write_history(ws, dream_cursor=1)
        server.script(*_dream_steps())
        provider = LLMProvider(cfg.llm)
        try:
            dream = Dream(
                cfg.memory, ws, provider, HistoryArchive(ws), state_dir=cfg.agent.state_path
            )
            result = await dream.run()
        finally:
            await provider.close()
        assert result.status == "done", result.detail
        brief = request_messages(server.requests[0])[1]["content"]
        assert "she keeps bees" in brief and "British English" in brief
        assert "Lisbon" not in brief  # cursor 1 was digested by nanobot already
        assert read_dream_cursor(ws) == 3


# -- nanobot's git repository ---------------------------------------------------------------


def _nanobot_ws(tmp_path: Path, extra: tuple[str, ...] = ()) -> Path:
    ws = tmp_path / "ws"
    write_memory_files(ws)
    write_history(ws, dream_cursor=1)
    for rel in extra:
        (ws / rel).write_text("someone's project file\n")
    nanobot_git(ws, extra)
    return ws


def test_dream_adopts_nanobots_repository(tmp_path: Path, llm: FakeLLMThread) -> None:
    cfg_path = write_config(tmp_path, llm.base_url)
    ws = _nanobot_ws(tmp_path)
    llm.script(*_dream_steps())
    done = run_memobot("dream", config=cfg_path)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert "1 added" in done.stdout
    assert read_dream_cursor(ws) == 3
    log = MemoryRepo(ws, tmp_path / "state").log()
    subjects = [c.subject for c in log]
    assert subjects[0].startswith("dream: digest history 2..3")
    # nanobot's history is kept underneath.
    assert subjects[-2:] == ["dream: 2026-03-02, 1 change(s)", "init: nanobot memory store"]
    assert any(c.author == NANOBOT_AUTHOR.decode() for c in log)
    assert (ws / ".gitignore").is_file() and (ws / "memory" / ".dream_cursor").is_file()
    # A second scheduled run has nothing left to repeat.
    again = run_memobot("dream", config=cfg_path)
    assert again.returncode == 0 and "no new history" in again.stdout
    assert (ws / "USER.md").read_text().count("Keeps bees") == 1


def test_dream_leaves_a_persons_repository_alone(tmp_path: Path, llm: FakeLLMThread) -> None:
    cfg_path = write_config(tmp_path, llm.base_url)
    ws = _nanobot_ws(tmp_path, extra=("notes.txt",))
    (ws / ".gitignore").write_text("")  # a person's repository: notes.txt is theirs
    (ws / "memory" / ".dream_cursor").write_text("3\n")
    with open(ws / "memory" / "history.jsonl", "a") as fh:
        fh.write(json.dumps({"cursor": 4, "session": "cli:direct", "content": "bees!"}) + "\n")
    dot_git = {p: p.read_bytes() for p in (ws / ".git").rglob("*") if p.is_file()}
    llm.script(*_dream_steps())
    done = run_memobot("dream", config=cfg_path)
    assert done.returncode == 0, done.stderr
    assert "1 added" in done.stdout and "Traceback" not in done.stderr
    assert "it tracks notes.txt" in done.stderr  # one line: not copied, left alone
    assert {p: p.read_bytes() for p in (ws / ".git").rglob("*") if p.is_file()} == dot_git
    subjects = [c.subject for c in MemoryRepo(ws, tmp_path / "state").log()]
    assert len(subjects) == 1 and subjects[0].startswith("dream: digest history 4..4")


def test_dream_refuses_an_unreadable_memory_repository_before_any_edit(
    tmp_path: Path, llm: FakeLLMThread
) -> None:
    cfg_path = write_config(tmp_path, llm.base_url)
    ws = _nanobot_ws(tmp_path)
    (tmp_path / "state" / "memory.git").mkdir(parents=True)  # not a repository
    user_before = (ws / "USER.md").read_bytes()
    llm.script(*_dream_steps())
    done = run_memobot("dream", config=cfg_path)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    lines = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()]
    assert len(lines) == 1 and "memory.git is not a git repository" in lines[0], lines
    assert (ws / "USER.md").read_bytes() == user_before
    assert read_dream_cursor(ws) == 1
    assert llm.requests == []  # checked before the model was asked anything


def test_onboard_on_a_nanobot_workspace(tmp_path: Path) -> None:
    ws = _nanobot_ws(tmp_path)
    cfg = tmp_path / "home" / "config.json"
    done = run_memobot("onboard", "--workspace", str(ws), config=cfg)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    subjects = [c.subject for c in MemoryRepo(ws, tmp_path / "home" / "state").log()]
    assert subjects[-1] == "init: nanobot memory store"
    assert (ws / "USER.md").read_text().startswith("# User\n\n- Name: Ada\n")


def test_onboard_leaves_a_persons_repository_alone(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "project.py").write_text("print('mine')\n")
    porcelain.init(str(ws))
    porcelain.add(str(ws), paths=[str(ws / "project.py")])
    porcelain.commit(str(ws), message=b"mine", author=b"A <a@b>", committer=b"A <a@b>")
    dot_git = {p: p.read_bytes() for p in (ws / ".git").rglob("*") if p.is_file()}
    cfg = tmp_path / "home" / "config.json"
    done = run_memobot("onboard", "--workspace", str(ws), config=cfg)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "it tracks project.py" in done.stderr
    assert {p: p.read_bytes() for p in (ws / ".git").rglob("*") if p.is_file()} == dot_git
    subjects = [c.subject for c in MemoryRepo(ws, tmp_path / "home" / "state").log()]
    assert subjects == ["memobot: memory files from the template"]


def test_onboard_refuses_an_unreadable_memory_repository_before_writing(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (tmp_path / "home" / "state" / "memory.git").mkdir(parents=True)
    cfg = tmp_path / "home" / "config.json"
    done = run_memobot("onboard", "--workspace", str(ws), config=cfg)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr and "memory.git is not a git repository" in done.stderr
    assert not cfg.exists()
    assert list(ws.iterdir()) == []
