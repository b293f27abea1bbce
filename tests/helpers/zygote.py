"""``python -m bot ARGS`` as :func:`subprocess.run` does it, forked from a pre-imported server.

See :mod:`tests.helpers.zygote_server` for why and what differs from a fresh interpreter. One
server per pytest process, started on first use, gone with it. ``MEMOBOT_TEST_EXEC=1`` runs every
command in a fresh interpreter instead (to rule the zygote out when a test behaves oddly).
"""

from __future__ import annotations

import atexit
import fcntl
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import termios
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tests.helpers import privileges

REPO = Path(__file__).resolve().parents[2]
_lock = threading.Lock()
_server: tuple[subprocess.Popen[bytes], str] | None = None


SHARED = "MEMOBOT_TEST_ZYGOTE"  # "PID:SOCKET" of the one server every xdist worker uses


def start_shared() -> None:
    """Start the run's one server, in the xdist controller before its workers start (they
    inherit its socket's path): a server per worker imported memobot six times over, ~3.5 s
    of CPU each. It dies with the controller."""
    if os.environ.get("MEMOBOT_TEST_EXEC") == "1" or SHARED in os.environ:
        return
    proc, path = _start()
    atexit.register(_stop, proc, path)
    os.environ[SHARED] = f"{proc.pid}:{path}"


def _start() -> tuple[subprocess.Popen[bytes], str]:
    folder = tempfile.mkdtemp(prefix="memobot-zygote-")
    path = os.path.join(folder, "sock")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.zygote_server", path],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        cwd=REPO,
        env={k: v for k, v in os.environ.items() if k != "MEMOBOT_FAILPOINTS"},
    )
    return proc, path


def _stop(proc: subprocess.Popen[bytes], path: str) -> None:
    proc.kill()
    proc.wait()
    shutil.rmtree(os.path.dirname(path), ignore_errors=True)


def _socket_path() -> str:
    """The server's socket, once it listens (it appears at its path only then)."""
    shared = os.environ.get(SHARED)
    if shared:
        from tests.helpers import alive  # (not at the top: tests.helpers imports this module)

        pid, _, path = shared.partition(":")
        if _wait_for(path, lambda: alive(int(pid))):
            return path
        os.environ.pop(SHARED, None)  # it died: this process starts its own, as without it
    with _lock:
        global _server
        if _server is None or _server[0].poll() is not None:
            proc, path = _start()
            if not _wait_for(path, lambda: proc.poll() is None):
                raise RuntimeError(f"the test zygote did not start at {path} (see stderr above)")
            atexit.register(_stop, proc, path)
            _server = (proc, path)
        return _server[1]


def _wait_for(path: str, running: Callable[[], bool]) -> bool:
    """True once the server listens at ``path``; False if it ended first (or took a minute)."""
    deadline = time.monotonic() + 60
    while not os.path.exists(path):
        if not running() or time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return running()


