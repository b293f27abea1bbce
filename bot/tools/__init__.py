"""The agent's tools and the default set the daemon registers."""

from __future__ import annotations

from pathlib import Path

from bot.config import ToolsConfig
from bot.memory.search import MemoryIndex
from bot.tools.base import Tool, ToolContext, ToolError, ToolRegistry
from bot.tools.filesystem import EditFileTool, ListDirTool, ReadFileTool, WriteFileTool
from bot.tools.memory_search import MemorySearchTool
from bot.tools.message import MessageTool
from bot.tools.search import WebSearchTool
from bot.tools.shell import ExecTool
from bot.tools.web import WebFetchTool

__all__ = ["Tool", "ToolContext", "ToolError", "ToolRegistry", "build_default_tools"]


def build_default_tools(
    cfg_tools: ToolsConfig, workspace: Path | None = None, state_dir: Path | None = None
) -> ToolRegistry:
    """The registry every turn uses: file tools, exec, web_fetch and web_search when enabled,
    message, and memory_search when both the workspace and the state folder (for its index)
    are given.

    ``restrict_to_workspace`` is not read here: it travels per turn in ``ToolContext``.
    """
    registry = ToolRegistry()
    for tool in (ReadFileTool(), WriteFileTool(), EditFileTool(), ListDirTool()):
        registry.register(tool)
    if cfg_tools.exec.enabled:
        registry.register(ExecTool(cfg_tools.exec))
    if cfg_tools.web.enabled:
        registry.register(WebFetchTool(cfg_tools.web))
        registry.register(WebSearchTool(cfg_tools.web))
    registry.register(MessageTool())
    if workspace is not None and state_dir is not None:
        registry.register(MemorySearchTool(MemoryIndex(workspace, state_dir)))
    return registry
