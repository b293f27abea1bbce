"""`memobot agent` on a real pty: an interactive chat shows answers rendered as Markdown
while they stream (read back from a VT100 screen in memory); NO_COLOR gives no escape
sequence; `agent -m` and pipes print the model's text as written; a terminal never gets the
model's control characters."""

from __future__ import annotations

import asyncio
import fcntl
import io
import os
import pty
import signal
import struct
import subprocess
import termios
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pyte
import pytest

from bot.bus import MessageBus, OutboundMessage, StreamEvent
from bot.streaming import STOPPED_MARK, stopped_answer
from channels.formatting import markdown_to_ansi
from channels.terminal_channel.channel import TerminalChannel, colour_allowed
from tests.fakes.llm_server import FakeLLM, FakeLLMThread, call, reply, tool_step
from tests.helpers import REPO, channel_in_process, make_config, run_memobot, write_config, zygote
from tests.helpers.terminal import XtermScreen, plain, screen_after

COLUMNS, ROWS = 60, 50
ANSWER = (
    "# Result\n"
    "The **important word** is here, with `code` and *slanted* text that runs past the "
    "sixty columns of this terminal so that it wraps.\n"
    "| key | value |\n"
    "|-----|-------|\n"
    "| a | 1 |\n"
    "- first\n"
    "- second **end**"
)


@pytest.fixture
def llm() -> Iterator[FakeLLMThread]:
    with FakeLLM.start_in_thread() as server:
        yield server


class Pty:
    """A terminal COLUMNS x ROWS for a child: its output is read in a thread."""

    def __init__(self) -> None:
        self.master, self.slave = pty.openpty()
        size = struct.pack("HHHH", ROWS, COLUMNS, 0, 0)
        fcntl.ioctl(self.slave, termios.TIOCSWINSZ, size)
        self.data = b""
        self.stamps: list[tuple[float, int]] = []  # (monotonic time, bytes read by then)
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        os.close(self.slave)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                chunk = os.read(self.master, 4096)
            except OSError:
                return
            if not chunk:
                return
            self.data += chunk
            self.stamps.append((time.monotonic(), len(self.data)))

    def wait_for(self, needle: bytes, after: int = 0, timeout: float = 20) -> int:
        """Where ``needle`` is written, at or after ``after``; just past its end."""
        deadline = time.monotonic() + timeout
        while (at := self.data.find(needle, after)) == -1:
            assert time.monotonic() < deadline, f"no {needle!r} in {self.data[-500:]!r}"
            time.sleep(0.02)
        return at + len(needle)

    def type(self, keys: bytes) -> None:
        os.write(self.master, keys)

    def close(self) -> str:
        self._thread.join(20)
        os.close(self.master)
        return self.data.decode()


def spawn_chat(cfg: Path, term: Pty, session: str, **env: str) -> subprocess.Popen[bytes]:
    """An interactive ``memobot agent`` on ``term``, its prompt up."""
    environ = {**os.environ, "TERM": "xterm-256color", "PROMPT_TOOLKIT_NO_CPR": "1", **env}
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", *(k for k in ("NO_COLOR",) if k not in env)):
        environ.pop(name, None)
    proc = zygote.popen(
        ["--config", str(cfg), "agent", "-s", session],
        stdin=term.slave,
        stdout=term.slave,
        stderr=subprocess.PIPE,
        cwd=REPO,
        env=environ,
    )
    term.start()
    term.wait_for(b"you>")
    return proc


def chat(cfg: Path, term: Pty, text: str, **env: str) -> tuple[subprocess.Popen[bytes], str]:
    """One message typed at the interactive prompt, then "exit"; returns the child and all
    it wrote to the terminal."""
    proc = spawn_chat(cfg, term, "cli:md", **env)
    typed_at = len(term.data)  # the banner says "Ctrl-D ends the chat": look past it
    term.type(text.encode() + b"\r")
    answered = term.wait_for(b"end", after=typed_at)  # the answer's last word...
    term.wait_for(b"you>", after=answered)  # ...and the prompt is back: the answer is done
    term.type(b"exit\r")
    assert proc.wait(20) == 0, proc.stderr.read() if proc.stderr else ""
    return proc, term.close()


def screen_of(data: str) -> XtermScreen:
    screen = XtermScreen(COLUMNS, ROWS)
    pyte.Stream(screen).feed(data)  # the pty already turned "\n" into CR LF
    return screen


