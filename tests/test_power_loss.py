"""Durability against a power cut: every confirmation to a platform waits for the fsync it needs.

A SIGKILL keeps the page cache, so the crash tests cannot see a missing fsync; a power cut
loses every write that was not fsynced. These tests record, in one ordered trace, every
``os.fsync`` (which file, how long it was) and every confirmation as the fake platform receives
it, then check for each confirmation that the session-file line it depends on lay inside the
part of the file already fsynced (and the file's folder entry too) when the platform got it:

- a Telegram ``getUpdates`` whose offset confirms an update: that message's pending record;
- a Slack Socket Mode ack of an envelope: that message's pending record;
- an answer reaching the platform: the outbox's "sending" mark for it (after a power cut a
  "queued" answer would be sent a second time);
- the ``/stop`` reply: the pending record of the turn it stops.

The real agent loop, channel manager, ledger and channels run in-process against the fakes;
the trace wraps ``os.fsync``/``os.fdatasync`` (what ``bot.session`` calls) and the fakes' own
request logs, nothing inside memobot.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bot.session import apply_changes
from bot.turn import STOPPED_TEXT
from channels.slack_channel.channel import SlackChannel
from tests.fakes.llm_server import FakeLLM, reply
from tests.fakes.slack_api import APP_TOKEN, BOT_TOKEN, FakeSlack
from tests.fakes.telegram_api import FakeBotAPI
from tests.helpers import (
    REPO,
    channel_in_process,
    config_dict,
    make_config,
    stop_gateway,
    telegram_in_process,
    zygote,
)

pytestmark = pytest.mark.timeout(60)

ALICE_TG = 1001
ALICE_SLACK = "U0ALICE01"
SLACK_DM = "D0DM00001"
SLOW_DISK = 0.03  # seconds each traced fsync takes


# --- the trace ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Event:
    kind: str  # "fsync" or the name of a confirmation
    path: str = ""  # fsync: the file or folder
    size: int = 0  # fsync: the file's length when it was synced
    is_dir: bool = False
    detail: Any = None  # confirmation: what the platform received


@dataclass
class Trace:
    """Everything that matters for a power cut, in the order it happened."""

    events: list[Event] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, event: Event) -> None:
        with self.lock:
            self.events.append(event)

    def confirmed(self, kind: str, detail: Any) -> None:
        self.add(Event(kind, detail=detail))

    def wrap_fsync(self, real: Callable[[int], None]) -> Callable[[int], None]:
        def traced(fd: int) -> None:
            real(fd)
            time.sleep(SLOW_DISK)  # a slow disk: an fsync racing a send loses every time
            info = os.fstat(fd)
            path = os.readlink(f"/proc/self/fd/{fd}")
            self.add(Event("fsync", path, info.st_size, stat.S_ISDIR(info.st_mode)))

        return traced

    def first(self, kind: str, match: Callable[[Any], bool]) -> int:
        """Index of the first ``kind`` event whose detail matches; AssertionError if none."""
        for i, e in enumerate(self.events):
            if e.kind == kind and match(e.detail):
                return i
        raise AssertionError(f"no {kind} event matched; trace: {self.events}")

    def durable_length(self, path: Path, before: int) -> int:
        """How many bytes of ``path`` a power cut just before event ``before`` would keep."""
        real = os.path.realpath(path)
        sizes = [e.size for e in self.events[:before] if e.kind == "fsync" and e.path == real]
        return max(sizes, default=0)

    def folder_synced(self, folder: Path, before: int) -> bool:
        real = os.path.realpath(folder)
        return any(e.kind == "fsync" and e.is_dir and e.path == real for e in self.events[:before])


@pytest.fixture
def trace(monkeypatch: pytest.MonkeyPatch) -> Iterator[Trace]:
    t = Trace()
    monkeypatch.setattr(os, "fsync", t.wrap_fsync(os.fsync))
    monkeypatch.setattr(os, "fdatasync", t.wrap_fsync(os.fdatasync))
    yield t


class TracedList(list[Any]):
    """A fake's request log that also puts each arrival into the trace."""

    def __init__(self, on_append: Callable[[Any], None]) -> None:
        super().__init__()
        self.on_append = on_append

    def append(self, item: Any) -> None:
        self.on_append(item)
        super().append(item)


