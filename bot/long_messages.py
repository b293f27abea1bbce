"""Messages too long for the model: the model gets the beginning and the end, the workspace
the whole text.

A 1 MB piped message went to the model whole against a 65,536-token window: the provider
refused it for length, on every retry. Past ``message_char_limit`` (half of what the window
leaves after the answer, so history, tools and tool results still have room) the whole
message is written once into the chat's own media folder (``bot.workspace.chat_media_dir``,
which the chat's privacy scope may read), and the model gets ``cut_message``: the head, a
marker naming the file and how much was left out, and the tail. The person is told.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath

from bot.tokens import SIZE_PER_TOKEN, message_size
from bot.workspace import chat_media_dir

# What a message may take of the window left after the answer (``llm.maxTokens``).
MESSAGE_SHARE = 0.5
MIN_MESSAGE_CHARS = 2_000
# Of what is kept, the beginning gets this share and the end the rest.
HEAD_SHARE = 0.75
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def message_char_limit(context_window: int, max_tokens: int) -> int:
    """The longest user message (in ASCII characters, see :func:`message_size`) sent whole
    to a model with this window."""
    room = max(0, context_window - max_tokens)
    return max(MIN_MESSAGE_CHARS, int(room * MESSAGE_SHARE) * SIZE_PER_TOKEN)


def _fitting(text: str, budget: int, *, from_end: bool) -> str:
    """The longest head (or tail) of ``text`` whose :func:`message_size` is within ``budget``."""
    lo, hi = 0, min(len(text), budget)  # every character counts at least one
    while lo < hi:
        mid = (lo + hi + 1) // 2
        part = text[len(text) - mid :] if from_end else text[:mid]
        if message_size(part) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return (text[len(text) - lo :] if lo else "") if from_end else text[:lo]


def message_file(channel: str, chat_id: str, message_id: str) -> PurePosixPath:
    """Where the whole of one long message is kept, relative to the workspace. Named after
    the message id, so a turn started again after a crash writes the same file."""
    name = _UNSAFE.sub("_", message_id) or "message"
    return chat_media_dir(channel, chat_id) / f"message-{name}.txt"


def cut_message(text: str, limit: int, kept_in: str) -> str:
    """``text`` cut to about ``limit`` characters: its head and tail (back to a line or
    word end when one is near) around a marker saying how much is left out and where the
    whole text is. ``text`` itself when it fits. ``limit`` and the fit are in
    :func:`message_size`."""
    if message_size(text) <= limit:
        return text
    keep = max(0, limit - 400)  # the marker's own room
    head = _to_break(_fitting(text, int(keep * HEAD_SHARE), from_end=False), from_end=False)
    tail = _to_break(_fitting(text, keep - int(keep * HEAD_SHARE), from_end=True), from_end=True)
    left_out = len(text) - len(head) - len(tail)
    marker = (
        f"[… memobot: this message is {len(text):,} characters long, too long for the model's "
        f"context window; {left_out:,} characters in the middle are left out here. The whole "
        f"message is the workspace file {kept_in}: read it with the file tools for the "
        "part left out.]"
    )
    return f"{head.rstrip()}\n\n{marker}\n\n{tail.lstrip()}"


def too_long_notice(length: int, kept: int, kept_in: str) -> str:
    """What the person is told when their message was cut for the model."""
    return (
        f"Your message is {length:,} characters long, more than the model can read at once: it "
        f"gets the beginning and the end ({kept:,} characters). The whole message is saved in "
        f"the workspace as {kept_in}, and the model can read it from there."
    )


def _to_break(part: str, *, from_end: bool) -> str:
    """``part`` shortened to a line or word boundary near its cut end, when one is near."""
    window = len(part) // 4
    for stop in ("\n", " "):
        if from_end:
            at = part.find(stop)
            if 0 <= at < window:
                return part[at + 1 :]
        else:
            at = part.rfind(stop)
            if at > len(part) - window:
                return part[:at]
    return part
