"""Builds what the model sees: a stable system prompt, a history window, the new user turn.

Provider prompt caches hit only on a byte-identical prefix, so everything that changes per turn
(time, channel, chat id) goes in a small runtime block at the end of the new user message, and
that message is stored exactly as sent.
"""

from __future__ import annotations

import base64
import json
import logging
import mimetypes
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, tzinfo
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bot import workspace_files
from bot.images import MAX_INLINE_IMAGE_BYTES, image_label, shown_name
from bot.memory.people import (
    FROM_PREFIX,
    Speaker,
    from_line,
    read_header,
    read_shown,
    speaker_in_block,
)
from bot.privacy import PrivacyScope, owner_scope
from bot.runner import NO_ANSWER_NOTE, interrupted_result
from bot.skills import SkillsIndex, UntrustedFiles
from bot.tokens import estimate_message_tokens, estimate_text_tokens
from bot.workspace import WORKSPACE_PROMPT_FILES

if TYPE_CHECKING:
    from bot.session import Session

log = logging.getLogger(__name__)

# After a trim the window keeps this share of its budget, so the next turns reuse one prefix
# instead of shifting it (and missing the cache) on every message.
TRIM_TO_SHARE = 0.75
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".gif", ".webp"}
_CHAT_FILES_KEPT = 256
# What goes between two messages whose roles strict chat templates refuse in a row, keyed by
# (the role before, the role after; None: the start of the conversation, after the system
# prompt). Mistral's API (mistral_common) refuses a user message right after a tool result:
# "Unexpected role 'user' after role 'tool'" (github.com/datapizza-labs/datapizza-ai/issues/98,
# github.com/zed-industries/zed/issues/37021); the Mistral templates on vLLM refuse two user
# messages in a row (github.com/vllm-project/vllm/issues/6862) and, like Gemma's on llama.cpp
# (HTTP 500, github.com/nextai-translator/raycast-openai-translator/issues/34), anything but
# user/assistant/user/... after the system prompt (github.com/microsoft/autogen/issues/3597).
# A bridge is inserted rather than the two messages merged: one rule covers every case (a
# tool result cannot be merged into a user message), every stored message is still sent as
# the same object, and the model sees that the first one got no answer.
ROLE_BRIDGES: dict[tuple[str | None, str], dict[str, str]] = {
    ("user", "user"): {"role": "assistant", "content": NO_ANSWER_NOTE},
    ("tool", "user"): {"role": "assistant", "content": NO_ANSWER_NOTE},
    (None, "assistant"): {"role": "user", "content": "[memobot: earlier messages are not shown.]"},
    ("assistant", "assistant"): {
        "role": "user",
        "content": "[memobot: no message from the person here.]",
    },
}
_BRIDGE_VALUES = list(ROLE_BRIDGES.values())
# Content part types the Chat Completions API takes, per role (what may stay a list).
CONTENT_PARTS: dict[str, frozenset[str]] = {
    "system": frozenset({"text"}),
    "user": frozenset({"text", "image_url"}),
    "assistant": frozenset({"text", "refusal"}),
    "tool": frozenset({"text"}),
}


class _CachedFile:
    __slots__ = ("key", "text")

    def __init__(self) -> None:
        self.key: tuple[int, int, int] | None = None
        self.text = ""


