"""``memobot import nanobot [PATH]``: adopt a nanobot installation.

What is where in nanobot (``~/.nanobot`` by default; PATH may also be a workspace itself):

* ``config.json``: provider, channels, tools (translated by :mod:`bot.importer.nanobot_config`);
* ``workspace/``: AGENTS.md, SOUL.md, USER.md, TOOLS.md, HEARTBEAT.md, memory/MEMORY.md,
  memory/history.jsonl (+ .cursor, .dream_cursor), maybe a legacy memory/HISTORY.md, skills/,
  and a git repository nanobot's Dream commits to;
* sessions: ``workspace/sessions/*.jsonl``, or ``~/.nanobot/sessions/<hash>/*.jsonl`` (0.3.5):
  a metadata line ``{"_type": "metadata", "key", "created_at", "metadata",
  "last_consolidated"}`` and OpenAI-style message lines with a ``timestamp``.

The workspace is adopted in place (``agent.workspace`` points at it) or copied (``--copy``).
memobot reads its files as they are: history lines are never rewritten, prompt files never
edited. Sessions are written into memobot's state folder by memobot's own session store, so
they are in memobot's format exactly. The memobot config is written last.

Everything that can refuse the import is checked before the first change: the source, an
existing config (``--force`` replaces it, keeping a ``.bak``), the copy target, the config's
validity and the folder layout. Then changes are made in an order that a re-run repairs: git,
template gaps, legacy history, sessions (existing ones are left alone), config.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import stat
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bot import durable, workspace_files
from bot.config import Config, ConfigError, check_layout, load_config, parse_config, save_config
from bot.cron.heartbeat import FILE as HEARTBEAT_FILE
from bot.cron.heartbeat import open_tasks
from bot.importer.nanobot_config import nanobot_workspace_setting, translate_config
from bot.importer.report import Report
from bot.memory.history import parse_entry
from bot.private import make_private_dirs
from bot.wording import counted

log = logging.getLogger(__name__)

DEFAULT_SOURCE = Path("~/.nanobot")
# The keys of a message line memobot keeps; nanobot's own extras (tools_used, reasoning
# content...) would be sent to the model API, which refuses unknown keys.
MESSAGE_KEYS = ("role", "content", "tool_calls", "tool_call_id", "name", "timestamp")
_ROLES = frozenset({"system", "user", "assistant", "tool"})
# nanobot tools memobot does not have (yet); mentions of them are reported, files not edited.
# (web_search and mcp_<server>_<tool> exist in memobot under the same names.)
NANOBOT_ONLY_TOOLS = ("spawn", "notebook_edit", "glob", "grep")
_TOOL_MENTION = re.compile(r"\b(" + "|".join(NANOBOT_ONLY_TOOLS) + r")\b")
PROMPT_FILES = ("AGENTS.md", "SOUL.md", "USER.md", "TOOLS.md")
_LEFT_ALONE_WHY = {
    "cron": "nanobot's scheduled jobs are not carried over: add them again with `memobot "
    "cron add` (or ask the agent)",
    "sessions": "imported into memobot's state folder (see below)",
    "config.json": "translated (see below)",
}


class ImportRefused(Exception):
    """The import cannot start; ``str()`` is one line for a person. Nothing was changed."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class Source:
    """Where the nanobot installation's parts are. ``home`` is None for a bare workspace."""

    home: Path | None
    workspace: Path
    config: dict[str, Any] | None
    config_problem: str = ""


@dataclass(slots=True)
class SessionImport:
    """One nanobot session file, converted (pure data; written by :func:`_write_session`)."""

    path: Path
    key: str
    messages: list[dict[str, Any]]
    last_consolidated: int
    created_at: str | None
    dropped_keys: Counter[str] = field(default_factory=Counter)
    skipped: int = 0
    key_guessed: bool = False


@dataclass(frozen=True, slots=True)
class Options:
    source: Path
    config_path: Path
    copy: bool = False
    copy_to: Path | None = None
    force: bool = False


# -- finding the parts -----------------------------------------------------------------------


def _looks_like_workspace(path: Path) -> bool:
    return any((path / name).exists() for name in ("memory", "AGENTS.md", "SOUL.md", "USER.md"))


