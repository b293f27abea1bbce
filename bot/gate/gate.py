"""The gate: the one way memobot starts a process or opens a path for the model.

Every process goes through :mod:`bot.gate.launcher` (a subreaper that kills what the command
left behind), gets the environment allowlist below instead of memobot's own environment, and,
when the agent is restricted to its workspace, runs under Landlock with the lists of the
:class:`~bot.gate.policy.PathPolicy` and a seccomp filter that denies Unix sockets, and runs
within the limits of :mod:`bot.gate.limits` (processes, file size). Each process belongs to
a :class:`ProcessScope` (a turn); closing the scope kills whatever is still running. A
process that outlived a crashed memobot is found by its marker variable and killed at the
next start.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from bot.gate import launcher, limits
from bot.gate.policy import CONFINED_READ_ROOTS, DEVICES, PathPolicy, carve, real_path
from bot.gate.usage import WorkspaceUsage
from bot.layout import within

log = logging.getLogger(__name__)

LAUNCHER = Path(launcher.__file__).resolve()
MARKER = "MEMOBOT_GATE"  # "<installation>:<memobot pid>:<its start time>", to find leftovers
# Names passed through from memobot's environment; everything else (API keys, tokens,
# ${VAR} secrets, the credentials folder) stays behind.
ENV_PASSTHROUGH = ("PATH", "LANG", "LANGUAGE", "TERM", "TZ", "USER", "LOGNAME", "COLORTERM")
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
# git in a command reads no setting that names a program to run: the repository's .git/config
# (and, for a confined command, its HOME) is the model's to write. Command-line scope
# (GIT_CONFIG_COUNT) beats every config file. Filters and diff or merge drivers named in
# .gitattributes cannot be switched off this way (their names are free), nor can
# diff.external (an empty value breaks `git diff`): that is why no git command is in the
# default tools.exec.allow. GIT_PAGER=cat (below) beats core.pager, and with no terminal git
# starts no pager anyway.
GIT_NEUTRAL: tuple[tuple[str, str], ...] = (
    ("core.fsmonitor", "false"),
    ("core.hooksPath", "/dev/null"),  # no hook runs, .git/hooks included
    ("core.editor", "true"),  # `git commit` without -m aborts, as with an empty message
    ("sequence.editor", "true"),  # `git rebase -i` takes the list as it is
    ("protocol.ext.allow", "never"),  # ext:: remotes run a command
)
# Only where the command is confined: unconfined, the owner's own ~/.gitconfig applies and
# these would break their pushes (credential helper, ssh command, signing program).
GIT_NEUTRAL_CONFINED: tuple[tuple[str, str], ...] = (
    ("core.sshCommand", "ssh"),
    ("core.askPass", ""),  # empty: no askpass program
    ("credential.helper", ""),  # empty: the list of helpers is reset
    ("gpg.program", "gpg"),
    ("gpg.openpgp.program", "gpg"),
    ("gpg.x509.program", "gpgsm"),
    ("gpg.ssh.program", "ssh-keygen"),
)
_TEMP_PREFIX = "memobot-tmp-"
_STATUS_DRAIN_SECONDS = 0.2
FILE_THREADS = 4
T = TypeVar("T")


class GateRefused(Exception):
    """The gate will not start this process; the message says why and what to change."""


@dataclass(frozen=True, slots=True)
class Confinement:
    """What confines the agent's processes, for logs, ``doctor`` and ``status``."""

    active: bool  # processes run under the kernel's confinement
    refused: bool  # exec is refused (confinement wanted, kernel cannot)
    summary: str
    gaps: bool = False  # active, but a way out stays open (e.g. Unix sockets)


def process_start_time(pid: int) -> int | None:
    """The start time of ``pid`` in clock ticks since boot (field 22 of /proc/pid/stat)."""
    fields = launcher.stat_fields(pid)
    return int(fields[19]) if len(fields) > 19 else None