class ContextBuilder:
    def __init__(
        self,
        workspace: Path,
        identity: str | None = None,
        timezone: tzinfo | None = None,
        untrusted_skills: UntrustedFiles | None = None,
    ) -> None:
        """``timezone``: the zone of the time in the runtime block (``agent.timezone``);
        None is the system's current offset."""
        self.workspace = workspace
        self.timezone = timezone
        self.identity = identity or default_identity(workspace)
        self.skills = SkillsIndex(workspace, untrusted_skills)
        self._files: dict[str, _CachedFile] = {n: _CachedFile() for n in WORKSPACE_PROMPT_FILES}
        self._prompts: dict[bool, str] = {}
        self._prompt_key: str | None = None
        self._repaired: set[str] = set()  # sessions whose history was already reported
        self._chat_files: dict[str, _CachedFile] = {}  # memory/chats/<chat>.md, by path
        self._people: dict[str, _CachedFile] = {}  # memory/people/<person>.md, by path

    def _read(self, name: str) -> bool:
        """Refresh one prompt file from disk if it changed; True if it did. A link, a folder
        or anything else that is not a regular file is left out (logged once per change)."""
        entry = self._files[name]
        try:
            st = workspace_files.lstat(self.workspace, name)
            key = (st.st_mtime_ns, st.st_size, st.st_ino)
        except (FileNotFoundError, NotADirectoryError):
            st, key = None, None
        if key == entry.key:
            return False
        entry.key = key
        entry.text = ""
        if st is not None and stat.S_ISLNK(st.st_mode):
            log.warning("prompt file %s is a symlink; left out (links are never followed)", name)
        elif st is not None and not stat.S_ISREG(st.st_mode):
            log.error("prompt file %s is not a regular file (a folder?); left out", name)
        elif st is not None:
            entry.text = workspace_files.read_text_or_empty(self.workspace, name).strip()
        return True

    def _cached(
        self, cache: dict[str, _CachedFile], rel: str
    ) -> tuple[_CachedFile, tuple[int, int, int] | None]:
        """``rel``'s entry in ``cache`` (made, the oldest dropped past _CHAT_FILES_KEPT) and
        the file's state now (None when absent), to compare with the entry's key."""
        entry = cache.get(rel)
        if entry is None:
            entry = cache[rel] = _CachedFile()
            if len(cache) > _CHAT_FILES_KEPT:
                cache.pop(next(iter(cache)))
        st = workspace_files.file_stat(self.workspace, rel)
        return entry, None if st is None else (st.st_mtime_ns, st.st_size, st.st_ino)

    def _chat_memory(self, rel: str) -> str:
        """The section of one chat's memory file ("" when it has none); re-read only when
        the file changed, so the prompt stays byte-identical between turns."""
        entry, key = self._cached(self._chat_files, rel)
        if key != entry.key:
            entry.key = key
            text = workspace_files.read_text_or_empty(self.workspace, rel).strip() if key else ""
            entry.text = (
                f"\n\n---\n\n## What you remember about this chat\n\n{text}" if text else ""
            )
        return entry.text

    def _person_memory(self, person: Speaker) -> str:
        """The section telling the model whose turn it is and what their own file holds,
        re-read only when the file changed (bot.memory.people)."""
        rel = person.file
        entry, key = self._cached(self._people, rel)
        if key != entry.key or person.shown not in entry.text:
            entry.key = key
            text = read_shown(self.workspace, rel) if key else ""
            if read_header(text) is not None:
                text = text.split("\n", 1)[1] if "\n" in text else ""
            text = text.strip() or "(nothing yet)"
            entry.text = (
                f"\n\n---\n\n## The person writing now: {person.shown}\n\n"
                f"What you remember about them is their own memory file, {rel}; it is theirs "
                "alone. When they ask you to remember something about themselves, add it "
                "there with your file tools, one short line per fact (never in USER.md, which "
                "is your owner's, and never in another person's file; without file tools here, "
                "it is remembered from the conversation later); what others say about them "
                f"does not go there.\n\n{text}"
            )
        return entry.text

    def system_prompt(self, scope: PrivacyScope | None = None) -> str:
        """Identity, the workspace's instruction and memory files, and the skills list.

        ``scope`` (default: the owner's) decides which prompt files go in: a group or a
        non-admin's private chat gets no USER.md or memory/MEMORY.md unless its scope shares
        the owner's memory. Only stat calls happen while nothing changed, and the same string
        is returned.
        """
        scope = scope or owner_scope("")
        changed = False
        for name in self._files:
            changed |= self._read(name)
        skills = self.skills.summary()
        if changed or skills != self._prompt_key:
            self._prompts.clear()
            self._prompt_key = skills
        # Two variants at most: with and without the owner's memory.
        variant = scope.owner_memory
        prompt = self._prompts.get(variant)
        if prompt is None:
            parts = [self.identity]
            for name, entry in self._files.items():
                if entry.text and scope.shows_prompt_file(name):
                    parts.append(f"## {name}\n\n{entry.text}")
            if skills:
                parts.append(
                    "## Skills\n\nRead a skill's SKILL.md with read_file before using it.\n\n"
                    + skills
                )
            prompt = self._prompts[variant] = "\n\n---\n\n".join(parts)
        return prompt

    def user_message(
        self,
        text: str,
        channel: str,
        chat_id: str,
        media: Sequence[str] = (),
        now: datetime | None = None,
        speaker: Speaker | None = None,
    ) -> dict[str, Any]:
        """The person's message as sent in this turn: its images inlined after a text that
        names each one, which is all the stored form (``bot.images.stored_form``) keeps.
        ``speaker``: who wrote it, named in the runtime block (a chat that is not the
        owner's: the model and, from the history, Dream tell people apart by it)."""
        if now is None and self.timezone is not None:
            now = datetime.now(self.timezone)
        if speaker is not None:
            text = as_typed(text)
        content = text + "\n\n" + runtime_block(channel, chat_id, now, speaker)
        images = [p for p in media if Path(p).suffix.lower() in IMAGE_SUFFIXES]
        others = [p for p in media if p not in images]
        if others:
            content += "\n[attached files: " + ", ".join(others) + "]"
        if not images:
            return {"role": "user", "content": content}
        urls: list[str] = []
        labels: list[str] = []
        for p in images:
            url = _image_data_url(self.workspace, Path(p))
            st = workspace_files.file_stat(self.workspace, p)
            size = None if st is None else st.st_size
            labels.append(image_label(shown_name(Path(p), self.workspace), size, bool(url)))
            if url:
                urls.append(url)
        parts: list[dict[str, Any]] = [{"type": "text", "text": "\n".join([content, *labels])}]
        parts += [{"type": "image_url", "image_url": {"url": url}} for url in urls]
        return {"role": "user", "content": parts}

    def history(self, session: Session, budget_tokens: int) -> list[dict[str, Any]]:
        """The unconsolidated tail that fits ``budget_tokens``, never opening on a tool result."""
        start = session.rel(max(session.last_consolidated, session.window_start))
        total = sum(session.tokens[start:])
        if total > budget_tokens:
            start = trim_start(
                session.wire, session.tokens, start, int(budget_tokens * TRIM_TO_SHARE)
            )
            session.window_start = session.base + start
        return session.wire[start:]

    def build(
        self,
        session: Session,
        turn: list[dict[str, Any]],
        context_window: int,
        max_tokens: int,
        tools_tokens: int = 0,
        scope: PrivacyScope | None = None,
        chat_memory: str | None = None,
        person: Speaker | None = None,
    ) -> list[dict[str, Any]]:
        """``chat_memory``: the workspace path of this chat's own memory file (a chat that is
        not the owner's: Dream keeps its facts there, bot.memory.dream), added to the prompt.
        ``person``: the speaker whose own memory file (bot.memory.people) this turn shows,
        last, after the chat's (in a group, the part that changes with the speaker)."""
        system = self.system_prompt(scope)
        if chat_memory:
            system += self._chat_memory(chat_memory)
        if person is not None:
            system += self._person_memory(person)
        fixed = estimate_text_tokens(system) + tools_tokens + max_tokens
        fixed += sum(estimate_message_tokens(m) for m in turn)
        budget = max(0, context_window - fixed)
        history = self.history(session, budget)
        prefix, done, repaired = self._clean_prefix(session, history)
        rest = [*history[done:], *turn]
        messages = api_messages(rest, last_role(prefix))
        repaired = repaired or _changed(rest, messages)
        messages = prefix + messages
        if session.key not in self._repaired and repaired:
            self._repaired.add(session.key)
            _report_repair(session.key, [*history, *turn])
        return [{"role": "system", "content": system}, *messages]

    def _clean_prefix(
        self, session: Session, history: list[dict[str, Any]]
    ) -> tuple[list[dict[str, Any]], int, bool]:
        """``api_messages`` of ``history`` up to its last user message, kept per session:
        (that prefix, how many history messages it covers, whether it was repaired).

        A user message ends every tool-call group before it, so the API form of the history
        is the form of the part before it followed by the form of the part from it on (given
        the role the part before ends with); the part before is worked out once, not again on
        every model call of every turn.
        """
        start = session.count - len(history)
        cached = session.api_prefix
        if isinstance(cached, _CleanPrefix) and cached.start == start:
            out, done, repaired = cached.out, cached.end - start, cached.repaired
        else:
            out, done, repaired = [], 0, False
        last_user = next(
            (i for i in range(len(history) - 1, done, -1) if history[i].get("role") == "user"),
            done,
        )
        if last_user > done:
            part = history[done:last_user]
            cleaned = api_messages(part, last_role(out))
            out = out + cleaned
            repaired = repaired or _changed(part, cleaned)
            done = last_user
            session.api_prefix = _CleanPrefix(start, start + done, out, repaired)
        return out, done, repaired


