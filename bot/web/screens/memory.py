"""Memory: the long-term memory files and skills (view, edit with a diff preview, save as a
commit), their history (the log with diffs, revert), the archive by day, search with
citations, and a Dream run in the running gateway.

Every reading and writing goes through the functions ``memobot memory ...`` uses
(:mod:`bot.memory.versioning`, :mod:`bot.memory.search`) and :mod:`bot.memory.editing`,
which reads the workspace as the model's hostile data (no link followed, no huge file read).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections import Counter
from dataclasses import dataclass
from datetime import date, datetime
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlencode

from aiohttp import web

from bot.config import Config
from bot.memory.editing import Current, EditError, Stale, from_form, read_current
from bot.memory.editing import save as save_file
from bot.memory.history import HistoryEntry
from bot.memory.search import SearchHit
from bot.memory.versioning import CommitInfo, MemoryRepo, MemoryRepoError
from bot.web.render import Html, join, tag, void
from bot.web.server import page_response
from bot.web.views import EMPTY, Frame, csrf_field, page, post_button

if TYPE_CHECKING:
    from bot.web.server import Panel

log = logging.getLogger(__name__)
NAV = ("/memory", "Memory")

LOG_PAGE = 30  # commits per page of the log
MAX_DIFF_CHARS = 20_000  # of one commit's diff on a page; `memobot memory diff` shows all
MAX_ENTRY_CHARS = 20_000  # of one archive entry on a page
SEARCH_HITS = 20
_HISTORY_SOURCE = re.compile(r"^memory/history(?:-[^/#]*)?\.jsonl#(\d+)$")
_FILE_SOURCE = re.compile(r"^([^#]+)#(\d+)$")
_SUBNAV = (
    ("/memory", "Files"),
    ("/memory/log", "Changes"),
    ("/memory/archive", "Archive"),
    ("/memory/search", "Search"),
)


def routes(panel: Panel) -> list[web.RouteDef]:
    async def places(request: web.Request) -> tuple[Config, Frame]:
        cfg, _ = await panel.config()
        return cfg, panel.frame(request, await panel.gateway_running())

    async def no_workspace(cfg: Config, frame: Frame) -> web.Response | None:
        workspace = cfg.agent.workspace_path  # the owner's path, from the config
        if await asyncio.to_thread(workspace.is_dir):
            return None
        why = f"The workspace {workspace} does not exist yet: “memobot onboard” creates it."
        return page_response(_problem_page("no workspace", why, frame))

    async def files(request: web.Request) -> web.Response:
        cfg, frame = await places(request)
        if (missing := await no_workspace(cfg, frame)) is not None:
            return missing
        listing = await asyncio.to_thread(file_listing, cfg)
        return page_response(files_page(listing, cfg, frame, panel.gateway is not None))

    async def view(request: web.Request) -> web.Response:
        cfg, frame = await places(request)
        rel = request.query.get("path", "")
        try:
            current = await asyncio.to_thread(read_current, cfg.agent.workspace_path, rel)
        except EditError as exc:
            return page_response(_problem_page(rel, str(exc), frame), 404)
        return page_response(view_page(current, frame))

    async def edit(request: web.Request) -> web.Response:
        cfg, frame = await places(request)
        rel = request.query.get("path", "")
        try:
            current = await asyncio.to_thread(read_current, cfg.agent.workspace_path, rel)
        except EditError as exc:
            return page_response(_problem_page(rel, str(exc), frame), 404)
        return page_response(edit_page(current, current.text, current.digest, frame))

    async def preview(request: web.Request) -> web.Response:
        cfg, frame = await places(request)
        form = await request.post()
        rel, seen = str(form.get("path", "")), str(form.get("seen", ""))
        try:
            current = await asyncio.to_thread(read_current, cfg.agent.workspace_path, rel)
        except EditError as exc:
            return page_response(_problem_page(rel, str(exc), frame), 409)
        text = from_form(str(form.get("text", "")), current.text)
        warning = ""
        if current.digest != seen:
            warning = (
                f"{rel} changed after you opened it (the model, Dream or another edit wrote "
                "it): the changes below are against the file as it is now, and saving undoes "
                "what was written meanwhile where your text differs."
            )
        return page_response(
            preview_page(current, text, frame, warning, budget=cfg.memory.max_chars)
        )

    async def save(request: web.Request) -> web.Response:
        cfg, frame = await places(request)
        workspace, state = cfg.agent.workspace_path, panel.state_dir
        form = await request.post()
        rel, seen = str(form.get("path", "")), str(form.get("seen", ""))
        sent = str(form.get("text", ""))
        try:
            current = await asyncio.to_thread(read_current, workspace, rel)
            text = from_form(sent, current.text)
            saved = await asyncio.to_thread(save_file, workspace, state, rel, text, seen)
        except Stale as exc:
            log.info("memory: a save of %s by web refused: it changed meanwhile", rel)
            try:
                now = await asyncio.to_thread(read_current, workspace, rel)
            except EditError as problem:  # replaced meanwhile by a link, a huge file...
                return page_response(_problem_page(rel, f"{exc} {problem}", frame), 409)
            text = from_form(sent, now.text)
            budget = cfg.memory.max_chars
            body = preview_page(now, text, frame, str(exc), stale=True, budget=budget)
            return page_response(body, 409)
        except (EditError, OSError) as exc:
            return page_response(_problem_page(rel, str(exc), frame), 409)
        where = "/memory/file?" + urlencode({"path": rel})
        if not saved.written:
            return panel.back(where, f"{rel} is unchanged: nothing to save.")
        if saved.commit is None:
            log.info("memory: %s edited by web, back to its last commit", rel)
            return panel.back(where, f"Saved {rel}: it is as its last commit has it again.")
        log.info("memory: %s edited by web, commit %s", rel, saved.commit[:7])
        return panel.back(where, f"Saved {rel}: commit {saved.commit[:7]} (by web).")

    async def history_log(request: web.Request) -> web.Response:
        cfg, frame = await places(request)
        count = _int(request.query.get("n"), LOG_PAGE, 1, 1000)
        try:
            commits = await asyncio.to_thread(change_log, cfg, count)
        except (OSError, MemoryRepoError) as exc:
            return page_response(_problem_page("the memory history", str(exc), frame), 500)
        return page_response(log_page(commits, count, frame))

    async def commit_view(request: web.Request) -> web.Response:
        cfg, frame = await places(request)
        rev = request.query.get("rev", "HEAD")
        try:
            [change] = await asyncio.to_thread(one_change, cfg, rev)
        except (OSError, MemoryRepoError) as exc:
            return page_response(_problem_page(rev, str(exc), frame), 404)
        return page_response(commit_page(change, frame))

    async def revert(request: web.Request) -> web.Response:
        from bot.memory.versioning import revert_commit

        cfg, _ = await panel.config()
        rev = str((await request.post()).get("rev", ""))
        repo = MemoryRepo(cfg.agent.workspace_path, panel.state_dir)
        try:
            done = await asyncio.to_thread(revert_commit, repo, rev, "web")
        except (OSError, MemoryRepoError) as exc:
            return panel.back("/memory/log", f"Not reverted: {exc}")
        log.info("memory: %s (by web)", done)
        return panel.back("/memory/log", f"{done} (by web).")

    async def archive(request: web.Request) -> web.Response:
        cfg, frame = await places(request)
        if (missing := await no_workspace(cfg, frame)) is not None:
            return missing
        cursor = _int(request.query.get("cursor"), 0, 0, 1 << 62)
        try:
            day = date.fromisoformat(request.query["day"]) if "day" in request.query else None
        except ValueError:
            day = None
        shown = await asyncio.to_thread(archive_day, cfg.agent.workspace_path, day, cursor)
        return page_response(archive_page(shown, frame))

    async def search(request: web.Request) -> web.Response:
        cfg, frame = await places(request)
        if (missing := await no_workspace(cfg, frame)) is not None:
            return missing
        query = request.query.get("q", "").strip()
        since_text, until_text = request.query.get("since", ""), request.query.get("until", "")
        found = Found(query, since_text, until_text)
        if query:
            found = await asyncio.to_thread(run_search, cfg, found)
        return page_response(search_page(found, frame))

    async def dream(request: web.Request) -> web.Response:
        gateway = panel.gateway
        if gateway is None:
            return panel.back(
                "/memory",
                "Dream runs in the gateway, and it is not running: start it, or run "
                "“memobot dream” in a terminal.",
            )
        runner = gateway.stack.loop.dream
        if runner.running:
            return panel.back("/memory", "Dream is running already: wait for it to finish.")
        log.info("dream: run by web")
        # A browser that goes away does not cut a run short (its edits land whole or not).
        result = await asyncio.shield(runner.run())
        said = result.describe()
        if result.commit:
            return panel.back("/memory/commit?" + urlencode({"rev": result.commit}), said)
        return panel.back("/memory", said)

    return [
        web.get("/memory", files),
        web.get("/memory/file", view),
        web.get("/memory/edit", edit),
        web.post("/memory/preview", preview),
        web.post("/memory/save", save),
        web.get("/memory/log", history_log),
        web.get("/memory/commit", commit_view),
        web.post("/memory/revert", revert),
        web.get("/memory/archive", archive),
        web.get("/memory/search", search),
        web.post("/memory/dream", dream),
    ]


def _int(text: str | None, default: int, low: int, high: int) -> int:
    try:
        return max(low, min(high, int(text or default)))
    except ValueError:
        return default


def _link(rel: str, anchor: str = "") -> str:
    return "/memory/file?" + urlencode({"path": rel}) + (f"#{anchor}" if anchor else "")


def _subnav(path: str) -> Html:
    return tag(
        "nav",
        join(
            tag("a", label, href=href, aria_current="page" if href == path else None)
            for href, label in _SUBNAV
        ),
        class_="subnav",
        aria_label="Memory",
    )


def _problem_page(what: str, why: str, frame: Frame) -> Html:
    body = join([_subnav(""), tag("p", why, class_="banner", role="alert")])
    return page(f"Memory: {what}"[:120], body, frame)


# -- the files -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FileLine:
    rel: str
    state: str  # "12,345 bytes", "absent", or why it cannot be edited here
    editable: bool
    budget: str  # "1,474/4,000 chars" for the budgeted files, else ""
    note: str  # a skill a non-admin wrote: left out of the prompt


def file_listing(cfg: Config) -> list[FileLine]:
    """Each memory file and skill: size, budget, whether the panel can edit it."""
    from bot.memory.dream import BUDGETED
    from bot.memory.editing import editable_files
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
        if rel in guests:
            note = (
                f"written in {guests[rel]}, not by an admin: left out of the prompt until "
                "you save it here"
            )
        out.append(FileLine(rel, size, True, budget, note))
    return out


def files_page(listing: list[FileLine], cfg: Config, frame: Frame, has_gateway: bool) -> Html:
    rows = []
    for f in listing:
        name = tag("a", f.rel, href=_link(f.rel)) if f.editable else tag("code", f.rel)
        state = (
            join([f.state, tag("br"), tag("span", f.note, class_="muted")]) if f.note else f.state
        )
        actions = (
            tag("a", "Edit", href="/memory/edit?" + urlencode({"path": f.rel}))
            if f.editable
            else EMPTY
        )
        rows.append(
            tag(
                "tr",
                join([tag("td", name), tag("td", state), tag("td", f.budget), tag("td", actions)]),
            )
        )
    head = tag("thead", tag("tr", join(tag("th", h) for h in ("File", "Now", "Budget", ""))))
    table = tag("table", join([head, tag("tbody", join(rows))]), class_="files")
    intro = tag(
        "p",
        "What memobot keeps about you and itself, in every prompt: edit a file, see the change "
        "before you save it (a commit in the memory history, undone under Changes).",
    )
    search = tag(
        "form",
        join(
            [
                void("input", type="search", name="q", aria_label="Search memory", required=True),
                " ",
                tag("button", "Search", type="submit"),
            ]
        ),
        method="get",
        action="/memory/search",
        class_="inline",
    )
    dream_note = (
        "Dream distils the new archive entries into these files now (it asks the model)."
        if has_gateway
        else "Dream runs in the gateway, which this panel is not part of: start the gateway, "
        "or run “memobot dream” in a terminal."
    )
    dream = join(
        [
            tag("h2", "Dream"),
            tag("p", dream_note, class_="muted"),
            post_button("/memory/dream", "Run Dream now", frame.csrf, True)
            if has_gateway
            else EMPTY,
        ]
    )
    body = join([_subnav("/memory"), intro, table, tag("h2", "Search"), search, dream])
    return page("Memory", body, frame)


def _lines(text: str) -> Html:
    """The file's lines, each with its number's anchor (``#L7``: a search citation)."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return tag(
        "pre",
        join(
            tag("span", line + "\n", id=f"L{n}", class_="line") for n, line in enumerate(lines, 1)
        ),
        class_="file",
    )


