"""A child process on a pseudo-terminal: what a person at a terminal sees and types."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.helpers import REPO, zygote


class Pty:
    """A child process on a pseudo-terminal: what a person at a terminal sees and types."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path = REPO) -> None:
        """``argv``: ``[sys.executable, "-m", "bot", ...]`` (forked from the suite's zygote,
        on the terminal as ``pty.fork`` puts a child) or any other command (exec'd)."""
        self.out = b""
        self.proc: subprocess.Popen[bytes] | None = None
        if argv[:3] == [sys.executable, "-m", "bot"]:
            self.fd, slave = pty.openpty()
            try:
                self.proc = zygote.popen(
                    argv[3:], terminal=True, stdin=slave, stdout=slave, stderr=slave,
                    env=env, cwd=cwd,
                )  # fmt: skip
            finally:
                os.close(slave)
            self.pid = self.proc.pid
            return
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: become the command
            os.chdir(cwd)
            os.execve(argv[0], argv, env)

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
            if (code := self._ended()) is not None:
                os.close(self.fd)
                return code
        os.kill(self.pid, signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait()
        else:
            os.waitpid(self.pid, 0)
        raise AssertionError(f"still running after {timeout} s; output:\n{self.text}")

    def _ended(self) -> int | None:
        """The exit code, once the child has ended."""
        if self.proc is not None:
            return self.proc.poll()
        pid, status = os.waitpid(self.pid, os.WNOHANG)
        return os.waitstatus_to_exitcode(status) if pid else None
