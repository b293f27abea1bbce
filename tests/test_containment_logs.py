"""Issue 9, items 3, 5 and 6, tried as an attacker would: through the real ``memobot`` command
or gateway as a subprocess, against the fake LLM and the fake Telegram Bot API.

* one model response with 200 ``exec`` calls runs only ``agent.maxToolCallsPerTurn`` of them;
* no secret (bot token, API key, a ``${VAR}`` value) reaches any log line, ``-vv`` included;
* a layout where the agent's workspace and memobot's own files overlap is refused at start.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.llm_server import FakeLLM, FakeLLMThread, call, reply, tool_step
from tests.helpers import request_messages, run_memobot, write_config


@pytest.fixture
def llm() -> Iterator[FakeLLMThread]:
    with FakeLLM.start_in_thread() as server:
        yield server


# -- item 3: tool calls per turn -------------------------------------------------------------


def test_one_response_with_200_exec_calls_runs_only_the_limit(
    tmp_path: Path, llm: FakeLLMThread
) -> None:
    cfg = write_config(tmp_path, llm.base_url)
    calls = [
        call("exec", {"command": f"echo line-{i} >> lines.txt"}, id=f"call_{i}") for i in range(200)
    ]
    llm.script(tool_step(*calls), reply("finished"))
    done = run_memobot("agent", "-m", "append lines", "-s", "cli:flood", config=cfg, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "finished\n"  # the turn still completed
    lines = (tmp_path / "ws" / "lines.txt").read_text().splitlines()
    assert lines == [f"line-{i}" for i in range(50)]
    # Every call got a result (the history stays valid); the refused ones say why.
    # Request 2 answered the calls (a consolidation of the long turn may follow it).
    messages = request_messages(llm.requests[1])
    results = [m for m in messages if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in results] == [f"call_{i}" for i in range(200)]
    refused = [m["content"] for m in results[50:]]
    assert all(c.startswith("Error:") and "agent.maxToolCallsPerTurn" in c for c in refused)
    assert not any("maxToolCallsPerTurn" in m["content"] for m in results[:50])


def test_the_limit_counts_over_every_round_of_the_turn_and_comes_from_the_config(
    tmp_path: Path, llm: FakeLLMThread
) -> None:
    cfg = write_config(tmp_path, llm.base_url, agent={"maxToolCallsPerTurn": 3})
    rounds = [
        tool_step(*[call("exec", {"command": f"echo r{r}-{i} >> lines.txt"}) for i in range(2)])
        for r in range(2)
    ]
    llm.script(*rounds, reply("finished"))
    done = run_memobot("agent", "-m", "append lines", "-s", "cli:rounds", config=cfg)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "finished\n"
    assert (tmp_path / "ws" / "lines.txt").read_text().splitlines() == ["r0-0", "r0-1", "r1-0"]
    last = [m for m in request_messages(llm.requests[2]) if m["role"] == "tool"][-1]
    assert last["content"].startswith("Error:") and "(agent.maxToolCallsPerTurn)" in last["content"]
