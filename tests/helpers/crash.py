"""Plumbing for the crash tests: memobot as a killable subprocess, and what it left on disk.

A ``Run`` is one ``memobot agent`` process whose stdout and stderr go to files, so whatever it
printed before a SIGKILL is still there to count. ``ConversationLLM`` is the fake LLM with a rule
instead of a queue: its answer is a function of the whole request, so a turn that is killed and
resumed any number of times still gets the answer scripted for *its* message.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bot.session import Session, SessionStore
from tests.fakes.llm_server import FakeLLM, Step, call, reply, tool_step
from tests.helpers import zygote

REPO = Path(__file__).resolve().parents[2]
RUNTIME_MARK = "\n\n[runtime context"
RESUME_NOTE_START = "[memobot: your previous run"
# Metadata keys that only exist while a turn or a delivery is unfinished.
UNFINISHED_KEYS = ("pending", "runtime_checkpoint", "outbox", "resume", "interrupted")


@dataclass
class Run:
    """One ``memobot agent`` process."""

    proc: subprocess.Popen[bytes]
    out_path: Path
    err_path: Path
    failpoints: str = ""

    def wait(self, timeout: float = 30) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"memobot did not exit within {timeout} s\nstdout:\n{self.stdout}\n"
                f"stderr:\n{self.stderr}"
            ) from None

    def kill(self) -> None:
        """SIGKILL (a no-op if it already exited) and reap."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def close_stdin(self) -> None:
        if self.proc.stdin and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except BrokenPipeError:
                pass  # it died before reading everything: that is what crash tests do

    @property
    def returncode(self) -> int | None:
        return self.proc.poll()

    @property
    def killed(self) -> bool:
        return self.proc.poll() == -signal.SIGKILL

    @property
    def stdout(self) -> str:
        return self.out_path.read_text(errors="replace")

    @property
    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    def describe(self) -> str:
        return (
            f"run failpoints={self.failpoints or '-'} rc={self.returncode}\n"
            f"--- stdout\n{self.stdout}--- stderr\n{self.stderr}"
        )


class Memobot:
    """Starts ``memobot --config CFG agent`` runs and keeps every one for the final checks."""

    def __init__(self, tmp_path: Path, config: Path, name: str = "runs") -> None:
        self.dir = tmp_path / name
        self.dir.mkdir(exist_ok=True)
        self.config = config
        self.state = tmp_path / "state"
        self.runs: list[Run] = []

    def start(
        self,
        session: str,
        lines: Iterable[str] = (),
        failpoints: str = "",
        keep_stdin_open: bool = False,
    ) -> Run:
        """Spawn a run; ``lines`` are written to its stdin (closed after, unless kept open)."""
        n = len(self.runs)
        out_path, err_path = self.dir / f"{n:03d}.out", self.dir / f"{n:03d}.err"
        env = {**os.environ, "MEMOBOT_FAILPOINTS": failpoints}
        for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "MEMOBOT_CONFIG"):
            env.pop(name, None)
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = zygote.popen(
                ["--config", str(self.config), "-v", "agent", "-s", session],
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=err,
                cwd=REPO,
                env=env,
            )
        run = Run(proc, out_path, err_path, failpoints)
        self.runs.append(run)
        assert proc.stdin is not None
        try:
            # A few short lines fit the pipe buffer: this never blocks, even if it dies now.
            proc.stdin.write("".join(f"{line}\n" for line in lines).encode())
            proc.stdin.flush()
        except BrokenPipeError:
            pass
        if not keep_stdin_open:
            run.close_stdin()
        return run

    def run(self, session: str, lines: Iterable[str] = (), failpoints: str = "") -> Run:
        """Start a run and wait for it to end on its own (a clean exit or a failpoint)."""
        run = self.start(session, lines, failpoints)
        run.wait()
        return run

    def stdout_lines(self) -> list[str]:
        """What every run printed, in order: the user's view of the whole conversation."""
        return [line for r in self.runs for line in r.stdout.splitlines()]

    def kill_all(self) -> None:
        for run in self.runs:
            run.kill()

    def session(self, key: str) -> Session:
        """The session as a fresh start would load it."""
        return SessionStore(self.state).get(key)