def run(
    argv: list[str],
    *,
    input: str = "",
    stdin: int | None = None,
    env: dict[str, str],
    cwd: Path | str = REPO,
    timeout: float,
    umask: int | None = None,
    privileges: dict[str, Any] | None = None,
    fresh: bool = False,
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run([python, "-m", "bot", *argv], input=..., capture_output=True,
    text=True, timeout=..., env=..., cwd=...)``; on timeout the child is killed and
    :class:`subprocess.TimeoutExpired` raised, as subprocess.run does. ``stdin``: a file
    descriptor (or ``subprocess.DEVNULL``) instead of a pipe carrying ``input``; ``umask``:
    the child's; ``privileges``: dropped before the child runs (see
    :func:`tests.helpers.privileges.drop`).

    ``fresh`` execs a new interpreter, for a test whose point needs one: what the kernel shows
    of the process (``/proc/PID/environ`` is the environment it was exec'd with, which a forked
    child cannot change), or what a cold start imports."""
    if fresh or os.environ.get("MEMOBOT_TEST_EXEC") == "1":
        return subprocess.run(
            [sys.executable, "-m", "bot", *argv],
            input=input if stdin is None else None,
            stdin=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            cwd=cwd,
            preexec_fn=None
            if umask is None and not privileges
            else _prepare_for(umask, privileges),
        )
    if stdin is None:
        stdin_r, stdin_w = os.pipe()
    elif stdin == subprocess.DEVNULL:
        stdin_r, stdin_w = os.open(os.devnull, os.O_RDONLY), -1
    else:  # the caller's own descriptor, theirs to close
        stdin_r, stdin_w = os.dup(stdin), -1
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        conn, pid = _fork(argv, env, cwd, (stdin_r, out_w, err_w), umask, privileges=privileges)
    finally:
        for fd in (stdin_r, out_w, err_w):
            os.close(fd)
    conn.settimeout(timeout)
    replies = conn.makefile("rb")
    try:
        data = input.encode() if stdin_w != -1 else b""
        out, err = _communicate(data, stdin_w, out_r, err_r, timeout)
        code = os.waitstatus_to_exitcode(int(replies.readline()))
    except (subprocess.TimeoutExpired, TimeoutError):
        os.kill(pid, signal.SIGKILL)
        raise subprocess.TimeoutExpired([sys.executable, "-m", "bot", *argv], timeout) from None
    finally:
        replies.close()
        conn.close()
    return subprocess.CompletedProcess(
        [sys.executable, "-m", "bot", *argv], code, out.decode(), err.decode()
    )


def _prepare_for(umask: int | None, drop: dict[str, Any] | None) -> Callable[[], None]:
    """A fresh interpreter's ``preexec_fn``: what a forked child does before it runs."""

    def prepare() -> None:
        if umask is not None:
            os.umask(umask)
        if drop:
            privileges.drop(drop)

    return prepare


def popen(
    argv: list[str], *, fresh: bool = False, terminal: bool = False, **kwargs: Any
) -> subprocess.Popen[Any]:
    """``subprocess.Popen([python, "-m", "bot", *argv], **kwargs)``: a process the caller can
    poll, wait for, signal and SIGKILL, forked from the zygote unless ``fresh`` (``umask``
    is honoured; ``preexec_fn`` and ``pass_fds`` are refused). ``terminal``: stdin is a pty's
    slave, made the controlling terminal of the child's own session (as ``pty.fork`` does)."""
    argv = [sys.executable, "-m", "bot", *argv]
    if fresh or os.environ.get("MEMOBOT_TEST_EXEC") == "1":
        if terminal:
            kwargs["preexec_fn"] = _take_terminal
        return subprocess.Popen(argv, **kwargs)
    return _Forked(argv, terminal=terminal, **kwargs)


