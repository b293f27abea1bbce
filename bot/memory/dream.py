"""Dream: distil the history archive into the long-term memory files.

A run reads the entries after ``memory/.dream_cursor`` and lets the model edit USER.md,
SOUL.md, memory/MEMORY.md and skills/ through targeted tools (add, replace, remove one entry;
write one skill). They are ordinary tools (:class:`bot.tools.base.Tool`) with declared effects,
run through a :class:`~bot.tools.base.ToolRegistry` (the same argument checks and error
results as a turn's) and the gate's path policy. Edits collect in memory and land only when the
run completes: files are replaced atomically without following a link
(:mod:`bot.workspace_files`), the change is committed to the workspace's git repository
(removals named with their reasons), the skills written are recorded in the provenance record
as the owner's, and only then does the cursor move. A run that would remove more than a third
of a file's entries is refused whole.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import functools
import logging
import re
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from bot import workspace_files
from bot.config import Config, MemoryConfig
from bot.cron.heartbeat import owner_chat, private_chat
from bot.gate.approval import WAITING
from bot.gate.effects import Effects
from bot.llm import LLMError, LLMProvider
from bot.memory.entries import EntryError, add_entry, count_entries, remove_entry, replace_entry
from bot.memory.files import MEMORY_FILES
from bot.memory.history import HistoryArchive, HistoryEntry
from bot.memory.people import Speaker, shown_part, with_header
from bot.memory.review import (
    ALLOW,
    Change,
    Proposal,
    ProposalStore,
    as_proposed,
    new_proposal,
)
from bot.privacy import owner_scope
from bot.provenance import Provenance, Writer, watched_stamps
from bot.session import SUFFIX, key_to_filename
from bot.spend.budget import Budget, BudgetSpent
from bot.spend.record import DREAM
from bot.tokens import estimate_text_tokens
from bot.tools.base import Tool, ToolContext, ToolError, ToolRegistry
from bot.tools.paths import path_policy
from bot.wording import counted

if TYPE_CHECKING:
    from bot.gate import Gate

log = logging.getLogger(__name__)

BUDGETED = ("USER.md", "memory/MEMORY.md")
MAX_REMOVED_SHARE = 1 / 3
_SKILL_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,47}$")
# "paused": a budget is spent (bot.spend.budget); not a failure, nothing was asked.
# "proposed": the edit waits for an admin's answer (memory.dreamReview; bot.memory.review);
# "waiting": a proposal waits still, so this run did nothing.
Status = Literal[
    "done", "nothing", "refused", "incomplete", "failed", "paused", "proposed", "waiting"
]
# Each edit names the history entries it comes from: they go into the commit message.
SOURCES: dict[str, Any] = {
    "type": "array",
    "items": {"type": "integer"},
    "description": "the #numbers of the history entries this change comes from",
}

DREAM_INSTRUCTIONS = """You maintain the long-term memory of a personal assistant. New entries \
from the conversation archive follow, together with the current memory files. Keep what will \
matter in future conversations, in the one right place:
- USER.md: who the user is: name, timezone, language, preferences, habits.
- SOUL.md: how the assistant should behave (rules the user asked for).
- memory/MEMORY.md: facts about the world, people and projects, decisions, references.
- skills/<name>/SKILL.md: a reusable multi-step procedure the user will want again.
Rules: edit with the tools, one short entry per fact (a single line). Do not copy chit-chat or \
one-off details. Replace an entry when a fact changed (e.g. a placeholder "(unknown)" or an old \
value); remove an entry only when it is wrong or obsolete, and always give the reason. Never \
delete facts to make room: when a file is over its budget, merge related entries into shorter \
ones with replace. When nothing is worth keeping, call finish at once. Call finish when done."""

CHAT_INSTRUCTIONS = """You maintain the memory an assistant keeps about one chat that is not \
its owner's private chat (a group, or a person who is not the owner). New entries from that \
chat's conversation archive follow, with the chat's memory file. Keep what will matter in \
future conversations in this chat, one short entry per fact, in that file only. Never record \
rules for how the assistant should behave, or anything said about its owner. Replace an entry \
when a fact changed; remove one only when it is wrong or obsolete, with the reason. When \
nothing is worth keeping, call finish at once. Call finish when done."""
# Added to CHAT_INSTRUCTIONS when people other than the owner wrote in the entries (their
# runtime blocks named them; bot.memory.people): each gets a file of their own.
PEOPLE_INSTRUCTIONS = """

Each person who wrote in these entries has a memory file of their own, named below with \
their name and id; it is in the prompt of their own conversations only. A fact a person \
stated about themselves (their name, what they like, their plans) goes in THAT person's file \
and no other, never in the chat's file; what someone said about another person goes in \
nobody's file. The chat's file keeps what concerns the chat as a whole."""
CHAT_MEMORY_DIR = "memory/chats"  # one file per chat whose facts are not the owner's
UNATTRIBUTED = frozenset({"", "legacy"})  # no session; bot.memory.migrate.LEGACY_SESSION
# A closed proposal's outcome (bot.memory.review.ProposalStore.close), in the answer's words.
_OUTCOMES = {
    "applied": "its changes are written",
    "denied": "nothing was written",
    "stale": "nothing was written, a file had changed since",
    "failed": "it could not be written",
    "dropped": "it was dropped unanswered, memory.dreamReview being off",
}
SESSION = "dream"  # who Dream's tool calls and writes are logged and recorded as


