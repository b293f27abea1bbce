"""The terminal while an answer is written: printed as it arrives when stdout is a terminal
(a pty here), each answer once; into a pipe each answer whole and exactly once (it is not
streamed); Ctrl-C keeps what was printed and says "stopped" on stderr; one dim line per tool
call in an interactive terminal."""

from __future__ import annotations

import asyncio
import io
import logging
import os
import pty
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyte
import pytest

from bot.streaming import STOPPED_MARK
from channels.terminal_channel.channel import DIM, LogsAboveTheAnswer, TerminalChannel
from tests.fakes.llm_server import FakeLLM, FakeLLMThread, reply, tool_step
from tests.helpers import REPO, channel_in_process, make_config, run_memobot, write_config, zygote

ANSWER = "Streaming answers arrive a few words at a time, then end with a full stop."


@pytest.fixture
def llm() -> Iterator[FakeLLMThread]:
    with FakeLLM.start_in_thread() as server:
        yield server


class _Terminal:
    """A child's stdout on a pty (so it sees a terminal), read in a thread; notes when the
    first byte came."""

    def __init__(self) -> None:
        self.master, self.slave = pty.openpty()
        self.data = b""
        self.first_at: float | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        os.close(self.slave)  # the child has its copy
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                chunk = os.read(self.master, 4096)
            except OSError:  # EIO: the child closed its end
                return
            if not chunk:
                return
            if self.first_at is None:
                self.first_at = time.monotonic()
            self.data += chunk

    def text(self) -> str:
        self._thread.join(20)
        os.close(self.master)
        return self.data.decode().replace("\r\n", "\n")


def _agent(cfg: Path, term: _Terminal, *args: str) -> subprocess.Popen[bytes]:
    env = {**os.environ}
    env.pop("OPENAI_API_KEY", None)
    env.pop("OPENAI_BASE_URL", None)
    proc = zygote.popen(
        ["--config", str(cfg), "agent", *args],
        stdin=subprocess.PIPE,
        stdout=term.slave,
        stderr=subprocess.PIPE,
        cwd=REPO,
        env=env,
    )
    term.start()
    return proc


def test_a_terminal_gets_the_answer_as_it_arrives_and_once(tmp_path, llm):
    cfg = write_config(tmp_path, llm.base_url)
    llm.script(reply(ANSWER, pieces=6, chunk_delay=0.25))
    term = _Terminal()
    proc = _agent(cfg, term, "-s", "cli:pipe")
    assert proc.stdin is not None
    proc.stdin.write(b"tell me\n")
    proc.stdin.close()
    assert proc.wait(30) == 0, proc.stderr.read() if proc.stderr else ""
    ended = time.monotonic()
    out = term.text()
    assert out == ANSWER + "\n"  # once, exactly
    assert llm.requests[0]["body"]["stream"] is True
    assert term.first_at is not None and ended - term.first_at > 0.8  # 5 pauses of 250 ms


def test_one_shot_into_a_pipe_prints_exactly_the_answer(tmp_path, llm):
    cfg = write_config(tmp_path, llm.base_url)
    (tmp_path / "workspace").mkdir(exist_ok=True)
    (tmp_path / "workspace" / "a.txt").write_text("x")
    llm.script(
        tool_step(("read_file", {"path": "a.txt"}), text="Let me look first."),
        reply("The file says x."),
    )
    done = run_memobot("agent", "-m", "read a.txt", "-s", "cli:one", config=cfg)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "The file says x.\n"
    assert all("stream" not in r["body"] for r in llm.requests)  # whole, once it is stored


def test_ctrl_c_mid_stream_keeps_what_was_printed_and_marks_it_stopped(tmp_path, llm):
    cfg = write_config(tmp_path, llm.base_url)
    long = " ".join(f"word{i}" for i in range(200))
    llm.script(reply(long, pieces=50, chunk_delay=0.2))
    term = _Terminal()
    proc = _agent(cfg, term, "-s", "cli:stop")
    assert proc.stdin is not None and proc.stderr is not None
    proc.stdin.write(b"go on\n")
    proc.stdin.flush()
    deadline = time.monotonic() + 20
    while len(term.data) < 20 and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    proc.stdin.close()
    assert proc.wait(30) == 130
    out, err = term.text(), proc.stderr.read().decode()
    assert out.endswith("\n") and out.count("\n") == 1
    printed = out.strip()
    assert printed and long.startswith(printed) and printed != long
    assert STOPPED_MARK in err