def view_page(current: Current, frame: Frame) -> Html:
    edit = tag(
        "a", "Edit", href="/memory/edit?" + urlencode({"path": current.rel}), class_="button"
    )
    if not current.exists:
        content = tag("p", f"{current.rel} does not exist yet: Edit creates it.", class_="muted")
    elif not current.text.strip():
        content = tag("p", f"{current.rel} is empty.", class_="muted")
    else:
        content = _lines(current.text)
    body = join([_subnav(""), tag("p", edit), content])
    return page(current.rel, body, frame)


def _editor(rel: str, text: str, seen: str, csrf: str, buttons: Html) -> Html:
    # multipart: the text is sent as it is (urlencoding triples it); the textarea's first
    # line break is eaten by the HTML parser, hence the one put before the text.
    fields = join(
        [
            csrf_field(csrf),
            void("input", type="hidden", name="path", value=rel),
            void("input", type="hidden", name="seen", value=seen),
            tag("label", f"New text of {rel}", for_="text", class_="muted"),
            tag("textarea", "\n" + text, name="text", id="text", rows="20", spellcheck="false"),
            tag("p", buttons, class_="actions"),
        ]
    )
    return tag(
        "form", fields, method="post", action="/memory/preview", enctype="multipart/form-data"
    )


def edit_page(current: Current, text: str, seen: str, frame: Frame) -> Html:
    button = tag("button", "Preview changes", type="submit", class_="primary")
    note = tag(
        "p",
        "Nothing is saved until you have seen the changes. A file the model or Dream changes "
        "meanwhile is not overwritten.",
        class_="muted",
    )
    body = join([_subnav(""), note, _editor(current.rel, text, seen, frame.csrf, button)])
    return page(f"Edit {current.rel}", body, frame)