def parse_session_files(state: Path) -> dict[str, list[dict[str, Any]]]:
    """Every line of every session file, parsed; AssertionError naming the first bad line."""
    files = sorted((state / "sessions").glob("*.jsonl"))
    assert files, f"no session files under {state}"
    parsed: dict[str, list[dict[str, Any]]] = {}
    for path in files:
        data = path.read_bytes()
        assert data.endswith(b"\n"), f"{path.name}: last line is torn: {data[-120:]!r}"
        rows = []
        for n, line in enumerate(data.decode("utf-8").splitlines(), start=1):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise AssertionError(
                    f"{path.name} line {n} is not JSON ({exc}): {line!r}"
                ) from None
        parsed[path.name] = rows
    corrupt = sorted(p.name for p in (state / "sessions").glob("*.corrupt-*"))
    assert not corrupt, f"a crash made memobot quarantine a session file: {corrupt}"
    return parsed


def user_text(message: dict[str, Any]) -> str | None:
    """What the person wrote, for a stored user message; None for resume notes and non-users."""
    content = message.get("content")
    if message.get("role") != "user" or not isinstance(content, str):
        return None
    if content.startswith(RESUME_NOTE_START):
        return None
    return content.split(RUNTIME_MARK, 1)[0]


def accepted_texts(session: Session) -> list[str]:
    """Texts memobot has taken responsibility for: in its history or still pending."""
    texts = [t for m in session.messages if (t := user_text(m)) is not None]
    texts += [p["text"] for p in session.metadata.get("pending") or []]
    return texts


def unfinished(session: Session) -> dict[str, Any]:
    """The metadata entries that should be gone once every turn has been answered."""
    return {k: session.metadata[k] for k in UNFINISHED_KEYS if k in session.metadata}


def wait_until(predicate: Callable[[], object], timeout: float = 15, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or predicate}")
        time.sleep(0.01)


def kill_pid_file(path: Path) -> None:
    """Kill the process whose pid a tool command wrote (an orphan of a SIGKILLed memobot)."""
    try:
        pid = int(path.read_text().strip())
    except (FileNotFoundError, ValueError):
        return
    try:
        os.killpg(pid, signal.SIGKILL)  # exec runs each command as its own process group
    except (ProcessLookupError, PermissionError):
        pass


# --- a fake LLM that answers by rule -----------------------------------------------------------

Rule = Callable[[list[dict[str, Any]]], Step]


class ConversationLLM(FakeLLM):
    """A FakeLLM whose every answer is ``rule(request_messages)``.

    The queue of the base class is filled with exactly the step the rule picks, just before
    the base class takes it; both happen on the server's event loop with no await between
    them, so concurrent requests cannot take each other's step.
    """

    def __init__(self, rule: Rule, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.rule = rule

    def _take_step(self, request: Any, body: dict, user_text: str) -> tuple[Step, dict[str, Any]]:
        self.script(self.rule(body.get("messages") or []))
        return super()._take_step(request, body, user_text)


TURN_RE = re.compile(r"^message (?P<tag>[a-z]+)-(?P<n>\d+)$")


def current_turn(messages: list[dict[str, Any]]) -> tuple[str, int, list[dict[str, Any]]]:
    """(tag, number, messages after it) of the last message the person wrote in a request."""
    for i in range(len(messages) - 1, -1, -1):
        text = user_text(messages[i])
        if text is not None:
            m = TURN_RE.match(text)
            if m is None:
                raise ValueError(f"not a scripted message: {text!r}")
            return m["tag"], int(m["n"]), messages[i + 1 :]
    raise ValueError("no user message in the request")


ToolFor = Callable[[str, int], tuple[str, dict[str, Any]] | None]


def turn_rule(
    tool_for: ToolFor | None = None, delay: Callable[[str, int], float] | None = None
) -> Rule:
    """The model of a scripted conversation: message ``message <tag>-<n>`` is answered with
    ``answer <tag>-<n>``, after one call of ``tool_for(tag, n)`` when that is not None.

    Stateless: whatever a crash took away, the next request gets the answer that fits the
    conversation it carries. A resumed turn (the tool call already in the request) gets the
    answer straight away, so an interrupted tool is never called again by the model.
    """

    def rule(messages: list[dict[str, Any]]) -> Step:
        tag, n, after = current_turn(messages)
        wait = delay(tag, n) if delay else 0.0
        tool = tool_for(tag, n) if tool_for else None
        called = any(m.get("role") == "assistant" and m.get("tool_calls") for m in after)
        if tool is not None and not called:
            name, args = tool
            return tool_step(call(name, args, id=f"call-{tag}-{n}"), delay=wait)
        return reply(answer_for(tag, n), delay=wait)

    return rule


def message_for(tag: str, n: int) -> str:
    return f"message {tag}-{n}"


def answer_for(tag: str, n: int) -> str:
    return f"answer {tag}-{n}"