def locate(path: Path) -> Source:
    """The nanobot installation at ``path`` (its home folder or a workspace). Raises
    ImportRefused when there is none."""
    path = path.expanduser().absolute()
    if not path.is_dir():
        raise ImportRefused(f"no nanobot installation at {path} (not a folder)")
    home: Path | None = path
    if not (path / "config.json").is_file():
        if not _looks_like_workspace(path):
            raise ImportRefused(
                f"no nanobot installation at {path}: expected config.json and workspace/ "
                "(~/.nanobot) or a nanobot workspace (memory/, AGENTS.md, ...)"
            )
        parent = path.parent
        home = parent if (parent / "config.json").is_file() else None
        config, problem = _read_config(home / "config.json") if home else (None, "")
        return Source(home, path, config, problem)
    config, problem = _read_config(path / "config.json")
    workspace = path / "workspace"
    setting = nanobot_workspace_setting(config) if config else None
    if setting:
        configured = Path(setting).expanduser()
        configured = configured if configured.is_absolute() else path / configured
        if configured.is_dir():
            workspace = configured
    if not workspace.is_dir():
        raise ImportRefused(f"{path} has a config.json but no workspace folder ({workspace})")
    return Source(home, workspace.absolute(), config, problem)


def _read_config(path: Path) -> tuple[dict[str, Any] | None, str]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        return None, f"cannot be read ({exc})"
    except json.JSONDecodeError as exc:
        return None, f"is not valid JSON (line {exc.lineno}): nothing in it was translated"
    if not isinstance(data, dict):
        return None, "is not a JSON object: nothing in it was translated"
    return data, ""


def session_files(source: Source) -> list[Path]:
    """Every nanobot session file: the workspace's sessions/, then ``~/.nanobot/sessions/``
    and its per-workspace ``<hash>/`` folders (nanobot 0.3.5)."""
    folders = [source.workspace / "sessions"]
    if source.home:
        top = source.home / "sessions"
        folders.append(top)
        if top.is_dir():
            folders += sorted(p for p in top.iterdir() if p.is_dir())
    out: list[Path] = []
    for folder in folders:
        # The workspace's sessions/ was the model's to write: no link in it is followed.
        root = source.workspace if folder == folders[0] else folder.parent
        out += [
            folder / name
            for name, st in workspace_files.list_dir(root, folder.name)
            if name.endswith(".jsonl") and stat.S_ISREG(st.st_mode)
        ]
    return out


# -- sessions (pure) ---------------------------------------------------------------------------


def _utc_stamp(value: Any) -> str | None:
    """memobot's timestamp form (UTC, ms, Z) for nanobot's (naive local time), else None."""
    if not isinstance(value, str) or not value:
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _message(raw: dict[str, Any], dropped: Counter[str]) -> dict[str, Any] | None:
    """A nanobot message line as a memobot message line, or None when it is not a message."""
    if raw.get("role") not in _ROLES:
        return None
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in MESSAGE_KEYS:
            dropped[key] += 1
        elif value is not None or key == "content":
            out[key] = value
    calls = out.get("tool_calls")
    if calls is not None:
        fixed = []
        for call in calls if isinstance(calls, list) else []:
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict) or not isinstance(call.get("id"), str):
                continue
            args = fn.get("arguments")
            if not isinstance(args, str):
                args = json.dumps(args if args is not None else {}, ensure_ascii=False)
            fixed.append(
                {
                    "id": call["id"],
                    "type": "function",
                    "function": {"name": str(fn.get("name", "")), "arguments": args},
                }
            )
        if fixed:
            out["tool_calls"] = fixed
        else:
            out.pop("tool_calls")
    if "timestamp" in out:
        stamp = _utc_stamp(out["timestamp"])
        if stamp:
            out["timestamp"] = stamp
        elif not isinstance(out["timestamp"], str):
            out.pop("timestamp")
    if out["role"] == "tool" and not isinstance(out.get("tool_call_id"), str):
        return None
    for key in ("tool_call_id", "name"):
        if key in out and not isinstance(out[key], str):
            dropped[key] += 1
            out.pop(key)
    return out


def guess_key(path: Path) -> str:
    """nanobot names a session file after its key with ``:`` written as ``_``."""
    stem = path.stem
    channel, sep, rest = stem.partition("_")
    return f"{channel}:{rest}" if sep and rest else f"cli:{stem}"


