"""Chat commands: the one list of them (``/help``, the parser and the channels read it), and
the one router through which the agent loop answers them, without the model."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bot.bus import InboundMessage


@dataclass(frozen=True, slots=True)
class CommandSpec:
    """One line of ``/help``: the command as written (``usage``) and what it does.

    ``immediate``: answered at once, beside a running turn, and never stored as a pending turn.
    ``by_channel``: answered by the chat channel itself (``/whoami``, which needs the platform's
    user id before anyone is let in), only where the channel says it does (``CommandSyntax``).
    """

    usage: str
    summary: str
    immediate: bool = False
    by_channel: bool = False

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(word.rstrip(",") for word in self.usage.split() if word.startswith("/"))


# Every chat command, in /help's order: the one list that /help, the parser and the channels
# read (docs/commands.md's "In-chat commands" is checked against /help's answer by the tests).
SPECS = (
    CommandSpec("/new", "start a fresh conversation (the current one is archived to memory first)"),
    CommandSpec(
        "/stop [ID]",
        "cancel the answer being worked on in this chat, or background task ID",
        immediate=True,
    ),
    CommandSpec("/tasks", "list this chat's background tasks (id, state, age)", immediate=True),
    CommandSpec("/status", "model, conversation size, memory usage, uptime", immediate=True),
    CommandSpec(
        "/dream", "distil the conversation archive into long-term memory now", immediate=True
    ),
    CommandSpec(
        "/allow ID, /always ID, /deny ID", "answer an approval request (where there are no buttons)"
    ),
    CommandSpec(
        "/approve CODE",
        "(admins) let in the person who was given this pairing code",
        immediate=True,
    ),
    CommandSpec(
        "/cron", "list this chat's scheduled jobs (reminders, recurring tasks)", immediate=True
    ),
    CommandSpec(
        "/usage",
        "model calls, tokens and cost today and this month: this chat's (an admin in a "
        "private chat: every chat's)",
        immediate=True,
    ),
    CommandSpec(
        "/budget",
        "(admins) the spending limits and their use; followed by NAME VALUE|off|default, "
        "changes one",
        immediate=True,
    ),
    CommandSpec(
        "/model [NAME]",
        "list the models of llm.models; NAME switches this chat's (admins, by default)",
        immediate=True,
    ),
    CommandSpec("/whoami", "your user id and whether you are allowed here", by_channel=True),
    CommandSpec("/help", "this list", immediate=True),
)

# What the agent loop answers; a channel answers its own (by_channel) before the loop sees them.
COMMANDS = frozenset(n for spec in SPECS if not spec.by_channel for n in spec.names)
IMMEDIATE = frozenset(n for spec in SPECS if spec.immediate for n in spec.names)
CHANNEL_COMMANDS = frozenset(n for spec in SPECS if spec.by_channel for n in spec.names)
# Typed answers to an approval question, for chats without buttons ("/allow ap-…"): a turn of
# their own kind (an approval press, bot.kinds), never routed as commands.
ANSWER_COMMANDS = {"/allow": "once", "/always": "always", "/deny": "deny"}
ROUTED = COMMANDS - ANSWER_COMMANDS.keys()


@dataclass(frozen=True, slots=True)
class CommandSyntax:
    """How a channel's people write commands: ``prefix`` instead of ``/`` (Slack clients take
    a leading ``/`` as a slash command of their own), the ``CHANNEL_COMMANDS`` the channel
    answers itself, and a ``note`` line for the end of ``/help``."""

    prefix: str = "/"
    answers: frozenset[str] = frozenset()
    note: str = ""


def help_text(syntax: CommandSyntax = CommandSyntax()) -> str:
    """The answer to ``/help`` in a channel that writes commands as ``syntax`` says."""
    lines = ["memobot commands:"]
    for spec in SPECS:
        if spec.by_channel and not set(spec.names) <= syntax.answers:
            continue
        usage = re.sub(r"(?<!\S)/", syntax.prefix, spec.usage)
        lines.append(
            f"{usage:<7} {spec.summary}" if len(usage) <= 7 else f"{usage}   {spec.summary}"
        )
    if syntax.note:
        lines.append(syntax.note)
    return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class Command:
    name: str
    args: str


def parse_command(text: str) -> Command | None:
    """``/name[@botname] [args]`` for a known command, else None (the text goes to the model)."""
    stripped = text.strip()
    if not stripped.startswith("/"):
        return None
    head, _, args = stripped.partition(" ")
    name = head.split("@", 1)[0].lower()
    if name not in COMMANDS:
        return None
    return Command(name, args.strip())


# A command's handler: the message and the command's arguments -> the answer's text, or None
# when the handler has answered the message itself (``/new`` ends its turn through the ledger).
CommandHandler = Callable[["InboundMessage", str], Awaitable[str | None]]


class CommandRouter:
    """The one table from a command's name to its handler (as bolt's listener registry).

    Built once with a handler for every command the loop answers (``ROUTED``); a command in
    ``SPECS`` without one, or a handler for no command, is refused at construction, so /help
    can never list a command that nothing answers.
    """

    def __init__(self, handlers: Mapping[str, CommandHandler]) -> None:
        missing, unknown = ROUTED - handlers.keys(), handlers.keys() - ROUTED
        if missing or unknown:
            raise ValueError(
                f"command router: no handler for {sorted(missing)}, handlers for unknown "
                f"commands {sorted(unknown)}"
            )
        self._handlers = dict(handlers)

    async def route(self, msg: InboundMessage) -> str | None:
        """Answer the command ``msg`` was classified with (``bot.kinds``)."""
        command = msg.classification.command
        if command is None:
            raise ValueError(f"message {msg.message_id} is not a command")
        return await self._handlers[command.name](msg, command.args)


def format_duration(seconds: float) -> str:
    seconds = int(seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h {minutes}m"
    if hours:
        return f"{hours}h {minutes}m"
    if minutes:
        return f"{minutes}m {secs}s"
    return f"{secs}s"
