"""The Memory screen in Chromium at a phone's width: edit USER.md, see the change before
saving, find the commit in the log, revert it (forms only, no script)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from bot.config import load_config
from bot.memory.versioning import WEB_AUTHOR, MemoryRepo
from bot.workspace import init_workspace
from tests.helpers import write_config
from tests.helpers.browser import BROWSER_TEST, csp_violations
from tests.helpers.web import browsing, panel_section

if TYPE_CHECKING:
    from playwright.async_api import Page

pytestmark = BROWSER_TEST

NO_LLM = "http://127.0.0.1:9/v1"
PHONE = {"width": 390, "height": 844}


async def fits(page: Page) -> bool:
    """Nothing wider than the screen (no sideways scrolling)."""
    return await page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")


async def test_edit_user_md_see_the_commit_and_revert_it(
    browser_page: Page, tmp_path: Path
) -> None:
    config = write_config(tmp_path, NO_LLM, web=panel_section())
    cfg, _ = load_config(config)
    ws = cfg.agent.workspace_path
    init_workspace(ws)
    user = ws / "USER.md"
    user.write_text("\n" + user.read_text())  # a first blank line survives the textarea
    repo = MemoryRepo(ws, cfg.agent.state_path)
    repo.commit("memobot: memory files from the template\n")
    before = (ws / "USER.md").read_text()
    page = browser_page
    await page.set_viewport_size(PHONE)
    async with browsing(cfg, config) as panel:
        await page.goto(panel.link())
        await page.wait_for_url(panel.base + "/")
        await page.get_by_role("link", name="Memory", exact=True).click()
        await page.wait_for_url(panel.base + "/memory")
        assert await fits(page)
        await page.get_by_role("row", name="USER.md").get_by_role("link", name="Edit").click()
        text = await page.locator("textarea").input_value()
        assert text == before  # the textarea holds the file as it is (first line included)
        await page.locator("textarea").fill(before + "- Drinks tea, no sugar\n")
        await page.get_by_role("button", name="Preview changes").click()
        await page.wait_for_url(panel.base + "/memory/preview")
        assert "+- Drinks tea, no sugar" in await page.locator("pre.diff").inner_text()
        assert (ws / "USER.md").read_text() == before  # not saved yet
        assert await fits(page)
        await page.get_by_role("button", name="Save").click()
        await page.wait_for_url(panel.base + "/memory/file?path=USER.md")
        [head] = repo.log(limit=1)
        notice = await page.locator(".notice").inner_text()
        assert f"Saved USER.md: commit {head.short_id} (by web)." in notice
        assert (ws / "USER.md").read_bytes() == (
            before + "- Drinks tea, no sugar\n"
        ).encode()  # LF kept
        assert head.author == WEB_AUTHOR

        await page.get_by_role("link", name="Changes").click()
        change = page.locator("article.change").first
        assert "web: USER.md edited by web" in await change.inner_text()
        await change.get_by_text("What changed").click()  # a <details>: no script needed
        assert "+- Drinks tea, no sugar" in await change.locator("pre.diff").inner_text()
        assert await fits(page)
        await change.get_by_role("button", name="Revert").click()
        await page.wait_for_url(panel.base + "/memory/log")
        notice = await page.locator(".notice").inner_text()
        assert f"Reverted {head.short_id}: web: USER.md edited by web as" in notice
        assert (ws / "USER.md").read_text() == before
        assert await csp_violations(page) == []
        assert await page.page_errors() == []
