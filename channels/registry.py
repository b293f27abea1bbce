"""Every channel memobot knows: one line per platform.

A platform is a package under ``channels/`` whose light ``spec`` module holds its
``ChannelSpec``; listing it here is all the core needs. The spec modules import no SDK; a
platform's SDK is imported only when its channel is built (``ChannelSpec.build``).
"""

from __future__ import annotations

import functools
import importlib
from typing import TYPE_CHECKING, Any

from channels.spec import ChannelSpec, TokenProbe, Unasked

if TYPE_CHECKING:
    from bot.bus import MessageBus
    from bot.config import Config
    from channels.base import Channel

SPEC_MODULES = (
    "channels.telegram_channel.spec",
    "channels.discord_channel.spec",
    "channels.slack_channel.spec",
    "channels.terminal_channel.spec",
    "channels.web_channel.spec",
    "channels.api_channel.spec",
)


@functools.cache
def specs() -> dict[str, ChannelSpec]:
    """name -> spec, in the order above."""
    found = [importlib.import_module(m).SPEC for m in SPEC_MODULES]
    return {s.name: s for s in found}


def spec(name: str) -> ChannelSpec | None:
    return specs().get(name)


def enabled(cfg: Config) -> list[ChannelSpec]:
    """The configured channels the config enables, in registry order."""
    return [s for s in specs().values() if (sec := s.section(cfg)) is not None and sec.enabled]


def gateway_channels(cfg: Config) -> list[ChannelSpec]:
    """The channels a gateway runs: the enabled ones, then those it runs for the config as a
    whole (the panel's chat), in registry order."""
    configured = enabled(cfg)
    return configured + [s for s in specs().values() if s not in configured and s.in_gateway(cfg)]


def create_channel(name: str, bus: MessageBus, cfg: Config) -> Channel:
    found = spec(name)
    if found is None:
        raise ValueError(f"unknown channel {name!r}")
    return found.build(bus, cfg)


def private_chat(key: str) -> bool:
    """True when the chat of session ``key`` is provably one person's private chat, as its
    channel tells; a chat of an unknown channel counts as a group."""
    name, _, chat = key.partition(":")
    found = spec(name)
    return found is not None and found.private_chat(chat)


def owner_chat(cfg: Config, key: str) -> bool:
    """True when the chat of session ``key`` is provably an admin's own private chat."""
    name, _, chat = key.partition(":")
    found = spec(name)
    if found is None:
        return False
    # A channel configured outside channels.* (the API: api.keys) reads the whole config.
    return found.owner_chat(chat, found.section(cfg) if found.config is not None else cfg)


def settings_for(cfg: Config, key: str) -> Any:
    """The ``channels.*`` section whose rules govern the person of session ``key``'s chat: its
    channel's own, or for a channel without one (the API), the one its spec names; None."""
    name, _, chat = key.partition(":")
    found = spec(name)
    if found is None:
        return None
    return found.section(cfg) if found.config is not None else found.person_settings(cfg, chat)


def approvals(cfg: Config, key: str) -> Unasked:
    """How a call needing approval is decided in the chat of session ``key``: asked, unless
    its channel says nobody there can answer (the API: allowed or refused by its key)."""
    name, _, chat = key.partition(":")
    found = spec(name)
    return found.approvals(cfg, chat) if found is not None else "ask"


def admin_chat(cfg: Config) -> str | None:
    """The session key of the first enabled channel's default chat for the owner's notices
    (an admin's private chat, where the platform's ids name one); None when none does."""
    for s in enabled(cfg):
        chat = s.admin_chat(s.section(cfg))
        if chat is not None:
            return f"{s.name}:{chat}"
    return None


def token_probes(cfg: Config) -> list[TokenProbe]:
    """The requests ``memobot doctor`` makes to check each enabled channel's tokens."""
    return [p for s in enabled(cfg) for p in s.token_probes(s.section(cfg))]
