"""The ``memobot`` command line. Heavy modules are imported inside the commands that use them."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import logging
import os
import selectors
import signal
import stat
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bot import __version__, startup
from bot.config import EX_CONFIG, Config, ConfigError, default_config_path, load_config
from bot.file_errors import file_problem
from bot.invocation import command_for, program
from bot.service.logs import LOG_FORMATS, redact
from bot.urls import redact_url

if TYPE_CHECKING:
    from bot.loop import AgentLoop
    from bot.service.logs import LogFormat
    from channels.terminal_channel.channel import TerminalChannel

log = logging.getLogger("memobot")
DEFAULT_SESSION = "cli:direct"
STDIN_LINE_LIMIT = 16 * 1024 * 1024
# Exit codes, one table in docs/commands.md ("Exit codes").
EX_OK = 0
EX_FAILED = 1  # a turn failed (model unreachable or refusing), or a command failed
EX_USAGE = 2  # argparse's own code for a bad command line
EX_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports Ctrl-C
EX_CLOSED_PIPE = 141  # 128 + SIGPIPE: the reader of stdout went away (`| head`)
# Commands that write the config, so a --config path that does not exist yet is expected.
CREATES_CONFIG = ("onboard", "import")
EXIT_WORDS = frozenset({"exit", "quit", "/exit", "/quit"})
MCP_WAIT_SECONDS = 5.0  # how long `agent` waits for MCP servers before the first turn


def session_arg(raw: str) -> str:
    """``-s/--session``: ``cli:NAME`` or ``NAME``; returns the chat id (argparse type)."""
    channel, sep, chat_id = raw.partition(":")
    if not sep:
        channel, chat_id = "cli", raw
    if not channel or not chat_id.strip():
        raise argparse.ArgumentTypeError(f"{raw!r}: expected cli:NAME or NAME, e.g. cli:demo")
    if channel != "cli":
        raise argparse.ArgumentTypeError(
            f"{raw!r}: the terminal can only open cli: sessions (e.g. cli:demo)"
        )
    return chat_id


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--config",
        type=Path,
        default=argparse.SUPPRESS,
        help="config file (default: $MEMOBOT_CONFIG or ~/.memobot/config.json); a path given "
        "here or in $MEMOBOT_CONFIG must exist, except for onboard, which creates it",
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
        epilog=f"Exit codes: {EX_OK} success, {EX_FAILED} a turn or command failed, {EX_USAGE} "
        f"usage, {EX_CONFIG} configuration (or a file it cannot read or write), "
        f"{EX_INTERRUPTED} interrupted (Ctrl-C), "
        f"{EX_CLOSED_PIPE} stdout closed early.",
        parents=[common],
    )
    parser.add_argument("--version", action="version", version=f"memobot {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    onboard = sub.add_parser(
        "onboard",
        parents=[common],
        help="create the config file and the workspace",
        description="Create the config file (mode 0600) and the workspace, or update the given "
        "fields of an existing config. With no LLM configured and no LLM flags, asks for the "
        "endpoint, key and model in a terminal (presets: OpenAI, Ollama, vLLM, OpenRouter). "
        "A new or changed model is asked one question before the config is saved (on a "
        "failure, a terminal is asked whether to save anyway). In a terminal, with no chat "
        "channel enabled yet, asks which channels to connect (Telegram, Discord, Slack), "
        "checks their tokens live and finds your own user id (Telegram: you message the "
        "bot), so the bot answers you; without your id, newcomers get a pairing code.",
    )
    onboard.add_argument(
        "--workspace",
        help="workspace folder (default: beside the config file, ~/.memobot/workspace)",
    )
    onboard.add_argument(
        "--base-url", help="OpenAI-compatible endpoint, e.g. http://localhost:11434/v1"
    )
    onboard.add_argument("--api-key", help="API key (or leave empty and set OPENAI_API_KEY)")
    onboard.add_argument("--model", help="model name, e.g. gpt-4o-mini or llama3.1")
    onboard.add_argument(
        "--state-dir",
        help="memobot's own records: sessions, search index (default: beside the config file)",
    )
    onboard.add_argument(
        "--api-url",
        action="append",
        default=[],
        metavar="CHANNEL=URL",
        help="for the channel step: a self-hosted or test API server, e.g. "
        "telegram=http://localhost:8081/bot (channels.telegram.baseUrl)",
    )

    agent = sub.add_parser(
        "agent",
        parents=[common],
        help="chat in the terminal",
        description="Chat in the terminal. Interactive when stdin is a terminal (exit, quit, "
        "/exit or Ctrl-D ends it); otherwise each line of stdin is one message, each answer is "
        "printed in order, and the end of input ends the session. A failed turn exits 1, "
        "Ctrl-C during -m 130.",
    )
    agent.add_argument("-m", "--message", help="send one message, print the answer, exit")
    agent.add_argument(
        "-s",
        "--session",
        type=session_arg,
        default=DEFAULT_SESSION.partition(":")[2],
        help=f"session key cli:NAME (default {DEFAULT_SESSION}); a bare name means cli:NAME",
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
    mcp = sub.add_parser(
        "mcp",
        parents=[common],
        help="MCP servers: mcp list starts each configured server and shows its tools",
        description="MCP servers (tools.mcpServers in the config).",
    )
    mcp_sub = mcp.add_subparsers(dest="mcp_command", metavar="SUBCOMMAND", required=True)
    mcp_sub.add_parser(
        "list",
        parents=[common],
        help="start each server, show its state and tools, stop it (exit 1 if one failed)",
        description="Start each configured MCP server the way the agent does (stdio servers "
        "through the gate, confined like exec), list its tools as the model sees them "
        "(mcp_<server>_<tool>), then stop it. Exits 1 when a server could not be reached.",
    )
    from bot.memory.commands import add_parsers

    add_parsers(sub, common)
    from bot import onboard as onboard_steps
    from bot import pairing

    onboard_steps.add_parsers(sub, common)
    pairing.add_parsers(sub, common)
    from bot.cron import commands as cron_commands

    cron_commands.add_parsers(sub, common)
    from bot.service import commands as service_commands

    service_commands.add_parsers(sub, common)
    from bot.importer import commands as import_commands

    import_commands.add_parsers(sub, common)
    from bot.web import command as web_command

    web_command.add_parsers(sub, common)
    from bot.spend import commands as usage_commands

    usage_commands.add_parsers(sub, common)
    from bot import tasks_commands

    tasks_commands.add_parsers(sub, common)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns the exit code (see docs/commands.md's table)."""
    startup.starting()
    try:
        code = _main(argv)
        sys.stdout.flush()  # here, not at exit, so a closed pipe is caught below
        return code
    except BrokenPipeError:
        return _closed_stdout()
    except Exception as exc:
        # One place for every command: a config, state folder or workspace memobot may not
        # read or write (another user's, a folder in a file's place, a full or read-only
        # disk) is one line naming the path, and EX_CONFIG, never a traceback. Raised as an
        # OSError, or as a command's own error raised from one (a memory history's).
        problem = file_problem(exc)
        if problem is None:
            raise
        print(f"memobot: {problem}", file=sys.stderr)
        return EX_CONFIG
    finally:
        startup.started(freeze=False)  # a caller that goes on (a test) gets it back


