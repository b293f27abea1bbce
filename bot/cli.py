"""The ``memobot`` command line. Heavy modules are imported inside the commands that use them."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import stat
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

from bot import __version__
from bot.config import EX_CONFIG, Config, ConfigError, default_config_path, load_config
from bot.service.logs import LOG_FORMATS

if TYPE_CHECKING:
    from bot.loop import AgentLoop
    from bot.service.logs import LogFormat
    from channels.terminal import TerminalChannel

log = logging.getLogger("memobot")
DEFAULT_SESSION = "cli:direct"
STDIN_LINE_LIMIT = 16 * 1024 * 1024


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--config",
        type=Path,
        default=argparse.SUPPRESS,
        help="config file (default: $MEMOBOT_CONFIG or ~/.memobot/config.json)",
    )
    common.add_argument(
        "-v", "--verbose", action="count", default=argparse.SUPPRESS, help="more log output"
    )
    common.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default=argparse.SUPPRESS,
        help="stderr logs: text (default; journald-friendly under systemd) or json, one "
        "object per line",
    )
    parser = argparse.ArgumentParser(
        prog="memobot",
        description="A self-hosted chat assistant that remembers, with tools in a workspace.",
        parents=[common],
    )
    parser.add_argument("--version", action="version", version=f"memobot {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    onboard = sub.add_parser(
        "onboard", parents=[common], help="create the config file and the workspace"
    )
    onboard.add_argument("--workspace", help="workspace folder (default ~/.memobot/workspace)")
    onboard.add_argument(
        "--base-url", help="OpenAI-compatible endpoint, e.g. http://localhost:11434/v1"
    )
    onboard.add_argument("--api-key", help="API key (or leave empty and set OPENAI_API_KEY)")
    onboard.add_argument("--model", help="model name, e.g. gpt-4o-mini or llama3.1")

    agent = sub.add_parser(
        "agent",
        parents=[common],
        help="chat in the terminal",
        description="Chat in the terminal. Interactive when stdin is a terminal; otherwise each "
        "line of stdin is one message and each answer is printed in order.",
    )
    agent.add_argument("-m", "--message", help="send one message, print the answer, exit")
    agent.add_argument(
        "-s",
        "--session",
        default=DEFAULT_SESSION,
        help=f"session key channel:chat_id (default {DEFAULT_SESSION}); a bare name means cli:NAME",
    )

    sub.add_parser(
        "gateway",
        parents=[common],
        help="run the daemon: every enabled channel, the agent, Dream and recovery",
        description="Run memobot as a daemon. SIGTERM or Ctrl-C stops it gracefully (running "
        "answers get gateway.drainSeconds to finish; the rest resume at the next start); a "
        "second Ctrl-C exits at once.",
    )
    sub.add_parser("status", parents=[common], help="show config, workspace, model and sessions")
    from bot.memory.commands import add_parsers

    add_parsers(sub, common)
    from bot.service import commands as service_commands

    service_commands.add_parsers(sub, common)
    from bot.importer import commands as import_commands

    import_commands.add_parsers(sub, common)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 0
    verbose = getattr(args, "verbose", 0)
    quiet = args.command not in ("gateway", "dream")
    _setup_logging(verbose, quiet, getattr(args, "log_format", "text"))
    config_path = getattr(args, "config", None) or default_config_path()
    try:
        if args.command in ("service", "doctor"):
            from bot.service import commands as service_commands

            return service_commands.run(args)
        if args.command == "onboard":
            return cmd_onboard(args, config_path)
        if args.command == "import":  # writes the config: it need not exist yet
            from bot.importer import commands as import_commands

            return import_commands.run(args, config_path)
        cfg, config_path = load_config(config_path)
        if args.command == "agent":
            return cmd_agent(args, cfg, config_path)
        if args.command == "gateway":
            return cmd_gateway(cfg, config_path)
        if args.command == "status":
            return cmd_status(cfg, config_path)
        if args.command in ("memory", "dream"):
            from bot.memory.commands import run

            return run(args, cfg)
    except ConfigError as exc:
        print(f"memobot: {exc}", file=sys.stderr)
        return EX_CONFIG
    except KeyboardInterrupt:
        return 130
    parser.error(f"unknown command {args.command}")
    return 2


def _setup_logging(verbose: int, quiet: bool, log_format: LogFormat) -> None:
    from bot.service.logs import setup_logging

    # In the terminal chat, logs would interleave with the conversation: warnings only.
    level = logging.WARNING if quiet else logging.INFO
    if verbose:
        level = logging.DEBUG if verbose > 1 else logging.INFO
    setup_logging(level, log_format)


# -- onboard ---------------------------------------------------------------------------------


def cmd_onboard(args: argparse.Namespace, config_path: Path) -> int:
    from bot.config import check_layout, save_config
    from bot.workspace import init_workspace

    if config_path.exists():
        cfg, _ = load_config(config_path)
        changed = False
        print(f"Config exists, kept: {config_path}")
    else:
        cfg = Config()
        changed = True
    for attr, value in (
        ("base_url", args.base_url),
        ("api_key", args.api_key),
        ("model", args.model),
    ):
        if value is not None:
            setattr(cfg.llm, attr, value)
            changed = True
    if args.workspace:
        cfg.agent.workspace = args.workspace
        changed = True
    check_layout(cfg, config_path)  # before anything is written
    from bot.memory.versioning import MemoryRepo, MemoryRepoError

    try:  # a .git memobot cannot version memory in (it adopts nanobot's): before any write
        MemoryRepo(cfg.agent.workspace_path).check()
    except MemoryRepoError as exc:
        print(f"memobot: {exc}", file=sys.stderr)
        return 1
    if changed:
        save_config(cfg, config_path)
        print(f"Wrote config (mode 0600): {config_path}")
    workspace = cfg.agent.workspace_path
    created = init_workspace(workspace)
    if created:
        from bot.app import initial_memory_commit

        initial_memory_commit(workspace)
    print(f"Workspace: {workspace} ({len(created)} new files and folders)")
    cfg.agent.state_path.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not (cfg.llm.resolved_api_key() or cfg.llm.resolved_base_url()):
        print(
            "\nNext: set an LLM. Either export OPENAI_API_KEY=sk-..., or run\n"
            "  memobot onboard --base-url http://localhost:11434/v1 --model llama3.1\n"
            f"(or edit llm.apiKey / llm.baseUrl / llm.model in {config_path})."
        )
    print("Then chat: memobot agent")
    return 0


# -- agent -----------------------------------------------------------------------------------


def normalise_session_key(raw: str) -> tuple[str, str]:
    channel, sep, chat_id = raw.partition(":")
    if not sep:
        return "cli", raw
    if not channel or not chat_id:
        raise ConfigError(f"--session {raw!r}: expected channel:chat_id, for example cli:demo")
    return channel, chat_id


def cmd_agent(args: argparse.Namespace, cfg: Config, config_path: Path) -> int:
    from bot.llm import LLMNotConfigured

    channel, chat_id = normalise_session_key(args.session)
    if channel != "cli":
        raise ConfigError(f"--session {args.session!r}: the terminal can only open cli: sessions")
    from bot.session import StateLayoutError, check_session_path
    from bot.workspace import layout_problem

    # A folder where a file belongs (or the reverse): one line, not a traceback per turn.
    check_session_path(cfg.agent.state_path, f"cli:{chat_id}")
    problem = layout_problem(cfg.agent.workspace_path)
    if problem:
        raise StateLayoutError(problem)
    try:
        return asyncio.run(_agent_main(args, cfg, config_path, chat_id))
    except LLMNotConfigured as exc:
        print(f"memobot: {exc}", file=sys.stderr)
        return EX_CONFIG


async def _agent_main(
    args: argparse.Namespace, cfg: Config, config_path: Path, chat_id: str
) -> int:
    from bot.app import build_agent
    from channels.manager import ChannelManager
    from channels.terminal import TerminalChannel

    stack = build_agent(cfg, config_path)
    terminal = TerminalChannel(stack.bus, chat_id)
    manager = ChannelManager(stack.bus, stack.loop.ledger, [terminal])
    await manager.start()
    loop_task = asyncio.create_task(stack.loop.run(), name="agent-loop")
    key = f"cli:{chat_id}"
    aio = asyncio.get_running_loop()
    terminate = asyncio.Event()
    aio.add_signal_handler(signal.SIGTERM, terminate.set)
    # An interrupted turn of this session is finished (and printed) before new input.
    stack.loop.recover([key])
    io_task = asyncio.create_task(_converse(args, stack.loop, terminal, cfg, key))
    stop_wait = asyncio.create_task(terminate.wait())
    try:
        await asyncio.wait([io_task, stop_wait], return_when=asyncio.FIRST_COMPLETED)
        if terminate.is_set():
            log.info("SIGTERM: finishing the running answer, then exiting")
            io_task.cancel()
        await stack.loop.shutdown(cfg.gateway.drain_seconds)
        await manager.flush()
        if io_task.done() and not io_task.cancelled() and io_task.exception():
            raise io_task.exception()  # type: ignore[misc]
    finally:
        for t in (io_task, stop_wait, loop_task):
            t.cancel()
        await asyncio.gather(io_task, stop_wait, loop_task, return_exceptions=True)
        await manager.stop()
        await stack.close()
    return 0


async def _converse(
    args: argparse.Namespace, loop: AgentLoop, terminal: TerminalChannel, cfg: Config, key: str
) -> None:
    await loop.wait_idle(key)
    # Recovered answers are printed before a new line is taken; otherwise its intake runs
    # while an answer sits between its "sending" mark and the terminal, and a crash there
    # drops that answer unseen.
    await loop.bus.outbound.join()
    if args.message is not None:
        await _turn_with_interrupt(loop, terminal, args.message)
    elif sys.stdin.isatty():
        await _interactive(loop, terminal, cfg)
    else:
        await _piped(loop, terminal)


async def _turn_with_interrupt(loop: AgentLoop, terminal: TerminalChannel, text: str) -> None:
    """Send one message; Ctrl-C while it runs cancels that turn instead of killing memobot."""
    key = f"cli:{terminal.chat_id}"
    aio = asyncio.get_running_loop()
    aio.add_signal_handler(signal.SIGINT, loop.stop, key)
    try:
        await terminal.ask(text)
    finally:
        aio.remove_signal_handler(signal.SIGINT)


async def _piped(loop: AgentLoop, terminal: TerminalChannel) -> None:
    async for line in _stdin_lines():
        text = line.rstrip("\r\n")
        if text.strip():
            await _turn_with_interrupt(loop, terminal, text)


async def _stdin_lines() -> AsyncIterator[str]:
    """Lines of stdin without a blocking read in the event loop (a SIGTERM must get through)."""
    if stat.S_ISREG(os.fstat(sys.stdin.fileno()).st_mode):
        for line in sys.stdin:  # a regular file never blocks
            yield line
        return
    reader = asyncio.StreamReader(limit=STDIN_LINE_LIMIT)
    await asyncio.get_running_loop().connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), sys.stdin
    )
    while line := await reader.readline():
        yield line.decode("utf-8", errors="replace")


async def _interactive(loop: AgentLoop, terminal: TerminalChannel, cfg: Config) -> None:
    from prompt_toolkit import PromptSession
    from prompt_toolkit.history import FileHistory
    from prompt_toolkit.patch_stdout import patch_stdout

    history_file = cfg.agent.state_path / "cli_history"
    history_file.parent.mkdir(parents=True, exist_ok=True)
    prompt: PromptSession[str] = PromptSession(history=FileHistory(str(history_file)))
    print("memobot: type a message, /help for commands, Ctrl-C stops an answer, Ctrl-D exits.")
    while True:
        try:
            with patch_stdout():
                text = await prompt.prompt_async("you> ")
        except KeyboardInterrupt:
            continue  # Ctrl-C at the prompt clears the line, as in a shell
        except EOFError:
            return
        if text.strip():
            await _turn_with_interrupt(loop, terminal, text.strip())


# -- gateway ---------------------------------------------------------------------------------


def cmd_gateway(cfg: Config, config_path: Path) -> int:
    from bot.gateway import run_gateway
    from bot.llm import LLMNotConfigured

    try:
        return asyncio.run(run_gateway(cfg, config_path))
    except LLMNotConfigured as exc:
        print(f"memobot: {exc}", file=sys.stderr)
        return EX_CONFIG


# -- status ----------------------------------------------------------------------------------


def _exec_line(cfg: Config) -> str:
    from bot.gate import describe_confinement

    tools = cfg.tools
    if not tools.exec.enabled:
        return "disabled"
    return describe_confinement(
        tools.restrict_to_workspace, tools.exec.sandbox, tools.exec.network
    ).summary


def cmd_status(cfg: Config, config_path: Path) -> int:
    from bot.memory.dream import budget_lines, read_dream_cursor

    state = cfg.agent.state_path
    sessions_dir = state / "sessions"
    count = len(list(sessions_dir.glob("*.jsonl"))) if sessions_dir.is_dir() else 0
    llm = cfg.llm
    endpoint = llm.resolved_base_url() or ("api.openai.com" if llm.resolved_api_key() else "")
    from bot.gateway import enabled_channels, read_status

    enabled = enabled_channels(cfg)
    live = read_status(state)
    if live:
        shown = []
        for name in enabled:
            info = live["channels"].get(name, {})
            when = info.get("last_event_at")
            last = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(when)) if when else "never"
            detail = f" ({info['detail']})" if info.get("detail") else ""
            shown.append(f"{name}: {info.get('state', '?')}{detail}, last event {last}")
        enabled = shown
    exists = "" if config_path.exists() else " (missing: defaults in use; run memobot onboard)"
    rows = [
        ("config", f"{config_path}{exists}"),
        ("workspace", str(cfg.agent.workspace_path)),
        ("state", str(state)),
        ("model", f"{llm.model} @ {endpoint}" if endpoint else f"{llm.model} (no LLM configured)"),
        ("sessions", str(count)),
        ("memory", ", ".join(budget_lines(cfg.agent.workspace_path, cfg.memory.max_chars))),
        ("dream", f"digested up to history cursor {read_dream_cursor(cfg.agent.workspace_path)}"),
        ("channels", "; ".join(enabled) if enabled else "none enabled"),
        ("exec", _exec_line(cfg)),
        ("gateway", f"running (pid {live['pid']})" if live else "not running"),
    ]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k.ljust(width)}  {v}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
