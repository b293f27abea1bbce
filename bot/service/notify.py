"""The systemd notify protocol (sd_notify(3)), spoken directly: one datagram per message.

systemd passes ``NOTIFY_SOCKET`` (a Unix datagram socket path; a leading ``@`` means the abstract
namespace) to a ``Type=notify`` service and waits for ``READY=1``. ``WATCHDOG_USEC`` asks for a
``WATCHDOG=1`` ping at least that often; the pings are sent by a task on the event loop, so a
blocked loop misses them and systemd restarts the process. Without ``NOTIFY_SOCKET`` every call
here is a no-op, so the gateway behaves the same in a terminal.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Mapping, MutableMapping

log = logging.getLogger(__name__)

# What a child process (the exec tool's shell) must not inherit: with NotifyAccess=main systemd
# ignores its messages anyway, but a child's stray READY=1 or watchdog ping would be misleading.
NOTIFY_ENV = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")
# Stopping takes the drain, then up to 5 s for late turns and 10 s to flush queued replies, then
# the channels' disconnects: the unit's TimeoutStopSec and EXTEND_TIMEOUT_USEC leave this much.
STOP_MARGIN_SECONDS = 20.0


def stop_budget(drain_seconds: float) -> float:
    """Seconds a graceful stop may take with ``gateway.drainSeconds`` = ``drain_seconds``."""
    return drain_seconds + STOP_MARGIN_SECONDS


def socket_address(value: str) -> str | bytes | None:
    """The ``sendto`` address for a ``NOTIFY_SOCKET`` value; None when it is not a Unix socket."""
    if value.startswith("@"):
        return b"\0" + value[1:].encode()  # abstract namespace
    if value.startswith("/"):
        return value
    return None  # e.g. "vsock:CID:PORT" (systemd >= 253, VMs): not needed on a server


def watchdog_interval(env: Mapping[str, str], pid: int) -> float | None:
    """Seconds between pings: half of ``WATCHDOG_USEC``, as sd_watchdog_enabled(3) advises.

    None when no watchdog is asked for, or when ``WATCHDOG_PID`` names another process.
    """
    usec = env.get("WATCHDOG_USEC", "")
    if not usec.isdigit() or int(usec) == 0:
        return None
    owner = env.get("WATCHDOG_PID", "")
    if owner and owner != str(pid):
        return None
    return int(usec) / 2 / 1_000_000


class Notifier:
    """Sends sd_notify messages; every method is a no-op when there is no socket."""

    def __init__(self, notify_socket: str = "", watchdog_seconds: float | None = None) -> None:
        self.address = socket_address(notify_socket) if notify_socket else None
        if notify_socket and self.address is None:
            log.warning("NOTIFY_SOCKET=%s is not a Unix socket path: not notifying", notify_socket)
        self.watchdog_seconds = watchdog_seconds if self.address is not None else None
        self._sock: socket.socket | None = None
        self._failed = False
        self._last_status = ""

    @classmethod
    def from_env(cls, env: MutableMapping[str, str] | None = None) -> Notifier:
        """Read (and remove, see ``NOTIFY_ENV``) the variables systemd set for this process."""
        env = os.environ if env is None else env
        notifier = cls(env.get("NOTIFY_SOCKET", ""), watchdog_interval(env, os.getpid()))
        for name in NOTIFY_ENV:
            env.pop(name, None)
        return notifier

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def send(self, *fields: str) -> bool:
        """One datagram of ``KEY=value`` lines. Never blocks and never raises: a service
        manager that went away must not take the daemon down with it."""
        if self.address is None:
            return False
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                self._sock.setblocking(False)
            self._sock.sendto("\n".join(fields).encode(), self.address)
        except OSError as exc:
            if not self._failed:  # once: a dead socket would otherwise log every ping
                log.warning("cannot notify systemd at %r: %s", self.address, exc)
                self._failed = True
            return False
        self._failed = False
        return True

    def ready(self, status: str = "") -> None:
        self.send("READY=1", *([f"STATUS={status}"] if status else []))
        if status:
            self._last_status = status

    def status(self, text: str) -> None:
        """``STATUS=`` for ``systemctl status``; sent only when it changed."""
        if text != self._last_status and self.send(f"STATUS={text}"):
            self._last_status = text

    def reloading(self) -> None:
        # systemd >= 253 wants the monotonic time with RELOADING=1 to order it against READY=1.
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        self.send("RELOADING=1", f"MONOTONIC_USEC={usec}")

    def reloaded(self) -> None:
        self.send("READY=1")

    def stopping(self, status: str = "stopping") -> None:
        self.send("STOPPING=1", f"STATUS={status}")

    def extend_timeout(self, seconds: float) -> None:
        """Ask for ``seconds`` more than the configured start/stop timeout from now on."""
        self.send(f"EXTEND_TIMEOUT_USEC={int(seconds * 1_000_000)}")

    async def watchdog_forever(self) -> None:
        """Ping at half the watchdog interval, from the event loop, until cancelled."""
        if self.watchdog_seconds is None:
            return
        log.info("systemd watchdog: pinging every %.1f s", self.watchdog_seconds)
        while True:
            self.send("WATCHDOG=1")
            await asyncio.sleep(self.watchdog_seconds)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
