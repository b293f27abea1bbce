"""The agent's tools and the default set the daemon registers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from bot.config import ToolsConfig
from bot.memory.hybrid import Embeddings
from bot.memory.search import MemoryIndex
from bot.tools.base import Tool, ToolContext, ToolError, ToolRegistry
from bot.tools.filesystem import EditFileTool, ListDirTool, ReadFileTool, WriteFileTool
from bot.tools.memory_search import MemorySearchTool
from bot.tools.message import MessageTool
from bot.tools.search import WebSearchTool
from bot.tools.shell import ExecTool
from bot.tools.web import WebFetchTool

__all__ = [
    "SWITCHABLE",
    "Tool",
    "ToolContext",
    "ToolError",
    "ToolRegistry",
    "build_default_tools",
    "switch_builtins",
]

# The built-in tools the config turns on or off: ``tools.<section>.enabled`` and the tools
# that section brings.
SWITCHABLE: dict[str, tuple[str, ...]] = {
    "exec": ("exec",),
    "web": ("web_fetch", "web_search"),
}


def _switchable(cfg_tools: ToolsConfig, section: str) -> list[Tool]:
    if section == "exec":
        return [ExecTool(cfg_tools.exec)]
    return [WebFetchTool(cfg_tools.web), WebSearchTool(cfg_tools.web)]


def switch_builtins(registry: ToolRegistry, cfg_tools: ToolsConfig) -> list[str]:
    """Register or take away the switchable built-ins as ``cfg_tools`` says now (a reload);
    what changed (``+exec``, ``-web_fetch``)."""
    changed = []
    for section, names in SWITCHABLE.items():
        on = getattr(cfg_tools, section).enabled
        for tool in _switchable(cfg_tools, section) if on else ():
            if registry.get(tool.name) is None:
                registry.register(tool)
                changed.append("+" + tool.name)
        for name in names if not on else ():
            if registry.unregister(name):
                changed.append("-" + name)
    return changed


def build_default_tools(
    cfg_tools: ToolsConfig,
    workspace: Path | None = None,
    state_dir: Path | None = None,
    owner_chat: Callable[[str], bool] | None = None,
    embeddings: Embeddings | None = None,
) -> ToolRegistry:
    """The registry every turn uses: file tools, exec, web_fetch and web_search when enabled,
    message, and memory_search when both the workspace and the state folder (for its index)
    are given (``owner_chat``: which chats are the owner's, whose history a chat that shares
    the owner's memory may search; None: none is; searching by meaning too with
    ``embeddings``, whose index is the same one).

    ``restrict_to_workspace`` is not read here: it travels per turn in ``ToolContext``.
    """
    registry = ToolRegistry()
    for tool in (ReadFileTool(), WriteFileTool(), EditFileTool(), ListDirTool()):
        registry.register(tool)
    for section in SWITCHABLE:
        if getattr(cfg_tools, section).enabled:
            for tool in _switchable(cfg_tools, section):
                registry.register(tool)
    registry.register(MessageTool())
    if workspace is not None and state_dir is not None:
        index = embeddings.index if embeddings is not None else MemoryIndex(workspace, state_dir)
        registry.register(MemorySearchTool(index, embeddings, owner_chat))
    return registry
