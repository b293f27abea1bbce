"""The Telegram side of the end-to-end tests: the people in the chats, and a real
TelegramChannel with the real agent loop against the fake Bot API and the fake LLM."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bot.app import AgentStack
from channels.manager import ChannelManager
from channels.telegram_channel.channel import TelegramChannel
from tests.fakes.llm_server import FakeLLM
from tests.fakes.telegram_api import BOT_USERNAME, FakeBotAPI
from tests.helpers import make_config, telegram_in_process

ALICE = 1001  # in allowFrom
MALLORY = 2002  # not in allowFrom
GROUP = -1001234
BOT = f"@{BOT_USERNAME}"


@dataclass
class Running:
    api: FakeBotAPI
    llm: FakeLLM
    stack: AgentStack
    channel: TelegramChannel
    manager: ChannelManager
    tmp: Path

    def user_texts(self) -> list[str]:
        """The last user line of every LLM request (the runtime block cut off)."""
        out = []
        for r in self.llm.requests:
            content = r["body"]["messages"][-1]["content"]
            if isinstance(content, list):
                content = content[0]["text"]
            out.append(content.split("\n\n[runtime context", 1)[0])
        return out

    async def handled(self, update_id: int) -> None:
        """Wait until ``update_id`` is confirmed: saved, and sent back as a getUpdates offset."""

        def confirmed() -> bool:
            polls = self.api.calls("getUpdates")
            return (self.channel.offset or 0) > update_id and any(
                (c.params.get("offset") or 0) > update_id for c in polls
            )

        await self.api.wait_for_async(confirmed)


def settings(api: Any, **extra: Any) -> dict[str, Any]:
    """``channels.telegram`` against the fake Bot API ``api``, Alice let in; ``extra`` over it."""
    return {
        "enabled": True,
        "token": api.token,
        "baseUrl": api.base_url,
        "allowFrom": [str(ALICE)],
        "pollTimeoutSeconds": 2,
        **extra,
    }


@asynccontextmanager
async def running(
    tmp_path: Path, llm: FakeLLM, api: FakeBotAPI, **telegram: Any
) -> AsyncIterator[Running]:
    section = {
        **settings(api),
        # Telegram's 20 a minute per group, shortened; pacing itself is in test_pacing.py.
        "rateLimits": {"group": {"messages": 20, "perSeconds": 1}},
        **telegram,
    }
    cfg = make_config(tmp_path, llm.base_url, channels={"telegram": section})
    async with telegram_in_process(cfg, tmp_path / "config.json") as (stack, channel, manager):
        yield Running(api, llm, stack, channel, manager, tmp_path)
