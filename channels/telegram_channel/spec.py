"""Telegram as the core sees it (no SDK import)."""

from __future__ import annotations

from channels.spec import ChannelSpec, TokenProbe
from channels.telegram_channel.config import TelegramConfig

NAME = "telegram"
DEFAULT_BASE = "https://api.telegram.org/bot"


def token_probes(cfg: TelegramConfig) -> list[TokenProbe]:
    url = f"{cfg.base_url or DEFAULT_BASE}{cfg.token}/getMe"
    fix = "check channels.telegram.token (from @BotFather)"
    return [TokenProbe(NAME, "GET", url, {}, cfg.token, fix)]


def private_chat(chat: str) -> bool:
    """A private chat's id is its person's user id: positive (groups are negative, and a
    forum topic is "<group>:<topic>")."""
    return chat.isdigit()


def owner_chat(chat: str, cfg: TelegramConfig) -> bool:
    """A private chat whose id (the user's id) is an admin's."""
    admins = cfg.admin_ids
    return chat.isdigit() and ("*" in admins or chat in admins)  # as AccessPolicy.is_admin


def admin_chat(cfg: TelegramConfig) -> str | None:
    """The first numeric admin id: that admin's private chat has the same id."""
    return next((a for a in cfg.admin_ids if a.isdigit()), None)


SPEC = ChannelSpec(
    NAME,
    "channels.telegram_channel.channel:TelegramChannel",
    TelegramConfig,
    token_probes,
    private_chat,
    owner_chat,
    admin_chat,
)
