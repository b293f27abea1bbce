"""exec: real subprocesses in a tmp workspace; timeouts, cancellation and the command guard.

Refusal tests that go through the tool put ``false &&`` before the dangerous part: if the guard
ever broke, the shell would still not run it, and the ``ran`` marker shows the guard failed.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bot.config import ExecConfig
from bot.gate import Gate
from bot.tools.base import ToolContext, ToolRegistry
from bot.tools.shell import ExecTool, check_command


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    path.mkdir()
    return path.resolve()  # pwd prints the real path


@pytest.fixture
def gate(ws: Path) -> Iterator[Gate]:
    g = Gate(ws)
    yield g
    g.close()


@pytest.fixture
def ctx(ws: Path, gate: Gate) -> ToolContext:
    return ToolContext(workspace=ws, gate=gate)


def make_registry(**cfg: float) -> ToolRegistry:
    registry = ToolRegistry()
    registry.register(ExecTool(ExecConfig(**cfg), kill_grace_seconds=0.3))
    return registry


async def run(ctx: ToolContext, command: str, limit: float | None = None, **cfg: float) -> str:
    """Call exec through the registry; ``limit`` is the timeout argument, ``cfg`` ExecConfig."""
    payload: dict[str, object] = {"command": command}
    if limit is not None:
        payload["timeout"] = limit
    return await make_registry(**cfg).execute("exec", json.dumps(payload), ctx)


def alive(pid: int) -> bool:
    """A process that exists and is not a zombie (this container's init may not reap)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


async def wait_dead(pid: int, within: float = 3.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        await asyncio.sleep(0.02)
    return False


def read_if_present(path: Path) -> str:
    return path.read_text().strip() if path.exists() else ""


async def wait_for_file(path: Path, within: float = 5.0) -> str:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if text := read_if_present(path):
            return text
        await asyncio.sleep(0.02)
    raise AssertionError(f"{path} never appeared")


# ---------------------------------------------------------------------------------------------
# Running


async def test_runs_in_the_workspace_and_returns_output(ctx: ToolContext, ws: Path) -> None:
    assert await run(ctx, "echo hello") == "hello\n"
    assert await run(ctx, "pwd") == f"{ctx.workspace}\n"
    await run(ctx, "echo data > made.txt")
    assert (ws / "made.txt").read_text() == "data\n"


async def test_nonzero_exit_and_stderr_are_reported(ctx: ToolContext) -> None:
    out = await run(ctx, "echo out; echo err >&2; exit 3")
    assert out == "out\nerr\nexit code 3"
    assert await run(ctx, "exit 1") == "(no output)\nexit code 1"
    assert await run(ctx, "true") == "(no output)"
    assert "killed by signal SIGKILL" in await run(ctx, "kill -9 $$")


async def test_stdin_is_empty_so_readers_do_not_hang(ctx: ToolContext) -> None:
    started = time.monotonic()
    assert await run(ctx, "cat; read line; echo done") == "done\n"
    assert time.monotonic() - started < 5


async def test_daemon_secrets_are_not_in_the_environment(
    ctx: ToolContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEMOBOT_TEST_API_KEY", "sk-do-not-leak")
    monkeypatch.setenv("TELEGRAM_BOT_TOKEN", "123:do-not-leak")
    monkeypatch.setenv("MEMOBOT_TEST_PLAIN", "not-on-the-allowlist")
    monkeypatch.setenv("TZ", "Europe/Berlin")
    out = await run(ctx, "env")
    assert "do-not-leak" not in out
    assert "not-on-the-allowlist" not in out  # an allowlist, not a pattern of secret names
    assert "TZ=Europe/Berlin" in out
    assert ctx.gate is not None and f"HOME={ctx.gate.home}\n" in out


async def test_long_output_keeps_head_and_tail(ctx: ToolContext) -> None:
    out = await run(ctx, "seq 1 20000", max_output_chars=200)
    assert out.startswith("1\n2\n3\n")
    assert out.rstrip().endswith("19999\n20000")
    assert "bytes of output omitted" in out
    assert len(out) < 320


async def test_timeout_kills_the_whole_process_group(ctx: ToolContext, ws: Path) -> None:
    started = time.monotonic()
    out = await run(ctx, "echo started; sleep 30 & echo $! > bg.pid; sleep 30", limit=0.5)
    assert out.startswith("Error: command timed out after 0.5 s")
    assert "started" in out
    assert time.monotonic() - started < 5
    assert await wait_dead(int((ws / "bg.pid").read_text()))


async def test_timeout_is_capped_by_the_config(ctx: ToolContext) -> None:
    started = time.monotonic()
    out = await run(ctx, "sleep 30", limit=1000, timeout_seconds=0.4)
    assert "timed out after 0.4 s" in out
    assert time.monotonic() - started < 5
    assert "positive" in await run(ctx, "true", limit=0)


async def test_cancellation_kills_the_group_and_reraises(ctx: ToolContext, ws: Path) -> None:
    tool = ExecTool(ExecConfig(), kill_grace_seconds=0.3)
    task = asyncio.create_task(
        tool.run({"command": "echo $$ > sh.pid; sleep 30 & echo $! > bg.pid; wait"}, ctx)
    )
    sh_pid = int(await wait_for_file(ws / "sh.pid"))
    bg_pid = int(await wait_for_file(ws / "bg.pid"))
    assert alive(bg_pid)
    started = time.monotonic()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert time.monotonic() - started < 3
    assert await wait_dead(bg_pid, within=10) and await wait_dead(sh_pid, within=10)


async def test_cancellation_sigkills_what_ignores_sigterm(ctx: ToolContext, ws: Path) -> None:
    tool = ExecTool(ExecConfig(), kill_grace_seconds=0.3)
    # The ignored SIGTERM is inherited by the sleep as well.
    command = "trap '' TERM; sleep 30 & echo $! > bg.pid; wait; wait"
    task = asyncio.create_task(tool.run({"command": command}, ctx))
    bg_pid = int(await wait_for_file(ws / "bg.pid"))
    started = time.monotonic()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert 0.25 <= time.monotonic() - started < 3  # the grace was given, then SIGKILL
    assert await wait_dead(bg_pid)


async def test_bad_input(ctx: ToolContext, tmp_path: Path) -> None:
    assert "must not be empty" in await run(ctx, "   ")
    missing = ToolContext(workspace=tmp_path / "nope", gate=ctx.gate)
    assert "does not exist" in await run(missing, "true")


# ---------------------------------------------------------------------------------------------
# HOME and git: nothing the model wrote into the workspace is read as a program to run

EVIL = '#!/bin/sh\necho "$0 $*" >> {marker}\n'
HOOKS = ("pre-commit", "post-commit", "post-index-change", "reference-transaction")
# Each runs a program the workspace names (see plant_repo); the comment says which.
GIT_ATTACKS = (
    "git status",  # core.fsmonitor, the post-index-change hook
    "git commit -q --allow-empty -m x",  # hooks, gpg.program (commit.gpgSign)
    "git commit -q --allow-empty",  # core.editor
    "git fetch -q origin",  # core.sshCommand
    "git ls-remote ext",  # an ext:: remote (protocol.ext.allow)
    "git st",  # an alias in the workspace's .gitconfig, read when HOME is the workspace
    "printf 'protocol=https\\nhost=x\\n\\n' | git credential fill",  # helper, askpass
    "git rebase -q -i --root",  # sequence.editor (last: it leaves a rebase going)
)


def git(ws: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(ws), *args], check=True, capture_output=True)


def plant_repo(ws: Path) -> Path:
    """A repository in the workspace whose .git/config, hooks and a .gitconfig beside it
    name a program that appends a line to the returned marker file."""
    marker = ws / "ran.txt"
    evil = ws / ".evil"
    evil.write_text(EVIL.format(marker=marker))
    evil.chmod(0o755)
    (ws / "a.txt").write_text("a\n")
    git(ws, "init", "-q")
    git(ws, "add", "a.txt")
    git(ws, "-c", "user.name=o", "-c", "user.email=o@x", "commit", "-q", "-m", "one")
    hooks = ws / ".hooks"
    hooks.mkdir()
    for name in HOOKS:
        for folder in (hooks, ws / ".git" / "hooks"):
            shutil.copy(evil, folder / name)
    for key, value in {
        "user.name": "m", "user.email": "m@x",
        "core.fsmonitor": f"{evil} fsmonitor", "core.hooksPath": str(hooks),
        "core.editor": f"{evil} editor", "sequence.editor": f"{evil} sequence",
        "core.sshCommand": f"{evil} ssh", "credential.helper": f"!{evil} credential",
        "core.askPass": str(evil),
        "gpg.program": str(evil), "commit.gpgSign": "true",
        "remote.origin.url": "ssh://git@127.0.0.1:1/x", "protocol.ext.allow": "always",
        "remote.ext.url": f"ext::{evil} ext",
    }.items():  # fmt: skip
        git(ws, "config", key, value)
    (ws / ".gitconfig").write_text(f'[alias]\n\tst = "!{evil} alias"\n')
    return marker


def test_every_planted_git_setting_runs_in_plain_git(ws: Path) -> None:
    """The control for the tests below: each attack command runs the model's program when
    git reads the repository and HOME as they are (as git did in commands before)."""
    marker = plant_repo(ws)
    env = {"PATH": os.environ["PATH"], "HOME": str(ws)}
    for command in GIT_ATTACKS:
        before = read_if_present(marker)
        argv = ["/bin/sh", "-c", command]
        subprocess.run(argv, cwd=ws, env=env, stdin=subprocess.DEVNULL, capture_output=True)
        assert read_if_present(marker) != before, command


async def test_git_in_a_command_runs_no_program_the_workspace_names(
    ctx: ToolContext, ws: Path
) -> None:
    assert ctx.gate is not None
    marker = plant_repo(ws)
    # Also where HOME really is: a .gitconfig there is the model's to write as well.
    ctx.gate.home.mkdir(parents=True)
    shutil.copy(ws / ".gitconfig", ctx.gate.home / ".gitconfig")
    outs = {command: await run(ctx, command) for command in GIT_ATTACKS}
    assert read_if_present(marker) == "", outs
    assert "On branch" in outs["git status"]  # git itself works
    assert "'ext' not allowed" in outs["git ls-remote ext"]
    assert "'st' is not a git command" in outs["git st"]


async def test_commands_get_a_home_of_their_own(ctx: ToolContext, ws: Path) -> None:
    assert ctx.gate is not None
    marker = ws / "ran.txt"
    for name in (".profile", ".bashrc", ".bash_profile"):
        (ws / name).write_text(f"echo {name} >> {marker}\n")
    out = await run(ctx, 'echo "$HOME"; cd "$HOME" && pwd; bash -l -c true; bash -i -c true; env')
    assert read_if_present(marker) == ""  # no shell read the workspace's dotfiles
    home, pwd = out.splitlines()[:2]
    assert home == pwd == str(ctx.gate.home) and not Path(home).is_relative_to(ws)
    for name in ("CONFIG", "CACHE", "DATA", "STATE"):
        assert f"XDG_{name}_HOME={home}/" in out
    # The home is the commands' own: writable, kept between commands, made again if removed.
    assert await run(ctx, "echo kept > ~/note; rm -rf ~/.cache") == "(no output)"
    assert await run(ctx, "cat ~/note") == "kept\n"
    await run(ctx, 'rm -r "$TMPDIR/home"')
    assert await run(ctx, 'cd "$HOME" && pwd') == f"{home}\n"


async def test_a_private_folder_is_out_of_the_commands_reach(ctx: ToolContext) -> None:
    assert ctx.gate is not None
    folder = ctx.gate.private_folder("mcp-x")
    assert folder == ctx.gate.private_folder("mcp-x") and folder.is_dir()
    (folder / "secret").write_text("server's own")
    out = await run(ctx, f"cat {folder}/secret; touch {folder}/planted")
    assert "server's own" not in out and "Permission denied" in out
    assert not (folder / "planted").exists()
    ctx.gate.close()
    assert not folder.exists()


async def test_path_keeps_no_folder_the_agent_can_write(
    ctx: ToolContext, ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (ws / "bin").mkdir()
    for folder in (ws, ws / "bin"):
        (folder / "ls").write_text(f"#!/bin/sh\necho planted > {ws}/ran.txt\n")
        (folder / "ls").chmod(0o755)
    monkeypatch.setenv("PATH", f":.:bin:{ws}/bin:{ws}:{os.environ['PATH']}")
    await run(ctx, "ls")
    assert read_if_present(ws / "ran.txt") == ""
    kept = [p for p in os.environ["PATH"].split(":") if p.startswith("/")]
    expected = [p for p in dict.fromkeys(kept) if not Path(p).is_relative_to(ws)]
    assert (await run(ctx, 'echo "$PATH"')).strip() == ":".join(expected)


async def test_a_clean_filter_still_runs_which_is_why_git_asks_first(
    ctx: ToolContext, ws: Path
) -> None:
    """The limit of the git settings (README: git is not in the default allow list): a
    filter named in .gitattributes runs under `git status`, confined."""
    marker = plant_repo(ws)
    (ws / ".gitattributes").write_text("a.txt filter=x\n")
    git(ws, "config", "filter.x.clean", f"{ws / '.evil'} filter")
    (ws / "a.txt").write_text("b\n")  # same size: git must hash it, through the filter
    os.utime(ws / "a.txt", (time.time() + 5, time.time() + 5))
    await run(ctx, "git status")
    assert "filter" in read_if_present(marker)


# ---------------------------------------------------------------------------------------------
# The guard, through the tool


DESTRUCTIVE = [
    "rm -rf /",
    "rm -fr /*",
    "rm -rf ~",
    "rm -rf --no-preserve-root /",
    "mkfs.ext4 /dev/sda1",
    "dd if=/dev/zero of=/dev/sda bs=1M",
    "echo x > /dev/sda",
    "shutdown -h now",
    "sudo reboot",
    "systemctl poweroff",
    "init 0",
    "sh -c 'halt'",
]


@pytest.mark.parametrize("dangerous", DESTRUCTIVE)
async def test_destructive_commands_are_refused_before_running(
    ctx: ToolContext, ws: Path, dangerous: str
) -> None:
    out = await run(ctx, f"touch ran && false && {dangerous}")
    assert out.startswith("Error: command refused:"), out
    assert not (ws / "ran").exists()


async def test_harmless_lookalikes_run(ctx: ToolContext, ws: Path) -> None:
    (ws / "build/sub").mkdir(parents=True)
    assert await run(ctx, "rm -rf build/ && echo gone") == "gone\n"
    assert not (ws / "build").exists()
    assert await run(ctx, "echo shutdown") == "shutdown\n"
    assert await run(ctx, "echo 'rm -rf /'") == "rm -rf /\n"
    assert await run(ctx, "dd if=/dev/zero of=/dev/null count=1 2>/dev/null; echo ok") == "ok\n"


async def test_leaving_a_restricted_workspace_is_refused(
    ctx: ToolContext, ws: Path, tmp_path: Path
) -> None:
    (tmp_path / "outside.txt").write_text("outside secret")
    out = await run(ctx, "cd .. && touch escaped")
    assert out.startswith("Error: command refused:") and "leaves the workspace" in out
    assert not (tmp_path / "escaped").exists()
    out = await run(ctx, "cat ../outside.txt")
    assert "outside the workspace" in out and "outside secret" not in out
    (ws / "sub").mkdir()
    (ws / "top.txt").write_text("top")
    assert await run(ctx, "cd sub && cat ../top.txt") == "top"


async def test_unrestricted_workspace_may_cd_out(ws: Path, gate: Gate) -> None:
    free = ToolContext(workspace=ws, restrict_to_workspace=False, gate=gate)
    assert await run(free, "cd .. && pwd") == f"{ws.parent}\n"


# ---------------------------------------------------------------------------------------------
# The guard, as a pure function


@pytest.mark.parametrize(
    "command",
    [
        *DESTRUCTIVE,
        "rm -r -f /",
        "rm --recursive --force /",
        "rm -rf ~/",
        "rm -rf $HOME/*",
        "rm -Rf /usr",
        "echo hi && rm -rf /etc/*",
        "sudo rm -rf --no-preserve-root /",
        ":(){ :|:& };:",
        "bomb(){ bomb|bomb& };bomb",
        "mkfs -t ext4 /dev/sdb",
        "wipefs -a /dev/sda",
        "cat disk.img >> /dev/nvme0n1",
        "tee /dev/sda < image",
        "/sbin/reboot",
        "poweroff",
        "halt -p",
        "init 6",
        "systemctl reboot",
        "sudo systemctl --force reboot",
        "bash -lc 'rm -rf /'",
        "eval 'reboot'",
        "echo $(reboot)",
        'echo "$(shutdown now)"',
        "`reboot`",
        "ls\nreboot",
        "timeout 5 reboot",
        "env X=1 nohup poweroff &",
        "cat <<EOF\nit's\nEOF\nreboot",
    ],
)
def test_guard_refuses(command: str) -> None:
    assert check_command(command) is not None


@pytest.mark.parametrize(
    "command",
    [
        "rm -rf build/",
        "rm -rf ./build /tmp/scratch",
        "rm -r sub",
        "echo shutdown",
        "echo 'rm -rf /'",
        'echo "reboot now"',
        "grep -rn reboot .",
        "dd if=/dev/zero of=/dev/null count=1",
        "ls > /dev/null 2>&1",
        "echo x >&2",
        "systemctl status nginx",
        "init_db --force",
        "ls -la /etc",
        "git log --oneline | head",
        "cat <<'EOF' > notes.txt\nit's fine\nEOF",
    ],
)
def test_guard_allows(command: str) -> None:
    assert check_command(command) is None


@pytest.mark.parametrize(
    "command",
    ["cd ..", "cd /", "cd", "cd ~", "cd sub && cd ../..", "cat ../x", "ls ../../etc",
     "echo x > ../out", "python ../tool.py", "pushd /tmp"],
)  # fmt: skip
def test_guard_refuses_workspace_escapes(command: str, ws: Path) -> None:
    (ws / "sub").mkdir()
    assert check_command(command, ws) is not None
    assert check_command(command, None) is None  # only when restricted


@pytest.mark.parametrize(
    "command",
    ["cd sub && cat ../README", "cd sub; cd ..; ls", "ls sub/../", "git diff HEAD..main",
     "cat /etc/hostname", "cd $PROJECT", "cd -"],
)  # fmt: skip
def test_guard_allows_paths_inside(command: str, ws: Path) -> None:
    (ws / "sub").mkdir()
    assert check_command(command, ws) is None
