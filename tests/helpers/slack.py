"""The Slack side of the end-to-end tests: the people and their events, and a real
SlackChannel (slack-bolt and slack_sdk) with the real agent loop against the fake Slack and
the fake LLM."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from bot.app import AgentStack, build_agent
from bot.config import parse_config
from bot.session import apply_changes
from channels.manager import ChannelManager
from channels.slack_channel.channel import SlackChannel
from tests.fakes.llm_server import FakeLLM
from tests.fakes.slack_api import APP_TOKEN, BOT_TOKEN, BOT_USER_ID, FakeSlack
from tests.helpers import config_dict, request_messages, stop_agent

ALICE = "U0ALICE01"  # in allowFrom
MALLORY = "U0MALLORY"  # not in allowFrom
DM = "D0DM00001"
CHAN = "C0CHAN001"


def dm(text: str, ts: str, user: str = ALICE, **extra: Any) -> dict[str, Any]:
    return {
        "type": "message",
        "channel": DM,
        "channel_type": "im",
        "user": user,
        "text": text,
        "ts": ts,
        "event_ts": ts,
        "client_msg_id": f"cm-{ts}",
        **extra,
    }


def mention(text: str, ts: str, thread_ts: str | None = None, user: str = ALICE) -> dict[str, Any]:
    event = {
        "type": "app_mention",
        "channel": CHAN,
        "user": user,
        "text": f"<@{BOT_USER_ID}> {text}",
        "ts": ts,
        "event_ts": ts,
        "client_msg_id": f"cm-{ts}",
    }
    if thread_ts:
        event["thread_ts"] = thread_ts
    return event


def last_user_text(entry: dict[str, Any]) -> str:
    content = [m for m in request_messages(entry) if m["role"] == "user"][-1]["content"]
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content)
    return content


class Rig:
    """The agent, the channel manager and a real SlackChannel, wired as the gateway does."""

    def __init__(self, tmp_path: Path, llm: FakeLLM, slack: FakeSlack, **slack_cfg: Any) -> None:
        settings = {
            "enabled": True,
            "botToken": BOT_TOKEN,
            "appToken": APP_TOKEN,
            "apiUrl": slack.api_url,
            "allowFrom": [ALICE],
            # Off unless asked: these tests read the answers' chat.postMessage bodies (the
            # streaming ones are in test_streaming_slack.py).
            "streaming": False,
            **slack_cfg,
        }
        data = config_dict(tmp_path, llm.base_url, channels={"slack": settings})
        path = tmp_path / "config.json"
        path.write_text(json.dumps(data))
        self.cfg = parse_config(data)
        self.stack: AgentStack = build_agent(self.cfg, path)
        self.channel = SlackChannel(
            self.stack.bus,
            self.cfg.channels.slack,
            self.cfg.agent.workspace_path,
            self.cfg.agent.state_path,
        )
        self.manager = ChannelManager(self.stack.bus, self.stack.loop.ledger, [self.channel])
        self._loop_task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Rig:
        self.stack.loop.recover()
        self._loop_task = asyncio.create_task(self.stack.loop.run())
        await self.manager.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await stop_agent(self.stack, self._loop_task, self.manager)

    def session_file(self, chat_id: str) -> Path:
        return self.stack.store.path_for(f"slack:{chat_id}")

    def pending_entries(self, chat_id: str) -> list[dict[str, Any]]:
        """Every pending entry any metadata line of the session file ever listed, once each."""
        path = self.session_file(chat_id)
        entries: dict[str, dict[str, Any]] = {}
        if not path.exists():
            return []
        meta: dict[str, Any] = {}
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record.get("_type") == "metadata":  # a full record or a change record
                changes = record.get("changes")
                meta = apply_changes(meta, changes) if changes else record["metadata"]
                for p in meta.get("pending") or []:
                    entries.setdefault(p["id"], p)
        return list(entries.values())

    def pending_ids(self, chat_id: str) -> set[str]:
        return {p["id"] for p in self.pending_entries(chat_id)}


async def quiet(seconds: float = 0.3) -> None:
    """Give any unwanted extra answer the time to show up."""
    await asyncio.sleep(seconds)
