"""``channels.slack``: the Slack section of the config."""

from __future__ import annotations

import re
from typing import ClassVar

from pydantic import StrictBool, field_validator

from bot.config_base import ChannelConfig, ConfigModel, RateLimitConfig
from bot.urls import with_trailing_slash


class SlackRateLimits(ConfigModel):
    # Slack: about 1 message a second per channel, short bursts allowed.
    channel: RateLimitConfig = RateLimitConfig(messages=1, per_seconds=1, burst=3)


class SlackConfig(ChannelConfig):
    required_when_enabled: ClassVar[tuple[str, ...]] = ("bot_token", "app_token")
    bot_token: str = ""
    app_token: str = ""
    # Default Slack's public Web API; for a proxy or a local test server. Kept with a
    # trailing slash: the SDK resolves method names against it ("chat.postMessage").
    api_url: str = ""
    rate_limits: SlackRateLimits = SlackRateLimits()
    # Stream answers in threads with chat.startStream/appendStream/stopStream where Slack
    # allows it; False (or a refusal): chat.postMessage, then chat.update.
    native_streaming: StrictBool = True
    _id_pattern: ClassVar[re.Pattern[str]] = re.compile(r"^[A-Z0-9]+$")
    _id_example: ClassVar[str] = "a Slack member id such as U0123ABCD"

    _api_url = field_validator("api_url")(with_trailing_slash)
