"""``memobot gateway``: the daemon. Channels, the agent loop, Dream and recovery in one process.

Start order matters: interrupted turns are queued for recovery before any channel takes a new
message, so a session with a checkpoint is repaired before anything else touches it. Stop
order: intake closes, running turns drain (``gateway.drainSeconds``), queued answers are
flushed to the platforms, channels disconnect.

A channel that fails for good (token refused) shows as "failed" in ``memobot status``, the
systemd STATUS line and ``doctor``, while the others go on. When every enabled channel has
failed, nothing can work until the config is fixed: the gateway stops with one line per
channel saying what to fix, and exit status 78 (EX_CONFIG; the unit does not restart on it).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bot import durable, startup
from bot.config import EX_CONFIG, Config
from bot.cron import heartbeat
from bot.tasks import CHANNEL as TASK_CHANNEL

if TYPE_CHECKING:
    from bot.web.api import ApiServer
    from bot.web.listener import DeferredPanel

log = logging.getLogger(__name__)

STATUS_FILE = "gateway.json"
STATUS_EVERY_SECONDS = 5.0
# A live gateway's snapshot older than this: the gateway is stuck (or the pid is another
# process's now), and what the snapshot says is no longer known to be true.
STALE_AFTER_SECONDS = 6 * STATUS_EVERY_SECONDS


def enabled_channels(cfg: Config) -> list[str]:
    from channels import registry

    return [s.name for s in registry.enabled(cfg)]


def write_status(path: Path, data: dict[str, Any]) -> None:
    # It names the chats and their last activity: private, whatever the umask. A snapshot
    # rewritten every few seconds: not fsynced.
    durable.replace_file(path, json.dumps(data, indent=1), mode=0o600, sync=False)


def read_status(state_dir: Path) -> dict[str, Any] | None:
    """The running gateway's last status snapshot, if a live process wrote one."""
    data = _status_file(state_dir)
    if data is None:
        return None
    try:
        os.kill(int(data["pid"]), 0)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return data


def left_status(state_dir: Path) -> dict[str, Any] | None:
    """The snapshot a gateway left behind when it did not stop cleanly (killed, a power
    cut): its process is gone, so nothing in it is current. None when there is none."""
    data = _status_file(state_dir)
    if data is None or read_status(state_dir) is not None:
        return None
    return data


def status_age(data: dict[str, Any], now: float) -> float | None:
    """Seconds since ``data`` was written; None when it does not say."""
    at = data.get("updated_at")
    return now - at if isinstance(at, int | float) else None


