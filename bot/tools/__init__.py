"""The agent's tools and the default set the daemon registers."""

from __future__ import annotations

from bot.config import ToolsConfig
from bot.tools.base import Tool, ToolContext, ToolError, ToolRegistry
from bot.tools.filesystem import EditFileTool, ListDirTool, ReadFileTool, WriteFileTool
from bot.tools.message import MessageTool
from bot.tools.shell import ExecTool
from bot.tools.web import WebFetchTool

__all__ = ["Tool", "ToolContext", "ToolError", "ToolRegistry", "build_default_tools"]


def build_default_tools(cfg_tools: ToolsConfig) -> ToolRegistry:
    """The registry every turn uses: file tools, exec and web_fetch when enabled, message.

    ``restrict_to_workspace`` is not read here: it travels per turn in ``ToolContext``.
    """
    registry = ToolRegistry()
    for tool in (ReadFileTool(), WriteFileTool(), EditFileTool(), ListDirTool()):
        registry.register(tool)
    if cfg_tools.exec.enabled:
        registry.register(ExecTool(cfg_tools.exec))
    if cfg_tools.web.enabled:
        registry.register(WebFetchTool(cfg_tools.web))
    registry.register(MessageTool())
    return registry