def _diff(lines: list[str]) -> Html:
    def one(line: str) -> Html:
        kind = None
        if line.startswith(("+++", "---", "diff ", "index ", "new file", "deleted file")):
            kind = "meta"
        elif line.startswith("@@"):
            kind = "hunk"
        elif line.startswith("+"):
            kind = "add"
        elif line.startswith("-"):
            kind = "del"
        return tag("span", line + "\n", class_=kind)

    return tag("pre", join(one(line) for line in lines), class_="diff")


def preview_page(
    current: Current,
    text: str,
    frame: Frame,
    warning: str = "",
    *,
    stale: bool = False,
    budget: int = 0,
) -> Html:
    """The changes ``text`` makes to the file as it is, and the form that saves them (with
    the digest of that version). ``budget``: memory.maxChars, for the budgeted files."""
    from bot.memory.dream import BUDGETED
    from bot.memory.editing import diff_lines, text_problem

    lines = diff_lines(current.rel, current.text, text)
    blocked = text_problem(current.rel, text)
    parts: list[Html] = [_subnav("")]
    for alert in (warning, blocked):
        if alert:
            parts.append(tag("p", alert, class_="banner", role="alert"))
    if stale:
        parts.append(tag("p", "Below: your text against the file as it is now.", class_="muted"))
    if current.rel in BUDGETED and budget and len(text) > budget:
        over = (
            f"{len(text):,} characters, over the budget of {budget:,} (memory.maxChars): "
            "Dream will condense it."
        )
        parts.append(tag("p", over, class_="muted"))
    if lines and not blocked:
        parts += [tag("h2", "Changes"), _diff(lines)]
        save = tag("button", "Save", type="submit", formaction="/memory/save", class_="primary")
    elif blocked:
        save = EMPTY
    else:
        parts.append(tag("p", "No changes: your text is the file as it is.", class_="notice"))
        save = EMPTY
    buttons = join([save, " ", tag("button", "Preview again", type="submit")])
    parts.append(_editor(current.rel, text, current.digest, frame.csrf, buttons))
    return page(f"Preview {current.rel}", join(parts), frame)


