"""The approval decision: which tool calls wait for a person's yes (DESIGN.md section 10).

Pure functions over plain data, deciding from each tool's declared effects
(:mod:`bot.gate.effects`), never from its name. ``tools.approval`` is "off" (nothing asks),
"always" (every call asks) or "risky" (the default): a command that no ``tools.exec.allow``
pattern matches (``exec``), any other process a tool starts, a path a tool writes outside the
workspace when the agent is not restricted to it (``write_file``, ``edit_file``), and every
tool whose effects nobody declared, MCP tools included unless ``tools.safeMcpTools`` lists
them. A question names the whole call (:class:`Question`; how it is shown:
:mod:`bot.gate.question`), and "Always allow" remembers exactly that call, never a tool
whatever its arguments.

A pending approval is a record in the turn's checkpoint (phase ``awaiting_approval``); the
helpers at the end change such records under the session's lock, so a button press, the
timeout and ``/stop`` cannot both win.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Literal

from bot.gate.effects import Effects
from bot.gate.question import one_line
from bot.safejson import BadArguments, parse_arguments

Mode = Literal["off", "risky", "always"]
Choice = Literal["once", "always", "deny"]
CHOICES: tuple[Choice, ...] = ("once", "always", "deny")
SHOW = "show"  # a press that asks for the whole text of a question, not an answer
# Safe to run unasked: they read, and the path policy still decides what they may read.
# None of them runs anything a file names, whatever options follow (a pattern covers every
# later word, and a glob may expand to a file called "--something"): GNU ls, cat, head,
# tail, wc and grep read no config file and have no option that starts a program, and the
# gate's PATH holds no folder the model can write. git is not here: a repository's config
# (a clean filter named in .gitattributes, which even `git status` runs) can make it run
# any program, and no fixed list of settings can switch every such name off.
DEFAULT_EXEC_ALLOW: tuple[str, ...] = ("ls", "pwd", "cat", "head", "tail", "wc", "grep")
# Anything that makes a second command, a substitution or a redirection: a command holding
# one of these is never "ls", whatever it starts with. Backslash and quotes are allowed only
# where shlex reads them as plain quoting.
_SHELL_SYNTAX = re.compile(r"[;&|`$<>\n\r()\\{}]")
APPROVAL_ID = re.compile(r"^ap-[0-9a-f]{12}$")
WAITING = "waiting"  # bot.session.state.WAITING (not imported: bot.config imports this module)
# A call longer than this is not asked about but refused: nobody reviews 100,000 characters,
# and the whole text must reach the person ("Show all") in a bearable number of messages.
MAX_REVIEW_CHARS = 100_000

Outcome = Literal["waiting", "once", "always", "deny", "timeout", "stopped"]


def new_approval_id() -> str:
    return f"ap-{secrets.token_hex(6)}"


def allow_pattern_problem(pattern: str) -> str | None:
    """Why ``pattern`` cannot be a tools.exec.allow entry, or None."""
    if not pattern.strip():
        return "an empty pattern would allow every command"
    if _SHELL_SYNTAX.search(pattern):
        return "a pattern is plain words (globs allowed), without shell syntax such as ; | $ >"
    try:
        shlex.split(pattern)
    except ValueError as exc:
        return f"cannot be read as words ({exc})"
    return None


def command_allowed(command: str, patterns: list[str] | tuple[str, ...]) -> bool:
    """Whether ``command`` is one simple command that a pattern covers.

    A pattern's words must match the command's first words (``fnmatch`` per word, so
    ``git status`` covers ``git status --short`` and ``ls`` covers ``ls -la src``, but ``ls``
    does not cover ``lsblk``). Any shell syntax beyond quoting (``;``, ``&&``, ``|``, ``$(``,
    backticks, redirections, newlines) makes the command unmatched.
    """
    if _SHELL_SYNTAX.search(command):
        return False
    try:
        words = shlex.split(command)
    except ValueError:
        return False
    if not words:
        return False
    for pattern in patterns:
        try:
            want = shlex.split(pattern)
        except ValueError:
            continue
        if want and len(words) >= len(want) and all(map(fnmatchcase, words, want)):
            return True
    return False


def matches_any(name: str, patterns: list[str] | tuple[str, ...]) -> bool:
    return any(fnmatchcase(name, p) for p in patterns)


@dataclass(frozen=True, slots=True)
class ApprovalPolicy:
    mode: Mode
    exec_allow: tuple[str, ...]
    safe_mcp: tuple[str, ...]
    workspace: Path
    restrict_to_workspace: bool
    timeout_seconds: float


@dataclass(frozen=True, slots=True)
class Question:
    """What a person is asked about one call.

    ``subject`` is the whole of what would run, exactly: the command, or the tool's name and
    its arguments (all of them, as JSON). ``key`` is what "Always allow" remembers for the
    chat: ``exec:<command>`` or ``call:<tool>:<canonical JSON of the arguments>``, so an
    allowed call never allows the same tool with other arguments.
    """

    tool: str
    subject: str
    key: str
    outside: bool = False  # a file write outside the workspace
    command: bool = False  # the subject is a shell command the tool would run

    @property
    def summary(self) -> str:
        """One short visible line, for ``memobot status`` and the logs."""
        head = f"{self.tool}: {self.subject}" if self.command else self.subject
        return one_line(head)

    @property
    def intro(self) -> str:
        if self.command:
            return "Approval needed: the assistant wants to run this command:"
        if self.outside:
            return "Approval needed: the assistant wants to write outside the workspace:"
        return "Approval needed: the assistant wants to call this tool with these arguments:"

    @property
    def always_label(self) -> str:
        if self.command:
            return "Always allow this command"
        return "Always allow this exact call"


def _args(raw: str) -> dict[str, Any] | None:
    """The arguments object, or None when ``raw`` is not one (the tool will refuse it)."""
    try:
        return parse_arguments(raw)
    except BadArguments:
        return None  # the call fails with that error before anything asks about it


def _outside_workspace(raw: Any, workspace: Path) -> bool:
    if not isinstance(raw, str) or not raw.strip():
        return False
    path = Path(raw).expanduser()
    if not path.is_absolute():
        path = workspace / path
    real, home = Path(os.path.realpath(path)), Path(os.path.realpath(workspace))
    return not (real == home or real.is_relative_to(home))


def canonical(args: dict[str, Any]) -> str:
    """One spelling per arguments object: sorted keys, no spaces, ASCII (stored as is)."""
    return json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def describe_call(name: str, raw_arguments: str, effects: Effects | None) -> Question:
    """The question about one call, whatever the policy says about asking it. A tool that
    runs a command (``effects.command``) is asked about the command alone, remembered as
    ``<tool>:<command>`` (``exec:ls -l``); any other about its name and all its arguments."""
    args = _args(raw_arguments)
    if args is None:  # shown as sent; the tool refuses it anyway
        return Question(name, f"{name}\n{raw_arguments}", f"call:{name}:raw:{raw_arguments}")
    if effects is not None and effects.command is not None:
        command = str(args.get(effects.command, "")).strip()
        return Question(name, command, f"{name}:{command}", command=True)
    try:
        shown = json.dumps(args, ensure_ascii=False, indent=2)
        key = f"call:{name}:{canonical(args)}"
    except (RecursionError, ValueError):
        return Question(name, f"{name}\n{raw_arguments}", f"call:{name}:raw:{raw_arguments}")
    return Question(name, f"{name}\n{shown}", key)


def legacy_keys(allowed_here: list[str]) -> list[str]:
    """Entries of ``approved_calls`` written before "always" remembered the arguments:
    ``tool:<name>`` allowed every later call of that tool. They allow nothing any more."""
    return [k for k in allowed_here if k.startswith("tool:")]


def question_for(
    policy: ApprovalPolicy,
    effects: Effects | None,
    name: str,
    raw_arguments: str,
    allowed_here: list[str],
) -> Question | None:
    """The question to ask before running this call, or None when it may run unasked.

    ``effects``: what the tool declared; None when no tool of that name is registered (the
    call runs nothing: the registry answers it with an error). ``allowed_here``: what
    "Always allow" recorded for this chat (keys of earlier questions).
    """
    if policy.mode == "off" or effects is None:
        return None
    question = describe_call(name, raw_arguments, effects)
    if question.key in allowed_here:
        return None
    if policy.mode == "always":
        return question
    if effects.command is not None:
        return None if command_allowed(question.subject, policy.exec_allow) else question
    if not effects.declared:
        vouched = effects.external and matches_any(name, policy.safe_mcp)
        return None if vouched else question
    if effects.processes:  # a process whose command no allow pattern can be matched against
        return question
    if effects.writes and not policy.restrict_to_workspace:
        # Restricted, the path policy refuses a path outside; unrestricted, a person decides.
        args = _args(raw_arguments) or {}
        if any(_outside_workspace(args.get(arg), policy.workspace) for arg in effects.writes):
            return replace(question, outside=True)
    return None


def offered_by_default(
    name: str, effects: Effects, safe_mcp: list[str] | tuple[str, ...], *, scoped_files: bool
) -> bool:
    """Whether a chat that may not see everything gets this tool when its config names none.

    A group gets the tools that touch no workspace file (a group must not read what the
    owner's private chats left there); a non-admin's private chat (``scoped_files``) also the
    tools whose paths keep to its privacy scope. Never a tool that starts processes (a command
    reads whatever the workspace holds), nor one whose effects nobody declared, unless the
    owner vouched for it (``tools.safeMcpTools``).
    """
    if not effects.declared:
        return effects.external and matches_any(name, safe_mcp)
    if not effects.touches_workspace:
        return True
    return scoped_files and effects.scoped and not effects.processes


def limited_tool_names(
    tools: Mapping[str, Effects],
    configured: list[str] | None,
    safe_mcp: list[str] | tuple[str, ...],
    *,
    scoped_files: bool,
) -> set[str]:
    """The tools offered in a chat that may not see everything (a group, a non-admin's private
    chat): ``configured`` (globs: ``groupTools``/``dmTools``) when set, else those
    :func:`offered_by_default`."""
    if configured is not None:
        return {n for n in tools if matches_any(n, configured)}
    return {
        n
        for n, effects in tools.items()
        if offered_by_default(n, effects, safe_mcp, scoped_files=scoped_files)
    }


def group_tool_names(
    tools: Mapping[str, Effects],
    group_tools: list[str] | None,
    safe_mcp: list[str] | tuple[str, ...],
) -> set[str]:
    """The tools offered in a group chat: ``group_tools`` (globs) when set, else the tools that
    touch no workspace file and the MCP tools listed as safe."""
    return limited_tool_names(tools, group_tools, safe_mcp, scoped_files=False)


# -- records in the checkpoint -----------------------------------------------------------------


def new_record(
    call_id: str,
    tool: str,
    question: Question,
    asked_by: str,
    is_group: bool,
    timeout_seconds: float,
    now: float | None = None,
    owner_chats: list[tuple[str, str]] | None = None,
) -> dict[str, Any]:
    """The approval record kept in the checkpoint. ``owner_chats``: an unattended turn's
    question (a scheduled job, the heartbeat), asked in those admins' private chats; any
    admin's press answers it."""
    now = time.time() if now is None else now
    record: dict[str, Any] = {
        "id": new_approval_id(),
        "call_id": call_id,
        "tool": tool,
        "summary": question.summary,
        "key": question.key,
        "asked_by": asked_by,
        "is_group": is_group,
        "asked_at": now,
        "deadline": now + timeout_seconds,
        "state": WAITING,
    }
    if owner_chats is not None:
        record["owner"] = True
        record["asked_in"] = [list(chat) for chat in owner_chats]
    return record


def may_answer(record: dict[str, Any], sender_id: str, is_admin: bool) -> bool:
    """The person who asked may answer; in a group an admin may too. An unattended turn's
    question (``owner``) has nobody who asked: an admin answers it."""
    if record.get("owner"):
        return is_admin
    if sender_id == record.get("asked_by"):
        return True
    return bool(record.get("is_group")) and is_admin


def denied_result(outcome: str, timeout_minutes: float) -> str:
    """The tool result the model gets for a call that was not allowed."""
    if outcome == "timeout":
        return (
            f"Error: not run: nobody approved this call within {timeout_minutes:g} minutes "
            "(tools.approvalTimeoutMinutes), so it counts as denied. Do not retry it unasked; "
            "tell the user what you wanted to do."
        )
    return (
        "Error: not run: the user denied this call. Do not retry it; ask the user what to do "
        "instead, or continue without it."
    )


def answer_hint(approval_id: str, timeout_minutes: float) -> str:
    """memobot's words after the quoted text: the timeout and the typed answers."""
    return (
        f"Allow it? (no answer within {timeout_minutes:g} min means no)\n"
        f"(or reply /allow {approval_id}, /always {approval_id} or /deny {approval_id})"
    )


def too_long_result(size: int) -> str:
    """The tool result of a call too long for a person to read in an approval question."""
    return (
        f"Error: not run: this call is {size:,} characters long, more than a person can review "
        f"in an approval question ({MAX_REVIEW_CHARS:,}). Do the work in smaller steps."
    )


def no_buttons_result() -> str:
    """The tool result of a call needing approval in a chat where nobody can give it (a
    program on the API whose key may not run such calls unasked)."""
    return (
        "Error: not run: this call needs a person's approval, and this conversation is a "
        "program's on the API, which cannot give one (its key does not allow such calls "
        "unasked: api.keys[].approvals). Do not retry it; say in your answer what you wanted "
        "to do."
    )


def no_owner_result() -> str:
    """The tool result of an unattended turn's call when no admin can be asked."""
    return (
        "Error: not run: this call needs an admin's approval, and no admin's private chat is "
        "reachable to ask in (channels.<name>.admins of a running channel). Do not retry it; "
        "report what you wanted to do in your answer."
    )


def asked_call(
    checkpoint: Mapping[str, Any] | None, record: Mapping[str, Any]
) -> tuple[str, str] | None:
    """(tool, raw arguments) of the call ``record`` asks about, from the checkpoint's
    messages; None when the checkpoint does not hold it."""
    for message in reversed((checkpoint or {}).get("messages") or []):
        for tool_call in message.get("tool_calls") or []:
            if tool_call.get("id") == record.get("call_id"):
                function = tool_call.get("function") or {}
                return str(function.get("name", "")), str(function.get("arguments", ""))
    return None
