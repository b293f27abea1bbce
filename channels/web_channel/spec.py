"""The panel's chat as the core sees it: conversations of the owner alone, each a private chat,
run by a gateway whose panel is on. It is not configured in ``channels.*``."""

from __future__ import annotations

from typing import Any

from channels.spec import ChannelSpec

NAME = "web"


def _always(chat: str, section: Any = None) -> bool:
    return True


def _panel_on(cfg: Any) -> bool:
    return bool(cfg.web.enabled)


SPEC = ChannelSpec(
    NAME,
    "channels.web_channel.channel:WebChannel",
    private_chat=_always,
    owner_chat=_always,
    in_gateway=_panel_on,
)
