"""The memobot command run the way a user runs it: real subprocesses, the fake LLM over HTTP."""

from __future__ import annotations

import json
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from bot.session import SessionStore
from tests.fakes.llm_server import FakeLLM, FakeLLMThread, reply
from tests.helpers import converse, request_messages, run_memobot, write_config


@pytest.fixture
def llm() -> Iterator[FakeLLMThread]:
    with FakeLLM.start_in_thread() as server:
        yield server


def test_one_shot_prints_only_the_reply(tmp_path: Path, llm: FakeLLMThread) -> None:
    cfg = write_config(tmp_path, llm.base_url)
    llm.script(reply("Hi from the model"))
    done = run_memobot("agent", "-m", "hello", "-s", "cli:demo", config=cfg)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "Hi from the model\n"


def test_history_continues_across_processes(tmp_path: Path, llm: FakeLLMThread) -> None:
    cfg = write_config(tmp_path, llm.base_url)
    llm.script(reply("Nice to meet you, Ada."))
    assert run_memobot("agent", "-m", "I am Ada", "-s", "cli:demo", config=cfg).returncode == 0
    second = run_memobot("agent", "-m", "who am I?", "-s", "cli:demo", config=cfg)
    assert second.stdout == "echo: who am I?\n"
    msgs = request_messages(llm.requests[1])
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    assert msgs[2]["content"] == "Nice to meet you, Ada."
    # Byte-identical prefix: the second request repeats the first one's messages exactly.
    assert msgs[:2] == request_messages(llm.requests[0])


def test_piped_stdin_one_message_per_line(tmp_path: Path, llm: FakeLLMThread) -> None:
    cfg = write_config(tmp_path, llm.base_url)
    llm.script(reply("first answer", delay=0.3))
    done = run_memobot("agent", "-s", "cli:pipe", config=cfg, stdin="hi\n\nand again\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["first answer", "echo: and again"]


def test_env_variable_selects_config(tmp_path: Path, llm: FakeLLMThread) -> None:
    cfg = write_config(tmp_path, llm.base_url)
    done = run_memobot("agent", "-m", "via env", env={"MEMOBOT_CONFIG": str(cfg)})
    assert done.stdout == "echo: via env\n"
    assert SessionStore(tmp_path / "state").keys() == ["cli:direct"]


def test_no_llm_configured_says_what_to_set(tmp_path: Path) -> None:
    cfg = tmp_path / "no-llm.json"
    agent = {"workspace": str(tmp_path / "ws"), "stateDir": str(tmp_path / "state")}
    cfg.write_text(json.dumps({"agent": agent}))
    done = run_memobot("agent", "-m", "hi", config=cfg)
    assert done.returncode == 78
    assert "OPENAI_API_KEY" in done.stderr and "llm.baseUrl" in done.stderr
    assert "Ollama" in done.stderr and "Traceback" not in done.stderr
    assert done.stdout == ""


def test_bad_config_exits_78_with_json_path(tmp_path: Path) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"agent": {"maxConcurrentTurns": 0, "colour": "blue"}}))
    done = run_memobot("status", config=cfg)
    assert done.returncode == 78
    assert "agent.maxConcurrentTurns" in done.stderr and "agent.colour" in done.stderr
    assert "Traceback" not in done.stderr


def test_torn_session_line_recovered_by_next_run(tmp_path: Path, llm: FakeLLMThread) -> None:
    cfg = write_config(tmp_path, llm.base_url)
    assert converse(cfg, "cli:x", "one") == ["echo: one"]
    path = SessionStore(tmp_path / "state").path_for("cli:x")
    with open(path, "ab") as fh:
        fh.write(b'{"role":"assistant","content":"half a li')  # a crash mid-append
    done = run_memobot("agent", "-m", "two", "-s", "cli:x", config=cfg)
    assert done.stdout == "echo: two\n"
    lines = [json.loads(line) for line in path.read_text().splitlines()]  # every line parses
    contents = [m["content"] for m in lines if m.get("role") == "assistant"]
    assert contents == ["echo: one", "echo: two"]


def test_onboard_then_status(tmp_path: Path) -> None:
    cfg = tmp_path / "home" / "config.json"
    ws = tmp_path / "ws"
    done = run_memobot(
        "onboard",
        "--workspace",
        str(ws),
        "--base-url",
        "http://127.0.0.1:1/v1",
        "--model",
        "llama3.1",
        config=cfg,
    )
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(cfg.stat().st_mode) == 0o600
    for name in ("AGENTS.md", "SOUL.md", "USER.md", "TOOLS.md", "memory/MEMORY.md"):
        assert (ws / name).is_file()
    (ws / "USER.md").write_text("- Name: Ada\n")
    again = run_memobot("onboard", config=cfg)
    assert again.returncode == 0 and "kept" in again.stdout
    assert (ws / "USER.md").read_text() == "- Name: Ada\n"  # never overwritten
    status = run_memobot("status", config=cfg)
    assert status.returncode == 0
    assert str(cfg) in status.stdout and str(ws) in status.stdout
    assert "llama3.1 @ http://127.0.0.1:1/v1" in status.stdout
    row = next(line for line in status.stdout.splitlines() if line.startswith("sessions"))
    assert row.split()[-1] == "0"
    assert "none enabled" in status.stdout


def test_status_counts_sessions(tmp_path: Path, llm: FakeLLMThread) -> None:
    cfg = write_config(tmp_path, llm.base_url)
    converse(cfg, "cli:one", "a")
    converse(cfg, "cli:two", "b")
    out = run_memobot("status", config=cfg).stdout
    row = next(line for line in out.splitlines() if line.startswith("sessions"))
    assert row.split()[-1] == "2"


def test_python_dash_m_and_help() -> None:
    done = run_memobot("--help")
    assert done.returncode == 0
    for command in ("onboard", "agent", "status"):
        assert command in done.stdout
    agent_help = run_memobot("agent", "--help").stdout
    assert "--message" in agent_help and "--session" in agent_help and "--config" in agent_help


def test_onboard_changes_only_what_it_was_asked_to_in_a_config_that_exists(
    tmp_path: Path, llm: FakeLLMThread
) -> None:
    # Secrets kept out of the file as ${VAR} references stay references: onboard writing the
    # loaded (expanded) config back would put the key and the token in the file.
    cfg = write_config(
        tmp_path,
        llm.base_url,
        llm={"apiKey": "${MEMOTEST_LLM_KEY}"},
        channels={"telegram": {"token": "${MEMOTEST_TG_TOKEN}", "allowFrom": ["42"]}},
    )
    before = json.loads(cfg.read_text())
    env = {"MEMOTEST_LLM_KEY": "sk-kept-out-of-the-file", "MEMOTEST_TG_TOKEN": "123:secret"}
    done = run_memobot("onboard", "--model", "another-model", config=cfg, env=env)
    assert done.returncode == 0, done.stderr
    text = cfg.read_text()
    assert "sk-kept-out-of-the-file" not in text and "123:secret" not in text
    after = json.loads(text)
    assert after["llm"]["model"] == "another-model"
    after["llm"]["model"] = before["llm"]["model"]
    assert after == before  # nothing else changed
    assert "llm.model" in done.stdout