def test_an_interactive_terminal_shows_the_answer_rendered_as_it_streams(tmp_path, llm):
    cfg = write_config(tmp_path, llm.base_url)
    llm.script(reply(ANSWER, pieces=12, chunk_delay=0.05))
    _, data = chat(cfg, Pty(), "show me")
    assert llm.requests[0]["body"]["stream"] is True
    screen = screen_of(data)
    rows = [line.rstrip() for line in screen.display]
    start = rows.index("Result")
    expected = screen_after(markdown_to_ansi(ANSWER), COLUMNS)
    expected = expected[: max(k for k, row in enumerate(expected) if row) + 1]
    assert rows[start : start + len(expected)] == expected
    assert not any("**" in row or "|---" in row or row.startswith("- ") for row in rows)
    # The SGR attributes on the screen: bold words bold, the heading underlined, code coloured.
    line = screen.buffer[start + 1]
    cells = [line[x] for x in range(COLUMNS)]
    text = "".join(c.data for c in cells)
    at = text.index("important word")
    assert all(c.bold for c in cells[at : at + len("important word")])
    assert not cells[at - 2].bold
    assert all(screen.buffer[start][x].underscore for x in range(len("Result")))
    code_at = text.index("code")
    assert cells[code_at].fg == "cyan" and cells[code_at - 2].fg == "default"
    # Streamed: the raw text was on screen before its line was rendered.
    assert "**important word**" in data


@pytest.mark.parametrize("env", [{"NO_COLOR": "1"}, {"TERM": "dumb"}])
def test_no_color_writes_no_escape_sequence_around_the_answer(tmp_path, llm, env):
    cfg = write_config(tmp_path, llm.base_url)
    llm.script(reply(ANSWER, pieces=12, chunk_delay=0.02))
    _, data = chat(cfg, Pty(), "show me", **env)
    # prompt_toolkit draws its prompt with escape sequences; between the question's echo
    # and the next prompt is memobot's output alone: the answer as written, nothing else.
    answer = data[data.index("# Result") : data.rindex("you>")]
    assert "\x1b" not in answer.split("**end**")[0] + "**end**"
    assert answer.startswith(ANSWER.replace("\n", "\r\n"))


def test_colour_is_off_for_no_color_and_dumb_terminals():
    assert colour_allowed({"TERM": "xterm-256color"})
    assert colour_allowed({"TERM": "xterm", "NO_COLOR": ""})  # empty: as if unset
    assert not colour_allowed({"TERM": "xterm", "NO_COLOR": "1"})
    assert not colour_allowed({"TERM": "dumb"})


def test_agent_m_prints_the_markdown_as_written(tmp_path, llm):
    cfg = write_config(tmp_path, llm.base_url)
    llm.script(reply(ANSWER))
    done = run_memobot("agent", "-m", "show me", "-s", "cli:one", config=cfg)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ANSWER + "\n"


def test_agent_m_on_a_terminal_streams_the_text_as_written_without_control_characters(
    tmp_path, llm
):
    cfg = write_config(tmp_path, llm.base_url)
    hostile = ANSWER + "\n\x1b]0;owned\x07\x1b[2Jgone?\rX"
    llm.script(reply(hostile, pieces=5, chunk_delay=0.02))
    term = Pty()
    env = {**os.environ, "TERM": "xterm-256color"}
    env.pop("OPENAI_API_KEY", None)
    proc = zygote.popen(
        ["--config", str(cfg), "agent", "-m", "hi", "-s", "cli:t"],
        stdin=subprocess.DEVNULL,
        stdout=term.slave,
        stderr=subprocess.PIPE,
        cwd=REPO,
        env=env,
    )
    term.start()
    assert proc.wait(30) == 0, proc.stderr.read() if proc.stderr else ""
    out = term.close().replace("\r\n", "\n")
    assert out == ANSWER + "\n]0;owned[2Jgone?X\n"  # no SGR, no control character


async def run_terminal(terminal_kw: dict, steps: list, tmp_path: Path) -> tuple[str, str]:
    """One question through a TerminalChannel writing to a StringIO; (stdout, stderr)."""
    async with FakeLLM() as llm:
        (tmp_path / "workspace").mkdir(exist_ok=True)
        (tmp_path / "workspace" / "a.txt").write_text("x")
        llm.script(*steps)
        cfg = make_config(tmp_path, llm.base_url)
        out, err = io.StringIO(), io.StringIO()
        async with channel_in_process(
            cfg,
            tmp_path / "config.json",
            lambda stack: TerminalChannel(stack.bus, "i", out=out, err=err, **terminal_kw),
        ) as (_, terminal, _manager):
            await asyncio.wait_for(terminal.ask("go"), 20)
    return out.getvalue(), err.getvalue()


