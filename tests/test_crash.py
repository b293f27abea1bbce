"""Issue 3, "never lose or repeat a turn": memobot is SIGKILLed at every phase of a turn and
started again; every accepted message gets exactly one answer, no session file is corrupt, and
the person never has to write again.

Every test but the redelivery one runs ``memobot agent`` as a real subprocess against the fake
LLM (in a thread of the test process, so it outlives each memobot). A kill is either a named
failpoint (``MEMOBOT_FAILPOINTS``, see bot/failpoints.py) or an external SIGKILL at a moment the
test observes (a request reaching the fake LLM, a tool writing its pid).
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import random
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bot.bus import InboundMessage
from bot.recovery import GAVE_UP_TEXT, MAX_RESUME_ATTEMPTS
from bot.runner import INTERRUPTED_TOOL_RESULT
from bot.session import Session, SessionStore
from tests.fakes.llm_server import FakeLLM, FakeLLMThread, hang, history_problem
from tests.helpers import Harness, make_config, request_messages, write_config
from tests.helpers.crash import (
    RESUME_NOTE_START,
    RUNTIME_MARK,
    ConversationLLM,
    Memobot,
    Run,
    accepted_texts,
    answer_for,
    current_turn,
    kill_pid_file,
    message_for,
    parse_session_files,
    turn_rule,
    unfinished,
    user_text,
    wait_until,
)

KEY = "cli:k"
EXEC_MARK = "exec-ran"


@pytest.fixture
def llm() -> Iterator[FakeLLMThread]:
    with ConversationLLM.start_in_thread(rule=turn_rule()) as server:
        yield server


@pytest.fixture
def memobot(tmp_path: Path, llm: FakeLLMThread) -> Iterator[Memobot]:
    mb = Memobot(tmp_path, write_config(tmp_path, llm.base_url))
    try:
        yield mb
    finally:
        mb.kill_all()
        for pid_file in (tmp_path / "ws").glob("*.pid"):
            kill_pid_file(pid_file)  # a tool command orphaned by a SIGKILLed memobot


def set_rule(llm: FakeLLMThread, rule: Any) -> None:
    llm.llm.rule = rule  # type: ignore[attr-defined]


def exec_tool(tag: str, n: int) -> tuple[str, dict[str, Any]]:
    """A tool call with a visible side effect: one line in runs.log per execution."""
    return "exec", {"command": f"echo {tag}-{n} >> runs.log; echo {EXEC_MARK}"}


def exec_runs(tmp_path: Path) -> list[str]:
    log = tmp_path / "ws" / "runs.log"
    return log.read_text().split() if log.exists() else []


def assert_answered_once(mb: Memobot, key: str, texts: list[str], answers: list[str]) -> None:
    """The end state every crash must lead to."""
    parse_session_files(mb.state)
    printed = mb.stdout_lines()
    for answer in answers:
        assert printed.count(answer) == 1, (answer, printed, [r.describe() for r in mb.runs])
    session = mb.session(key)
    assert unfinished(session) == {}, unfinished(session)
    # Each message is in the history exactly once, and the history is valid for the API.
    assert [t for m in session.messages if (t := user_text(m)) is not None] == texts
    assert history_problem(session.wire) is None, history_problem(session.wire)


def unfinished_append(data: bytes) -> bool:
    """True if a session file ends in the middle of an append: a torn line, or message lines
    without the metadata line that closes every append."""
    *_, last, tail = data.split(b"\n")
    return bool(tail) or not last.startswith(b'{"_type":"metadata"')


def tool_messages(mb: Memobot, key: str) -> list[dict[str, Any]]:
    return [m for m in mb.session(key).messages if m.get("role") == "tool"]


# --- 1. one kill at each phase of a turn ---------------------------------------------------


# failpoint -> (LLM requests the restart makes, exec runs in all, tool call interrupted,
#               which run prints the answer)
KILL_POINTS = {
    # The pending entry is on disk, nothing else: the whole turn runs on restart.
    "after_intake": (2, 1, False, 2),
    # The model's first answer is in the usage ledger, not in a checkpoint: the turn runs
    # again, and its new call is a new record (the ledger matches what the model served).
    "usage_recorded": (2, 1, False, 2),
    # The model asked for the tool; we cannot know whether it ran, so it is not run again.
    "awaiting_tools": (1, 0, True, 2),
    # The tool's result is in the checkpoint: the model gets it, the tool is not repeated.
    "tools_completed": (1, 1, False, 2),
    # The answer is in the checkpoint: delivered without asking the model again.
    "final_response": (0, 1, False, 2),
    # Turn and ledger entry written, nothing printed: the ledger sends it on restart.
    "before_delivery": (0, 1, False, 2),
    # Printed, not yet marked sent: dropped on restart, never printed twice.
    "after_send": (0, 1, False, 1),
    # Torn appends (1 intake, 2 awaiting_tools, 3 tools_completed, 4 final_response,
    # 5 turn + ledger, 6 "sending", 7 sent): the torn line is ignored on restart.
    "mid_append@2": (2, 1, False, 2),
    "mid_append@5": (0, 1, False, 2),
    "mid_append@6": (0, 1, False, 2),
}


@pytest.mark.parametrize("failpoint", list(KILL_POINTS))
def test_kill_at_a_phase_then_restart(
    failpoint: str, tmp_path: Path, llm: FakeLLMThread, memobot: Memobot
) -> None:
    new_requests, runs, interrupted, printed_by = KILL_POINTS[failpoint]
    set_rule(llm, turn_rule(tool_for=exec_tool))
    text, answer = message_for("k", 1), answer_for("k", 1)

    first = memobot.run(KEY, [text], failpoints=failpoint)
    assert first.killed, first.describe()
    if failpoint.startswith("mid_append"):
        assert unfinished_append(memobot.session(KEY).path.read_bytes())
    before = len(llm.requests)

    second = memobot.run(KEY, [])  # no new input: memobot finishes the turn by itself
    assert second.returncode == 0, second.describe()
    assert [first.stdout, second.stdout][printed_by - 1] == f"{answer}\n"
    assert len(llm.requests) - before == new_requests
    assert exec_runs(tmp_path) == ["k-1"] * runs
    assert_answered_once(memobot, KEY, [text], [answer])
    results = tool_messages(memobot, KEY)
    assert [m["tool_call_id"] for m in results] == ["call-k-1"]
    assert (results[0]["content"] == INTERRUPTED_TOOL_RESULT) is interrupted
    if new_requests == 1:  # resumed from a checkpoint: the model sees what was done
        sent = request_messages(llm.requests[-1])
        _, _, after = current_turn(sent)
        # The last thing the model reads is the tool result of the person's question; the
        # note sits in the person's message, after its runtime block.
        assert [m["role"] for m in after] == ["assistant", "tool"]
        assert (EXEC_MARK in after[1]["content"]) is not interrupted
        note = resume_note_of(sent[-len(after) - 1])
        assert ("did not finish: exec" in note) is interrupted
    if failpoint == "after_send":
        assert "was being sent when memobot stopped" in second.stderr
    assert_usage_counted_once(memobot, llm)


def assert_usage_counted_once(mb: Memobot, llm: FakeLLMThread) -> None:
    """The usage ledger holds each answer the model served exactly once, whatever was killed
    and resumed in between (issue 31)."""
    served = [e["usage"] for e in llm.requests if e.get("usage")]
    records = [r for path in mb.state.glob("usage/*.jsonl") for r in parse_jsonl(path)]
    assert len(records) == len(served), (records, served)
    for count in ("prompt_tokens", "completion_tokens"):
        assert sum(r[count] for r in records) == sum(u[count] for u in served), count


def parse_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def resume_note_of(message: dict[str, Any]) -> str:
    """The resume note inside the person's message (after the runtime block)."""
    assert message["role"] == "user"
    content = message["content"]
    assert isinstance(content, str) and RESUME_NOTE_START in content, content
    note = content[content.index(RESUME_NOTE_START) :]
    assert content.index(RESUME_NOTE_START) > content.index(RUNTIME_MARK)
    return note


