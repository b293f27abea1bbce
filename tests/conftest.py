"""Suite-wide guards: no test may reach past the loopback interface."""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import pytest_asyncio
from _pytest.logging import LogCaptureHandler

from bot.service.logs import SECRETS
from tests.fakes.llm_server import FakeLLM
from tests.fakes.telegram_api import FakeBotAPI
from tests.helpers import browser, bytecode, zygote

if TYPE_CHECKING:
    from playwright.async_api import Browser, Page

# The suite starts memobot several hundred times. A machine that sets PYTHONDONTWRITEBYTECODE
# (this one does) would have each start compile memobot's modules again, a third of a second
# of CPU, where an installation compiles them once: the suite caches bytecode as users do.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput") or not config.getoption("numprocesses", None):
        return  # an xdist worker, or the only process
    bytecode.prepare(config, Path(__file__).resolve().parents[1])
    zygote.start_shared()


_real_connect = socket.socket.connect
_real_connect_ex = socket.socket.connect_ex


def _check(address: object) -> None:
    if not isinstance(address, tuple):
        return  # AF_UNIX paths
    host = str(address[0])
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        raise RuntimeError(f"test tried to connect to a hostname: {host}") from None
    if not ip.is_loopback:
        raise RuntimeError(f"test tried to leave 127.0.0.1: connect to {host}")


def _guarded_connect(self: socket.socket, address: object) -> None:
    _check(address)
    return _real_connect(self, address)


def _guarded_connect_ex(self: socket.socket, address: object) -> int:
    _check(address)
    return _real_connect_ex(self, address)


@pytest.fixture(autouse=True)
def _no_network_beyond_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket.socket, "connect", _guarded_connect)
    monkeypatch.setattr(socket.socket, "connect_ex", _guarded_connect_ex)


@pytest.fixture(autouse=True)
def _own_logging() -> Iterator[None]:
    """A test that runs memobot's main() in-process has its logging set up: the root logger's
    handlers replaced by one writing to that test's captured stderr. Put back after the test,
    or every later log line of the worker went through it (about 1 ms each, minutes a run)."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        if handler not in handlers and SECRETS in handler.filters:  # memobot's own
            root.removeHandler(handler)
    for handler in handlers:  # pytest's for the whole session, not one phase's capture
        if handler not in root.handlers and not isinstance(handler, LogCaptureHandler):
            root.addHandler(handler)
    root.setLevel(level)


@pytest.fixture(autouse=True)
def _own_secrets() -> Iterator[None]:
    """Each test's config adds its secrets to the process's one log filter: forgotten after
    the test, or a worker's filter grows to thousands and every log line slows down."""
    yield
    SECRETS.forget()


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory):
    # A developer's own key or config must never leak into a test run.
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "MEMOBOT_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path_factory.mktemp("home")))


# Modules whose tests start memobot processes and wait on them go first: the workers share
# two cores, and a long test handed out last leaves the others idle at the end of the run.
_LONG_FIRST = (
    "test_crash.py", "test_cron_gateway.py", "test_containment.py", "test_outage.py",
    "test_import_nanobot.py", "test_approvals.py", "test_mcp.py", "test_cli_first_hour.py",
    "test_streaming_crash.py", "test_streaming_slack_crash.py", "test_telegram.py",
    "test_provenance.py", "test_power_loss.py", "test_limits.py", "test_versioning.py",
    "test_cli.py", "test_hostile_workspace.py", "test_nanobot_compat.py",
)  # fmt: skip


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(_LONG_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


# The fakes most modules talk to; a module that needs them otherwise (a threaded LLM, a fake
# with other rules) defines its own fixture of the same name.
@pytest.fixture
async def llm() -> AsyncIterator[FakeLLM]:
    async with FakeLLM() as server:
        yield server


@pytest.fixture
async def api() -> AsyncIterator[FakeBotAPI]:
    async with FakeBotAPI() as server:
        yield server


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    # -q prints no skip reasons: say once how to get the browser tests to run.
    skipped = terminalreporter.stats.get("skipped", [])
    if any(browser.INSTALL_HINT in str(report.longrepr) for report in skipped):
        terminalreporter.write_line(
            f"The browser tests were skipped: no Chromium. `{browser.INSTALL_HINT}` (as root) "
            "runs them."
        )


# Real-browser tests (tests/helpers/browser.py): one Chromium per worker, launched by the first
# browser test that worker runs (about a second), a fresh context and page for each test.
@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def chromium() -> AsyncIterator[Browser]:
    async for launched in browser.launch():
        yield launched


@pytest_asyncio.fixture(loop_scope="session")
async def browser_page(request: pytest.FixtureRequest, chromium: Browser) -> AsyncIterator[Page]:
    if problems := browser.loop_mismatches(request.node):
        pytest.fail(
            "not on the browser's event loop (tests/helpers/browser.py): " + "; ".join(problems)
        )
    async for page in browser.new_page(chromium):
        yield page