def describe_confinement(restrict: bool, sandbox: str, network: bool) -> Confinement:
    """Which confinement a command gets under this config on this kernel."""
    if not restrict:
        return Confinement(False, False, "none (tools.restrictToWorkspace is false)")
    if sandbox == "off":
        return Confinement(False, False, 'none (tools.exec.sandbox is "off")')
    abi = launcher.landlock_abi()
    if abi < 1:
        return Confinement(
            False,
            True,
            "unavailable: this kernel has no Landlock (Linux 5.13+ with Landlock enabled), so "
            'exec is refused; set tools.exec.sandbox to "off" to run commands unconfined',
        )
    parts = [f"Landlock ABI {abi}: workspace and a private temp folder writable, system read-only"]
    if not network:
        parts.append("no TCP" if abi >= 4 else "network NOT blocked (needs Landlock ABI 4)")
    parts.append("signals scoped" if abi >= 6 else "signals NOT scoped (needs Landlock ABI 6)")
    if launcher.seccomp_available():
        parts.append("Unix sockets blocked (seccomp)")
        return Confinement(True, False, ", ".join(parts))
    parts.append(
        f"Unix sockets NOT blocked (no seccomp filter for {os.uname().machine} on this "
        "kernel): a command can reach socket files such as a tmux server or docker.sock"
    )
    return Confinement(True, False, ", ".join(parts), gaps=True)


class GateProcess:
    """One command started through the launcher."""

    def __init__(self, proc: asyncio.subprocess.Process, scope: ProcessScope) -> None:
        self.proc = proc
        self._scope = scope

    @property
    def pid(self) -> int:
        return self.proc.pid

    async def communicate(self, on_output: Callable[[bytes], None]) -> int:
        """Feed the command's output to ``on_output`` until it ends; return its exit code
        (negative: killed by that signal). Background jobs may still run afterwards.

        Raises GateRefused when the command could not start (e.g. the kernel refused the
        confinement); cancellation propagates (call :meth:`stop`).
        """
        assert self.proc.stdout is not None and self.proc.stderr is not None
        reader = asyncio.ensure_future(_pump(self.proc.stdout, on_output))
        try:
            line = (await self.proc.stderr.readline()).decode(errors="replace").strip()
            # The status line comes when the command's main process exits; output it wrote
            # just before is already in the pipe, output of background jobs may never end.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_STATUS_DRAIN_SECONDS):
                    await asyncio.shield(reader)
        finally:
            reader.cancel()
        if line.startswith("status "):
            return os.waitstatus_to_exitcode(int(line.split()[1]))
        if line.startswith("memobot-sandbox: "):
            raise GateRefused(line.removeprefix("memobot-sandbox: "))
        rest = (await self.proc.stderr.read()).decode(errors="replace")
        code = await self.proc.wait()
        if line or rest:  # a launcher bug: say what it printed
            log.error(
                "launcher %d failed (exit %d): %s", self.proc.pid, code, (line + rest)[-2000:]
            )
            raise GateRefused(f"the command's launcher failed: {(line or rest).strip()[:300]}")
        return -signal.SIGKILL  # the launcher itself was killed before the command ended

    async def stop(self, grace: float) -> None:
        await self._scope.stop(self, grace)


async def _pump(stream: asyncio.StreamReader, on_output: Callable[[bytes], None]) -> None:
    while chunk := await stream.read(65536):
        on_output(chunk)


class ProcessScope:
    """The processes of one turn. :meth:`close` ends every one still running."""

    def __init__(self, grace: float = 2.0) -> None:
        self.grace = grace
        self._live: set[GateProcess] = set()

    def add(self, process: GateProcess) -> None:
        self._live.add(process)

    @property
    def running(self) -> int:
        return sum(1 for p in self._live if p.proc.returncode is None)

    async def stop(self, process: GateProcess, grace: float | None = None) -> None:
        """SIGTERM the launcher (it kills its subtree: SIGTERM, grace, SIGKILL) and wait.

        The launcher is our own code and always exits; the SIGKILL after a generous bound is
        for a launcher that was itself stopped (SIGSTOP) by something.
        """
        self._live.discard(process)
        proc = process.proc
        grace = self.grace if grace is None else grace
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(grace + 5.0):
                    await asyncio.shield(proc.wait())
            except TimeoutError:
                log.error("launcher %d did not stop; killing it and its subtree", proc.pid)
                # Its subtree first: once the launcher is gone they would belong to pid 1.
                for pid in [proc.pid, *launcher.descendants(proc.pid)]:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
        await proc.wait()

    async def close(self) -> None:
        """Kill everything still running in this scope; safe to call twice."""
        await asyncio.gather(*(self.stop(p) for p in list(self._live)))


