"""Streaming through the channel manager on a virtual clock: the timing rules of previews
(one update per interval, the minimum before a first message, a platform's retry-after,
drafts kept up while the turn works) asserted on exact times, with a fake channel."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Literal

import pytest

from bot.bus import Activity, MessageBus, OutboundMessage, StreamEvent, TurnActivity
from channels import preview as preview_module
from channels.base import Channel, PreviewMode
from channels.errors import RetryAfter
from channels.manager import ChannelManager
from channels.pacing import Limit
from tests.fakes.clock import FakeClock
from tests.fakes.ledger import NoLedger

INTERVAL = 0.1
CHAT = "1"


class _Streaming(Channel):
    """Previews as a message (or a draft), every call kept as (virtual time, call, text)."""

    name = "fake"
    streaming = True
    stream_interval = INTERVAL

    def __init__(self, bus: MessageBus, clock: FakeClock, mode: PreviewMode) -> None:
        super().__init__(bus)
        self.clock = clock
        self.mode = mode
        self.calls: list[tuple[float, str, str]] = []
        self.refuse: list[Exception] = []  # raised by the next preview calls, in turn

    def preview_mode(self, chat_id: str) -> PreviewMode:
        return self.mode

    def pace_limits(self, chat_id: str) -> list[Limit]:
        return [Limit(f"chat:{chat_id}", 100, 1.0, burst=10)]  # never in the way here

    def _call(self, call: str, text: str) -> None:
        if self.refuse:
            self.calls.append((self.clock.now(), f"{call} refused", text))
            raise self.refuse.pop(0)
        self.calls.append((self.clock.now(), call, text))

    async def send_chunk(
        self, msg: OutboundMessage, chunk: str, plain: bool = False, *, first: bool = False
    ) -> None:
        self.calls.append((self.clock.now(), "send", chunk))

    async def send_preview(self, msg: OutboundMessage, text: str, *, first: bool = False) -> str:
        self._call("preview", text)
        return "42"

    async def edit_chunk(
        self, chat_id: str, message_id: str, chunk: str, plain: bool = False
    ) -> None:
        self._call("edit" if plain else "final", chunk)

    async def send_draft(self, chat_id: str, draft_id: int, text: str) -> None:
        self._call("draft", text)

    def times(self, *calls: str) -> list[float]:
        return [t for t, call, _ in self.calls if call in calls]


@asynccontextmanager
async def _streaming(
    mode: PreviewMode = "message",
) -> AsyncIterator[tuple[MessageBus, _Streaming, FakeClock]]:
    bus, clock = MessageBus(), FakeClock()
    channel = _Streaming(bus, clock, mode)
    manager = ChannelManager(bus, NoLedger(), [channel], clock=clock)  # type: ignore[arg-type]
    await manager.start()
    try:
        async with asyncio.timeout(30):  # real seconds: a hang fails, it does not stall
            yield bus, channel, clock
    finally:
        await manager.stop()


def _event(text: str, kind: Literal["text", "tool", "done"] = "text") -> StreamEvent:
    return StreamEvent("fake", CHAT, "m1", kind, text)


async def _write(bus: MessageBus, clock: FakeClock, words: int, every: float) -> str:
    """The model writes ``words`` words, one each ``every`` virtual seconds."""
    text = ""
    for i in range(words):
        text += f"word{i} "
        bus.publish_stream(_event(text))
        await clock.sleep(every)
    return text


async def test_a_preview_message_is_updated_at_most_once_an_interval():
    async with _streaming() as (bus, channel, clock):
        text = await _write(bus, clock, 30, every=0.03)
        bus.publish_stream(_event("", "done"))
        await bus.publish_outbound(OutboundMessage("fake", CHAT, text, reply_to="m1", final=True))
        await clock.sleep(1.0)
    shown = channel.times("preview", "edit")
    assert len(shown) >= 5  # it grew while written...
    gaps = [b - a for a, b in itertools.pairwise(shown)]
    assert min(gaps) >= INTERVAL - 1e-9  # ...never faster than the interval (float rounding)
    # The final answer edits the preview into the answer: one message, no second send.
    assert [call for _, call, _ in channel.calls if call in ("final", "send")] == ["final"]


async def test_a_first_preview_message_waits_for_some_text_or_one_interval():
    async with _streaming() as (bus, channel, clock):
        bus.publish_stream(_event("Hi "))  # short: the message waits one interval
        await clock.sleep(0.5)
        assert channel.times("preview") == [pytest.approx(INTERVAL)]


async def test_a_long_enough_first_text_is_shown_at_once():
    async with _streaming() as (bus, channel, clock):
        bus.publish_stream(_event("Here is the plan for today, step by step "))
        await clock.sleep(0.5)
        assert channel.times("preview") == [0.0]


async def test_a_retry_after_on_a_preview_is_waited_out():
    async with _streaming() as (bus, channel, clock):
        bus.publish_stream(_event("Here is the plan for today, step by step "))
        await clock.sleep(0.05)
        channel.refuse.append(RetryAfter(1.0))
        await _write(bus, clock, 10, every=0.05)
        await clock.sleep(2.0)
        refused = channel.times("edit refused")
        edits = channel.times("edit")
        assert len(refused) == 1 and edits
        # The wait asked for plus its margin; then the chat's bucket, held at one token,
        # needs one more for a preview to leave the answer its token (1/100 s).
        assert edits[0] == pytest.approx(refused[0] + 1.1 + 0.01)


async def test_a_draft_is_kept_up_while_the_turn_works_and_not_while_it_waits():
    async with _streaming("draft") as (bus, channel, clock):
        await bus.publish_outbound(TurnActivity("fake", CHAT, "m1", Activity.WORKING))
        bus.publish_stream(_event("Let me look. "))
        bus.publish_stream(_event("", "tool"))  # a long tool run: the draft shows "Thinking..."
        await clock.sleep(3 * preview_module.DRAFT_REFRESH_SECONDS + 1)
        drafts = channel.times("draft")
        # Sent, then again every DRAFT_REFRESH_SECONDS while the tool runs.
        assert drafts == pytest.approx(
            [0.0, *(k * preview_module.DRAFT_REFRESH_SECONDS for k in (1, 2, 3))]
        )
        await bus.publish_outbound(TurnActivity("fake", CHAT, "m1", Activity.WAITING_FOR_PERSON))
        await clock.sleep(3 * preview_module.DRAFT_REFRESH_SECONDS)
        assert len(channel.times("draft")) == len(drafts)  # waiting is not working
