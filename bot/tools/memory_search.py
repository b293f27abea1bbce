"""The ``memory_search`` tool: search over the history archive and the memory files, by words
(BM25) and, with ``memory.embeddings`` on, by meaning too (bot.memory.hybrid)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import date
from typing import Any, ClassVar

from bot.memory.hybrid import Embeddings, memory_search
from bot.memory.search import MAX_LIMIT, MemoryIndex, SearchUnavailable, format_hits
from bot.tools.base import Effects, Tool, ToolContext, ToolError

MAX_HITS = 20
WORDS_ONLY_NOTE = "Matched by words only: search by meaning is not available right now."
DEFAULT_HITS = 10


def _day(args: dict[str, Any], name: str) -> date | None:
    text = args.get(name)
    if text is None or not str(text).strip():
        return None
    try:
        return date.fromisoformat(str(text).strip())
    except ValueError:
        raise ToolError(
            f"{name} must be a date as YYYY-MM-DD, e.g. 2026-11-28; got {text!r}"
        ) from None


class MemorySearchTool(Tool):
    name: ClassVar[str] = "memory_search"
    # Reads the history and the memory files, no path it is given, within the turn's scope.
    effects: ClassVar[Effects] = Effects(scoped=True)
    description: ClassVar[str] = (
        "Search past conversations (the history archive) and the memory files (USER.md, "
        "SOUL.md, memory/MEMORY.md, skills) by words. Returns the best matches with their "
        "source (file#cursor for history, file#line for memory files), date and chat. "
        "Entries with all the words come first; if none has them all, entries with any word. "
        "A word ending in * matches as a prefix. since/until limit the search to history "
        "from those days (memory files have no date and are left out then)."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "Words to look for"},
            "since": {"type": "string", "description": "Only history from this day, YYYY-MM-DD"},
            "until": {
                "type": "string",
                "description": "Only history up to and including this day, YYYY-MM-DD",
            },
            "limit": {
                "type": "integer",
                "description": f"How many matches (default {DEFAULT_HITS}, at most {MAX_HITS})",
                "minimum": 1,
                "maximum": MAX_HITS,
            },
        },
        "required": ["query"],
    }

    def __init__(
        self,
        index: MemoryIndex,
        embeddings: Embeddings | None = None,
        owner_chat: Callable[[str], bool] | None = None,
    ) -> None:
        """``owner_chat``: whether a chat is the owner's own (bot.cron.heartbeat.owner_chat);
        None: no chat is, so a chat sharing the owner's memory searches its files only."""
        self.index = index
        self.embeddings = embeddings
        self.owner_chat = owner_chat

    def schema(self) -> dict[str, Any]:
        schema = super().schema()
        if self.embeddings is not None:  # the model is told what kind of search it has
            schema["function"]["description"] += _BY_MEANING
        return schema

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        query = str(args["query"]).strip()
        if not any(ch.isalnum() for ch in query):
            raise ToolError("query must contain at least one word")
        since, until = _day(args, "since"), _day(args, "until")
        if since and until and since > until:
            raise ToolError(f"since ({since}) is after until ({until})")
        limit = args.get("limit", DEFAULT_HITS)
        if limit < 1:
            raise ToolError(f"limit must be between 1 and {MAX_HITS}")
        # A chat that may not see the owner's memory (a group, a non-admin's private chat)
        # searches only its own archived history: never the memory files or other chats (the
        # same scope keeps USER.md out of its system prompt).
        only = ctx.scope.history_session
        # Sharing the owner's memory (memory.shareWithNonAdmins, shareInGroups) shares the
        # owner's files and chats, not another person's private chat or another group: their
        # history holds what they said about themselves, which their own file keeps from
        # everyone else (bot.memory.people). Filtered after ranking, from a larger result.
        shared = only is None and not ctx.scope.is_owner
        wanted = min(limit, MAX_HITS)
        try:
            found = await memory_search(
                self.index,
                self.embeddings,
                query,
                MAX_LIMIT if shared else wanted,
                since,
                until,
                only,
            )
        except SearchUnavailable as exc:
            raise ToolError(str(exc)) from None
        hits = found.hits
        if shared:
            hits = [h for h in hits if self._shared(h.session, ctx.scope.session_key)][:wanted]
        note = found.note
        if note and not ctx.scope.is_owner:
            # The endpoint's address (a server on the owner's network) and what it said are
            # the owner's to read, not a guest's or a group's.
            note = WORDS_ONLY_NOTE
        note = f"\n({note})" if note else ""
        if not hits:
            span = _describe_span(since, until)
            return f"No matches for {query!r}{span}.{note}"
        return format_hits(hits) + note

    def _shared(self, session: str | None, own: str) -> bool:
        """Whether a hit of ``session`` (None: a memory file) is the owner's to share, or
        this chat's own."""
        from bot.memory.dream import UNATTRIBUTED  # the owner's: from before chats had keys

        if session is None or session in UNATTRIBUTED or session == own:
            return True
        return self.owner_chat is not None and self.owner_chat(session)


_BY_MEANING = (
    " Entries with the same meaning in other words are found too; each hit says whether it "
    "matched by words, meaning or both."
)


def _describe_span(since: date | None, until: date | None) -> str:
    if since and until:
        return f" between {since} and {until}"
    if since:
        return f" since {since}"
    if until:
        return f" until {until}"
    return ""
