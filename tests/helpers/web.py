"""The panel's side of the tests: a real panel server on 127.0.0.1 and a real HTTP client
that keeps its cookies, as a browser would (without the browser)."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from bot.config import Config
from bot.gateway import Gateway
from bot.web.limits import AttemptLimiter
from bot.web.server import Panel, login_url
from tests.helpers import closed_port, stop_agent

CSRF = re.compile(r'name="csrf" value="([^"]+)"')
PAGES = (  # every page of a logged-in browser
    "/",
    "/access",
    "/approvals",
    "/schedule",
    "/settings",
    "/settings/llm",
    "/settings/tools",
    "/settings/channels.telegram",
    "/settings/channels.slack",
    "/settings/web",
    "/settings/raw",
    "/memory",
    "/memory/file?path=USER.md",
    "/memory/edit?path=USER.md",
    "/memory/log",
    "/memory/archive",
    "/memory/search?q=memobot",
    "/chat",
    "/chat/notes",
    "/chats",
    "/chats?q=hello",
    "/logs",
    "/logs?level=DEBUG&session=telegram:1",
    "/tools",
    "/usage",
    "/usage?since=7d&until=today&by=model",
    "/tasks",
    "/tasks/view?id=abcd",  # a task the crawls' state folders hold (tests.helpers.web.seed_task)
)
PUBLIC_PAGES = ("/login", "/logged-out", "/expired", "/static/panel.css")


def seed_task(state_dir: Path) -> None:
    """The background task PAGES shows (``/tasks/view?id=abcd``): its record alone."""
    from bot.tasks import TaskRecord, TaskStore

    TaskStore(state_dir).put(TaskRecord("abcd", "telegram:1001", "1001", "crawl", started=1.0))


def panel_section(**extra: Any) -> dict[str, Any]:
    """The config's ``web`` section: the panel on, at a free port of 127.0.0.1."""
    return {"enabled": True, "listen": f"127.0.0.1:{closed_port()}", **extra}


@dataclass
class Browser:
    panel: Panel
    http: aiohttp.ClientSession

    @property
    def base(self) -> str:
        return self.panel.base_url

    def link(self) -> str:
        return login_url(self.base, self.panel.links.issue())

    async def login(self) -> None:
        async with self.http.get(self.link()) as r:
            assert r.status == 200, await r.text()

    async def get(self, path: str, **kw: Any) -> tuple[int, str, aiohttp.ClientResponse]:
        async with self.http.get(self.base + path, **kw) as r:
            return r.status, await r.text(), r

    async def csrf(self, path: str = "/access") -> str:
        _, text, _ = await self.get(path)
        found = CSRF.search(text)
        assert found, text
        return found.group(1)

    async def post(
        self, path: str, data: dict[str, str], *, origin: str | None = "own", **kw: Any
    ) -> tuple[int, str, aiohttp.ClientResponse]:
        headers = dict(kw.pop("headers", {}))
        if origin == "own":
            headers["Origin"] = self.base
        elif origin is not None:
            headers["Origin"] = origin
        async with self.http.post(
            self.base + path, data=data, headers=headers, allow_redirects=False, **kw
        ) as r:
            return r.status, await r.text(), r


@dataclass
class GatewayInProcess:
    """What a panel acts on in a running gateway (its live config, agent stack, channels and
    reload path: the real ``ServiceHooks``), over ``channel_in_process``'s stack and channel."""

    cfg: Config
    config_path: Path
    stack: Any
    channels: list[Any]

    def __post_init__(self) -> None:
        from bot.service.daemon import ServiceHooks

        self.service = ServiceHooks(self, self.config_path)  # type: ignore[arg-type]


@asynccontextmanager
async def chatting(cfg: Config, config_path: Path) -> AsyncIterator[tuple[Gateway, Browser]]:
    """A gateway's agent loop, channels (the panel's chat among them) and panel in this
    process, started and stopped in the gateway's order, and a browser's client of the panel;
    ``cfg`` must have the panel on (``panel_section``)."""
    gateway = Gateway(cfg, config_path)
    stack = gateway.stack
    stack.loop.recover(channels={c.name for c in gateway.channels})
    loop_task = asyncio.create_task(stack.loop.run())
    await gateway.manager.start()
    try:
        async with browsing(cfg, config_path, in_gateway=True, gateway=gateway) as browser:
            yield gateway, browser
    finally:
        await stop_agent(stack, loop_task, gateway.manager)


@asynccontextmanager
async def browsing(
    cfg: Config,
    config_path: Path,
    *,
    clock: Callable[[], float] = time.time,
    limiter: AttemptLimiter | None = None,
    in_gateway: bool = False,
    gateway: Any = None,
) -> AsyncIterator[Browser]:
    """A started panel over ``cfg`` and a cookie-keeping client (cookies of 127.0.0.1 too).
    ``gateway``: what the panel acts on live (a ``bot.gateway.Gateway``, or a stand-in with
    its ``stack`` and ``scheduler``); None as under ``memobot web`` alone."""
    panel = Panel(
        cfg,
        config_path,
        in_gateway=in_gateway or gateway is not None,
        gateway=gateway,
        clock=clock,
        limiter=limiter,
    )
    assert await panel.start() is None
    try:
        jar = aiohttp.CookieJar(unsafe=True)
        async with aiohttp.ClientSession(cookie_jar=jar) as http:
            yield Browser(panel, http)
    finally:
        await panel.stop()
