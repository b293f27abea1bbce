"""``channels.telegram``: the Telegram section of the config."""

from __future__ import annotations

import re
from typing import ClassVar

from pydantic import Field, field_validator

from bot.config_base import ChannelConfig, ConfigModel, RateLimitConfig
from bot.urls import telegram_base_url


class TelegramRateLimits(ConfigModel):
    # Telegram: about 30 a second per bot (28: exactly 30 drew 429s, arrival jitter bunches
    # sends), about 1 a second per chat (short bursts allowed: the pieces of one answer), 20 a
    # minute per group: 18 a minute with a burst of 2 holds no more than 20 in any minute, and
    # the second token lets a streamed answer's final edit go at once (previews keep it).
    bot: RateLimitConfig = RateLimitConfig(messages=28, per_seconds=1)
    chat: RateLimitConfig = RateLimitConfig(messages=1, per_seconds=1, burst=3)
    group: RateLimitConfig = RateLimitConfig(messages=18, per_seconds=60, burst=2)


class TelegramConfig(ChannelConfig):
    required_when_enabled: ClassVar[tuple[str, ...]] = ("token",)
    token: str = ""
    # python-telegram-bot's meaning: "http://host:port/bot", the token appended. Known slips
    # (a trailing slash, a bare host) are put right when the config loads, others refused.
    base_url: str = ""
    base_file_url: str = ""
    poll_timeout_seconds: int = Field(30, ge=1, le=300)
    rate_limits: TelegramRateLimits = TelegramRateLimits()
    _id_pattern: ClassVar[re.Pattern[str]] = re.compile(r"^-?[0-9]+$")
    _id_example: ClassVar[str] = "a numeric Telegram user id"

    _base_url = field_validator("base_url")(telegram_base_url)
    _base_file_url = field_validator("base_file_url")(
        lambda v: telegram_base_url(v, suffix="/file/bot")
    )