def _status_file(state_dir: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((state_dir / STATUS_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


class GatewayLocked(RuntimeError):
    pass


class Gateway:
    def __init__(self, cfg: Config, config_path: Path) -> None:
        # The agent, the channels and the scheduler are imported here, not at the top:
        # `memobot status` reads the status file through this module and needs none of them.
        from bot.app import build_agent
        from bot.cron.scheduler import Scheduler
        from bot.cron.store import JobStore
        from bot.service.daemon import ServiceHooks
        from bot.service.log_ring import LogRing
        from channels import registry
        from channels.manager import ChannelManager

        self.cfg = cfg
        self.config_path = config_path
        self.stack = build_agent(cfg, config_path, wait_for_model=True)
        # The enabled platforms, and the panel's chat when the panel is on.
        self.channels = [s.build(self.stack.bus, cfg) for s in registry.gateway_channels(cfg)]
        self.manager = ChannelManager(self.stack.bus, self.stack.loop.ledger, self.channels)
        self.stack.usage.listeners.append(self._count_usage)
        self.scheduler = Scheduler(
            cfg,
            JobStore(cfg.agent.state_path),
            self.stack.bus,
            self.stack.store,
            {c.name for c in self.channels},
        )
        self.status_path = cfg.agent.state_path / STATUS_FILE
        self.started = time.time()
        self._stop = asyncio.Event()
        self._all_failed = False
        self.manager.on_all_failed = self._every_channel_failed
        self._interrupts = 0
        # Set when a channel's state changes: the status file is written at once, not at the
        # next tick (`memobot status` showed "starting" seconds after the channel connected).
        self._status_due = asyncio.Event()
        self.service = ServiceHooks(self, config_path)  # systemd notify, SIGHUP reload
        self.panel: DeferredPanel | None = None
        self.api_server: ApiServer | None = None  # the API alone, when the panel is off
        # The log's last lines for the panel (on the root logger while ``run`` runs).
        self.logs = LogRing()

    @property
    def platforms(self) -> list[Any]:
        """The chat platforms' channels (not the panel's chat)."""
        return [c for c in self.channels if c.platform]

    def status(self) -> dict[str, Any]:
        from bot.app import exec_limits_line

        return {
            "pid": os.getpid(),
            "started_at": self.started,
            "updated_at": time.time(),
            "channels": {c.name: c.status() for c in self.channels},
            "active_sessions": len(self.stack.loop.running_keys()),
            "cron": self.scheduler.snapshot(),
            "outage": self.stack.loop.outage.snapshot() if self.stack.loop.outage else None,
            "mcp": {
                st.name: {"state": st.state, "detail": st.detail, "tools": len(st.tools)}
                for st in self.stack.mcp.statuses()
            },
            # What holds in this process (its cgroup is the service's, not the shell's).
            "exec_limits": exec_limits_line(self.cfg, self.stack.gate),
            # Where the panel listens (memobot web's links), None when it does not.
            "web": self.panel.base_url if self.panel else None,
        }

    def _count_usage(self, rec: Any) -> None:
        for channel in self.channels:
            channel.count_usage(rec.session, rec.purpose, rec.prompt_tokens, rec.completion_tokens)

    def _every_channel_failed(self, channels: list[Any]) -> None:
        for c in channels:
            log.error("channel %s cannot work: %s", c.name, c.fatal)
        log.error("every enabled channel failed; stopping (exit status %d)", EX_CONFIG)
        self._all_failed = True
        self._stop.set()

    def request_stop(self, signum: int) -> None:
        if signum == signal.SIGINT:
            self._interrupts += 1
            if self._interrupts > 1:
                # Every write is a single append; stopping here tears at most one line, which
                # the next start recognises and cuts off.
                log.warning("second interrupt: exiting at once")
                os._exit(130)
        log.info("signal %s: stopping (drain up to %.0f s)", signum, self.cfg.gateway.drain_seconds)
        self._stop.set()

    def _lock(self) -> None:
        """One gateway per state folder: two would answer every message twice."""
        path = self.cfg.agent.state_path / "gateway.lock"
        self._lock_fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise GatewayLocked(
                f"another memobot gateway is already running with state folder "
                f"{self.cfg.agent.state_path} (lock {path})"
            ) from None

    async def run(self) -> int:
        from bot.pairing import announce_approvals, stores

        self._lock()
        logging.getLogger().addHandler(self.logs)
        aio = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            aio.add_signal_handler(sig, self.request_stop, sig)
        aio.add_signal_handler(signal.SIGHUP, self.service.reload)
        for channel in self.channels:
            # A channel may change state from an SDK's thread: the event is set in the loop.
            channel.on_state = lambda: aio.call_soon_threadsafe(self._status_due.set)
        watchdog_task = asyncio.create_task(self.service.watchdog(), name="watchdog")
        if not self.platforms:
            log.warning("no channel is enabled: set channels.<name>.enabled in the config")
        # The heartbeat's own session too: its answers go to a chat of a running channel.
        # Background tasks too: their reports go to the chats that started them.
        recovered = {c.name for c in self.channels} | {heartbeat.CHANNEL, TASK_CHANNEL}
        resumed = self.stack.loop.recover(channels=recovered)
        if resumed:
            log.info("resuming %d interrupted session(s)", resumed)
        loop_task = asyncio.create_task(self.stack.loop.run(schedule_dream=True), name="agent")
        self.stack.mcp.start()  # in the background: a slow server never delays the start
        await self.manager.start()
        self.stack.loop.resume_review()  # the channels are up: a question can be asked
        await self._start_panel()
        startup.started()
        # After recovery (a recorded occurrence is found as a duplicate) and the channels.
        self.scheduler.start()
        warm = asyncio.create_task(self.stack.provider.warm_up(), name="llm-warm-up")
        log.info(
            "gateway running: channels=%s model=%s",
            ",".join(c.name for c in self.channels) or "none",
            self.cfg.llm.model,
        )
        status_task = asyncio.create_task(self._write_status_forever(), name="status")
        heap_task = asyncio.create_task(_release_free_memory_forever(), name="heap-trim")
        # memory.embeddings: the archive embedded in the background, never on a turn's path.
        embed = self.stack.embeddings
        embed_task = asyncio.create_task(
            embed.run() if embed else asyncio.sleep(0), name="memory-embeddings"
        )
        pairing_task = asyncio.create_task(
            announce_approvals(
                stores(self.cfg.agent.state_path, [c.name for c in self.platforms]),
                self.stack.loop.announce_once,
            ),
            name="pairing-announcements",
        )
        try:
            await self.service.started(self._stop)
            await self._stop.wait()
        finally:
            self.service.stopping(self.cfg.gateway.drain_seconds)
            if self.panel is not None:
                await self.panel.stop()
            if self.api_server is not None:
                await self.api_server.stop()
            await self.scheduler.stop()  # nothing new is due once intake closes
            await self.stack.loop.shutdown(self.cfg.gateway.drain_seconds)
            await self.manager.flush(10)
            tasks = (loop_task, status_task, watchdog_task, warm, pairing_task, heap_task)
            tasks += (embed_task,)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.manager.stop()
            await self.stack.close()
            self.status_path.unlink(missing_ok=True)
            log.info("gateway stopped")
            logging.getLogger().removeHandler(self.logs)
        return EX_CONFIG if self._all_failed else 0

    async def _start_panel(self) -> None:
        """The control panel, unless web.enabled is false; an address it cannot have is one
        log line (Panel.start's), and the gateway runs on without it. The API is served by
        the panel, or alone on the panel's address when the panel is off."""
        if not self.cfg.web.enabled:
            if self.cfg.api.enabled:
                from bot.web.api import ApiServer

                api = ApiServer(self.cfg, self)
                if await api.start() is None:
                    self.api_server = api
            return
        from bot.web.listener import DeferredPanel

        panel = DeferredPanel(self.cfg, self.config_path, self)
        if panel.start() is None:
            self.panel = panel

    async def _write_status_forever(self) -> None:
        while True:
            try:
                await asyncio.to_thread(write_status, self.status_path, self.status())
            except OSError as exc:
                log.warning("cannot write %s: %s", self.status_path, exc)
            self.service.tick()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(STATUS_EVERY_SECONDS):
                    await self._status_due.wait()
            self._status_due.clear()


async def _release_free_memory_forever() -> None:
    from bot.service import heap

    while True:
        await asyncio.sleep(heap.TRIM_EVERY_SECONDS)
        if await asyncio.to_thread(heap.release_free_memory) is None:
            return  # not glibc: nothing to do, ever


async def run_gateway(cfg: Config, config_path: Path) -> int:
    try:
        return await Gateway(cfg, config_path).run()
    except GatewayLocked as exc:
        log.error("%s", exc)
        return 1
