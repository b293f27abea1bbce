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


def key_named(cfg: Any, name: str) -> Any:
    """The live key (``api.keys[]``) called ``name``; None for none, or a revoked one."""
    key = next((k for k in cfg.api.keys if k.name == name), None)
    return key if key is not None and not key.revoked else None


def speaks_as_admin(cfg: Any, key: Any) -> bool:
    """Whether ``key`` speaks for an admin: the owner, or a person who is one of their
    channel's admins."""
    if key.as_ == "owner":
        return True
    channel, _, user = key.as_.partition(":")
    section = getattr(cfg.channels, channel, None)
    return section is not None and ("*" in section.admin_ids or user in section.admin_ids)


def _owner_chat(chat: str, cfg: Any) -> bool:
    """A conversation of a key that speaks for an admin is that admin's own private chat (its
    memory is the owner's, as at the terminal)."""
    key = key_named(cfg, chat.partition(":")[0])
    return key is not None and speaks_as_admin(cfg, key)


def _person_settings(cfg: Any, chat: str) -> Any:
    """The section of the channel whose person the chat's key speaks for (their ``dmTools``);
    None for the owner's keys."""
    key = key_named(cfg, chat.partition(":")[0])
    if key is None or key.as_ == "owner":
        return None
    return getattr(cfg.channels, key.as_.partition(":")[0], None)


def _approvals(cfg: Any, chat: str) -> Unasked:
    """A key allowed to run such calls unasked runs them; any other refuses them."""
    key = key_named(cfg, chat.partition(":")[0])
    return "allow" if key is not None and key.approvals == "allow" else "refuse"


SPEC = ChannelSpec(
    NAME,
    "channels.api_channel.channel:ApiChannel",
    private_chat=_private,
    owner_chat=_owner_chat,
    in_gateway=_enabled,
    approvals=_approvals,
    person_settings=_person_settings,
)
