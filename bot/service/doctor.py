"""``memobot doctor``: check that memobot can run here, one line per check, a fix for each failure.

Checks are read-only unless ``--fix``, which applies only repairs that cannot lose data: file
modes, and damaged session files through the session loader's own quarantine (a copy of the
file is kept aside before the good lines are rewritten). Network checks use short timeouts; a
chat platform that cannot be reached is a warning, since a server may be offline on purpose.
"""

from __future__ import annotations

import asyncio
import functools
import os
import shlex
import stat
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from bot import workspace_files
from bot.config import Config, ConfigError, default_config_path, load_config
from bot.file_errors import file_problem
from bot.invocation import program
from bot.service.checks import Check, Status
from bot.service.probes import check_llm, check_token, proxy_for, token_probes
from bot.wording import counted

CLOCK_SKEW_LIMIT_SECONDS = 300.0
_MARKS = {"ok": ("✓", "OK"), "warn": ("!", "WARN"), "fail": ("✗", "FAIL"), "info": ("·", "INFO")}


def _marks_fit() -> bool:
    try:
        "✓✗·".encode(sys.stdout.encoding or "ascii")
    except (UnicodeEncodeError, LookupError):
        return False
    return True


def format_check(check: Check, unicode: bool = True) -> str:
    mark = _MARKS[check.status][0 if unicode else 1]
    line = f"{mark} {check.text}"
    if check.fix:
        line += "\n    fix: " + check.fix.replace("\n", "\n         ")
    return line


# -- config and permissions ------------------------------------------------------------------


def check_config(path: Path) -> tuple[Check, Config | None]:
    if not path.exists():
        return Check(
            "fail",
            f"config: {path} does not exist (memobot would run on defaults)",
            f"{program()} --config {path} onboard",
        ), None
    try:
        cfg, _ = load_config(path)
    except OSError as exc:
        problem = file_problem(exc)
        if problem is None:
            raise
        what, fix = problem.explained
        return Check("fail", f"config: {what}", fix), None
    except ConfigError as exc:
        return Check(
            "fail", f"config is invalid:\n    {exc}".replace("\n", "\n    "), f"edit {path}"
        ), None
    return Check("ok", f"config valid: {path}"), cfg


def check_mode(path: Path, want: int, what: str, fix: bool, severity: Status = "fail") -> Check:
    """``path`` must not be readable by group or others (it holds keys, or conversations)."""
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        return Check("fail", f"{what} {path} does not exist", f"{program()} onboard")
    if not mode & 0o077:
        return Check("ok", f"{what} {path} is private (mode {mode:04o})")
    command = f"chmod {want:o} {path}"
    if fix:
        os.chmod(path, want)
        return Check("ok", f"{what} {path}: mode {mode:04o} changed to {want:04o} (fixed)")
    return Check(
        severity, f"{what} {path} has mode {mode:04o}: others may read it", command, fixable=True
    )


# -- workspace files ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SessionScan:
    bad_lines: list[int]  # 1-based, complete lines that are not JSON: the loader quarantines
    torn_tail: bool  # an unfinished last line: the loader ignores it and cuts it at the next write
    # (line, what is wrong) for JSON records of the wrong shape: the loader quarantines them too
    misshapen: list[tuple[int, str]] = field(default_factory=list)

    @property
    def damaged(self) -> bool:
        """Lines the loader sets aside (a torn tail is only cut off)."""
        return bool(self.bad_lines or self.misshapen)


def scan_session(data: bytes) -> SessionScan:
    """Classify a session file's lines exactly as ``SessionStore`` does on load, reading only."""
    from bot.session import parse_json_line
    from bot.session.records import check_record

    lines = data.split(b"\n")
    torn = bool(lines.pop())
    bad: list[int] = []
    misshapen: list[tuple[int, str]] = []
    for n, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        ok, value = parse_json_line(raw)
        if not ok:
            bad.append(n)
        else:
            misshapen.extend((n, problem) for problem in check_record(value).problems)
    if bad and bad[-1] == len(lines):  # a complete but unparsable last line is torn as well
        bad.pop()
        torn = True
    return SessionScan(bad, torn, misshapen)


