"""Platform channels: each speaks one chat platform and meets the core only at the bus.

Modules are named ``*_channel`` so they can never shadow the SDK packages they import
(``telegram``, ``discord``, ``slack_bolt``). A channel's SDK is imported only when that channel
is enabled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bot.bus import MessageBus
    from bot.config import Config
    from channels.base import Channel


def create_channel(name: str, bus: MessageBus, cfg: Config) -> Channel:
    workspace, state_dir = cfg.agent.workspace_path, cfg.agent.state_path
    if name == "telegram":
        from channels.telegram_channel import TelegramChannel

        return TelegramChannel(bus, cfg.channels.telegram, workspace, state_dir)
    if name == "discord":
        from channels.discord_channel import DiscordChannel

        return DiscordChannel(bus, cfg.channels.discord, workspace, state_dir)
    if name == "slack":
        from channels.slack_channel import SlackChannel

        return SlackChannel(bus, cfg.channels.slack, workspace, state_dir)
    raise ValueError(f"unknown channel {name!r}")
