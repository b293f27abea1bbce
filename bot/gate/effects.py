"""What a tool does beyond answering with text, as the tool declares it (DESIGN.md section 10).

The gate decides from these declarations, never from a tool's name: which calls wait for a
person's yes in "risky" mode (:func:`bot.gate.approval.question_for`) and which tools a group
or a non-admin's private chat is offered (:func:`bot.gate.approval.offered_by_default`). A
tool that declares nothing gets :data:`UNDECLARED`, the worst case: asked for in "risky" mode
and offered only where the owner's config names it.

The type lives in the gate, not beside :class:`bot.tools.base.Tool`, because the config
module imports the gate's approval rules and ``bot.tools`` imports the config.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Effects:
    """One tool's declared effects.

    ``reads``/``writes`` name the arguments that are paths the tool reads or writes (resolved
    by the gate's path policy). ``command`` names the argument that is a shell command it
    starts (the one ``tools.exec.allow`` patterns are matched against). ``processes``: it
    starts processes, which reach whatever the workspace holds. ``network``: it reaches the
    network. ``messages``: it sends messages to the chat. ``side_effects``: it changes other
    lasting state (scheduled jobs, memory files). ``scoped``: what it opens of the workspace
    keeps to the turn's privacy scope (:mod:`bot.privacy`). ``declared`` False: nobody knows
    what it does; ``external`` marks another program's tool (an MCP server's), which the owner
    may vouch for in ``tools.safeMcpTools``. ``resumable``: a call of it that a crash or a
    restart interrupted is run again when its turn resumes, rather than marked interrupted,
    because run again for the same call (``ToolContext.turn_id``, ``call_id``) it does
    nothing twice (spawn returns the task that call started).
    """

    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()
    command: str | None = None
    processes: bool = False
    network: bool = False
    messages: bool = False
    side_effects: bool = False
    scoped: bool = False
    declared: bool = True
    external: bool = False
    resumable: bool = False

    def __post_init__(self) -> None:
        if self.command is not None and not self.processes:
            raise ValueError("a tool that takes a command starts a process: processes=True")

    @property
    def touches_workspace(self) -> bool:
        """Whether it may open workspace files: by a path argument, through a process it
        starts, or because nobody said it does not."""
        return not self.declared or self.processes or bool(self.reads or self.writes)


# A tool that declares nothing: it may do anything.
UNDECLARED = Effects(declared=False, side_effects=True)
# An MCP server's tool: memobot cannot know what it does; tools.safeMcpTools may vouch for it.
EXTERNAL = Effects(declared=False, side_effects=True, external=True)