def check_sessions(cfg: Config, fix: bool) -> Iterator[Check]:
    from bot.gateway import read_status
    from bot.session import (
        SUFFIX,
        SessionPathError,
        SessionStore,
        StateLayoutError,
        check_folder,
        filename_to_key,
    )

    folder = cfg.agent.state_path / "sessions"
    try:
        check_folder(folder, "the sessions folder")
    except StateLayoutError as exc:
        yield Check("fail", str(exc), "move that file away; memobot creates the folder at start")
        return
    # Listed so that a folder memobot may not read fails here, naming it (glob sees nothing).
    files = (
        sorted(p for p in folder.iterdir() if p.name.endswith(SUFFIX) and p.name[0] != ".")
        if folder.is_dir()
        else []
    )
    damaged: list[tuple[str, Path, SessionScan]] = []
    for path in files:
        if not path.is_file():
            yield Check("fail", str(SessionPathError(path)), f"move {path} away")
            continue
        try:
            key = filename_to_key(path.name)
            scan = scan_session(path.read_bytes())
        except (OSError, ValueError, UnicodeDecodeError) as exc:
            problem = file_problem(exc)
            if problem is not None:
                yield Check("fail", *problem.explained)
            else:
                yield Check("fail", f"session file {path} cannot be read: {exc}")
            continue
        if scan.damaged or scan.torn_tail:
            damaged.append((key, path, scan))
    if not files:
        yield Check("ok", f"sessions: none yet ({folder})")
    elif not damaged:
        yield Check("ok", f"sessions: all {len(files)} file(s) parse ({folder})")
    live = read_status(cfg.agent.state_path) if fix and damaged else None
    store = SessionStore(cfg.agent.state_path) if fix and damaged and not live else None
    for key, path, scan in damaged:
        where = f"session {key} ({path})"
        if live:
            yield Check(
                "fail",
                f"{where}: not repaired, the gateway is running (pid {live['pid']})",
                "stop it (systemctl stop memobot), then memobot doctor --fix",
            )
        elif store is not None:
            yield _repair_session(store, key, where)
        elif scan.damaged:
            found = []
            if scan.bad_lines:
                found.append(f"line(s) {', '.join(map(str, scan.bad_lines[:10]))} do not parse")
            found += [f"line {n}: {what}" for n, what in scan.misshapen[:10]]
            yield Check(
                "fail",
                f"{where}: " + "; ".join(found),
                f"{program()} doctor --fix (copies the file aside as .corrupt-<time>, keeps every "
                "good line)",
                fixable=True,
            )
        else:
            yield Check(
                "warn",
                f"{where}: torn last line from an interrupted write (ignored; cut off at the "
                "next write)",
                f"{program()} doctor --fix cuts it now",
                fixable=True,
            )
    aside = sorted(folder.glob(f"*{SUFFIX}.corrupt-*")) if folder.is_dir() else []
    if aside:
        yield Check(
            "info", f"{len(aside)} quarantined copy(ies) of damaged sessions kept in {folder}"
        )


def _repair_session(store: Any, key: str, where: str) -> Check:
    # The loader copies a file with bad lines aside and rewrites it with every good line; a
    # torn tail it only marks, so compaction (the store's own safe rewrite) drops it now.
    session = store.get(key)
    if session.truncate_at is not None:
        store.compact(session)
    scan = scan_session(session.path.read_bytes())
    if scan.damaged or scan.torn_tail:
        return Check("fail", f"{where}: still damaged after repair", f"inspect {session.path}")
    return Check("ok", f"{where}: repaired ({counted(session.count, 'message')} kept)")


def check_history(cfg: Config) -> Check:
    from bot.memory.history import parse_entry
    from bot.workspace import workspace_shape_problem

    problem = workspace_shape_problem(cfg.agent.workspace_path)
    if problem:  # a folder where a memory file belongs: every turn would trip over it
        return Check("fail", problem, "move it away; memobot recreates what it needs")
    path = cfg.agent.workspace_path / "memory" / "history.jsonl"
    try:
        data = workspace_files.read_bytes(cfg.agent.workspace_path, path)
    except FileNotFoundError:
        return Check("ok", f"{path}: not created yet")
    lines = data.split(b"\n")
    tail = lines.pop()
    bad = [n for n, raw in enumerate(lines, 1) if raw.strip() and parse_entry(raw) is None]
    if bad:
        shown = ", ".join(map(str, bad[:10]))
        return Check(
            "fail",
            f"{path}: line(s) {shown} do not parse; search and Dream skip them",
            f"edit {path}: each line must be a JSON object with a cursor and content "
            "(timestamp and session are optional), or delete the line",
        )
    if tail.strip():
        return Check("warn", f"{path}: torn last line (the next archive write starts a new line)")
    return Check("ok", f"{path}: {counted(len(lines), 'entry', 'entries')} parse")


