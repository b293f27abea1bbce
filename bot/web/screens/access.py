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
from channels.refused import Refused

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
        try:
            approved = await asyncio.to_thread(approve_code, panel.state_dir, code)
        except OSError as exc:
            return panel.back("/access", pairing_problem(exc))
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
        try:
            refused = await asyncio.to_thread(refuse_code, panel.state_dir, code)
        except OSError as exc:
            return panel.back("/access", pairing_problem(exc))
        if refused is None:
            return panel.back("/access", no_code_text(code))
        channel, sender = refused.channel, refused.sender_id
        log.info("pairing: request of %s user %s refused by web", channel, sender)
        return panel.back("/access", refused_text(channel, sender))

    async def revoke(request: web.Request) -> web.Response:
        """What ``memobot pairing revoke CHANNEL ID`` does."""
        from bot.pairing import revoke_paired

        form = await request.post()
        channel, sender = str(form.get("channel", "")), str(form.get("id", ""))
        if channel not in _channel_names():
            return panel.back("/access", f"No channel {channel!r}.")
        try:
            text = await asyncio.to_thread(revoke_paired, panel.state_dir, channel, sender)
        except OSError as exc:
            return panel.back("/access", pairing_problem(exc))
        if text.startswith("Revoked"):
            log.info("pairing: %s user %s revoked by web", channel, sender)
        cfg, problem = await panel.config()
        section = None if problem else getattr(cfg.channels, channel, None)
        if section is not None and (sender in section.allow_from or "*" in section.allow_from):
            # Pairing was not their only way in: the owner must not think them shut out.
            listed = sender if sender in section.allow_from else "*"
            text += (
                f" They can still talk: channels.{channel}.allowFrom lists {listed!r} "
                "(Settings to remove it)."
            )
        return panel.back("/access", text)

    async def let_in(request: web.Request) -> web.Response:
        """A refused sender's id added to allowFrom (as a guest, or as an admin), saved as
        a settings change is and applied to the running gateway at once."""
        from bot.config import ConfigError
        from bot.web.screens.settings import applied

        form = await request.post()
        channel, sender = str(form.get("channel", "")), str(form.get("id", ""))
        admin = form.get("admin") == "yes"
        _, problem = await panel.config()
        if problem:
            return panel.back("/access", problem)
        if channel not in _channel_names():
            return panel.back("/access", f"No channel {channel!r}.")
        if not sender.strip() or sender == "*":
            # "*" is everyone: a choice made in Settings, never by a button for one person.
            return panel.back("/access", f"Let in lets one person in, not {sender!r}.")
        try:
            after = await asyncio.to_thread(let_in_saved, panel.config_path, channel, sender, admin)
        except ConfigError as exc:
            return panel.back("/access", f"Nothing saved: {exc}")
        role = "an admin" if admin else "a guest"
        log.info("access: %s user %s let in as %s (allowFrom) by web", channel, sender, role)
        text = f"Let in {channel} user {sender} as {role}: added to channels.{channel}.allowFrom."
        return panel.back("/access", f"{text} {applied(panel, after)}")

    return [
        web.get("/access", show),
        web.post("/access/approve", approve),
        web.post("/access/refuse", refuse),
        web.post("/access/revoke", revoke),
        web.post("/access/let-in", let_in),
    ]


def let_in_saved(config_path: Path, channel: str, sender: str, admin: bool) -> Config:
    """Let ``sender`` in on ``channel`` in the config file as it is now (read, changed and
    written as one: an edit made meanwhile is never overwritten); the config it now loads."""
    from bot.config import parse_config, read_versioned, set_options
    from bot.onboard import let_in_changes

    raw, version = read_versioned(config_path)
    section = getattr(parse_config(raw, str(config_path)).channels, channel)
    written = raw.get("channels", {}).get(channel, {})
    changes = let_in_changes(section, written if isinstance(written, dict) else {}, sender, admin)
    paths = {("channels", channel, k): v for k, v in changes.items()}
    return set_options(config_path, raw, paths, version)


def pairing_problem(exc: OSError) -> str:
    """A pairing file that cannot be changed (damaged, not ours): said, not a server error."""
    log.error("pairing: cannot change the pairing file: %s", exc)
    return f"Nothing changed: {exc}"


def _channel_names() -> set[str]:
    from channels import registry

    return {n for n, s in registry.specs().items() if s.config is not None}


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
    refused: list[Refused]  # refused recently and not let in since, newest first


def access(cfg: Config) -> list[ChannelAccess]:
    """Every configurable channel: who may talk, who administers, and pairing."""
    from bot.pairing import PairingStore
    from channels import registry
    from channels.access import dm_policy_of
    from channels.refused import RefusedSenders

    state: Path = cfg.agent.state_path
    out = []
    for spec in registry.specs().values():
        section = spec.section(cfg)
        if section is None:
            continue
        pairing = PairingStore(state, spec.name).listing()
        let_in = {*section.allow_from, *(a.sender_id for a in pairing.approved)}
        refused = [
            r
            for r in RefusedSenders(state, spec.name).listing()
            if r.sender_id not in let_in and "*" not in let_in
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
                pairing=pairing,
                refused=refused,
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
            ]
        ),
        class_="facts",
    )
    if c.pairing.approved:
        rows_in: list[list[object]] = [
            [a.who, post_button("/access/revoke", "Revoke", csrf, channel=c.name, id=a.sender_id)]
            for a in c.pairing.approved
        ]
        paired = join([tag("h3", "Let in through pairing"), table(("Who", ""), rows_in)])
    else:
        paired = tag("p", "Nobody was let in through pairing.", class_="muted")
    refused = _refused(c, csrf, now)
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
    return tag("section", join([title, facts, refused, waiting, paired]), aria_label=c.name)


def _ago(seconds: float) -> str:
    minutes = max(0, int(seconds // 60))
    if minutes < 60:
        return f"{minutes} min ago"
    return f"{minutes // 60} h ago" if minutes < 48 * 60 else f"{minutes // 1440} days ago"


def _refused(c: ChannelAccess, csrf: str, now: float) -> Html:
    """Senders refused recently, each with the id memobot saw and the way in."""
    if not c.refused:
        return tag("p", "Nobody was refused recently.", class_="muted")
    rows: list[list[object]] = []
    for r in c.refused:
        where = f"{r.chat}, given a pairing code" if r.paired else r.chat
        actions = join(
            [
                post_button("/access/let-in", "Let in", csrf, True, channel=c.name, id=r.sender_id),
                " ",
                post_button(
                    "/access/let-in", "Let in as admin", csrf, channel=c.name, id=r.sender_id,
                    admin="yes",
                ),
            ]
        )  # fmt: skip
        rows.append([tag("code", r.sender_id), r.name, where, _ago(now - r.at), actions])
    note = tag(
        "p",
        "Let in adds the id to allowFrom (a guest: admins are pinned to who they are now); "
        "as admin, it also gets the owner's rights. A running gateway takes it at once.",
        class_="muted",
    )
    head = ("Id", "Name", "Where", "When", "")
    return join([tag("h3", "Refused recently"), table(head, rows), note])


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