def test_kill_during_the_llm_call(llm: FakeLLMThread, memobot: Memobot) -> None:
    set_rule(llm, lambda messages: hang())
    text, answer = message_for("k", 1), answer_for("k", 1)
    first = memobot.start(KEY, [text])
    llm.wait_for_requests(1, timeout=15)
    first.proc.send_signal(signal.SIGKILL)
    first.wait()
    assert memobot.session(KEY).metadata["pending"][0]["text"] == text

    set_rule(llm, turn_rule())
    second = memobot.run(KEY, [])
    assert second.stdout == f"{answer}\n", second.describe()
    assert [r["last_user"].split("\n")[0] for r in llm.requests] == [text, text]
    assert_answered_once(memobot, KEY, [text], [answer])


def test_kill_while_a_tool_runs(tmp_path: Path, llm: FakeLLMThread, memobot: Memobot) -> None:
    pid_file = tmp_path / "ws" / "sleeper.pid"
    command = "echo started >> runs.log; echo $$ > sleeper.pid; exec sleep 30"
    set_rule(llm, turn_rule(tool_for=lambda tag, n: ("exec", {"command": command})))
    text, answer = message_for("k", 1), answer_for("k", 1)
    first = memobot.start(KEY, [text])
    wait_until(lambda: pid_file.exists() and pid_file.read_text().strip(), what="the tool")
    first.proc.send_signal(signal.SIGKILL)
    first.wait()
    kill_pid_file(pid_file)
    assert memobot.session(KEY).metadata["runtime_checkpoint"]["phase"] == "awaiting_tools"

    second = memobot.run(KEY, [])
    assert second.stdout == f"{answer}\n", second.describe()
    assert exec_runs(tmp_path) == ["started"]  # not run again blindly
    resumed = request_messages(llm.requests[-1])
    _, _, after = current_turn(resumed)
    assert after[0]["tool_calls"][0]["id"] == "call-k-1"
    assert after[1] == {
        "role": "tool",
        "tool_call_id": "call-k-1",
        "name": "exec",
        "content": INTERRUPTED_TOOL_RESULT,
    }
    assert len(after) == 2  # the tool result is the last message the model reads
    assert "did not finish: exec" in resume_note_of(resumed[-3])
    assert_answered_once(memobot, KEY, [text], [answer])
    [result] = tool_messages(memobot, KEY)
    assert result["tool_call_id"] == "call-k-1" and result["content"] == INTERRUPTED_TOOL_RESULT
    assert_usage_counted_once(memobot, llm)


