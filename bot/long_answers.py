"""Answers too long for a chat: the chat gets the beginning, and the whole answer as a file.

A 10 MB reply became about 2,500 Telegram messages, and 30 MB of session file: the text went
into the final_response checkpoint, the history and the outbox entry, each in full. Past
``LONG_ANSWER_CHARS`` the whole answer is written once, to ``<state>/answers/<session>/<id>.md``
(before the checkpoint that names it, so a restart still has it), and everything else holds
``cut_text``: its first ``HEAD_CHARS`` and a note naming the file. The delivery sends that text
and then the file (``OutboundMessage.media``); a channel that cannot send files says where the
file is kept instead (channels.manager).
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from pathlib import Path

from bot.private import make_private_dirs, replace_durably

# About ten Telegram messages (twenty on Discord): past it an answer is cut.
LONG_ANSWER_CHARS = 40_000
# What the chat then shows before the note: one message on every platform but Discord's two.
HEAD_CHARS = 3_000
ANSWERS_DIR = "answers"


@dataclass(frozen=True, slots=True)
class LongAnswer:
    text: str  # the beginning and the note: what the chat shows and the history keeps
    path: Path  # the whole answer


def cut_text(text: str, name: str) -> str:
    """The first ``HEAD_CHARS`` of ``text`` (back to a line or word end when one is near) and
    a note that the whole of it, ``len(text)`` characters, is the file ``name``."""
    head = text[:HEAD_CHARS]
    for stop in ("\n", " "):
        end = head.rfind(stop)
        if end > HEAD_CHARS * 3 // 4:
            head = head[:end]
            break
    return (
        f"{head.rstrip()}\n\n[… this answer is {len(text):,} characters long; the chat shows "
        f"its beginning, and the whole answer is in the file {name} sent with it]"
    )


def answer_path(state_dir: Path, session_file: str) -> Path:
    """A new file for one answer of the session whose file is ``session_file``."""
    stem = session_file.removesuffix(".jsonl")
    return state_dir / ANSWERS_DIR / stem / f"answer-{uuid.uuid4().hex[:12]}.md"


async def spill(state_dir: Path, session_file: str, text: str) -> LongAnswer | None:
    """None when ``text`` fits a chat; else the whole of it written durably (mode 0600, fsynced
    before this returns) and the cut text naming it."""
    if len(text) <= LONG_ANSWER_CHARS:
        return None
    path = answer_path(state_dir, session_file)

    def write() -> None:
        make_private_dirs(path.parent)
        replace_durably(path, text)

    await asyncio.to_thread(write)
    return LongAnswer(cut_text(text, path.name), path)


def kept_where(path: str | Path) -> str:
    """An answer's file as a person finds it: from the answers folder of the state folder on."""
    parts = Path(path).parts
    if ANSWERS_DIR in parts:
        return "/".join(parts[len(parts) - 1 - parts[::-1].index(ANSWERS_DIR) :])
    return Path(path).name
