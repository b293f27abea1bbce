"""A turn knows its kind: the classifier (bot.kinds), the pending entry that keeps it across a
crash (bot.intake), and the one command router (bot.commands). Pure: no event loop but the
router's, no files."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from bot.bus import InboundMessage, MessageBus
from bot.commands import COMMANDS, IMMEDIATE, ROUTED, CommandRouter
from bot.intake import DurableIntake, inbound_from_pending, pending_entry
from bot.kinds import (
    POLICIES,
    Classified,
    Press,
    Sender,
    TurnKind,
    classify,
    with_kind,
)
from bot.session import SessionStore

PRIVATE = {"is_admin": False, "is_group": False}
ADMIN = {"is_admin": True, "is_group": False}
GROUP = {"is_admin": False, "is_group": True}
APPROVAL_ID = "ap-0123456789ab"


def _msg(text: str, metadata: dict[str, Any], channel: str = "telegram") -> InboundMessage:
    return InboundMessage(channel, "42", "7", text, message_id="m1", metadata=metadata)


def test_a_persons_message() -> None:
    got = classify(_msg("hello", PRIVATE))
    assert got == Classified(TurnKind.MESSAGE, Sender("7", is_admin=False, is_group=False))
    assert got.policy.uses_model and got.policy.shows_typing and got.policy.sends
    assert got.durable and not got.immediate and not got.policy.unattended


def test_a_command_addressed_to_the_bot_by_name() -> None:
    got = classify(_msg("/status@memobot_bot  ", ADMIN))
    assert got.kind is TurnKind.COMMAND and got.command is not None
    assert (got.command.name, got.command.args) == ("/status", "")
    assert got.immediate and not got.durable  # answered at once, never stored
    assert got.sender == Sender("7", is_admin=True, is_group=False)


def test_a_command_in_a_group_keeps_its_sender_and_its_order() -> None:
    got = classify(_msg("/NEW please", GROUP))
    assert got.kind is TurnKind.COMMAND and got.command is not None
    assert (got.command.name, got.command.args) == ("/new", "please")
    assert got.sender.is_group and not got.sender.is_admin
    assert got.durable and not got.immediate  # /new runs in order with the chat's turns
    assert not got.policy.uses_model and not got.policy.waits_for_model


def test_what_only_looks_like_a_command_is_a_message() -> None:
    for text in ("/unknown thing", "hello /stop", " /whoami"):
        assert classify(_msg(text, PRIVATE)).kind is TurnKind.MESSAGE, text


def test_a_heartbeat_tick() -> None:
    meta = {
        "heartbeat": {"deliver_to": "telegram:1001", "due": "2026-03-01T08:00:00Z"},
        "is_admin": False,
        "is_group": True,
        "narrowed": "telegram:-5",
    }
    got = classify(_msg("check the tasks", meta, channel="heartbeat"))
    assert got.kind is TurnKind.HEARTBEAT
    assert (got.deliver_to, got.narrowed) == ("telegram:1001", "telegram:-5")
    assert got.sender == Sender("7", is_admin=False, is_group=True)
    policy = got.policy
    assert policy.uses_model and policy.waits_for_model and policy.unattended
    assert not policy.shows_typing and not policy.sends  # its answer goes to deliverTo only


def test_scheduled_jobs_a_reminder_and_an_agent_job() -> None:
    reminder = classify(_msg("call mum", {"cron": {"deliver": "text"}, **ADMIN}))
    job = classify(_msg("[scheduled task j1] tidy", {"cron": {"deliver": "agent"}, **ADMIN}))
    assert reminder.kind is TurnKind.REMINDER and not reminder.policy.uses_model
    assert job.kind is TurnKind.JOB and job.policy.uses_model and job.policy.shows_typing
    assert reminder.policy.unattended and job.policy.unattended
    # What the scheduler made wins over what the text looks like.
    assert classify(_msg("/new", {"cron": {"deliver": "text"}})).kind is TurnKind.REMINDER


def test_approval_presses_a_button_and_a_typed_answer() -> None:
    button = classify(_msg("", {"approval": {"id": APPROVAL_ID, "choice": "show"}, **ADMIN}))
    assert button.kind is TurnKind.APPROVAL and button.press == Press(APPROVAL_ID, "show")
    typed = classify(_msg(f"/always@memobot_bot {APPROVAL_ID}", GROUP))
    assert typed.kind is TurnKind.APPROVAL and typed.press == Press(APPROVAL_ID, "always")
    bad = classify(_msg("/deny 12", PRIVATE))
    assert bad.kind is TurnKind.APPROVAL and bad.press is None  # answered with its usage
    assert bad.command is not None and bad.command.name == "/deny"
    assert not button.durable and not typed.durable  # recorded in the approval, not queued


def test_the_sender_when_the_channel_does_not_say() -> None:
    """The terminal's person is the owner, in private; anyone else is nobody special."""
    assert classify(_msg("hi", {}, channel="cli")).sender == Sender("7", True, False)
    assert classify(_msg("hi", {}, channel="plain")).sender == Sender("7", False, False)