def convert_session(path: Path, data: bytes) -> SessionImport:
    """Read one nanobot session file. Lines that are not JSON objects or not messages are
    counted in ``skipped``; the last metadata line names the key and the pointer."""
    from bot.session.records import check_record

    meta: dict[str, Any] = {}
    messages: list[dict[str, Any]] = []
    kept_before: list[int] = []  # for each original message index, how many were kept before
    dropped: Counter[str] = Counter()
    skipped = 0
    for raw in data.split(b"\n"):
        if not raw.strip():
            continue
        try:
            value = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            skipped += 1
            continue
        if not isinstance(value, dict):
            skipped += 1
            continue
        if value.get("_type") == "metadata":
            meta = value
            continue
        kept_before.append(len(messages))
        message = _message(value, dropped)
        if message is None or check_record(message).problems:
            skipped += 1
            continue
        messages.append(message)
    key = meta.get("key")
    guessed = not (isinstance(key, str) and key)
    if guessed:
        key = guess_key(path)
    pointer = meta.get("last_consolidated")
    n = pointer if isinstance(pointer, int) and not isinstance(pointer, bool) else 0
    n = max(0, min(n, len(kept_before)))
    last = kept_before[n] if n < len(kept_before) else len(messages)
    created = meta.get("created_at")
    return SessionImport(
        path,
        str(key),
        messages,
        last,
        _utc_stamp(created) or (created if isinstance(created, str) else None),
        dropped,
        skipped,
        guessed,
    )


# -- the import ----------------------------------------------------------------------------------


@dataclass(slots=True)
class Plan:
    source: Source
    workspace: Path  # where the memobot workspace will be (the source's, or the copy)
    config: Config
    config_json: dict[str, Any]
    sessions: list[SessionImport]
    report: Report
    notes: list[tuple[str, str]]


def plan(opts: Options) -> Plan:
    """Everything the import will do, decided without changing anything.

    Raises ImportRefused (code 1, or 78 for a config or layout memobot refuses)."""
    source = locate(opts.source)
    config_path = opts.config_path
    if config_path.exists() and not opts.force:
        raise ImportRefused(
            f"{config_path} exists; nothing was changed. Run again with --force to replace it "
            "(the old file is kept next to it as .bak-<time>), or pass --config NEW_PATH"
        )
    report = Report()
    workspace = source.workspace
    if opts.copy:
        workspace = (opts.copy_to or config_path.parent / "workspace").expanduser().absolute()
        if workspace.exists() and (not workspace.is_dir() or any(workspace.iterdir())):
            raise ImportRefused(f"cannot copy the workspace to {workspace}: it is not empty")
    paths = {"workspace": str(workspace), "stateDir": str(config_path.parent.absolute() / "state")}
    for key, value in paths.items():
        if "${" in value:
            # memobot fills ${NAME} in from its own environment, and has no way to write one
            # that it leaves alone: the path would name another folder, or a secret.
            raise ImportRefused(
                f"agent.{key} would be {value}, which holds ${{...}}: memobot would fill it in "
                "from its own environment. Import with --copy (the workspace goes next to the "
                "config, or to --workspace), and a --config path without ${"
            )
    translation = translate_config(source.config or {})
    data = translation.config
    data["agent"].update(paths)
    try:
        cfg = parse_config(json.loads(json.dumps(data)), "the translated nanobot config")
        check_layout(cfg, config_path)
    except ConfigError as exc:
        raise ImportRefused(str(exc), code=78) from None
    for what, why in translation.dropped:
        report.add("not carried", what, why)
    sessions = []
    for path in session_files(source):
        try:
            data = workspace_files.read_bytes(path.parent, path.name)
            sessions.append(convert_session(path, data))
        except OSError as exc:
            report.add("left alone", _rel(source, path), f"cannot be read ({exc.strerror})")
    return Plan(source, workspace, cfg, data, sessions, report, translation.notes)


def run_import(opts: Options) -> tuple[Plan, Path]:
    """Plan, then carry it out. Returns the plan (with its report filled in) and the path
    of the written config. Raises ImportRefused before any change; OSError and
    MemoryRepoError from the changes themselves (a re-run picks up where it stopped)."""
    p = plan(opts)
    src, report = p.source, p.report
    if p.workspace != src.workspace:
        _copy_workspace(src.workspace, p.workspace)
        report.add("converted", "workspace", f"copied to {p.workspace} (the original is untouched)")
    else:
        report.add("adopted", "workspace", f"{p.workspace}, in place")
    _adopt_files(p)
    _adopt_repo(p)
    _fill_template(p)
    _migrate_legacy(p)
    _import_sessions(p)
    _write_config(p, opts)
    return p, opts.config_path


def _rel(source: Source, path: Path) -> str:
    for base in (source.workspace, source.home):
        if base and path.is_relative_to(base):
            prefix = "" if base == source.workspace else "~nanobot/"
            return prefix + str(path.relative_to(base))
    return str(path)


def _copy_workspace(src: Path, dest: Path) -> None:
    """Copy the workspace without its sessions/ (transcripts go to the state folder, out of the
    agent's reach) and its .git (the history goes to memobot's own repository, see
    :func:`_adopt_repo`); symlinks are copied as links, never followed."""
    make_private_dirs(dest.parent)
    shutil.copytree(
        src,
        dest,
        symlinks=True,
        ignore=lambda folder, names: ["sessions", ".git"] if Path(folder) == src else [],
        dirs_exist_ok=True,
    )
    os.chmod(dest, 0o700)


