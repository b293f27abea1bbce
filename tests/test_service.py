"""memobot under systemd: the notify protocol, SIGHUP reload and log formats.

The gateway runs as a real process with ``NOTIFY_SOCKET`` pointing at a Unix datagram socket
the test binds, exactly as systemd would hand it over.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from bot.app import build_agent
from bot.service import logs
from bot.service.notify import Notifier, socket_address, stop_budget, watchdog_interval
from bot.service.reload import apply_config
from tests.fakes.llm_server import FakeLLM, FakeLLMThread
from tests.helpers import REPO, config_dict, make_config, write_config, zygote

DRAIN_SECONDS = 20.0


class NotifySocket:
    """What systemd listens on: a datagram socket; ``messages`` are the datagrams, in order."""

    def __init__(self, address: str) -> None:
        self.env_value = address
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(socket_address(address))
        self.messages: list[tuple[float, str]] = []

    def receive(self, timeout: float) -> str | None:
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(4096).decode()
        except TimeoutError:
            return None
        self.messages.append((time.monotonic(), data))
        return data

    def wait_for(self, field: str, timeout: float, proc: subprocess.Popen[str]) -> float:
        """Receive until a datagram carries ``field`` (a line such as "READY=1"); its time."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            data = self.receive(0.1)
            if data is not None and field in data.split("\n"):
                return self.messages[-1][0]
            assert proc.poll() is None or data is not None, f"gateway exited: {proc.returncode}"
        raise AssertionError(f"no {field} within {timeout} s; got {self.messages}")

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def llm() -> Iterator[FakeLLMThread]:
    with FakeLLM.start_in_thread() as server:
        yield server


@pytest.fixture
def notify_socket() -> Iterator[NotifySocket]:
    # A short folder: a socket path must fit in 108 bytes, pytest's tmp_path may not.
    with tempfile.TemporaryDirectory(prefix="mb-") as folder:
        sock = NotifySocket(os.path.join(folder, "notify"))
        yield sock
        sock.close()


def start_gateway(
    cfg: Path, tmp_path: Path, env: dict[str, str], *args: str
) -> tuple[subprocess.Popen[str], Path]:
    err = tmp_path / "gateway.err"
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    proc = zygote.popen(
        ["--config", str(cfg), *args, "gateway"],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=err.open("w"),
        text=True,
        env={**full_env, **env},
    )
    return proc, err


def wait_for_log(err: Path, text: str, timeout: float = 10) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        content = err.read_text()
        if text in content:
            return content
        time.sleep(0.05)
    raise AssertionError(f"{text!r} not logged within {timeout} s:\n{err.read_text()}")


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)


# -- the gateway process ---------------------------------------------------------------------


def test_ready_watchdog_stopping_and_clean_exit(
    tmp_path: Path, llm: FakeLLMThread, notify_socket: NotifySocket
) -> None:
    cfg = write_config(tmp_path, llm.base_url)
    env = {"NOTIFY_SOCKET": notify_socket.env_value, "WATCHDOG_USEC": "1000000"}
    proc, err = start_gateway(cfg, tmp_path, env)
    try:
        ready_at = notify_socket.wait_for("READY=1", 30, proc)
        ready = notify_socket.messages[-1][1]
        assert "STATUS=no channels enabled, 0 answers in progress" in ready.split("\n")
        # Half of WATCHDOG_USEC: a ping every 0.5 s, from the event loop.
        while time.monotonic() < ready_at + 1.5:
            notify_socket.receive(0.1)
        pings = [t for t, m in notify_socket.messages if m == "WATCHDOG=1" and t >= ready_at]
        assert len(pings) >= 2, notify_socket.messages
        proc.send_signal(signal.SIGTERM)
        stopping_at = notify_socket.wait_for("STOPPING=1", 10, proc)
        extend = notify_socket.wait_for(
            f"EXTEND_TIMEOUT_USEC={int(stop_budget(DRAIN_SECONDS) * 1_000_000)}", 5, proc
        )
        assert extend >= stopping_at
        assert proc.wait(DRAIN_SECONDS) == 0, err.read_text()
    finally:
        stop(proc)
    assert "gateway stopped" in err.read_text()