# -- the history of changes ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Change:
    info: CommitInfo
    diff: str
    cut: bool  # the diff is longer than a page shows


def _repo(cfg: Config) -> MemoryRepo:
    return MemoryRepo(cfg.agent.workspace_path, cfg.agent.state_path)


def _change(repo: MemoryRepo, info: CommitInfo) -> Change:
    diff = repo.diff(info.id)
    return Change(info, diff[:MAX_DIFF_CHARS], len(diff) > MAX_DIFF_CHARS)


def change_log(cfg: Config, count: int) -> list[Change]:
    """The last ``count`` commits with their diffs, newest first (``memobot memory log``)."""
    repo = _repo(cfg)
    return [_change(repo, info) for info in repo.log(limit=count)]


def one_change(cfg: Config, rev: str) -> list[Change]:
    """The commit ``rev`` names (``memobot memory diff REV``)."""
    repo = _repo(cfg)
    return [_change(repo, repo.info(rev))]


def _change_block(change: Change, csrf: str, open_: bool) -> Html:
    info = change.info
    when = info.time.astimezone().strftime("%Y-%m-%d %H:%M")
    link = tag(
        "a", tag("code", info.short_id), href="/memory/commit?" + urlencode({"rev": info.id})
    )
    title = join([link, " ", info.subject])
    facts = tag("p", join([when, " · ", info.author]), class_="muted")
    body = info.message.split("\n", 1)[1].strip() if "\n" in info.message else ""
    diff = _diff(change.diff.splitlines())
    if change.cut:
        diff = join(
            [
                diff,
                tag(
                    "p",
                    f"Cut here: `memobot memory diff {info.short_id}` shows all.",
                    class_="muted",
                ),
            ]
        )
    details = tag(
        "details",
        join(
            [
                tag("summary", "What changed"),
                tag("pre", body, class_="wrap") if body else EMPTY,
                diff,
            ]
        ),
        open=open_,
    )
    revert = post_button("/memory/revert", "Revert", csrf, rev=info.id)
    return tag("article", join([tag("h3", title), facts, details, revert]), class_="change")