def _adopt_files(p: Plan) -> None:
    """Report each file of the workspace (and of nanobot's home) as memobot will use it."""
    ws, report = p.workspace, p.report
    for name in PROMPT_FILES:
        if not workspace_files.is_file(ws, name):
            continue
        text = workspace_files.read_text_or_empty(ws, name)
        tools = sorted(set(_TOOL_MENTION.findall(text)))
        detail = "in the system prompt"
        if tools:
            detail += (
                f"; it mentions tools memobot does not have ({', '.join(tools)}): the file is "
                "left as it is, edit it if the agent should stop offering them"
            )
        report.add("adopted", name, detail)
    memory = ws / "memory"
    if workspace_files.is_file(ws, "memory/MEMORY.md"):
        report.add("adopted", "memory/MEMORY.md", "in the system prompt")
    history = memory / "history.jsonl"
    if workspace_files.is_file(ws, history):
        total = without = bad = 0
        for raw in workspace_files.read_bytes(ws, history).split(b"\n"):
            if not raw.strip():
                continue
            entry = parse_entry(raw)
            if entry is None:
                bad += 1
                continue
            total += 1
            without += not entry.session
        detail = f"{counted(total, 'entry', 'entries')}, read as they are (never rewritten)"
        if without:
            detail += f"; {without} without a session"
        if bad:
            detail += f"; {bad} line(s) that are not entries are skipped"
        report.add("adopted", "memory/history.jsonl", detail)
    for name, what in ((".cursor", "last archive cursor"), (".dream_cursor", "Dream's cursor")):
        if workspace_files.is_file(ws, memory / name):
            value = workspace_files.read_text_or_empty(ws, memory / name).strip()
            report.add("adopted", f"memory/{name}", f"{what} {value}")
    found = workspace_files.files_matching(ws, "skills", "SKILL.md")
    if found:
        from bot.skills import FrontMatterError, parse_front_matter

        for rel, _ in found:
            try:
                meta = parse_front_matter(workspace_files.read_text_or_empty(ws, rel))
            except FrontMatterError as exc:
                report.add("adopted", rel, f"its front matter cannot be read ({exc})")
                continue
            if not meta.get("description"):
                report.add("adopted", rel, "no description: the prompt lists it by name only")
            else:
                report.add("adopted", rel)
    if workspace_files.is_file(ws, HEARTBEAT_FILE):
        tasks = open_tasks(workspace_files.read_text_or_empty(ws, HEARTBEAT_FILE))
        report.add(
            "adopted",
            HEARTBEAT_FILE,
            f"read by the heartbeat every heartbeat.intervalMinutes; {len(tasks)} open task(s)",
        )
    handled = {*PROMPT_FILES, HEARTBEAT_FILE, "memory", "skills", ".git", ".gitignore"}
    for entry in sorted(ws.iterdir()):
        if entry.name in handled:
            continue
        why = _LEFT_ALONE_WHY.get(entry.name, "memobot does not use it; the agent can read it")
        if entry.name == "sessions":
            why = (
                "imported into memobot's state folder; this copy stays in the workspace, where "
                "the agent's tools can read it: move it away once you no longer need nanobot"
            )
        report.add("left alone", entry.name + ("/" if entry.is_dir() else ""), why)
    if (memory).is_dir():
        known = {"MEMORY.md", "history.jsonl", ".cursor", ".dream_cursor", "HISTORY.md"}
        for entry in sorted(memory.iterdir()):
            if entry.name not in known:
                report.add("left alone", f"memory/{entry.name}", "memobot does not use it")
    home = p.source.home
    if home:
        for entry in sorted(home.iterdir()):
            if entry.name in ("workspace", "sessions", "config.json"):
                continue
            if entry == p.source.workspace:
                continue
            why = _LEFT_ALONE_WHY.get(entry.name, "memobot does not use it")
            report.add("left alone", f"~nanobot/{entry.name}", why)


