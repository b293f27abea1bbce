"""The Discord side of the end-to-end tests: the people, and real discord.py (through the
channel factory, as the gateway builds it) with the real agent loop against the fake
Discord and the fake LLM."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bot.session import SessionStore
from channels.manager import ChannelManager
from channels.registry import create_channel
from tests.fakes.discord_api import BOT_USER, TOKEN, FakeDiscord, user
from tests.fakes.llm_server import FakeLLM
from tests.helpers import Harness, make_config

ALICE = user(1_300_000_000_000_000_042, "alice")
BOB = user(1_300_000_000_000_000_077, "bob")
OTHER_BOT = user(1_300_000_000_000_000_099, "otherbot", bot=True)
ALICE_DM = 1_400_000_000_000_000_042
BOB_DM = 1_400_000_000_000_000_077
MENTION = f"<@{BOT_USER['id']}>"
NO_PINGS = {"parse": [], "replied_user": False}


@asynccontextmanager
async def running_on(server: FakeDiscord) -> AsyncIterator[FakeDiscord]:
    """``server`` with discord.py pointed at it (for a fake built with non-default rules)."""
    with server.patch():
        yield server


async def until(predicate: Callable[[], Any], timeout: float = 10.0) -> None:  # noqa: ASYNC109
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        await asyncio.sleep(0.01)


@dataclass
class Bot:
    harness: Harness
    channel: Any  # DiscordChannel (imported through the factory, as the gateway does)
    api: FakeDiscord
    llm: FakeLLM
    tmp_path: Path

    async def answered(self, channel_id: int, n: int = 1) -> list[dict[str, Any]]:
        """The first ``n`` message bodies memobot posted to ``channel_id``."""
        return [c.body for c in await self.api.wait_posts(n, channel_id)][:n]

    def session(self, chat_id: int) -> list[dict[str, Any]]:
        return SessionStore(self.tmp_path / "state").get(f"discord:{chat_id}").messages


@asynccontextmanager
async def running(
    tmp_path: Path, llm: FakeLLM, api: FakeDiscord, **discord: Any
) -> AsyncIterator[Bot]:
    # Streaming off unless a test asks: these tests read the answers' POST bodies (the
    # streaming ones are in test_streaming_discord_slack.py).
    settings = {
        "enabled": True,
        "token": TOKEN,
        "allowFrom": [ALICE["id"]],
        "streaming": False,
        **discord,
    }
    cfg = make_config(tmp_path, llm.base_url, channels={"discord": settings})
    harness = Harness(cfg, tmp_path / "config.json", channels=())
    channel = create_channel("discord", harness.stack.bus, cfg)
    harness.manager = ChannelManager(harness.stack.bus, harness.stack.loop.ledger, [channel])
    async with harness:
        await until(lambda: channel.state == "connected")
        yield Bot(harness, channel, api, llm, tmp_path)


async def settle(bot: Bot, channel_id: int) -> None:
    """Send a message that is answered; everything injected before it has been handled."""
    before = len(bot.api.posts(channel_id))
    await bot.api.send_message(channel_id, ALICE, f"{MENTION} sync", mentions=[BOT_USER])
    await bot.api.wait_posts(before + 1, channel_id)
