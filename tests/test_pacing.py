"""Pacing: the token bucket on its own, then through the channel manager with Telegram's
buckets (``TelegramChannel.pace_limits`` from config), on a virtual clock: every send is
timed exactly where the manager makes it, so no assertion needs a tolerance."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from bot.bus import MessageBus, OutboundMessage
from bot.config import parse_config
from channels.errors import RetryAfter
from channels.manager import ChannelManager
from channels.pacing import Limit, Pacer, TokenBucket
from channels.telegram_channel.channel import TelegramChannel
from tests.fakes.clock import FakeClock
from tests.fakes.ledger import NoLedger

ALICE, BOB, GROUP = 1001, 7007, -1001234


# -- the bucket, pure ------------------------------------------------------------------------


def test_bucket_lets_the_burst_go_then_the_rate():
    b = TokenBucket(1, 1.0, 3, now=0.0)
    assert [b.reserve(0.0) for _ in range(5)] == [0.0, 0.0, 0.0, 1.0, 2.0]
    assert b.reserve(10.0) == 0.0  # refilled while idle, never beyond the burst
    assert [b.reserve(10.0) for _ in range(3)] == [0.0, 0.0, 1.0]


def test_bucket_hold_waits_then_paces_without_a_burst():
    b = TokenBucket(1, 1.0, 3, now=0.0)
    b.hold(5.0)
    assert b.reserve(1.0) == pytest.approx(4.0)  # nothing before the end of the hold
    assert b.reserve(1.0) == pytest.approx(5.0)  # then the steady rate, no burst of 3
    assert b.reserve(7.0) == pytest.approx(0.0)


def test_burst_one_never_puts_more_than_the_limit_in_a_window():
    b = TokenBucket(20, 60.0, 1, now=0.0)
    sends = sorted(t + b.reserve(t) for t in [0.0] * 50)
    assert all(sends[i + 20] - sends[i] >= 60.0 - 1e-9 for i in range(len(sends) - 20))


def test_pacer_keeps_buckets_apart_and_forgets_idle_ones(monkeypatch):
    monkeypatch.setattr("channels.pacing.SWEEP_EVERY", 5)
    pacer = Pacer()
    a, b = Limit("chat:1", 1, 1.0), Limit("chat:2", 1, 1.0)
    assert pacer.reserve(a, 0.0) == 0.0 and pacer.reserve(b, 0.0) == 0.0
    assert pacer.reserve(a, 0.0) == 1.0  # chat 1's wait does not touch chat 2's bucket
    pacer.hold([a, Limit("bot", 30, 1.0, shared=True)], 9.0, 0.0)
    assert "bot" not in pacer.buckets  # shared: a 429 in one chat does not hold it
    assert pacer.reserve(a, 0.0) == pytest.approx(9.0)  # held: one send at 9, no sooner
    pacer.reserve(b, 100.0)  # the 5th reservation sweeps: chat:1 is full again
    assert set(pacer.buckets) == {"chat:2"}


def test_previews_take_only_spare_tokens_and_never_push_an_answer_back():
    pacer = Pacer()
    chat, bot = Limit("chat:1", 1, 1.0, burst=3), Limit("bot", 2, 1.0, burst=3, shared=True)
    assert pacer.take_if_ready([chat, bot], 0.0) == 0.0  # a spare token in each: taken
    assert pacer.take_if_ready([chat, bot], 0.0) == 0.0
    # One token left in each: it is kept for the answer, so nothing is taken.
    wait = pacer.take_if_ready([chat, bot], 0.0)
    assert wait == pytest.approx(1.0)  # until every bucket has a spare one (the chat's, at 1 s)
    assert pacer.buckets["chat:1"].level == pytest.approx(1.0)  # no debt, the last one kept
    # The answer that ends the stream goes at once, on the token the previews left.
    assert pacer.reserve(chat, 0.0) == 0.0
    # An answer reserving next waits only for the refill, not behind any preview.
    assert pacer.reserve(chat, 0.0) == pytest.approx(1.0)
    # While the answer's debt stands, a preview finds no token.
    assert pacer.take_if_ready([chat], 0.5) > 0


def test_a_preview_may_take_the_only_token_of_a_bucket_of_one():
    # Burst 1 (Discord's 5 per 5 s, the bot's 28/s): keeping the token would mean no previews.
    pacer = Pacer()
    channel = Limit("channel:1", 5, 5.0)
    assert pacer.take_if_ready([channel], 0.0) == 0.0
    assert pacer.take_if_ready([channel], 0.0) == pytest.approx(1.0)


def test_rate_limits_are_config_with_the_platform_defaults():
    cfg = parse_config(
        {"channels": {"telegram": {"rateLimits": {"group": {"messages": 5, "perSeconds": 1}}}}}
    )
    tg = cfg.channels.telegram.rate_limits
    assert (tg.bot.messages, tg.bot.per_seconds) == (28, 1)
    assert (tg.chat.messages, tg.chat.per_seconds, tg.chat.burst) == (1, 1, 3)
    assert (tg.group.messages, tg.group.per_seconds, tg.group.burst) == (5, 1, 1)
    discord = cfg.channels.discord.rate_limits.channel
    assert (discord.messages, discord.per_seconds) == (5, 5)
    assert cfg.channels.slack.rate_limits.channel.messages == 1


# -- through the manager, with Telegram's buckets -----------------------------------------------


class _Telegram(TelegramChannel):
    """Telegram's buckets and rendering; sends are kept with the virtual time they went at
    (``refuse``: an exception to raise instead, once, for the sends it matches)."""

    def __init__(self, bus: MessageBus, clock: FakeClock, tmp_path: Path, limits: Any) -> None:
        cfg = parse_config({"channels": {"telegram": {"rateLimits": limits}}})
        super().__init__(bus, cfg.channels.telegram, tmp_path, tmp_path)
        self.clock = clock
        self.sent: list[tuple[float, str, str]] = []  # (time, chat, text)
        self.tried: list[tuple[float, str]] = []
        self.refuse: dict[str, Exception] = {}  # chat -> raised on its next send
        self.changed = asyncio.Event()

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def send_chunk(
        self, msg: OutboundMessage, chunk: str, plain: bool = False, *, first: bool = False
    ) -> None:
        self.tried.append((self.clock.now(), msg.chat_id))
        if (refusal := self.refuse.pop(msg.chat_id, None)) is not None:
            raise refusal
        self.sent.append((self.clock.now(), msg.chat_id, chunk))
        self.changed.set()

    async def wait_sent(self, n: int, chat: int | None = None) -> list[tuple[float, str]]:
        """The first ``n`` sends (to ``chat``) as (time, text), once there are that many."""
        while len(picked := self._sent_to(chat)) < n:
            self.changed.clear()
            await self.changed.wait()
        return picked[:n]

    def _sent_to(self, chat: int | None) -> list[tuple[float, str]]:
        return [(t, text) for t, c, text in self.sent if chat is None or c == str(chat)]


@asynccontextmanager
async def _manager(tmp_path: Path, limits: dict[str, Any]) -> AsyncIterator[_Telegram]:
    bus, clock = MessageBus(), FakeClock()
    channel = _Telegram(bus, clock, tmp_path, limits)
    manager = ChannelManager(bus, NoLedger(), [channel], clock=clock)  # type: ignore[arg-type]
    await manager.start()
    try:
        async with asyncio.timeout(30):  # real seconds: a hang fails, it does not stall
            yield channel
    finally:
        await manager.stop()


async def _answer(channel: _Telegram, chat: int, text: str) -> None:
    await channel.bus.publish_outbound(OutboundMessage("telegram", str(chat), text, final=True))


def _at_most_in_window(times: list[float], n: int, window: float) -> bool:
    """No ``window`` seconds hold more than ``n`` of ``times`` (exact times; 1e-9 is float
    rounding, not a tolerance)."""
    times = sorted(times)
    return all(times[i + n] - times[i] >= window - 1e-9 for i in range(len(times) - n))


async def test_ten_answers_to_one_chat_go_out_after_the_burst_at_the_chat_rate(tmp_path):
    limits = {"chat": {"messages": 1, "perSeconds": 0.1, "burst": 3}}
    async with _manager(tmp_path, limits) as tg:
        for i in range(10):
            await _answer(tg, ALICE, f"m{i}")
        sent = await tg.wait_sent(10, ALICE)
    assert [text for _, text in sent] == [f"m{i}" for i in range(10)]  # in order
    times = [t for t, _ in sent]
    # The burst of 3 at once (the bot's 28 a second spaces even those), then one per 0.1 s.
    assert times[:3] == pytest.approx([0, 1 / 28, 2 / 28])
    assert _at_most_in_window(times, 3, 0.1)
    assert times[-1] == pytest.approx(0.7)  # 7 after the burst, at 0.1 s each


async def test_forty_chats_at_once_stay_within_thirty_a_second(tmp_path):
    async with _manager(tmp_path, {}) as tg:
        for i in range(40):
            await _answer(tg, 5000 + i, f"hi {i}")
        sent = await tg.wait_sent(40)
    times = [t for t, _ in sent]
    assert _at_most_in_window(times, 30, 1.0)
    assert max(times) == pytest.approx(39 / 28)  # the bot's 28 a second, one after another


async def test_a_group_stays_within_its_per_minute_limit(tmp_path):
    limits = {  # Telegram's 20 a minute, shortened; the per-chat rate out of the way
        "group": {"messages": 5, "perSeconds": 0.5},
        "chat": {"messages": 100, "perSeconds": 1, "burst": 10},
    }
    async with _manager(tmp_path, limits) as tg:
        for i in range(10):
            await _answer(tg, GROUP, f"g{i}")
        sent = await tg.wait_sent(10, GROUP)
    assert [text for _, text in sent] == [f"g{i}" for i in range(10)]
    assert _at_most_in_window([t for t, _ in sent], 5, 0.5)
    assert sent[-1][0] == pytest.approx(0.9)  # one per 0.1 s (5 per 0.5 s, no burst)


async def test_flood_wait_pauses_that_chat_only_and_the_queue_behind_goes_paced(tmp_path):
    limits = {"chat": {"messages": 1, "perSeconds": 0.2, "burst": 3}}
    async with _manager(tmp_path, limits) as tg:
        tg.refuse[str(ALICE)] = RetryAfter(0.6)
        for i in range(5):
            await _answer(tg, ALICE, f"m{i}")
        await _answer(tg, BOB, "me too")
        [(bob_at, _)] = await tg.wait_sent(1, BOB)
        sent = await tg.wait_sent(5, ALICE)
    refused_at = tg.tried[0][0]
    assert [text for _, text in sent] == [f"m{i}" for i in range(5)]
    assert bob_at < sent[0][0]  # the other chat was not held by this one's pause
    assert sent[0][0] - refused_at >= 0.6  # the wait asked for (and its margin)
    # After the pause: the steady rate, no burst.
    assert _at_most_in_window([t for t, _ in sent], 1, 0.2)
