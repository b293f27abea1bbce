"""``memobot onboard``'s steps after the folders: the model checked before the config is
saved, and the chat channels (tokens checked live, the owner's own id found or typed); and
``memobot channels add``, the channel step without the wizard.

A channel is set up as a plan of config changes (camelCase keys, as in the file). In a config
file that exists, the plan is applied to the file's own JSON, which keeps everything else as
written (``${VAR}`` references included); a new config is saved whole by onboard.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError
from pydantic.alias_generators import to_camel

from bot.config import (
    EX_CONFIG,
    Config,
    ConfigError,
    invalid_section,
    load_config,
    read_raw,
    set_options,
)
from bot.invocation import command_for

if TYPE_CHECKING:
    from bot.config_base import ChannelConfig
    from bot.service.checks import Check
    from channels.spec import ChannelSpec, Person

Ask = Callable[[str], str]  # shows a question, returns the answer (input, getpass)

EX_OK, EX_FAILED, EX_USAGE = 0, 1, 2
OWNER_WAIT_SECONDS = 120  # how long onboard waits for the owner's message to the bot
OWNER_POLL_SECONDS = 10  # one long poll of it


def _say(text: str = "") -> None:
    print(text, flush=True)


def _yes(answer: str, default: bool) -> bool:
    answer = answer.strip().lower()
    return default if not answer else answer in ("y", "yes")


# -- the model -------------------------------------------------------------------------------


def model_check(cfg: Config, config_path: Path, ask: Ask | None) -> bool:
    """Ask the model one question, as ``memobot doctor`` does, and say what was found; True
    when the config should be saved. On a failure ``ask`` (None: not a terminal, saved
    anyway) decides."""
    from bot.service.doctor import format_check
    from bot.service.probes import check_llm

    _say(f"\nChecking the model {cfg.llm.model} ...")
    probe = asyncio.run(check_llm(cfg, config_path))
    _say(format_check(probe.check))
    if probe.models is not None:
        listed = cfg.llm.model in probe.models
        shown = ", ".join(probe.models[:8]) + (", ..." if len(probe.models) > 8 else "")
        _say(
            f"  the server lists {len(probe.models)} model(s)"
            + (f", {cfg.llm.model} among them" if listed else f": {shown or 'none'}")
        )
    if probe.check.status == "ok":
        return True
    if ask is None:
        _say(
            f"  Saved anyway (not a terminal to ask); `{command_for(config_path, 'doctor')}` "
            "checks it again."
        )
        return True
    return _yes(ask("Save this config anyway? [y/N] "), default=False)


# -- a channel's plan ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ChannelPlan:
    """The changes to ``channels.<name>`` (keys as in the file), and the owner let in."""

    name: str
    changes: dict[str, Any]
    owner: str | None = None


def setup_specs() -> dict[str, ChannelSpec]:
    """The channels that can be set up from the command line, by name."""
    from channels import registry

    return {n: s for n, s in registry.specs().items() if s.setup is not None}


def _section(spec: ChannelSpec, current: dict[str, Any], changes: dict[str, Any]) -> Any:
    """The section with ``changes`` applied; raises ValidationError."""
    assert spec.config is not None
    return spec.config.model_validate({**current, **changes})


def check_owner_id(spec: ChannelSpec, owner: str) -> str | None:
    """Why ``owner`` cannot be a user id of this platform (None: it can)."""
    assert spec.config is not None
    try:
        spec.config.model_validate({"allowFrom": [owner]})
    except ValidationError as exc:
        return "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
    return None


def check_tokens(spec: ChannelSpec, section: ChannelConfig) -> list[Check]:
    """Each of the section's tokens asked of the platform, live."""
    from bot.service.probes import check_token

    return [asyncio.run(check_token(p, section.proxy)) for p in spec.token_probes(section)]


