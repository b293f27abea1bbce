"""Shared test plumbing: a config pointed at the fake LLM, and an in-process agent harness."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from bot.app import AgentStack, build_agent
from bot.bus import InboundMessage, OutboundMessage
from bot.config import Config, parse_config

REPO = Path(__file__).resolve().parents[1]


def config_dict(tmp_path: Path, base_url: str, **sections: dict[str, Any]) -> dict[str, Any]:
    data: dict[str, Any] = {
        "llm": {
            "baseUrl": base_url,
            "apiKey": "test-key",
            "model": "fake-model",
            "retry": {"attempts": 3, "initialDelaySeconds": 0.01, "maxDelaySeconds": 0.05},
            "timeoutSeconds": 10,
        },
        "agent": {"workspace": str(tmp_path / "ws"), "stateDir": str(tmp_path / "state")},
        "tools": {"exec": {"timeoutSeconds": 20}},
    }
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    return data


def make_config(tmp_path: Path, base_url: str, **sections: dict[str, Any]) -> Config:
    return parse_config(config_dict(tmp_path, base_url, **sections))


def write_config(tmp_path: Path, base_url: str, **sections: dict[str, Any]) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config_dict(tmp_path, base_url, **sections)))
    return path


class Harness:
    """Runs the real agent loop in-process and collects what it sends to chats."""

    def __init__(self, cfg: Config, config_path: Path) -> None:
        self.stack: AgentStack = build_agent(cfg, config_path)
        self.outbox: list[OutboundMessage] = []
        self._waiters: dict[str, asyncio.Future[OutboundMessage]] = {}
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> Harness:
        self._tasks = [
            asyncio.create_task(self.stack.loop.run()),
            asyncio.create_task(self._collect()),
        ]
        return self

    async def __aexit__(self, *exc: object) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.stack.close()

    async def _collect(self) -> None:
        while True:
            msg = await self.stack.bus.consume_outbound()
            self.outbox.append(msg)
            waiter = self._waiters.get(msg.reply_to or "")
            if msg.final and waiter and not waiter.done():
                waiter.set_result(msg)

    async def send(self, text: str, chat: str = "t", channel: str = "cli") -> asyncio.Future:
        """Publish a message; the returned future resolves to its final answer."""
        mid = uuid.uuid4().hex
        fut: asyncio.Future[OutboundMessage] = asyncio.get_running_loop().create_future()
        self._waiters[mid] = fut
        await self.stack.bus.publish_inbound(
            InboundMessage(channel, chat, "user-1", text, message_id=mid)
        )
        return fut

    async def ask(self, text: str, chat: str = "t", wait: float = 15) -> str:
        fut = await self.send(text, chat)
        return (await asyncio.wait_for(fut, wait)).text


def run_memobot(
    *args: str,
    config: Path | None = None,
    stdin: str | None = None,
    timeout: float = 60,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, **(env or {})}
    full_env.pop("OPENAI_API_KEY", None)
    full_env.pop("OPENAI_BASE_URL", None)
    cmd = [sys.executable, "-m", "bot"]
    if config is not None:
        cmd += ["--config", str(config)]
    return subprocess.run(
        [*cmd, *args],
        input=stdin if stdin is not None else "",
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        cwd=REPO,
    )


def request_messages(entry: dict[str, Any]) -> list[dict[str, Any]]:
    return entry["body"]["messages"]
