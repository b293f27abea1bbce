"""Tool contract: a JSON-schema description for the model and an async ``run``.

A tool never raises into the runner. Expected failures raise :class:`ToolError` with a message
written for the model; the registry turns those, bad arguments and unexpected exceptions alike,
into an ``Error: ...`` tool result so the model can correct itself and the loop keeps going.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from bot.gate.effects import UNDECLARED, Effects
from bot.privacy import PrivacyScope, owner_scope
from bot.safejson import BadArguments, parse_arguments

if TYPE_CHECKING:
    from bot.gate import Gate, ProcessScope
    from bot.images import ShownImage
    from bot.kinds import Sender

log = logging.getLogger(__name__)


class ToolError(Exception):
    """An expected failure; the message goes to the model as the tool result."""


@dataclass(slots=True)
class ToolContext:
    """What a tool may know about the turn it runs in."""

    workspace: Path
    restrict_to_workspace: bool = True
    channel: str = ""
    chat_id: str = ""
    session_key: str = ""
    # Sends a message to the current chat (the ``message`` tool); set by the agent loop.
    send: Callable[[str], Awaitable[None]] | None = None
    # Who the turn speaks for (bot.kinds); None outside a chat turn (tests, the CLI).
    sender: Sender | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # The one path policy and process launcher (bot.gate); the processes this turn started.
    gate: Gate | None = None
    processes: ProcessScope | None = None
    # What of the owner's data this turn may show (bot.privacy), decided once by the turn;
    # the default, the owner's, is for tools run outside a person's turn (tests, the CLI).
    scope: PrivacyScope = field(default_factory=lambda: owner_scope(""))
    # The message id of the turn (its pending entry), and the call being run as "<batch>/<id>"
    # (the batch: the turn's how-manyth assistant message with calls), set by the runner
    # before each call: the same when a resumed turn runs an interrupted call again, so a tool
    # that must not act twice for one call (spawn) can key on the two.
    turn_id: str = ""
    call_id: str = ""
    # Images a tool showed the model in this turn (read_file of a picture); the runner puts
    # each before the model once, after the results of the calls that showed it.
    images: list[ShownImage] = field(default_factory=list)


class Tool(ABC):
    name: ClassVar[str]
    description: ClassVar[str]
    parameters: ClassVar[dict[str, Any]]  # JSON schema of the arguments object
    # What it does besides answering (bot.gate.effects): the gate asks and offers by this.
    # A tool that declares nothing is treated as able to do anything.
    effects: ClassVar[Effects] = UNDECLARED

    @abstractmethod
    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        """Do the work and return text for the model. Raise ToolError for expected failures."""

    def schema(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
}


def check_arguments(schema: dict[str, Any], args: dict[str, Any]) -> str | None:
    """A short description of what is wrong with ``args``, or None when they fit the schema."""
    props: dict[str, Any] = schema.get("properties", {})
    for name in schema.get("required", []):
        if name not in args:
            return f"missing required argument '{name}'"
    for name, value in args.items():
        spec = props.get(name)
        if spec is None:
            return f"unknown argument '{name}' (expected: {', '.join(props) or 'none'})"
        want = spec.get("type")
        types = _JSON_TYPES.get(want) if isinstance(want, str) else None
        if types is None:
            continue
        bad_bool = isinstance(value, bool) and want in ("integer", "number")
        if not isinstance(value, types) or bad_bool:
            return f"argument '{name}' must be of type {want}, got {type(value).__name__}"
        if "enum" in spec and value not in spec["enum"]:
            return f"argument '{name}' must be one of {spec['enum']}"
    return None


class ToolRegistry:
    def __init__(self) -> None:
        self._tools: dict[str, Tool] = {}
        self._schemas: list[dict[str, Any]] | None = None
        self._groups: dict[str, list[str]] = {}
        # Goes up whenever the tool list changes, so callers can cache what they derive from it.
        self.version = 0

    def register(self, tool: Tool) -> None:
        self._tools[tool.name] = tool
        self._put_groups_last()
        self._schemas = None
        self.version += 1

    def unregister(self, name: str) -> bool:
        """Take a built-in tool away (a reload that turns it off); whether it was there."""
        if self._tools.pop(name, None) is None:
            return False
        self._schemas = None
        self.version += 1
        return True

    def replace_group(self, group: str, tools: list[Tool]) -> bool:
        """Make ``tools``, in this order, the tools of ``group`` (e.g. MCP servers), after the
        built-in ones. Returns whether the schemas changed; when they did not (a server came
        back with the same tools), the cached schemas stay, so requests stay byte-identical."""
        before = [self._tools[n].schema() for n in self._groups.get(group, [])]
        if before == [t.schema() for t in tools]:
            for tool in tools:  # the same schemas; the objects may hold a new connection
                self._tools[tool.name] = tool
            return False
        for name in self._groups.pop(group, []):
            self._tools.pop(name, None)
        for tool in tools:
            self._tools[tool.name] = tool
        self._groups[group] = [t.name for t in tools]
        self._put_groups_last()
        self._schemas = None
        self.version += 1
        return True

    def _put_groups_last(self) -> None:
        """Groups after the built-ins, in a fixed order of groups."""
        if not self._groups:
            return
        grouped = {n for names in self._groups.values() for n in names}
        order = [n for n in self._tools if n not in grouped]
        for g in sorted(self._groups):
            order += self._groups[g]
        self._tools = {n: self._tools[n] for n in order}

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def effects(self) -> dict[str, Effects]:
        """Each registered tool's declared effects, by name, in the registry's order."""
        return {name: tool.effects for name, tool in self._tools.items()}

    @property
    def names(self) -> list[str]:
        return list(self._tools)

    def schemas(self) -> list[dict[str, Any]]:
        # Built once and reused so the tools part of every request is byte-identical.
        if self._schemas is None:
            self._schemas = [t.schema() for t in self._tools.values()]
        return self._schemas

    async def execute(self, name: str, raw_arguments: str, ctx: ToolContext) -> str:
        """Run one tool call and return its result text; never raises except on cancellation."""
        tool = self._tools.get(name)
        if tool is None:
            return f"Error: unknown tool '{name}'. Available tools: {', '.join(self._tools)}"
        try:
            args = parse_arguments(raw_arguments)
        except BadArguments as exc:
            return f"Error: {exc}"
        problem = check_arguments(tool.parameters, args)
        if problem:
            return f"Error: {problem}"
        try:
            return await tool.run(args, ctx)
        except ToolError as exc:
            return f"Error: {exc}"
        except Exception as exc:  # a bug in a tool must not end the turn
            log.exception("tool %s failed session=%s", name, ctx.session_key)
            return f"Error: {name} failed unexpectedly: {type(exc).__name__}: {exc}"