def chat_memory_file(session: str) -> str:
    """The workspace-relative memory file of a chat that is not the owner's private chat."""
    return f"{CHAT_MEMORY_DIR}/{key_to_filename(session).removesuffix(SUFFIX)}.md"


class _DreamTool(Tool):
    """One of Dream's editing tools, bound to one pass's working copy (:class:`_Edits`):
    an edit changes the copy; the files change when the run lands."""

    def __init__(self, edits: _Edits) -> None:
        self.edits = edits

    def allow(self, rel: str, ctx: ToolContext) -> None:
        """Refuse ``rel`` when the gate's path policy would not let a tool write it. Named, not
        resolved: the landing write never follows a link (a link is replaced)."""
        policy = path_policy(ctx)
        if not policy.allows(policy.workspace / rel, write=True):
            raise ToolError(f"{rel} may not be written (the gate's path policy refuses it)")


class _EntryTool(_DreamTool):
    """An edit of one entry of one of the pass's files (its ``file`` enum: those files)."""

    parameters: ClassVar[dict[str, Any]]
    effects: ClassVar[Effects] = Effects(reads=("file",), writes=("file",))
    fields: ClassVar[tuple[str, ...]]  # string arguments besides ``file``
    required: ClassVar[tuple[str, ...]]

    def __init__(self, edits: _Edits) -> None:
        super().__init__(edits)
        properties: dict[str, Any] = {"file": {"type": "string", "enum": list(edits.files)}}
        properties.update({name: {"type": "string"} for name in self.fields})
        properties["sources"] = SOURCES
        self.parameters = {  # type: ignore[misc]  # per pass: its own files
            "type": "object",
            "properties": properties,
            "required": ["file", *self.required],
        }


class AddEntryTool(_EntryTool):
    name: ClassVar[str] = "add_entry"
    description: ClassVar[str] = (
        "Add one bullet entry to a memory file, optionally under a '## section' heading."
    )
    fields: ClassVar[tuple[str, ...]] = ("entry", "section")
    required: ClassVar[tuple[str, ...]] = ("entry",)

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        self.allow(args["file"], ctx)
        return self.edits.add(args["file"], args["entry"], args.get("section"), args.get("sources"))


class ReplaceEntryTool(_EntryTool):
    name: ClassVar[str] = "replace_entry"
    description: ClassVar[str] = "Replace the one entry containing `old` with `new`."
    fields: ClassVar[tuple[str, ...]] = ("old", "new", "reason")
    required: ClassVar[tuple[str, ...]] = fields

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        self.allow(args["file"], ctx)
        return self.edits.replace(
            args["file"], args["old"], args["new"], args["reason"], args.get("sources")
        )


class RemoveEntryTool(_EntryTool):
    name: ClassVar[str] = "remove_entry"
    description: ClassVar[str] = "Remove the one entry containing `entry`; say why."
    fields: ClassVar[tuple[str, ...]] = ("entry", "reason")
    required: ClassVar[tuple[str, ...]] = fields

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        self.allow(args["file"], ctx)
        return self.edits.remove(args["file"], args["entry"], args["reason"], args.get("sources"))


class WriteSkillTool(_DreamTool):
    name: ClassVar[str] = "write_skill"
    description: ClassVar[str] = "Create or update skills/<name>/SKILL.md with a procedure."
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "description": "lowercase-with-dashes"},
            "description": {"type": "string", "description": "one line: when to use it"},
            "instructions": {"type": "string", "description": "Markdown steps"},
            "sources": SOURCES,
        },
        "required": ["name", "description", "instructions"],
    }
    # Writes skills/<name>/SKILL.md, a file that runs later: recorded in the provenance.
    effects: ClassVar[Effects] = Effects(side_effects=True)

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        name = str(args["name"]).strip().lower()
        if not _SKILL_NAME.match(name):
            raise ToolError(
                "a skill name is lowercase letters, digits and dashes, e.g. 'weekly-report'"
            )
        self.allow(skill_file(name), ctx)
        return self.edits.skill(
            name, str(args["description"]), str(args["instructions"]), args.get("sources")
        )


class FinishTool(_DreamTool):
    name: ClassVar[str] = "finish"
    description: ClassVar[str] = "End the run with a one-line summary of what changed."
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"summary": {"type": "string"}},
        "required": ["summary"],
    }
    effects: ClassVar[Effects] = Effects()

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        self.edits.finished = True
        return "Done."


