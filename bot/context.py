"""Builds what the model sees: a stable system prompt, a history window, the new user turn.

Provider prompt caches hit only on a byte-identical prefix, so everything that changes per turn
(time, channel, chat id) goes in a small runtime block at the end of the new user message, and
that message is stored exactly as sent.
"""

from __future__ import annotations

import base64
import mimetypes
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bot.skills import SkillsIndex
from bot.tokens import estimate_message_tokens, estimate_text_tokens
from bot.workspace import WORKSPACE_PROMPT_FILES

if TYPE_CHECKING:
    from bot.session import Session

# After a trim the window keeps this share of its budget, so the next turns reuse one prefix
# instead of shifting it (and missing the cache) on every message.
TRIM_TO_SHARE = 0.75
PRIVATE_FILES = frozenset({"USER.md", "memory/MEMORY.md"})
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".gif", ".webp"}
MAX_INLINE_IMAGE_BYTES = 10 * 1024 * 1024


class _CachedFile:
    __slots__ = ("key", "text")

    def __init__(self) -> None:
        self.key: tuple[int, int] | None = None
        self.text = ""


class ContextBuilder:
    def __init__(
        self, workspace: Path, identity: str | None = None, share_in_groups: bool = False
    ) -> None:
        self.workspace = workspace
        self.identity = identity or default_identity(workspace)
        self.skills = SkillsIndex(workspace)
        self._files: dict[str, _CachedFile] = {n: _CachedFile() for n in WORKSPACE_PROMPT_FILES}
        self.share_in_groups = share_in_groups
        self._prompts: dict[bool, str] = {}
        self._prompt_key: str | None = None

    def _read(self, name: str) -> bool:
        """Refresh one prompt file from disk if its mtime or size changed; True if it did."""
        entry = self._files[name]
        path = self.workspace / name
        try:
            st = path.stat()
            key = (st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            key = None
        if key == entry.key:
            return False
        entry.key = key
        entry.text = path.read_text(encoding="utf-8", errors="replace").strip() if key else ""
        return True

    def system_prompt(self, private: bool = True) -> str:
        """Identity, the workspace's instruction and memory files, and the skills list.

        ``private`` False (a group chat) leaves out USER.md and memory/MEMORY.md unless
        ``share_in_groups``: what the assistant knows about its owner is not for everyone.
        Only stat calls happen while nothing changed, and the same string is returned.
        """
        changed = False
        for name in self._files:
            changed |= self._read(name)
        skills = self.skills.summary()
        if changed or skills != self._prompt_key:
            self._prompts.clear()
            self._prompt_key = skills
        variant = private or self.share_in_groups
        prompt = self._prompts.get(variant)
        if prompt is None:
            parts = [self.identity]
            for name, entry in self._files.items():
                if entry.text and (variant or name not in PRIVATE_FILES):
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
    ) -> dict[str, Any]:
        content = text + "\n\n" + runtime_block(channel, chat_id, now)
        images = [p for p in media if Path(p).suffix.lower() in IMAGE_SUFFIXES]
        others = [p for p in media if p not in images]
        if others:
            content += "\n[attached files: " + ", ".join(others) + "]"
        if not images:
            return {"role": "user", "content": content}
        parts: list[dict[str, Any]] = [{"type": "text", "text": content}]
        for p in images:
            url = _image_data_url(Path(p))
            if url:
                parts.append({"type": "image_url", "image_url": {"url": url}})
        return {"role": "user", "content": parts}

    def history(self, session: Session, budget_tokens: int) -> list[dict[str, Any]]:
        """The unconsolidated tail that fits ``budget_tokens``, never opening on a tool result."""
        start = max(session.last_consolidated, session.window_start)
        total = sum(session.tokens[start:])
        if total > budget_tokens:
            start = trim_start(
                session.wire, session.tokens, start, int(budget_tokens * TRIM_TO_SHARE)
            )
            session.window_start = start
        return session.wire[start:]

    def build(
        self,
        session: Session,
        turn: list[dict[str, Any]],
        context_window: int,
        max_tokens: int,
        tools_tokens: int = 0,
        private: bool = True,
    ) -> list[dict[str, Any]]:
        system = self.system_prompt(private)
        fixed = estimate_text_tokens(system) + tools_tokens + max_tokens
        fixed += sum(estimate_message_tokens(m) for m in turn)
        budget = max(0, context_window - fixed)
        return [{"role": "system", "content": system}, *self.history(session, budget), *turn]


def trim_start(wire: list[dict[str, Any]], tokens: list[int], start: int, budget: int) -> int:
    """The first index from which the tail fits ``budget``, moved to a safe message boundary.

    A window must not open on a tool result whose assistant call was cut off; it prefers to
    open on a user message.
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


def runtime_block(channel: str, chat_id: str, now: datetime | None = None) -> str:
    now = (now or datetime.now().astimezone()).replace(microsecond=0)
    return (
        "[runtime context: metadata, not an instruction]\n"
        f"time: {now.strftime('%Y-%m-%d %H:%M %Z (%A)')}\n"
        f"channel: {channel}\nchat: {chat_id}"
    )


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


def _image_data_url(path: Path) -> str | None:
    try:
        if path.stat().st_size > MAX_INLINE_IMAGE_BYTES:
            return None
        data = path.read_bytes()
    except OSError:
        return None
    mime = mimetypes.guess_type(path.name)[0] or "image/png"
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"
