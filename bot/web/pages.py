"""What each page shows, read with the functions the command line uses (``memobot status``,
``memobot pairing list``), so the panel and the commands never disagree. Blocking file
reads: the server calls these in a thread."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bot import __version__
from bot.config import Config
from bot.pairing import Listing
from bot.status import ChannelLine


@dataclass(frozen=True, slots=True)
class Overview:
    version: str
    model: str
    gateway: str
    gateway_running: bool
    channels: list[ChannelLine]
    sessions: int
    schedule: str  # the jobs and the next one due, as ``memobot status`` says it
    open_approvals: int


def overview(cfg: Config) -> Overview:
    from bot.approvals import open_approvals
    from bot.cron.commands import status_line as cron_status_line
    from bot.gateway import read_status
    from bot.session import SessionStore
    from bot.status import channel_lines, gateway_line, model_line, sessions_count

    state = cfg.agent.state_path
    live = read_status(state)
    return Overview(
        version=__version__,
        model=model_line(cfg),
        gateway=gateway_line(live, state),
        gateway_running=live is not None,
        channels=channel_lines(cfg, live),
        sessions=sessions_count(cfg),
        schedule=cron_status_line(cfg),
        # The count only: a waiting call's summary is the model's text, shown where it is
        # answered (its chat), not here.
        open_approvals=len(open_approvals(SessionStore(state))),
    )


@dataclass(frozen=True, slots=True)
class ChannelAccess:
    name: str
    enabled: bool
    allow_from: list[str]
    admins: list[str]
    admins_set: bool  # False: admins are the allowFrom ids (no "admins" in the config)
    dm_policy: str
    dm_policy_set: bool
    pairing: Listing  # codes waiting, people let in through pairing


def access(cfg: Config) -> list[ChannelAccess]:
    """Every configurable channel: who may talk, who administers, and pairing."""
    from bot.pairing import PairingStore
    from channels import registry
    from channels.access import dm_policy_of

    state: Path = cfg.agent.state_path
    out = []
    for spec in registry.specs().values():
        section = spec.section(cfg)
        if section is None:
            continue
        out.append(
            ChannelAccess(
                name=spec.name,
                enabled=section.enabled,
                allow_from=list(section.allow_from),
                admins=list(section.admin_ids),
                admins_set=section.admins is not None,
                dm_policy=dm_policy_of(section),
                dm_policy_set=section.dm_policy is not None,
                pairing=PairingStore(state, spec.name).listing(),
            )
        )
    return out