def _closed_stdout() -> int:
    """The reader of stdout went away (``memobot status | head -3``): stop quietly. Whatever
    is still buffered goes to /dev/null, so the flush at exit cannot raise again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass  # stdout is not a real file (tests capture it): nothing will flush it at exit
    return EX_CLOSED_PIPE


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command not in ("gateway", "agent"):
        # Only those two run for long after start-up and turn collection back on themselves
        # (bot.startup); dream, import, doctor... may make garbage for minutes.
        startup.started(freeze=False)
    if not args.command:
        parser.print_help()
        return 0
    if args.command == "agent" and args.message is not None and not args.message.strip():
        print("memobot agent: error: -m/--message is empty: nothing to send", file=sys.stderr)
        return EX_USAGE
    verbose = getattr(args, "verbose", 0)
    # dream prints its one result line itself; the panel's server says what it did.
    quiet = args.command not in ("gateway", "web")
    _setup_logging(verbose, quiet, getattr(args, "log_format", "text"))
    given = "--config" if getattr(args, "config", None) else None
    if not given and os.environ.get("MEMOBOT_CONFIG"):
        given = "$MEMOBOT_CONFIG"
    config_path = (getattr(args, "config", None) or default_config_path()).expanduser()
    if given and args.command not in CREATES_CONFIG and not config_path.exists():
        # A typo must not quietly run on defaults; only the default path may be missing.
        print(
            f"memobot: config file {config_path} (from {given}) does not exist. Check the "
            f"path, or create it with: {program()} --config {config_path} onboard",
            file=sys.stderr,
        )
        return EX_CONFIG
    try:
        if args.command in ("service", "doctor"):
            from bot.service import commands as service_commands

            return service_commands.run(args)
        if args.command == "onboard":
            return cmd_onboard(args, config_path)
        if args.command == "channels":
            from bot import onboard as onboard_steps

            return onboard_steps.run_channels(args, config_path)
        if args.command == "web" and args.set_password:
            # Before the config is loaded: a listen address refused for want of a password
            # is what setting one fixes.
            from bot.web import command as web_command

            return web_command.set_password(config_path)
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
        if args.command == "mcp":
            return cmd_mcp_list(cfg, config_path)
        if args.command == "pairing":
            from bot import pairing

            return pairing.run(args, cfg.agent.state_path, config_path)
        if args.command == "cron":
            from bot.cron import commands as cron_commands

            return cron_commands.run(args, cfg)
        if args.command == "web":
            from bot.web import command as web_command

            return web_command.run(args, cfg, config_path)
        if args.command == "usage":
            from bot.spend import commands as usage_commands

            return usage_commands.run(args, cfg)
        if args.command == "tasks":
            from bot import tasks_commands

            return tasks_commands.run(args, cfg)
        if args.command in ("memory", "dream"):
            from bot.memory.commands import run

            return run(args, cfg)
    except ConfigError as exc:
        print(f"memobot: {exc}", file=sys.stderr)
        return EX_CONFIG
    except KeyboardInterrupt:
        return EX_INTERRUPTED
    parser.error(f"unknown command {args.command}")
    return EX_USAGE


def _setup_logging(verbose: int, quiet: bool, log_format: LogFormat) -> None:
    from bot.service.logs import setup_logging

    # In the terminal chat, logs would interleave with the conversation: warnings only.
    level = logging.WARNING if quiet else logging.INFO
    if verbose:
        level = logging.DEBUG if verbose > 1 else logging.INFO
    setup_logging(level, log_format)


# -- onboard ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LLMPreset:
    name: str
    base_url: str  # "" for OpenAI's own endpoint
    needs_key: bool
    model: str  # the suggested model; "" when it depends on the server


LLM_PRESETS: tuple[LLMPreset, ...] = (
    LLMPreset("OpenAI", "", True, "gpt-4o-mini"),
    LLMPreset("Ollama (local)", "http://localhost:11434/v1", False, "llama3.1"),
    LLMPreset("vLLM (local)", "http://localhost:8000/v1", False, ""),
    LLMPreset("OpenRouter", "https://openrouter.ai/api/v1", True, "openai/gpt-4o-mini"),
    LLMPreset("another OpenAI-compatible server", "", False, ""),
)


def _ask(question: str, default: str = "") -> str:
    shown = f" [{default}]" if default else ""
    while True:
        answer = input(f"{question}{shown}: ").strip() or default
        if answer:
            return answer


def ask_llm(cfg: Config) -> None:
    """Ask for the endpoint, key and model at a terminal (the key is not echoed)."""
    from getpass import getpass

    print("\nNo LLM is configured yet. Which one should memobot talk to?")
    for number, preset in enumerate(LLM_PRESETS, 1):
        print(f"  {number}. {preset.name}")
    choice = ""
    while not (choice.isdigit() and 1 <= int(choice) <= len(LLM_PRESETS)):
        choice = _ask(f"Choose 1-{len(LLM_PRESETS)}", "1")
    preset = LLM_PRESETS[int(choice) - 1]
    if preset is not LLM_PRESETS[0]:  # OpenAI: the SDK's own endpoint
        cfg.llm.base_url = _ask("Base URL", preset.base_url)
    if preset.needs_key:
        key = ""
        while not key:
            key = getpass("API key (not shown): ").strip()
        cfg.llm.api_key = key
    elif preset is LLM_PRESETS[-1]:
        cfg.llm.api_key = getpass("API key (not shown; Enter for none): ").strip()
    cfg.llm.model = _ask("Model", preset.model)


def _onboard_fields(
    cfg: Config, args: argparse.Namespace, asked_llm: bool
) -> dict[tuple[str, str], Any]:
    """The settings onboard sets in a config that exists, as the file names them."""
    fields: dict[tuple[str, str], Any] = {}
    for attr, key in (("base_url", "baseUrl"), ("api_key", "apiKey"), ("model", "model")):
        if asked_llm or getattr(args, attr) is not None:
            fields["llm", key] = getattr(cfg.llm, attr)
    if args.workspace:
        fields["agent", "workspace"] = cfg.agent.workspace
    if args.state_dir:
        fields["agent", "stateDir"] = cfg.agent.state_dir
    return fields


def _llm_flags_help(config_path: Path) -> str:
    onboard = command_for(config_path, "onboard")
    return (
        "\nNext: set an LLM. Either export OPENAI_API_KEY=sk-... (OpenAI), or run onboard "
        "again with\n"
        "  --base-url URL   an OpenAI-compatible endpoint: http://localhost:11434/v1 (Ollama),\n"
        "                   http://localhost:8000/v1 (vLLM), https://openrouter.ai/api/v1\n"
        "  --api-key KEY    the endpoint's key (local servers need none)\n"
        "  --model NAME     e.g. gpt-4o-mini, llama3.1\n"
        f"for example: {onboard} --base-url http://localhost:11434/v1 --model llama3.1\n"
        f"Run in a terminal, `{onboard}` asks for them. Or edit llm.apiKey / llm.baseUrl / "
        f"llm.model in {config_path}."
    )


def _absolute(path: str) -> str:
    """A path that means the same from every folder (``~`` expanded, not resolved)."""
    return os.path.abspath(os.path.expanduser(path))


def cmd_onboard(args: argparse.Namespace, config_path: Path) -> int:
    from bot.config import check_layout, save_config
    from bot.private import make_private_dirs
    from bot.workspace import init_workspace

    config_path = Path(_absolute(str(config_path)))
    existed = config_path.exists()
    if existed:
        cfg, _ = load_config(config_path)
        changed = False
        print(f"Config exists, kept: {config_path}")
    else:
        cfg = Config()
        # memobot's own folders live with its config (the default: ~/.memobot/...), so an
        # onboard with --config elsewhere never writes into the home folder's ~/.memobot.
        cfg.agent.workspace = str(config_path.parent / "workspace")
        cfg.agent.state_dir = str(config_path.parent / "state")
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
        cfg.agent.workspace = _absolute(args.workspace)
        changed = True
    if args.state_dir:
        cfg.agent.state_dir = _absolute(args.state_dir)
        changed = True
    check_layout(cfg, config_path)  # before anything is written
    from bot.memory.versioning import MemoryRepo, MemoryRepoError

    try:  # a memory repository memobot cannot read: before any write
        MemoryRepo(cfg.agent.workspace_path, cfg.agent.state_path).check()
    except MemoryRepoError as exc:
        print(f"memobot: {exc}", file=sys.stderr)
        return 1
    from getpass import getpass

    from bot import onboard as steps
    from channels import registry

    try:
        api_urls = _api_urls(args.api_url)
    except ValueError as exc:
        print(f"memobot onboard: error: {exc}", file=sys.stderr)
        return EX_USAGE
    llm_flags = (args.base_url, args.api_key, args.model)
    no_llm = not (cfg.llm.resolved_api_key() or cfg.llm.resolved_base_url())
    llm_new = not existed or any(v is not None for v in llm_flags)
    interactive = sys.stdin.isatty() and sys.stdout.isatty()
    plans: list[steps.ChannelPlan] = []
    asked_llm = False
    try:
        if no_llm and all(v is None for v in llm_flags) and interactive:
            ask_llm(cfg)
            changed, no_llm, llm_new, asked_llm = True, False, True, True
        # Before anything is written: a model that cannot answer is found now, not at the
        # first message.
        if llm_new and not no_llm:
            if not steps.model_check(cfg, config_path, input if interactive else None):
                print(
                    "Nothing written. Start the model's server or fix the answers, then run "
                    f"{command_for(config_path, 'onboard')} again.",
                    file=sys.stderr,
                )
                return EX_FAILED
        if interactive and not registry.enabled(cfg):
            plans = steps.ask_channels(cfg, config_path, input, getpass, api_urls)
    except (EOFError, KeyboardInterrupt):
        print("\nNothing written.", file=sys.stderr)
        return EX_INTERRUPTED
    if existed and (changed or plans):
        # Only what onboard was asked to change goes into a config that exists; the rest of
        # the file stays as written (a ${VAR} reference is not written out expanded).
        fields = _onboard_fields(cfg, args, asked_llm)
        steps.write_plans(config_path, steps.read_raw(config_path), plans, fields)
        written = [f"{s}.{k}" for s, k in fields] + [f"channels.{p.name}" for p in plans]
        print(f"Wrote {', '.join(written)} to {config_path}")
    elif changed or plans:
        save_config(cfg, config_path)
        print(f"Wrote config (mode 0600): {config_path}")
    workspace = cfg.agent.workspace_path
    created = init_workspace(workspace)
    if created:
        from bot.app import initial_memory_commit

        initial_memory_commit(workspace, cfg.agent.state_path)
    print(f"Workspace: {workspace} ({len(created)} new files and folders)")
    make_private_dirs(cfg.agent.state_path)
    print(
        f"State: {cfg.agent.state_path} (memobot's own records, outside the workspace; "
        "agent.stateDir in the config)"
    )
    if no_llm:
        print(_llm_flags_help(config_path))
    print(f"Then chat: {command_for(config_path, 'agent')}")
    for line in steps.next_steps(cfg, config_path, plans):
        print(line)
    if not registry.enabled(cfg):
        add = command_for(config_path, "channels add telegram --token TOKEN --owner YOUR_ID")
        print(f"To answer on Telegram, Discord or Slack: {add} (see channels add --help)")
    return 0


def _api_urls(given: list[str]) -> dict[str, str]:
    """``--api-url CHANNEL=URL`` options as {channel: url}; ValueError names a wrong one."""
    from bot.onboard import setup_specs

    takes = [n for n, s in setup_specs().items() if s.setup and s.setup.url_field]
    urls: dict[str, str] = {}
    for item in given:
        name, sep, url = item.partition("=")
        name = name.strip().lower()
        if not sep or name not in takes or not url.strip():
            raise ValueError(
                f"--api-url {item!r}: expected CHANNEL=URL with CHANNEL one of "
                f"{', '.join(takes)}, e.g. telegram=http://localhost:8081/bot"
            )
        urls[name] = url.strip()
    return urls


# -- agent -----------------------------------------------------------------------------------


def cmd_agent(args: argparse.Namespace, cfg: Config, config_path: Path) -> int:
    from bot.llm import LLMNotConfigured

    chat_id: str = args.session
    from bot.session import StateLayoutError, check_session_path
    from bot.workspace import workspace_shape_problem

    # A folder where a file belongs (or the reverse): one line, not a traceback per turn.
    check_session_path(cfg.agent.state_path, f"cli:{chat_id}")
    problem = workspace_shape_problem(cfg.agent.workspace_path)
    if problem:
        raise StateLayoutError(problem)
    check_access(cfg, f"cli:{chat_id}")
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
    from channels.terminal_channel.channel import (
        LogsAboveTheAnswer,
        TerminalChannel,
        colour_allowed,
    )

    stack = build_agent(cfg, config_path)
    interactive = args.message is None and sys.stdin.isatty()
    tty = sys.stdout.isatty()
    terminal = TerminalChannel(
        stack.bus,
        chat_id,
        thinking=interactive and tty,
        # Only to a person watching: stdout into a pipe or a file gets each answer exactly
        # once, whole, when it is on record (text printed while it was written cannot be
        # taken back if memobot is killed before the answer is stored, and the resumed turn
        # prints it again), and no text the model wrote before calling a tool.
        streaming=tty,
        show_tools=interactive and tty,
        # Rendered for a person chatting; `agent -m` and piped input print the model's text
        # as written (scripts read it), only cleaned of control characters on a terminal.
        markdown=interactive and tty,
        ansi=tty and colour_allowed(os.environ),
        clean=tty,
        clean_err=sys.stderr.isatty(),
    )
    root = logging.getLogger()
    handlers = list(root.handlers)
    same = _same_terminal(sys.stdout, sys.stderr)
    if terminal.thinking or (terminal.streaming and terminal.ansi and same):
        # A log line on this screen comes above the answer being written and the status
        # line, not inside them; a model retry's notice is the status line.
        root.handlers = [LogsAboveTheAnswer(h, terminal, same_screen=same) for h in handlers]
    manager = ChannelManager(stack.bus, stack.loop.ledger, [terminal])
    await manager.start()
    startup.started()
    stack.mcp.start()
    loop_task = asyncio.create_task(stack.loop.run(), name="agent-loop")
    key = f"cli:{chat_id}"
    aio = asyncio.get_running_loop()
    terminate = asyncio.Event()
    aio.add_signal_handler(signal.SIGTERM, terminate.set)
    # Set before a recovered turn runs: it may be waiting for an approval answer. Piped
    # input: the next line answers (y, a, anything else: no).
    lines = None if sys.stdin.isatty() else _stdin_lines()
    terminal.read_answer = _prompt_answers() if lines is None else _line_answers(lines)
    # An interrupted turn of this session is finished (and printed) before new input.
    stack.loop.recover([key])
    io_task = asyncio.create_task(_converse(args, stack.loop, terminal, cfg, key, lines))
    stop_wait = asyncio.create_task(terminate.wait())
    code = EX_OK
    try:
        await asyncio.wait([io_task, stop_wait], return_when=asyncio.FIRST_COMPLETED)
        if terminate.is_set():
            log.info("SIGTERM: finishing the running answer, then exiting")
            io_task.cancel()
        await stack.loop.shutdown(cfg.gateway.drain_seconds)
        await manager.flush()
        if io_task.done() and not io_task.cancelled():
            if io_task.exception():
                raise io_task.exception()  # type: ignore[misc]
            code = io_task.result()
    finally:
        for t in (io_task, stop_wait, loop_task):
            t.cancel()
        await asyncio.gather(io_task, stop_wait, loop_task, return_exceptions=True)
        await manager.stop()
        await stack.close()
        root.handlers = handlers
    return code


def _same_terminal(a: Any, b: Any) -> bool:
    """Whether the streams ``a`` and ``b`` write to one terminal (one screen)."""
    try:
        return bool(
            a.isatty()
            and b.isatty()
            and os.path.samestat(os.fstat(a.fileno()), os.fstat(b.fileno()))
        )
    except (OSError, ValueError, AttributeError):
        return False


async def _converse(
    args: argparse.Namespace,
    loop: AgentLoop,
    terminal: TerminalChannel,
    cfg: Config,
    key: str,
    lines: AsyncIterator[str] | None,
) -> int:
    """Take input until it ends; returns the exit code. ``lines``: stdin's lines when it is
    not a terminal (None: a terminal, read through a prompt)."""
    if loop.mcp is not None:
        # A one-shot question may need a server's tools: give them a moment to come up.
        await loop.mcp.wait_ready(MCP_WAIT_SECONDS)
    await loop.wait_idle(key)
    # Recovered answers are printed before a new line is taken; otherwise its intake runs
    # while an answer sits between its "sending" mark and the terminal, and a crash there
    # drops that answer unseen.
    await loop.bus.outbound.join()
    if args.message is not None:
        code = _exit_code(await _turn_with_interrupt(loop, terminal, args.message))
    elif lines is None:
        await _interactive(loop, terminal, cfg)
        code = EX_OK
    else:
        code = await _piped(loop, terminal, lines)
    return EX_CLOSED_PIPE if terminal.closed else code


def _exit_code(outcome: str) -> int:
    return {"ok": EX_OK, "stopped": EX_INTERRUPTED}.get(outcome, EX_FAILED)


async def _turn_with_interrupt(loop: AgentLoop, terminal: TerminalChannel, text: str) -> str:
    """Send one message and return how its turn ended: "ok", "failed" or "stopped".

    Ctrl-C while it runs cancels that turn instead of killing memobot; before the turn has
    started it abandons the wait (the message stays pending and is answered next time).
    """
    key = f"cli:{terminal.chat_id}"
    aio = asyncio.get_running_loop()
    asking = asyncio.ensure_future(terminal.ask(text))

    def interrupt() -> None:
        if not loop.stop(key):
            asking.cancel()

    aio.add_signal_handler(signal.SIGINT, interrupt)
    try:
        answer = await asking
    except asyncio.CancelledError:
        if asyncio.current_task().cancelling():  # type: ignore[union-attr]
            raise  # SIGTERM: we are being cancelled ourselves
        return "stopped"
    finally:
        aio.remove_signal_handler(signal.SIGINT)
    if answer is None:
        return "failed"  # not taken: memobot is shutting down
    return str(answer.metadata.get("outcome", "ok"))


async def _piped(loop: AgentLoop, terminal: TerminalChannel, lines: AsyncIterator[str]) -> int:
    """One message per line; a failed turn makes the exit code 1 but later lines are still
    sent; Ctrl-C stops the running turn and the input."""
    code = EX_OK
    async for line in lines:
        text = line.rstrip("\r\n")
        if not text.strip():
            continue
        outcome = await _turn_with_interrupt(loop, terminal, text)
        if outcome == "stopped":
            return EX_INTERRUPTED
        if terminal.closed:
            return EX_CLOSED_PIPE  # nobody reads the answers: take no more lines
        if outcome != "ok":
            code = EX_FAILED
    return code


def _line_answers(lines: AsyncIterator[str]) -> Callable[[str], Awaitable[str | None]]:
    """Approval answers read from the same stdin lines as the messages (piped input)."""

    async def read(prompt: str) -> str | None:
        sys.stderr.write(prompt)
        sys.stderr.flush()
        try:
            line = await anext(lines)
        except StopAsyncIteration:
            return None
        sys.stderr.write(line if line.endswith("\n") else line + "\n")
        return line

    return read


def _prompt_answers() -> Callable[[str], Awaitable[str | None]]:
    """Approval answers typed at a prompt_toolkit prompt (a terminal)."""
    from prompt_toolkit import PromptSession
    from prompt_toolkit.patch_stdout import patch_stdout

    if sys.stdout.isatty():
        prompt: PromptSession[str] = PromptSession()

        async def read(text: str) -> str | None:
            with patch_stdout():
                return await prompt.prompt_async(text)

        return read

    # stdout is a pipe or a file that takes the answers only: the question is on stderr.
    from prompt_toolkit.output import create_output

    on_stderr: PromptSession[str] = PromptSession(output=create_output(stdout=sys.stderr))

    async def read_on_stderr(text: str) -> str | None:
        return await on_stderr.prompt_async(text)

    return read_on_stderr


def _loop_can_watch(fd: int) -> bool:
    """Whether the event loop's selector accepts ``fd``: epoll refuses regular files and
    some devices (``/dev/null``) with EPERM, which asyncio reports only later, in a callback,
    leaving a reader that never sees the end of input."""
    selector = selectors.DefaultSelector()
    try:
        selector.register(fd, selectors.EVENT_READ)
    except (OSError, ValueError):
        return False
    finally:
        selector.close()
    return True


async def _stdin_lines() -> AsyncIterator[str]:
    """Lines of stdin without a blocking read in the event loop (a SIGTERM must get through).

    Any stdin works: a pipe or socket is watched by the loop, a regular file is read
    directly, and anything else (``/dev/null``, other devices) through a reader thread.
    """
    fd = sys.stdin.fileno()
    if stat.S_ISREG(os.fstat(fd).st_mode):
        for line in sys.stdin:  # a regular file never blocks
            yield line
        return
    if not _loop_can_watch(fd):
        async for line in _thread_lines(fd):
            yield line
        return
    reader = asyncio.StreamReader(limit=STDIN_LINE_LIMIT)
    await asyncio.get_running_loop().connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), sys.stdin
    )
    while line := await reader.readline():
        yield line.decode("utf-8", errors="replace")


async def _thread_lines(fd: int) -> AsyncIterator[str]:
    """Lines of ``fd`` read by a daemon thread. It uses ``os.read``, not ``sys.stdin``, so it
    holds no buffer lock when the process exits while it still waits for input."""
    aio = asyncio.get_running_loop()
    chunks: asyncio.Queue[bytes] = asyncio.Queue()

    def pump() -> None:
        while True:
            try:
                data = os.read(fd, 65536)
            except OSError:
                data = b""  # an unreadable stdin ends the input like EOF
            try:
                aio.call_soon_threadsafe(chunks.put_nowait, data)
            except RuntimeError:
                return  # the event loop is closed: nobody is reading any more
            if not data:
                return

    threading.Thread(target=pump, name="stdin-reader", daemon=True).start()
    pending = b""
    while data := await chunks.get():
        pending += data
        *lines, pending = pending.split(b"\n")
        for line in lines:
            yield line.decode("utf-8", errors="replace") + "\n"
        if len(pending) > STDIN_LINE_LIMIT:
            raise ValueError(f"a line of stdin is longer than {STDIN_LINE_LIMIT} bytes")
    if pending:
        yield pending.decode("utf-8", errors="replace")


async def _interactive(loop: AgentLoop, terminal: TerminalChannel, cfg: Config) -> None:
    from prompt_toolkit import PromptSession
    from prompt_toolkit.history import FileHistory
    from prompt_toolkit.patch_stdout import patch_stdout

    from bot.private import create_private_file

    history_file = cfg.agent.state_path / "cli_history"
    create_private_file(history_file)  # what was typed is as private as the transcript
    prompt: PromptSession[str] = PromptSession(history=FileHistory(str(history_file)))
    terminal.read_answer = _prompt_answers()
    print(
        "memobot: type a message, /help for commands, Ctrl-C stops an answer, "
        "exit or Ctrl-D ends the chat."
    )
    while True:
        try:
            with patch_stdout():
                text = await prompt.prompt_async("you> ")
        except KeyboardInterrupt:
            continue  # Ctrl-C at the prompt clears the line, as in a shell
        except EOFError:
            return
        text = text.strip()
        if text.lower() in EXIT_WORDS:
            return
        if text:
            await _turn_with_interrupt(loop, terminal, text)


# -- gateway ---------------------------------------------------------------------------------


def check_access(cfg: Config, session: str | None = None) -> None:
    """Open what every turn reads (the prompt files, the history, the sessions folder, and
    ``session``'s file for reading and appending): one another user owns stops the command
    here, with the one line of bot.file_errors, instead of failing each turn."""
    from bot import workspace_files
    from bot.file_errors import about
    from bot.session import key_to_filename
    from bot.workspace import HISTORY_FILE, WORKSPACE_PROMPT_FILES

    workspace = cfg.agent.workspace_path
    if workspace.exists():
        for name in (*WORKSPACE_PROMPT_FILES, HISTORY_FILE):
            with contextlib.suppress(FileNotFoundError):  # a link counts as absent, too
                os.close(workspace_files.open_fd(workspace, name))
    folder = cfg.agent.state_path / "sessions"
    with about(folder), contextlib.suppress(FileNotFoundError):
        os.listdir(folder)
    # Where every turn writes (a new chat's file, the history, memory's commits).
    for place in (workspace, workspace / "memory", cfg.agent.state_path, folder):
        if place.is_dir() and not os.access(place, os.W_OK | os.X_OK):
            read_only = os.statvfs(place).f_flag & os.ST_RDONLY
            err = errno.EROFS if read_only else errno.EACCES
            with about(place, "write to"):
                raise OSError(err, os.strerror(err), str(place))
    if session is not None:
        path = folder / key_to_filename(session)
        with about(path), contextlib.suppress(FileNotFoundError):
            os.close(os.open(path, os.O_RDWR | os.O_CLOEXEC))


def cmd_gateway(cfg: Config, config_path: Path) -> int:
    from bot.gateway import run_gateway
    from bot.llm import LLMNotConfigured

    check_access(cfg)
    try:
        return asyncio.run(run_gateway(cfg, config_path))
    except LLMNotConfigured as exc:
        print(f"memobot: {exc}", file=sys.stderr)
        return EX_CONFIG


# -- status ----------------------------------------------------------------------------------


def cmd_mcp_list(cfg: Config, config_path: Path) -> int:
    """Start each MCP server once, print its state and tools; 1 if one failed."""
    from bot.app import mcp_log_dir, probe_mcp_servers

    if not cfg.tools.mcp_servers:
        print("No MCP servers configured (tools.mcpServers in the config).")
        return EX_OK
    statuses = probe_mcp_servers(cfg, config_path)
    failed = 0
    for st in statuses:
        where = cfg.tools.mcp_servers[st.name]
        target = (
            " ".join([where.command, *where.args])
            if st.transport == "stdio"
            else redact_url(where.url)
        )
        # Output that gets pasted into bug reports: a ${VAR} secret in a url stays out of it.
        print(redact(f"{st.name} ({st.transport}: {target}): {st.state}, {st.detail}"))
        for name in st.tools:
            print(f"  {name}")
        if st.state != "connected":
            failed += 1
            if st.transport == "stdio":
                print(f"  its stderr: {mcp_log_dir(cfg) / (st.name + '.log')}")
    return EX_FAILED if failed else EX_OK


def cmd_status(cfg: Config, config_path: Path) -> int:
    from bot.status import status_rows

    rows = status_rows(cfg, config_path)
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k.ljust(width)}  {v}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