def access_changes(
    spec: ChannelSpec,
    current: dict[str, Any],
    owner: str | None,
    written: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """allowFrom/admins/dmPolicy changes so the channel never refuses everyone: the owner
    listed (and an admin), or else pairing for strangers' private messages. ``written``:
    the section as the file writes it, whose lists are kept as written (``${VAR}`` ids)."""
    from channels.access import dm_policy_of

    changes: dict[str, Any] = {}
    notes: list[str] = []
    section = _section(spec, current, {})
    allow = list(section.allow_from)
    if owner is not None:
        written = written or {}
        if owner not in allow:
            changes["allowFrom"] = [*as_written(allow, written.get("allowFrom")), owner]
        if section.admins is not None and owner not in section.admins:
            admins = as_written(section.admins, written.get("admins"))
            changes["admins"] = [*admins, owner]
        return changes, notes
    if not allow and dm_policy_of(section) != "pairing":
        changes["dmPolicy"] = "pairing"
        notes.append(
            f'channels.{spec.name}.dmPolicy was "allowlist" with nobody in allowFrom, which '
            'refuses everyone: set to "pairing"'
        )
    return changes, notes


def let_in_changes(
    section: ChannelConfig, written: dict[str, Any], sender_id: str, admin: bool
) -> dict[str, Any]:
    """allowFrom/admins changes that let ``sender_id`` in: as an admin, or as a guest (then
    an unset ``admins``, which means "the allowFrom ids", is pinned to who they are now, so
    the newcomer gets no admin rights by being listed). ``section`` as it loads decides;
    ``written`` (the section's JSON in the file) gives the lists as written, so an id given
    as ``${OWNER_ID}`` stays a reference."""
    changes: dict[str, Any] = {}
    allow = as_written(section.allow_from, written.get("allowFrom"))
    if sender_id not in section.allow_from:
        changes["allowFrom"] = [*allow, sender_id]
    if admin and section.admins is not None and sender_id not in section.admins:
        changes["admins"] = [*as_written(section.admins, written.get("admins")), sender_id]
    if not admin and section.admins is None:
        # admin_ids: the allowFrom ids but "*" (as it loads: a ${VAR} may be "*").
        changes["admins"] = [w for w, i in zip(allow, section.allow_from, strict=True) if i != "*"]
    return changes


def as_written(loaded: list[str], written: Any) -> list[str]:
    """A list of ids as the file writes it (``${VAR}`` entries kept), when ``written`` is
    that list (one entry for each loaded id); else the ids as loaded."""
    if isinstance(written, list) and len(written) == len(loaded):
        return [w if isinstance(w, str) else i for w, i in zip(written, loaded, strict=True)]
    return list(loaded)


def next_steps(cfg: Config, config_path: Path, plans: list[ChannelPlan]) -> list[str]:
    from bot.gateway import read_status

    if not plans:
        return []
    gateway = command_for(config_path, "gateway")
    lines = [
        f"Start memobot with the channel(s): {gateway} (or install the service: "
        f"{command_for(config_path, 'service install --user')})"
    ]
    live = read_status(cfg.agent.state_path)
    if live:
        lines.append(
            f"A gateway is running (pid {live['pid']}): restart it to connect "
            f"{', '.join(p.name for p in plans)}."
        )
    for plan in plans:
        if plan.owner is not None:
            lines.append(f"{plan.name}: write to the bot; it answers you (user {plan.owner}).")
        else:
            approve = command_for(config_path, "pairing approve CODE")
            lines.append(
                f"{plan.name}: the first private message from someone new gets a pairing code; "
                f"the gateway logs it and `{command_for(config_path, 'pairing list')}` shows "
                f"it. Let them in (you too) with: {approve}"
            )
    return lines


def _print_checks(checks: list[Check]) -> None:
    from bot.service.doctor import format_check

    for check in checks:
        _say("  " + format_check(check).replace("\n", "\n  "))


# -- the wizard's channel step ---------------------------------------------------------------


def ask_channels(
    cfg: Config,
    config_path: Path,
    ask: Ask,
    ask_secret: Ask,
    api_urls: dict[str, str] | None = None,
) -> list[ChannelPlan]:
    """Which chat channels, their tokens (checked live) and the owner's id; applies each to
    ``cfg``. ``api_urls``: a channel's API server other than the platform's own. Raises
    EOFError or KeyboardInterrupt when the person leaves."""
    specs = setup_specs()
    names = "/".join(specs)
    _say(f"\nChat channels: memobot can answer on {', '.join(specs)}.")
    plans: list[ChannelPlan] = []
    while True:
        answer = ask(f"Which ones? ({names}, several with commas, or none) [none]: ")
        chosen = [w.strip().lower() for w in answer.replace(" ", ",").split(",") if w.strip()]
        if chosen in ([], ["none"]):
            return plans
        unknown = [c for c in chosen if c not in specs]
        if not unknown:
            break
        _say(f"  not a channel memobot has: {', '.join(unknown)}")
    for name in dict.fromkeys(chosen):
        plan = _ask_channel(cfg, specs[name], ask, ask_secret, (api_urls or {}).get(name))
        if plan is not None:
            section = getattr(cfg.channels, name)
            current = section.model_dump(by_alias=True, exclude_unset=True)
            setattr(cfg.channels, name, _section(specs[name], current, plan.changes))
            plans.append(plan)
    return plans


def _ask_channel(
    cfg: Config, spec: ChannelSpec, ask: Ask, ask_secret: Ask, api_url: str | None
) -> ChannelPlan | None:
    assert spec.setup is not None
    section = getattr(cfg.channels, spec.name)
    current = section.model_dump(by_alias=True, exclude_unset=True)
    _say(f"\n{spec.name}:")
    while True:
        changes: dict[str, Any] = {"enabled": True}
        if api_url:
            changes[to_camel(spec.setup.url_field)] = api_url
        for key, where in spec.setup.tokens:
            token = ""
            while not token:
                token = ask_secret(f"  {spec.name} {to_camel(key)} ({where}; not shown): ").strip()
            changes[to_camel(key)] = token
        candidate = _section(spec, current, changes)
        checks = check_tokens(spec, candidate)
        _print_checks(checks)
        if not any(c.status == "fail" for c in checks):
            break
        if not _yes(ask(f"  Try another token for {spec.name}? [Y/n] "), default=True):
            _say(f"  {spec.name} left out.")
            return None
    owner = _ask_owner(spec, candidate, ask)
    access, notes = access_changes(spec, {**current, **changes}, owner)
    plan = ChannelPlan(spec.name, {**changes, **access}, owner)
    for note in notes:
        _say(f"  {note}")
    if owner is not None:
        _say(f"  Owner: {spec.name} user {owner}, in allowFrom and an admin.")
    return plan


def _ask_owner(spec: ChannelSpec, section: Any, ask: Ask) -> str | None:
    """The owner's user id: found from a message they send the bot, or typed; None: none."""
    assert spec.setup is not None
    _say(
        f"  Your own {spec.name} user id lets memobot answer you and treat you as its admin "
        "(without it, newcomers, you too, get a pairing code to approve)."
    )
    search = spec.setup.owner_search
    if search is not None and _yes(
        ask("  Find it now: you send the bot a message, memobot reads who wrote? [Y/n] "),
        default=True,
    ):
        found = _find_owner(spec, section, ask)
        if found is not None:
            return found
    _say(f"  (Where to find it: {spec.setup.id_help}.)")
    while True:
        typed = ask(f"  Your {spec.name} user id (Enter for none: pairing): ").strip()
        if not typed:
            return None
        problem = check_owner_id(spec, typed)
        if problem is None:
            return typed
        _say(f"  {problem}")


def _find_owner(spec: ChannelSpec, section: Any, ask: Ask) -> str | None:
    """Poll for a private message to the bot until the owner says it is theirs, for up to
    OWNER_WAIT_SECONDS; None on a timeout, an error (said), or Ctrl-C."""
    import aiohttp

    from bot.service.probes import fetch_json

    assert spec.setup is not None and spec.setup.owner_search is not None
    search = spec.setup.owner_search
    _say(
        f"  Send any message to your bot in a private chat now. Waiting up to "
        f"{OWNER_WAIT_SECONDS // 60} minutes (Ctrl-C to type the id instead)..."
    )
    refused: set[str] = set()
    deadline = time.monotonic() + OWNER_WAIT_SECONDS
    try:
        while (left := deadline - time.monotonic()) > 0:
            wait = max(1, min(OWNER_POLL_SECONDS, int(left)))
            probe = search.request(section, wait)
            try:
                status, body = asyncio.run(fetch_json(probe, section.proxy, seconds=wait + 10))
            except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
                reason = str(exc).replace(probe.secret, "<token>") or type(exc).__name__
                _say(f"  Could not read the bot's messages: {reason}")
                return None
            if status != 200:
                said = body.get("description") if isinstance(body, dict) else None
                _say(f"  Could not read the bot's messages (HTTP {status}: {said}).")
                return None
            for person in search.senders(body):
                if person.id in refused:
                    continue
                if _is_owner(person, ask):
                    return person.id
                refused.add(person.id)
    except KeyboardInterrupt:
        _say("")
        return None
    _say("  No private message came.")
    return None


def _is_owner(person: Person, ask: Ask) -> bool:
    who = f"{person.name}, user id {person.id}" if person.name else f"user id {person.id}"
    return _yes(ask(f"  A message from {who}. Is that you? [Y/n] "), default=True)


# -- memobot channels add ----------------------------------------------------------------------


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    channels = sub.add_parser(
        "channels",
        parents=[common],
        help="chat channels: channels add telegram --token T sets one up",
        description="Chat channels (channels.<name> in the config).",
    )
    verbs = channels.add_subparsers(dest="channels_command", metavar="SUBCOMMAND", required=True)
    add = verbs.add_parser(
        "add",
        parents=[common],
        help="enable a channel: its token checked live, the owner let in",
        description="Enable a chat channel in the config, as onboard's channel step does: the "
        "token(s) are checked with the platform first (nothing is written if it refuses "
        "them), the owner's id goes into allowFrom (and makes them an admin). Without "
        "--owner, a private message from someone new gets a pairing code "
        "(memobot pairing approve CODE). A token the config already has may be left out "
        "(to add --owner later). Everything else in the config stays as written. A running "
        "gateway connects the channel at its next start.",
        epilog="Examples: channels add telegram --token 123456:ABC... --owner 987654321; "
        "channels add discord --token T; channels add slack --bot-token xoxb-... "
        "--app-token xapp-...",
    )
    add.add_argument("channel", choices=tuple(setup_specs()), help="the platform")
    add.add_argument("--token", help="telegram, discord: the bot token")
    add.add_argument("--bot-token", help="slack: the bot token (xoxb-...)")
    add.add_argument("--app-token", help="slack: the app-level token (xapp-...), Socket Mode")
    add.add_argument("--owner", help="your own user id on that platform: allowed, and an admin")
    add.add_argument(
        "--api-url",
        help="a self-hosted or test API server: channels.telegram.baseUrl "
        "(http://host:port/bot) or channels.slack.apiUrl",
    )


def run_channels(args: argparse.Namespace, config_path: Path) -> int:
    """``memobot channels add``: exit 0 written, 1 a token refused, 2 usage, 78 config."""
    spec = setup_specs()[args.channel]
    assert spec.setup is not None
    if not config_path.exists():
        _err(
            f"{config_path} does not exist yet: run {command_for(config_path, 'onboard')} "
            "first (in a terminal it sets up channels too)"
        )
        return EX_CONFIG
    try:
        cfg, _ = load_config(config_path)  # its errors (and layout checks) first
        data = read_raw(config_path)
    except ConfigError as exc:
        _err(str(exc))
        return EX_CONFIG
    usage = _usage_problem(args, spec)
    if usage:
        _err(usage)
        return EX_USAGE
    # The section as loaded (${VAR} expanded): what the tokens are checked with.
    loaded = getattr(cfg.channels, spec.name).model_dump(by_alias=True, exclude_unset=True)
    changes: dict[str, Any] = {"enabled": True}
    for key, _ in spec.setup.tokens:
        given = getattr(args, key)
        if given:
            changes[to_camel(key)] = given
    if args.api_url:
        changes[to_camel(spec.setup.url_field)] = args.api_url
    merged = {**loaded, **changes}
    missing = [to_camel(k) for k, _ in spec.setup.tokens if not merged.get(to_camel(k))]
    if missing:
        flags = ", ".join("--" + k.replace("_", "-") for k, _ in spec.setup.tokens)
        _err(f"{spec.name} needs {', '.join(missing)}: give {flags}")
        return EX_USAGE
    try:
        candidate = _section(spec, loaded, changes)
    except ValidationError as exc:
        _err(invalid_section(exc, "channels", spec.name))
        return EX_CONFIG
    checks = check_tokens(spec, candidate)
    _print_checks(checks)
    if any(c.status == "fail" for c in checks):
        _err(f"Nothing written: {spec.name} refused the token.")
        return EX_FAILED
    written = data.get("channels", {}).get(spec.name)
    access, notes = access_changes(
        spec, {**loaded, **changes}, args.owner, written if isinstance(written, dict) else None
    )
    plan = ChannelPlan(spec.name, {**changes, **access}, args.owner)
    try:
        after = write_plans(config_path, data, [plan])
    except ConfigError as exc:
        _err(str(exc))
        return EX_CONFIG
    for note in notes:
        _say(note)
    who = f", owner {args.owner} (in allowFrom, an admin)" if args.owner else ""
    _say(f"Wrote channels.{spec.name} (enabled{who}) to {config_path}")
    for line in next_steps(after, config_path, [plan]):
        _say(line)
    return EX_OK


def write_plans(
    config_path: Path,
    data: dict[str, Any],
    plans: list[ChannelPlan],
    fields: dict[tuple[str, str], Any] | None = None,
) -> Config:
    """Apply ``plans`` and ``fields`` (``("llm", "model"): "x"``, camelCase as in the file) to
    ``data`` (the file's JSON, from ``read_raw``) with ``bot.config.set_options``."""
    changes: dict[tuple[str, ...], Any] = dict(fields or {})
    for plan in plans:
        changes.update({("channels", plan.name, k): v for k, v in plan.changes.items()})
    return set_options(config_path, data, changes)


def _usage_problem(args: argparse.Namespace, spec: ChannelSpec) -> str | None:
    assert spec.setup is not None
    takes = [k for k, _ in spec.setup.tokens]
    wrong = [k for k in ("token", "bot_token", "app_token") if getattr(args, k) and k not in takes]
    if wrong:
        flags = ", ".join("--" + k.replace("_", "-") for k in takes)
        return f"{spec.name} takes {flags}, not --{wrong[0].replace('_', '-')}"
    if args.api_url and not spec.setup.url_field:
        return f"{spec.name} has no API address to set (--api-url)"
    if args.owner is not None:
        problem = check_owner_id(spec, args.owner)
        if problem:
            return f"--owner {args.owner!r}: {problem}"
    return None


def _err(text: str) -> None:
    print(f"memobot: {text}", file=sys.stderr)
