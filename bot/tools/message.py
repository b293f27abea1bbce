"""The ``message`` tool: say something to the current chat before the turn's final answer."""

from __future__ import annotations

from typing import Any, ClassVar

from bot.tools.base import Effects, Tool, ToolContext, ToolError


class MessageTool(Tool):
    name: ClassVar[str] = "message"
    effects: ClassVar[Effects] = Effects(messages=True)
    description: ClassVar[str] = (
        "Send a message to the user in the current chat right away, e.g. a progress note "
        "during a long task. Your final answer is sent anyway; do not repeat it here."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"text": {"type": "string", "description": "The message to send"}},
        "required": ["text"],
    }

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        text: str = args["text"]
        if not text.strip():
            raise ToolError("text must not be empty")
        if ctx.send is None:
            raise ToolError("there is no chat to send to in this context")
        await ctx.send(text)
        return "Message sent"
