"""Pacing: the token bucket on its own, then through the real python-telegram-bot against the
fake Bot API (limits shortened by config so the tests run fast)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from bot.config import parse_config
from channels.pacing import Limit, Pacer, TokenBucket
from tests.fakes.llm_server import FakeLLM
from tests.fakes.telegram_api import BOT_USERNAME, FakeBotAPI, FloodControl, mention_entities
from tests.test_telegram import ALICE, GROUP, running

BOT = f"@{BOT_USERNAME}"


@pytest.fixture
async def llm() -> AsyncIterator[FakeLLM]:
    async with FakeLLM() as server:
        yield server


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


# -- through the Telegram channel ------------------------------------------------------------


def _alice(api: FakeBotAPI, text: str) -> dict[str, Any]:
    return api.message(text, chat=api.private_chat(ALICE), sender=api.user(ALICE))


def _in_group(api: FakeBotAPI, text: str) -> dict[str, Any]:
    entities = mention_entities(text, BOT_USERNAME)
    return api.message(text, chat=api.group_chat(GROUP), sender=api.user(ALICE), entities=entities)


def _times(calls: list[Any]) -> list[float]:
    return sorted(c.at for c in calls)


def _at_most_in_window(times: list[float], n: int, window: float, jitter: float = 0.03) -> bool:
    """No ``window`` seconds hold more than ``n`` of ``times`` (``jitter``: the share of the
    window that arrival times may be compressed by the event loop and the HTTP round trip)."""
    return all(times[i + n] - times[i] >= window * (1 - jitter) for i in range(len(times) - n))


async def test_ten_answers_to_one_chat_go_out_after_the_burst_at_the_chat_rate(tmp_path, llm):
    limits = {"chat": {"messages": 1, "perSeconds": 0.1, "burst": 3}}
    async with FakeBotAPI() as api, running(tmp_path, llm, api, rateLimits=limits):
        api.inject_many([_alice(api, f"m{i}") for i in range(10)])
        sent = await api.wait_sent_async(10, ALICE)
    assert [c.params["text"] for c in sent] == [f"echo: m{i}" for i in range(10)]  # in order
    times = _times(sent)
    # After the burst of 3: one per 0.1 s; a loop stall (two cores, the whole suite) may
    # compress arrivals by a quarter of the window, as in the tests below.
    assert _at_most_in_window(times, 3, 0.1, jitter=0.25)
    assert times[-1] - times[0] >= 0.65


async def test_forty_chats_at_once_stay_within_thirty_a_second(tmp_path, llm):
    async with FakeBotAPI() as api, running(tmp_path, llm, api, allowFrom=["*"]):
        api.inject_many(
            [
                api.message(f"hi {i}", chat=api.private_chat(5000 + i), sender=api.user(5000 + i))
                for i in range(40)
            ]
        )
        sent = await api.wait_sent_async(40)
    times = _times(sent)
    # 40 chats' answers race through one event loop, which the fake's clock shares: a stall
    # of the loop (the whole suite runs on two cores) compresses arrivals by a few intervals;
    # an unpaced burst puts all 40 within about 0.1 s, far inside this margin.
    assert _at_most_in_window(times, 30, 1.0, jitter=0.25)
    assert times[-1] - times[0] >= 1.2  # 40 at 30 a second


async def test_a_group_stays_within_its_per_minute_limit(tmp_path, llm):
    limits = {  # Telegram's 20 a minute, shortened; the per-chat rate out of the way
        "group": {"messages": 5, "perSeconds": 0.5},
        "chat": {"messages": 100, "perSeconds": 1, "burst": 10},
    }
    async with FakeBotAPI() as api, running(tmp_path, llm, api, rateLimits=limits):
        api.inject_many([_in_group(api, f"{BOT} g{i}") for i in range(10)])
        sent = await api.wait_sent_async(10, GROUP)
    assert [c.params["text"] for c in sent] == [f"echo: g{i}" for i in range(10)]
    # The fake shares the gateway's loop and clock: allow for a stall, as for forty chats.
    assert _at_most_in_window(_times(sent), 5, 0.5, jitter=0.25)


async def test_flood_wait_pauses_that_chat_only_and_the_queue_behind_goes_paced(tmp_path, llm):
    limits = {"chat": {"messages": 1, "perSeconds": 0.2, "burst": 3}}
    flood = FloodControl(chat=2, chat_window=0.2, fractional=True)  # ours: 3 at once
    async with (
        FakeBotAPI(flood=flood) as api,
        running(tmp_path, llm, api, rateLimits=limits, allowFrom=["*"]),
    ):
        api.fail("sendMessage", 429, retry_after=0.6, when=lambda p: p.get("chat_id") == ALICE)
        api.inject_many([_alice(api, f"m{i}") for i in range(5)])
        await api.wait_for_async(lambda: api.calls("sendMessage") != [])
        other = api.message("me too", chat=api.private_chat(7007), sender=api.user(7007))
        api.inject_many([other])
        [bob] = await api.wait_sent_async(1, 7007)
        sent = await api.wait_sent_async(5, ALICE)
    attempts = [c for c in api.calls("sendMessage") if c.params.get("chat_id") == ALICE]
    assert attempts[0].status == 429
    assert [c.params["text"] for c in sent] == [f"echo: m{i}" for i in range(5)]
    assert bob.at < sent[0].at  # the other chat was not held by this one's pause
    assert sent[0].at - attempts[0].at >= 0.6
    # After the pause: the steady rate, no burst (the fake's own rule is never hit either);
    # a quarter of the gap for arrival jitter, as in the tests above (a flush is 1 ms apart).
    times = _times(sent)
    assert _at_most_in_window(times, 1, 0.2, jitter=0.25), times
    assert api.flooded == 0