def _adopt_repo(p: Plan) -> None:
    """nanobot's memory repository: its history is copied into memobot's own, in the state
    folder (:meth:`MemoryRepo.migrate`); the workspace's ``.git`` is left as it is, unused."""
    from bot.memory.versioning import MemoryRepo

    repo = MemoryRepo(p.workspace, p.config.agent.state_path)
    found = repo.migrate(p.source.workspace)
    if found.state == "none":
        return  # _fill_template makes the first commit
    if found.state == "exists":
        commits = len(repo.log(limit=100_000))
        p.report.add(
            "adopted", "memory history", f"memobot's own, {commits} commit(s) in {repo.git_dir}"
        )
        return
    if found.state != "copied":
        p.report.add(
            "left alone",
            ".git",
            f"not copied: {found.detail}; memobot starts its own memory history in {repo.git_dir}",
        )
        return
    repo.commit("memobot: memory files as imported from nanobot\n")
    detail = f"nanobot's memory history, {found.commits} commit(s) kept in {repo.git_dir}"
    if found.drop:
        detail += f"; no longer versioned (the files stay): {', '.join(found.drop)}"
    p.report.add("adopted", ".git", detail + "; memobot no longer uses .git itself")


def _fill_template(p: Plan) -> None:
    from bot.app import initial_memory_commit
    from bot.memory.versioning import MemoryRepo
    from bot.workspace import init_workspace

    state = p.config.agent.state_path
    repo = MemoryRepo(p.workspace, state)
    had_history = bool(repo.log(limit=1))
    created = init_workspace(p.workspace)
    for path in created:
        if workspace_files.is_file(p.workspace, path):
            p.report.add("added", str(path.relative_to(p.workspace)), "from memobot's template")
    if not had_history:
        repo.commit("memobot: memory files as imported from nanobot\n")
        p.report.add("added", "memory history", f"{repo.git_dir} (memobot memory log)")
    elif created:
        initial_memory_commit(p.workspace, state)
    mode = os.stat(p.workspace).st_mode & 0o777
    if mode & 0o077:
        os.chmod(p.workspace, 0o700)
        p.report.add("converted", "workspace mode", f"{mode:o} -> 700 (it holds private memory)")


def _migrate_legacy(p: Plan) -> None:
    if not workspace_files.is_file(p.workspace, "memory/HISTORY.md"):
        return
    from bot.memory.migrate import migrate_legacy_history

    count = migrate_legacy_history(p.workspace)
    p.report.add(
        "converted",
        "memory/HISTORY.md",
        f"{counted(count, 'entry', 'entries')} appended to memory/history.jsonl; kept as "
        "memory/HISTORY.md.bak",
    )


def _import_sessions(p: Plan) -> None:
    from bot.session import SessionStore, transitions

    state = p.config.agent.state_path
    make_private_dirs(state)  # transcripts are private, the folder's parents too
    store = SessionStore(state)
    existing = set(store.keys())
    newest: dict[str, SessionImport] = {}
    for item in p.sessions:
        other = newest.get(item.key)
        if other is None or item.path.stat().st_mtime > other.path.stat().st_mtime:
            if other is not None:
                p.report.add(
                    "left alone", _rel(p.source, other.path), f"an older copy of {other.key}"
                )
            newest[item.key] = item
        else:
            p.report.add("left alone", _rel(p.source, item.path), f"an older copy of {item.key}")
    for key, item in newest.items():
        rel = _rel(p.source, item.path)
        if key in existing:
            p.report.add("left alone", rel, f"memobot already has a session {key}; kept as it is")
            continue
        session = store.get(key)
        store.apply(
            session,
            transitions.imported(f"nanobot:{item.path}", item.created_at or None),
            item.messages,
            last_consolidated=item.last_consolidated,
        )
        detail = (
            f"session {key}{' (key guessed from the file name)' if item.key_guessed else ''}, "
            f"{counted(len(item.messages), 'message')} "
            f"({len(item.messages) - item.last_consolidated} not yet "
            f"archived, in the next prompt) -> {session.path}"
        )
        if item.dropped_keys:
            detail += "; dropped nanobot-only fields: " + ", ".join(sorted(item.dropped_keys))
        if item.skipped:
            detail += f"; {item.skipped} line(s) that are not valid messages skipped"
        p.report.add("converted", rel, detail)


def _write_config(p: Plan, opts: Options) -> None:
    path = opts.config_path
    backup = ""
    if path.exists():
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        old = path.with_name(f"{path.name}.bak-{stamp}")
        durable.move(path, old)
        backup = f" (the previous one is kept as {old.name})"
    save_config(p.config, path)
    load_config(path)  # what memobot will read at start; raises ConfigError if it cannot
    where = "config.json" if p.source.home else "(no nanobot config.json found)"
    detail = f"-> {path}, mode 0600{backup}"
    if p.source.config_problem:
        detail += f"; nanobot's config.json {p.source.config_problem}"
    p.report.add("converted", where, detail)
    for key, note in p.notes:
        p.report.add("converted", key, note)
