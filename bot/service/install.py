"""``memobot service install``: put this installation's unit where systemd looks for it.

A unit that differs from what would be written is never replaced silently: the difference is
shown and ``--force`` is needed, since an operator may have edited it on purpose.
"""

from __future__ import annotations

import difflib
import os
import pwd
import sys
from dataclasses import dataclass
from pathlib import Path

from bot import durable
from bot.config import EX_CONFIG, Config, ConfigError, default_config_path, load_config
from bot.service.units import (
    SERVICE_USER,
    SYSTEM_CONFIG,
    SYSTEM_STATE,
    UNIT_NAME,
    Installation,
    Kind,
    memobot_command,
    render,
)

SYSTEM_UNIT_DIR = Path("/etc/systemd/system")
# Tests and packagers write units elsewhere (e.g. into a package build root).
UNIT_DIR_ENV = "MEMOBOT_UNIT_DIR"


def unit_dir(kind: Kind) -> Path:
    override = os.environ.get(UNIT_DIR_ENV)
    if override:
        return Path(override).expanduser()
    if kind == "system":
        return SYSTEM_UNIT_DIR
    config_home = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config_home) / "systemd" / "user"


@dataclass(frozen=True, slots=True)
class Plan:
    kind: Kind
    target: Path
    text: str
    installation: Installation
    config_exists: bool


def plan(kind: Kind, config_path: Path | None) -> Plan:
    """The unit ``service install`` would write. Raises ConfigError for an unusable config.

    The system unit's config defaults to /etc/memobot/config.json (not the caller's
    ~/.memobot: the service user cannot see home folders); a missing config file renders with
    the system defaults that the header comment asks for.
    """
    if kind == "system":
        path = (config_path or SYSTEM_CONFIG).expanduser().absolute()
    else:
        path = (config_path or default_config_path()).expanduser().absolute()
    exists = path.exists()
    cfg, _ = load_config(path)
    if kind == "system" and not exists:
        cfg = Config.model_validate(
            {
                "agent": {
                    "workspace": str(SYSTEM_STATE / "workspace"),
                    "stateDir": str(SYSTEM_STATE / "state"),
                }
            }
        )
    inst = Installation(
        memobot_command(),
        path,
        cfg.agent.workspace_path.absolute(),
        cfg.agent.state_path.absolute(),
        cfg.gateway.drain_seconds,
        home=Path.home() if kind == "user" else None,
    )
    return Plan(kind, unit_dir(kind) / UNIT_NAME, render(kind, inst), inst, exists)


def system_warnings(inst: Installation) -> list[str]:
    """What would make the system unit fail under its sandbox, said before it is installed."""
    out = []
    named = {
        "memobot command": Path(inst.command[0]),
        "config": inst.config_path,
        "workspace": inst.workspace,
        "state folder": inst.state_dir,
    }
    for what, p in named.items():
        if any(p.is_relative_to(h) for h in ("/home", "/root", "/run/user")):
            out.append(
                f"the {what} {p} is under a home folder, which the system unit hides "
                "(ProtectHome=yes): install memobot system-wide (e.g. /opt/memobot or "
                "/usr/local) and keep its data in /var/lib/memobot, or use --user"
            )
        elif any(p.is_relative_to(t) for t in ("/tmp", "/var/tmp")):
            out.append(
                f"the {what} {p} is in a temporary folder, which the system unit replaces "
                "with a private empty one (PrivateTmp=yes)"
            )
    return out


def next_steps(p: Plan) -> list[str]:
    if p.kind == "user":
        return [
            "systemctl --user daemon-reload && systemctl --user enable --now memobot",
            "loginctl enable-linger $USER   # keep it running when you are logged out",
            "journalctl --user -u memobot -f   # follow its logs",
        ]
    steps = []
    try:
        pwd.getpwnam(SERVICE_USER)
    except KeyError:
        steps.append(
            "useradd --system --user-group --home-dir /var/lib/memobot "
            "--shell /usr/sbin/nologin memobot"
        )
    if not p.config_exists:
        steps.append(
            f"create {p.installation.config_path} (owner memobot, mode 0600) with "
            '"agent": {"workspace": "/var/lib/memobot/workspace", '
            '"stateDir": "/var/lib/memobot/state"} and your llm and channels settings'
        )
    steps += [
        "systemctl daemon-reload && systemctl enable --now memobot",
        "journalctl -u memobot -f   # follow its logs",
    ]
    return steps


def write_unit(target: Path, text: str) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    durable.replace_file(target, text, mode=0o644, chmod=0o644)


def cmd_service_install(
    kind: Kind, config_path: Path | None, dry_run: bool = False, force: bool = False
) -> int:
    """Returns 0 when the unit is (or already was) in place, 1 when refused or not writable."""
    try:
        p = plan(kind, config_path)
    except ConfigError as exc:
        print(f"memobot: {exc}", file=sys.stderr)
        return EX_CONFIG
    if kind == "system":
        for warning in system_warnings(p.installation):
            print(f"warning: {warning}", file=sys.stderr)
    if dry_run:
        print(f"# {p.target} (dry run: nothing written)")
        print(p.text, end="")
        return 0
    try:
        current = p.target.read_text()
    except FileNotFoundError:
        current = None
    if current == p.text:
        print(f"already installed: {p.target} matches this installation")
        return 0
    if current is not None and not force:
        print(f"{p.target} exists and differs from what this installation would write:")
        sys.stdout.writelines(
            difflib.unified_diff(
                current.splitlines(keepends=True),
                p.text.splitlines(keepends=True),
                str(p.target),
                "new",
            )
        )
        print("Not overwritten. Run again with --force to replace it.")
        return 1
    try:
        write_unit(p.target, p.text)
    except PermissionError:
        hint = "run it as root (sudo)" if kind == "system" else "check the folder's owner"
        print(f"memobot: cannot write {p.target}: permission denied; {hint}", file=sys.stderr)
        return 1
    print(f"{'replaced' if current is not None else 'wrote'} {p.target}")
    print("next:")
    for step in next_steps(p):
        print(f"  {step}")
    return 0
