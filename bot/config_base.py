"""The config models a channel's own section builds on, apart from ``bot.config`` so each
platform package can declare its section (``channels/<platform>/config.py``) and
``bot.config`` can gather them from ``channels.registry`` without an import cycle."""

from __future__ import annotations

import re
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator, model_validator
from pydantic.alias_generators import to_camel

from bot.proxy import check_proxy_url


class ConfigModel(BaseModel):
    # strict: "0.5" is not a number and 4242 is not an id. A quoted number or an unquoted id
    # is refused with the field's path (bot.config's messages say how to write it), rather
    # than quietly converted: the README promises that wrong types are errors.
    model_config = ConfigDict(
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        validate_default=True,
        strict=True,
    )


_USERNAME_HELP = (
    "usernames are not accepted in allowFrom: they can be changed and then taken over by "
    "someone else. Use the numeric user id instead: message the bot and send /whoami, or "
    "look at the log line memobot writes for a denied sender."
)


_TOOL_PATTERN = re.compile(r"^[A-Za-z0-9_*?\[\]-]+$")


class ChannelConfig(ConfigModel):
    """``channels.<name>``: what every channel's section has; each platform's own model
    (in its package, ``channels/<platform>/config.py``) adds its tokens and limits."""

    # The fields that must be set when the channel is enabled (its tokens).
    required_when_enabled: ClassVar[tuple[str, ...]] = ()
    enabled: StrictBool = False
    allow_from: list[str] = Field(default_factory=list)
    admins: list[str] | None = None  # default: the allowFrom ids (but "*")
    group_policy: Literal["mention", "open"] = "mention"
    proxy: str = ""
    # Answers appear while the model writes them (a draft or an edited preview message).
    streaming: StrictBool = True
    stream_edit_interval_seconds: float = Field(1.0, ge=0.05, le=60)
    # "typing..." only for an answer not there within this time: Telegram asks bots to show
    # it only when an answer takes noticeable time, and a quick answer then costs no call.
    typing_delay_seconds: float = Field(1.0, ge=0, le=60)
    # "pairing": a stranger's private message gets a one-time code the owner approves; unset:
    # "pairing" while allowFrom is empty, else "allowlist" (channels.access.dm_policy_of).
    dm_policy: Literal["allowlist", "pairing"] | None = None
    # The tools offered in group chats (globs); None: the tools that touch no workspace file
    # (by their declared effects: bot.gate.approval.offered_by_default) and tools.safeMcpTools.
    group_tools: list[str] | None = None
    # An admin's own turns in groups get every tool (exec too, which no privacy scope binds).
    group_admin_tools: StrictBool = False
    # The tools offered in a private chat with someone who is not an admin; None: all but exec
    # and MCP tools not in tools.safeMcpTools (they could read what the chat may not see).
    dm_tools: list[str] | None = None

    # How this platform's stable user ids look; "*" is always accepted.
    _id_pattern: ClassVar[re.Pattern[str]] = re.compile(r"^[A-Za-z0-9_.:-]+$")
    _id_example: ClassVar[str] = "an id"

    @model_validator(mode="after")
    def _tokens_when_enabled(self) -> ChannelConfig:
        # Here, not on the channels section: the error then points at this channel's own
        # section (channels.slack), and shows that section, not the first one in the file.
        for f in self.required_when_enabled:
            if self.enabled and not getattr(self, f):
                raise ValueError(
                    f"{to_camel(f)} is required when the channel is enabled (set it, or set "
                    '"enabled": false)'
                )
        return self

    @field_validator("allow_from", "admins")
    @classmethod
    def _valid_ids(cls, v: list[str] | None) -> list[str] | None:
        for item in v or []:
            if item == "*":
                continue
            if item.startswith("@"):
                raise ValueError(f"{item!r}: {_USERNAME_HELP}")
            if not cls._id_pattern.match(item):
                raise ValueError(f"{item!r} is not {cls._id_example}")
        return v

    @field_validator("group_tools", "dm_tools")
    @classmethod
    def _tool_patterns(cls, v: list[str] | None) -> list[str] | None:
        for item in v or []:
            if not item or item != item.strip() or not _TOOL_PATTERN.match(item):
                raise ValueError(
                    f"{item!r} is not a tool name or glob (letters, digits, _ - and * ? [ ])"
                )
        return v

    _proxy = field_validator("proxy")(check_proxy_url)

    @property
    def admin_ids(self) -> list[str]:
        """``admins``, or the allowFrom ids when it is not set. An allowFrom "*" lets anyone
        talk, not anyone administer: only an explicit ``admins: ["*"]`` makes everyone one."""
        if self.admins is None:
            return [i for i in self.allow_from if i != "*"]
        return self.admins


class RateLimitConfig(ConfigModel):
    """``messages`` per ``perSeconds``, up to ``burst`` at once (a token bucket)."""

    messages: float = Field(gt=0)
    per_seconds: float = Field(gt=0)
    burst: int = Field(1, ge=1, le=1000)