def dream_registry(edits: _Edits) -> ToolRegistry:
    """The tools of one pass: entries of its files only; write_skill when it may write
    skills (the owner's pass)."""
    registry = ToolRegistry()
    kinds: list[type[_DreamTool]] = [AddEntryTool, ReplaceEntryTool, RemoveEntryTool]
    if edits.skills:
        kinds.append(WriteSkillTool)
    for kind in [*kinds, FinishTool]:
        registry.register(kind(edits))
    return registry


def skill_file(name: str) -> str:
    return f"skills/{name}/SKILL.md"


@dataclass(slots=True)
class DreamResult:
    status: Status
    entries: int = 0
    cursor: int | None = None
    commit: str | None = None
    added: list[str] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    skills: list[str] = field(default_factory=list)
    detail: str = ""
    proposal: str | None = None  # the id of the proposal it made, or waits on
    cited: dict[str, str] = field(default_factory=dict)  # skill -> its history entries

    def summary(self) -> dict[str, list[str]]:
        """The changes, one line each with the history entries it comes from."""
        skills = [f"{rel}{self.cited.get(rel, '')}" for rel in dict.fromkeys(self.skills)]
        return {
            "added": list(self.added),
            "replaced": list(self.replaced),
            "removed": list(self.removed),
            "skills": skills,
        }

    def describe(self) -> str:
        if self.status == "nothing":
            return "Dream: no new history to digest."
        if self.status == "proposed":
            changes = len(self.added) + len(self.replaced) + len(self.removed) + len(self.skills)
            return (
                f"Dream proposes {counted(changes, 'change')} from "
                f"{counted(self.entries, 'history entry', 'history entries')} "
                f"(approval {self.proposal}): nothing is written until an admin allows it."
            )
        if self.status == "waiting":
            return f"Dream waits: {self.detail}"
        if self.status != "done":
            return f"Dream {self.status}: {self.detail}"
        changes = len(self.added) + len(self.replaced) + len(self.removed) + len(self.skills)
        return (
            f"Dream digested {counted(self.entries, 'history entry', 'history entries')}: "
            f"{len(self.added)} added, "
            f"{len(self.replaced)} replaced, {len(self.removed)} removed, "
            f"{counted(len(self.skills), 'skill')} written"
            + (f" (commit {self.commit[:8]})" if self.commit else "")
            + ("." if changes else "; nothing worth keeping.")
        )


class _Edits:
    """The run's working copy of the memory files and a record of every change."""

    def __init__(
        self,
        workspace: Path,
        files: tuple[str, ...] = MEMORY_FILES,
        skills: bool = True,
        writer_of: Callable[[str], Writer | None] | None = None,
    ) -> None:
        self.workspace = workspace
        self.skills = skills
        self.original: dict[str, str] = {}
        # Who wrote each watched file's ``original``, taken as it is read: the version a
        # failed run puts back is that writer's, whoever changed the file meanwhile.
        self.writer_of = writer_of
        self.prior: dict[str, Writer | None] = {}
        self.files: dict[str, str] = {}
        for name in files:
            self.original[name] = _read(workspace, name)
        self.files = dict(self.original)
        self.existed = {name for name in files if workspace_files.is_file(workspace, name)}
        self.result = DreamResult("done")
        self.removed_per_file: dict[str, int] = {}
        self.finished = False  # the model called finish
        self.cursors: tuple[int, ...] = ()  # the history entries this pass considers
        self.people: dict[str, Speaker] = {}  # the person files among ``files``: whose

    def cite(self, sources: Any) -> str:
        """`` (history #5, #7)``: the entries a change comes from, as the model named them
        (each one of this pass's entries, else a ToolError for the model to correct); when
        it named none, the pass's whole range, said to be unnamed."""
        named: list[int] = []
        for item in sources if isinstance(sources, list) else []:
            text = str(item).strip().lstrip("#")
            if not text.isdigit() or (self.cursors and int(text) not in self.cursors):
                raise ToolError(
                    f"sources: {item!r} is not one of the new history entries "
                    f"(#{self.cursors[0]}..#{self.cursors[-1]})"
                    if self.cursors
                    else f"sources: {item!r} is not a history entry's number"
                )
            if int(text) not in named:
                named.append(int(text))
        if named:
            return " (history " + ", ".join(f"#{c}" for c in sorted(named)) + ")"
        if not self.cursors:
            return ""
        return f" (history #{self.cursors[0]}..#{self.cursors[-1]}, not named)"

    def add(self, file: str, entry: str, section: str | None, sources: Any = None) -> str:
        cited = self.cite(sources)
        section = _one_line(section) if section else None  # a heading is one line
        if file in self.people:  # a person's file starts with the header naming them
            self.files[file] = with_header(self.files[file], self.people[file])
        with _entry_errors():
            self.files[file], changed = add_entry(self.files[file], entry, section)
        if not changed:
            return "Already there; nothing changed."
        self.result.added.append(f"{file}: {entry}{cited}")
        return "Added."

    def replace(self, file: str, old: str, new: str, reason: str, sources: Any = None) -> str:
        cited = self.cite(sources)
        reason = _one_line(reason)
        with _entry_errors():
            self.files[file], found = replace_entry(self.files[file], old, new)
        self.result.replaced.append(f'{file}: "{found}" -> "{new}" ({reason}){cited}')
        return "Replaced."

    def remove(self, file: str, entry: str, reason: str, sources: Any = None) -> str:
        cited = self.cite(sources)
        reason = _one_line(reason)
        with _entry_errors():
            self.files[file], old = remove_entry(self.files[file], entry)
        self.removed_per_file[file] = self.removed_per_file.get(file, 0) + 1
        self.result.removed.append(f'{file}: "{old}" (reason: {reason}){cited}')
        return "Removed."

    def skill(self, name: str, description: str, instructions: str, sources: Any = None) -> str:
        cited = self.cite(sources)
        description = " ".join(description.split()).replace('"', "'")
        body = instructions.strip()
        rel = skill_file(name)
        self.files[rel] = f'---\nname: {name}\ndescription: "{description}"\n---\n\n{body}\n'
        if rel not in self.original:
            if self.writer_of is not None:
                self.prior[rel] = self.writer_of(rel)
            if workspace_files.is_file(self.workspace, rel):
                self.existed.add(rel)
        self.original.setdefault(rel, _read(self.workspace, rel))
        self.result.skills.append(rel)
        self.result.cited[rel] = cited
        return f"Wrote {rel}."

    def refusal(self) -> str | None:
        """Why this run must not land, if it removes too much of any file."""
        for file, removed in self.removed_per_file.items():
            total = count_entries(self.original[file])
            if total and removed > total * MAX_REMOVED_SHARE:
                return (
                    f"it would remove {removed} of {counted(total, 'entry', 'entries')} from "
                    f"{file} (more than a third); nothing was changed"
                )
        return None

    def changed(self) -> dict[str, str]:
        return {k: v for k, v in self.files.items() if v != self.original.get(k)}


