"""Issue 29 item 4: while the model is retried, the interactive terminal shows one status line
in place of "thinking..." ("model unavailable (HTTP 503), retrying in 1 s (1/2)..."), never a
log WARNING glued to it; the log (the gateway's journal) still gets one line per retry."""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path

import pyte
import pytest

from bot.config import LLMConfig
from bot.llm import LLMProvider, RetryNotice
from tests.fakes.llm_server import FakeLLM, error, reply
from tests.helpers import REPO, write_config
from tests.helpers.console import Pty

COLUMNS, ROWS = 100, 30


def test_retries_are_one_status_line_in_the_interactive_chat(tmp_path: Path) -> None:
    with FakeLLM.start_in_thread() as llm:
        retry = {"attempts": 3, "initialDelaySeconds": 0.6, "maxDelaySeconds": 0.6}
        cfg = write_config(tmp_path, llm.base_url, llm={"retry": retry})
        llm.script(error(503), error(503), reply("the answer at last"))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "NO_COLOR"))}
        env.update(PYTHONPATH=str(REPO), TERM="xterm", PROMPT_TOOLKIT_NO_CPR="1")
        # stdin, stdout and stderr on one terminal, as a person runs it.
        argv = [sys.executable, "-m", "bot", "--config", str(cfg), "agent", "-s", "st"]
        term = Pty(argv, env)
        term.read_until("you>")
        term.send("hello\r")
        term.read_until("the answer at last")
        time.sleep(0.5)  # the prompt is back
        term.send("exit\r")
        assert term.wait() == 0, term.text
    out = term.text
    assert "model unavailable (HTTP 503), retrying in 1 s (1/2)..." in out
    assert "(2/2)..." in out
    assert "WARNING" not in out and "bot.llm" not in out
    # Each status line replaced the one before (erased first), none is left on the screen.
    assert "thinking...\r\x1b[Kmodel unavailable" in out
    screen = pyte.Screen(COLUMNS, ROWS)
    pyte.Stream(screen).feed(out)
    rows = [r.rstrip() for r in screen.display if r.strip()]
    answer = next(i for i, r in enumerate(rows) if "the answer at last" in r)
    assert rows[answer].strip() == "the answer at last", rows
    assert not any("retrying" in r or "thinking" in r for r in rows), rows


async def test_each_retry_is_one_log_line_with_its_notice(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with FakeLLM() as llm:
        llm.script(error(503), reply("ok"))
        retry = {"attempts": 2, "initial_delay_seconds": 0.01, "max_delay_seconds": 0.01}
        provider = LLMProvider(
            LLMConfig(base_url=llm.base_url, api_key="k", model="m", retry=retry)
        )
        with caplog.at_level(logging.WARNING, logger="bot.llm"):
            answer = await provider.chat([{"role": "user", "content": "hi"}], session_key="s:1")
        await provider.close()
    assert answer.content == "ok"
    [record] = [r for r in caplog.records if "retry 1/1" in r.getMessage()]
    assert "HTTP 503" in record.getMessage() and "session=s:1" in record.getMessage()
    notice = record.retry_notice  # type: ignore[attr-defined]
    assert isinstance(notice, RetryNotice) and notice.status_line().startswith(
        "model unavailable (HTTP 503), retrying in 1 s (1/1)"
    )