def test_recovered_answer_is_printed_before_new_input(llm: FakeLLMThread, memobot: Memobot) -> None:
    first = memobot.run(KEY, [message_for("k", 1)], failpoints="before_delivery")
    assert first.killed
    # The start re-sends the answer, then takes the next line, whose intake dies at once.
    # The answer must be out by then: taken while it sat between its "sending" mark and the
    # terminal, a crash in that intake would drop it unseen (the random run found that race).
    second = memobot.run(KEY, [message_for("k", 2)], failpoints="after_intake")
    assert second.killed and second.stdout == f"{answer_for('k', 1)}\n", second.describe()
    third = memobot.run(KEY, [])
    assert third.stdout == f"{answer_for('k', 2)}\n", third.describe()
    texts = [message_for("k", n) for n in (1, 2)]
    assert_answered_once(memobot, KEY, texts, [answer_for("k", n) for n in (1, 2)])


# --- 2. a platform redelivers a message across a restart -----------------------------------


async def test_redelivered_message_is_answered_once_across_restarts(tmp_path: Path) -> None:
    async with FakeLLM() as server:
        cfg = make_config(tmp_path, server.base_url)
        config_path = tmp_path / "config.json"
        # Answered, then redelivered after a restart (a Telegram offset not yet confirmed).
        async with Harness(cfg, config_path) as h:
            answered = await asyncio.wait_for(await h.send("first", message_id="tg-1"), 10)
        # Accepted, then memobot stopped before answering; redelivered after the restart.
        server.script(hang(when_user_contains="second"))
        async with Harness(cfg, config_path) as h:
            await h.send("second", message_id="tg-2")
            await server.wait_for_requests(2)
            stopped = h.outbox
        async with Harness(cfg, config_path) as h:
            resumed = h.expect("tg-2")
            verdicts = [
                await h.stack.bus.publish_inbound(_inbound(text, mid))
                for text, mid in (("first", "tg-1"), ("second", "tg-2"))
            ]
            assert (await asyncio.wait_for(resumed, 10)).text == "echo: second"
            await h.manager.flush()
            later = h.outbox
    assert verdicts == ["duplicate", "duplicate"]
    assert answered.text == "echo: first"
    assert stopped == []  # shutting down mid-turn says nothing; the next start answers
    assert [(m.reply_to, m.text) for m in later] == [("tg-2", "echo: second")]
    assert [r["last_user"].split("\n")[0] for r in server.requests] == ["first", "second", "second"]
    session = SessionStore(tmp_path / "state").get("cli:t")
    assert unfinished(session) == {}
    assert [user_text(m) for m in session.messages if m["role"] == "user"] == ["first", "second"]