def check_memory_history(cfg: Config) -> Iterator[Check]:
    """Where the memory history is (memobot's own repository in the state folder), and an old
    workspace ``.git`` it no longer uses. Reads only: nothing is created or copied here."""
    from bot.memory.versioning import MemoryRepo, MemoryRepoError

    repo = MemoryRepo(cfg.agent.workspace_path, cfg.agent.state_path)
    old = workspace_files.is_dir(cfg.agent.workspace_path, ".git")
    if not repo.git_dir.exists():
        later = f"; at first use, the memory history of {repo.workspace / '.git'} is copied there"
        yield Check("ok", f"memory history: {repo.git_dir} not created yet{later if old else ''}")
        return
    try:
        commits = len(repo.log(limit=1_000_000))
    except (MemoryRepoError, OSError) as exc:
        yield Check("fail", f"memory history: {exc}", f"move {repo.git_dir} away")
        return
    yield Check("ok", f"memory history: {repo.git_dir}, {commits} commit(s)")
    if old:
        yield Check(
            "info",
            f"memory history: {repo.workspace / '.git'} is no longer used by memobot (its history "
            f"is in {repo.git_dir}); remove it when you like",
        )


# -- service unit and clock --------------------------------------------------------------------


def check_units(config_path: Path | None) -> Check:
    from bot.service.install import plan, unit_dir
    from bot.service.units import UNIT_NAME

    found = False
    seen: set[Path] = set()
    for kind in ("system", "user"):
        target = unit_dir(kind) / UNIT_NAME
        if target in seen or not target.exists():
            continue
        seen.add(target)
        found = True
        installed = target.read_text()
        # MEMOBOT_UNIT_DIR may hold either kind; the unit's own [Install] section says which.
        actual = "user" if "WantedBy=default.target" in installed else "system"
        flag = " --user" if actual == "user" else ""
        conf = f" --config {config_path}" if config_path else ""
        try:
            expected = plan(actual, config_path).text
        except ConfigError as exc:
            return Check("warn", f"cannot compare {target} with this installation: {exc}")
        if installed == expected:
            return Check("ok", f"{actual} unit {target} matches this installation")
        diff = _first_difference(installed, expected)
        return Check(
            "fail",
            f"{actual} unit {target} differs from this installation ({diff})",
            f"memobot{conf} service install{flag} --force, then systemctl{flag} daemon-reload",
        )
    if not found:
        return Check("info", "no systemd unit installed (memobot service install [--user])")
    return Check("info", "no systemd unit checked")


def _first_difference(installed: str, expected: str) -> str:
    """The first differing setting (comment lines are skipped: they explain, they do not act)."""

    def settings(text: str) -> list[str]:
        return [line for line in text.splitlines() if line and not line.startswith("#")]

    for a, b in zip(settings(installed), settings(expected), strict=False):
        if a != b:
            return f"installed {a!r}, expected {b!r}"
    return (
        "settings are the same, comments differ"
        if settings(installed) == settings(expected)
        else "a different number of settings"
    )


def install_time() -> float:
    """When this installation's files were written: a clock before that is certainly wrong."""
    package = Path(__file__).resolve().parents[1]
    return max(p.stat().st_mtime for p in package.glob("*.py"))


def check_clock(server: tuple[str, float] | None, now: float | None = None) -> Check:
    now = time.time() if now is None else now
    fix = "turn on time synchronisation: timedatectl set-ntp true"
    built = install_time()
    if now < built:
        stamp = time.strftime("%Y-%m-%d %H:%M", time.gmtime(built))
        return Check(
            "fail", f"clock: the system time is before this installation ({stamp} UTC)", fix
        )
    if server is None:
        return Check("ok", "clock: after this installation's date (no server time to compare)")
    host, server_time = server
    skew = now - server_time
    if abs(skew) > CLOCK_SKEW_LIMIT_SECONDS:
        return Check("fail", f"clock: {skew:+.0f} s off the time of {host}", fix)
    return Check("ok", f"clock: within {abs(skew):.0f} s of {host}")


