"""Shared test plumbing: a config pointed at the fake LLM, and an in-process agent harness."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bot.app import AgentStack, build_agent
from bot.bus import InboundMessage, OutboundMessage
from bot.config import Config, load_config, parse_config
from channels.base import Channel
from channels.manager import ChannelManager
from tests.helpers import zygote

REPO = Path(__file__).resolve().parents[2]


PLATFORMS = ("telegram", "discord", "slack", "cli")


def readme_commands(platform: str) -> set[str]:
    """The in-chat commands docs/commands.md's "In-chat commands" lists for ``platform``, as
    written there: each bullet's commands (a bullet naming platforms, "(Telegram, Discord, Slack)",
    only for those); on Slack the ``!`` forms its paragraph lists, and ``/memobot``."""
    text = (REPO / "docs" / "commands.md").read_text(encoding="utf-8")
    section = text.split("\n## In-chat commands\n", 1)[1].split("\n## ", 1)[0]
    found: set[str] = set()
    for bullet in re.findall(r"^- (.*)$", section, re.MULTILINE):
        head = bullet.split(":", 1)[0]
        where = re.search(r"\(([^)]*)\)", head)
        if where is None or platform in where.group(1).lower().replace(" ", "").split(","):
            found.update(re.findall(r"`(/[a-z]+)", head))
    if platform != "slack":
        return found
    slack = section[section.index("On Slack") :]
    bangs = set(re.findall(r"`(![a-z]+)", slack))
    assert bangs == {"!" + c[1:] for c in found}, "docs/commands.md's Slack list differs"
    return bangs | set(re.findall(r"`(/memobot)\b", slack))


def listed_commands(help_text: str) -> set[str]:
    """The commands an answer to /help names (``/new``, ``!new``)."""
    return set(re.findall(r"(?<![\w/!])[/!][a-z]+\b", help_text))


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
        # Approvals have their own tests (test_approvals.py); elsewhere tools run unasked.
        "tools": {"exec": {"timeoutSeconds": 20}, "approval": "off"},
        # A test's gateway takes no fixed port of the machine; the panel's tests (test_web_*)
        # turn it on at a free one (tests.helpers.web.panel_section).
        "web": {"enabled": False},
    }
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    return data


def closed_port() -> int:
    """A port on 127.0.0.1 nothing listens on (bound for a moment to pick it, then freed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_config(tmp_path: Path, base_url: str, **sections: dict[str, Any]) -> Config:
    return parse_config(config_dict(tmp_path, base_url, **sections))


@asynccontextmanager
async def channel_in_process(
    cfg: Config, config_path: Path, make_channel: Callable[[AgentStack], Channel]
) -> AsyncIterator[tuple[AgentStack, Any, ChannelManager]]:
    """The agent loop, the channel manager and one real channel (``make_channel(stack)``) in
    this process, started and stopped in the gateway's order; yields (stack, channel, manager)."""
    stack = build_agent(cfg, config_path)
    channel = make_channel(stack)
    manager = ChannelManager(stack.bus, stack.loop.ledger, [channel])
    stack.loop.recover()
    loop_task = asyncio.create_task(stack.loop.run())
    await manager.start()
    try:
        yield stack, channel, manager
    finally:
        await stack.loop.shutdown(0)
        loop_task.cancel()
        await asyncio.gather(loop_task, return_exceptions=True)
        await manager.stop()
        await stack.close()


def telegram_in_process(
    cfg: Config, config_path: Path
) -> AbstractAsyncContextManager[tuple[AgentStack, Any, ChannelManager]]:
    """``channel_in_process`` with a real TelegramChannel against the fake Bot API in ``cfg``."""
    from channels.telegram_channel.channel import TelegramChannel

    return channel_in_process(
        cfg,
        config_path,
        lambda stack: TelegramChannel(
            stack.bus, cfg.channels.telegram, cfg.agent.workspace_path, cfg.agent.state_path
        ),
    )


def write_config(tmp_path: Path, base_url: str, **sections: dict[str, Any]) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config_dict(tmp_path, base_url, **sections)))
    return path