def _inbound(text: str, message_id: str) -> InboundMessage:
    return InboundMessage("cli", "t", "user-1", text, message_id=message_id)


# --- 3. a turn that dies every time -------------------------------------------------------


def test_resume_attempts_are_capped(llm: FakeLLMThread, memobot: Memobot) -> None:
    doomed = message_for("k", 1)
    first = memobot.run(KEY, [doomed], failpoints="before_llm")
    assert first.killed
    for attempt in range(1, MAX_RESUME_ATTEMPTS + 1):
        again = memobot.run(KEY, [], failpoints="before_llm")
        assert again.killed and again.stdout == "", again.describe()
        assert memobot.session(KEY).metadata["resume"]["attempts"] == attempt
    gave_up = memobot.run(KEY, [], failpoints="before_llm")  # still armed: it must not try
    assert gave_up.returncode == 0, gave_up.describe()
    assert gave_up.stdout == GAVE_UP_TEXT.format(n=MAX_RESUME_ATTEMPTS) + "\n"
    assert llm.requests == []
    assert unfinished(memobot.session(KEY)) == {}

    fresh = memobot.run(KEY, [message_for("k", 2)])
    assert fresh.stdout == f"{answer_for('k', 2)}\n", fresh.describe()
    assert memobot.stdout_lines().count(GAVE_UP_TEXT.format(n=MAX_RESUME_ATTEMPTS)) == 1
    parse_session_files(memobot.state)
    session = memobot.session(KEY)
    assert unfinished(session) == {}
    assert history_problem(session.wire) is None


# --- 4. graceful stop ---------------------------------------------------------------------


def test_sigterm_lets_the_running_turn_finish(llm: FakeLLMThread, memobot: Memobot) -> None:
    set_rule(llm, turn_rule(delay=lambda tag, n: 1.5))
    text, answer = message_for("k", 1), answer_for("k", 1)
    run = memobot.start(KEY, [text], keep_stdin_open=True)  # it would wait for more input
    llm.wait_for_requests(1, timeout=15)
    sent = time.monotonic()
    run.proc.send_signal(signal.SIGTERM)
    assert run.wait(timeout=15) == 0, run.describe()
    assert 1.0 <= time.monotonic() - sent <= 6  # it waited for the answer, not for the drain
    assert run.stdout == f"{answer}\n"
    assert_answered_once(memobot, KEY, [text], [answer])