class Gate:
    """Starts the agent's processes and answers its path questions (one policy)."""

    def __init__(
        self,
        workspace: Path,
        *,
        protected: Iterable[Path] = (),
        temp_root: Path | None = None,
        installation: str = "",
        workspace_warn_bytes: int = 0,
    ) -> None:
        self.workspace = workspace
        self._temp = Path(tempfile.mkdtemp(prefix=f"{_TEMP_PREFIX}{os.getpid()}-", dir=temp_root))
        self.policy = PathPolicy.for_agent(
            workspace, self._temp, protected=protected, private=_home()
        )
        self._marker = f"{installation}:{os.getpid()}:{process_start_time(os.getpid())}"
        self._confined: ThreadPoolExecutor | None = None
        self._plain: ThreadPoolExecutor | None = None
        self._own: dict[str, Path] = {}
        self.task_cap = limits.task_cap()
        self.usage = WorkspaceUsage(workspace, workspace_warn_bytes)

    @property
    def temp(self) -> Path:
        return self._temp

    @property
    def home(self) -> Path:
        """``HOME`` of the commands of a confined agent: a folder in the private temp folder,
        never the workspace, so dotfiles the model writes there (``.gitconfig``, ``.bashrc``,
        ``.npmrc``, ``pip.conf``) are not read. It lasts as long as the gate."""
        return self._temp / "home"

    def private_folder(self, name: str) -> Path:
        """A new folder for one process memobot starts (an MCP server without a state
        folder), beside the temp folder rather than in it, so the agent's tools and commands
        cannot reach it; the same folder for the same name until :meth:`close` removes it."""
        if name not in self._own:
            self._own[name] = Path(
                tempfile.mkdtemp(prefix=f"{self._temp.name}-{name}-", dir=self._temp.parent)
            )
        return self._own[name]

    def environment(
        self, *, restrict: bool, extra: dict[str, str] | None = None, home: Path | None = None
    ) -> dict[str, str]:
        """The allowlisted environment of a process started for the model.

        With ``restrict``, ``HOME`` (and the XDG folders under it) is ``home`` or
        :attr:`home`; without, the owner's own home. ``PATH`` keeps only absolute folders
        outside the workspace and the temp folder, so a plain ``ls`` is always the system's.
        git gets :data:`GIT_NEUTRAL` settings (and, with ``restrict``, no system or global
        config and :data:`GIT_NEUTRAL_CONFINED`). ``extra`` comes last and wins.
        """
        env = {k: os.environ[k] for k in ENV_PASSTHROUGH if k in os.environ}
        env.update({k: v for k, v in os.environ.items() if k.startswith("LC_")})
        env["PATH"] = self._search_path(env.get("PATH", DEFAULT_PATH))
        env.setdefault("LANG", "C.UTF-8")
        if restrict:
            folder = str(home or self.home)
            env.update(
                HOME=folder, XDG_CONFIG_HOME=f"{folder}/.config",
                XDG_CACHE_HOME=f"{folder}/.cache", XDG_DATA_HOME=f"{folder}/.local/share",
                XDG_STATE_HOME=f"{folder}/.local/state",
            )  # fmt: skip
        else:
            env["HOME"] = str(Path.home())
        # stdin is /dev/null: anything waiting for a pager or a password prompt would hang.
        env.update(
            SHELL="/bin/sh", TMPDIR=str(self._temp), PAGER="cat", GIT_PAGER="cat",
            GIT_TERMINAL_PROMPT="0",
        )  # fmt: skip
        env.update(git_environment(confined=restrict))
        env.update(extra or {})
        env[MARKER] = self._marker
        return env

    def _search_path(self, value: str) -> str:
        """``value`` without empty or relative entries (the shell reads those as the current
        folder: the workspace) and without folders the model can write."""
        mine = self.policy.writable
        keep = [
            entry
            for entry in value.split(":")
            if entry.startswith("/") and not any(within(real_path(entry), w) for w in mine)
        ]
        return ":".join(dict.fromkeys(keep)) or DEFAULT_PATH

    def launcher_command(
        self,
        argv: list[str],
        *,
        confine: bool,
        network: bool = True,
        restrict: bool = True,
        extra_env: dict[str, str] | None = None,
        stdio: bool = True,
        grace: float = 2.0,
        read_also: Iterable[Path] = (),
        home: Path | None = None,
        max_tasks: int = launcher.MAX_NEW_TASKS,
        max_file_bytes: int | None = None,
    ) -> tuple[list[str], dict[str, str]]:
        """The command line and environment that run ``argv`` through the launcher, for a
        library that starts the process itself (an MCP stdio client): the same confinement,
        environment allowlist and subtree cleanup as :meth:`spawn`; it dies with memobot.

        ``read_also`` adds read-only folders (an owner-configured server's installation, see
        :func:`install_roots`), minus the protected paths. ``home``: a folder memobot made
        for this process alone (an MCP server's own), its ``HOME`` when ``restrict`` and
        writable for it, even inside the state folder; default :attr:`home`. ``max_tasks``
        caps the processes and threads (in a pids cgroup of its own where :attr:`task_cap` has
        one), ``max_file_bytes`` the size of a file it writes. Confined, it gets no Unix sockets.

        Raises GateRefused when confinement is asked for and the kernel has no Landlock.
        """
        if confine and launcher.landlock_abi() < 1:
            raise GateRefused(describe_confinement(True, "landlock", network).summary)
        self._temp.mkdir(mode=0o700, exist_ok=True)
        own = [home] if home is not None else []
        if home is None:
            # Made again for each process: a command may have removed it.
            with contextlib.suppress(FileExistsError):  # or left something else there
                self.home.mkdir(mode=0o700)
        extra = [str(p) for p in carve(read_also, self.policy.protected)]
        spec = {
            "argv": argv,
            "ppid": os.getpid(),
            "grace": grace,
            "confine": confine,
            "stdio": stdio,
            "network": network,
            # Where the kernel cannot take the filter, describe_confinement says so.
            "unix_sockets": not (confine and launcher.seccomp_available()),
            "max_tasks": max_tasks,
            "max_file_bytes": max_file_bytes,
            "cgroup": str(self.task_cap.parent) if self.task_cap.parent else None,
            "read": [str(p) for p in self.policy.read_roots] + list(CONFINED_READ_ROOTS) + extra,
            "write": [str(p) for p in (*self.policy.writable, *own)],
            "devices": list(DEVICES),
        }
        command = [sys.executable, "-I", "-S", str(LAUNCHER), *launcher.build_args(spec)]
        return command, self.environment(restrict=restrict, extra=extra_env, home=home)

    async def spawn(
        self,
        argv: list[str],
        *,
        cwd: Path,
        scope: ProcessScope,
        confine: bool,
        network: bool = True,
        extra_env: dict[str, str] | None = None,
        restrict: bool = True,
        max_tasks: int = launcher.MAX_NEW_TASKS,
        max_file_bytes: int | None = None,
    ) -> GateProcess:
        """Start ``argv`` through the launcher, confined when ``confine`` is true, within the
        limits (see :meth:`launcher_command`).

        Raises GateRefused when confinement is asked for and the kernel has no Landlock.
        """
        command, env = self.launcher_command(
            argv,
            confine=confine,
            network=network,
            restrict=restrict,
            extra_env=extra_env,
            stdio=False,
            grace=scope.grace,
            max_tasks=max_tasks,
            max_file_bytes=max_file_bytes,
        )
        proc = await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=cwd,
            env=env,
        )
        process = GateProcess(proc, scope)
        scope.add(process)
        return process

    async def run_file_op(self, fn: Callable[..., T], *args: object, confined: bool) -> T:
        """Run a file tool's blocking work in the gate's own threads.

        With ``confined`` (the agent is restricted to its workspace) and a kernel with Landlock,
        the threads are themselves under Landlock with the policy's lists: the kernel, not a
        path check done a moment earlier, decides what the call can open, so a symlink swapped
        in by a background job between check and use leads nowhere. Separate, bounded pools
        keep a stuck call from starving memobot's own file work in the default executor.
        """
        pool = self._confined_pool() if confined else self._plain_pool()
        return await asyncio.get_running_loop().run_in_executor(pool, lambda: fn(*args))

    def _confined_pool(self) -> ThreadPoolExecutor:
        if self._confined is None:
            if launcher.landlock_abi() < 1:
                return self._plain_pool()  # the path policy alone still applies
            read = [str(p) for p in self.policy.read_roots]
            write = [str(p) for p in self.policy.writable]
            self._confined = ThreadPoolExecutor(
                FILE_THREADS,
                thread_name_prefix="memobot-files-confined",
                initializer=launcher.confine,
                initargs=(read, write, [], True),
            )
        return self._confined

    def _plain_pool(self) -> ThreadPoolExecutor:
        if self._plain is None:
            self._plain = ThreadPoolExecutor(FILE_THREADS, thread_name_prefix="memobot-files")
        return self._plain

    def after_command(self) -> None:
        """A command of the agent ended: the workspace may have grown (measured at most once
        a minute, in a thread)."""
        self.usage.poke()

    def close(self) -> None:
        self.usage.cancel()
        for pool in (self._confined, self._plain):
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)
        for folder in (self._temp, *self._own.values()):
            shutil.rmtree(folder, ignore_errors=True)


