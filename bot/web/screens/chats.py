"""Chats: every session, its transcript (a page at a time, tool calls folded), a search across
them, and exports as JSONL (the message lines as stored) and Markdown.

A session is named in a URL by its key in the query (``?key=telegram:123``) and found only
among the store's own keys: a key that is not one of them (``../../config.json``) is a 404,
never a path. Everything shown is the model's or a stranger's text: escaped, never markup.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from aiohttp import web

from bot.bus import no_surrogates
from bot.gate.limits import human_bytes
from bot.gate.question import marked_invisible, quoted
from bot.session.reading import (
    Found,
    Page,
    SessionFile,
    content_text,
    describe,
    message_lines,
    message_of,
    read_page,
    search,
)
from bot.web.render import Html, join, tag, void
from bot.web.server import page_response
from bot.web.views import EMPTY, Frame, page, table

if TYPE_CHECKING:
    from bot.session import SessionStore
    from bot.web.server import Panel

log = logging.getLogger(__name__)
NAV = ("/chats", "Chats")

PAGE_SIZE = 50  # messages on a transcript page
SHOWN_CHARS = 20_000  # of one message on a page (the export has it all)
MAX_LISTED = 500  # sessions in the list, most recently active first
MAX_QUERY = 200
EXPORT_BATCH = 256 * 1024  # bytes read per worker-thread step of an export


def routes(panel: Panel) -> list[web.RouteDef]:
    # One search at a time: each may read 256 MB in a worker thread, and a few at once (tabs,
    # a held-down Enter) would take every thread of the pool the gateway's own file work uses.
    searching = asyncio.Semaphore(1)

    def store() -> SessionStore:
        from bot.session import SessionStore

        return panel.gateway.stack.store if panel.gateway else SessionStore(panel.state_dir)

    async def known(request: web.Request) -> tuple[str, Path]:
        """The session the query names, if the store has it (else 404)."""
        key = request.query.get("key", "")
        s = await asyncio.to_thread(store)
        if key not in await asyncio.to_thread(s.keys):
            raise web.HTTPNotFound(text="No such chat.")
        return key, s.path_for(key)

    async def listing(request: web.Request) -> web.Response:
        query = request.query.get("q", "").strip()[:MAX_QUERY]
        s = await asyncio.to_thread(store)
        files = await asyncio.to_thread(_files, s)
        found = None
        if query:
            paths = [(f.key, s.path_for(f.key)) for f in files]
            async with searching:
                found = await asyncio.to_thread(search, paths, query)
        frame = panel.frame(request, await panel.gateway_running())
        return page_response(chats_page(files, query, found, frame))

    async def transcript(request: web.Request) -> web.Response:
        key, path = await known(request)
        at = _number(request.query.get("at"))
        start = None if at is None else at - at % PAGE_SIZE
        data = await asyncio.to_thread(read_page, key, path, start, PAGE_SIZE)
        frame = panel.frame(request, await panel.gateway_running())
        # Built in a worker too: 50 messages of 20,000 characters each, every character
        # looked at (invisible ones marked), is work the gateway's loop must not wait on.
        return page_response(await asyncio.to_thread(transcript_page, key, data, frame))

    async def export(request: web.Request) -> web.StreamResponse:
        key, path = await known(request)
        kind = request.query.get("format", "jsonl")
        if kind not in ("jsonl", "md"):
            raise web.HTTPNotFound(text="Export as jsonl or md.")
        lines = message_lines(key, path)
        chunks = _jsonl_chunks(lines) if kind == "jsonl" else _markdown_chunks(key, lines)
        response = web.StreamResponse(
            headers={
                "Content-Type": (
                    "application/x-ndjson" if kind == "jsonl" else "text/markdown; charset=utf-8"
                ),
                "Content-Disposition": f'attachment; filename="{export_name(key, kind)}"',
            }
        )
        await response.prepare(request)
        log.info("chats: session=%s exported as %s by web", key, kind)
        try:
            while chunk := await asyncio.to_thread(next, chunks, b""):
                await response.write(chunk)
        finally:
            chunks.close()  # its files now, also when the download was cancelled
        await response.write_eof()
        return response

    return [
        web.get("/chats", listing),
        web.get("/chats/view", transcript),
        web.get("/chats/export", export),
    ]


def _files(store: SessionStore) -> list[SessionFile]:
    files = [f for k in store.keys() if (f := describe(store.path_for(k), k)) is not None]
    files.sort(key=lambda f: f.modified, reverse=True)
    return files


def _number(value: str | None) -> int | None:
    return int(value) if value and value.isdigit() and len(value) < 12 else None


def export_name(key: str, kind: str) -> str:
    """A file name safe in a header and on any disk: the key's letters, digits, - and _."""
    return f"memobot-{re.sub(r'[^A-Za-z0-9_-]+', '_', key)[:80]}.{kind}"