def check_confinement(cfg: Config) -> Check:
    """Which confinement the agent's commands get, and whether exec can run at all."""
    from bot.gate import describe_confinement

    tools = cfg.tools
    if not tools.exec.enabled:
        return Check("info", "exec: disabled (tools.exec.enabled is false)")
    c = describe_confinement(tools.restrict_to_workspace, tools.exec.sandbox, tools.exec.network)
    if c.refused:
        return Check("fail", f"exec confinement: {c.summary}", 'tools.exec.sandbox: "off"')
    return Check("ok" if c.active and not c.gaps else "warn", f"exec confinement: {c.summary}")


def check_limits(cfg: Config) -> Check:
    """The process and file size caps of the agent's commands; the running gateway's when it
    runs (under systemd its cgroup is not this shell's)."""
    from bot.app import exec_limits_line
    from bot.gateway import read_status

    if not cfg.tools.exec.enabled:
        return Check("info", "exec limits: exec is disabled")
    live = (read_status(cfg.agent.state_path) or {}).get("exec_limits")
    line = f"{live} (in the running gateway)" if isinstance(live, str) else exec_limits_line(cfg)
    if line.startswith("NO process cap"):
        return Check(
            "warn",
            f"exec limits: {line}",
            "run memobot as the systemd service (Delegate=pids), or start it with "
            "`systemd-run --scope -p Delegate=pids memobot gateway`, or as a user other than "
            "root",
        )
    return Check("ok", f"exec limits: {line}")


def check_workspace_size(cfg: Config) -> Check:
    from bot.gate.usage import describe, measure

    path = cfg.agent.workspace_path
    warn = cfg.agent.workspace_warn_bytes
    size, complete = measure(path)
    text = f"workspace size: {describe(size, complete, warn)}"
    if warn and size > warn:
        return Check("warn", text, f"free space in {path}, or raise agent.workspaceWarnBytes")
    return Check("ok", text)


def check_exec_allow(cfg: Config) -> Iterator[Check]:
    """A ``tools.exec.allow`` pattern that lets git run unasked: a repository's config (the
    model's to write) can make any git command run a program."""
    tools = cfg.tools
    if not tools.exec.enabled or tools.approval != "risky":
        return
    for pattern in tools.exec.allow:
        words = shlex.split(pattern)  # the config's validator made sure it can be read
        if words and fnmatchcase("git", words[0]):
            yield Check(
                "warn",
                f"tools.exec.allow lists {pattern!r}: git runs unasked, and a .git/config or "
                ".gitattributes the model wrote can make it run any program (confined)",
                f"remove {pattern!r} from tools.exec.allow to be asked first",
            )


def check_mcp(cfg: Config, config_path: Path) -> Iterator[Check]:
    """Start each MCP server the way the agent does and list its tools."""
    if not cfg.tools.mcp_servers:
        return
    from bot.app import mcp_log_dir, probe_mcp_servers

    if not cfg.agent.workspace_path.is_dir():
        yield Check("fail", "mcp: the workspace does not exist yet", f"{program()} onboard")
        return
    statuses = probe_mcp_servers(cfg, config_path)
    for st in statuses:
        if st.state == "connected":
            shown = ", ".join(st.tools[:8]) + (", ..." if len(st.tools) > 8 else "")
            yield Check("ok", f"mcp server {st.name}: starts, {len(st.tools)} tool(s): {shown}")
            continue
        fix = f"check tools.mcpServers.{st.name} in {config_path}"
        if st.transport == "stdio":
            fix += f"; its stderr is in {mcp_log_dir(cfg) / (st.name + '.log')}"
        yield Check("fail", f"mcp server {st.name}: {st.detail}", fix)


def check_channel_access(cfg: Config) -> Iterator[Check]:
    """An enabled channel that would refuse everyone: dmPolicy "allowlist" with nobody in
    allowFrom and nobody let in by pairing earlier."""
    from bot.pairing import PairingStore
    from channels import registry
    from channels.access import dm_policy_of

    for spec in registry.enabled(cfg):
        section = spec.section(cfg)
        if section is None or section.allow_from or dm_policy_of(section) == "pairing":
            continue
        if PairingStore(cfg.agent.state_path, spec.name).approved_ids():
            continue
        yield Check(
            "warn",
            f'channel {spec.name}: allowFrom is empty and dmPolicy is "allowlist": every '
            "message is refused",
            f"{program()} channels add {spec.name} --owner YOUR_ID (or set "
            f'channels.{spec.name}.dmPolicy to "pairing": strangers get a code you approve)',
        )


