"""SIGHUP: apply what can change in a running gateway, and say what needs a restart.

The running components hold references to the live ``Config`` sections (the provider its
``llm``, the consolidator and Dream their ``memory``, each tool and channel its own section)
and read them at use, so a live change is an in-place assignment on that one object. The few
values copied at start-up are refreshed by ``refresh_copies``. Anything else (endpoints, keys,
tokens, which channels and tools exist, folders) is built once at start: those changes are
reported as needing a restart, never half-applied.
"""

from __future__ import annotations

import fnmatch
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel
from pydantic.alias_generators import to_camel

from bot.approvals import policy_for
from bot.config import Config
from bot.gate import describe_confinement
from bot.tools import switch_builtins

if TYPE_CHECKING:
    from bot.app import AgentStack
    from channels.base import Channel

log = logging.getLogger(__name__)

# Config paths (camelCase, as in the file) a running gateway picks up at its next use.
LIVE = (
    "llm.model",
    "llm.maxTokens",
    "llm.temperature",
    "llm.contextWindowTokens",
    "llm.retry.*",
    "llm.prices",
    "budget.*",
    "api.keys",  # read at each request: a key revoked or added counts at once
    "agent.maxTokensPerTurn",
    "agent.maxToolIterations",
    "agent.maxToolCallsPerTurn",
    "agent.workspaceWarnBytes",
    "tools.restrictToWorkspace",
    "tools.exec.enabled",
    "tools.exec.allow",
    "tools.web.enabled",
    "tools.mcpServers",
    "tools.exec.timeoutSeconds",
    "tools.exec.maxOutputChars",
    "tools.exec.maxProcesses",
    "tools.exec.maxFileBytes",
    "tools.web.timeoutSeconds",
    "tools.web.maxBytes",
    "tools.web.maxChars",
    "memory.consolidateAtTokens",
    "memory.consolidateAtMessages",
    "memory.keepRecentMessages",
    "memory.maxChars",
    "memory.historyKeepDays",
    "memory.dream.intervalMinutes",
    "memory.dream.maxIterations",
    "memory.dream.maxTokens",
    "memory.dream.maxEntries",
    "channels.*.allowFrom",
    "channels.*.admins",
    "channels.*.groupPolicy",
    "gateway.drainSeconds",
)


@dataclass(slots=True)
class ReloadResult:
    applied: list[str] = field(default_factory=list)
    restart_needed: list[str] = field(default_factory=list)


def _leaves(model: BaseModel, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    out: dict[tuple[str, ...], Any] = {}
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            out.update(_leaves(value, (*prefix, name)))
        else:
            out[(*prefix, name)] = value
    return out


def display(path: tuple[str, ...]) -> str:
    return ".".join(to_camel(p) for p in path)


def changed_paths(old: Config, new: Config) -> list[tuple[str, ...]]:
    """Attribute paths of every leaf value that differs (lists compare as a whole)."""
    a, b = _leaves(old), _leaves(new)
    return [p for p in a if a[p] != b[p]]


def is_live(path: tuple[str, ...]) -> bool:
    name = display(path)
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in LIVE)


def _assign(target: BaseModel, path: tuple[str, ...], value: Any) -> None:
    for part in path[:-1]:
        target = getattr(target, part)
    setattr(target, path[-1], value)


def apply_config(
    live: Config, new: Config, stack: AgentStack, channels: list[Channel]
) -> ReloadResult:
    """Copy the live-changeable differences of ``new`` into ``live``; list the others."""
    result = ReloadResult()
    for path in changed_paths(live, new):
        if is_live(path) and _channel_accepts(path, channels):
            _assign(live, path, _leaves(new)[path])
            result.applied.append(display(path))
        else:
            result.restart_needed.append(display(path))
    if result.applied:
        access = {p.split(".")[1] for p in result.applied if p.endswith((".allowFrom", ".admins"))}
        refresh_copies(live, stack, [c for c in channels if c.name in access])
    return result


def _channel_accepts(path: tuple[str, ...], channels: list[Channel]) -> bool:
    """A running channel takes a new allowFrom only if it keeps an access policy to rebuild."""
    if path[0] != "channels" or path[-1] not in ("allow_from", "admins"):
        return True
    return all(c.policy is not None for c in channels if c.name == path[1])


def refresh_copies(cfg: Config, stack: AgentStack, channels: list[Channel]) -> None:
    """Values that components copied at start-up instead of reading the config at use.

    ``channels``: those whose allowFrom or admins changed; each rebuilds its own access
    policy (``Channel.reload_access``), keeping its pairing store and dmPolicy.
    """
    stack.provider.model = cfg.llm.model
    stack.loop.runner.max_iterations = cfg.agent.max_tool_iterations
    stack.loop.runner.max_tool_calls = cfg.agent.max_tool_calls_per_turn
    stack.loop.runner.max_turn_tokens = cfg.agent.max_tokens_per_turn
    stack.gate.usage.warn_bytes = cfg.agent.workspace_warn_bytes
    # Which tools exist: the built-ins turned on or off, the MCP servers added, taken away or
    # changed (each started or stopped here), and the approval policy's copy of exec.allow.
    switched = switch_builtins(stack.loop.turns.tools, cfg.tools)
    servers = stack.mcp.apply(cfg.tools)
    if switched or servers:
        log.info("tools now: %s", ", ".join([*switched, *servers]))
    if "+exec" in switched:  # as at start: say what confines the commands it will run
        tools = cfg.tools
        confinement = describe_confinement(
            tools.restrict_to_workspace, tools.exec.sandbox, tools.exec.network
        )
        (log.info if confinement.active else log.warning)(
            "exec confinement: %s", confinement.summary
        )
        from bot.app import exec_limits_line  # the composition root's wording, as at start

        (log.info if stack.gate.task_cap.holds else log.warning)(
            "exec limits: %s", exec_limits_line(cfg, stack.gate)
        )
    stack.loop.approvals.policy = policy_for(cfg)
    for channel in channels:
        section = getattr(cfg.channels, channel.name, None)
        if section is not None:
            channel.reload_access(section)