def _batched(pieces: Iterator[bytes]) -> Generator[bytes, None, None]:
    buf: list[bytes] = []
    size = 0
    for piece in pieces:
        buf.append(piece)
        size += len(piece)
        if size >= EXPORT_BATCH:
            yield b"".join(buf)
            buf, size = [], 0
    if buf:
        yield b"".join(buf)


def _jsonl_chunks(lines: Iterator[bytes]) -> Generator[bytes, None, None]:
    return _batched(raw + b"\n" for raw in lines)


def _markdown_chunks(key: str, lines: Iterator[bytes]) -> Generator[bytes, None, None]:
    def pieces() -> Iterator[bytes]:
        yield f"# memobot chat {_code(key)}\n".encode()
        for number, raw in enumerate(lines):
            yield markdown_message(number, message_of(raw)).encode("utf-8")

    return _batched(pieces())


def _fence(text: str) -> str:
    """A code fence longer than any run of backticks in ``text``."""
    return quoted(text)


def _code(text: object) -> str:
    """``text`` as inline code on one line: a run of backticks longer than any in it, so
    nothing in it (a tool name or call id the model wrote) ends the span or the line."""
    one = " ".join(str(text).split())
    longest = max((len(m) for m in re.findall(r"`+", one)), default=0)
    ticks = "`" * (longest + 1)
    pad = " " if one.startswith("`") or one.endswith("`") else ""
    return f"{ticks}{pad}{one}{pad}{ticks}"


def markdown_message(number: int, message: dict[str, Any] | None) -> str:
    """One message as Markdown: a heading of memobot's, then what was said in a fenced block
    (nothing a person or the model wrote can close it and pass for the next message's
    heading: a message starting "## 5: assistant" stays inside its block)."""
    if message is None:
        return f"\n## {number}: (a damaged line)\n"
    role = str(message.get("role"))
    head = f"\n## {number}: {role}"
    if message.get("timestamp"):
        head += " · " + " ".join(str(message["timestamp"]).split())
    parts = [head, ""]
    text = content_text(message.get("content"))
    if role == "tool":
        parts.append(f"Result of call {_code(message.get('tool_call_id'))}:\n\n{_fence(text)}")
    elif text:
        parts.append(_fence(text))
    for call in message.get("tool_calls") or []:
        fn = call["function"]
        parts.append(f"\nTool call {_code(fn['name'])}:\n\n{_fence(fn['arguments'])}")
    return "\n".join(parts) + "\n"


# -- pages ---------------------------------------------------------------------------------


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts))


def _chat_link(key: str, at: int | None = None, anchor: bool = True) -> str:
    """The transcript's page holding message ``at`` (None: the newest page)."""
    query = {"key": key} if at is None else {"key": key, "at": str(at)}
    return f"/chats/view?{urlencode(query)}" + (f"#m{at}" if anchor and at is not None else "")


def _search_form(query: str) -> Html:
    field = void(
        "input",
        type="search",
        name="q",
        value=query,
        maxlength=str(MAX_QUERY),
        aria_label="Search the chats",
        placeholder="Search the chats",
    )
    return tag(
        "form",
        join([field, " ", tag("button", "Search", type="submit")]),
        method="get",
        action="/chats",
        class_="search",
    )


def _results(query: str, found: Found) -> Html:
    if not found.hits:
        return tag("p", f"No message holds “{query}”.", class_="muted")
    rows: list[list[object]] = [
        [tag("a", h.key, href=_chat_link(h.key, h.number)), h.role, marked_invisible(h.snippet)]
        for h in found.hits
    ]
    more = (
        EMPTY
        if found.complete
        else tag(
            "p",
            "The search stopped early: more messages may match. Try more words.",
            class_="muted",
        )
    )
    return join([table(("Chat", "Who", "Message"), rows), more])


