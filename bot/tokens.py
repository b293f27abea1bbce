"""Cheap token estimates, good enough for budgets: about four characters a token in English,
weighted by UTF-8 bytes elsewhere (:func:`message_size`)."""

from __future__ import annotations

import json
from typing import Any

_PER_MESSAGE_OVERHEAD = 4
SIZE_PER_TOKEN = 4  # message_size units (quarter tokens: ASCII characters) in a token


def message_size(text: str) -> int:
    """``text``'s length in quarter tokens: an ASCII character is one, any other two per UTF-8
    byte. Four characters a token holds for English only: a Chinese, Japanese or Korean
    character (3 bytes, 6 here: 1.5 tokens) or an emoji (4 bytes, 2 tokens) takes a token or
    more, and counted as a quarter the window overflowed."""
    if text.isascii():
        return len(text)
    ascii_chars = len(text.encode("ascii", "ignore"))
    return 2 * len(text.encode("utf-8", "surrogatepass")) - ascii_chars


def estimate_text_tokens(text: str) -> int:
    return -(-message_size(text) // SIZE_PER_TOKEN)


def estimate_message_tokens(message: dict[str, Any]) -> int:
    """Estimate one Chat Completions message, tool calls included."""
    total = _PER_MESSAGE_OVERHEAD
    content = message.get("content")
    if isinstance(content, str):
        total += estimate_text_tokens(content)
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                total += estimate_text_tokens(str(part.get("text", "")))
            else:
                total += 765  # an image part: roughly a high-detail tile budget
    calls = message.get("tool_calls")
    if calls:
        total += estimate_text_tokens(json.dumps(calls, ensure_ascii=False))
    reasoning = message.get("reasoning_content")
    if isinstance(reasoning, str):
        # Sent back with the calls to DeepSeek, vLLM and llama.cpp (bot.dialects); counted
        # for every dialect, so a switch of model never finds the window overfull.
        total += estimate_text_tokens(reasoning)
    return total
