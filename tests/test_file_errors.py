"""A config, state folder or workspace memobot cannot use is one line naming the path, its
owner and mode and what to do, with exit 78, from every command; ``doctor`` fails that check
and runs the others. Nothing stored is changed.

The suite runs as root, who reads every file, so the other-user cases run ``python -m bot``
as a process that may not: uid 65534 against root's files where that uid can run this
interpreter, else root without any capability (no CAP_DAC_OVERRIDE) against 65534's files.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bot import cli
from tests.helpers import REPO, zygote

NOBODY = 65534
EX_CONFIG = 78


@dataclass(frozen=True, slots=True)
class Stranger:
    """How to run memobot as someone the files do not belong to."""

    prefix: tuple[str, ...]  # setpriv's arguments, to probe which way works here
    privileges: dict[str, Any]  # the same for tests.helpers.privileges
    files_uid: int  # the owner to give the files that process must not read
    owner: str  # that owner as the message names it
    own_uid: int  # the process's own uid, for the files it may use


@functools.cache
def _stranger() -> Stranger | None:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return None
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    as_nobody = ("setpriv", "--reuid", str(NOBODY), "--regid", str(NOBODY), "--clear-groups")
    # The same installation, not one it falls back on when it cannot read its own (a venv
    # whose base interpreter is under /root finds the system's standard library instead).
    same = f"import bot.cli, sys; sys.exit(sys.base_prefix != {sys.base_prefix!r})"
    probe = [*as_nobody, sys.executable, "-c", same]
    if subprocess.run(probe, env=env, cwd="/", capture_output=True).returncode == 0:
        return Stranger(as_nobody, {"uid": NOBODY, "gid": NOBODY}, 0, "root", NOBODY)
    # This interpreter lives where uid 65534 may not go (/root): the same test the other
    # way round. Without capabilities, root is held to the permission bits like anyone.
    no_caps = ("setpriv", "--bounding-set=-all", "--inh-caps=-all")
    if subprocess.run([*no_caps, "true"], capture_output=True).returncode != 0:
        return None
    return Stranger(no_caps, {"caps": "none"}, NOBODY, "nobody", 0)


@pytest.fixture
def stranger() -> Stranger:
    found = _stranger()
    if found is None:
        pytest.skip("needs root and setpriv to run memobot as another user")
    return found


@pytest.fixture
def home() -> Iterator[Path]:
    """A folder the other user may enter (pytest's own are root's 0700), as /etc or /var/lib."""
    path = Path(tempfile.mkdtemp(prefix="memobot-stranger-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def _home(tmp_path: Path, owner: int, config_mode: int) -> Path:
    """A memobot home made by ``onboard``, owned by ``owner``: config ``config_mode``,
    workspace and state 0700."""
    config = tmp_path / "config.json"
    args = ["--config", str(config), "onboard", "--base-url", "http://127.0.0.1:9/v1"]
    assert cli.main([*args, "--model", "m"]) == 0
    for path in (config, *tmp_path.rglob("*")):
        os.lchown(path, owner, owner)
    config.chmod(config_mode)
    for folder in ("workspace", "state"):
        (tmp_path / folder).chmod(0o700)
    return config


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _run(stranger: Stranger, config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "MEMOBOT_"))}
    env |= {"PYTHONPATH": str(REPO), "HOME": "/nonexistent"}
    return zygote.run(
        ["--config", str(config), *args],
        env=env,
        cwd="/",
        timeout=60,
        privileges=stranger.privileges,
    )


# (command, what belongs to the other user: "all" the config too, "folders" only the
# workspace and the state folder, the config readable; or one file, the rest the process's
# own), the path the line names.
SESSION = "state/sessions/cli%3Adirect.jsonl"
MEMORY = "workspace/memory/MEMORY.md"
CASES = [
    ("status", "all", "config.json"),
    ("onboard", "all", "config.json"),
    ("gateway", "all", "config.json"),
    ("agent -m hi", "all", "config.json"),
    ("service install --user --dry-run", "all", "config.json"),
    ("status", "folders", "state"),
    ("onboard", "folders", "state"),
    ("gateway", "folders", "workspace"),
    ("agent -m hi", "folders", "state"),
    ("cron list", "folders", "state"),
    ("memory log", "folders", "state"),
    ("pairing list", "folders", "state"),
    ("dream", "folders", "workspace"),
    ("agent -m hi", SESSION, SESSION),  # the one chat it opens
    ("gateway", MEMORY, MEMORY),  # read by every turn: not a failure per message
    ("agent -m hi", "state/", "state"),  # readable, but a new chat's file cannot be made
]


@pytest.mark.parametrize(("command", "owned", "named"), CASES)
def test_another_users_files_are_one_line_and_exit_78(
    home: Path, stranger: Stranger, command: str, owned: str, named: str
) -> None:
    tmp_path = home
    if owned in ("all", "folders"):
        config = _home(tmp_path, stranger.files_uid, 0o600 if owned == "all" else 0o644)
    elif owned.endswith("/"):
        config = _home(tmp_path, stranger.own_uid, 0o600)
        os.chown(tmp_path / owned, stranger.files_uid, stranger.files_uid)
        (tmp_path / owned).chmod(0o755)
    else:
        config = _home(tmp_path, stranger.own_uid, 0o600)
        (tmp_path / owned).parent.mkdir(exist_ok=True)
        os.chown((tmp_path / owned).parent, stranger.own_uid, stranger.own_uid)
        (tmp_path / owned).write_text('{"role": "user", "content": "hello"}\n')
        os.chown(tmp_path / owned, stranger.files_uid, stranger.files_uid)
        (tmp_path / owned).chmod(0o600)
    before = _snapshot(tmp_path)
    result = _run(stranger, config, *command.split())
    assert result.returncode == EX_CONFIG, result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert "Traceback" not in result.stderr
    assert line.startswith("memobot: cannot "), line
    assert str(tmp_path / named) in line and f"owner {stranger.owner}, mode 0" in line
    assert "permission denied" in line and "chown/chmod" in line
    assert result.stderr.count("\n") == 1, result.stderr
    assert _snapshot(tmp_path) == before


def test_doctor_fails_the_check_naming_the_path_and_runs_the_others(
    home: Path, stranger: Stranger
) -> None:
    tmp_path = home
    config = _home(tmp_path, stranger.files_uid, 0o644)
    result = _run(stranger, config, "doctor")
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    out = result.stdout
    sessions = tmp_path / "state" / "sessions"
    assert f"✗ cannot open {sessions}: permission denied by the folder {tmp_path / 'state'}" in out
    assert out.count(f"cannot open {sessions}") == 1  # told once, not by every check
    assert "fix: Run memobot as the owner of that folder" in out
    assert "✓ config valid" in out and "clock:" in out  # the checks before and after ran


# -- in process: a folder where a file belongs, a read-only disk --------------------------------


def _main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = cli.main(list(args))
    return code, capsys.readouterr().err


def test_a_folder_where_the_config_belongs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.json"
    config.mkdir()
    code, err = _main(capsys, "--config", str(config), "status")
    assert code == EX_CONFIG
    assert err.startswith(f"memobot: cannot read {config}: it is a folder where a file should be")
    assert err.count("\n") == 1 and "Move it away" in err


def test_a_file_where_the_state_folder_belongs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.json"
    state = tmp_path / "state"
    config.write_text(json.dumps({"agent": {"stateDir": str(state)}}))
    state.write_text("not a folder")
    code, err = _main(capsys, "--config", str(config), "cron", "list")
    assert code == EX_CONFIG, err
    assert f"{state} (owner root, mode 0644) is a file where a folder should be" in err
    assert state.read_text() == "not a folder"


@pytest.mark.parametrize(
    ("err", "said"),
    [(errno.EROFS, "the file system is read-only"), (errno.ENOSPC, "no space left")],
)
def test_a_read_only_or_full_disk_names_the_file_being_written(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    err: int,
    said: str,
) -> None:
    config = tmp_path / "config.json"
    assert cli.main(["--config", str(config), "onboard", "--model", "m"]) == 0
    before = config.read_bytes()
    real_open: Callable[..., int] = os.open

    def refusing_open(path: object, flags: int, *args: object, **kwargs: object) -> int:
        # The disk refuses the new temporary file: the error names only that file.
        if str(path).endswith(".tmp") and flags & os.O_CREAT:
            raise OSError(err, os.strerror(err), str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", refusing_open)
    code, out = _main(capsys, "--config", str(config), "onboard", "--model", "other")
    assert code == EX_CONFIG, out
    assert out.startswith(f"memobot: cannot write {config}: {said}") and out.count("\n") == 1
    assert config.read_bytes() == before