def test_abstract_socket_and_no_watchdog_for_another_pid(tmp_path: Path, llm: FakeLLMThread):
    sock = NotifySocket(f"@memobot-test-{uuid.uuid4().hex}")
    cfg = write_config(tmp_path, llm.base_url)
    # WATCHDOG_PID names another process: the pings are not ours to send.
    env = {"NOTIFY_SOCKET": sock.env_value, "WATCHDOG_USEC": "200000", "WATCHDOG_PID": "1"}
    proc, _ = start_gateway(cfg, tmp_path, env)
    try:
        ready_at = sock.wait_for("READY=1", 30, proc)
        while time.monotonic() < ready_at + 0.6:
            sock.receive(0.1)
        assert not [m for _, m in sock.messages if m == "WATCHDOG=1"]
    finally:
        stop(proc)
        sock.close()


def test_bad_config_exits_78_without_ready(tmp_path: Path, notify_socket: NotifySocket) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"llm": {"model": 5, "baseUrl": "http://127.0.0.1:9/v1"}}))
    proc, err = start_gateway(cfg, tmp_path, {"NOTIFY_SOCKET": notify_socket.env_value})
    try:
        assert proc.wait(30) == 78
    finally:
        stop(proc)
    assert "llm.model" in err.read_text()
    assert notify_socket.receive(0.2) is None


def test_sighup_applies_a_good_config_and_refuses_a_bad_one(
    tmp_path: Path, llm: FakeLLMThread, notify_socket: NotifySocket
) -> None:
    cfg = write_config(tmp_path, llm.base_url)
    proc, err = start_gateway(
        cfg, tmp_path, {"NOTIFY_SOCKET": notify_socket.env_value}, "--log-format", "json"
    )
    try:
        notify_socket.wait_for("READY=1", 30, proc)
        data = config_dict(tmp_path, llm.base_url)
        data["llm"]["model"] = "bigger-model"
        data["agent"]["maxToolIterations"] = 7
        # An endpoint: only at the next start ("/v1/" would be the same one: bot.urls).
        data["llm"]["baseUrl"] = llm.base_url.replace("127.0.0.1", "localhost")
        cfg.write_text(json.dumps(data))
        proc.send_signal(signal.SIGHUP)
        notify_socket.wait_for("RELOADING=1", 10, proc)
        notify_socket.wait_for("READY=1", 10, proc)
        wait_for_log(err, "need a restart")
        cfg.write_text('{"llm": {"model": ')  # half-written by an editor
        proc.send_signal(signal.SIGHUP)
        wait_for_log(err, "config reload refused")
        time.sleep(0.2)
        assert proc.poll() is None, "a bad config must not stop the gateway"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(DRAIN_SECONDS) == 0
    finally:
        stop(proc)
    records = [json.loads(line) for line in err.read_text().splitlines() if line.strip()]
    assert all({"time", "level", "logger", "message"} <= r.keys() for r in records)
    messages = {r["message"]: r for r in records}
    applied = next(m for m in messages if m.startswith("config reloaded, applied:"))
    assert "llm.model" in applied and "agent.maxToolIterations" in applied
    restart = next(m for m in messages if "need a restart" in m)
    assert "llm.baseUrl" in restart and messages[restart]["level"] == "warning"
    refused = next(m for m in messages if m.startswith("config reload refused"))
    assert "not valid JSON" in refused and messages[refused]["level"] == "error"


# -- reload, in process ----------------------------------------------------------------------


