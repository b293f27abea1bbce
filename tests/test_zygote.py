"""The suite's pre-imported ``python -m bot`` (tests.helpers.zygote) behaves as a fresh one.

Most command-line tests run memobot forked from it; if it drifted from a fresh interpreter, they
would test something users never run."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.llm_server import FakeLLM, FakeLLMThread
from tests.helpers import run_memobot, write_config


@pytest.fixture
def llm() -> Iterator[FakeLLMThread]:
    with FakeLLM.start_in_thread() as server:
        yield server


def test_a_forked_command_prints_and_exits_as_a_fresh_one(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "config.json"
    for args in (("--version",), ("status",), ("cron", "list"), ("no-such-command",)):
        forked = run_memobot(*args, config=missing)
        fresh = run_memobot(*args, config=missing, fresh=True)
        assert (forked.returncode, forked.stdout, forked.stderr) == (
            fresh.returncode,
            fresh.stdout,
            fresh.stderr,
        ), args


def test_the_child_gets_its_own_environment_stdin_and_failpoints(
    tmp_path: Path, llm: FakeLLMThread
) -> None:
    cfg = write_config(tmp_path, llm.base_url)
    llm.script({"text": "first"})
    piped = run_memobot(
        "agent",
        "-s",
        "cli:z",
        config=cfg,
        stdin="hello from stdin\n",
    )
    assert piped.returncode == 0, piped.stderr
    assert "hello from stdin" in json.dumps(llm.requests[-1]["body"])
    # MEMOBOT_FAILPOINTS is read when bot.failpoints is imported: the zygote imported it
    # without, so the child must read it again from its own environment.
    killed = run_memobot(
        "agent", "-m", "again", "-s", "cli:z", config=cfg, env={"MEMOBOT_FAILPOINTS": "before_llm"}
    )
    assert killed.returncode == -9


def test_a_command_that_outlives_its_timeout_is_killed(tmp_path: Path, llm: FakeLLMThread) -> None:
    cfg = write_config(tmp_path, llm.base_url)
    llm.script({"hang": True})
    with pytest.raises(subprocess.TimeoutExpired):
        run_memobot("agent", "-m", "hi", "-s", "cli:slow", config=cfg, timeout=2)