async def test_interactive_terminal_shows_one_dim_line_per_tool_call(tmp_path):
    async with FakeLLM() as llm:
        (tmp_path / "workspace").mkdir(exist_ok=True)
        (tmp_path / "workspace" / "a.txt").write_text("x")
        llm.script(
            tool_step(("read_file", {"path": "a.txt"}), ("list_dir", {"path": "."})),
            reply("Done: the file says x.", pieces=4, chunk_delay=0.05),
        )
        cfg = make_config(tmp_path, llm.base_url)
        out, err = io.StringIO(), io.StringIO()
        async with channel_in_process(
            cfg,
            tmp_path / "config.json",
            lambda stack: TerminalChannel(stack.bus, "i", out=out, err=err, show_tools=True),
        ) as (_, terminal, _manager):
            answer = await asyncio.wait_for(terminal.ask("read it"), 20)
    assert answer is not None
    lines = out.getvalue().splitlines()
    tool_lines = [line for line in lines if line.startswith(DIM)]
    assert len(tool_lines) == 2
    assert "read_file(" in tool_lines[0] and "list_dir(" in tool_lines[1]
    assert lines[-1] == "Done: the file says x."
    assert out.getvalue().count("Done: the file says x.") == 1


# -- a stream cut by an error and retried --------------------------------------------------------

CUT = "A first try at the answer that the server cuts off half way through its sentence."
RETRIED = "The answer, sent again whole."


def _screen(written: str, columns: int) -> list[str]:
    """The rows a VT100 ``columns`` wide shows after ``written`` (the tty makes "\\n" CR LF)."""
    screen = pyte.Screen(columns, 24)
    pyte.Stream(screen).feed(written.replace("\n", "\r\n"))
    return [row.rstrip() for row in screen.display if row.strip()]


async def _terminal_answer(
    tmp_path: Path,
    llm: FakeLLM,
    markdown: bool,
    columns: int = 24,
    logs: bool = False,
    **agent: Any,
) -> str:
    """Ask one question through an interactive terminal (narrow: the cut text wraps); what
    it wrote to stdout. ``logs``: the LLM client's log lines go to the same screen, as
    ``memobot agent`` wires them when stderr is the terminal too."""
    cfg = make_config(tmp_path, llm.base_url, **({"agent": agent} if agent else {}))
    out, err = io.StringIO(), io.StringIO()
    logger = logging.getLogger("bot.llm")
    async with channel_in_process(
        cfg,
        tmp_path / "config.json",
        lambda stack: TerminalChannel(
            stack.bus, "i", out=out, err=err, markdown=markdown, columns=lambda: columns
        ),
    ) as (_, terminal, _manager):
        handler = LogsAboveTheAnswer(logging.StreamHandler(out), terminal)
        if logs:
            logger.addHandler(handler)
        try:
            answer = await asyncio.wait_for(terminal.ask("go"), 20)
        finally:
            logger.removeHandler(handler)
    assert answer is not None and not err.getvalue()
    return out.getvalue()


@pytest.mark.parametrize("markdown", [False, True])
async def test_a_stream_cut_and_retried_leaves_only_the_retried_answer(tmp_path, llm, markdown):
    # Role chunk, three of six pieces, then the connection drops: the client retries.
    llm.script(
        reply(CUT, pieces=6, chunk_delay=0.01, disconnect_after_chunks=4),
        reply(RETRIED, pieces=3, chunk_delay=0.01),
    )
    written = await _terminal_answer(tmp_path, llm, markdown)
    assert len(llm.requests) == 2
    assert "A first try" in written  # the cut text was shown while it came...
    assert _screen(written, 24) == _screen(RETRIED, 24)  # ...and replaced


@pytest.mark.parametrize("markdown", [False, True])
async def test_a_log_line_comes_above_the_answer_being_written(tmp_path, llm, markdown):
    """stderr on the same screen: the retry's warning does not land inside the cut text; the
    cut text goes, the warning stays, the retried answer is below it."""
    llm.script(
        reply(CUT, pieces=6, chunk_delay=0.01, disconnect_after_chunks=4),
        reply(RETRIED, pieces=3, chunk_delay=0.01),
    )
    written = await _terminal_answer(tmp_path, llm, markdown, columns=200, logs=True)
    assert "A first try" in written
    [warning, answer] = _screen(written, 200)
    assert warning.startswith("llm request to") and "retry 1/2" in warning
    assert answer == RETRIED


@pytest.mark.parametrize("markdown", [False, True])
async def test_the_text_of_each_reply_of_a_tool_turn_stays(tmp_path, llm, markdown):
    """A new reply after tool calls is not a retry: what the model wrote before stays. Also
    after calls that were not run (the turn's call limit)."""
    llm.script(
        tool_step(("list_dir", {"path": "."}), text="Looking first."),
        tool_step(("list_dir", {"path": "."}), text="Once more."),  # over the limit: not run
        reply("Done."),
    )
    written = await _terminal_answer(tmp_path, llm, markdown, maxToolCallsPerTurn=1)
    assert _screen(written, 24) == ["Looking first.", "Once more.", "Done."]
