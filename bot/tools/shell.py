"""The ``exec`` tool: run a shell command in the workspace, with a timeout and a seatbelt.

The command guard (:func:`check_command`) is a seatbelt, not a sandbox. It reads the command
the way a shell roughly would (words, quotes, ``;``/``&&``/``|`` separators, ``$(...)``,
``sh -c`` and ``eval`` bodies) and refuses a short list of obviously destructive commands and,
in a restricted workspace, ``cd`` or ``..`` paths that lead out of it. It cannot see through
variables, aliases, scripts, interpreters (``python -c``), ``find -exec`` or ``xargs`` fed from
a pipe, and it does not refuse absolute paths in general. Heredoc bodies are read as commands
too: refusing a harmless command is cheaper than missing a harmful one. The real confinement is
the gate (:mod:`bot.gate`): the kernel's Landlock rules, the environment allowlist and a
launcher that kills every process the turn started.
"""

from __future__ import annotations

import asyncio
import os
import posixpath
import re
import shlex
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from bot.config import ExecConfig
from bot.gate import GateRefused, ProcessScope, real_path
from bot.tools.base import Effects, Tool, ToolContext, ToolError

KILL_GRACE_SECONDS = 2.0
_MAX_NESTING = 4

# ---------------------------------------------------------------------------------------------
# The guard

_PUNCTUATION = "();<>|&`\n"
_FORK_BOMB = re.compile(r"(?P<f>[^\s(){}|&;<>]+)\s*\(\s*\)\s*\{[^}]*(?P=f)\s*\|\s*(?P=f)\s*&")
_POWER_COMMANDS = frozenset({"shutdown", "reboot", "halt", "poweroff"})
_POWER_VERBS = frozenset({"poweroff", "reboot", "halt", "kexec"})
_FORMAT_COMMANDS = frozenset({"mke2fs", "mkswap", "wipefs"})
_SHELLS = frozenset({"sh", "bash", "zsh", "dash", "ksh", "ash", "su"})
# Words that run the next word as the command (`sudo rm ...`) or are shell syntax before it.
_WRAPPERS = frozenset(
    {
        "sudo", "doas", "env", "nohup", "time", "command", "builtin", "exec", "nice",
        "ionice", "stdbuf", "timeout", "xargs", "then", "do", "else", "elif", "if", "while",
        "until", "!", "{", "}",
    }
)  # fmt: skip
_WRAPPER_OPTIONS_WITH_VALUE = frozenset({"-u", "-g", "-C", "-D", "-h", "-p", "-r", "-t", "-U"})
_SYSTEM_DIRS = frozenset(
    {
        "bin", "boot", "dev", "etc", "home", "lib", "lib32", "lib64", "opt", "proc", "root",
        "run", "sbin", "srv", "sys", "usr", "var",
    }
)  # fmt: skip
_HOME_WORDS = frozenset({"~", "$HOME", "${HOME}"})
_SAFE_DEVICES = re.compile(
    r"^/dev/(null|zero|full|u?random|stdin|stdout|stderr|tty|fd/\d+|pts/\d+|shm/.*)$"
)
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_DURATION = re.compile(r"^\d+(\.\d+)?[smhd]?$")


@dataclass(slots=True)
class _Segment:
    words: list[str]
    redirects: list[str]  # targets of > >> < etc.


def _tokens(command: str, *, quotes: bool) -> list[str]:
    lex = shlex.shlex(command, posix=True, punctuation_chars=_PUNCTUATION)
    lex.whitespace = " \t\r"  # newline separates commands; it is punctuation here
    lex.whitespace_split = True
    lex.commenters = ""
    if not quotes:
        lex.quotes = ""
        lex.escape = ""
    return list(lex)