class RecordingChannel(Channel):
    """A chat platform stand-in that keeps what it was asked to send (our side of the seam)."""

    def __init__(self, harness: Harness, name: str) -> None:
        super().__init__(harness.stack.bus)
        self.name = name
        self.harness = harness

    async def send_chunk(
        self, msg: OutboundMessage, chunk: str, plain: bool = False, *, first: bool = False
    ) -> None:
        self.harness.outbox.append(msg)
        waiter = self.harness.waiters.get(msg.reply_to or "")
        if msg.final and waiter and not waiter.done():
            waiter.set_result(msg)


async def stop_agent(
    stack: AgentStack, loop_task: asyncio.Task[None] | None, manager: ChannelManager
) -> None:
    """Stop an in-process agent as the gateway does: drain the loop, then the channels."""
    await stack.loop.shutdown(0)
    if loop_task:
        loop_task.cancel()
        await asyncio.gather(loop_task, return_exceptions=True)
    await manager.stop()
    await stack.close()


class Harness:
    """Runs the real agent loop and channel manager in-process and collects what they send."""

    def __init__(self, cfg: Config, config_path: Path, channels: tuple[str, ...] = ("cli",)):
        self.cfg = cfg
        self.stack: AgentStack = build_agent(cfg, config_path)
        self.outbox: list[OutboundMessage] = []
        self.waiters: dict[str, asyncio.Future[OutboundMessage]] = {}
        self.manager = ChannelManager(
            self.stack.bus, self.stack.loop.ledger, [RecordingChannel(self, n) for n in channels]
        )
        self._loop_task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Harness:
        await self.manager.start()
        self.stack.loop.recover()
        self._loop_task = asyncio.create_task(self.stack.loop.run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        await stop_agent(self.stack, self._loop_task, self.manager)

    def expect(self, message_id: str) -> asyncio.Future[OutboundMessage]:
        fut: asyncio.Future[OutboundMessage] = asyncio.get_running_loop().create_future()
        self.waiters[message_id] = fut
        return fut

    async def send(
        self,
        text: str,
        chat: str = "t",
        channel: str = "cli",
        message_id: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> asyncio.Future[OutboundMessage]:
        """Publish a message; the returned future resolves to its final answer."""
        mid = message_id or uuid.uuid4().hex
        fut = self.expect(mid)
        verdict = await self.stack.bus.publish_inbound(
            InboundMessage(channel, chat, "user-1", text, message_id=mid, metadata=metadata or {})
        )
        if verdict != "accepted":
            fut.set_result(OutboundMessage(channel, chat, f"<{verdict}>", final=True))
        return fut

    async def ask(self, text: str, chat: str = "t", wait: float = 15) -> str:
        fut = await self.send(text, chat)
        return (await asyncio.wait_for(fut, wait)).text


def converse(config: Path, session: str, *texts: str) -> list[str]:
    """The answers to ``texts``, said one after another in the terminal session ``session``
    (``cli:NAME``) by the real agent loop run in this process against ``config``.

    Set-up for a test whose point is what a later ``memobot`` process makes of the state: it
    leaves the same session on disk as ``memobot agent -m TEXT -s SESSION`` runs would, without
    starting a process for each."""
    channel, _, chat = session.partition(":")
    assert channel == "cli" and chat, f"a terminal session is cli:NAME, not {session!r}"

    async def talk() -> list[str]:
        cfg, path = load_config(config)
        async with Harness(cfg, path) as harness:
            return [await harness.ask(text, chat, wait=30) for text in texts]

    return asyncio.run(talk())


def run_memobot(
    *args: str,
    config: Path | None = None,
    stdin: str | None = None,
    timeout: float = 60,
    env: dict[str, str] | None = None,
    fresh: bool = False,
) -> subprocess.CompletedProcess[str]:
    """``memobot ARGS`` as a process of its own (forked from the suite's pre-imported zygote
    unless ``fresh``: see :func:`tests.helpers.zygote.run`)."""
    full_env = {**os.environ, **(env or {})}
    full_env.pop("OPENAI_API_KEY", None)
    full_env.pop("OPENAI_BASE_URL", None)
    argv = ["--config", str(config)] if config is not None else []
    return zygote.run(
        [*argv, *args],
        input=stdin if stdin is not None else "",
        timeout=timeout,
        env=full_env,
        cwd=REPO,
        fresh=fresh,
    )


def request_messages(entry: dict[str, Any]) -> list[dict[str, Any]]:
    return entry["body"]["messages"]


# -- processes ---------------------------------------------------------------------------------


def alive(pid: int) -> bool:
    """A process that exists and is not a zombie (this container's init may not reap)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def sleepers(tag: str) -> list[int]:
    """Living ``sleep TAG`` processes (not the shell or launcher whose command mentions it)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            argv = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[:2] == [b"sleep", tag.encode()] and alive(int(name)):
            found.append(int(name))
    return found


def wait_for(predicate: Any, within: float = 10.0) -> bool:
    """Poll ``predicate`` every 50 ms until it is true (True) or ``within`` s pass (False)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def start_gateway(config: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """``memobot gateway`` as its own process, stderr appended to ``gateway.log`` beside the
    config; ``env`` adds to this process's environment (MEMOBOT_FAILPOINTS only if given)."""
    full_env = {**os.environ, **(env or {})}
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "MEMOBOT_FAILPOINTS"):
        if not env or name not in env:
            full_env.pop(name, None)
    return zygote.popen(
        ["--config", str(config), "gateway"],
        cwd=REPO,
        env=full_env,
        stdout=subprocess.DEVNULL,
        stderr=open(config.parent / "gateway.log", "ab"),  # the child keeps writing after we return
    )


def stop_gateway(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, as systemd stops it; SIGKILL if it is still there 20 s later."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


# -- the model ----------------------------------------------------------------------------------

# The outage settings that make a probe come quickly.
FAST_OUTAGE = {"probeMaxSeconds": 0.2, "maxWaitMinutes": 5}


def llm_settings(base_url: str, fallback_url: str | None = None, **extra: Any) -> dict[str, Any]:
    """The config's ``llm`` section for a primary model at ``base_url`` (and a fallback),
    retrying fast."""
    llm: dict[str, Any] = {
        "baseUrl": base_url,
        "apiKey": "test-key",
        "model": "primary-model",
        "retry": {"attempts": 2, "initialDelaySeconds": 0.01, "maxDelaySeconds": 0.05},
        "timeoutSeconds": 10,
        **extra,
    }
    if fallback_url:
        llm["fallbacks"] = [{"baseUrl": fallback_url, "model": "fallback-model"}]
    return llm


# -- the heartbeat -------------------------------------------------------------------------------


async def fire_heartbeat(harness: Harness, llm: Any, requests_before: int) -> dict[str, Any]:
    """Run the heartbeat once now, on a fake clock (one tick to plan it, one past its
    interval), against ``harness``'s real loop; the body of its request to the model."""
    from datetime import timedelta

    from bot.cron.scheduler import Scheduler
    from bot.cron.store import JobStore

    cfg = harness.cfg
    now = [datetime(2026, 3, 1, 8, 0, tzinfo=UTC)]
    stack = harness.stack
    sched = Scheduler(
        cfg, JobStore(cfg.agent.state_path), stack.bus, stack.store, {"telegram"},
        clock=lambda: now[0],
    )  # fmt: skip
    await sched.tick()
    now[0] += timedelta(minutes=cfg.heartbeat.interval_minutes + 1)
    await sched.tick()
    requests = await llm.wait_for_requests(requests_before + 1)
    return requests[requests_before]["body"]


class Clock:
    """A wall clock for the scheduler (``Scheduler(clock=...)``) that moves when a test sets
    ``now``."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


T0 = datetime(2026, 3, 1, 8, 0, tzinfo=UTC)  # a Sunday morning, for the scheduler tests


class VirtualClock:
    """A clock for ``ChannelManager.clock``: ``sleep`` moves it on at once (yielding to the
    loop), so retry and breaker times are asserted on virtual seconds, with no real wait."""

    def __init__(self) -> None:
        self.t = 0.0
        self.slept: list[float] = []

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.t += seconds
        await asyncio.sleep(0)


# A Markdown answer with a list and code, as streaming tests send it.
STREAMED_ANSWER = (
    "Here is **the plan** for today, step by step:\n\n"
    "1. Wake up and drink a glass of water before anything else.\n"
    "2. Walk for twenty minutes, whatever the weather says.\n"
    "3. Write the report, then send it to `team@example.org`."
)
# Quick Telegram previews for tests; Telegram's real per-chat pace is exercised in bench/.
TELEGRAM_FAST_PREVIEWS: dict[str, Any] = {
    "streamEditIntervalSeconds": 0.1,
    "rateLimits": {
        "chat": {"messages": 50, "perSeconds": 1, "burst": 5},
        "group": {"messages": 50, "perSeconds": 1},
    },
}
