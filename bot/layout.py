"""The folder layout that keeps the agent out of memobot's own files (DESIGN.md section 3).

The workspace is the agent's: its file tools and shell may read and rewrite anything in it. So
the state folder (every chat's transcript and checkpoints) must not lie inside it, the workspace
must not lie inside the state folder, and the config file (keys, tokens, allowFrom) must not lie
inside the workspace. Paths are compared as the kernel sees them: symlinks resolved, ``..``
applied; a path that does not exist yet is resolved as far as it exists.
"""

from __future__ import annotations

import os
from pathlib import Path


def real_path(path: Path | str) -> Path:
    """The symlink-free absolute path the kernel would reach through ``path``.

    Every existing component is resolved, symlinks included; a dangling symlink is followed to
    the path it names; components that do not exist yet are appended as written; ``..`` applies
    to the already-resolved prefix, as it does for the kernel.
    """
    return Path(os.path.realpath(path))


def within(inner: Path, outer: Path) -> bool:
    """``inner`` is ``outer`` or lies inside it (both real paths)."""
    return inner == outer or inner.is_relative_to(outer)


def layout_problem(workspace: Path, state_dir: Path, config_path: Path) -> str | None:
    """One line naming the paths and the reason when the layout lets the agent reach memobot's
    own files; None when it is safe."""
    ws, state, config = (real_path(p.expanduser()) for p in (workspace, state_dir, config_path))
    # The config first: a state folder kept beside it (onboard's default) is then inside the
    # workspace too, and moving the config is what fixes both.
    if within(config, ws):
        return (
            f"the config file {config} is inside agent.workspace {ws}: the agent's tools "
            "could read its keys and rewrite allowFrom. Move the config file out of the "
            "workspace."
        )
    if ws == state:
        return (
            f"agent.workspace and agent.stateDir are the same folder {ws}: the agent's tools "
            "could read and rewrite every chat's transcript. Give them separate folders."
        )
    if within(state, ws):
        return (
            f"agent.stateDir {state} is inside agent.workspace {ws}: the agent's tools could "
            "read and rewrite every chat's transcript. Move the state folder out of the "
            "workspace."
        )
    if within(ws, state):
        return (
            f"agent.workspace {ws} is inside agent.stateDir {state}: the agent's tools could "
            "read and rewrite every chat's transcript. Move the workspace out of the state "
            "folder."
        )
    return None
