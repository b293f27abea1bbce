"""The gateway's side of running under systemd: readiness, status, watchdog, stop, reload.

Kept out of ``bot.gateway`` so the daemon's composition stays readable: the gateway calls one
method at each point of its life and this module says what systemd is told there.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from bot.config import Config, ConfigError, load_config
from bot.service.notify import Notifier, stop_budget
from bot.service.reload import ReloadResult, apply_config

if TYPE_CHECKING:
    from bot.gateway import Gateway

log = logging.getLogger(__name__)

# Channels connect in the background after start(); READY waits this long for each to say
# "connected" or "failed", so `systemctl start` returns with a meaningful state.
READY_WAIT_SECONDS = 10.0
READY_POLL_SECONDS = 0.1
_SETTLED = ("connected", "failed", "stopped")


class ServiceHooks:
    def __init__(self, gateway: Gateway, config_path: Path) -> None:
        self.gateway = gateway
        self.config_path = config_path
        self.notify = Notifier.from_env()

    def status_line(self) -> str:
        channels = self.gateway.platforms
        up = sum(c.state == "connected" for c in channels)
        answers = len(self.gateway.stack.loop.running_keys())
        head = f"{up}/{len(channels)} channels up" if channels else "no channels enabled"
        failed = [c.name for c in channels if c.state == "failed"]
        if failed:
            head += f" ({', '.join(failed)} failed: see memobot status)"
        line = f"{head}, {answers} answer{'' if answers == 1 else 's'} in progress"
        outage = self.gateway.stack.loop.outage
        return f"{line}; {outage.describe()}" if outage and outage.active else line

    async def started(self, stop: asyncio.Event) -> None:
        """After every channel's start() returned: wait briefly for them to settle, READY=1.

        A stop request ends the wait at once (READY=1 is still sent: systemd expects it
        before STOPPING=1)."""
        channels = self.gateway.channels
        # Channel states have no change event: poll, ten times a second, for seconds at most.
        for _ in range(int(READY_WAIT_SECONDS / READY_POLL_SECONDS)):
            if stop.is_set() or all(c.state in _SETTLED for c in channels):
                break
            await asyncio.sleep(READY_POLL_SECONDS)
        for c in channels:
            if c.state != "connected":
                detail = f": {c.state_detail}" if c.state_detail else ""
                log.warning("channel %s is %s at start-up%s", c.name, c.state, detail)
        self.notify.ready(self.status_line())

    def tick(self) -> None:
        self.notify.status(self.status_line())

    async def watchdog(self) -> None:
        await self.notify.watchdog_forever()

    def stopping(self, drain_seconds: float) -> None:
        """STOPPING=1, and room for the drain beyond a TimeoutStopSec= set too short."""
        answers = len(self.gateway.stack.loop.running_keys())
        self.notify.stopping(
            f"stopping: draining {answers} answer(s) for up to {drain_seconds:g} s"
        )
        self.notify.extend_timeout(stop_budget(drain_seconds))

    def reload(self) -> None:
        """SIGHUP: re-read the config file; a bad one is refused and the running one kept."""
        try:
            new, _ = load_config(self.config_path)
        except ConfigError as exc:
            log.error("config reload refused, the running config is kept: %s", exc)
            return
        self.apply(new)

    def apply(self, new: Config) -> ReloadResult:
        """Make the running gateway work with ``new`` (the file as it now loads): what can
        change live is applied, the rest is listed as needing a restart (and logged). SIGHUP
        and the panel's saves both come here."""
        self.notify.reloading()
        try:
            gw = self.gateway
            result = apply_config(gw.cfg, new, gw.stack, gw.channels)
        finally:
            self.notify.reloaded()
        if not result.applied and not result.restart_needed:
            log.info("config reloaded from %s: no changes", self.config_path)
        if result.applied:
            log.info("config reloaded, applied: %s", ", ".join(result.applied))
        if result.restart_needed:
            log.warning(
                "config reloaded, these changes need a restart (systemctl restart memobot): %s",
                ", ".join(result.restart_needed),
            )
        return result

    def close(self) -> None:
        self.notify.close()