def _take_terminal() -> None:
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def _fork(
    argv: list[str],
    env: Mapping[str, str],
    cwd: Path | str,
    fds: tuple[int, int, int],
    umask: int | None = None,
    terminal: bool = False,
    privileges: dict[str, Any] | None = None,
) -> tuple[socket.socket, int]:
    """Ask the zygote for a child running ``python -m bot ARGV`` on ``fds`` as its 0, 1, 2
    (``terminal``: in a session of its own whose controlling terminal is fd 0, a pty's slave);
    returns the connection that will carry its wait status, and its pid."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(_socket_path())
        request = {
            "argv": argv, "env": dict(env), "cwd": str(cwd), "umask": umask, "terminal": terminal,
            "privileges": privileges,
        }  # fmt: skip
        socket.send_fds(conn, [json.dumps(request).encode()], list(fds))
        pid = b""
        while not pid.endswith(b"\n"):
            chunk = conn.recv(1)
            if not chunk:
                raise RuntimeError("the test zygote closed the connection before forking")
            pid += chunk
    except BaseException:
        conn.close()
        raise
    return conn, int(pid)


class _Forked(subprocess.Popen[Any]):
    """Popen whose child comes from the zygote: the child is not ours to waitpid, so its wait
    status comes over the zygote's connection instead; everything else is Popen's."""

    _conn: socket.socket
    _pending: bytes

    def __init__(self, args: list[str], *, terminal: bool = False, **kwargs: Any) -> None:
        self._terminal = terminal
        super().__init__(args, **kwargs)

    def _execute_child(  # type: ignore[override]
        self, args: list[str], executable: Any, preexec_fn: Any, close_fds: bool,
        pass_fds: Any, cwd: Any, env: Any, startupinfo: Any, creationflags: int, shell: bool,
        p2cread: int, p2cwrite: int, c2pread: int, c2pwrite: int, errread: int, errwrite: int,
        *rest: Any,
    ) -> None:  # fmt: skip
        if preexec_fn is not None or pass_fds or shell:
            raise ValueError("a forked memobot takes no preexec_fn, pass_fds or shell")
        umask = rest[4]  # Popen's umask argument (-1: the caller's)
        fds = (
            p2cread if p2cread != -1 else 0,
            c2pwrite if c2pwrite != -1 else 1,
            errwrite if errwrite != -1 else 2,
        )
        try:
            self._conn, self.pid = _fork(
                list(args)[3:],
                env if env is not None else os.environ,
                cwd or os.getcwd(),
                fds,
                None if umask == -1 else umask,
                self._terminal,
            )
            self._pending = b""
            self._child_created = True
        finally:
            self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)

    def _status(self, block: bool) -> int | None:
        while b"\n" not in self._pending:
            self._conn.setblocking(block)
            try:
                chunk = self._conn.recv(64)
            except BlockingIOError:
                return None
            if not chunk:  # the zygote died: the status is lost, the child may live on
                return signal.SIGKILL
            self._pending += chunk
        self._conn.close()
        return int(self._pending)

    def _try_wait(self, wait_flags: int) -> tuple[int, int]:
        status = self._status(block=not wait_flags & os.WNOHANG)
        return (0, 0) if status is None else (self.pid, status)

    def _internal_poll(self, _deadstate: int | None = None, **_: Any) -> int | None:
        if self.returncode is None and self._waitpid_lock.acquire(False):
            try:
                if self.returncode is None:
                    pid, status = self._try_wait(os.WNOHANG)
                    if pid:
                        self._handle_exitstatus(status)
            finally:
                self._waitpid_lock.release()
        return self.returncode


def _communicate(
    data: bytes, stdin_w: int, out_r: int, err_r: int, timeout: float
) -> tuple[bytes, bytes]:
    """Write ``data`` to the child's stdin and read its stdout and stderr to their ends."""
    deadline = time.monotonic() + timeout
    chunks: dict[int, list[bytes]] = {out_r: [], err_r: []}
    sel = selectors.DefaultSelector()
    pending = memoryview(data)
    if pending:
        os.set_blocking(stdin_w, False)
        sel.register(stdin_w, selectors.EVENT_WRITE)
    elif stdin_w != -1:  # -1: the child reads /dev/null
        os.close(stdin_w)
    for fd in chunks:
        sel.register(fd, selectors.EVENT_READ)
    try:
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired("memobot", timeout)
            for key, _ in sel.select(left):
                if key.fd == stdin_w:
                    try:
                        pending = pending[os.write(stdin_w, pending[:65536]) :]
                    except BrokenPipeError:
                        pending = pending[:0]
                    if not pending:
                        sel.unregister(stdin_w)
                        os.close(stdin_w)
                    continue
                chunk = os.read(key.fd, 65536)
                if chunk:
                    chunks[key.fd].append(chunk)
                else:
                    sel.unregister(key.fd)
    finally:
        for key in list(sel.get_map().values()):
            sel.unregister(key.fd)
            if key.fd == stdin_w:
                os.close(stdin_w)
        sel.close()
        os.close(out_r)
        os.close(err_r)
    return b"".join(chunks[out_r]), b"".join(chunks[err_r])
