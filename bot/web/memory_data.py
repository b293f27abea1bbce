"""What the panel's Memory screen shows, read by the functions ``memobot memory ...`` uses:
the memory files and skills (:mod:`bot.memory.editing`), the history of changes
(:mod:`bot.memory.versioning`), the archive by day and search (:mod:`bot.memory.search`).
Blocking: call them in a worker thread."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass
from datetime import date, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from bot.config import Config
from bot.memory.editing import EditError, read_current
from bot.memory.history import HistoryEntry
from bot.memory.search import SearchHit
from bot.memory.versioning import CommitInfo, MemoryRepo

if TYPE_CHECKING:
    from bot.memory.hybrid import Embeddings

LOG_PAGE = 30  # commits per page of the log
MAX_DIFF_CHARS = 20_000  # of one commit's diff on a page; `memobot memory diff` shows all
SEARCH_HITS = 20


@dataclass(frozen=True, slots=True)
class FileLine:
    rel: str
    state: str  # "1,234 chars", "absent", or why it cannot be edited here
    editable: bool
    budget: str  # "1,474/4,000 chars" for the budgeted files, else ""
    note: str  # a skill a non-admin wrote: left out of the prompt


def file_listing(cfg: Config) -> list[FileLine]:
    """Each memory file and skill: size, budget, whether the panel can edit it."""
    from bot.memory.dream import BUDGETED
    from bot.memory.editing import editable_files
    from bot.memory.people import person_of
    from bot.provenance import Provenance

    workspace = cfg.agent.workspace_path
    guests = Provenance(cfg.agent.state_path, workspace).untrusted_now()
    out = []
    for rel in editable_files(workspace):
        try:
            current = read_current(workspace, rel)
        except EditError as exc:
            out.append(FileLine(rel, str(exc).removeprefix(rel).strip(), False, "", ""))
            continue
        size = f"{len(current.text):,} chars" if current.exists else "absent"
        budget = ""
        if rel in BUDGETED:
            budget = f"{len(current.text):,}/{cfg.memory.max_chars:,} chars"
            if len(current.text) > cfg.memory.max_chars:
                budget += " (over budget: Dream will condense it)"
        note = ""
        if (who := person_of(rel, current.text)) is not None:
            note = f"what memobot keeps about {who.shown}: in the prompt of their own turns only"
        if rel in guests:
            note = (
                f"written in {guests[rel]}, not by an admin: left out of the prompt until "
                "you save it here"
            )
        out.append(FileLine(rel, size, True, budget, note))
    return out


@dataclass(frozen=True, slots=True)
class Change:
    info: CommitInfo
    diff: str
    cut: bool  # the diff is longer than a page shows


def _repo(cfg: Config) -> MemoryRepo:
    return MemoryRepo(cfg.agent.workspace_path, cfg.agent.state_path)


def _change(repo: MemoryRepo, info: CommitInfo) -> Change:
    # At most 4 bytes a character: past this many bytes the page's part is certainly there.
    diff = repo.diff(info.id, limit=4 * MAX_DIFF_CHARS + 4)
    return Change(info, diff[:MAX_DIFF_CHARS], len(diff) > MAX_DIFF_CHARS)


def change_log(cfg: Config, skip: int = 0) -> list[Change]:
    """LOG_PAGE commits with their diffs, newest first, after the newest ``skip`` (``memobot
    memory log``); one more without its diff when there are older ones."""
    repo = _repo(cfg)
    infos = repo.log(limit=skip + LOG_PAGE + 1)[skip:]
    changes = [_change(repo, info) for info in infos[:LOG_PAGE]]
    return changes + [Change(info, "", False) for info in infos[LOG_PAGE:]]


def one_change(cfg: Config, rev: str) -> list[Change]:
    """The commit ``rev`` names (``memobot memory diff REV``)."""
    repo = _repo(cfg)
    return [_change(repo, repo.info(rev))]


@dataclass(frozen=True, slots=True)
class Day:
    days: list[tuple[date, int]]  # every day with entries, newest first, and how many
    undated: int
    day: date | None  # the day shown
    entries: list[HistoryEntry]
    times: list[str]  # "HH:MM" of each entry


def archive_day(workspace: Path, day: date | None, cursor: int) -> Day:
    """The days of the archive and one day's entries: ``day``, the day of entry ``cursor``,
    or the newest day. One pass over the archive (a second one to follow a citation)."""
    from bot.memory.search import dated_history

    counts: Counter[date | None] = Counter()
    shown: list[tuple[HistoryEntry, datetime | None]] = []
    newest: date | None = None
    for when, entry, moment in dated_history(workspace):
        counts[when] += 1
        if cursor and entry.cursor == cursor:
            day = when
        if day is None and not cursor and when is not None and (newest is None or when > newest):
            newest, shown = when, []  # a later day: the newest so far
        if when is not None and when == (day or newest):
            shown.append((entry, moment))
    if cursor and day is not None:
        shown = [(entry, moment) for _, entry, moment in dated_history(workspace, day, day)]
    days = sorted(((d, n) for d, n in counts.items() if d is not None), reverse=True)
    times = [moment.strftime("%H:%M") if moment else "--:--" for _, moment in shown]
    return Day(days, counts[None], day or newest, [entry for entry, _ in shown], times)


@dataclass(frozen=True, slots=True)
class Found:
    query: str
    since: str
    until: str
    hits: tuple[SearchHit, ...] = ()
    problem: str = ""
    searched: bool = False
    note: str = ""  # why a hybrid search matched by words only


async def run_search(cfg: Config, asked: Found, embeddings: Embeddings | None = None) -> Found:
    """What ``memobot memory search`` and the ``memory_search`` tool find (the owner's
    scope: every chat's history and the memory files), by meaning too when
    ``memory.embeddings`` is on: ``embeddings`` the running gateway's, else made for this
    search."""
    from bot.memory.commands import parse_day
    from bot.memory.hybrid import Embeddings, memory_search
    from bot.memory.search import MemoryIndex, SearchUnavailable

    try:
        since = parse_day(asked.since) if asked.since.strip() else None
        until = parse_day(asked.until) if asked.until.strip() else None
    except ValueError as exc:
        return Found(asked.query, asked.since, asked.until, problem=f"A day is wrong: {exc}")
    if since and until and since > until:
        return Found(asked.query, asked.since, asked.until, problem="“since” is after “until”.")
    own = None
    if embeddings is None:
        index = MemoryIndex(cfg.agent.workspace_path, cfg.agent.state_path)
        # In a thread: with embeddings on, this loads numpy (0.1-0.3 s the first time).
        embeddings = own = await asyncio.to_thread(Embeddings.from_config, cfg, index)
    else:
        index = embeddings.index
    try:
        result = await memory_search(index, embeddings, asked.query, SEARCH_HITS, since, until)
    except SearchUnavailable as exc:
        return Found(asked.query, asked.since, asked.until, problem=str(exc))
    finally:
        if own is not None:
            await own.close()
    return Found(
        asked.query, asked.since, asked.until, result.hits, searched=True, note=result.note
    )
