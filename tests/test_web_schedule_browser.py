"""The Schedule screen in Chromium, 390 px wide, no script: a job added with the form and
fired with "Run now" reaches its chat once, and the page shows how the run ended."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

from bot.config import load_config
from bot.cron.scheduler import Scheduler
from bot.cron.store import JobStore
from tests.helpers import Harness, write_config
from tests.helpers.browser import BROWSER_TEST, csp_violations
from tests.helpers.web import browsing, panel_section

if TYPE_CHECKING:
    from playwright.async_api import Page

pytestmark = BROWSER_TEST

NO_LLM = "http://127.0.0.1:9/v1"  # a reminder is sent as it is: no model call


async def test_a_job_added_in_the_browser_fires_once_when_run_now(
    browser_page: Page, tmp_path: Path
) -> None:
    config = write_config(tmp_path, NO_LLM, web=panel_section())
    cfg, _ = load_config(config)
    store = JobStore(cfg.agent.state_path)
    page = browser_page
    await page.set_viewport_size({"width": 390, "height": 844})
    async with Harness(cfg, config, channels=("telegram",)) as harness:
        stack = harness.stack
        scheduler = Scheduler(cfg, store, stack.bus, stack.store, {"telegram"})
        scheduler.start()
        try:
            gateway = SimpleNamespace(stack=stack, scheduler=scheduler)
            async with browsing(cfg, config, gateway=gateway) as panel:
                await page.goto(panel.link())
                await page.wait_for_url(panel.base + "/")
                await page.get_by_role("link", name="Schedule").click()
                await page.wait_for_url(panel.base + "/schedule")
                await page.get_by_label("Chat", exact=True).fill("telegram:1001")
                await page.get_by_label("Message", exact=True).fill("drink <some> water")
                await page.get_by_label("Or every … seconds").fill("3600")
                await page.get_by_label("Send the message as it is").check()
                await page.get_by_role("button", name="Add the job").click()
                await page.wait_for_url(panel.base + "/schedule")
                [job] = store.load().jobs
                assert f"Job {job.id} added" in await page.locator(".notice").inner_text()
                row = page.locator("tr", has_text=job.id)
                assert "drink <some> water" in await row.inner_text()
                # Nothing wider than the phone: the table stacks, the form fits.
                width = await page.evaluate("document.documentElement.scrollWidth")
                assert width <= 390

                await row.get_by_role("button", name="Run now").click()
                await page.wait_for_url(panel.base + "/schedule")
                assert "started now" in await page.locator(".notice").inner_text()
                for _ in range(100):
                    sent = [m.text for m in harness.outbox if m.final]
                    if sent:
                        break
                    await asyncio.sleep(0.05)
                await page.reload()
                runs = page.get_by_role("table", name="Recent runs")
                assert "ok" in await runs.inner_text() and "(run now)" in await runs.inner_text()
                assert [m.text for m in harness.outbox if m.final] == ["drink <some> water"]
                assert store.load().jobs[0].next_run == job.next_run  # the schedule as it was
                assert await csp_violations(page) == []
                assert await page.page_errors() == []
        finally:
            await scheduler.stop()
