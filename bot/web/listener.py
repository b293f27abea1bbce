"""The gateway's panel before anyone opens it: a bound socket and nothing else.

The panel's web server (aiohttp's, its screens, templates) costs about 2 MiB of memory once
imported. A gateway binds the panel's address at its start (so a taken port is said at once,
in one log line) and leaves the server unbuilt; the first connection to arrive builds it and
hands it the socket, whose backlog still holds that connection. A panel nobody opens costs a
socket: no import, no timer, no wakeup.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import socket
from pathlib import Path
from typing import TYPE_CHECKING

from bot.config import Config
from bot.web.addresses import parse_listen, served

if TYPE_CHECKING:
    from bot.gateway import Gateway
    from bot.web.server import Panel

log = logging.getLogger(__name__)


class DeferredPanel:
    """The panel of a running gateway, built at its first connection."""

    def __init__(self, cfg: Config, config_path: Path, gateway: Gateway) -> None:
        self.cfg = cfg
        self.config_path = config_path
        self.gateway = gateway
        self.base_url = served(cfg.web.listen, cfg.web.public_url).base_url
        self.panel: Panel | None = None  # once built
        self._sock: socket.socket | None = None
        self._waking: asyncio.Task[None] | None = None

    def start(self) -> str | None:
        """Bind and listen; None when listening, else why not (also logged, as one line)."""
        host, port = parse_listen(self.cfg.web.listen)
        try:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            sock = socket.create_server((host, port), family=family, backlog=128)
        except OSError as exc:
            why = (
                f"the web panel cannot listen on {self.cfg.web.listen}: "
                f"{exc.strerror or exc} (set web.listen to a free address, or web.enabled "
                "to false)"
            )
            log.error("%s; memobot runs on without it", why)
            return why
        sock.setblocking(False)
        self._sock = sock
        asyncio.get_running_loop().add_reader(sock.fileno(), self._knocked)
        log.info("web panel on %s (memobot web prints a login link)", self.base_url)
        return None

    def _knocked(self) -> None:
        assert self._sock is not None
        asyncio.get_running_loop().remove_reader(self._sock.fileno())
        self._waking = asyncio.create_task(self._build(self._sock), name="web-panel")

    async def _build(self, sock: socket.socket) -> None:
        try:
            # The import (aiohttp.web and the screens) in a thread: the loop keeps answering.
            server = await asyncio.to_thread(importlib.import_module, "bot.web.server")
            panel = server.Panel(self.cfg, self.config_path, in_gateway=True, gateway=self.gateway)
            why = await panel.start(sock)
        except Exception:
            log.exception("web panel: could not start serving; the gateway runs on without it")
            sock.close()
            return
        if why is None:
            self.panel = panel

    async def stop(self) -> None:
        if self._waking is not None:
            await asyncio.gather(self._waking, return_exceptions=True)
        if self.panel is not None:
            await self.panel.stop()
        elif self._sock is not None:
            asyncio.get_running_loop().remove_reader(self._sock.fileno())
            self._sock.close()
        self._sock = None
