"""Telegram as the core sees it (no SDK import)."""

from __future__ import annotations

from typing import Any

from channels.spec import ChannelSpec, OwnerSearch, Person, Setup, TokenProbe
from channels.telegram_channel.config import TelegramConfig

NAME = "telegram"
DEFAULT_BASE = "https://api.telegram.org/bot"


def token_probes(cfg: TelegramConfig) -> list[TokenProbe]:
    url = f"{cfg.base_url or DEFAULT_BASE}{cfg.token}/getMe"
    fix = "check channels.telegram.token (from @BotFather)"
    return [TokenProbe(NAME, "GET", url, {}, cfg.token, fix)]


def updates_request(cfg: TelegramConfig, wait: int) -> TokenProbe:
    """getUpdates without an offset: it confirms nothing, so the gateway still gets (and
    answers) every message seen here; no allowed_updates either, which Telegram would keep."""
    url = f"{cfg.base_url or DEFAULT_BASE}{cfg.token}/getUpdates?timeout={wait}"
    return TokenProbe(NAME, "GET", url, {}, cfg.token)


def private_senders(body: Any) -> list[Person]:
    """The people who wrote to the bot in a private chat, in the order of their messages."""
    found: dict[str, Person] = {}
    updates = body.get("result") if isinstance(body, dict) else None
    for update in updates if isinstance(updates, list) else []:
        message = update.get("message") if isinstance(update, dict) else None
        if not isinstance(message, dict) or (message.get("chat") or {}).get("type") != "private":
            continue
        sender = message.get("from")
        if not isinstance(sender, dict) or sender.get("is_bot") or "id" not in sender:
            continue
        full = " ".join(str(sender[k]) for k in ("first_name", "last_name") if sender.get(k))
        handle = f"@{sender['username']}" if sender.get("username") else ""
        name = f"{handle} ({full})" if handle and full else handle or full
        found.setdefault(str(sender["id"]), Person(str(sender["id"]), name))
    return list(found.values())


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
    Setup(
        (("token", "from @BotFather in Telegram: /newbot"),),
        "send /whoami to the bot (it answers anyone), or ask @userinfobot",
        url_field="base_url",
        owner_search=OwnerSearch(updates_request, private_senders),
    ),
)
