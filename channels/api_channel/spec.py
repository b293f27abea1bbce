"""The API as the core sees it: each conversation belongs to one named key (chat id
``<key name>:<session id>``), which speaks for one person; nobody there can press an approval
button. It is not configured in ``channels.*`` but in ``api`` (docs/api.md)."""

from __future__ import annotations

from typing import Any

from channels.spec import ChannelSpec, Unasked

NAME = "api"


def _private(chat: str) -> bool:
    return True  # a key's conversations are that key's person's alone


def _enabled(cfg: Any) -> bool:
    return bool(cfg.api.enabled)


def _approvals(cfg: Any, chat: str) -> Unasked:
    """A key allowed to run such calls unasked runs them; any other refuses them."""
    name = chat.partition(":")[0]
    key = next((k for k in cfg.api.keys if k.name == name), None)
    return "allow" if key is not None and not key.revoked and key.approvals == "allow" else "refuse"


SPEC = ChannelSpec(
    NAME,
    "channels.api_channel.channel:ApiChannel",
    private_chat=_private,
    in_gateway=_enabled,
    approvals=_approvals,
)
