"""Where a tool's path argument really points, and whether the agent may touch it."""

from __future__ import annotations

import os
from pathlib import Path

from bot.tools.base import ToolContext, ToolError


def real_path(path: Path) -> Path:
    """The symlink-free absolute path the kernel would reach through ``path``.

    Every existing component is resolved, symlinks included; a dangling symlink is followed to
    the path it names; components that do not exist yet are appended as written. The ``..``
    components are applied to the already-resolved prefix, so ``link/..`` means the parent of
    the link's target, as it does for the kernel.
    """
    # Non-strict realpath walks to the nearest existing ancestor and resolves it strictly;
    # unlike strict mode it also follows dangling links, which is what a write would do.
    return Path(os.path.realpath(path))


def resolve_tool_path(raw: str, ctx: ToolContext) -> Path:
    """Resolve a tool's path argument; refuse it when it leaves a restricted workspace.

    Relative paths start at ``ctx.workspace``; ``~`` is expanded. The returned path is the real
    (symlink-free) one and tools must use it, not ``raw``, so the checked path and the opened
    path are the same. Raises :class:`ToolError` for an empty path or, with
    ``ctx.restrict_to_workspace``, for any path whose real location is outside the workspace.
    A concurrent process swapping a directory for a symlink between check and use is out of
    scope: the service's sandbox is the real boundary.
    """
    if not raw or not raw.strip():
        raise ToolError("path must not be empty")
    path = Path(raw).expanduser()
    if not path.is_absolute():
        path = ctx.workspace / path
    resolved = real_path(path)
    if ctx.restrict_to_workspace:
        workspace = real_path(ctx.workspace)
        if not resolved.is_relative_to(workspace):
            raise ToolError(
                f"path '{raw}' is outside the workspace ({workspace}); "
                "only files inside the workspace can be used"
            )
    return resolved
