"""Access: who may talk on each channel, and pairing codes to approve or refuse (what
``memobot pairing approve|refuse`` do)."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web

from bot.config import Config
from bot.pairing import Listing
from bot.web.render import Html, join, tag
from bot.web.server import page_response
from bot.web.views import Frame, page, post_button, table

if TYPE_CHECKING:
    from bot.web.server import Panel

log = logging.getLogger(__name__)
NAV = ("/access", "Access")


def routes(panel: Panel) -> list[web.RouteDef]:
    async def show(request: web.Request) -> web.Response:
        cfg, problem = await panel.config()
        channels = await asyncio.to_thread(access, cfg)
        frame = panel.frame(request, await panel.gateway_running())
        return page_response(access_page(channels, frame, problem))

    async def approve(request: web.Request) -> web.Response:
        """What ``memobot pairing approve CODE`` does."""
        from bot.pairing import approve_code, no_code_text

        code = str((await request.post()).get("code", ""))
        approved = await asyncio.to_thread(approve_code, panel.state_dir, code)
        if approved is None:
            return panel.back("/access", no_code_text(code))
        log.info("pairing: %s user %s approved by web", approved.channel, approved.sender_id)
        return panel.back(
            "/access", f"Approved {approved.channel} user {approved.who}: let in, and told so."
        )

    async def refuse(request: web.Request) -> web.Response:
        """What ``memobot pairing refuse CODE`` does."""
        from bot.pairing import no_code_text, refuse_code, refused_text

        code = str((await request.post()).get("code", ""))
        refused = await asyncio.to_thread(refuse_code, panel.state_dir, code)
        if refused is None:
            return panel.back("/access", no_code_text(code))
        channel, sender = refused.channel, refused.sender_id
        log.info("pairing: request of %s user %s refused by web", channel, sender)
        return panel.back("/access", refused_text(channel, sender))

    return [
        web.get("/access", show),
        web.post("/access/approve", approve),
        web.post("/access/refuse", refuse),
    ]


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


def _ids(ids: list[str], empty: str) -> Html:
    return join([tag("code", i) for i in ids], ", ") if ids else tag("span", empty, class_="muted")


def _channel_access(c: ChannelAccess, csrf: str, now: float) -> Html:
    state = "enabled" if c.enabled else "not enabled"
    admins_note = "" if c.admins_set else " (the allowFrom ids: admins is not set)"
    policy_note = "" if c.dm_policy_set else " (not set: the default for this allowFrom)"
    facts = tag(
        "dl",
        join(
            [
                tag("dt", "allowFrom"),
                tag("dd", _ids(c.allow_from, "nobody: strangers are refused or get a code")),
                tag("dt", "Admins"),
                tag("dd", join([_ids(c.admins, "none"), admins_note])),
                tag("dt", "dmPolicy"),
                tag("dd", join([tag("code", c.dm_policy), policy_note])),
                tag("dt", "Let in through pairing"),
                tag("dd", _ids([a.who for a in c.pairing.approved], "nobody")),
            ]
        ),
        class_="facts",
    )
    if c.pairing.waiting:
        rows: list[list[object]] = [
            [
                tag("code", w.code),
                w.who,
                f"{w.minutes_left(now):.0f} min",
                join(
                    [
                        post_button("/access/approve", "Approve", csrf, True, code=w.code),
                        " ",
                        post_button("/access/refuse", "Refuse", csrf, code=w.code),
                    ]
                ),
            ]
            for w in c.pairing.waiting
        ]
        waiting = join(
            [tag("h3", "Waiting for you"), table(("Code", "Who", "Time left", ""), rows)]
        )
    else:
        waiting = tag("p", "No pairing code waits.", class_="muted")
    title = tag("h2", join([c.name, " ", tag("span", f"({state})", class_="muted")]))
    return tag("section", join([title, facts, waiting]), aria_label=c.name)


def access_page(channels: list[ChannelAccess], frame: Frame, problem: str = "") -> Html:
    intro = tag(
        "p",
        "Who may talk to memobot on each channel. A stranger's private message gets a pairing "
        "code when dmPolicy is pairing; approve it here to let them in at once (as a guest, "
        "not an admin).",
    )
    parts = [intro]
    if problem:
        parts.append(tag("p", problem, class_="banner", role="alert"))
    now = time.time()
    parts.extend(_channel_access(c, frame.csrf, now) for c in channels)
    return page("Access", join(parts), frame)
