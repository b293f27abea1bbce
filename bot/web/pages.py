"""What each page shows, read with the functions the command line uses (``memobot status``,
``memobot pairing list``), so the panel and the commands never disagree. Blocking file
reads: the server calls these in a thread."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from bot import __version__
from bot.config import Config
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
    from bot.approvals import describe_open
    from bot.cron.commands import status_line as cron_status_line
    from bot.gateway import read_status
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
        open_approvals=len(describe_open(state)),
    )


@dataclass(frozen=True, slots=True)
class Waiting:
    """A pairing code waiting for the owner (``memobot pairing list``'s "waiting" line)."""

    code: str
    sender_id: str
    name: str
    minutes_left: int


@dataclass(frozen=True, slots=True)
class ChannelAccess:
    name: str
    enabled: bool
    allow_from: list[str]
    admins: list[str]
    admins_set: bool  # False: admins are the allowFrom ids (no "admins" in the config)
    dm_policy: str
    dm_policy_set: bool
    waiting: list[Waiting]
    paired: list[str]  # ids let in through pairing, with their names


def access(cfg: Config) -> list[ChannelAccess]:
    """Every configurable channel: who may talk, who administers, and pairing."""
    from bot.pairing import CODE_TTL_SECONDS, PairingStore
    from channels import registry
    from channels.access import dm_policy_of

    state: Path = cfg.agent.state_path
    now = time.time()
    out = []
    for spec in registry.specs().values():
        section = spec.section(cfg)
        if section is None:
            continue
        data = PairingStore(state, spec.name).snapshot()
        waiting = [
            Waiting(
                str(p["code"]),
                str(p["id"]),
                str(p.get("name", "")),
                max(0, round((CODE_TTL_SECONDS - (now - p["created"])) / 60)),
            )
            for p in data["pending"]
        ]
        paired = [
            f"{a['id']} ({a['name']})" if a.get("name") else str(a["id"]) for a in data["approved"]
        ]
        out.append(
            ChannelAccess(
                name=spec.name,
                enabled=section.enabled,
                allow_from=list(section.allow_from),
                admins=list(section.admin_ids),
                admins_set=section.admins is not None,
                dm_policy=dm_policy_of(section),
                dm_policy_set=section.dm_policy is not None,
                waiting=waiting,
                paired=paired,
            )
        )
    return out
