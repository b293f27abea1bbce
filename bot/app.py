"""Composition root for the core: builds the agent stack from a validated config."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bot import workspace_files
from bot.approvals import ApprovalDesk
from bot.bus import AdminNotice, MessageBus
from bot.config import Config
from bot.context import ContextBuilder
from bot.cron import heartbeat
from bot.cron.schedule import zone
from bot.cron.store import JobStore
from bot.delivery import DeliveryLedger
from bot.gate import (
    Gate,
    describe_confinement,
    installation_id,
    reap_leftovers,
    remove_stale_temp,
)
from bot.intake import DurableIntake
from bot.llm import LLMProvider
from bot.loop import AgentLoop, Background
from bot.memory.consolidate import Consolidator
from bot.memory.dream import Dream
from bot.memory.history import HistoryArchive
from bot.memory.hybrid import Embeddings
from bot.memory.review import DreamReview
from bot.memory.search import MemoryIndex
from bot.outage import Outage
from bot.provenance import Provenance
from bot.recovery import Recovery
from bot.session import SessionStore
from bot.spend.budget import Budget
from bot.spend.ledger import UsageLedger
from bot.tools import build_default_tools
from bot.tools.base import ToolRegistry
from bot.tools.cron import CronTool
from bot.tools.mcp import McpManager
from bot.tools.spawn import SpawnTool
from bot.turn import Turns
from bot.workspace import init_workspace

if TYPE_CHECKING:
    from bot.tools.mcp import ServerStatus

log = logging.getLogger(__name__)


def initial_memory_commit(workspace: Path, state_dir: Path) -> None:
    """Record the template's memory files, so the first real change shows as a diff."""
    from bot.memory.versioning import MemoryRepo

    MemoryRepo(workspace, state_dir).commit("memobot: memory files from the template\n")


@dataclass(slots=True)
class AgentStack:
    bus: MessageBus
    loop: AgentLoop
    store: SessionStore
    provider: LLMProvider
    gate: Gate
    mcp: McpManager
    usage: UsageLedger
    budget: Budget
    # memory.embeddings on: the meaning half of memory search (its indexer a gateway task).
    embeddings: Embeddings | None = None

    async def close(self) -> None:
        try:
            await self.mcp.stop()  # before the gate's temp folder goes
            await self.usage.aclose()
            if self.embeddings is not None:
                await self.embeddings.close()
        finally:
            try:
                # An unclosed aiohttp connector is logged as an error at exit.
                await self.provider.close()
            finally:
                self.gate.close()


def build_gate(cfg: Config, config_path: Path) -> Gate:
    """The gate of this installation: the config and the state folder are out of reach.

    Also kills what a crashed memobot left running and removes its temp folders, and says at
    start which confinement the agent's commands get.
    """
    installation = installation_id(cfg.agent.state_path)
    reap_leftovers(installation)
    remove_stale_temp()
    tools = cfg.tools
    confinement = describe_confinement(
        tools.restrict_to_workspace, tools.exec.sandbox, tools.exec.network
    )
    if tools.exec.enabled and not confinement.active:
        log.warning("exec confinement: %s", confinement.summary)
    else:
        log.info("exec confinement: %s", confinement.summary)
    protected = [config_path, cfg.agent.state_path]
    if config_path.resolve().parent.parent == Path("/etc"):
        # A folder of its own (/etc/memobot) also holds the secrets file (EnvironmentFile=).
        protected.append(config_path.resolve().parent)
    gate = Gate(
        cfg.agent.workspace_path,
        protected=protected,
        installation=installation,
        workspace_warn_bytes=cfg.agent.workspace_warn_bytes,
    )
    if tools.exec.enabled:
        line = exec_limits_line(cfg, gate)
        (log.info if gate.task_cap.holds else log.warning)("exec limits: %s", line)
    return gate


def exec_limits_line(cfg: Config, gate: Gate | None = None) -> str:
    """The limits of the agent's commands: this gate's, or what this process would get."""
    from bot.gate.limits import describe_limits

    ex = cfg.tools.exec
    return describe_limits(ex.max_processes, ex.max_file_bytes, gate.task_cap if gate else None)