def log_page(changes: list[Change], count: int, frame: Frame) -> Html:
    parts: list[Html] = [_subnav("/memory/log")]
    if not changes:
        parts.append(tag("p", "No memory commits yet.", class_="muted"))
    else:
        parts.append(
            tag(
                "p",
                "Every change to the memory files, newest first (what “memobot memory log” "
                "lists). Revert undoes one change with a new commit; later edits are kept.",
            )
        )
        parts += [_change_block(c, frame.csrf, False) for c in changes]
        if len(changes) == count:
            more = "/memory/log?" + urlencode({"n": count + LOG_PAGE})
            parts.append(tag("p", tag("a", "Older changes", href=more)))
    return page("Memory changes", join(parts), frame)


def commit_page(change: Change, frame: Frame) -> Html:
    body = join([_subnav(""), _change_block(change, frame.csrf, True)])
    return page(f"Change {change.info.short_id}", body, frame)


# -- the archive by day --------------------------------------------------------------------


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


def archive_page(shown: Day, frame: Frame) -> Html:
    parts: list[Html] = [_subnav("/memory/archive")]
    if not shown.days:
        parts.append(tag("p", "No history entries yet.", class_="muted"))
        return page("Memory archive", join(parts), frame)
    parts.append(
        tag(
            "p",
            "The conversation archive Dream reads, by day (what “memobot memory history” prints).",
        )
    )
    links = join(
        tag(
            "a",
            f"{d.isoformat()} ({n})",
            href="/memory/archive?" + urlencode({"day": d.isoformat()}),
            aria_current="page" if d == shown.day else None,
        )
        for d, n in shown.days
    )
    parts.append(tag("nav", links, class_="days", aria_label="Days"))
    if shown.day is None:
        parts.append(tag("p", "No entry of that day.", class_="muted"))
    else:
        parts.append(tag("h2", f"{shown.day.isoformat()} ({shown.day.strftime('%A')})"))
        for entry, time_ in zip(shown.entries, shown.times, strict=True):
            content = entry.content
            if len(content) > MAX_ENTRY_CHARS:
                content = content[:MAX_ENTRY_CHARS] + " …"
            head = tag(
                "p",
                join([time_, " · ", entry.session or "-", " · #", str(entry.cursor)]),
                class_="muted",
            )
            parts.append(
                tag(
                    "article",
                    join([head, tag("pre", content, class_="wrap")]),
                    id=f"c{entry.cursor}",
                    class_="entry",
                )
            )
    return page("Memory archive", join(parts), frame)


