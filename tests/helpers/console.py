"""A child process on a pseudo-terminal: what a person at a terminal sees and types."""

from __future__ import annotations

import os
import pty
import select
import signal
import time
from pathlib import Path

from tests.helpers import REPO


class Pty:
    """A child process on a pseudo-terminal: what a person at a terminal sees and types."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path = REPO) -> None:
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: become the command
            os.chdir(cwd)
            os.execve(argv[0], argv, env)
        self.out = b""

    def read_until(self, needle: str, timeout: float = 20) -> str:
        end = time.monotonic() + timeout
        while needle.encode() not in self.out:
            left = end - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{needle!r} never appeared; output so far:\n{self.text}")
            ready, _, _ = select.select([self.fd], [], [], left)
            if ready:
                try:
                    chunk = os.read(self.fd, 4096)
                except OSError:  # EIO: the child closed the terminal
                    chunk = b""
                if not chunk:
                    raise AssertionError(f"{needle!r} never appeared; output:\n{self.text}")
                self.out += chunk
        return self.text

    @property
    def text(self) -> str:
        return self.out.decode("utf-8", errors="replace")

    def send(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def wait(self, timeout: float = 20) -> int:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:  # keep draining so the child never blocks on a full terminal
                ready, _, _ = select.select([self.fd], [], [], 0.05)
                if ready:
                    self.out += os.read(self.fd, 4096)
            except OSError:
                pass
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                os.close(self.fd)
                return os.waitstatus_to_exitcode(status)
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        raise AssertionError(f"still running after {timeout} s; output:\n{self.text}")