def check_running_channels(cfg: Config) -> Iterator[Check]:
    """Channels the running gateway reports as failed (a token accepted here may still be
    refused there: intents, a revoked app token), and answers it could not deliver."""
    from bot.delivery import undelivered
    from bot.gateway import read_status

    live = read_status(cfg.agent.state_path)
    for name, info in sorted(((live or {}).get("channels") or {}).items()):
        if info.get("state") == "failed":
            yield Check(
                "fail",
                f"channel {name}: failed in the running gateway: {info.get('detail') or '?'}",
                "fix the config, then restart the gateway",
            )
        for feature, why in (info.get("features_off") or {}).items():
            yield Check(
                "warn",
                f"channel {name}: {feature} off in the running gateway ({why})",
                "the platform (or the server at baseUrl) does not offer it; a restart tries again",
            )
    failed = [e for _, e in undelivered(cfg.agent.state_path)]
    given_up = [e for e in failed if e.get("state") == "failed"]
    if given_up:
        yield Check(
            "warn",
            f"{len(given_up)} answer(s) could not be delivered (the user was told); last: "
            f"{given_up[-1].get('reason')}",
            f"{program()} status lists them",
        )


# -- the command -------------------------------------------------------------------------------


def _guarded(check: Callable[[], Check | Iterable[Check]], told: set[str]) -> Iterator[Check]:
    """Run one check. A file or folder it may not use (another user's, a folder in a file's
    place: bot.file_errors) is a failed check naming the path, once (``told``: the ones
    already reported), and the next checks run."""
    try:
        found = check()
        yield from [found] if isinstance(found, Check) else found
    except OSError as exc:
        problem = file_problem(exc)
        if problem is None:
            raise
        what, fix = problem.explained
        if what not in told:
            told.add(what)
            yield Check("fail", what, fix)


def run_checks(config_path: Path | None, fix: bool) -> Iterator[Check]:
    path = (config_path or default_config_path()).expanduser()
    check, cfg = check_config(path)
    yield check
    guarded = functools.partial(_guarded, told=set())
    yield from guarded(
        lambda: [check_mode(path, 0o600, "config file", fix)] if path.exists() else []
    )
    server = None
    if cfg is not None:
        ws, state = cfg.agent.workspace_path, cfg.agent.state_path
        yield from guarded(lambda: check_mode(ws, 0o700, "workspace", fix))
        # Transcripts sit in its own 0700 sessions/ folder; the rest (terminal history,
        # channel offsets) is less private: a warning, not a failure.
        yield from guarded(
            lambda: (
                [check_mode(state, 0o700, "state folder", fix, severity="warn")]
                if state.exists()
                else []
            )
        )
        yield from guarded(lambda: check_sessions(cfg, fix))
        yield from guarded(lambda: check_history(cfg))
        yield from guarded(lambda: check_memory_history(cfg))
        yield check_confinement(cfg)
        yield from check_exec_allow(cfg)
        yield from guarded(lambda: check_limits(cfg))
        yield from guarded(lambda: [check_workspace_size(cfg)] if ws.is_dir() else [])
        yield from guarded(lambda: check_mcp(cfg, path))
        probe = asyncio.run(check_llm(cfg, path))
        server = probe.date_header
        yield probe.check
        probes = token_probes(cfg)
        if not probes:
            yield Check("info", "channels: none enabled (set channels.<name>.enabled)")
        for token_probe in probes:
            yield asyncio.run(check_token(token_probe, proxy_for(cfg, token_probe)))
        yield from guarded(lambda: check_channel_access(cfg))
        yield from guarded(lambda: check_running_channels(cfg))
    yield from guarded(lambda: check_units(config_path))
    yield check_clock(server)


def cmd_doctor(config_path: Path | None, fix: bool = False) -> int:
    """Print every check as it completes; 1 if any failed, else 0."""
    unicode = _marks_fit()
    failed = fixable = 0
    for check in run_checks(config_path, fix):
        print(format_check(check, unicode), flush=True)
        failed += check.status == "fail"
        fixable += check.fixable
    hint = f" {fixable} can be repaired with memobot doctor --fix." if fixable else ""
    if failed:
        print(f"\n{failed} problem(s) found.{hint}")
        return 1
    print(f"\nAll checks passed.{hint}")
    return 0
