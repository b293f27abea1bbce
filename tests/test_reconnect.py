"""The one reconnect policy (channels.retry.Reconnect) every channel and MCP server uses, on a
virtual clock: python-telegram-bot's network loop, in our error vocabulary."""

from __future__ import annotations

import pytest

from channels.errors import FatalChannelError, RetryAfter, TransientError
from channels.retry import RETRY_AFTER_MARGIN, Reconnect
from tests.helpers import VirtualClock


async def test_backoff_grows_by_half_up_to_thirty_seconds_and_starts_afresh():
    clock = VirtualClock()
    reconnect = Reconnect(clock)
    for _ in range(12):
        assert await reconnect.pause(OSError("connection refused"))
    assert clock.slept[:4] == [1.0, 1.5, 2.25, 3.375]
    assert max(clock.slept) == 30.0 and clock.slept[-1] == 30.0
    reconnect.succeeded()
    assert reconnect.wait_after(TransientError("502")) == 1.0


async def test_flood_control_waits_what_the_platform_asked_plus_a_little():
    clock = VirtualClock()
    reconnect = Reconnect(clock)
    assert await reconnect.pause(RetryAfter(7))
    assert clock.slept == [pytest.approx(7 + RETRY_AFTER_MARGIN)]
    # The platform's own wait does not grow the backoff.
    assert reconnect.wait_after(OSError()) == 1.0


async def test_a_timeout_is_tried_again_at_once():
    clock = VirtualClock()
    reconnect = Reconnect(clock)
    assert await reconnect.pause(TimeoutError())
    assert clock.slept == [0.0]
    assert reconnect.wait_after(OSError()) == 1.0
    # Where a timeout is a failure to show (an MCP server's connect), it backs off too.
    assert Reconnect(clock, timeouts_at_once=False).wait_after(TimeoutError()) == 1.0


async def test_a_refused_token_stops_the_loop_without_waiting():
    clock = VirtualClock()
    reconnect = Reconnect(clock)
    assert not await reconnect.pause(FatalChannelError("token refused"))
    assert reconnect.wait_after(FatalChannelError("token refused")) is None
    assert clock.slept == []


# -- the one classifier every platform's refusals go through -----------------------------------


def test_one_classifier_reads_any_platforms_table():
    """A new platform brings a table of its codes, not a mapping function of its own."""
    from channels.errors import (
        ErrorTable,
        FeatureUnavailable,
        FormattingRejected,
        PermanentError,
        Refusal,
        TooLong,
        classify,
    )

    table = ErrorTable(
        "refused: {detail}",
        optional={"m.typing": "typing"},
        fatal_codes=frozenset({"M_UNKNOWN_TOKEN"}),
        transient_codes=frozenset({"M_LIMIT_BUSY"}),
        unknown_method=lambda code: code == "M_UNRECOGNIZED",
        too_long=lambda code: code == "M_TOO_LARGE",
        formatting=lambda code: code == "M_BAD_HTML",
    )

    def of(**kw: object) -> Exception:
        return classify(Refusal("m.send", "said so", **kw), table)  # type: ignore[arg-type]

    flood = of(status=429, retry_after=2.0)
    assert isinstance(flood, RetryAfter) and flood.seconds == 2.0
    assert isinstance(of(unreachable=True), TransientError)
    token = of(status=200, code="M_UNKNOWN_TOKEN")
    assert isinstance(token, FatalChannelError) and str(token) == "refused: said so"
    assert isinstance(of(status=401), FatalChannelError)
    assert type(of(status=404)) is PermanentError  # the room or the event, not the token
    off = classify(Refusal("m.typing", "no", 400, "M_UNRECOGNIZED"), table)
    assert isinstance(off, FeatureUnavailable) and off.feature == "typing"
    assert isinstance(of(status=502), TransientError)
    assert isinstance(of(status=200, code="M_LIMIT_BUSY"), TransientError)
    assert isinstance(of(status=413, code="M_TOO_LARGE"), TooLong)
    assert isinstance(of(status=400, code="M_BAD_HTML"), FormattingRejected)
    assert type(of(status=403, code="M_FORBIDDEN")) is PermanentError


async def test_telegrams_poll_waits_on_the_channels_clock(tmp_path, llm, api):
    """The real channel against the fake Bot API: flood control on getUpdates waits what
    Telegram asked (on the injected clock, so not in real time), a 502 backs off from 1 s."""
    from channels.telegram_channel.channel import TelegramChannel
    from tests.helpers import channel_in_process, make_config

    settings = {
        "enabled": True,
        "token": api.token,
        "baseUrl": api.base_url,
        "allowFrom": ["1001"],
        "pollTimeoutSeconds": 1,
    }
    cfg = make_config(tmp_path, llm.base_url, channels={"telegram": settings})
    clock = VirtualClock()

    def make(stack: object) -> TelegramChannel:
        channel = TelegramChannel(
            stack.bus,  # type: ignore[attr-defined]
            cfg.channels.telegram,
            cfg.agent.workspace_path,
            cfg.agent.state_path,
        )
        channel.reconnect = Reconnect(clock)
        return channel

    api.fail("getUpdates", 429, retry_after=7)
    api.fail("getUpdates", 502, "Bad Gateway")
    async with channel_in_process(cfg, tmp_path / "config.json", make):
        api.private_text("still there?", user_id=1001)
        await api.wait_sent_async(1, 1001, 30)
    assert clock.slept[:2] == [pytest.approx(7 + RETRY_AFTER_MARGIN), 1.0]
