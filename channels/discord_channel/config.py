"""``channels.discord``: the Discord section of the config."""

from __future__ import annotations

import re
from typing import ClassVar

from pydantic import Field

from bot.config_base import ChannelConfig, ConfigModel, RateLimitConfig


class DiscordRateLimits(ConfigModel):
    # Discord: 5 messages per 5 s per channel (burst 1: no 5 s window holds more than 5).
    channel: RateLimitConfig = RateLimitConfig(messages=5, per_seconds=5)


class DiscordConfig(ChannelConfig):
    required_when_enabled: ClassVar[tuple[str, ...]] = ("token",)
    token: str = ""
    allow_channels: list[str] = Field(default_factory=list)  # empty: every guild channel
    rate_limits: DiscordRateLimits = DiscordRateLimits()
    _id_pattern: ClassVar[re.Pattern[str]] = re.compile(r"^[0-9]+$")
    _id_example: ClassVar[str] = "a numeric Discord user id"
