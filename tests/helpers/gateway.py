"""A ``memobot gateway`` as a process of its own (forked from the suite's zygote), for the
tests whose point is a real process: a SIGKILL, a restart."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from tests.helpers import REPO, zygote


class Gateway:
    def __init__(self, config: Path, failpoints: str = "") -> None:
        env = {**os.environ, "MEMOBOT_FAILPOINTS": failpoints}
        for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "MEMOBOT_CONFIG"):
            env.pop(name, None)
        self.log = config.parent / "gateway.log"
        with open(self.log, "ab") as log:
            self.proc = zygote.popen(
                ["--config", str(config), "-v", "gateway"],
                cwd=REPO,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )

    def wait_running(self, timeout: float = 20) -> None:
        wait_log(self.log, "gateway running", timeout, self.proc)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)


def wait_log(path: Path, text: str, timeout: float, proc: Any = None, count: int = 1) -> None:
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text(errors="replace").count(text) >= count):
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"gateway exited {proc.returncode}:\n{path.read_text()}")
        assert time.monotonic() < deadline, f"{text!r} never logged:\n{path.read_text()}"
        time.sleep(0.05)