def git_environment(*, confined: bool) -> dict[str, str]:
    """The variables that keep git in a command from running a program a config file names:
    :data:`GIT_NEUTRAL` as command-line settings, and for a ``confined`` command also no
    system or global config file (its ``HOME`` is the model's) and
    :data:`GIT_NEUTRAL_CONFINED`."""
    pairs = GIT_NEUTRAL + GIT_NEUTRAL_CONFINED if confined else GIT_NEUTRAL
    env = {"GIT_CONFIG_COUNT": str(len(pairs))}
    for i, (key, value) in enumerate(pairs):
        env[f"GIT_CONFIG_KEY_{i}"] = key
        env[f"GIT_CONFIG_VALUE_{i}"] = value
    if confined:
        # An empty GIT_PROXY_COMMAND wins over core.gitProxy (whose first match would win).
        env.update(GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL="/dev/null", GIT_PROXY_COMMAND="")
    return env


def install_roots(command: str, path: str | None = None) -> list[Path]:
    """The folders a program needs to read to start: the installation prefix of ``command``
    (``<prefix>/bin/<name>`` gives ``<prefix>``: a virtualenv, ``~/.local``, ``/opt/x``) and,
    for a script, of its interpreter and of the interpreter's real file (a virtualenv's python
    links to a base installation). Empty when the command cannot be found."""
    found = shutil.which(command, path=path) if "/" not in command else command
    if not found:
        return []
    roots: list[Path] = []
    todo = [Path(found).absolute(), real_path(found)]
    try:
        with open(real_path(found), "rb") as fh:
            first = fh.readline(256)
    except OSError:
        first = b""
    if first.startswith(b"#!"):
        words = first[2:].decode(errors="replace").split()
        if words and words[0].startswith("/"):
            interpreter = Path(words[0])
            if interpreter.name == "env" and len(words) > 1:
                interpreter = Path(shutil.which(words[1], path=path) or words[1])
            todo += [interpreter, real_path(interpreter)]
    for exe in todo:
        prefix = exe.parent.parent if exe.parent.name == "bin" else exe.parent
        # A program straight in ~/bin or /bin would open the whole home or disk: not that.
        if prefix not in (Path("/"), Path.home()) and prefix not in roots:
            roots.append(prefix)
    return roots