@dataclass(slots=True)
class _CleanPrefix:
    start: int  # message number of the window's first message
    end: int  # message number after the last one covered
    out: list[dict[str, Any]]
    repaired: bool


def _report_repair(key: str, raw: list[dict[str, Any]]) -> None:
    """Log, once per session, that its history is sent repaired, and how."""
    if only_bridged(raw, api_messages(raw)):
        # Nothing lost: an earlier memobot's failed turn, or a reminder sent into the chat.
        log.info(
            "session %s: history has roles in an order strict chat templates refuse (two "
            "user or assistant messages in a row, a user message after a tool result, an "
            "assistant message first); sending it with memobot notes between them",
            key,
        )
        return
    log.warning(
        "session %s: history is not valid for the API (orphan tool results, unanswered "
        "tool calls, unknown roles or non-text content); sending a repaired copy",
        key,
    )


def _changed(raw: list[dict[str, Any]], cleaned: list[dict[str, Any]]) -> bool:
    return len(cleaned) != len(raw) or any(a is not b for a, b in zip(cleaned, raw, strict=True))


def trim_start(wire: list[dict[str, Any]], tokens: list[int], start: int, budget: int) -> int:
    """The first index from which the tail fits ``budget``, moved to a safe message boundary.

    A window must not open on a tool result whose assistant call was cut off; it opens on a
    user message when the tail has one, as strict chat templates want the conversation to
    begin (when it has none, one turn fills the window: it opens on an assistant message,
    and ``api_messages`` puts a note before it).
    """
    total = 0
    i = len(tokens)
    while i > start and total + tokens[i - 1] <= budget:
        i -= 1
        total += tokens[i]
    for j in range(i, len(wire)):
        if wire[j].get("role") == "user":
            return j
    while i < len(wire) and wire[i].get("role") == "tool":
        i += 1
    return i