async def test_tool_lines_and_the_answer_around_them_are_rendered_in_order(tmp_path):
    out, _ = await run_terminal(
        {"show_tools": True, "markdown": True, "clean": True, "columns": lambda: 40},
        [
            # Arguments as the model wrote them, an escape sequence inside (not JSON-escaped).
            tool_step(call("read_file", '{"path": "a.txt\x1b[2J"}'), text="Let me **look**."),
            reply("The file says `x`.\n\n| a | b |\n|---|---|\n| 1 | 2 |", pieces=5),
        ],
        tmp_path,
    )
    rows = [row for row in screen_after(out, 40) if row]
    assert rows[0] == "Let me look."
    assert rows[1] == '  ↳ read_file({"path": "a.txt[2J"})'
    assert rows[2:] == ["The file says x.", "a | b", "--+--", "1 | 2"]  # a table at the end
    assert "\x1b[2J" not in out


async def test_without_ansi_nothing_writes_an_escape_sequence(tmp_path):
    out, _ = await run_terminal(
        {"show_tools": True, "markdown": True, "ansi": False, "clean": True, "thinking": True},
        [
            tool_step(("read_file", {"path": "a.txt"}), text="Let me **look**."),
            reply("The file says `x`.", pieces=3, chunk_delay=0.02),
        ],
        tmp_path,
    )
    assert "\x1b" not in out
    assert "Let me **look**." in out and "The file says `x`.\n" in out and "↳ read_file(" in out


async def test_a_stopped_answer_keeps_what_was_shown_rendered_and_says_so_on_stderr():
    out, err = io.StringIO(), io.StringIO()
    terminal = TerminalChannel(
        MessageBus(), "i", out=out, err=err, markdown=True, clean=True, columns=lambda: 30
    )
    for text in ("Hello **wor", "Hello **world** and\n- it", "Hello **world** and\n- item *b"):
        terminal.show_stream(StreamEvent("cli", "i", "m1", "text", text))
    assert screen_after(out.getvalue(), 30)[:2] == ["Hello world and", "- item *b"]
    final = stopped_answer("Hello **world** and\n- item *b")
    assert final is not None
    stopped = OutboundMessage("cli", "i", final, reply_to="m1", final=True)
    await terminal.send_chunk(replace_outcome(stopped, "stopped"), final)
    assert screen_after(out.getvalue(), 30)[:3] == ["Hello world and", "• item *b", ""]
    assert err.getvalue() == STOPPED_MARK + "\n"


def replace_outcome(msg: OutboundMessage, outcome: str) -> OutboundMessage:
    return OutboundMessage(
        msg.channel,
        msg.chat_id,
        msg.text,
        reply_to=msg.reply_to,
        final=True,
        metadata={"outcome": outcome},
    )


async def test_an_answer_not_streamed_is_printed_rendered_once():
    out = io.StringIO()
    terminal = TerminalChannel(MessageBus(), "i", out=out, markdown=True, clean=True)
    msg = OutboundMessage("cli", "i", "**one**\n\x1b[2Jtwo", reply_to="m1", final=True)
    await terminal.send_chunk(msg, msg.text)
    assert out.getvalue() == markdown_to_ansi("**one**\n[2Jtwo") + "\n"
    assert plain(out.getvalue()) == "one\n[2Jtwo\n"


def test_ctrl_c_mid_answer_leaves_what_was_shown_rendered(tmp_path, llm):
    cfg = write_config(tmp_path, llm.base_url)
    long = "Start **bold** here.\n" + " ".join(f"*word{i}*" for i in range(300))
    llm.script(reply(long, pieces=60, chunk_delay=0.1))
    term = Pty()
    proc = spawn_chat(cfg, term, "cli:stop")
    term.type(b"go on\r")
    term.wait_for(b"word20* ")
    proc.send_signal(signal.SIGINT)  # what Ctrl-C sends while an answer is written
    term.wait_for(b"you>", after=term.wait_for(b"word20* "))
    term.type(b"exit\r")
    assert proc.wait(20) == 0
    assert STOPPED_MARK in (proc.stderr.read() if proc.stderr else b"").decode()
    rows = [row.rstrip() for row in screen_of(term.close()).display]
    start = rows.index("Start bold here.")
    end = next(k for k in range(start, ROWS) if rows[k].startswith("you>"))
    shown = "".join(rows[start + 1 : end])  # the rows of one wrapped line
    # The unfinished line was rendered when the answer stopped: no marker left around a word.
    assert shown.startswith("word0 word1 ") and "word20 " in shown and "word299" not in shown
    assert "*word1*" not in shown
