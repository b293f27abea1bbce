"""A pre-imported ``python -m bot`` that forks a fresh process per request (a zygote).

Most of a short ``memobot`` command's CPU is the interpreter importing the openai SDK, pydantic
and memobot itself (about 1 s of a 1.4 s ``agent -m`` under the suite's load). The suite runs
such commands a few hundred times; this server imports them once and forks a child per command.
The child is a real process with its own pid, argv, environment, working directory and the
caller's pipes as fds 0-2; it leaves the accept loop and runs ``bot/__main__.py`` as
``python -m bot`` would, so exit codes, atexit handlers and the end of the interpreter are the
ordinary ones (short of freeing every object, see :func:`_exit_as_python_would`); its standard
streams are made again for its own fds, as a fresh interpreter makes them (a pty's stdout is
line-buffered). What a child cannot differ in: modules already imported here (so tests about
start-up imports or cold start spawn a real interpreter instead).

The socket appears at its path once the server listens. Protocol, one connection per
command: the client sends a JSON request (argv, env, cwd) with its three fds; the server answers
one line with the child's pid, then one line with its wait status (as :func:`os.waitpid` gives
it) when it ends.

    python -m tests.helpers.zygote_server SOCKET_PATH
"""

from __future__ import annotations

import ctypes
import fcntl
import gc
import importlib
import io
import json
import os
import selectors
import signal
import socket
import sys
import termios
import threading
import time
from typing import Any

from tests.helpers import privileges

PR_SET_PDEATHSIG = 1
# Imported once here. A module that reads the environment when imported must be listed in
# REIMPORTED so a child sees its own environment.
PRELOADED = (
    "openai",
    "bot.cli",
    "bot.app",
    "bot.llm",
    "bot.loop",
    "bot.service.doctor",
    "bot.memory.commands",
    "bot.memory.versioning",
    "channels.terminal_channel.channel",
    "bot.gateway",
    "channels.telegram_channel.channel",
    "channels.discord_channel.channel",
    "channels.slack_channel.channel",
)
REIMPORTED = ("bot.failpoints",)


def serve(path: str) -> dict[str, Any]:
    """Accept requests until the parent goes away; returns only in a forked child, with its
    request, after fds 0-2 are the caller's and nothing of the server is left open."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(f"{path}.new")
    listener.listen(64)
    os.rename(f"{path}.new", path)  # there only once it listens: the clients wait for it
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, None)
    # pidfd -> (pid, connection that waits for the exit code)
    children: dict[int, tuple[int, socket.socket]] = {}
    while True:
        for key, _ in sel.select():
            if key.data is not None:  # a child ended
                pidfd = key.fd
                pid, conn = children.pop(pidfd)
                sel.unregister(pidfd)
                os.close(pidfd)
                _, status = os.waitpid(pid, 0)
                _send_line(conn, status)
                conn.close()
                continue
            conn, _ = listener.accept()
            fds: list[int] = []
            try:
                raw, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
                request = json.loads(raw)
            except (OSError, ValueError):  # a client gone before its request: the others go on
                for fd in fds:
                    os.close(fd)
                conn.close()
                continue
            assert threading.active_count() == 1, "the zygote must not fork with threads running"
            pid = os.fork()
            if pid == 0:
                sel.close()
                listener.close()
                for pidfd, (_, other) in children.items():
                    os.close(pidfd)
                    other.close()
                conn.close()
                for target, fd in enumerate(fds):
                    os.dup2(fd, target)
                    os.close(fd)
                return request
            for fd in fds:
                os.close(fd)
            pidfd = os.pidfd_open(pid)
            children[pidfd] = (pid, conn)
            sel.register(pidfd, selectors.EVENT_READ, "child")
            _send_line(conn, pid)


def _send_line(conn: socket.socket, value: int) -> None:
    try:
        conn.sendall(f"{value}\n".encode())
    except OSError:
        pass  # the caller gave up (timeout); the child was killed or runs out on its own


def become(request: dict[str, Any]) -> None:
    """Turn this forked child into ``python -m bot ARGV`` run in the request's directory and
    environment."""
    if request.get("terminal"):  # as pty.fork() makes a child: its own session, fd 0 its tty
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    os.chdir(request["cwd"])
    if request.get("umask") is not None:
        os.umask(request["umask"])
    if request.get("privileges"):
        privileges.drop(request["privileges"])
    os.environ.clear()
    os.environ.update(request["env"])
    time.tzset()  # the C library and the time module read TZ once; this child may have its own
    for name in REIMPORTED:
        importlib.reload(sys.modules[name])
    _standard_streams_again()
    import runpy

    sys.argv = ["-m", *request["argv"]]
    code: object = None
    try:
        runpy.run_module("bot", run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        code = stop.code  # out of the handler first: its traceback holds main()'s frames
    _exit_as_python_would(code)


def _exit_as_python_would(code: object) -> None:
    """What the interpreter does on exit, short of freeing every object: wait for the
    non-daemon threads, run the atexit handlers, flush stdout and stderr, exit with the
    status ``sys.exit(code)`` gives. Freeing the modules imported before the fork costs a
    child ~0.1 s of CPU (it writes to every page it shares with the server); no ``memobot``
    command depends on a finalizer at shutdown. Anything unusual (a stream that cannot be
    flushed, an exception) takes the ordinary way out instead."""
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:
        print(code, file=sys.stderr)
        status = 1
    try:
        threading._shutdown()  # type: ignore[attr-defined]  # as Py_Finalize does first
    except BaseException:
        raise SystemExit(status) from None  # (Ctrl-C while waiting) the ordinary way
    import atexit

    atexit._run_exitfuncs()
    # What the child made and dropped is collected as at the end of a fresh interpreter, so
    # "Exception ignored in ..." or an unflushed file's data shows as it would (the objects
    # imported before the fork are frozen: not walked).
    gc.collect()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        raise SystemExit(status) from None
    os._exit(status & 0xFF)


_STARTUP_STREAMS: list[Any] = []  # the server's own; kept so collecting them flushes nothing


def _standard_streams_again() -> None:
    """sys.stdin and sys.stdout as an interpreter started on this child's fds makes them.
    Python decides at start-up from what the fds are: a terminal's are line-buffered, a pipe's
    are not. The server's were made for its pipes; a child's may be a pty (stderr is
    line-buffered either way). Same encoding as the server's (the suite's environment)."""
    for fd, name in enumerate(("stdin", "stdout")):
        if not os.isatty(fd):
            continue  # made for a pipe or a file, as the server's are
        old = getattr(sys, name)
        _STARTUP_STREAMS.append(old)
        binary = open(fd, "rb" if fd == 0 else "wb", closefd=False)
        stream = io.TextIOWrapper(
            binary, encoding=old.encoding, errors=old.errors, newline="\n", line_buffering=True
        )
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def main() -> None:
    # Die with the pytest worker that started us; children run out on their own.
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    for name in (*PRELOADED, *REIMPORTED):
        importlib.import_module(name)
    llm = sys.modules["bot.llm"]
    llm._tls_context(*llm._ca_environment())  # the CA bundle loaded once, not per child
    # A child's garbage collector would otherwise walk every object imported here and so copy
    # every page it shares with the server: ~0.6 s of CPU per child, most of a short command.
    gc.collect()
    gc.freeze()
    request = serve(sys.argv[1])
    become(request)


if __name__ == "__main__":
    main()
