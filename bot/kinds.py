"""What kind of turn a message starts, and for whom: classified once, where it is accepted.

DESIGN.md section 11. A person's message, a chat command, an approval press, a reminder, an
agent job and a heartbeat all arrive as :class:`bot.bus.InboundMessage`. The bus classifies
each one as it is published (:func:`with_kind`), and a pending turn read back after a crash
gets the classification it was stored with (:meth:`Classified.from_record`) when that grants
no more than the entry's own text and metadata (:func:`no_more_than`); an entry written before
kinds existed is classified from its text and metadata, exactly as it was then. From
there on every layer asks the message (``msg.kind``, ``msg.sender``, ``msg.policy``): nobody
parses its text for a command or looks for a heartbeat in its metadata again.

A new kind (a browser chat, an API call, a background task) is one more :class:`TurnKind`
member, one row in ``POLICIES`` and one rule in :func:`classify`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Literal

from bot.commands import ANSWER_COMMANDS, IMMEDIATE, ROUTED, Command, parse_command
from bot.gate.approval import APPROVAL_ID

if TYPE_CHECKING:
    from bot.bus import InboundMessage

TERMINAL = "cli"  # channels.terminal_channel.spec.NAME: the person at the keyboard is the owner
# InboundMessage.metadata keys, as the channels and the scheduler write them. Only this
# module reads them (the scheduler and the channels write them; the pending entry keeps them).
APPROVAL_KEY = "approval"  # a press: {"id", "choice"} (OutboundMessage: a request)
CRON_KEY = "cron"  # a scheduled job's occurrence: {"job_id", "deliver", "due", "late"}
HEARTBEAT_KEY = "heartbeat"  # a heartbeat tick: {"deliver_to", "due"}
# The session that shaped an unattended turn when that was not an admin's (bot.provenance,
# bot.cron.scheduler); such a turn gets a group member's rights.
NARROWED_KEY = "narrowed"
# A background task's turn, in its own session "task:<id>" (bot.tasks): {"id", "parent",
# "label"}; and its report, delivered in the chat that started it: {"id"}.
TASK_KEY = "task"
REPORT_KEY = "task_report"


class TurnKind(StrEnum):
    MESSAGE = "message"  # a person's message: the model answers it
    COMMAND = "command"  # a chat command (/new, /stop, ...): the code answers it
    APPROVAL = "approval"  # an answer to an approval question (a button, /allow ID)
    REMINDER = "reminder"  # a scheduled job that sends its text as it is (deliver "text")
    JOB = "job"  # a scheduled job the model does (deliver "agent")
    HEARTBEAT = "heartbeat"  # the heartbeat's tick: HEARTBEAT.md's open tasks
    TASK = "task"  # a background task's own turn (the spawn tool), in session task:<id>
    REPORT = "report"  # a task's result, told in the chat that started it (no model call)

    @property
    def policy(self) -> KindPolicy:
        return POLICIES[self]


@dataclass(frozen=True, slots=True)
class KindPolicy:
    """What a turn of one kind may do. Each field is what the code did for that kind before
    kinds were named, read from one table now.

    ``uses_model``: answered by a model turn (else by the code alone, no model call).
    ``durable``: a pending turn on disk before its platform is told it arrived (an immediate
    command and an approval press are answered at once instead; a press is made durable in
    its approval record). ``shows_typing``: the chat shows "typing..." while it works.
    ``sends``: it may write to its chat besides its answer (the ``message`` tool, the notice
    of a model outage). ``waits_for_model``: in the daemon, a model outage holds it until the
    model is back instead of answering it with the error. ``scope``: whose privacy scope and
    tools it gets: the sender's (a person is there) or the chat's (nobody watches: an
    unattended turn, whose approval questions go to an admin's private chat).
    """

    uses_model: bool
    durable: bool
    shows_typing: bool
    sends: bool
    waits_for_model: bool
    scope: Literal["sender", "chat"]

    @property
    def unattended(self) -> bool:
        return self.scope == "chat"


POLICIES: dict[TurnKind, KindPolicy] = {
    TurnKind.MESSAGE: KindPolicy(True, True, True, True, True, "sender"),
    TurnKind.COMMAND: KindPolicy(False, True, False, False, False, "sender"),
    TurnKind.APPROVAL: KindPolicy(False, False, False, False, False, "sender"),
    TurnKind.REMINDER: KindPolicy(False, True, False, False, False, "chat"),
    TurnKind.JOB: KindPolicy(True, True, True, True, True, "chat"),
    # Its answer goes to heartbeat.deliverTo, not to a chat of its own: no typing, no sends.
    TurnKind.HEARTBEAT: KindPolicy(True, True, False, False, True, "chat"),
    # For its starter, with the rights of the turn that started it; nobody watches its
    # session: no typing, no sends (it speaks through its report).
    TurnKind.TASK: KindPolicy(True, True, False, False, True, "sender"),
    TurnKind.REPORT: KindPolicy(False, True, False, False, False, "sender"),
}


@dataclass(frozen=True, slots=True)
class Sender:
    """Who a turn speaks for: the platform's user id, whether they are one of the bot's admins,
    and whether they wrote in a group (where others read the answer)."""

    id: str
    is_admin: bool
    is_group: bool


@dataclass(frozen=True, slots=True)
class Press:
    """An answer to approval question ``id``: a choice (bot.gate.approval.CHOICES, or "show")."""

    id: str
    choice: str


@dataclass(frozen=True, slots=True)
class Classified:
    """A message's kind and sender, and what its kind needs: the parsed ``command``
    (COMMAND; an APPROVAL typed as ``/allow ID``), the ``press`` (APPROVAL; None for a typed
    answer without a valid id), where a heartbeat's answer goes (``deliver_to``), and the
    session that shaped an unattended turn when that was not an admin's (``narrowed``)."""

    kind: TurnKind
    sender: Sender
    command: Command | None = None
    press: Press | None = None
    deliver_to: str | None = None
    narrowed: str | None = None

    @property
    def policy(self) -> KindPolicy:
        return self.kind.policy

    @property
    def immediate(self) -> bool:
        """A command answered at once, beside a running turn, and never stored."""
        return self.command is not None and self.command.name in IMMEDIATE

    @property
    def durable(self) -> bool:
        return self.policy.durable and not self.immediate

    def record(self) -> dict[str, Any]:
        """The JSON form kept in a pending entry (``kind`` key), read by ``from_record``."""
        data: dict[str, Any] = {
            "kind": self.kind.value,
            "sender": {
                "id": self.sender.id,
                "is_admin": self.sender.is_admin,
                "is_group": self.sender.is_group,
            },
        }
        if self.command is not None:
            data["command"] = {"name": self.command.name, "args": self.command.args}
        if self.press is not None:
            data["press"] = {"id": self.press.id, "choice": self.press.choice}
        if self.deliver_to is not None:
            data["deliver_to"] = self.deliver_to
        if self.narrowed is not None:
            data["narrowed"] = self.narrowed
        return data

    @classmethod
    def from_record(cls, data: Any) -> Classified | None:
        """The classification ``record`` wrote; None when ``data`` is not one (an entry of an
        older memobot has none, a damaged one is not trusted): classify the entry again."""
        if not isinstance(data, dict):
            return None
        sender, command, press = data.get("sender"), data.get("command"), data.get("press")
        try:
            kind = TurnKind(data.get("kind"))
            if not isinstance(sender, dict) or not all(
                isinstance(sender.get(k), t)
                for k, t in (("id", str), ("is_admin", bool), ("is_group", bool))
            ):
                return None
            return cls(
                kind,
                Sender(sender["id"], sender["is_admin"], sender["is_group"]),
                Command(str(command["name"]), str(command["args"])) if command else None,
                Press(str(press["id"]), str(press["choice"])) if press else None,
                _text_or_none(data.get("deliver_to")),
                _text_or_none(data.get("narrowed")),
            )
        except (ValueError, TypeError, KeyError):
            return None


def no_more_than(stored: Classified, fresh: Classified) -> bool:
    """Whether a pending entry's stored classification (``stored``) may stand for the one its
    own text and metadata give (``fresh``): it grants nothing they do not. The session file is
    memobot's own, but a torn, hand-edited or other-version one must not turn a non-admin's
    message resumed after a crash into an admin's, a private one, an owner's job, an
    un-narrowed one, a heartbeat answering into another chat, or a command nothing answers."""
    s, f = stored.sender, fresh.sender
    if s.id != f.id or (s.is_admin and not f.is_admin) or (f.is_group and not s.is_group):
        return False
    if stored.kind is TurnKind.APPROVAL:  # a press is never a pending turn
        return False
    if stored.command is not None and stored.command.name not in ROUTED:
        return False
    if stored.deliver_to != fresh.deliver_to or (fresh.narrowed and not stored.narrowed):
        return False
    # An unattended turn nobody narrowed has the owner's scope: only as its metadata says.
    return stored.kind is fresh.kind or not stored.policy.unattended or bool(stored.narrowed)


def _text_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


def sender_of(msg: InboundMessage) -> Sender:
    """Who sent ``msg``, as its channel said (``is_admin``, ``is_group`` in the metadata).
    What a message does not say is the least it could be: on the terminal, the owner at the
    keyboard in private; elsewhere not an admin, in private (a guest sees only their own
    memory). An admin's message that does not say where it came from is read as a group's:
    a channel that forgot the key must not turn a group message into an owner turn."""
    local = msg.channel == TERMINAL
    said = msg.metadata.get("is_admin")
    admin = bool(said) if said is not None else local
    group = msg.metadata.get("is_group")
    return Sender(
        msg.sender_id,
        admin,
        bool(group) if group is not None else admin and not local,
    )


def sender_name(msg: InboundMessage) -> str:
    """The name the platform gave the sender (``sender_name``, as the channels write it;
    "" when it gave none). Display text, never a right: who someone is, is their id."""
    name = msg.metadata.get("sender_name")
    return name if isinstance(name, str) else ""


def press_from_command(command: Command) -> Press | None:
    """``/allow ap-…`` and friends as a press; None when it is not one."""
    choice = ANSWER_COMMANDS.get(command.name)
    words = command.args.split()
    if choice is None or not words or not APPROVAL_ID.match(words[0]):
        return None
    return Press(words[0], choice)


def classify(msg: InboundMessage) -> Classified:
    """The kind of ``msg``: a press (a button's metadata, or a typed answer), a heartbeat
    tick, a scheduled job's occurrence, a chat command (``/name[@botname] args``), else a
    person's message. What the scheduler or a button made wins over what the text looks like:
    a reminder whose text is "/new" is a reminder."""
    meta = msg.metadata
    sender = sender_of(msg)
    narrowed = _text_or_none(meta.get(NARROWED_KEY) or None)
    if APPROVAL_KEY in meta:
        info = meta[APPROVAL_KEY] if isinstance(meta[APPROVAL_KEY], dict) else {}
        press = Press(str(info.get("id", "")), str(info.get("choice", "")))
        return Classified(TurnKind.APPROVAL, sender, press=press)
    beat = meta.get(HEARTBEAT_KEY)
    if beat is not None:
        deliver_to = str(beat.get("deliver_to") or "") if isinstance(beat, dict) else ""
        return Classified(TurnKind.HEARTBEAT, sender, deliver_to=deliver_to, narrowed=narrowed)
    task = meta.get(TASK_KEY)
    if isinstance(task, dict):
        return Classified(TurnKind.TASK, sender, deliver_to=_text_or_none(task.get("parent")))
    if isinstance(meta.get(REPORT_KEY), dict):
        return Classified(TurnKind.REPORT, sender)
    job = meta.get(CRON_KEY)
    if job is not None:
        text = isinstance(job, dict) and job.get("deliver") == "text"
        kind = TurnKind.REMINDER if text else TurnKind.JOB
        return Classified(kind, sender, narrowed=narrowed)
    command = parse_command(msg.text)
    if command is not None and command.name in ANSWER_COMMANDS:
        return Classified(TurnKind.APPROVAL, sender, command, press_from_command(command))
    if command is not None:
        return Classified(TurnKind.COMMAND, sender, command)
    return Classified(TurnKind.MESSAGE, sender, narrowed=narrowed)


def with_kind(msg: InboundMessage) -> InboundMessage:
    """``msg`` with its classification: the one it carries, else :func:`classify`'s."""
    if msg.classified is not None:
        return msg
    return replace(msg, classified=classify(msg))
