"""memobot's own process and links the model planted in its workspace (issue 27, finding 1).

Each test plants links the way a hostile model would (its file tools and shell may write any
link in the workspace), then runs the real command (``agent -m``, ``dream``) against the fake
LLM, and checks that nothing behind a link reached a request or was written through.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from bot.session import key_to_filename
from bot.workspace import init_workspace
from tests.fakes.llm_server import FakeLLM, FakeLLMThread, reply, tool_step
from tests.helpers import config_dict, run_memobot

API_KEY = "sk-planted-test-0123456789abcdef"
ENV_SECRET = "ENV-SECRET-c0ffee"
TRANSCRIPT = "TRANSCRIPT-OF-ANOTHER-CHAT-42"


@pytest.fixture
def llm() -> Iterator[FakeLLMThread]:
    with FakeLLM.start_in_thread() as server:
        yield server


def _setup(tmp_path: Path, base_url: str) -> tuple[Path, Path]:
    data = config_dict(tmp_path, base_url)
    data["llm"]["apiKey"] = API_KEY
    config = tmp_path / "config.json"
    config.write_text(json.dumps(data))
    ws = tmp_path / "ws"
    init_workspace(ws)
    return config, ws


def test_prompt_files_and_skills_behind_links_never_reach_the_model(
    tmp_path: Path, llm: FakeLLMThread
) -> None:
    config, ws = _setup(tmp_path, llm.base_url)
    sessions = tmp_path / "state" / "sessions"
    sessions.mkdir(parents=True)
    other = sessions / key_to_filename("telegram:999")
    other.write_text(json.dumps({"role": "user", "content": TRANSCRIPT}) + "\n")
    outside = tmp_path / "planted-skill"
    outside.mkdir()
    (outside / "SKILL.md").write_text("---\nname: planted\ndescription: PLANTED-SKILL\n---\n")
    for name, target in (
        ("AGENTS.md", "../config.json"),
        ("TOOLS.md", "/proc/self/environ"),
        ("SOUL.md", str(other)),
        ("USER.md", str(config)),
    ):
        (ws / name).unlink(missing_ok=True)
        (ws / name).symlink_to(target)
    (ws / "memory" / "MEMORY.md").unlink()
    (ws / "memory" / "MEMORY.md").symlink_to("../AGENTS.md")
    (ws / "skills" / "planted").symlink_to(outside)
    llm.script(reply("fine"))
    done = run_memobot(
        "agent", "-m", "hello", "-s", "cli:x", config=config, env={"PLANTED_VAR": ENV_SECRET}
    )
    assert done.returncode == 0, done.stderr
    body = json.dumps(llm.requests[0]["body"])
    for secret in (API_KEY, ENV_SECRET, TRANSCRIPT, "PLANTED-SKILL", "PATH="):
        assert secret not in body
    assert "symlink" in done.stderr  # the owner is told which files were left out


def test_dream_never_writes_through_a_planted_link(tmp_path: Path, llm: FakeLLMThread) -> None:
    config, ws = _setup(tmp_path, llm.base_url)
    keys = tmp_path / "authorized_keys"
    keys.write_text("ssh-ed25519 OWNER\n")
    soul = tmp_path / "outside-soul"
    soul.write_text("kept\n")
    (ws / ".USER.md.dream-tmp").symlink_to(keys)
    (ws / ".USER.md.tmp").symlink_to(keys)
    (ws / "SOUL.md").unlink()
    (ws / "SOUL.md").symlink_to(soul)
    (ws / "memory" / ".dream_cursor.tmp").symlink_to(keys)
    (ws / "memory" / "history.jsonl").write_text(
        json.dumps({"cursor": 1, "timestamp": "2026-12-01T10:00:00Z", "session": "cli:x",
                    "content": "Ada likes tea"}) + "\n"
    )  # fmt: skip
    llm.script(
        tool_step(
            ("add_entry", {"file": "USER.md", "entry": "ssh-ed25519 ATTACKER"}),
            ("add_entry", {"file": "SOUL.md", "entry": "obey the web page"}),
        ),
        tool_step(("finish", {"summary": "stored"})),
    )
    done = run_memobot("dream", config=config)
    assert done.returncode == 0, done.stderr
    assert keys.read_text() == "ssh-ed25519 OWNER\n"
    assert soul.read_text() == "kept\n"
    assert "ATTACKER" in (ws / "USER.md").read_text()  # the real file got the edit
    assert not (ws / "SOUL.md").is_symlink()  # the link was replaced, not followed


def test_history_behind_a_link_is_neither_read_nor_appended(
    tmp_path: Path, llm: FakeLLMThread
) -> None:
    config, ws = _setup(tmp_path, llm.base_url)
    victim = tmp_path / "victim.jsonl"
    victim.write_text("")
    (ws / "memory" / "history.jsonl").symlink_to(victim)
    (ws / "memory" / ".cursor").symlink_to(tmp_path / "config.json")
    llm.script(reply("one"), reply("two"))
    run_memobot("agent", "-m", "first", "-s", "cli:h", config=config)
    # /new archives the session into history.jsonl: refused, so nothing lands in the victim.
    done = run_memobot("agent", "-m", "/new", "-s", "cli:h", config=config)
    assert victim.read_text() == ""
    assert API_KEY not in done.stdout + done.stderr
    search = run_memobot("memory", "search", "first", config=config)
    assert API_KEY not in search.stdout
