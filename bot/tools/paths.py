"""Where a tool's path argument really points, and whether the agent may touch it."""

from __future__ import annotations

from pathlib import Path

from bot.gate import PathPolicy, real_path
from bot.tools.base import ToolContext, ToolError

__all__ = ["real_path", "resolve_tool_path"]


def resolve_tool_path(raw: str, ctx: ToolContext, *, write: bool = False) -> Path:
    """Resolve a tool's path argument; refuse it when the path policy does not allow it.

    Relative paths start at ``ctx.workspace``; ``~`` is expanded. The returned path is the real
    (symlink-free) one and tools must use it, not ``raw``, so the checked path and the opened
    path are the same. With ``ctx.restrict_to_workspace`` the gate's policy decides (the
    workspace and the private temp folder for writing, also the system folders for reading;
    never the config or the state folder); without a gate, only the workspace. Raises
    :class:`ToolError` for an empty or refused path. A concurrent process swapping a directory
    for a symlink between check and use is out of scope: memobot's own process is not confined.
    """
    if not raw or not raw.strip():
        raise ToolError("path must not be empty")
    path = Path(raw).expanduser()
    if not path.is_absolute():
        path = ctx.workspace / path
    resolved = real_path(path)
    if ctx.restrict_to_workspace:
        policy = ctx.gate.policy if ctx.gate else PathPolicy(real_path(ctx.workspace))
        if not policy.allows(resolved, write=write):
            where = "writable" if write else "readable"
            raise ToolError(
                f"path '{raw}' is outside the workspace ({policy.workspace}); only files inside "
                f"the workspace (and the system folders, read-only) are {where}"
            )
    return resolved
