"""The terminal as the core sees it: one chat, the owner's own, at the keyboard. It is not
configured in ``channels.*``: ``memobot agent`` builds it."""

from __future__ import annotations

from typing import Any

from channels.spec import ChannelSpec

NAME = "cli"


def _always(chat: str, section: Any = None) -> bool:
    return True


SPEC = ChannelSpec(
    NAME,
    "channels.terminal_channel.channel:TerminalChannel",
    private_chat=_always,
    owner_chat=_always,
)