def test_sigterm_past_the_drain_keeps_the_turn_for_the_next_start(
    tmp_path: Path, llm: FakeLLMThread
) -> None:
    cfg = write_config(tmp_path, llm.base_url, gateway={"drainSeconds": 1})
    memobot = Memobot(tmp_path, cfg)
    text, answer = message_for("k", 1), answer_for("k", 1)
    normal = turn_rule(tool_for=exec_tool)
    # The tool runs, then the model hangs: the turn holds a tools_completed checkpoint.
    set_rule(llm, lambda msgs: hang() if current_turn(msgs)[2] else normal(msgs))
    try:
        run = memobot.start(KEY, [text], keep_stdin_open=True)
        llm.wait_for_requests(2, timeout=15)
        sent = time.monotonic()
        run.proc.send_signal(signal.SIGTERM)
        assert run.wait(timeout=10) == 0, run.describe()
        took = time.monotonic() - sent
        assert 0.9 <= took <= 4, took
        assert run.stdout == ""
        meta = memobot.session(KEY).metadata
        assert meta["pending"][0]["text"] == text
        assert meta["runtime_checkpoint"]["phase"] == "tools_completed"

        set_rule(llm, normal)
        after = memobot.run(KEY, [])
        assert after.stdout == f"{answer}\n", after.describe()
        assert exec_runs(tmp_path) == ["k-1"]
        assert_answered_once(memobot, KEY, [text], [answer])
    finally:
        memobot.kill_all()


# --- 6. random kills over long conversations --------------------------------------------------

# Each kill costs a memobot start (about a second of CPU): 20 in the suite keeps it within its
# time; MEMOBOT_CRASH_KILLS=200 python -m pytest tests/test_crash.py -k random runs a long one.
RANDOM_KILLS = int(os.environ.get("MEMOBOT_CRASH_KILLS", "20"))
MIN_TURNS = 30
SESSIONS = ("ra", "rb")  # two conversations side by side: half the wall time on two cores
WINDOW = 4  # lines given to one start, so a failpoint that never fires cannot run away
# Seen about once per 75 external kills; many more would mean "sending" marks outlive sends.
MAX_SENDING_WINDOW_LOSSES = 3
FAILPOINT_CHOICES = (
    "after_intake",
    "before_llm",
    "awaiting_tools",
    "tools_completed",
    "final_response",
    "before_delivery",
    "after_send",
    "mid_append",
)
GAVE_UP = GAVE_UP_TEXT.format(n=MAX_RESUME_ATTEMPTS)
GIVING_UP_LOG = "giving up on interrupted turn"  # bot.recovery's log line when it gives up


def random_tool(tag: str, n: int) -> tuple[str, dict[str, Any]] | None:
    if n % 3:
        return None
    if n % 6:
        return "write_file", {"path": f"notes/{tag}-{n}.txt", "content": f"note {n}"}
    return "exec", {"command": f"echo {tag}-{n} >> runs.log; sleep 0.1"}


def random_delay(tag: str, n: int) -> float:
    return 0.02 + 0.03 * (n * 7 % 4)


