"""systemd unit files, rendered for one installation (``bot.service.install`` writes them).

The unit text is rendered here, from one template per kind, so the files shipped in
``systemd/`` (rendered with conventional paths) and the unit ``service install`` writes
(rendered with the real paths of the running installation) can never drift apart; a test
checks that the shipped files equal ``shipped_units()``.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from bot.service.notify import stop_budget

Kind = Literal["system", "user"]

UNIT_NAME = "memobot.service"
SERVICE_USER = "memobot"
SYSTEM_CONFIG = Path("/etc/memobot/config.json")
SYSTEM_STATE = Path("/var/lib/memobot")  # StateDirectory=memobot
# The one place the shipped files name an executable: where `pip install` puts console scripts.
SHIPPED_SYSTEM_EXEC = "/usr/local/bin/memobot"
_SHIPPED_HOME = Path("/home/SHIPPED")  # rendered as %h

_SYSTEM_HEADER = """\
# memobot as a system service: a dedicated user, state in /var/lib/memobot, config in /etc/memobot.
# Written by `memobot service install` for this installation; `memobot doctor` says whether the
# installed copy still matches. Set it up once:
#   useradd --system --user-group --home-dir /var/lib/memobot --shell /usr/sbin/nologin memobot
#   install -d -m 0755 /etc/memobot
#   install -o memobot -g memobot -m 0600 config.json {config}
# The config must keep the workspace and the state folder inside the state directory, the only
# place this unit may write (ProtectSystem=strict):
#   "agent": {{"workspace": "/var/lib/memobot/workspace", "stateDir": "/var/lib/memobot/state"}}
# Secrets: put OPENAI_API_KEY=... and other variables in /etc/memobot/env (root, mode 0600) and
# refer to them in the config as "${{OPENAI_API_KEY}}"; systemd reads that file as root.
# Exit code 78 (a config error) is not restarted: fix the config, then `systemctl restart memobot`.
"""

_USER_HEADER = """\
# memobot as a user service (systemctl --user), paths under your home (%h).
# Written by `memobot service install --user`; `memobot doctor` says whether it still matches.
#   systemctl --user daemon-reload && systemctl --user enable --now memobot
# A user service stops when you log out unless lingering is on: loginctl enable-linger $USER
# Exit code 78 (a config error) is not restarted: fix the config, then restart the service.
"""

# Lifecycle lines shared by both kinds. WatchdogSec: the gateway pings from its event loop
# every 30 s; a loop blocked for a minute is restarted. KillMode=mixed: SIGTERM goes to
# memobot alone, so it can drain running answers and stop the exec tool's commands itself;
# SIGKILL goes to everything left at TimeoutStopSec.
_SERVICE_COMMON = """\
Type=notify
NotifyAccess=main
ExecStart={exec_start}
ExecReload=/bin/kill -HUP $MAINPID
WatchdogSec=60
Restart=on-failure
RestartSec=5
RestartPreventExitStatus=78
# Running answers get gateway.drainSeconds ({drain:g} s) to finish, then queued replies are
# flushed: the stop timeout leaves a margin over that.
TimeoutStartSec=120
TimeoutStopSec={timeout_stop}
KillMode=mixed
UMask=0077
{resources}"""

# Limits for memobot and everything it runs, together; each command also has its own caps
# (tools.exec.maxProcesses, tools.exec.maxFileBytes). Delegate=pids hands memobot its cgroup's
# pids controller, so a command's process cap is a pids cgroup of its own, which holds even
# for root; memobot moves itself into a leaf ("memobot") below the service's cgroup for that.
# OOMPolicy=continue: a command killed at MemoryMax is that command's failure, not the
# service's (commands are the OOM killer's first choice: oom_score_adj 500).
_RESOURCES = """# Resource limits; change them in a drop-in: systemctl [--user] edit memobot
TasksMax={tasks_max}
MemoryHigh={memory_high}
MemoryMax={memory_max}
CPUQuota={cpu_quota}
OOMPolicy=continue
Delegate=pids
"""
TASKS_MAX = 4096
MEMORY_HIGH = "60%"  # of the machine's memory: reclaimed hard above it
MEMORY_MAX = "75%"  # killed above it: the rest of the machine keeps a quarter
CPU_QUOTA = "200%"  # two cores' worth

_SYSTEM_HARDENING = """\
# Sandbox: `systemd-analyze security --offline=yes` rates it 1.6 ("OK"). memobot keeps what it
# needs: outbound IPv4/IPv6 (LLM, chat platforms), AF_UNIX (DNS through nss, the notify socket),
# write access to its state directory and to its own cgroup (Delegate=pids; hence no
# ProtectControlGroups=, which would make /sys/fs/cgroup read-only), and fork/exec, so the exec
# tool runs ordinary commands in the workspace. Those commands inherit every restriction here:
# no setuid (sudo fails), no writable+executable memory (JIT runtimes such as node or java
# fail; remove MemoryDenyWriteExecute=yes if the agent must run them), denied system calls
# fail with EPERM.
NoNewPrivileges=yes
CapabilityBoundingSet=
AmbientCapabilities=
ProtectSystem=strict
ProtectHome=yes
PrivateTmp=yes
PrivateDevices=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectClock=yes
ProtectHostname=yes
ProtectProc=invisible
ProcSubset=pid
RestrictNamespaces=yes
RestrictRealtime=yes
RestrictSUIDSGID=yes
LockPersonality=yes
MemoryDenyWriteExecute=yes
RemoveIPC=yes
RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX
SystemCallArchitectures=native
SystemCallFilter=@system-service
# The exec tool confines each command with Landlock (not in @system-service before systemd 257).
SystemCallFilter=landlock_create_ruleset landlock_add_rule landlock_restrict_self
SystemCallFilter=~@privileged @resources
SystemCallErrorNumber=EPERM
"""

# User managers cannot set up mount namespaces for unprivileged users on every distribution,
# so the user unit keeps to restrictions that need no privileges (seccomp and prctl based).
_USER_HARDENING = """\
NoNewPrivileges=yes
RestrictRealtime=yes
RestrictSUIDSGID=yes
LockPersonality=yes
MemoryDenyWriteExecute=yes
RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX
SystemCallArchitectures=native
SystemCallFilter=@system-service
# The exec tool confines each command with Landlock (not in @system-service before systemd 257).
SystemCallFilter=landlock_create_ruleset landlock_add_rule landlock_restrict_self
SystemCallFilter=~@privileged @resources
SystemCallErrorNumber=EPERM
"""


@dataclass(frozen=True, slots=True)
class Installation:
    """What a unit needs to know about one installation of memobot."""

    command: tuple[str, ...]  # how to run memobot, e.g. ("/usr/local/bin/memobot",)
    config_path: Path
    workspace: Path
    state_dir: Path
    drain_seconds: float = 20.0
    home: Path | None = None  # user units: paths under it are written as %h/...


def memobot_command() -> tuple[str, ...]:
    """The command that runs the memobot being executed now.

    The console script's own path when started as ``memobot``; ``<python> -m bot`` when started
    as ``python -m bot``. Neither is resolved through symlinks: ``/usr/local/bin/memobot`` or a
    venv's ``bin/python`` must stay as they are to keep working after an upgrade.
    """
    argv0 = sys.argv[0] if sys.argv and sys.argv[0] else ""
    found = argv0 if os.sep in argv0 else (shutil.which(argv0) if argv0 else None)
    if found and not found.endswith(".py") and os.access(found, os.X_OK):
        return (os.path.abspath(found),)
    return (os.path.abspath(sys.executable), "-m", "bot")


_NEEDS_QUOTES = re.compile(r"[\s\"'\\;]")


def _escape(text: str) -> str:
    """Specifiers (%) and variables ($) taken literally."""
    return text.replace("%", "%%").replace("$", "$$")


def _quote(text: str) -> str:
    if _NEEDS_QUOTES.search(text) or not text:
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text


def unit_word(word: str) -> str:
    """One ExecStart= argument, taken literally by systemd."""
    return _quote(_escape(word))


def _path_word(path: Path, home: Path | None) -> str:
    if home is not None and path.is_relative_to(home):
        rest = path.relative_to(home)
        return _quote("%h" + ("" if rest == Path() else "/" + _escape(str(rest))))
    return unit_word(str(path))


def _exec_start(inst: Installation) -> str:
    words = [
        _path_word(Path(w), inst.home) if w.startswith("/") else unit_word(w) for w in inst.command
    ]
    words += ["--config", _path_word(inst.config_path, inst.home), "gateway"]
    return " ".join(words)


def _common(inst: Installation) -> str:
    resources = _RESOURCES.format(
        tasks_max=TASKS_MAX, memory_high=MEMORY_HIGH, memory_max=MEMORY_MAX, cpu_quota=CPU_QUOTA
    )
    return _SERVICE_COMMON.format(
        exec_start=_exec_start(inst),
        drain=inst.drain_seconds,
        timeout_stop=math.ceil(stop_budget(inst.drain_seconds)),
        resources=resources,
    )


def extra_writable_paths(inst: Installation) -> list[Path]:
    """Workspace or state folders outside /var/lib/memobot, which ProtectSystem=strict would
    make read-only: the system unit lists them in ReadWritePaths=."""
    return sorted(
        {p for p in (inst.workspace, inst.state_dir) if not p.is_relative_to(SYSTEM_STATE)}
    )


def render_system_unit(inst: Installation) -> str:
    rw = "".join(f"ReadWritePaths={unit_word(str(p))}\n" for p in extra_writable_paths(inst))
    return (
        _SYSTEM_HEADER.format(config=inst.config_path) + "\n[Unit]\n"
        "Description=memobot chat assistant\n"
        "Wants=network-online.target\n"
        "After=network-online.target\n"
        "\n[Service]\n" + _common(inst) + f"User={SERVICE_USER}\nGroup={SERVICE_USER}\n"
        "StateDirectory=memobot\n"
        "StateDirectoryMode=0700\n"
        "ConfigurationDirectory=memobot\n"
        "EnvironmentFile=-/etc/memobot/env\n"
        + rw
        + "\n"
        + _SYSTEM_HARDENING
        + "\n[Install]\nWantedBy=multi-user.target\n"
    )


def render_user_unit(inst: Installation) -> str:
    return (
        _USER_HEADER + "\n[Unit]\n"
        "Description=memobot chat assistant (user service)\n"
        "\n[Service]\n"
        + _common(inst)
        + "\n"
        + _USER_HARDENING
        + "\n[Install]\nWantedBy=default.target\n"
    )


def render(kind: Kind, inst: Installation) -> str:
    return render_system_unit(inst) if kind == "system" else render_user_unit(inst)


def shipped_units() -> dict[str, str]:
    """The contents of ``systemd/*.service``: conventional paths, default config."""
    system = Installation(
        (SHIPPED_SYSTEM_EXEC,),
        SYSTEM_CONFIG,
        SYSTEM_STATE / "workspace",
        SYSTEM_STATE / "state",
    )
    home = _SHIPPED_HOME
    user = Installation(
        (str(home / ".local/bin/memobot"),),
        home / ".memobot/config.json",
        home / ".memobot/workspace",
        home / ".memobot/state",
        home=home,
    )
    return {
        "memobot.service": render("system", system),
        "memobot-user.service": render("user", user),
    }