def _segments(command: str) -> list[_Segment]:
    """Split into simple commands. Unbalanced quotes (often a heredoc) fall back to plain words."""
    try:
        tokens = _tokens(command, quotes=True)
    except ValueError:
        tokens = [t.strip("'\"") for t in _tokens(command, quotes=False)]
    segments = [_Segment([], [])]
    redirect_next = False
    for tok in tokens:
        if tok and all(c in _PUNCTUATION for c in tok):
            if any(c in tok for c in "();`\n") or not any(c in tok for c in "<>"):
                segments.append(_Segment([], []))
            else:
                redirect_next = True
            continue
        if redirect_next:
            segments[-1].redirects.append(tok)
            redirect_next = False
        else:
            segments[-1].words.append(tok)
    return [s for s in segments if s.words or s.redirects]


def _command_start(words: list[str]) -> int:
    """Index of the word that is the program actually run (after sudo, env, VAR=x, ...)."""
    i = 0
    after_wrapper = False
    while i < len(words):
        word = words[i]
        if _ASSIGNMENT.match(word):
            i += 1
        elif posixpath.basename(word) in _WRAPPERS:
            after_wrapper = True
            i += 1
        elif after_wrapper and word.startswith("-"):
            i += 2 if word in _WRAPPER_OPTIONS_WITH_VALUE else 1
        elif after_wrapper and _DURATION.match(word):
            i += 1  # `timeout 5 cmd`, `nice -n 10 cmd`
        else:
            return i
    return i


def _is_root_or_system_dir(target: str) -> bool:
    """``/``, ``/*``, ``~``, ``$HOME/*``, ``/etc`` and the like: never a sane ``rm -r`` target."""
    for home in _HOME_WORDS:
        if target == home or target.startswith(home + "/"):
            return set(target[len(home) :]) <= set("/*.")
    if not target.startswith("/"):
        return False
    parts = [p for p in target.split("/") if p not in ("", ".")]
    if parts[-1:] == ["*"]:
        parts.pop()
    return not parts or parts == [".."] or (len(parts) == 1 and parts[0] in _SYSTEM_DIRS)


def _check_rm(args: list[str]) -> str | None:
    if "--no-preserve-root" in args:
        return "`rm --no-preserve-root` can delete the whole filesystem"
    recursive = False
    targets: list[str] = []
    options_done = False
    for arg in args:
        if not options_done and arg == "--":
            options_done = True
        elif not options_done and arg.startswith("--"):
            recursive = recursive or arg == "--recursive"
        elif not options_done and arg.startswith("-") and len(arg) > 1:
            recursive = recursive or "r" in arg or "R" in arg
        else:
            targets.append(arg)
    bad = [t for t in targets if _is_root_or_system_dir(t)]
    if recursive and bad:
        return f"`rm -r {bad[0]}` would delete the filesystem root, a system directory or home"
    return None


def _is_device(path: str) -> bool:
    return path.startswith("/dev/") and not _SAFE_DEVICES.match(path)


def _check_program(prog: str, args: list[str], depth: int) -> str | None:
    if prog == "rm":
        return _check_rm(args)
    if prog.startswith("mkfs") or prog in _FORMAT_COMMANDS:
        return f"`{prog}` formats or wipes a disk"
    if prog == "dd":
        dev = next((a[3:] for a in args if a.startswith("of=") and _is_device(a[3:])), None)
        return f"`dd of={dev}` writes to a raw device" if dev else None
    if prog in ("tee", "cp", "shred") and any(_is_device(a) for a in args):
        return f"`{prog}` would write to a raw device"
    if prog in _POWER_COMMANDS:
        return f"`{prog}` would shut down or restart the machine"
    if prog in ("init", "telinit") and args[:1] in (["0"], ["6"]):
        return f"`{prog} {args[0]}` would shut down or restart the machine"
    if prog == "systemctl":
        verb = next((a for a in args if not a.startswith("-")), "")
        if verb in _POWER_VERBS:
            return f"`systemctl {verb}` would shut down or restart the machine"
    if prog in _SHELLS:
        body = _shell_body(args)
        return _check(body, depth + 1) if body is not None else None
    if prog == "eval":
        return _check(" ".join(args), depth + 1)
    return None