@dataclass
class Conversation:
    """One session driven through random kills, and what the person saw."""

    tag: str
    mb: Memobot
    rng: random.Random
    kills: collections.Counter[str] = field(default_factory=collections.Counter)
    landed: collections.Counter[str] = field(default_factory=collections.Counter)
    gave_up: list[str] = field(default_factory=list)
    # Messages memobot gave up on whose notice has not been printed (or dropped) yet: a start
    # may give up and be killed before the notice goes out; a later start sends it.
    given_up: collections.deque[str] = field(default_factory=collections.deque)
    # (message, how the start that marked its answer "sending" ended) for answers never printed
    dropped_in_flight: list[tuple[str, str]] = field(default_factory=list)

    @property
    def key(self) -> str:
        return f"cli:{self.tag}"

    def drive(self, kill_budget: int) -> None:
        """Start memobot again and again, each start killed at a random moment, until the
        budget is spent and at least MIN_TURNS messages were sent; then one clean start."""
        run: Run | None = None
        last_kind, last_pending = "", ""
        for _ in range(kill_budget * 3):
            session = self.mb.session(self.key)
            accepted = accepted_texts(session)
            # Only lines memobot never took are sent again: resending a taken one would be
            # a new message. What it took is always a prefix of the conversation.
            assert accepted == [message_for(self.tag, n) for n in range(1, len(accepted) + 1)]
            pending = session.metadata.get("pending") or []
            assert len(pending) <= 1, pending
            outbox = session.metadata.get("outbox") or []
            spent = sum(self.kills.values()) >= kill_budget
            last = max(MIN_TURNS, len(accepted)) if spent else len(accepted) + WINDOW
            lines = [message_for(self.tag, n) for n in range(len(accepted) + 1, last + 1)]
            if spent and not lines and not pending and not outbox:
                return
            # This start drops answers the last one marked "sending" (the chat may show them).
            for e in outbox:
                if e["state"] == "sending" and run and e["text"] not in run.stdout.splitlines():
                    if e["text"] == GAVE_UP:
                        about = self.given_up.popleft() if self.given_up else last_pending
                    else:
                        about = message_text(e["text"])
                    self.dropped_in_flight.append((about, last_kind))
            last_pending = pending[0]["text"] if pending else ""
            run, last_kind = self.clean_run(lines) if spent else self.random_run(lines)
            if GIVING_UP_LOG in run.stderr:  # recovery only ever resumes a pending message
                self.given_up.append(last_pending)
            for _ in range(run.stdout.splitlines().count(GAVE_UP)):
                self.gave_up.append(self.given_up.popleft() if self.given_up else last_pending)
            if run.killed:
                self.kills[last_kind] += 1
                if last_kind == "external":
                    self.landed[landing(self.mb.session(self.key))] += 1
            else:
                assert run.returncode == 0, run.describe()
        raise AssertionError(f"{self.tag}: no end after {kill_budget * 3} starts: {self.kills}")

    def clean_run(self, lines: list[str]) -> tuple[Run, str]:
        run = self.mb.start(self.key, lines)
        run.wait()
        return run, "clean"

    def random_run(self, lines: list[str]) -> tuple[Run, str]:
        """An external SIGKILL a random 0-300 ms after the start first wrote to its session,
        or a random failpoint on a random visit."""
        if self.rng.random() < 0.5:
            delay = self.rng.uniform(0, 0.3)
            path = self.mb.session(self.key).path
            size = path.stat().st_size if path.exists() else 0
            run = self.mb.start(self.key, lines)
            deadline = time.monotonic() + 15
            while run.returncode is None and time.monotonic() < deadline:
                if path.exists() and path.stat().st_size != size:
                    break
                time.sleep(0.005)
            time.sleep(delay)
            run.kill()
            return run, "external"
        name = self.rng.choice(FAILPOINT_CHOICES)
        nth = self.rng.randint(1, 6 if name == "mid_append" else 2)
        run = self.mb.start(self.key, lines, failpoints=f"{name}@{nth}")
        run.wait()
        return run, name

    def answers(self) -> dict[str, int]:
        """How many answers the person saw for each message, across every start."""
        printed = collections.Counter(self.mb.stdout_lines())
        texts = accepted_texts(self.mb.session(self.key))
        return {t: printed[answer_text(t)] + self.gave_up.count(t) for t in texts}

    def unexpected_lines(self) -> list[str]:
        texts = accepted_texts(self.mb.session(self.key))
        expected = {answer_text(t) for t in texts} | {GAVE_UP}
        return [line for line in self.mb.stdout_lines() if line not in expected]


