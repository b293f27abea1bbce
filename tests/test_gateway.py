"""memobot gateway as a real process: single instance, graceful stop, second Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.llm_server import FakeLLM, FakeLLMThread
from tests.helpers import REPO, run_memobot, write_config, zygote


@pytest.fixture
def llm() -> Iterator[FakeLLMThread]:
    with FakeLLM.start_in_thread() as server:
        yield server


def start_gateway(cfg: Path) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    return zygote.popen(
        ["--config", str(cfg), "gateway"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def wait_for_status(state: Path, proc: subprocess.Popen[str], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not (state / "gateway.json").exists():
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "gateway did not start"
        time.sleep(0.05)


def test_single_instance_and_graceful_stop(tmp_path: Path, llm: FakeLLMThread) -> None:
    cfg = write_config(tmp_path, llm.base_url)
    first = start_gateway(cfg)
    try:
        wait_for_status(tmp_path / "state", first)
        second = start_gateway(cfg)
        _, err = second.communicate(timeout=30)
        assert second.returncode == 1 and "already running" in err
        status = run_memobot("status", config=cfg, timeout=30)
        assert f"running (pid {first.pid})" in status.stdout
        assert "processes per command" in status.stdout
        assert "(in the running gateway)" in status.stdout  # its cgroup, not this shell's
        first.send_signal(signal.SIGTERM)
        _, err = first.communicate(timeout=30)
        assert first.returncode == 0, err
        assert "gateway stopped" in err
        assert not (tmp_path / "state" / "gateway.json").exists()
    finally:
        first.kill()


def test_status_says_when_a_live_gateways_snapshot_is_old(tmp_path: Path, capsys) -> None:
    from bot.cli import cmd_status
    from bot.gateway import STATUS_FILE, write_status
    from tests.helpers import make_config

    cfg = make_config(tmp_path, "http://127.0.0.1:9/v1")
    cfg.agent.state_path.mkdir(parents=True)
    snapshot = {"pid": os.getpid(), "updated_at": time.time() - 600, "channels": {}}
    write_status(cfg.agent.state_path / STATUS_FILE, snapshot)
    cmd_status(cfg, tmp_path / "config.json")
    out = capsys.readouterr().out
    assert f"running (pid {os.getpid()}), but its status was last written 10 min ago" in out
    write_status(cfg.agent.state_path / STATUS_FILE, {**snapshot, "updated_at": time.time()})
    cmd_status(cfg, tmp_path / "config.json")
    assert f"running (pid {os.getpid()})\n" in capsys.readouterr().out