async def test_reload_updates_the_running_components(tmp_path: Path) -> None:
    live = make_config(tmp_path, "http://127.0.0.1:9/v1")
    stack = build_agent(live, tmp_path / "config.json")
    try:
        new = make_config(
            tmp_path,
            "http://127.0.0.1:9/v1",
            llm={"model": "m2", "temperature": 0.1, "apiKey": "other"},
            agent={"maxToolIterations": 3},
            memory={"maxChars": 900},
            channels={"telegram": {"allowFrom": ["42"]}},
        )
        result = apply_config(live, new, stack, channels=[])
        assert sorted(result.applied) == sorted(
            [
                "llm.model",
                "llm.temperature",
                "agent.maxToolIterations",
                "memory.maxChars",
                "channels.telegram.allowFrom",
            ]
        )
        assert result.restart_needed == ["llm.apiKey"]
        assert stack.provider.model == "m2" and stack.provider.cfg.temperature == 0.1
        assert stack.loop.runner.max_iterations == 3
        assert stack.loop.consolidator.cfg.max_chars == 900
        assert live.llm.api_key == "test-key"  # not half-applied
    finally:
        await stack.close()


# -- protocol and formats, in process --------------------------------------------------------


def test_notifier_is_a_noop_without_socket_and_clears_the_environment() -> None:
    env = {"NOTIFY_SOCKET": "", "WATCHDOG_USEC": "5000000"}
    notifier = Notifier.from_env(env)
    assert not notifier.enabled and notifier.watchdog_seconds is None
    assert not notifier.send("READY=1")
    env = {"NOTIFY_SOCKET": "/run/x", "WATCHDOG_USEC": "5000000", "WATCHDOG_PID": "1"}
    Notifier.from_env(env)
    assert env == {}  # the exec tool's commands must not inherit them


def test_protocol_details() -> None:
    assert socket_address("@name") == b"\0name"
    assert socket_address("/run/systemd/notify") == "/run/systemd/notify"
    assert socket_address("vsock:2:1234") is None
    assert watchdog_interval({"WATCHDOG_USEC": "60000000"}, 7) == 30.0
    assert watchdog_interval({"WATCHDOG_USEC": "60000000", "WATCHDOG_PID": "7"}, 7) == 30.0
    assert watchdog_interval({"WATCHDOG_USEC": "60000000", "WATCHDOG_PID": "8"}, 7) is None
    assert watchdog_interval({}, 7) is None


def test_notifier_survives_a_vanished_manager(tmp_path: Path) -> None:
    notifier = Notifier(str(tmp_path / "gone.sock"))
    assert not notifier.send("WATCHDOG=1")  # no exception: the daemon keeps running


def _record(message: str, level: int = logging.INFO) -> logging.LogRecord:
    return logging.LogRecord("bot.loop", level, __file__, 1, message, None, None)


def test_json_log_lines_carry_the_session() -> None:
    line = logs.JsonFormatter().format(_record("turn done session=telegram:42 in 1.2 s"))
    data = json.loads(line)
    assert data["session"] == "telegram:42" and data["level"] == "info"
    assert data["logger"] == "bot.loop" and data["time"].endswith("+00:00")
    assert "session" not in json.loads(logs.JsonFormatter().format(_record("no key here")))


def test_journal_format_drops_the_timestamp(monkeypatch: pytest.MonkeyPatch) -> None:
    st = os.fstat(sys.stderr.fileno())
    monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino}")
    formatter = logs.make_formatter("text")
    assert isinstance(formatter, logs.JournalFormatter)
    assert formatter.format(_record("slow", logging.WARNING)) == "<4>WARNING bot.loop: slow"
    monkeypatch.setenv("JOURNAL_STREAM", "1:2")  # someone else's stream: keep our timestamp
    assert not isinstance(logs.make_formatter("text"), logs.JournalFormatter)


def test_a_text_log_line_cannot_drive_the_terminal_or_forge_a_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A name or message quoted in a line (the model's, a stranger's) holding an ESC
    sequence, a CR or a line break: escaped, and its further lines indented."""
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    quoted = "x\x1b[2J\rINFO bot.gate: fine\n2026-12-06 18:00:00,000 ERROR bot.loop: forged"
    for formatter in (logs.make_formatter("text"), logs.JournalFormatter()):
        text = formatter.format(_record(f"tool {quoted} refused", logging.WARNING))
        assert "\x1b" not in text and "\r" not in text
        assert "x\\x1b[2J\\x0dINFO bot.gate: fine\n    2026-12-06 18:00:00,000 ERROR" in text
