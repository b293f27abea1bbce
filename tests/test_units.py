"""systemd units: the shipped files, ``memobot service install``, and systemd's own verdicts."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bot.service.units import (
    Installation,
    render_system_unit,
    render_user_unit,
    shipped_units,
    unit_word,
)
from tests.helpers import REPO, run_memobot, write_config

SYSTEMD_DIR = REPO / "systemd"
EXPOSURE_LIMIT = 2.0
LIFECYCLE = (
    "Type=notify",
    "NotifyAccess=main",
    "WatchdogSec=60",
    "Restart=on-failure",
    "RestartSec=5",
    "RestartPreventExitStatus=78",
    "TimeoutStopSec=40",
    "KillMode=mixed",
    "ExecReload=/bin/kill -HUP $MAINPID",
)
needs_systemd_analyze = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None,
    reason="systemd-analyze is not installed (apt-get install systemd)",
)


def directives(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith(("#", "["))]


def exec_start(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("ExecStart="))


def test_shipped_units_are_the_rendered_ones() -> None:
    for name, text in shipped_units().items():
        assert (SYSTEMD_DIR / name).read_text() == text, (
            f"systemd/{name} is stale: regenerate it from bot.service.units.shipped_units()"
        )


@pytest.mark.parametrize("name", ["memobot.service", "memobot-user.service"])
def test_units_have_the_service_lifecycle(name: str) -> None:
    lines = directives((SYSTEMD_DIR / name).read_text())
    for wanted in LIFECYCLE:
        assert wanted in lines, f"{name} lacks {wanted}"


@pytest.mark.parametrize("name", ["memobot.service", "memobot-user.service"])
def test_units_limit_memobot_and_its_commands(name: str) -> None:
    lines = directives((SYSTEMD_DIR / name).read_text())
    for wanted in (
        "TasksMax=4096",
        "MemoryHigh=60%",
        "MemoryMax=75%",
        "CPUQuota=200%",
        "OOMPolicy=continue",
        "Delegate=pids",
    ):
        assert wanted in lines, f"{name} lacks {wanted}"
    # Delegation needs a writable cgroup: ProtectControlGroups=yes mounts it read-only.
    assert not [line for line in lines if line.startswith("ProtectControlGroups=")]


def test_system_unit_paths_and_secrets() -> None:
    lines = directives((SYSTEMD_DIR / "memobot.service").read_text())
    for wanted in (
        "User=memobot",
        "Group=memobot",
        "StateDirectory=memobot",
        "ConfigurationDirectory=memobot",
        "EnvironmentFile=-/etc/memobot/env",
        "ExecStart=/usr/local/bin/memobot --config /etc/memobot/config.json gateway",
        "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX",
        "ProtectSystem=strict",
        "CapabilityBoundingSet=",
    ):
        assert wanted in lines
    assert not [line for line in lines if line.startswith(("ReadWritePaths=", "IPAddressDeny="))]
    user = directives((SYSTEMD_DIR / "memobot-user.service").read_text())
    assert "ExecStart=%h/.local/bin/memobot --config %h/.memobot/config.json gateway" in user


def test_words_are_escaped_for_systemd() -> None:
    assert unit_word("/opt/memobot/bin/memobot") == "/opt/memobot/bin/memobot"
    assert unit_word("/srv/my bot/config.json") == '"/srv/my bot/config.json"'
    assert unit_word("/srv/100%/$HOME") == "/srv/100%%/$$HOME"
    inst = Installation(
        ("/home/ann/venv/bin/python", "-m", "bot"),
        Path("/home/ann/bots/a b/config.json"),
        Path("/home/ann/.memobot/workspace"),
        Path("/home/ann/.memobot/state"),
        drain_seconds=45,
        home=Path("/home/ann"),
    )
    assert exec_start(render_user_unit(inst)) == (
        'ExecStart=%h/venv/bin/python -m bot --config "%h/bots/a b/config.json" gateway'
    )
    assert "TimeoutStopSec=65" in directives(render_user_unit(inst))


def test_system_unit_opens_folders_outside_the_state_directory() -> None:
    inst = Installation(
        ("/usr/bin/memobot",),
        Path("/etc/memobot/config.json"),
        Path("/srv/memobot/workspace"),
        Path("/var/lib/memobot/state"),
    )
    assert "ReadWritePaths=/srv/memobot/workspace" in directives(render_system_unit(inst))


# -- service install -------------------------------------------------------------------------


def install(tmp_path: Path, *args: str, config: Path | None = None):
    env = {"MEMOBOT_UNIT_DIR": str(tmp_path / "units")}
    return run_memobot("service", "install", *args, config=config, env=env)


def test_dry_run_system_unit(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, "http://127.0.0.1:9/v1")
    result = install(tmp_path, "--dry-run", config=cfg)
    assert result.returncode == 0, result.stderr
    target = tmp_path / "units" / "memobot.service"
    assert result.stdout.startswith(f"# {target} (dry run: nothing written)\n")
    assert not target.exists()
    # Run as ``python -m bot``: the unit starts the same interpreter the same way.
    assert exec_start(result.stdout) == f"ExecStart={sys.executable} -m bot --config {cfg} gateway"
    lines = directives(result.stdout)
    assert "Type=notify" in lines and "User=memobot" in lines
    assert f"ReadWritePaths={tmp_path / 'state'}" in lines
    # A tmp workspace would vanish behind PrivateTmp=yes: said before anything is installed.
    assert "PrivateTmp" in result.stderr


def test_dry_run_system_unit_defaults_to_etc(tmp_path: Path) -> None:
    result = install(tmp_path, "--dry-run")
    assert result.returncode == 0, result.stderr
    assert "--config /etc/memobot/config.json gateway" in exec_start(result.stdout)
    assert not [line for line in directives(result.stdout) if "ReadWritePaths" in line]


def test_dry_run_user_unit(tmp_path: Path) -> None:
    home = Path(os.environ["HOME"])
    cfg = write_config(home, "http://127.0.0.1:9/v1")  # ~/config.json, workspace under ~
    result = install(tmp_path, "--user", "--dry-run", config=cfg)
    assert result.returncode == 0, result.stderr
    assert "--config %h/config.json gateway" in exec_start(result.stdout)
    lines = directives(result.stdout)
    assert "Type=notify" in lines and "WantedBy=default.target" in lines
    assert not [line for line in lines if line.startswith("User=")]


def test_console_script_path_is_used(tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "memobot"
    if not script.exists():
        pytest.skip("memobot console script not installed next to this Python")
    cfg = write_config(tmp_path, "http://127.0.0.1:9/v1")
    result = subprocess.run(
        [str(script), "--config", str(cfg), "service", "install", "--user", "--dry-run"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "MEMOBOT_UNIT_DIR": str(tmp_path / "units")},
    )
    assert exec_start(result.stdout) == f"ExecStart={script} --config {cfg} gateway"


def test_install_refuses_a_changed_unit_without_force(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, "http://127.0.0.1:9/v1")
    target = tmp_path / "units" / "memobot.service"
    first = install(tmp_path, "--user", config=cfg)
    assert first.returncode == 0, first.stderr
    assert f"wrote {target}" in first.stdout
    assert "systemctl --user daemon-reload && systemctl --user enable --now memobot" in first.stdout
    assert "loginctl enable-linger" in first.stdout
    assert oct(target.stat().st_mode & 0o777) == "0o644"
    again = install(tmp_path, "--user", config=cfg)
    assert again.returncode == 0 and "already installed" in again.stdout
    target.write_text(target.read_text().replace("RestartSec=5", "RestartSec=1"))
    refused = install(tmp_path, "--user", config=cfg)
    assert refused.returncode == 1
    assert "-RestartSec=1" in refused.stdout and "--force" in refused.stdout
    assert "RestartSec=1" in target.read_text()
    forced = install(tmp_path, "--user", "--force", config=cfg)
    assert forced.returncode == 0 and f"replaced {target}" in forced.stdout
    assert "RestartSec=5" in target.read_text()


def test_install_with_a_bad_config_is_a_config_error(tmp_path: Path) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text('{"agent": {"workspace": 5}}')
    result = install(tmp_path, "--user", config=cfg)
    assert result.returncode == 78 and "agent.workspace" in result.stderr
    assert not (tmp_path / "units").exists()


# -- systemd's verdict -----------------------------------------------------------------------


@needs_systemd_analyze
def test_system_unit_exposure_is_at_most_2() -> None:
    result = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", "memobot.service"],
        cwd=SYSTEMD_DIR,
        capture_output=True,
        text=True,
        timeout=60,
    )
    found = re.search(r"Overall exposure level for memobot\.service: ([0-9.]+)", result.stdout)
    assert found, result.stdout + result.stderr
    assert float(found.group(1)) <= EXPOSURE_LIMIT, result.stdout


@needs_systemd_analyze
@pytest.mark.parametrize("kind", ["system", "user"])
def test_rendered_units_verify_clean(tmp_path: Path, kind: str) -> None:
    # Rendered for this installation, so ExecStart names an executable that exists.
    cfg = write_config(tmp_path, "http://127.0.0.1:9/v1")
    flags = ["--user"] if kind == "user" else []
    rendered = install(tmp_path, *flags, config=cfg)
    assert rendered.returncode == 0, rendered.stderr
    unit = tmp_path / "units" / "memobot.service"
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    result = subprocess.run(
        ["systemd-analyze", *flags, "verify", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "XDG_RUNTIME_DIR": str(runtime)},
    )
    if kind == "user" and "Failed to initialize manager" in result.stderr:
        pytest.skip(f"systemd-analyze --user cannot run here: {result.stderr.strip()}")
    assert result.returncode == 0 and not result.stderr.strip(), result.stderr


def _mdwe_supported() -> bool:
    # PR_SET_MDWE (Linux 6.3+) is the kernel's own MemoryDenyWriteExecute=; probe in a child.
    probe = "import ctypes,sys; sys.exit(ctypes.CDLL(None).prctl(65, 1, 0, 0, 0))"
    return subprocess.run([sys.executable, "-c", probe], timeout=30).returncode == 0


def test_memobot_runs_without_writable_executable_memory(tmp_path: Path) -> None:
    """MemoryDenyWriteExecute=yes must not break memobot, its SDKs or the exec tool's shell."""
    if not _mdwe_supported():
        pytest.skip("this kernel has no PR_SET_MDWE (Linux 6.3+) to emulate it")
    script = """
import ctypes, mmap, subprocess, sys
ctypes.CDLL(None).prctl(65, 1, 0, 0, 0)
import bot.gateway, bot.service.doctor, openai, aiohttp, pydantic, dulwich, sqlite3
import telegram, discord, slack_bolt
sqlite3.connect(":memory:").execute("create virtual table t using fts5(x)")
callback = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int)(lambda x: x + 1)
assert callback(41) == 42
try:
    mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    sys.exit("W+X memory was allowed: the emulation is not in force")
except OSError:
    pass
print(subprocess.run(["sh", "-c", "echo $((6 * 7)) | cat"], capture_output=True, text=True).stdout)
"""
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "42"