# -- search --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Found:
    query: str
    since: str
    until: str
    hits: tuple[SearchHit, ...] = ()
    problem: str = ""
    searched: bool = False


def run_search(cfg: Config, asked: Found) -> Found:
    """What ``memobot memory search`` and the ``memory_search`` tool find (the owner's
    scope: every chat's history and the memory files)."""
    from bot.memory.commands import parse_day
    from bot.memory.search import MemoryIndex, SearchUnavailable

    try:
        since = parse_day(asked.since) if asked.since.strip() else None
        until = parse_day(asked.until) if asked.until.strip() else None
    except ValueError as exc:
        return Found(asked.query, asked.since, asked.until, problem=f"A day is wrong: {exc}")
    if since and until and since > until:
        return Found(asked.query, asked.since, asked.until, problem="“since” is after “until”.")
    index = MemoryIndex(cfg.agent.workspace_path, cfg.agent.state_path)
    try:
        hits = index.search(asked.query, limit=SEARCH_HITS, since=since, until=until)
    except SearchUnavailable as exc:
        return Found(asked.query, asked.since, asked.until, problem=str(exc))
    return Found(asked.query, asked.since, asked.until, tuple(hits), searched=True)


def citation_link(source: str) -> str | None:
    """Where a hit's citation opens: the archive entry, or the memory file's line."""
    if m := _HISTORY_SOURCE.match(source):
        cursor = m.group(1)
        return f"/memory/archive?{urlencode({'cursor': cursor})}#c{cursor}"
    if m := _FILE_SOURCE.match(source):
        return _link(m.group(1), f"L{m.group(2)}")
    return None


def _hit(hit: SearchHit) -> Html:
    from bot.memory.search import local_time

    href = citation_link(hit.source)
    cite = tag("a", hit.source, href=href) if href else tag("code", hit.source)
    tags: list[object] = [cite]
    moment = local_time(hit.timestamp) if hit.timestamp else None
    if moment:
        tags += [" · ", moment.date().isoformat()]
    if hit.session:
        tags += [" · ", hit.session]
    return tag("li", join([tag("p", join(tags), class_="muted"), tag("p", hit.snippet)]))


def search_page(found: Found, frame: Frame) -> Html:
    def field(name: str, label: str, value: str, kind: str = "text", **extra: object) -> Html:
        return tag(
            "label",
            join([label, " ", void("input", type=kind, name=name, value=value, **extra)]),
        )

    form = tag(
        "form",
        join(
            [
                field("q", "Words", found.query, "search", required=True),
                field("since", "Since", found.since, placeholder="YYYY-MM-DD, 7d", size="14"),
                field("until", "Until", found.until, placeholder="YYYY-MM-DD", size="14"),
                tag("button", "Search", type="submit", class_="primary"),
            ]
        ),
        method="get",
        action="/memory/search",
        class_="search",
    )
    parts: list[Html] = [_subnav("/memory/search"), form]
    if found.problem:
        parts.append(tag("p", found.problem, class_="banner", role="alert"))
    elif found.searched and not found.hits:
        parts.append(tag("p", f"No matches for “{found.query}”.", class_="muted"))
    elif found.hits:
        parts.append(tag("ol", join(_hit(h) for h in found.hits), class_="hits"))
    else:
        parts.append(
            tag(
                "p",
                "The same search as “memobot memory search” and the model's memory_search: "
                "the archive and the memory files, best matches first.",
                class_="muted",
            )
        )
    return page("Memory search", join(parts), frame)
