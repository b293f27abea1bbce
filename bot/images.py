"""Images the model sees: sent once, in the request of the turn they arrived in (or the turn
read_file showed them in), and a short text label naming the file from then on.

A 9 MB photo is 12 MB of base64; kept in the history, it went out again with every later
request of its chat and stayed in memory with the session. So a turn holds its images as
``image_url`` parts while it runs, and what is stored (the session's messages, every
checkpoint) is ``stored_form``: the same messages without them. The text of the message
already names each image, so the stored message says what was there and how to see it again.
The first request after the turn differs from the turn's own from that message on (one
prompt-cache miss); every later request repeats the stored form byte for byte.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_INLINE_IMAGE_BYTES = 10 * 1024 * 1024
# The formats the Chat Completions API takes, by their first bytes (a name proves nothing).
_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)
SHOWN_BY_READ_FILE = "[memobot: the image(s) read_file showed, for this turn only]"


@dataclass(frozen=True, slots=True)
class ShownImage:
    """An image a tool put before the model: its label and its ``data:`` URL."""

    label: str
    url: str


def image_mime(head: bytes) -> str | None:
    """The MIME type of an image the model can be shown, from its first bytes; or None."""
    for magic, mime in _MAGIC:
        if head.startswith(magic):
            return mime
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    return None


def data_url(data: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def human_size(size: int) -> str:
    """``size`` bytes for a person: "512 B", "9.1 MB"."""
    if size < 1024:
        return f"{size} B"
    value = float(size)
    for unit in ("KB", "MB", "GB", "TB"):
        value /= 1024
        if value < 1024 or unit == "TB":
            return f"{value:.1f} {unit}"
    raise AssertionError("unreachable")


def shown_name(path: Path, workspace: Path) -> str:
    """``path`` as read_file takes it: relative to the workspace when it is inside."""
    try:
        return str(path.relative_to(workspace))
    except ValueError:
        return str(path)


def image_label(name: str, size: int | None, shown: bool) -> str:
    """The text that stands for an image in the history, from the turn it arrived on."""
    if size is None or (not shown and size <= MAX_INLINE_IMAGE_BYTES):
        return f"[image: {name}, could not be read]"
    if not shown:
        return (
            f"[image: {name}, {human_size(size)}: too large to show "
            f"(the limit is {human_size(MAX_INLINE_IMAGE_BYTES)})]"
        )
    return f"[image: {name}, {human_size(size)}; shown to you this once: read_file shows it again]"


def shown_message(images: Sequence[ShownImage]) -> dict[str, Any]:
    """The message that puts images a tool read before the model (tool results are text
    only in the Chat Completions API, so they follow the results as a user message)."""
    text = "\n".join([SHOWN_BY_READ_FILE, *(i.label for i in images)])
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}]
    parts += [{"type": "image_url", "image_url": {"url": i.url}} for i in images]
    return {"role": "user", "content": parts}


def stored_form(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` as they are stored: every ``image_url`` part left out, a message left
    with text parts only holding their text as a string. Messages without images are the
    same objects; ``messages`` itself is not changed."""
    if not any(_has_image(m) for m in messages):
        return messages
    return [_without_images(m) if _has_image(m) else m for m in messages]


def _has_image(message: dict[str, Any]) -> bool:
    content = message.get("content")
    return isinstance(content, list) and any(
        isinstance(p, dict) and p.get("type") == "image_url" for p in content
    )


def _without_images(message: dict[str, Any]) -> dict[str, Any]:
    kept = [
        p for p in message["content"] if not (isinstance(p, dict) and p.get("type") == "image_url")
    ]
    texts = [p.get("text") for p in kept if isinstance(p, dict) and p.get("type") == "text"]
    if len(texts) == len(kept) and all(isinstance(t, str) for t in texts):
        return {**message, "content": "\n".join(texts)}  # type: ignore[arg-type]
    return {**message, "content": kept}
