"""What a channel declares about itself, so the core never tests a platform's name.

Each platform package has a light ``spec`` module (no SDK import) with one ``ChannelSpec``:
its config section, how ``memobot doctor`` asks whether its tokens work, how its chat ids
tell a private chat from a group, where notices for the owner go, and the class that speaks
the platform, imported only when the channel is built. ``channels.registry`` lists them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from bot.bus import MessageBus
    from bot.config import Config
    from bot.config_base import ChannelConfig
    from channels.base import Channel


@dataclass(frozen=True, slots=True)
class TokenProbe:
    """One small request to a platform's API with a secret in it: whether a token is accepted
    (``memobot doctor``, ``memobot channels add``), or who wrote to the bot (``onboard``)."""

    channel: str  # "telegram", or "slack botToken" for one of several tokens
    method: str
    url: str = field(repr=False)  # may carry the token (Telegram's /bot<token>/)
    headers: dict[str, str] = field(repr=False)
    secret: str = field(repr=False)  # never printed: removed from every message
    fix: str = ""  # where the owner finds the right value, when the platform refused it


@dataclass(frozen=True, slots=True)
class Person:
    id: str  # the stable user id allowFrom takes
    name: str  # as shown to the owner: "@alice (Alice Smith)"


@dataclass(frozen=True, slots=True)
class OwnerSearch:
    """How ``memobot onboard`` finds the owner's id: the owner writes to the bot privately and
    a request that leaves the messages where they are (the gateway answers them later) shows
    who wrote."""

    request: Callable[[Any, int], TokenProbe]  # (section, seconds to long-poll) -> request
    senders: Callable[[Any], list[Person]]  # its JSON answer -> who wrote privately, in order


@dataclass(frozen=True, slots=True)
class Setup:
    """What ``memobot onboard`` and ``memobot channels add`` ask for and tell the owner."""

    tokens: tuple[tuple[str, str], ...]  # (section field, where the owner gets that token)
    id_help: str  # where the owner finds their own user id on the platform
    url_field: str = ""  # the section's API address (a self-hosted or test server), if any
    owner_search: OwnerSearch | None = None


def _never(chat: str) -> bool:
    return False


def _not_owner(chat: str, section: Any) -> bool:
    return False


def _nowhere(section: Any) -> str | None:
    return None


def _no_probes(section: Any) -> list[TokenProbe]:
    return []


def _unless_configured(cfg: Any) -> bool:
    return False


def _no_settings(cfg: Config, chat: str) -> Any:
    return None


def _ask(cfg: Any, chat: str) -> Unasked:
    return "ask"


# How a call that needs a person's approval is decided in a chat: "ask" (a question with
# buttons), or, where nobody can press one (a program on the API), "allow" or "refuse" it.
Unasked = Literal["ask", "allow", "refuse"]


@dataclass(frozen=True, slots=True)
class ChannelSpec:
    """One platform, as the core sees it. The callables take the platform's chat id (the
    part of a session key after ``<name>:``) and its config section (``config``)."""

    name: str  # the session keys' prefix, and the section ``channels.<name>`` when configured
    # "module:Class": a ``Channel`` built as Class(bus, section, workspace, state_dir)
    factory: str
    config: type[ChannelConfig] | None = None  # None: not configured in channels.* (terminal)
    token_probes: Callable[[Any], list[TokenProbe]] = field(default=_no_probes)
    # True only when the chat is provably one person's private chat; unknown: a group.
    private_chat: Callable[[str], bool] = field(default=_never)
    # True only when the chat is provably an admin's own private chat. (A channel without a
    # ``channels.*`` section is given the whole config instead: the API reads ``api.keys``.)
    owner_chat: Callable[[str, Any], bool] = field(default=_not_owner)
    # The chat id where notices for the owner go by default, when the section names one.
    admin_chat: Callable[[Any], str | None] = field(default=_nowhere)
    setup: Setup | None = None  # None: not set up from the command line (the terminal)
    # A channel without a ``channels.*`` section that the gateway runs when this says so for
    # the whole config (the panel's chat: when the panel is on).
    in_gateway: Callable[[Config], bool] = field(default=_unless_configured)
    # (config, chat id) -> how its approval questions are decided (``Unasked``).
    approvals: Callable[[Config, str], Unasked] = field(default=_ask)
    # A channel without a ``channels.*`` section: (config, chat id) -> the ``channels.*``
    # section whose rules (dmTools) govern the chat's person (the API: its key's person's).
    person_settings: Callable[[Config, str], Any] = field(default=_no_settings)

    def section(self, cfg: Config) -> ChannelConfig | None:
        return getattr(cfg.channels, self.name, None) if self.config is not None else None

    def build(self, bus: MessageBus, cfg: Config) -> Channel:
        """The channel, its module (and so its SDK) imported now and not before."""
        module, _, cls = self.factory.partition(":")
        channel_class = getattr(importlib.import_module(module), cls)
        workspace, state_dir = cfg.agent.workspace_path, Path(cfg.agent.state_path)
        channel: Channel = channel_class(bus, self.section(cfg), workspace, state_dir)
        return channel