def _shell_body(args: list[str]) -> str | None:
    """The script of ``sh -c 'script'`` (also ``bash -lc``, ``su -c``)."""
    for i, arg in enumerate(args):
        if arg.startswith("-") and not arg.startswith("--") and "c" in arg:
            rest = [a for a in args[i + 1 :] if not a.startswith("-")]
            return rest[0] if rest else None
    return None


def _check(command: str, depth: int) -> str | None:
    if depth > _MAX_NESTING:
        return "the command nests shells too deeply to check"
    if _FORK_BOMB.search(command):
        return "it looks like a fork bomb"
    for seg in _segments(command):
        for target in seg.redirects:
            if _is_device(target):
                return f"redirecting output to {target} writes to a raw device"
        for word in seg.words:
            # "$(...)" and backticks inside double quotes still run.
            if ("$(" in word or "`" in word) and word != command:
                reason = _check(word, depth + 1)
                if reason:
                    return reason
        start = _command_start(seg.words)
        if start < len(seg.words):
            prog = posixpath.basename(seg.words[start])
            reason = _check_program(prog, seg.words[start + 1 :], depth)
            if reason:
                return reason
    return None


def _escape_reason(command: str, workspace: Path) -> str | None:
    """A ``cd`` or ``..`` path in ``command`` that leads outside ``workspace``, if any.

    ``cd`` targets are followed in order, so ``cd src && cat ../README`` stays inside. Paths with
    variables or globs are skipped: they cannot be known before the shell runs.
    """
    cwd = workspace
    for seg in _segments(command):
        start = _command_start(seg.words)
        words = seg.words[start:]
        if words and words[0] in ("cd", "pushd"):
            target = next((w for w in words[1:] if not w.startswith("-") or w == "-"), "")
            if target == "-" or any(c in target for c in "$`*?["):
                continue
            new = real_path(cwd / os.path.expanduser(target or "~"))
            if not new.is_relative_to(workspace):
                return f"`{words[0]} {target or '(home)'}` leaves the workspace"
            cwd = new
            continue
        for word in [*words, *seg.redirects]:
            path = word.split("=", 1)[-1] if word.startswith("-") else word
            if ".." not in path.split("/") or any(c in path for c in "$`"):
                continue
            if not real_path(cwd / path).is_relative_to(workspace):
                return f"the path '{path}' leads outside the workspace"
    return None


def check_command(command: str, workspace: Path | None = None) -> str | None:
    """Why ``command`` is refused, or None to run it.

    Refuses destructive commands (recursive rm of / or ~ or a system directory, fork bombs,
    mkfs, dd or redirects onto devices, shutdown and friends). With ``workspace`` (a real
    path), also refuses ``cd`` and ``..`` paths that leave it. See the module docstring for
    what this guard cannot see.
    """
    return _check(command, 0) or (_escape_reason(command, workspace) if workspace else None)


# ---------------------------------------------------------------------------------------------
# Running


