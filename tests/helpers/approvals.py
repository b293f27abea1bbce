"""Approvals end to end through Telegram: who may press what, a command the allow list never
matches, and a real TelegramChannel with approvals in "risky" mode."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bot.app import AgentStack
from tests.fakes.llm_server import FakeLLM
from tests.fakes.telegram_api import Call, FakeBotAPI
from tests.helpers import make_config, telegram_in_process

ALICE = 1001  # allowed, admin
BOB = 3003  # allowed, not an admin
CAROL = 5005  # allowed, not an admin
MALLORY = 4004  # not allowed
GROUP = -1001234
RISKY = "echo ran >> ran.txt"  # a redirection: never matched by the allow list
WAIT = 30.0  # seconds; generous: the machine running the suite may be busy


@dataclass
class Running:
    api: FakeBotAPI
    llm: FakeLLM
    stack: AgentStack
    tmp: Path

    @property
    def ran(self) -> int:
        path = self.tmp / "ws" / "ran.txt"
        return len(path.read_text().splitlines()) if path.exists() else 0

    async def request(self, chat: int = ALICE) -> Call:
        """The approval request that was sent to ``chat`` (the message with buttons)."""
        await self.api.wait_for_async(
            lambda: any(self.api.markup(c) for c in self.api.sent(chat)), WAIT
        )
        return [c for c in self.api.sent(chat) if self.api.markup(c)][-1]

    async def said(self, text: str, chat: int = ALICE) -> Call:
        await self.api.wait_for_async(
            lambda: any(text in c.params["text"] for c in self.api.sent(chat)), WAIT
        )
        return next(c for c in self.api.sent(chat) if text in c.params["text"])

    def tool_results(self) -> list[str]:
        """The tool results the model was given, in order."""
        return [
            str(m.get("content"))
            for r in self.llm.requests
            for m in r["body"]["messages"]
            if m.get("role") == "tool"
        ]


def settings(api: FakeBotAPI, **extra: Any) -> dict[str, Any]:
    return {
        "enabled": True,
        "token": api.token,
        "baseUrl": api.base_url,
        "allowFrom": [str(ALICE), str(BOB), str(CAROL)],
        "admins": [str(ALICE)],
        "pollTimeoutSeconds": 2,
        "rateLimits": {"group": {"messages": 20, "perSeconds": 1}},
        **extra,
    }


@asynccontextmanager
async def running(
    tmp_path: Path,
    llm: FakeLLM,
    api: FakeBotAPI,
    tools: dict[str, Any] | None = None,
    agent: dict[str, Any] | None = None,
    memory: dict[str, Any] | None = None,
    **tg: Any,
) -> AsyncIterator[Running]:
    cfg = make_config(
        tmp_path,
        llm.base_url,
        channels={"telegram": settings(api, **tg)},
        tools={"exec": {"timeoutSeconds": 20}, "approval": "risky", **(tools or {})},
        agent=agent or {},
        memory=memory or {},
    )
    async with telegram_in_process(cfg, tmp_path / "config.json") as (stack, _channel, _manager):
        yield Running(api, llm, stack, tmp_path)


def button_data(request: Call, choice: str) -> str:
    """The callback data of the ``choice`` button (allow, always, deny) of a question."""
    for row in FakeBotAPI.markup(request):
        for button in row:
            if button["callback_data"].endswith(f":{choice}"):
                return str(button["callback_data"])
    raise AssertionError(f"no {choice} button")
