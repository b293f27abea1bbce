"""The message tool sends through ctx.send, the way the agent loop wires it."""

from __future__ import annotations

import json
from pathlib import Path

from bot.tools.base import ToolContext, ToolRegistry
from bot.tools.message import MessageTool


def registry() -> ToolRegistry:
    reg = ToolRegistry()
    reg.register(MessageTool())
    return reg


async def test_message_is_sent_to_the_current_chat(tmp_path: Path) -> None:
    sent: list[str] = []

    async def send(text: str) -> None:
        sent.append(text)

    ctx = ToolContext(workspace=tmp_path, channel="telegram", chat_id="42", send=send)
    out = await registry().execute("message", json.dumps({"text": "Working on it…"}), ctx)
    assert out == "Message sent"
    assert sent == ["Working on it…"]


async def test_message_without_a_chat_is_an_error(tmp_path: Path) -> None:
    out = await registry().execute("message", '{"text": "hi"}', ToolContext(workspace=tmp_path))
    assert out == "Error: there is no chat to send to in this context"


async def test_empty_or_missing_text_is_an_error(tmp_path: Path) -> None:
    sent: list[str] = []

    async def send(text: str) -> None:
        sent.append(text)

    ctx = ToolContext(workspace=tmp_path, send=send)
    assert await registry().execute("message", '{"text": "  "}', ctx) == (
        "Error: text must not be empty"
    )
    assert await registry().execute("message", "{}", ctx) == (
        "Error: missing required argument 'text'"
    )
    assert sent == []


async def test_a_failing_send_becomes_an_error_result(tmp_path: Path) -> None:
    async def send(text: str) -> None:
        raise ConnectionError("platform down")

    ctx = ToolContext(workspace=tmp_path, send=send)
    out = await registry().execute("message", '{"text": "hi"}', ctx)
    assert out.startswith("Error: message failed unexpectedly: ConnectionError: platform down")
