"""The Memory screen's pages as HTML (every value escaped by ``bot.web.render``; forms
only, no script)."""

from __future__ import annotations

import re
from urllib.parse import urlencode

from bot.gate.question import visible
from bot.memory.editing import Current
from bot.memory.search import SearchHit
from bot.web.memory_data import LOG_PAGE, Change, Day, FileLine, Found
from bot.web.render import Html, join, tag, void
from bot.web.views import EMPTY, Frame, csrf_field, page, post_button

MAX_ENTRY_CHARS = 20_000  # of one archive entry on a page
_HISTORY_SOURCE = re.compile(r"^memory/history(?:-[^/#]*)?\.jsonl#(\d+)$")
_FILE_SOURCE = re.compile(r"^([^#]+)#(\d+)$")
_SUBNAV = (
    ("/memory", "Files"),
    ("/memory/log", "Changes"),
    ("/memory/archive", "Archive"),
    ("/memory/search", "Search"),
)


def file_link(rel: str, anchor: str = "") -> str:
    return "/memory/file?" + urlencode({"path": rel}) + (f"#{anchor}" if anchor else "")


def subnav(path: str) -> Html:
    return tag(
        "nav",
        join(
            tag("a", label, href=href, aria_current="page" if href == path else None)
            for href, label in _SUBNAV
        ),
        class_="subnav",
        aria_label="Memory",
    )


def problem_page(what: str, why: str, frame: Frame) -> Html:
    body = join([subnav(""), tag("p", why, class_="banner", role="alert")])
    return page(f"Memory: {what}"[:120], body, frame)


# -- the files


def files_page(listing: list[FileLine], frame: Frame, has_gateway: bool) -> Html:
    rows = []
    for f in listing:
        name = tag("a", f.rel, href=file_link(f.rel)) if f.editable else tag("code", f.rel)
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
    body = join([subnav("/memory"), intro, table, tag("h2", "Search"), search, dream])
    return page("Memory", body, frame)


def _lines(text: str) -> Html:
    """The file's lines, each with its number's anchor (``#L7``: a search citation). The
    model writes these files, Dream's commit messages and their diffs: every invisible
    character is shown by its code point (a bidi override cannot make a line read as
    another), as the approval questions are."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return tag(
        "pre",
        join(
            tag("span", visible(line).shown + "\n", id=f"L{n}", class_="line")
            for n, line in enumerate(lines, 1)
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
    body = join([subnav(""), tag("p", edit), content])
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
    body = join([subnav(""), note, _editor(current.rel, text, seen, frame.csrf, button)])
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
        return tag("span", visible(line).shown + "\n", class_=kind)

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
    parts: list[Html] = [subnav("")]
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


# -- the history of changes


def _change_block(change: Change, csrf: str, open_: bool) -> Html:
    info = change.info
    when = info.time.astimezone().strftime("%Y-%m-%d %H:%M")
    link = tag(
        "a", tag("code", info.short_id), href="/memory/commit?" + urlencode({"rev": info.id})
    )
    title = join([link, " ", visible(info.subject).shown])
    facts = tag("p", join([when, " · ", visible(info.author).shown]), class_="muted")
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
                tag("pre", visible(body).shown, class_="wrap") if body else EMPTY,
                diff,
            ]
        ),
        open=open_,
    )
    revert = post_button("/memory/revert", "Revert", csrf, rev=info.id)
    return tag("article", join([tag("h3", title), facts, details, revert]), class_="change")


def log_page(changes: list[Change], skip: int, frame: Frame) -> Html:
    """One page of the log (:func:`change_log`: a last change beyond the page means there
    are older ones)."""
    parts: list[Html] = [subnav("/memory/log")]
    if not changes:
        none = "No older changes." if skip else "No memory commits yet."
        parts.append(tag("p", none, class_="muted"))
    else:
        parts.append(
            tag(
                "p",
                "Every change to the memory files, newest first (what “memobot memory log” "
                "lists). Revert undoes one change with a new commit; later edits are kept.",
            )
        )
        parts += [_change_block(c, frame.csrf, False) for c in changes[:LOG_PAGE]]
        links = []
        if skip:
            newer = "/memory/log" + (f"?skip={skip - LOG_PAGE}" if skip > LOG_PAGE else "")
            links.append(tag("a", "Newer changes", href=newer))
        if len(changes) > LOG_PAGE:
            links.append(tag("a", "Older changes", href=f"/memory/log?skip={skip + LOG_PAGE}"))
        if links:
            parts.append(tag("p", join(links, " · ")))
    return page("Memory changes", join(parts), frame)


def commit_page(change: Change, frame: Frame) -> Html:
    body = join([subnav(""), _change_block(change, frame.csrf, True)])
    return page(f"Change {change.info.short_id}", body, frame)


# -- the archive by day


def archive_page(shown: Day, frame: Frame) -> Html:
    parts: list[Html] = [subnav("/memory/archive")]
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


# -- search


def citation_link(source: str) -> str | None:
    """Where a hit's citation opens: the archive entry, or the memory file's line."""
    if m := _HISTORY_SOURCE.match(source):
        cursor = m.group(1)
        return f"/memory/archive?{urlencode({'cursor': cursor})}#c{cursor}"
    if m := _FILE_SOURCE.match(source):
        return file_link(m.group(1), f"L{m.group(2)}")
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
    if hit.kind:
        tags += [" · ", f"match: {hit.kind}"]
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
    parts: list[Html] = [subnav("/memory/search"), form]
    if found.note:
        parts.append(tag("p", found.note, class_="muted"))
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