@contextlib.contextmanager
def _entry_errors() -> Iterator[None]:
    """An entry that is not there (or ambiguous) is the model's error to correct."""
    try:
        yield
    except EntryError as exc:
        raise ToolError(str(exc)) from None


def _read(workspace: Path, rel: str) -> str:
    """A memory file's text; "" when absent, a folder or a link (never followed)."""
    try:
        return workspace_files.read_text(workspace, rel)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return ""


def _write(workspace: Path, rel: str, text: str) -> None:
    workspace_files.write_atomic(workspace, rel, text, make_parents=True)


def _restore(workspace: Path, change: Change) -> None:
    """Put a changed file back as it was read (absent: removed)."""
    if change.existed:
        _write(workspace, change.rel, change.before)
    else:
        workspace_files.unlink(workspace, change.rel)


def read_dream_cursor(workspace: Path) -> int:
    try:
        return int(workspace_files.read_text(workspace, "memory/.dream_cursor").strip() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def write_dream_cursor(workspace: Path, cursor: int) -> None:
    _write(workspace, "memory/.dream_cursor", f"{cursor}\n")


def budget_lines(workspace: Path, max_chars: int) -> list[str]:
    """``MEMORY.md 1,474/4,000 chars`` for each budgeted file (shown by /status and status)."""
    out = []
    for name in BUDGETED:
        size = len(_read(workspace, name))
        over = " (over budget: Dream will condense it)" if size > max_chars else ""
        out.append(f"{Path(name).name} {size:,}/{max_chars:,} chars{over}")
    return out


def _one_line(text: str) -> str:
    """``text`` with every run of white space, line breaks included, as one space."""
    return " ".join(str(text).split())


def commit_message(
    summary: dict[str, list[str]], entries: int, first: int, last: int, reviewed: str = ""
) -> str:
    """Dream's commit message: the range digested, then every change with the history
    entries it comes from (``memobot memory log`` shows them); ``reviewed``: who allowed it."""
    lines = [f"dream: digest history {first}..{last} ({counted(entries, 'entry', 'entries')})", ""]
    for key, title in (
        ("added", "Added"),
        ("replaced", "Replaced"),
        ("removed", "Removed"),
        ("skills", "Skills written"),
    ):
        items = summary.get(key) or []
        if items:
            lines.append(f"{title}:")
            # One line each: the model's words (a reason with a line break made a line of
            # its own, "Reviewed: ..." among them, which `memobot memory log` believes).
            lines += [f"- {_one_line(i)}" for i in items]
    if reviewed:
        lines += ["", f"Reviewed: {reviewed}"]
    return "\n".join(lines).rstrip() + "\n"


def result_of(proposal: Proposal) -> DreamResult:
    """The result a proposal lands as (its changes, as the run that made it found them)."""
    summary = proposal.summary
    skills, cited = [], {}
    for item in summary.get("skills") or []:
        rel, sep, rest = item.partition(" (history")
        skills.append(rel)
        cited[rel] = f"{sep}{rest}" if sep else ""
    return DreamResult(
        "done",
        proposal.entries,
        proposal.last,
        added=list(summary.get("added") or []),
        replaced=list(summary.get("replaced") or []),
        removed=list(summary.get("removed") or []),
        skills=skills,
        cited=cited,
    )


class Dream:
    def __init__(
        self,
        cfg: MemoryConfig,
        workspace: Path,
        provider: LLMProvider,
        archive: HistoryArchive,
        owner_chat: Callable[[str], bool] = private_chat,
        *,
        state_dir: Path,
        gate: Gate | None = None,
    ) -> None:
        """``owner_chat``: whether a session is the owner's own chat, whose facts may go to
        USER.md, SOUL.md and MEMORY.md (:func:`bot.cron.heartbeat.owner_chat`; by default any
        private chat). ``state_dir``: agent.stateDir, where the memory history is kept.
        ``gate``: the daemon's, whose path policy the edits keep to (without one, e.g.
        ``memobot dream``: the workspace's policy, as for a turn without a gate)."""
        self.cfg = cfg
        self.workspace = workspace
        self.state_dir = state_dir
        self.provider = provider
        self.archive = archive
        self.owner_chat = owner_chat
        self.gate = gate
        self.provenance = Provenance(state_dir, workspace)
        # memory.dreamReview: edits wait in the state folder for an admin's answer; the
        # approval desk asks (``on_proposal``, set where the desk is built).
        self.proposals = ProposalStore(state_dir)
        self.on_proposal: Callable[[Proposal], Awaitable[None]] | None = None
        self._lock = asyncio.Lock()

    @property
    def running(self) -> bool:
        return self._lock.locked()

    async def run(self) -> DreamResult:
        """One complete run; concurrent calls wait for each other."""
        async with self._lock:
            return await self._run()

    async def _run(self) -> DreamResult:
        waiting = await self._open_proposal()
        if waiting is not None:
            return waiting
        cursor = read_dream_cursor(self.workspace)
        entries = await asyncio.to_thread(self.archive.entries, cursor, self.cfg.dream.max_entries)
        if not entries:
            return DreamResult("nothing")
        # Before the model is asked anything: edits that cannot be committed must not land.
        # The caller reports the result (one line for `memobot dream`, a log line when scheduled).
        problem = await asyncio.to_thread(_repo_problem, self.workspace, self.state_dir)
        if problem:
            return DreamResult("failed", len(entries), detail=problem)
        passes = self._passes(entries)
        # One change per file, however many passes edit it (a person who wrote in two
        # chats): a later pass edits the earlier one's version, so no pass's edit is lost
        # to another's write, and its removals count against the file as it was read.
        working: dict[str, Change] = {}
        removed: dict[str, int] = {}
        result = DreamResult("done")
        for edits, subset, instructions in passes:
            edits.cursors = tuple(e.cursor for e in subset)
            for rel in edits.files:
                if rel in working:
                    edits.files[rel] = working[rel].after
                    edits.removed_per_file[rel] = removed.get(rel, 0)
            try:
                complete = await self._converse(edits, subset, instructions)
            except BudgetSpent as exc:
                log.info("dream paused: %s", exc)
                return DreamResult("paused", len(entries), detail=exc.user_message)
            except LLMError as exc:
                log.error("dream failed: %s", exc)
                return DreamResult("failed", len(entries), detail=str(exc))
            if not complete:
                return DreamResult("incomplete", len(entries), detail=complete_reason(self.cfg))
            refusal = edits.refusal()
            if refusal:
                removed = "; ".join(edits.result.removed)
                log.error("dream refused: %s; removals: %s", refusal, removed)
                return DreamResult("refused", len(entries), detail=refusal)
            # Who shaped each file Dream read, for a run taken back: a guest's skill put back
            # stays the guest's, not a file of no record (which reads as the owner's own
            # edit), also when the owner changed it meanwhile.
            for rel, text in edits.changed().items():
                if rel in working:
                    working[rel] = dataclasses.replace(working[rel], after=text)
                    continue
                existed = rel in edits.existed
                before = edits.original.get(rel, "")
                working[rel] = Change(rel, before, existed, text, edits.prior.get(rel))
            removed.update(edits.removed_per_file)
            for name in ("added", "replaced", "removed", "skills"):
                getattr(result, name).extend(getattr(edits.result, name))
            result.cited.update(edits.result.cited)
        changes = [c for c in working.values() if c.after != c.before]
        result.entries = len(entries)
        result.cursor = entries[-1].cursor
        first, last = entries[0].cursor, entries[-1].cursor
        if changes and self.cfg.dream_review:
            return await self._propose(changes, result, first, last)
        return await self._land(changes, result, first, last)

    async def _land(
        self,
        changes: list[Change],
        result: DreamResult,
        first: int,
        last: int,
        reviewed: str = "",
    ) -> DreamResult:
        """Write ``changes``, record the skills written as the owner's, commit, then move the
        cursor to ``last``. A commit that fails takes the writes back (cursor unmoved)."""
        from bot.memory.versioning import MemoryRepoError

        before = await asyncio.to_thread(watched_stamps, self.workspace)
        for change in changes:
            await asyncio.to_thread(_write, self.workspace, change.rel, change.after)
        if result.skills:
            # Written from the owner's own chats (other chats' passes write no skill): the
            # owner's, as an admin's private turn's would be.
            # Only its own skills: a watched file someone else changed meanwhile keeps the
            # record of whoever wrote it.
            ours = set(result.skills)
            after = await asyncio.to_thread(watched_stamps, self.workspace)
            mine_before = {rel: st for rel, st in before.items() if rel in ours}
            mine_after = {rel: st for rel, st in after.items() if rel in ours}
            await asyncio.to_thread(self.provenance.record, mine_before, mine_after, SESSION, True)
        if changes:
            try:
                message = commit_message(result.summary(), result.entries, first, last, reviewed)
                result.commit = await _commit(self.workspace, self.state_dir, message)
            except MemoryRepoError as exc:
                # The repository changed under us since the check: take the edits back, so
                # the next run does them once, not on top of themselves.
                for change in changes:
                    await asyncio.to_thread(_restore, self.workspace, change)
                    await asyncio.to_thread(self.provenance.carry, change.rel, change.prior)
                log.error("dream: commit failed, edits taken back: %s", exc)
                return DreamResult("failed", result.entries, detail=str(exc))
        # Last: the cursor. A crash before this line re-digests the same entries next time,
        # and adding an entry that is already there changes nothing.
        await self._advance(last)
        log.info("dream: %s", result.describe())
        await self._compact(last)
        return result

    async def _advance(self, last: int) -> None:
        """Move the cursor to ``last`` (never back)."""
        if read_dream_cursor(self.workspace) < last:
            await asyncio.to_thread(write_dream_cursor, self.workspace, last)

    async def _compact(self, last: int) -> None:
        try:
            moved = await self.archive.compact(last, self.cfg.history_keep_days)
            if moved:
                log.info("history: moved %d digested entries to monthly archive files", moved)
        except OSError as exc:
            log.warning("history compaction skipped: %s", exc)

    # -- review (memory.dreamReview; bot.memory.review) ------------------------------------

    async def _propose(
        self, changes: list[Change], result: DreamResult, first: int, last: int
    ) -> DreamResult:
        """Store the edit as a proposal for an admin (nothing written, the cursor unmoved)
        and ask about it."""
        proposal = new_proposal(first, last, result.entries, changes, result.summary())
        stored = await asyncio.to_thread(self.proposals.propose, proposal)
        if stored is None:  # a `memobot dream` beside the gateway proposed first
            return await self._open_proposal() or DreamResult("nothing")
        log.info(
            "dream: proposal %s: %s in %s from history %d..%d, waiting for an admin's answer",
            proposal.id,
            counted(sum(map(len, result.summary().values())), "change"),
            ", ".join(proposal.files),
            first,
            last,
        )
        if self.on_proposal is not None:
            try:
                await self.on_proposal(proposal)
            except Exception:  # stored: the panel and /allow still answer it
                log.exception("dream: asking about proposal %s failed", proposal.id)
        result.status = "proposed"
        result.proposal = proposal.id
        result.cursor = None
        return result

    async def _open_proposal(self) -> DreamResult | None:
        """A "waiting" result while a proposal waits for its answer; one answered but not yet
        landed (a crash between) is finished first. None: no proposal is open."""
        proposal = await asyncio.to_thread(self.proposals.open)
        if proposal is None:
            return None
        if proposal.state != WAITING:
            await self._settle(proposal)
            return None
        if not self.cfg.dream_review:
            # Review was turned off while it waited: nobody is to be asked any more, so it is
            # not waited on; nothing of it is written and this run redoes its entries.
            await asyncio.to_thread(
                self.proposals.close, proposal, "dropped", "memory.dreamReview is off"
            )
            log.warning(
                "dream: proposal %s dropped unanswered (memory.dreamReview is off): nothing "
                "of it written; history %d..%d is gone over again",
                proposal.id,
                proposal.first,
                proposal.last,
            )
            return None
        return DreamResult(
            "waiting",
            proposal=proposal.id,
            detail=(
                f"its proposal {proposal.id} (history #{proposal.first}..#{proposal.last}) "
                f"waits for an admin's answer (/allow {proposal.id} or /deny {proposal.id}); "
                "no new history is digested until then"
            ),
        )

    async def settle(self, proposal: Proposal) -> str:
        """Act on the answer recorded in ``proposal`` (allow: land it; deny: skip its entries);
        the reply for whoever answered."""
        async with self._lock:
            # Re-read under the lock: a run (or a restart's resume) that held it meanwhile may
            # have carried this answer out already, and it is carried out once.
            current = await asyncio.to_thread(self.proposals.open)
            if current is None or current.id != proposal.id or current.state != proposal.state:
                done = await asyncio.to_thread(self.proposals.closed, proposal.id)
                outcome = _OUTCOMES.get(str((done or {}).get("outcome")), "it is closed")
                return f"Dream's proposal {proposal.id} was carried out already: {outcome}."
            return await self._settle(current)

    async def _settle(self, proposal: Proposal) -> str:
        pid, first, last = proposal.id, proposal.first, proposal.last
        if proposal.state != ALLOW:
            await self._advance(last)
            await asyncio.to_thread(self.proposals.close, proposal, "denied")
            log.info(
                "dream: proposal %s denied by %s: nothing written, history %d..%d skipped "
                "(cursor moved to %d)",
                pid,
                proposal.by,
                first,
                last,
                last,
            )
            await self._compact(last)
            return (
                f"Denied: nothing was written. Dream moves on past history entries "
                f"#{first}..#{last}."
            )
        moved = await asyncio.to_thread(self._changed_since, proposal)
        if moved:
            await asyncio.to_thread(self.proposals.close, proposal, "stale", ", ".join(moved))
            log.warning(
                "dream: proposal %s allowed by %s, but %s changed since it was made: nothing "
                "written; the next run goes over history %d..%d again",
                pid,
                proposal.by,
                ", ".join(moved),
                first,
                last,
            )
            return (
                f"Not written: {', '.join(moved)} changed since Dream proposed this, and a "
                "newer edit is never overwritten. The next Dream run goes over the same "
                f"history entries (#{first}..#{last}) again."
            )
        reviewed = f"allowed by {proposal.by} ({pid})"
        landed = await self._land(
            list(proposal.changes), result_of(proposal), first, last, reviewed
        )
        if landed.status != "done":
            await asyncio.to_thread(self.proposals.close, proposal, "failed", landed.detail)
            return (
                f"Allowed, but it could not be written ({landed.detail}); nothing was "
                "changed. The next Dream run tries these entries again."
            )
        await asyncio.to_thread(self.proposals.close, proposal, "applied", landed.commit or "")
        log.info(
            "dream: proposal %s allowed by %s: written (commit %s)",
            pid,
            proposal.by,
            (landed.commit or "-")[:8],
        )
        commit = f" (commit {landed.commit[:8]})" if landed.commit else ""
        return f"Allowed: Dream's changes are written{commit}."

    def _changed_since(self, proposal: Proposal) -> list[str]:
        """The files of ``proposal`` that are no longer as it found them (blocking reads)."""
        return [
            c.rel
            for c in proposal.changes
            if not as_proposed(
                _read(self.workspace, c.rel), workspace_files.is_file(self.workspace, c.rel), c
            )
        ]

    def _passes(self, entries: list[HistoryEntry]) -> list[tuple[_Edits, list[HistoryEntry], str]]:
        """One pass over the owner's own chats (USER.md, SOUL.md, MEMORY.md, skills), then one
        per other chat (a group, a person who is not the owner) that may edit only that chat's
        memory file and the files of the people its entries name as writers (bot.memory.people):
        what a group said never reaches the files every private prompt carries, and what one
        person said about themselves goes to their own file."""
        own = [e for e in entries if self._owners(e)]
        others: dict[str, list[HistoryEntry]] = {}
        for e in entries:
            if not self._owners(e):
                others.setdefault(e.session, []).append(e)
        own_edits = _Edits(self.workspace, writer_of=self.provenance.writer)
        passes = [(own_edits, own, DREAM_INSTRUCTIONS)] if own else []
        for session, subset in others.items():
            # The people who wrote there (as the entries recorded them) get their own files:
            # the pass may edit theirs and no one else's.
            people = {p.file: p for e in subset for p in e.speakers}
            files = (chat_memory_file(session), *sorted(people))
            edits = _Edits(self.workspace, files, skills=False)
            edits.people = people
            instructions = CHAT_INSTRUCTIONS + (PEOPLE_INSTRUCTIONS if people else "")
            passes.append((edits, subset, instructions))
        return passes

    def _owners(self, entry: HistoryEntry) -> bool:
        # Entries that name no chat come from before chats were told apart (nanobot's
        # history, an imported HISTORY.md): the owner's, as they always were.
        return entry.session in UNATTRIBUTED or self.owner_chat(entry.session)

    async def _converse(
        self, edits: _Edits, entries: list[HistoryEntry], instructions: str = DREAM_INSTRUCTIONS
    ) -> bool:
        registry = dream_registry(edits)
        tools = registry.schemas()
        ctx = ToolContext(
            workspace=self.workspace, session_key=SESSION, gate=self.gate, scope=owner_scope("")
        )
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": instructions},
            {"role": "user", "content": self._brief(edits, entries)},
        ]
        spent = 0
        for _ in range(self.cfg.dream.max_iterations):
            response = await self.provider.chat(
                messages,
                tools,
                session_key=SESSION,
                max_tokens=2048,
                purpose=DREAM,
                model=self.cfg.model or None,
            )
            usage = response.usage or {}
            spent += int(
                usage.get("total_tokens")
                or sum(estimate_text_tokens(str(m.get("content") or "")) for m in messages)
            )
            if not response.tool_calls:
                return True  # the model has nothing more to do
            messages.append(response.assistant_message())
            for call in response.tool_calls:
                text = await registry.execute(call.name, call.arguments, ctx)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": text})
            if edits.finished:
                return True
            if spent > self.cfg.dream.max_tokens:
                log.warning("dream stopped at its token cap (%d tokens)", spent)
                return False
        log.warning("dream stopped at its iteration cap (%d)", self.cfg.dream.max_iterations)
        return False

    def _brief(self, edits: _Edits, entries: list[HistoryEntry]) -> str:
        parts = ["# Current memory files"]
        for name in edits.files:
            text = edits.files[name].strip() or "(empty)"
            budget = ""
            if name in BUDGETED:
                size = len(edits.files[name])
                budget = f" ({size:,}/{self.cfg.max_chars:,} chars"
                budget += ", OVER BUDGET: condense)" if size > self.cfg.max_chars else ")"
            if name in edits.people:
                # The person writes it: budgeted as USER.md is, and shown capped.
                size = len(edits.files[name])
                budget = f" (the file of {edits.people[name].shown}; {size:,}/"
                budget += f"{self.cfg.max_chars:,} chars"
                budget += ", OVER BUDGET: condense)" if size > self.cfg.max_chars else ")"
                text = shown_part(text)
            parts.append(f"## {name}{budget}\n\n{text}")
        if edits.skills:
            found = workspace_files.files_matching(self.workspace, "skills", "SKILL.md")
            skills = sorted(rel.split("/")[1] for rel, _ in found)
            parts.append("## skills\n\n" + (", ".join(skills) or "(none)"))
        parts.append("# New history entries")
        for e in entries:
            who = ""
            if e.speakers:
                who = "; people who wrote: " + ", ".join(p.shown for p in e.speakers)
            parts.append(
                f"[#{e.cursor} {e.timestamp[:16].replace('T', ' ')} {e.session}{who}]\n{e.content}"
            )
        return "\n\n".join(parts)


