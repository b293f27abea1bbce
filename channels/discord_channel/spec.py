"""Discord as the core sees it (no SDK import). A DM's key carries the DM channel's id,
which says nothing of who is in it: no chat counts as private (its turns never see the
owner's memory)."""

from __future__ import annotations

from channels.discord_channel.config import DiscordConfig
from channels.spec import ChannelSpec, Setup, TokenProbe

NAME = "discord"
ME_URL = "https://discord.com/api/v10/users/@me"


def token_probes(cfg: DiscordConfig) -> list[TokenProbe]:
    auth = {"Authorization": f"Bot {cfg.token}"}
    fix = "check channels.discord.token (Developer Portal, Bot, Reset Token)"
    return [TokenProbe(NAME, "GET", ME_URL, auth, cfg.token, fix)]


SPEC = ChannelSpec(
    NAME,
    "channels.discord_channel.channel:DiscordChannel",
    DiscordConfig,
    token_probes,
    setup=Setup(
        (("token", "Developer Portal, your application, Bot, Reset Token"),),
        "in Discord, Settings, Advanced, Developer Mode on; then right-click your name, "
        "Copy User ID",
    ),
)