def test_every_kind_has_a_policy_and_an_unclassified_message_is_a_bug() -> None:
    assert set(POLICIES) == set(TurnKind)
    with pytest.raises(RuntimeError, match="never classified"):
        _ = _msg("hi", PRIVATE).sender


async def test_the_bus_classifies_what_it_accepts_once() -> None:
    bus, seen = MessageBus(), []

    async def hook(msg: InboundMessage) -> Any:
        seen.append(msg)
        return "accepted"

    bus.set_intake(hook)
    assert await bus.publish_inbound(_msg("/help", GROUP)) == "accepted"
    queued = bus.inbound.get_nowait()
    assert seen == [queued] and queued.kind is TurnKind.COMMAND and queued.sender.is_group
    # A message that already carries a kind keeps it.
    kept = Classified(TurnKind.JOB, Sender("s", True, False))
    assert with_kind(InboundMessage("t", "1", "s", "/new", classified=kept)).classified is kept


def test_a_resumed_pending_turn_has_the_kind_it_was_accepted_as() -> None:
    msg = with_kind(_msg("/new", GROUP))
    entry = pending_entry(msg)
    assert entry["kind"]["kind"] == "command"
    resumed = inbound_from_pending("telegram:42", entry)
    assert resumed.classified == msg.classified
    # The stored kind wins over the text and metadata read again.
    stored = Classified(TurnKind.JOB, Sender("7", is_admin=False, is_group=True), narrowed="x")
    entry = {**pending_entry(with_kind(_msg("do it", PRIVATE))), "kind": stored.record()}
    assert inbound_from_pending("telegram:42", entry).classified == stored


def test_an_old_pending_entry_is_classified_as_it_was_then() -> None:
    """Entries written before kinds existed have no "kind": their text and metadata decide."""
    beat = {"heartbeat": {"deliver_to": "telegram:1001", "due": "x"}, **ADMIN}
    old = [
        ({"id": "a", "sender_id": "7", "text": "hi", "metadata": GROUP}, TurnKind.MESSAGE),
        ({"id": "b", "sender_id": "7", "text": "/new@bot", "metadata": {}}, TurnKind.COMMAND),
        ({"id": "c", "sender_id": "s", "text": "tasks", "metadata": beat}, TurnKind.HEARTBEAT),
        ({"id": "d", "text": "x", "metadata": {"cron": {"deliver": "text"}}}, TurnKind.REMINDER),
    ]
    for entry, kind in old:
        resumed = inbound_from_pending("telegram:42", entry)
        assert resumed.kind is kind, entry
    group = inbound_from_pending("telegram:42", old[0][0])
    assert group.sender == Sender("7", is_admin=False, is_group=True)
    # A damaged kind is not trusted: the entry is classified again.
    broken = {**old[0][0], "kind": {"kind": "message", "sender": {"id": "7", "is_admin": "yes"}}}
    assert inbound_from_pending("telegram:42", broken).sender.is_admin is False
    unknown = {**old[2][0], "kind": {"kind": "browser-chat", "sender": {}}}
    assert inbound_from_pending("telegram:42", unknown).kind is TurnKind.HEARTBEAT


# -- the router --------------------------------------------------------------------------------


def _answer(name: str) -> Any:
    async def handler(msg: InboundMessage, args: str) -> str:
        return f"{name}({args})"

    return handler


def test_the_router_answers_each_command_through_its_table() -> None:
    router = CommandRouter({name: _answer(name) for name in ROUTED})
    msg = with_kind(_msg("/approve@memobot_bot  AB12 ", ADMIN))
    assert asyncio.run(router.route(msg)) == "/approve(AB12)"
    with pytest.raises(ValueError, match="not a command"):
        asyncio.run(router.route(with_kind(_msg("hello", ADMIN))))


def test_the_router_refuses_a_table_with_a_command_missing_or_unknown() -> None:
    handlers = {name: _answer(name) for name in ROUTED}
    with pytest.raises(ValueError, match="no handler for \\['/cron'\\]"):
        CommandRouter({k: v for k, v in handlers.items() if k != "/cron"})
    with pytest.raises(ValueError, match="/shout"):
        CommandRouter({**handlers, "/shout": _answer("/shout")})
    # Typed approval answers are presses, not routed commands; every immediate one is routed.
    assert ROUTED == COMMANDS - {"/allow", "/always", "/deny"} and IMMEDIATE <= ROUTED


async def test_a_lone_surrogate_anywhere_in_a_message_does_not_stop_its_intake(
    tmp_path: Path,
) -> None:
    # A Slack or Telegram display name may carry "\ud800" alone, as the text may: UTF-8
    # cannot hold it, and the journal refused the whole message (never taken, redelivered).
    bus = MessageBus()
    replies: list[str] = []

    async def reply(msg: InboundMessage, text: str) -> None:
        replies.append(text)

    bus.set_intake(DurableIntake(SessionStore(tmp_path), reply).accept)
    msg = _msg("hi \ud800", {**PRIVATE, "sender_name": "Bad \udcff name"})
    assert await bus.publish_inbound(msg) == "accepted"
    queued = bus.inbound.get_nowait()
    assert queued.text == "hi \ufffd" and queued.metadata["sender_name"] == "Bad \ufffd name"
    assert replies == []
