"""An API-enabled gateway in-process for the API's tests: keys, the running stack, clients."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import openai

from bot.config import load_config
from bot.gateway import Gateway
from bot.session import SessionStore
from tests.fakes.llm_server import FakeLLM
from tests.helpers import write_config
from tests.helpers.web import Browser, chatting, panel_section

KEY = "k-editor-0123456789abcdef"
GUEST_KEY = "k-guest-0123456789abcdefg"
OLD_KEY = "k-revoked-0123456789abcdef"
RUN_KEY = "k-runner-0123456789abcdefg"


def api_section(**extra: Any) -> dict[str, Any]:
    return {
        "enabled": True,
        "keys": [
            {"name": "editor", "key": KEY},
            {"name": "guest", "key": GUEST_KEY, "as": "telegram:42"},
            {"name": "old", "key": OLD_KEY, "revoked": True},
            {"name": "runner", "key": RUN_KEY, "approvals": "allow"},
        ],
        **extra,
    }


@asynccontextmanager
async def running(
    tmp_path: Path,
    *steps: Any,
    api: dict[str, Any] | None = None,
    budget: dict[str, Any] | None = None,
    telegram: dict[str, Any] | None = None,
    **tools: Any,
) -> AsyncIterator[tuple[FakeLLM, Gateway, Browser]]:
    async with FakeLLM() as llm:
        llm.script(*steps)
        section = {"enabled": False, "token": "1:x", "allowFrom": ["7", "42"], "admins": ["7"]}
        path = write_config(
            tmp_path,
            llm.base_url,
            web=panel_section(),
            api=api or api_section(),
            channels={"telegram": {**section, **(telegram or {})}},
            tools=tools,
            budget=budget or {},
        )
        cfg, _ = load_config(path)
        try:
            async with chatting(cfg, path) as (gateway, browser):
                yield llm, gateway, browser
        finally:
            # Closed while the loop runs: left to the collector, each logged "Event loop is
            # closed" with a traceback, which hid what the server itself logged.
            while CLIENTS:
                await CLIENTS.pop().close()


CLIENTS: list[openai.AsyncOpenAI] = []  # made by client(), closed when running() ends


def client(browser: Browser, key: str = KEY) -> openai.AsyncOpenAI:
    made = openai.AsyncOpenAI(base_url=f"{browser.base}/v1", api_key=key, max_retries=0, timeout=20)
    CLIENTS.append(made)
    return made


def user_texts(gateway: Gateway, key: str) -> list[str]:
    session = SessionStore(gateway.cfg.agent.state_path).get(key)
    return [
        str(m["content"]).split("\n\n[runtime context")[0]
        for m in session.messages
        if m.get("role") == "user"
    ]


def assistant_texts(gateway: Gateway, key: str) -> list[str]:
    session = SessionStore(gateway.cfg.agent.state_path).get(key)
    return [m["content"] for m in session.messages if m.get("role") == "assistant"]
