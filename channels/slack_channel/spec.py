"""Slack as the core sees it (no SDK import)."""

from __future__ import annotations

from channels.slack_channel.config import SlackConfig
from channels.spec import ChannelSpec, Setup, TokenProbe

NAME = "slack"
DEFAULT_API = "https://slack.com/api/"
BOT_TOKEN_HELP = "xoxb-..., OAuth & Permissions"
APP_TOKEN_HELP = "xapp-..., with connections:write"


def token_probes(cfg: SlackConfig) -> list[TokenProbe]:
    """Both tokens: the bot token (Web API) and the app token (Socket Mode)."""
    base = (cfg.api_url or DEFAULT_API).rstrip("/") + "/"
    return [
        TokenProbe(
            f"{NAME} {key}",
            "POST",
            base + method,
            {"Authorization": f"Bearer {token}"},
            token,
            f"check channels.slack.{key} ({where})",
        )
        for key, method, token, where in (
            ("botToken", "auth.test", cfg.bot_token, BOT_TOKEN_HELP),
            ("appToken", "apps.connections.open", cfg.app_token, APP_TOKEN_HELP),
        )
    ]


def private_chat(chat: str) -> bool:
    """A DM's channel id starts with "D" (a thread in one: "D...:<ts>"). Its key names no
    user, so no chat here is provably the owner's own."""
    return chat.startswith("D")


SPEC = ChannelSpec(
    NAME,
    "channels.slack_channel.channel:SlackChannel",
    SlackConfig,
    token_probes,
    private_chat,
    setup=Setup(
        (("bot_token", BOT_TOKEN_HELP), ("app_token", APP_TOKEN_HELP)),
        "in Slack, your profile, the ⋮ menu, Copy member ID (U...)",
        url_field="api_url",
    ),
)