def complete_reason(cfg: MemoryConfig) -> str:
    return (
        f"the run hit its cap (memory.dream.maxIterations {cfg.dream.max_iterations}, "
        f"maxTokens {cfg.dream.max_tokens}) before finishing; nothing was changed"
    )


def _repo_problem(workspace: Path, state_dir: Path) -> str | None:
    """Why Dream's changes could not be committed, or None."""
    from bot.memory.versioning import MemoryRepo, MemoryRepoError

    try:
        MemoryRepo(workspace, state_dir).check()
    except (MemoryRepoError, OSError) as exc:
        return str(exc)
    return None


async def _commit(workspace: Path, state_dir: Path, message: str) -> str | None:
    from bot.memory.versioning import commit_async

    return await commit_async(workspace, state_dir, message)


async def run_dream_command(cfg: Config, args: argparse.Namespace) -> int:
    """``memobot dream``: one run now, a one-line result on stdout."""
    from bot.cron.schedule import zone
    from bot.llm import LLMNotConfigured
    from bot.memory.migrate import migrate_legacy_history
    from bot.spend.ledger import UsageLedger

    usage = UsageLedger(cfg.agent.state_path)  # its calls are counted as the gateway's are
    workspace = cfg.agent.workspace_path
    if workspace_files.exists(workspace, "memory/HISTORY.md"):
        migrate_legacy_history(workspace)
    # Held to the budget as the gateway's Dream is (its notices are the gateway's to give).
    budget = await asyncio.to_thread(Budget, cfg, zone(cfg.agent.timezone))
    try:
        provider = LLMProvider(cfg.llm, meter=usage.record, guard=budget.check)
    except LLMNotConfigured as exc:
        print(f"memobot: {exc}", file=__import__("sys").stderr)
        return 78
    try:
        archive = HistoryArchive(workspace)
        owner = functools.partial(owner_chat, cfg)
        dream = Dream(
            cfg.memory, workspace, provider, archive, owner, state_dir=cfg.agent.state_path
        )
        result = await dream.run()
    finally:
        await provider.close()
        await usage.aclose()
    print(result.describe())
    if result.status == "proposed":  # no chat to ask in from here
        print(
            f"Answer it with /allow {result.proposal} or /deny {result.proposal} in a chat, or "
            "in the panel's Approvals screen; the gateway asks the admins at its next start."
        )
    return 0 if result.status in ("done", "nothing", "proposed") else 1
