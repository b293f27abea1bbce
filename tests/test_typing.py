""" "typing..." is shown while the bot works on a turn, and only then: not while the turn waits
for an approval (also one restored after a restart) or for the model, not kept up as a draft
meanwhile, not stopped by another message's answer. The refresh is shortened here."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from bot.bus import Activity, MessageBus, OutboundMessage, TurnActivity
from bot.outage import NOTICE_TEXT, Outage
from channels import manager as manager_module
from channels import preview as preview_module
from channels.base import Channel
from channels.manager import ChannelManager
from channels.pacing import Limit
from tests.fakes.clock import FakeClock
from tests.fakes.ledger import NoLedger
from tests.fakes.llm_server import FakeLLM, call, reply, tool_step
from tests.fakes.telegram_api import FakeBotAPI
from tests.helpers import FAST_OUTAGE, llm_settings, make_config, telegram_in_process
from tests.helpers.approvals import ALICE, RISKY, button_data, running


@pytest.fixture(autouse=True)
def fast_refresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(manager_module, "TYPING_REFRESH_SECONDS", 0.05)
    monkeypatch.setattr(preview_module, "DRAFT_REFRESH_SECONDS", 0.3)


# -- the manager alone ------------------------------------------------------------------------


class _Typing(Channel):
    name = "fake"

    def __init__(self, bus: MessageBus) -> None:
        super().__init__(bus)
        self.actions = 0

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def send_typing(self, chat_id: str) -> None:
        self.actions += 1

    async def send_chunk(
        self, msg: OutboundMessage, chunk: str, plain: bool = False, *, first: bool = False
    ) -> None:
        pass


async def _actions_within(channel: _Typing, clock: FakeClock, seconds: float) -> int:
    before = channel.actions
    await clock.sleep(seconds)
    return channel.actions - before


@asynccontextmanager
async def _manager_alone(
    channel_type: type[_Typing] | None = None,
) -> AsyncIterator[tuple[MessageBus, _Typing, ChannelManager, FakeClock]]:
    """The manager alone, on a virtual clock (``clock.sleep``: let that much time pass)."""
    clock = FakeClock()
    bus = MessageBus()
    channel = (channel_type or _Typing)(bus)
    manager = ChannelManager(bus, NoLedger(), [channel], clock=clock)  # type: ignore[arg-type]
    await manager.start()
    try:
        yield bus, channel, manager, clock
    finally:
        await manager.stop()


async def test_a_stop_and_a_start_at_once_leave_typing_shown() -> None:
    # The wait for the model ends before the manager ran: the start must not be lost to the
    # stopped task that is still on its way out.
    async with _manager_alone() as (bus, channel, _, clock):
        await bus.publish_outbound(TurnActivity("fake", "1", "m1", Activity.WORKING))
        await clock.sleep(0.1)
        await bus.publish_outbound(TurnActivity("fake", "1", "m1", Activity.WAITING_FOR_MODEL))
        await bus.publish_outbound(TurnActivity("fake", "1", "m1", Activity.WORKING))
        await clock.sleep(0.05)
        assert await _actions_within(channel, clock, 0.3) >= 3


async def test_only_the_turns_own_answer_stops_its_typing() -> None:
    async with _manager_alone() as (bus, channel, manager, clock):
        working = TurnActivity("fake", "1", "m1", Activity.WORKING)  # the turn answering m1
        await bus.publish_outbound(working)
        await clock.sleep(0.1)
        # /status, answered while m1's turn works: a final answer to another message
        status = OutboundMessage("fake", "1", "status", reply_to="m2", final=True)
        await bus.publish_outbound(status)
        await clock.sleep(0.05)
        assert await _actions_within(channel, clock, 0.3) >= 3
        await bus.publish_outbound(OutboundMessage("fake", "1", "done", reply_to="m1", final=True))
        await clock.sleep(0.05)
        assert await _actions_within(channel, clock, 0.3) == 0
        assert manager.chats_in_memory == 0


async def test_the_turns_done_stops_its_typing_and_another_turns_does_not() -> None:
    async with _manager_alone() as (bus, channel, manager, clock):
        await bus.publish_outbound(TurnActivity("fake", "1", "m1", Activity.WORKING))
        await bus.publish_outbound(TurnActivity("fake", "1", "m2", Activity.DONE))
        assert await _actions_within(channel, clock, 0.3) >= 3
        await bus.publish_outbound(TurnActivity("fake", "1", "m1", Activity.DONE))
        await clock.sleep(0.05)
        assert await _actions_within(channel, clock, 0.3) == 0
        assert manager.chats_in_memory == 0


class _Paced(_Typing):
    def pace_limits(self, chat_id: str) -> list[Limit]:
        return [Limit(f"chat:{chat_id}", 1, 1.0)]  # one send a second


async def test_typing_goes_on_while_the_done_turns_answer_waits_to_be_sent() -> None:
    async with _manager_alone(_Paced) as (bus, channel, _, clock):
        await bus.publish_outbound(TurnActivity("fake", "1", "m1", Activity.WORKING))
        for note in ("a note", "another note"):  # sent at 0 s and 1 s
            await bus.publish_outbound(OutboundMessage("fake", "1", note, reply_to="m1"))
        await bus.publish_outbound(OutboundMessage("fake", "1", "done", reply_to="m1", final=True))
        await bus.publish_outbound(TurnActivity("fake", "1", "m1", Activity.DONE))
        # The answer waits in the chat's queue behind the notes: the bot is still seen at
        # work until it is taken to be sent (at 1 s; it goes out at 2 s).
        assert await _actions_within(channel, clock, 0.9) >= 3
        await clock.sleep(0.2)
        assert await _actions_within(channel, clock, 0.3) == 0


async def test_waiting_for_a_person_stops_typing_until_the_turn_works_again() -> None:
    async with _manager_alone() as (bus, channel, _, clock):
        await bus.publish_outbound(TurnActivity("fake", "1", "m1", Activity.WORKING))
        await clock.sleep(0.1)
        await bus.publish_outbound(TurnActivity("fake", "1", "m1", Activity.WAITING_FOR_PERSON))
        await clock.sleep(0.05)
        assert await _actions_within(channel, clock, 0.3) == 0
        await bus.publish_outbound(TurnActivity("fake", "1", "m1", Activity.WORKING))
        assert await _actions_within(channel, clock, 0.3) >= 3


# -- through the Telegram channel -------------------------------------------------------------


async def test_a_question_restored_after_a_restart_waits_without_typing(tmp_path, llm, api):
    llm.script(tool_step(call("exec", {"command": RISKY})), reply("ran after restart", delay=0.5))
    async with running(tmp_path, llm, api, typingDelaySeconds=0) as tg:
        api.private_text("please run it")
        request = await tg.request()
    restarted = time.monotonic()
    async with running(tmp_path, llm, api, typingDelaySeconds=0) as tg:
        await asyncio.sleep(1.0)  # twenty refreshes, were it shown
        assert [c for c in api.calls("sendChatAction") if c.at > restarted] == []
        assert sum(bool(api.markup(c)) for c in api.sent()) == 1  # waited for, not asked again
        api.press(request, button_data(request, "once"))
        answer = await tg.said("ran after restart")
        again = [c for c in api.calls("sendChatAction") if c.at > restarted]
        assert again and again[0].at < answer.at  # the turn went on: shown again


async def test_no_typing_while_the_second_question_of_a_turn_waits(tmp_path, llm, api):
    llm.script(
        tool_step(call("exec", {"command": RISKY}), call("exec", {"command": RISKY + " 2"})),
        reply("both ran", delay=0.5),
    )
    async with running(tmp_path, llm, api, typingDelaySeconds=0) as tg:
        api.private_text("please run both")
        first = await tg.request()
        api.press(first, button_data(first, "once"))
        await api.wait_for_async(lambda: sum(bool(api.markup(c)) for c in api.sent()) == 2, 30)
        second = [c for c in api.sent() if api.markup(c)][-1]
        await asyncio.sleep(0.6)
        assert [c for c in api.calls("sendChatAction") if c.at > second.at + 0.1] == []
        api.press(second, button_data(second, "once"))
        await tg.said("both ran")


async def test_no_draft_kept_up_while_a_question_waits(tmp_path, llm, api):
    # After a tool the private chat's draft is empty ("Thinking..." in the app): kept up while
    # the turn works, not while it waits for the person.
    llm.script(
        tool_step(call("exec", {"command": "ls"}), call("exec", {"command": RISKY})),
        reply("ran", delay=0.5),
    )
    async with running(tmp_path, llm, api, typingDelaySeconds=0) as tg:
        api.private_text("list then run")
        request = await tg.request()
        await asyncio.sleep(1.5)  # five draft refreshes, were it kept up
        assert [d for d in api.drafts(ALICE) if d.at > request.at + 0.05] == []
        api.press(request, button_data(request, "once"))
        await tg.said("ran")


async def test_neither_typing_nor_draft_while_a_turn_waits_for_the_model(
    tmp_path: Path, llm: FakeLLM
) -> None:
    # Waiting out an outage (up to llm.outage.maxWaitMinutes) is not working on an answer;
    # when the model is back the turn runs again, and shows it again.
    llm.configure(mode="strict")  # every unscripted request: HTTP 500
    llm.script(tool_step(call("exec", {"command": "ls"})))
    async with FakeBotAPI() as bot_api:
        settings = {
            "enabled": True,
            "token": bot_api.token,
            "baseUrl": bot_api.base_url,
            "allowFrom": [str(ALICE)],
            "pollTimeoutSeconds": 1,
            "typingDelaySeconds": 0,
        }
        model = llm_settings(llm.base_url, outage=FAST_OUTAGE)
        cfg = make_config(tmp_path, llm.base_url, llm=model, channels={"telegram": settings})
        async with telegram_in_process(cfg, tmp_path / "config.json") as (stack, _, _):
            stack.loop.outage = Outage(stack.provider.probe, cfg.llm.outage)
            bot_api.private_text("hello", user_id=ALICE)
            [notice] = await bot_api.wait_sent_async(1)
            assert notice.params["text"] == NOTICE_TEXT
            assert bot_api.calls("sendChatAction")  # shown while the model was tried
            await asyncio.sleep(1.5)
            assert [d for d in bot_api.drafts(ALICE) if d.at > notice.at + 0.3] == []
            assert [c for c in bot_api.calls("sendChatAction") if c.at > notice.at + 0.3] == []
            llm.configure(mode="echo", delay=0.5)  # the probe too
            [_, answer] = await bot_api.wait_sent_async(2)
            assert answer.params["text"] == "echo: hello"
            again = [c for c in bot_api.calls("sendChatAction") if c.at > notice.at + 0.3]
            assert again and again[0].at < answer.at
