"""Attacks on issue 28's refactors: what a damaged, old or forged state file, a group member or
a planted workspace file could get out of the typed session state, the turn kinds and the
declared tool effects. Each test here failed before its fix."""

from __future__ import annotations

from typing import Any

from bot.bus import InboundMessage
from bot.commands import Command
from bot.config import MemoryConfig
from bot.intake import inbound_from_pending, pending_entry
from bot.kinds import Classified, Sender, TurnKind, with_kind
from bot.privacy import scope_for_person, scope_for_unattended

GUEST = {"is_admin": False, "is_group": False}
GROUP = {"is_admin": False, "is_group": True}


def _entry(text: str, metadata: dict[str, Any], stored: Classified) -> dict[str, Any]:
    msg = with_kind(InboundMessage("telegram", "42", "7", text, message_id="m1", metadata=metadata))
    return {**pending_entry(msg), "kind": stored.record()}


def _scope(msg: InboundMessage) -> Any:
    memory = MemoryConfig()
    if msg.policy.unattended:
        return scope_for_unattended(msg, memory)
    return scope_for_person(msg, memory)


def test_a_stored_kind_never_gives_a_resumed_turn_more_rights_than_its_entry_says() -> None:
    """A pending entry's "kind" (a torn, hand-edited or other-version session file) is not
    believed over the sender the entry's own metadata names: a non-admin's message resumed
    after a crash is a non-admin's, never an admin's, never a job with the owner's rights,
    never un-narrowed, never a heartbeat whose answer goes to another chat."""
    forged = [
        # The sender claims to be an admin, in private.
        (GUEST, Classified(TurnKind.MESSAGE, Sender("7", True, False))),
        # A group member's message claims to be private.
        (GROUP, Classified(TurnKind.MESSAGE, Sender("7", False, False))),
        # Someone else's id.
        (GUEST, Classified(TurnKind.MESSAGE, Sender("1", False, False))),
        # A person's message as an agent job nobody narrowed: the owner's scope and tools.
        (GUEST, Classified(TurnKind.JOB, Sender("7", False, False))),
        (GUEST, Classified(TurnKind.HEARTBEAT, Sender("7", False, False), deliver_to="cli:x")),
    ]
    for metadata, stored in forged:
        resumed = inbound_from_pending("telegram:42", _entry("hello", metadata, stored))
        assert resumed.classified != stored, stored
        assert not resumed.sender.is_admin and resumed.sender.id == "7"
        assert resumed.sender.is_group == metadata["is_group"]
        assert not _scope(resumed).is_owner, stored


def test_a_narrowed_job_stays_narrowed_and_a_job_keeps_its_heartbeat_address() -> None:
    """A job a non-admin made runs with that person's rights even when its stored kind lost
    the mark; a heartbeat answers where its metadata says, not where its stored kind says."""
    job = {"cron": {"job_id": "j", "deliver": "agent"}, "narrowed": "telegram:42", **GROUP}
    stored = Classified(TurnKind.JOB, Sender("7", False, True))  # narrowed dropped
    resumed = inbound_from_pending("telegram:42", _entry("do it", job, stored))
    assert resumed.classification.narrowed == "telegram:42"
    beat = {"heartbeat": {"deliver_to": "telegram:1001", "due": "x"}, "is_admin": True}
    moved = Classified(TurnKind.HEARTBEAT, Sender("7", True, False), deliver_to="slack:C99")
    resumed = inbound_from_pending("telegram:42", _entry("tasks", beat, moved))
    assert resumed.classification.deliver_to == "telegram:1001"


def test_a_stored_command_this_memobot_does_not_answer_is_read_again() -> None:
    """An entry written by another memobot version naming a command this one has no handler
    for (or a press, which is never a pending turn) is classified from its text: the router
    would otherwise fail on it at every start."""
    for stored in (
        Classified(TurnKind.COMMAND, Sender("7", False, False), Command("/browse", "")),
        Classified(TurnKind.APPROVAL, Sender("7", False, False)),
    ):
        resumed = inbound_from_pending("telegram:42", _entry("hello", GUEST, stored))
        assert resumed.kind is TurnKind.MESSAGE, stored


def test_a_channel_that_forgets_is_group_gets_a_group_turn_not_an_owner_turn() -> None:
    forgot = with_kind(InboundMessage("matrix", "!room", "7", "hi", metadata={"is_admin": True}))
    assert forgot.sender == Sender("7", is_admin=True, is_group=True)
    assert not _scope(forgot).is_owner
    keyboard = with_kind(InboundMessage("cli", "direct", "user", "hi"))
    assert keyboard.sender == Sender("user", is_admin=True, is_group=False)
    assert _scope(keyboard).is_owner