def api_messages(messages: Sequence[Any], after: str | None = None) -> list[dict[str, Any]]:
    """``messages`` as the Chat Completions API accepts them; a pure function.

    Unknown roles and non-objects are dropped; tool results that answer no call of the
    assistant message right before them are dropped; tool calls left without a result get the
    'interrupted' result a restored turn gets; content the API refuses becomes text; malformed
    tool calls are dropped. A valid message is returned as the same object, untouched, so a
    valid history gives a byte-identical request prefix turn after turn; the input is never
    modified.

    Roles also alternate as strict chat templates require (``ROLE_BRIDGES``): where a history
    has a user message right after a user or tool message, or an assistant message first or
    right after another, a memobot note of the missing role goes between them. ``after``: the
    role of the message before ``messages`` (None: they open the conversation, after the
    system prompt), so that a history cleaned in parts comes out as if cleaned whole.
    """
    out: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []  # the tool calls of the last assistant message
    awaiting: set[str] = set()  # the ids of those not yet answered
    last = after  # the role of the last message in ``out`` (system messages aside)
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in CONTENT_PARTS:
            continue
        role = m["role"]
        if role == "tool":
            call_id = m.get("tool_call_id")
            if not isinstance(call_id, str) or call_id not in awaiting:
                continue  # an orphan, or a second answer to one call
            awaiting.discard(call_id)
            out.append(_with_api_content(m, role, False))
            last = role
            continue
        if awaiting:
            out.extend(interrupted_result(c) for c in calls if c["id"] in awaiting)
            awaiting = set()
            last = "tool"
        if role != "system":
            bridge = ROLE_BRIDGES.get((last, role))
            if bridge is not None:
                out.append(dict(bridge))
            last = role
        fixed = m
        if "tool_calls" in m:
            calls = _valid_calls(m.get("tool_calls")) if role == "assistant" else []
            if calls is not m.get("tool_calls"):
                fixed = {k: v for k, v in m.items() if k != "tool_calls"}
                if calls:
                    fixed["tool_calls"] = calls
            awaiting = {c["id"] for c in calls}
        out.append(_with_api_content(fixed, role, bool(awaiting)))
    if awaiting:
        out.extend(interrupted_result(c) for c in calls if c["id"] in awaiting)
    return out


def last_role(messages: Sequence[dict[str, Any]]) -> str | None:
    """The role of the last message that is not a system message (``api_messages``'s
    ``after`` for what follows them); None when there is none."""
    for m in reversed(messages):
        if m.get("role") != "system":
            return str(m.get("role"))
    return None


def only_bridged(raw: Sequence[Any], cleaned: list[dict[str, Any]]) -> bool:
    """Whether ``cleaned`` (``api_messages(raw)``) is ``raw`` with role bridges put in and
    nothing else changed: a history in the wrong order, not a damaged one."""
    i = 0
    for m in cleaned:
        if i < len(raw) and m is raw[i]:
            i += 1
        elif m not in _BRIDGE_VALUES:
            return False
    return i == len(raw)


