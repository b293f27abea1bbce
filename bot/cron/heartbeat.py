"""The heartbeat: every ``heartbeat.intervalMinutes`` the agent looks at ``HEARTBEAT.md``.

Pure helpers: which lines of the file are open tasks, the task text the heartbeat turn gets,
and whether its answer has something to tell. The scheduler (bot.cron.scheduler) runs the
ticks; the turn code (bot.loop) decides delivery with :func:`worth_telling`.
"""

from __future__ import annotations

import re

from bot.config import Config
from channels import registry

FILE = "HEARTBEAT.md"
CHANNEL = "heartbeat"  # the heartbeat's own session is "heartbeat:main", apart from any chat
CHAT = "main"
SESSION = f"{CHANNEL}:{CHAT}"
NOTHING = "HEARTBEAT_OK"
# "- [ ] task", "* task", "1. task"; a ticked box "- [x]" is done.
_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+(?:\[(?P<box>[ xX])\]\s*)?(?P<task>\S.*)$")
_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)


def open_tasks(text: str) -> list[str]:
    """The list items of HEARTBEAT.md that are not ticked, outside HTML comments."""
    tasks = []
    for line in _COMMENT.sub("", text).splitlines():
        m = _ITEM.match(line)
        if m and (m["box"] or " ") == " ":
            tasks.append(m["task"].strip())
    return tasks


def task_text(tasks: list[str], late_note: str = "") -> str:
    """What the heartbeat turn is asked to do."""
    listed = "\n".join(f"- {t}" for t in tasks)
    return (
        f"{late_note}[heartbeat] Work on these open tasks from {FILE} in your workspace "
        f"now:\n{listed}\n\nWhen you are done: if there is nothing the user needs to hear, "
        f"answer exactly {NOTHING}. Otherwise answer with only what they should be told; it "
        "is sent to them as a message. Tick a task in the file (- [x]) once it is finished "
        "for good."
    )


def worth_telling(answer: str) -> str | None:
    """The message to deliver for a heartbeat answer, or None when it says there is nothing
    to tell (the sentinel alone, possibly with punctuation or formatting around it)."""
    rest = answer.replace(NOTHING, "")
    if NOTHING in answer and not re.sub(r"[\s*_`.!:\-]", "", rest):
        return None
    if not answer.strip():
        return None
    return rest.strip() if NOTHING in answer else answer.strip()


def private_chat(key: str) -> bool:
    """True when the chat ``key`` is provably one person's private chat (the terminal, a
    Telegram private chat, a Slack DM: each channel's spec tells). Unknown chats count as
    groups, so their turns never see the owner's memory."""
    return registry.private_chat(key)


def owner_chat(cfg: Config, key: str) -> bool:
    """True when the chat ``key`` is provably an admin's own private chat (the terminal, or a
    Telegram private chat whose id, the user's id there, is an admin's). Slack and Discord
    DMs carry no user id in their key, so they count as someone else's chat: what Dream
    learns there goes to that chat's own memory file, never to USER.md or SOUL.md."""
    return registry.owner_chat(cfg, key)


def deliver_to(cfg: Config) -> str | None:
    """``heartbeat.deliverTo``, or the first enabled channel's default chat for the owner
    (Telegram: the first admin's private chat, its id is the user id there); None when
    neither exists."""
    if cfg.heartbeat.deliver_to:
        return cfg.heartbeat.deliver_to
    return registry.admin_chat(cfg)