class _Capture:
    """Keeps the first and last ``limit // 2`` bytes of a stream and counts the rest."""

    def __init__(self, limit: int) -> None:
        self._half = max(limit // 2, 1)
        self._head = bytearray()
        self._tail = bytearray()
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self._half - len(self._head)
        if room > 0:
            self._head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self._tail += chunk
            if len(self._tail) > self._half:
                del self._tail[: len(self._tail) - self._half]

    def text(self) -> str:
        head = self._head.decode("utf-8", errors="replace")
        tail = self._tail.decode("utf-8", errors="replace")
        omitted = self.total - len(self._head) - len(self._tail)
        if omitted <= 0:
            return head + tail
        return f"{head}\n\n[... {omitted} bytes of output omitted ...]\n\n{tail}"


def _format_result(out: str, code: int) -> str:
    out = out or "(no output)"
    if code == 0:
        return out
    sep = "" if out.endswith("\n") else "\n"
    if code < 0:
        return f"{out}{sep}killed by signal {signal.Signals(-code).name}"
    return f"{out}{sep}exit code {code}"


class ExecTool(Tool):
    """Runs ``sh -c command`` in the workspace through the gate.

    With ``tools.restrictToWorkspace`` and ``tools.exec.sandbox: "landlock"`` the command and
    all its children run under the kernel's confinement; without a kernel that can confine,
    the call is refused. Every command runs within ``maxProcesses`` and ``maxFileBytes``
    (:mod:`bot.gate.limits`). On timeout or cancellation (``/stop``) the command's whole subtree
    gets SIGTERM, then SIGKILL after a short grace; cancellation is re-raised. Background jobs
    live until the turn ends (the turn's process scope).
    """

    name: ClassVar[str] = "exec"
    # The command runs in the workspace: it can read and write whatever is there.
    effects: ClassVar[Effects] = Effects(command="command", processes=True, network=True)
    description: ClassVar[str] = (
        "Run a shell command (sh) in the workspace and return its combined stdout and stderr, "
        "plus the exit code when it is not 0. stdin is empty, so interactive programs cannot "
        "be used. The command is killed when it runs longer than the timeout. Background jobs "
        "(`cmd > log 2>&1 &`) keep running until this answer is finished, then they are "
        "stopped; redirect their output to a file."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "command": {"type": "string", "description": "The shell command to run"},
            "timeout": {
                "type": "number",
                "description": "Seconds before the command is killed (capped by the config)",
            },
        },
        "required": ["command"],
    }

    def __init__(self, cfg: ExecConfig, *, kill_grace_seconds: float = KILL_GRACE_SECONDS):
        self.cfg = cfg
        self.kill_grace_seconds = kill_grace_seconds

    def _timeout(self, requested: float | None) -> float:
        if requested is None:
            return self.cfg.timeout_seconds
        if requested <= 0:
            raise ToolError("timeout must be a positive number of seconds")
        return min(float(requested), self.cfg.timeout_seconds)

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        command: str = args["command"]
        if not command.strip():
            raise ToolError("command must not be empty")
        timeout = self._timeout(args.get("timeout"))
        workspace = real_path(ctx.workspace)
        if not workspace.is_dir():
            raise ToolError(f"the workspace {workspace} does not exist")
        reason = check_command(command, workspace if ctx.restrict_to_workspace else None)
        if reason:
            raise ToolError(
                f"command refused: {reason}. This guard blocks destructive commands and, "
                "in a restricted workspace, leaving it; ask the user to run it themselves "
                "if it is really needed."
            )
        scope = ctx.processes or ProcessScope(self.kill_grace_seconds)
        try:
            return await self._run(command, workspace, ctx, scope, seconds=timeout)
        finally:
            if ctx.processes is None:  # no turn to outlive: the call is the scope
                await scope.close()

    async def _run(
        self, command: str, cwd: Path, ctx: ToolContext, scope: ProcessScope, *, seconds: float
    ) -> str:
        if ctx.gate is None:
            raise ToolError("exec is not available here (no process gate)")
        confine = ctx.restrict_to_workspace and self.cfg.sandbox == "landlock"
        capture = _Capture(self.cfg.max_output_chars)
        try:
            proc = await ctx.gate.spawn(
                ["/bin/sh", "-c", command],
                cwd=cwd,
                scope=scope,
                confine=confine,
                network=self.cfg.network,
                restrict=ctx.restrict_to_workspace,
                max_tasks=self.cfg.max_processes,
                max_file_bytes=self.cfg.max_file_bytes,
            )
        except GateRefused as exc:
            raise ToolError(f"exec refused: {exc}") from None
        try:
            async with asyncio.timeout(seconds):
                code = await proc.communicate(capture.add)
        except TimeoutError:
            await proc.stop(self.kill_grace_seconds)
            out = capture.text()
            raise ToolError(
                f"command timed out after {seconds:g} s and was killed (with its child "
                "processes)." + (f" Output before the timeout:\n{out}" if out else "")
            ) from None
        except GateRefused as exc:
            raise ToolError(f"exec refused: {exc}") from None
        except BaseException:
            # Cancellation (/stop) or a bug: never leave the command running behind us.
            await asyncio.shield(proc.stop(self.kill_grace_seconds))
            raise
        finally:
            ctx.gate.after_command()
        return _format_result(capture.text(), code)