def _valid_calls(calls: Any) -> list[dict[str, Any]]:
    """The well-formed tool calls (``calls`` itself when all are), unique ids, in order."""
    if not isinstance(calls, list):
        return []
    good: list[dict[str, Any]] = []
    ids: set[str] = set()
    for c in calls:
        fn = c.get("function") if isinstance(c, dict) else None
        if (
            isinstance(fn, dict)
            and isinstance(c.get("id"), str)
            and c["id"]
            and c["id"] not in ids
            and c.get("type", "function") == "function"
            and isinstance(fn.get("name"), str)
            and isinstance(fn.get("arguments"), str)
        ):
            good.append(c)
            ids.add(c["id"])
    return calls if len(good) == len(calls) else good


def _with_api_content(m: dict[str, Any], role: str, has_calls: bool) -> dict[str, Any]:
    content = m.get("content")
    if isinstance(content, str) or (content is None and has_calls):
        return m
    if (
        isinstance(content, list)
        and content
        and all(_valid_part(p, CONTENT_PARTS[role]) for p in content)
    ):
        return m
    return {**m, "content": content_as_text(content)}


def _valid_part(part: Any, types: frozenset[str]) -> bool:
    if not isinstance(part, dict) or part.get("type") not in types:
        return False
    kind = part["type"]
    if kind == "image_url":
        image = part.get("image_url")
        return isinstance(image, dict) and isinstance(image.get("url"), str)
    return isinstance(part.get(kind), str)  # "text": str, "refusal": str


def content_as_text(content: Any) -> str:
    """Any JSON value as message text: the text parts of a list, or the JSON itself."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content:
        texts = [p.get("text") for p in content if isinstance(p, dict)]
        if len(texts) == len(content) and all(isinstance(t, str) for t in texts):
            return "\n".join(texts)  # type: ignore[arg-type]
    return json.dumps(content, ensure_ascii=False)


RUNTIME_HEAD = "[runtime context: metadata, not an instruction]"
_FROM_LINE = re.compile("^" + re.escape(FROM_PREFIX), re.MULTILINE)


def runtime_block(
    channel: str, chat_id: str, now: datetime | None = None, speaker: Speaker | None = None
) -> str:
    now = (now or datetime.now().astimezone()).replace(microsecond=0)
    block = (
        f"{RUNTIME_HEAD}\n"
        f"time: {now.strftime('%Y-%m-%d %H:%M %Z (%A)')}\n"
        f"channel: {channel}\nchat: {chat_id}"
    )
    return block + ("\n" + from_line(speaker) if speaker is not None else "")


def as_typed(text: str) -> str:
    """A person's text in a chat where several people write, with nothing in it that reads
    as memobot's runtime block: its head and its ``from:`` line are memobot's words alone.
    (A copy naming someone else as the writer had the model, the summary and so Dream
    credit that person with what the writer typed.)"""
    text = text.replace(RUNTIME_HEAD, "[runtime context as typed by the person]")
    return _FROM_LINE.sub("from (as typed by the person): ", text)


def speaker_of(message: dict[str, Any]) -> Speaker | None:
    """Who wrote a stored user message, as its runtime block names them (None: the owner, a
    message from before speakers were named, or not a user message)."""
    if message.get("role") != "user":
        return None
    text = content_as_text(message.get("content"))
    cut = text.rfind("\n\n" + RUNTIME_HEAD)
    return None if cut == -1 else speaker_in_block(text[cut + 2 :])


def said_by_person(text: str) -> str:
    """What the person wrote, from a stored user message's text: without the runtime block
    and the attachment lines after it."""
    cut = text.rfind("\n\n" + RUNTIME_HEAD)
    return text[:cut] if cut != -1 else text


def default_identity(workspace: Path) -> str:
    return (
        "# memobot\n\n"
        "You are memobot, a personal assistant that people reach through chat apps and a "
        "terminal. You can work with files and run commands inside your workspace with your "
        f"tools. Your workspace is {workspace}. Answer in the person's language, be concise, "
        "and say plainly when you are unsure or a tool failed. Each user message ends with a "
        "runtime context block (time, channel, chat); it is information from memobot, not from "
        "the person."
    )


def _image_data_url(workspace: Path, path: Path) -> str | None:
    """The image as a data URL; None when it is too big, absent, outside the workspace or
    reached through a link (media files live in the workspace, which the model writes)."""
    try:
        data = workspace_files.read_bytes(workspace, path, limit=MAX_INLINE_IMAGE_BYTES + 1)
    except OSError:
        return None
    if len(data) > MAX_INLINE_IMAGE_BYTES:
        return None
    mime = mimetypes.guess_type(path.name)[0] or "image/png"
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"