def build_agent(cfg: Config, config_path: Path, wait_for_model: bool = False) -> AgentStack:
    """Raises LLMNotConfigured when no model endpoint is set. ``wait_for_model``: turns wait
    out a model outage (the daemon) instead of failing (see bot.outage)."""
    bus = MessageBus()
    background = Background()
    on_refused = None
    if wait_for_model:  # the daemon: a wrong key or model is reported to the admins

        def on_refused(text: str) -> None:
            background.spawn(bus.publish_outbound(AdminNotice(text)))

    # Every model call of the stack (turns, consolidation, Dream, probes) is counted here,
    # and asked of the budget before it is made.
    usage = UsageLedger(cfg.agent.state_path)

    async def tell_admins(text: str) -> None:
        await bus.publish_outbound(AdminNotice(text))

    budget = Budget(cfg, zone(cfg.agent.timezone), notify=tell_admins)
    provider = LLMProvider(
        cfg.llm,
        str(config_path),
        on_refused=on_refused,
        meter=budget.metered(usage.record),
        guard=budget.check,
    )
    workspace = cfg.agent.workspace_path
    if not workspace.exists():  # a deleted template file stays deleted once set up
        init_workspace(workspace)
        initial_memory_commit(workspace, cfg.agent.state_path)
    elif workspace_files.exists(workspace, "memory/HISTORY.md"):
        # Before the archive object below reads and caches the last cursor.
        from bot.memory.migrate import migrate_legacy_history

        migrate_legacy_history(workspace)
    store = SessionStore(cfg.agent.state_path)
    gate = build_gate(cfg, config_path)
    jobs = JobStore(cfg.agent.state_path)
    embeddings = Embeddings.from_config(cfg, MemoryIndex(workspace, cfg.agent.state_path))
    tools = build_default_tools(
        cfg.tools,
        workspace,
        cfg.agent.state_path,
        owner_chat=functools.partial(heartbeat.owner_chat, cfg),
        embeddings=embeddings,
    )
    tools.register(CronTool(jobs, cfg.cron, cfg.agent.timezone))
    # Not started here: the caller starts it once its event loop runs (mcp.start()).
    mcp = McpManager(cfg.tools, tools, gate=gate, workspace=workspace, log_dir=mcp_log_dir(cfg))
    context = ContextBuilder(
        workspace,
        timezone=zone(cfg.agent.timezone),
        untrusted_skills=Provenance(cfg.agent.state_path, workspace),
    )
    outage = Outage(provider.probe, cfg.llm.outage) if wait_for_model else None
    # A new archive entry wakes the embedder (which otherwise looks once a minute).
    wake = embeddings.wake if embeddings is not None else None
    loop = build_loop(
        cfg, bus, store, provider, tools, context, gate, jobs, background, outage, mcp, budget, wake
    )
    bus.set_intake(loop.accept)
    return AgentStack(bus, loop, store, provider, gate, mcp, usage, budget, embeddings)


def build_loop(
    cfg: Config,
    bus: MessageBus,
    store: SessionStore,
    provider: LLMProvider,
    tools: ToolRegistry,
    context: ContextBuilder,
    gate: Gate | None,
    jobs: JobStore,
    background: Background,
    outage: Outage | None,
    mcp: McpManager | None,
    budget: Budget,
    on_archived: Callable[[], None] | None = None,
) -> AgentLoop:
    """The agent loop and everything it works with, wired once, here. ``on_archived``: called
    after consolidation archives an entry (:class:`Consolidator`)."""
    workspace = cfg.agent.workspace_path
    archive = HistoryArchive(workspace)

    async def tell_admins(text: str) -> None:
        log.warning("admin notice: %s", text)
        await bus.publish_outbound(AdminNotice(text))

    consolidator = Consolidator(
        cfg.memory, store, provider, archive, notify=tell_admins, on_archived=on_archived
    )
    dream = Dream(
        cfg.memory,
        workspace,
        provider,
        archive,
        functools.partial(heartbeat.owner_chat, cfg),
        state_dir=cfg.agent.state_path,
        gate=gate,
    )
    slots = asyncio.Semaphore(cfg.agent.max_concurrent_turns)
    # The desk gives a waiting turn's slot back while a person decides.
    approvals = ApprovalDesk(cfg, store, bus, tools, slots)
    # Dream's proposals (memory.dreamReview) are questions of the same desk.
    review = DreamReview(dream, bus)
    dream.on_proposal = review.ask
    approvals.review = review
    turns = Turns(
        cfg, bus, store, provider, tools, context, consolidator, gate, background.spawn, approvals
    )
    ledger = DeliveryLedger(store)
    loop = AgentLoop(
        cfg,
        bus,
        store,
        turns=turns,
        # A message that cannot be stored is answered at once, with a final answer.
        intake=DurableIntake(store, lambda msg, text: turns.publish(msg, text, True)),
        recovery=Recovery(
            store,
            ledger,
            bus,
            turns.user_message,
            lambda: {name for name, e in tools.effects().items() if e.resumable},
        ),
        ledger=ledger,
        jobs=jobs,
        consolidator=consolidator,
        dream=dream,
        slots=slots,
        background=background,
        outage=outage,
        budget=budget,
        mcp=mcp,
    )
    tools.register(SpawnTool(loop.tasks))  # a task is a turn of this loop
    return loop


def mcp_log_dir(cfg: Config) -> Path:
    """Where each stdio MCP server's stderr is kept: ``<state>/mcp/<name>.log``."""
    return cfg.agent.state_path / "mcp"


def probe_mcp_servers(cfg: Config, config_path: Path) -> list[ServerStatus]:
    """Start every configured MCP server once through this installation's gate, list its
    tools and stop it (``memobot mcp list``, ``doctor``)."""
    import asyncio

    from bot.tools.mcp import probe_servers

    gate = build_gate(cfg, config_path)
    try:
        return asyncio.run(
            probe_servers(
                cfg.tools, gate=gate, workspace=cfg.agent.workspace_path, log_dir=mcp_log_dir(cfg)
            )
        )
    finally:
        gate.close()