def line_end(path: Path, match: Callable[[dict[str, Any]], bool], what: str) -> int:
    """Byte offset just past the first line of ``path`` that ``match`` accepts: a message, or
    for a metadata line the metadata as it stands after that line (a change record carries
    only what changed)."""
    offset = 0
    meta: dict[str, Any] = {}
    for raw in path.read_bytes().splitlines(keepends=True):
        offset += len(raw)
        record = json.loads(raw)
        if record.get("_type") == "metadata":
            if "changes" in record:
                meta = apply_changes(meta, record["changes"])
            else:
                meta = record.get("metadata") or {}
            record = {**record, "metadata": meta}
        if match(record):
            return offset
    raise AssertionError(f"{path.name} has no line with {what}")


def assert_durable_before(trace: Trace, index: int, path: Path, end: int, what: str) -> None:
    durable = trace.durable_length(path, index)
    assert durable >= end, (
        f"{what}: the platform was told while only {durable} of the {end} bytes of "
        f"{path.name} that hold it were fsynced; a power cut now loses it"
    )
    assert trace.folder_synced(path.parent, index), (
        f"{what}: the folder entry of the new file {path.name} was not fsynced yet"
    )


def pending_with(text: str) -> Callable[[dict[str, Any]], bool]:
    def match(record: dict[str, Any]) -> bool:
        pending = (record.get("metadata") or {}).get("pending") or []
        return any(text in (p.get("text") or "") for p in pending)

    return match


def sending(text: str) -> Callable[[dict[str, Any]], bool]:
    def match(record: dict[str, Any]) -> bool:
        outbox = (record.get("metadata") or {}).get("outbox") or []
        return any(e.get("state") == "sending" and e.get("text") == text for e in outbox)

    return match


def assert_send_was_marked(trace: Trace, kind: str, path: Path, text: str) -> None:
    """The answer ``text`` reached the platform only after its "sending" mark was durable."""
    index = trace.first(kind, lambda sent: text in sent)
    end = line_end(path, sending(text), f'a "sending" mark for {text!r}')
    assert_durable_before(trace, index, path, end, f"the answer {text!r}")


# --- Telegram -----------------------------------------------------------------------------


@asynccontextmanager
async def telegram(tmp_path: Path, trace: Trace) -> AsyncIterator[tuple[FakeBotAPI, FakeLLM]]:
    async with FakeLLM() as llm, FakeBotAPI() as api:

        def arrived(call: Any) -> None:
            if call.method == "getupdates" and call.params.get("offset") is not None:
                trace.confirmed("tg-offset", int(call.params["offset"]))
            elif call.method == "sendmessage":
                trace.confirmed("tg-send", str(call.params.get("text")))

        api._calls = TracedList(arrived)  # the fake logs every request here on arrival
        settings = {
            "enabled": True,
            "token": api.token,
            "baseUrl": api.base_url,
            "allowFrom": [str(ALICE_TG)],
            "pollTimeoutSeconds": 1,
        }
        cfg = make_config(tmp_path, llm.base_url, channels={"telegram": settings})
        async with telegram_in_process(cfg, tmp_path / "config.json"):
            yield api, llm


def tg_session(tmp_path: Path) -> Path:
    [path] = (tmp_path / "state" / "sessions").glob(f"telegram*{ALICE_TG}*.jsonl")
    return path


async def test_telegram_offset_waits_for_the_pending_fsync(tmp_path: Path, trace: Trace) -> None:
    async with telegram(tmp_path, trace) as (api, _llm):
        update_id = api.private_text("power cut please", user_id=ALICE_TG)
        await api.wait_sent_async(1)
        await api.wait_for_async(
            lambda: any((c.params.get("offset") or 0) > update_id for c in api.calls("getUpdates"))
        )
    path = tg_session(tmp_path)
    confirm = trace.first("tg-offset", lambda offset: offset > update_id)
    end = line_end(path, pending_with("power cut please"), "the pending record")
    assert_durable_before(trace, confirm, path, end, "the confirmed Telegram update")


async def test_answer_leaves_only_after_its_sending_mark_is_durable(
    tmp_path: Path, trace: Trace
) -> None:
    async with telegram(tmp_path, trace) as (api, _llm):
        api.private_text("mark it first", user_id=ALICE_TG)
        await api.wait_sent_async(1)
    assert_send_was_marked(trace, "tg-send", tg_session(tmp_path), "echo: mark it first")


async def test_stop_reply_waits_for_the_pending_record(tmp_path: Path, trace: Trace) -> None:
    async with telegram(tmp_path, trace) as (api, llm):
        llm.script(reply("too late", delay=5))
        api.private_text("a slow question", user_id=ALICE_TG)
        await _until(lambda: len(llm.requests) >= 1)
        api.private_text("/stop", user_id=ALICE_TG)
        await api.wait_for_async(
            lambda: any(STOPPED_TEXT == c.params.get("text") for c in api.calls("sendMessage"))
        )
    path = tg_session(tmp_path)
    ack = trace.first("tg-send", lambda text: text.startswith("Stopping"))
    end = line_end(path, pending_with("a slow question"), "the pending record")
    assert_durable_before(trace, ack, path, end, "the turn /stop acknowledged")


