"""The panel in Chromium (its protections against a plain HTTP client are in
test_web_security.py): what a real browser makes of the login link, the session cookie, the
logout form and the Content-Security-Policy."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from bot.config import load_config
from bot.web.sessions import COOKIE
from tests.helpers import write_config
from tests.helpers.browser import BROWSER_TEST, csp_violations
from tests.helpers.web import browsing, panel_section

if TYPE_CHECKING:
    from playwright.async_api import Page

pytestmark = BROWSER_TEST

NO_LLM = "http://127.0.0.1:9/v1"  # the panel's pages never call the model


async def test_a_login_link_logs_the_browser_in_once_and_no_page_breaks_the_csp(
    browser_page: Page, tmp_path: Path
) -> None:
    config = write_config(tmp_path, NO_LLM, web=panel_section())
    cfg, _ = load_config(config)
    async with browsing(cfg, config) as panel:
        link = panel.link()
        response = await browser_page.goto(link)
        assert response is not None and response.status == 200
        # The logged-in page moves on to the overview by itself, the cookie with it.
        await browser_page.wait_for_url(panel.base + "/")
        assert "Overview" in await browser_page.title()
        (cookie,) = [c for c in await browser_page.context.cookies() if c["name"] == COOKIE]
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        assert await browser_page.evaluate("document.cookie") == ""

        # Logging out is a form POST with its CSRF field and the browser's own Origin.
        await browser_page.get_by_role("button", name="Log out").click()
        await browser_page.wait_for_url(panel.base + "/logged-out")

        response = await browser_page.goto(link)
        assert response is not None and response.status == 403
        assert "used already" in await browser_page.content()
        await browser_page.goto(panel.base + "/")
        assert (await browser_page.title()).startswith("Log in")  # the second use let no one in
        assert await csp_violations(browser_page) == []
        assert await browser_page.page_errors() == []