def chats_page(files: list[SessionFile], query: str, found: Found | None, frame: Frame) -> Html:
    parts = [_search_form(query)]
    if found is not None:
        parts += [tag("h2", "Found"), _results(query, found)]
    parts.append(tag("h2", f"Every chat ({len(files)})"))
    if not files:
        parts.append(tag("p", "No chat yet.", class_="muted"))
    else:
        rows: list[list[object]] = []
        for f in files[:MAX_LISTED]:
            channel, _, chat = f.key.partition(":")
            rows.append(
                [
                    tag("a", f.key, href=_chat_link(f.key)),
                    channel,
                    chat,
                    marked_invisible(", ".join(f.people)) or "—",
                    _when(f.modified),
                    human_bytes(f.size),
                ]
            )
        parts.append(table(("Session", "Channel", "Chat", "People", "Last activity", "Size"), rows))
        if len(files) > MAX_LISTED:
            parts.append(
                tag(
                    "p",
                    f"The {MAX_LISTED} most recent are shown; search finds the others.",
                    class_="muted",
                )
            )
    return page("Chats", join(parts), frame)


def _shown(text: str) -> Html:
    if len(text) <= SHOWN_CHARS:
        return tag("div", marked_invisible(text), class_="text")
    cut = len(text) - SHOWN_CHARS
    return join(
        [
            tag("div", marked_invisible(text[:SHOWN_CHARS]), class_="text"),
            tag("p", f"… {cut:,} more characters: export the chat to read it all.", class_="muted"),
        ]
    )


def _message(number: int, message: dict[str, Any] | None) -> Html:
    if message is None:
        return tag(
            "article",
            tag("p", f"Message {number}: a damaged line.", class_="muted"),
            id=f"m{number}",
            class_="msg",
        )
    role = str(message.get("role"))
    stamp = str(message.get("timestamp") or "")
    head = tag(
        "header",
        join([tag("strong", role), " ", tag("span", f"#{number} {stamp}", class_="muted")]),
    )
    text = content_text(message.get("content"))
    body: list[Html] = []
    if role == "tool":
        summary = tag("summary", f"tool result ({len(text):,} characters)")
        shown = marked_invisible(text[:SHOWN_CHARS])
        body.append(tag("details", join([summary, tag("pre", shown)])))
    elif text:
        body.append(_shown(text))
    for call in message.get("tool_calls") or []:
        fn = call["function"]
        args = fn["arguments"]
        try:
            # no_surrogates: the model's "\udc00", decoded, is no text a page can hold.
            args = no_surrogates(json.dumps(json.loads(args), indent=2, ensure_ascii=False))
        except (ValueError, RecursionError):
            pass
        name = marked_invisible(fn["name"][:200])
        summary = tag("summary", join(["tool call ", tag("code", name)]))
        body.append(
            tag("details", join([summary, tag("pre", marked_invisible(args[:SHOWN_CHARS]))]))
        )
    return tag("article", join([head, *body]), id=f"m{number}", class_=f"msg {role}")


def _pager(key: str, data: Page) -> Html:
    links: list[Html] = []
    if data.start > 0:
        links.append(tag("a", "First", href=_chat_link(key, 0, anchor=False)))
        prev = max(0, data.start - PAGE_SIZE)
        links.append(tag("a", "Older", href=_chat_link(key, prev, anchor=False)))
    end = data.start + len(data.messages)
    if end < data.total:
        links.append(tag("a", "Newer", href=_chat_link(key, end, anchor=False)))
        links.append(tag("a", "Newest", href=_chat_link(key)))
    shown = f"Messages {data.start}–{max(data.start, end - 1)} of {data.total}"
    return tag("nav", join([tag("span", shown), *links], " "), class_="pager", aria_label="Pages")


def transcript_page(key: str, data: Page, frame: Frame) -> Html:
    exports = join(
        [
            "Export: ",
            tag("a", "JSONL", href="/chats/export?" + urlencode({"key": key, "format": "jsonl"})),
            " · ",
            tag("a", "Markdown", href="/chats/export?" + urlencode({"key": key, "format": "md"})),
        ]
    )
    parts = [
        tag("p", join([tag("a", "All chats", href="/chats"), " · ", exports])),
        _pager(key, data),
    ]
    if not data.messages:
        parts.append(tag("p", "No message here.", class_="muted"))
    parts.extend(_message(n, m) for n, m in data.messages)
    parts.append(_pager(key, data))
    return page(f"Chat {key}", join(parts), frame)
