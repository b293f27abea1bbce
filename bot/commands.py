"""Chat commands the agent loop answers itself, without the model."""

from __future__ import annotations

from dataclasses import dataclass

HELP_TEXT = """memobot commands:
/new    start a fresh conversation (the current one is archived to memory first)
/stop   cancel the answer being worked on in this chat
/status model, conversation size, memory usage, uptime
/dream  distil the conversation archive into long-term memory now
/allow ID, /always ID, /deny ID   answer an approval request (where there are no buttons)
/approve CODE   (admins) let in the person who was given this pairing code
/cron   list this chat's scheduled jobs (reminders, recurring tasks)
/help   this list"""

COMMANDS = frozenset(
    {
        "/new",
        "/stop",
        "/status",
        "/help",
        "/dream",
        "/allow",
        "/always",
        "/deny",
        "/approve",
        "/cron",
    }
)
# Answered at once, beside a running turn, and never stored as a pending turn.
IMMEDIATE = frozenset({"/stop", "/help", "/status", "/dream", "/approve", "/cron"})


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
