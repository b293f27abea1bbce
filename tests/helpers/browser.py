"""Real-browser tests: Playwright for Python driving Debian's Chromium (``apt-get install
chromium``; no browser is downloaded at run time).

A browser test is an async test in a module marked ``pytestmark = BROWSER_TEST`` that takes the
``browser_page`` fixture (tests/conftest.py) and serves what it tests with :func:`serve`::

    pytestmark = BROWSER_TEST

    async def test_page(browser_page: Page) -> None:
        async with serve(app) as url:
            await browser_page.goto(url)

One Chromium is launched per worker and shared; each test gets a context (cookies, storage)
and a page of its own. Playwright's objects belong to the event loop that started them, so
the browser, its pages and the test all run in the worker's session-wide loop: an async
fixture such a test uses must be declared with ``loop_scope="session"`` too (a fixture on a
loop of its own would start a server that nothing runs while the test waits on it; the
``browser_page`` fixture refuses such a test, naming the fixture).
"""

from __future__ import annotations

import inspect
import os
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, NoReturn

import pytest
from aiohttp import web

if TYPE_CHECKING:
    from playwright.async_api import Browser, Page

INSTALL_HINT = "apt-get install chromium"
# Every wait of a page (navigation, a click, a selector): long enough for a loaded 2-core
# machine, short enough that a broken page fails in seconds, not at the 120 s test timeout.
TIMEOUT_MS = 10_000
# The browser's loop. Each worker that runs a browser test launches its own Chromium (0.8 s on
# a quiet machine, 2 to 3 s beside busy workers). Keeping them to one worker (a scheduler that
# hands every browser module to one worker, xdist's LoadScopeScheduling) cost more than it
# saved: 286 s against 246 s for the whole suite, its workers idle between single tests.
BROWSER_TEST = pytest.mark.asyncio(loop_scope="session")


def find_chromium() -> str | None:
    """The system Chromium: ``chromium`` on PATH, else Debian's /usr/bin/chromium; None when
    neither is there."""
    found = shutil.which("chromium")
    if found:
        return found
    return "/usr/bin/chromium" if os.access("/usr/bin/chromium", os.X_OK) else None


def under_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1")


def no_browser(reason: str) -> NoReturn:
    """A browser test that cannot run: skipped on a developer's machine, failed under CI
    (``CI=true``), where a missing browser must not pass as a green run."""
    message = f"{reason}: the browser tests need Debian's Chromium (`{INSTALL_HINT}`)"
    if under_ci():
        pytest.fail(f"{message}; under CI a missing browser fails the run", pytrace=False)
    pytest.skip(message)


async def launch() -> AsyncIterator[Browser]:
    """Playwright started and the system Chromium launched headless; closed on exit."""
    executable = find_chromium()
    if executable is None:
        no_browser("no Chromium on PATH or at /usr/bin/chromium")
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        no_browser("Playwright is not installed (pip install -e '.[test]')")
    async with async_playwright() as playwright:
        # No GPU process: headless pages need none, and its software GL cost a fifth of the
        # browser tests' CPU (22 s against 18 s for the 13 of them on one worker).
        browser = await playwright.chromium.launch(
            executable_path=executable, headless=True, args=["--disable-gpu"]
        )
        try:
            yield browser
        finally:
            await browser.close()


def loop_mismatches(item: pytest.Function) -> list[str]:
    """What keeps ``item`` off the browser's session-wide loop: its own loop scope, and each
    async fixture it uses that runs on a loop of its own."""
    problems = []
    marker = item.get_closest_marker("asyncio")
    scope = marker.kwargs.get("loop_scope") if marker else None
    if scope != "session":
        problems.append(f"the test's loop scope is {scope or 'function'}: mark it BROWSER_TEST")
    # _fixtureinfo is pytest's, _loop_scope pytest-asyncio's (set by @pytest_asyncio.fixture):
    # neither offers a public way to ask which loop a fixture runs on.
    for name, defs in item._fixtureinfo.name2fixturedefs.items():
        func = defs[-1].func
        is_async = inspect.iscoroutinefunction(func) or inspect.isasyncgenfunction(func)
        if is_async and getattr(func, "_loop_scope", None) != "session":
            problems.append(f"async fixture {name!r} is not on loop_scope='session'")
    return problems


async def new_page(browser: Browser) -> AsyncIterator[Page]:
    """A page in a fresh context (no cookies or storage from another test), closed on exit."""
    context = await browser.new_context()
    context.set_default_timeout(TIMEOUT_MS)
    try:
        yield await context.new_page()
    finally:
        await context.close()


async def csp_violations(page: Page) -> list[str]:
    """The console's Content-Security-Policy reports on ``page``, every page it showed."""
    messages = await page.console_messages(filter="all")
    return [m.text for m in messages if "Content Security Policy" in m.text]


@asynccontextmanager
async def serve(app: web.Application, host: str = "127.0.0.1") -> AsyncIterator[str]:
    """``app`` served on ``host`` at a free port; yields its base URL (``http://HOST:PORT``)."""
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, host, 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()