def _home() -> list[Path]:
    home = Path.home()
    return [] if home == Path("/") else [home]


def installation_id(state_dir: Path) -> str:
    """A short name for one installation (its state folder), for the marker."""
    return hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:12]


def reap_leftovers(installation: str) -> int:
    """Kill processes started through this installation's gate by a memobot that is gone.

    A launcher dies with memobot and takes its subtree along; this catches the rest (a killed
    launcher's orphans). Each carries ``MEMOBOT_GATE=<installation>:<pid>:<start time>`` of the
    memobot that started it; the start time guards against a reused pid, the installation
    keeps one memobot's start from touching another installation's processes. Returns how many
    were killed.
    """
    killed = 0
    me = os.getpid()
    owners: dict[str, bool] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            environ = Path(f"/proc/{name}/environ").read_bytes()
        except OSError:
            continue
        marker = _marker_of(environ)
        if marker is None or not marker.startswith(f"{installation}:"):
            continue
        owner = marker.removeprefix(f"{installation}:")
        if owner not in owners:
            pid, _, start = owner.partition(":")
            owners[owner] = pid.isdigit() and str(process_start_time(int(pid))) == start
        if owners[owner]:
            continue  # its memobot still runs (e.g. a gateway beside `memobot agent`)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(int(name), signal.SIGKILL)
            killed += 1
    if killed:
        log.warning("killed %d process(es) left running by a memobot that stopped", killed)
    return killed


def _marker_of(environ: bytes) -> str | None:
    prefix = MARKER.encode() + b"="
    for item in environ.split(b"\0"):
        if item.startswith(prefix):
            return item[len(prefix) :].decode(errors="replace")
    return None


def remove_stale_temp(temp_root: Path | None = None) -> None:
    """Remove private temp folders of memobot processes that no longer run."""
    root = Path(temp_root or tempfile.gettempdir())
    try:
        entries = list(root.glob(f"{_TEMP_PREFIX}*"))
    except OSError:
        return
    for entry in entries:
        pid = entry.name.removeprefix(_TEMP_PREFIX).split("-", 1)[0]
        if not pid.isdigit() or Path(f"/proc/{pid}").exists():
            continue
        with contextlib.suppress(OSError):
            if entry.stat().st_uid == os.getuid():
                shutil.rmtree(entry, ignore_errors=True)