def landing(session: Session) -> str:
    """Where in a turn a kill landed, judged by what it left on disk."""
    meta = session.metadata
    if session.truncate_at is not None:
        return "torn write"
    if any(e["state"] == "sending" for e in meta.get("outbox") or []):
        return "sending"
    if meta.get("outbox"):
        return "answer queued"
    if meta.get("runtime_checkpoint"):
        return meta["runtime_checkpoint"]["phase"]
    if meta.get("pending"):
        return "pending"
    return "between turns"


def answer_text(text: str) -> str:
    return text.replace("message", "answer", 1)


def message_text(text: str) -> str:
    return text.replace("answer", "message", 1)


def test_random_kills(tmp_path: Path, llm: FakeLLMThread) -> None:
    set_rule(llm, turn_rule(tool_for=random_tool, delay=random_delay))
    config = write_config(tmp_path, llm.base_url)
    rng = random.Random(1234)
    conversations = [
        Conversation(tag, Memobot(tmp_path, config, f"runs-{tag}"), random.Random(rng.random()))
        for tag in SESSIONS
    ]
    started = time.monotonic()
    try:
        with ThreadPoolExecutor(len(conversations)) as pool:
            budget = RANDOM_KILLS // len(conversations)
            for done in [pool.submit(c.drive, budget) for c in conversations]:
                done.result()
    finally:
        for c in conversations:
            c.mb.kill_all()
    elapsed = time.monotonic() - started

    parse_session_files(tmp_path / "state")
    answers = {t: n for c in conversations for t, n in c.answers().items()}
    duplicates = {t: n for t, n in answers.items() if n > 1}
    losses = [t for t, n in answers.items() if n == 0]
    dropped = [d for c in conversations for d in c.dropped_in_flight]
    # The one loss the ledger accepts by design (at most once): an external SIGKILL after the
    # answer was marked "sending" and before it was printed. The mark is written on the event
    # loop right before the print (its fsync follows), so this window is microseconds wide.
    in_window = [t for t in losses if (t, "external") in dropped]
    kinds = sum((c.kills for c in conversations), collections.Counter())
    tool_runs = collections.Counter(exec_runs(tmp_path))
    summary = (
        f"random crash run: {sum(kinds.values())} kills ({kinds['external']} external, landing "
        f"in {dict(sum((c.landed for c in conversations), collections.Counter()))}; failpoints "
        f"{ {k: n for k, n in kinds.items() if k != 'external'} }), "
        f"{sum(len(c.mb.runs) for c in conversations)} starts, {len(answers)} turns, "
        f"{sum(answers.values())} answers, duplicates={len(duplicates)}, losses={len(losses)} "
        f"(in the 'sending' window: {len(in_window)}), gave up after {MAX_RESUME_ATTEMPTS} "
        f"resumes={sum(len(c.gave_up) for c in conversations)}, exec tool runs="
        f"{sum(tool_runs.values())}, {elapsed:.1f} s"
    )
    print(f"\n{summary}")
    if in_window:
        print(f"answers lost in the at-most-once 'sending' window: {in_window}")
    problems = {
        "duplicates": duplicates,
        "losses outside the sending window": [t for t in losses if t not in in_window],
        "dropped after a failpoint": [d for d in dropped if d[1] != "external"],
        "unexpected lines": [line for c in conversations for line in c.unexpected_lines()],
    }
    assert sum(kinds.values()) == RANDOM_KILLS, summary
    assert not any(problems.values()), (summary, problems)
    assert len(in_window) <= MAX_SENDING_WINDOW_LOSSES, (summary, in_window)
    for c in conversations:
        session = c.mb.session(c.key)
        assert unfinished(session) == {}, (c.tag, unfinished(session))
        texts = [t for m in session.messages if (t := user_text(m)) is not None]
        assert texts == [message_for(c.tag, n) for n in range(1, len(texts) + 1)], summary
        assert len(texts) >= MIN_TURNS, summary
        assert history_problem(session.wire) is None, (c.tag, history_problem(session.wire))
    assert all(n == 1 for n in tool_runs.values()), tool_runs  # no tool ever ran twice
