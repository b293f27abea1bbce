"""``memobot web``: a one-time login link to the panel, and the panel itself while no gateway
runs; ``memobot web --set-password`` for a panel behind a reverse proxy."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import signal
import sys
import webbrowser
from pathlib import Path
from typing import Any

from bot.config import EX_CONFIG, Config, ConfigError, read_raw, set_options
from bot.invocation import command_for

EX_OK, EX_FAILED, EX_USAGE = 0, 1, 2
MIN_PASSWORD = 12


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    web = sub.add_parser(
        "web",
        parents=[common],
        help="the control panel in the browser: prints a one-time login link",
        description="Print a link that logs you in to memobot's control panel (it works once, "
        "for 10 minutes; only the link is printed when stdout is not a terminal). A running "
        "gateway serves the panel (web.listen, default 127.0.0.1:8765); with none running, "
        "this command serves it until Ctrl-C, on the same config and state.",
    )
    web.add_argument("--open", action="store_true", help="open the link in a web browser")
    web.add_argument(
        "--set-password",
        action="store_true",
        help="ask for a password for the panel (twice, in a terminal) and store its scrypt "
        "hash as web.passwordHash: needed to listen beyond this machine (behind a proxy)",
    )


def run(args: argparse.Namespace, cfg: Config, config_path: Path) -> int:
    """The link (and the panel, while no gateway runs). ``--set-password`` is
    :func:`set_password`, called before the config is loaded."""
    if not cfg.web.enabled:
        _err(f"the panel is off: web.enabled is false in {config_path}")
        return EX_CONFIG
    from bot.gateway import read_status
    from bot.web.links import LinkBook
    from bot.web.server import login_url

    live = read_status(cfg.agent.state_path)
    if live is None:
        return asyncio.run(serve_alone(cfg, config_path, args.open))
    base = live.get("web")
    if not isinstance(base, str) or not base:
        _err(
            f"a gateway is running (pid {live.get('pid')}) without the panel: web.enabled was "
            "false when it started, or its address was taken (its log says which). Restart "
            f"it, or stop it and run {command_for(config_path, 'web')} alone."
        )
        return EX_FAILED
    _show(login_url(base, LinkBook(cfg.agent.state_path).issue()), args.open, serving=False)
    return EX_OK


def _show(url: str, open_browser: bool, serving: bool) -> None:
    if sys.stdout.isatty():
        print(f"Open the panel (this link works once, for 10 minutes):\n  {url}", flush=True)
        if serving:
            print("No gateway is running: the panel is served from here until Ctrl-C.", flush=True)
    else:
        print(url, flush=True)  # only the link: it goes into another program
        if serving:
            print("memobot web: serving the panel until stopped (no gateway runs)", file=sys.stderr)
    if open_browser and not webbrowser.open(url):
        _err("could not open a browser: open the link above yourself")


async def serve_alone(cfg: Config, config_path: Path, open_browser: bool) -> int:
    """The panel on its own, in the foreground, until SIGINT or SIGTERM."""
    from bot.web.links import LinkBook
    from bot.web.server import Panel, login_url

    panel = Panel(cfg, config_path, in_gateway=False)
    problem = await panel.start()
    if problem is not None:
        _err(problem)
        return EX_FAILED
    stop = asyncio.Event()
    aio = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        aio.add_signal_handler(sig, stop.set)
    try:
        token = await asyncio.to_thread(LinkBook(cfg.agent.state_path).issue)
        _show(login_url(panel.base_url, token), open_browser, serving=True)
        await stop.wait()
    finally:
        await panel.stop()
    return EX_OK


def set_password(config_path: Path) -> int:
    """Ask twice at a terminal, write the hash into the file's own JSON."""
    from bot.web.passwords import hash_password

    if not sys.stdin.isatty():
        _err("--set-password asks at a terminal (the password is not taken from a pipe)")
        return EX_USAGE
    try:
        first = getpass.getpass("New password for the panel: ")
        if len(first) < MIN_PASSWORD:
            _err(f"too short: use at least {MIN_PASSWORD} characters")
            return EX_USAGE
        if getpass.getpass("The same again: ") != first:
            _err("the two did not match; nothing written")
            return EX_USAGE
    except (EOFError, KeyboardInterrupt):
        print(file=sys.stderr)
        return EX_USAGE
    try:
        set_options(
            config_path, read_raw(config_path), {("web", "passwordHash"): hash_password(first)}
        )
    except ConfigError as exc:
        _err(str(exc))
        return EX_CONFIG
    print(
        f"Wrote web.passwordHash to {config_path}. A running gateway uses it after a restart.",
        flush=True,
    )
    return EX_OK


def _err(text: str) -> None:
    print(f"memobot web: {text}", file=sys.stderr, flush=True)