async def _until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:  # noqa: ASYNC109
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


# --- Slack --------------------------------------------------------------------------------


async def test_slack_ack_waits_for_the_fsync(tmp_path: Path, trace: Trace) -> None:
    async with FakeLLM() as llm, FakeSlack() as slack:
        slack.on_ack = lambda envelope_id: trace.confirmed("slack-ack", envelope_id)
        settings = {
            "enabled": True,
            "botToken": BOT_TOKEN,
            "appToken": APP_TOKEN,
            "apiUrl": slack.api_url,
            "allowFrom": [ALICE_SLACK],
        }
        cfg = make_config(tmp_path, llm.base_url, channels={"slack": settings})
        slack_cfg = cfg.channels.slack
        async with channel_in_process(
            cfg,
            tmp_path / "config.json",
            lambda stack: SlackChannel(
                stack.bus, slack_cfg, cfg.agent.workspace_path, cfg.agent.state_path
            ),
        ):
            await slack.wait_connected()
            ts = "1700000000.000100"
            event = {
                "type": "message",
                "channel": SLACK_DM,
                "channel_type": "im",
                "user": ALICE_SLACK,
                "text": "slack power cut",
                "ts": ts,
                "event_ts": ts,
                "client_msg_id": f"cm-{ts}",
            }
            envelope = await slack.push_event(event, "Ev0POWER01")
            await slack.wait_ack(envelope)
            await slack.wait_posts(1)
    [path] = (tmp_path / "state" / "sessions").glob("slack*.jsonl")
    ack = trace.first("slack-ack", lambda envelope_id: envelope_id == envelope)
    end = line_end(path, pending_with("slack power cut"), "the pending record")
    assert_durable_before(trace, ack, path, end, "the acknowledged Slack envelope")


# --- a kill inside the send window ----------------------------------------------------------


def test_kill_inside_the_send_window_never_sends_twice_and_says_so(tmp_path: Path) -> None:
    """SIGKILL while Telegram holds the answer's sendMessage: the request has left memobot, the
    reply never came back. By design the answer is delivered at most once: the next start
    finds it marked "sending", does not send it again, and logs that the chat may show it."""
    with FakeLLM.start_in_thread() as llm, FakeBotAPI.start_in_thread() as api:
        settings = {
            "enabled": True,
            "token": api.token,
            "baseUrl": api.base_url,
            "allowFrom": [str(ALICE_TG)],
            "pollTimeoutSeconds": 1,
        }
        config = tmp_path / "config.json"
        config.write_text(
            json.dumps(config_dict(tmp_path, llm.base_url, channels={"telegram": settings}))
        )
        answer = "echo: inside the window"
        api.fail("sendMessage", 0, delay=1.0, when=lambda p: p.get("text") == answer)
        first = _gateway(config)
        try:
            api.private_text("inside the window", user_id=ALICE_TG)
            api.wait_for(lambda: any(c.params.get("text") == answer for c in api.calls()), 20)
            first.send_signal(signal.SIGKILL)
            assert first.wait(10) == -signal.SIGKILL
            # Telegram finishes the held request on its side: the chat shows the answer.
            api.wait_for(lambda: _answers(api, answer) == 1, 5)
        finally:
            stop_gateway(first)
        second = _gateway(config)
        try:
            log = tmp_path / "gateway.log"
            wait_until_text(log, "not sending it again", 20)
            time.sleep(0.5)  # a second copy would have been sent by now
        finally:
            stop_gateway(second)
        assert second.returncode == 0, log.read_text()
        assert _answers(api, answer) == 1, [c.params for c in api.calls("sendMessage")]


def _answers(api: Any, text: str) -> int:
    return sum(c.params.get("text") == text and c.status == 200 for c in api.calls())


def wait_until_text(path: Path, text: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not (path.exists() and text in path.read_text(errors="replace")):
        assert time.monotonic() < deadline, f"{text!r} never logged:\n{path.read_text()}"
        time.sleep(0.05)


def _gateway(config: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ}
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "MEMOBOT_FAILPOINTS", "MEMOBOT_CONFIG"):
        env.pop(name, None)
    with open(config.parent / "gateway.log", "ab") as log:
        return zygote.popen(
            ["--config", str(config), "gateway"],
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
