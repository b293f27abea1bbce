"""Where a tool's path argument really points, and whether the agent may touch it."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from bot.gate import PathPolicy, real_path
from bot.layout import within
from bot.tools.base import ToolContext, ToolError

__all__ = ["hidden_here", "path_policy", "real_path", "resolve_tool_path"]


def resolve_tool_path(raw: str, ctx: ToolContext, *, write: bool = False) -> Path:
    """Resolve a tool's path argument; refuse it when the path policy or the turn's privacy
    scope does not allow it.

    Relative paths start at ``ctx.workspace``; ``~`` is expanded. The returned path is the real
    (symlink-free) one and tools must use it, not ``raw``, so the checked path and the opened
    path are the same. With ``ctx.restrict_to_workspace`` the gate's policy decides (the
    workspace and the private temp folder for writing, also the system folders for reading;
    never the config or the state folder); without a gate, only the workspace. A turn that is
    not the owner's (``ctx.scope``) is held to the policy even without
    ``restrict_to_workspace``, and is refused the paths its scope hides (:func:`hidden_here`):
    a link inside the workspace pointing at USER.md is USER.md. Raises :class:`ToolError` for an
    empty or refused path. A concurrent process swapping a directory for a symlink between
    check and use is not caught here: the file tools check a file they opened to read again
    (:func:`hidden_here` on its descriptor's path); a write into a swapped folder is not.
    """
    if not raw or not raw.strip():
        raise ToolError("path must not be empty")
    path = Path(raw).expanduser()
    if not path.is_absolute():
        path = ctx.workspace / path
    resolved = real_path(path)
    policy = path_policy(ctx)
    if ctx.restrict_to_workspace or not ctx.scope.is_owner:
        if not policy.allows(resolved, write=write):
            where = "writable" if write else "readable"
            raise ToolError(
                f"path '{raw}' is outside the workspace ({policy.workspace}); only files inside "
                f"the workspace (and the system folders, read-only) are {where}"
            )
    refuse_hidden(raw, resolved, ctx, write=write)
    return resolved


def path_policy(ctx: ToolContext) -> PathPolicy:
    """The path policy a tool in this context keeps to: the gate's, else the workspace's."""
    return ctx.gate.policy if ctx.gate else PathPolicy(real_path(ctx.workspace))


def hidden_here(real: Path, ctx: ToolContext, *, write: bool = False) -> str | None:
    """Why the turn's privacy scope hides the real path ``real``, or None. Outside the owner's
    scope the shared temporary folder is hidden too: every chat's commands write there."""
    scope = ctx.scope
    if scope.is_owner:
        return None
    policy = path_policy(ctx)
    if policy.temp is not None and within(real, policy.temp):
        return "the temporary folder every chat shares"
    if not within(real, policy.workspace):
        return None
    return scope.hidden(PurePosixPath(real.relative_to(policy.workspace).as_posix()), write=write)


def refuse_hidden(raw: str, real: Path, ctx: ToolContext, *, write: bool = False) -> None:
    """Raise the model's error for a path the scope hides; the content is never shown."""
    why = hidden_here(real, ctx, write=write)
    if why is not None:
        what = "writable" if write else "readable"
        raise ToolError(f"not {what} in this chat: {raw} ({why})")
