"""The ``spawn`` tool: start a background task (``bot.tasks``), with nanobot's arguments.

``wait: false`` (the default) answers at once with the task's id; its result is told in this
chat when it ends. ``wait: true`` returns the result to this turn, within ``WAIT_SECONDS`` at
most (after that the task goes on and reports to the chat as any task).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from bot.gate.question import marked_invisible
from bot.tools.base import Effects, Tool, ToolContext, ToolError

if TYPE_CHECKING:
    from bot.tasks import TaskBoard

WAIT_SECONDS = 600.0
LABEL_CHARS = 60


class SpawnTool(Tool):
    name: ClassVar[str] = "spawn"
    # It starts lasting work; the task's own calls go through the gate as any turn's, with
    # this turn's tools and scope at most. Resumable: run again for the same call (a turn
    # resumed after a crash), it returns the task that call started, never a second one.
    effects: ClassVar[Effects] = Effects(side_effects=True, resumable=True)
    description: ClassVar[str] = (
        "Start a background task: another run of you with the same tools, working on `task` "
        "on its own (it does not see this conversation: put everything it needs in `task`). "
        "wait=false (default): returns at once and the task's result is posted in this chat "
        "when it ends. wait=true: waits for the result and returns it here. A task cannot "
        "start tasks."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "task": {"type": "string", "description": "what to do, with everything it needs"},
            "label": {"type": "string", "description": "a short name shown in /tasks"},
            "wait": {"type": "boolean", "description": "wait for the result (default false)"},
        },
        "required": ["task"],
    }

    def __init__(self, board: TaskBoard, wait_seconds: float = WAIT_SECONDS) -> None:
        self.board = board
        self.wait_seconds = wait_seconds

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        from bot.tasks import CHANNEL

        if ctx.channel == CHANNEL:
            raise ToolError("a background task cannot start background tasks")
        if ctx.sender is None or not ctx.session_key:
            raise ToolError("background tasks are started in a chat, for its sender")
        # A lone surrogate (JSON's "\ud800") is no text a session file can hold.
        text = str(args["task"]).encode("utf-8", "replace").decode("utf-8").strip()
        if not text:
            raise ToolError("task must not be empty")
        label = str(args.get("label") or text).encode("utf-8", "replace").decode("utf-8")
        # Shown in /tasks, reports and `memobot tasks` (a terminal): a bidi override or an
        # escape the model wrote shows by its code point, never reorders or hides the line.
        label = marked_invisible(" ".join(label.split())[:LABEL_CHARS])
        wait = bool(args.get("wait"))
        offered = ctx.extra.get("offered")
        model = ctx.extra.get("model")
        started = await self.board.start(
            ctx.session_key,
            ctx.sender,
            text,
            label,
            ctx.scope,
            None if offered is None else set(offered),
            wait,
            model=model if isinstance(model, str) else None,
            # This call, run again by a resumed turn, gets its task back (bot.tasks).
            call=f"{ctx.turn_id}/{ctx.call_id}" if ctx.turn_id and ctx.call_id else "",
        )
        if isinstance(started, str):
            raise ToolError(started)
        if started.state != "running":  # started by this call before a restart, ended since
            again = await self.board.result_again(started) if wait else None
            if again is not None:
                return again  # handed to this turn once, lost by the crash before it was kept
            return (
                f"task {started.id} ({started.label}) was started by this call before memobot "
                f"restarted and has ended ({started.state}); its result was posted in this chat."
            )
        if not wait:
            return (
                f"started task {started.id}: {label}. Its result will be posted in this chat "
                f"when it ends (/tasks lists it, /stop {started.id} stops it)."
            )
        result = await self.board.wait(started.id, self.wait_seconds)
        if result is None:
            return (
                f"task {started.id} ({label}) is still running after {self.wait_seconds:g} s; "
                "its result will be posted in this chat when it ends."
            )
        return result
