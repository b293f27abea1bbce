"""The Chats, Tools, Logs and Usage screens in Chromium at a phone's width (390 px): nothing wider
than the screen, and the Logs page's live tail (static/logs.js over server-sent events)
showing a new line as text, under the panel's Content-Security-Policy."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from bot.config import load_config
from bot.gateway import Gateway
from bot.session import SessionStore
from bot.spend.ledger import month_file
from bot.spend.record import CallRecord, now_utc
from tests.helpers import config_dict
from tests.helpers.browser import BROWSER_TEST, csp_violations
from tests.helpers.web import browsing, panel_section, seed_task

if TYPE_CHECKING:
    from playwright.async_api import Page

pytestmark = BROWSER_TEST

NO_LLM = "http://127.0.0.1:9/v1"
log = logging.getLogger("bot.test_browser_screens")


async def test_the_screens_fit_a_phone_and_the_log_tail_is_live(
    browser_page: Page, tmp_path: Path
) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(config_dict(tmp_path, NO_LLM, web=panel_section())))
    cfg, _ = load_config(config)
    store = SessionStore(cfg.agent.state_path)
    long_word = "x" * 300  # no break opportunity: it must wrap, not widen the page
    store.append(
        store.get("telegram:7"),
        [
            {"role": "user", "content": f"<b>hi</b> {long_word}"},
            {"role": "assistant", "content": f"an answer {long_word}"},
        ],
    )
    usage = month_file(cfg.agent.state_path, now_utc()[:7])
    usage.parent.mkdir(parents=True)
    usage.write_bytes(
        CallRecord(
            "a",
            now_utc(),
            "telegram:7",
            "turn",
            long_word,
            "e",
            10**9,
            10**8,
            10**9,
            False,
            1e6,
            "USD",
        ).line()
    )
    seed_task(cfg.agent.state_path)
    gateway = Gateway(cfg, config)
    root = logging.getLogger()
    root.addHandler(gateway.logs)  # as Gateway.run does
    await browser_page.set_viewport_size({"width": 390, "height": 800})
    try:
        async with browsing(cfg, config, gateway=gateway) as panel:
            await browser_page.goto(panel.link())
            await browser_page.wait_for_url(panel.base + "/")
            screens = (
                "/chats",
                "/chats/view?key=telegram:7",
                "/tools",
                "/logs",
                "/usage?by=model",
                "/tasks",
                "/tasks/view?id=abcd",
            )
            for path in screens:
                await browser_page.goto(panel.base + path)
                width = await browser_page.evaluate("document.documentElement.scrollWidth")
                assert width <= 390, (path, width)

            await browser_page.goto(panel.base + "/logs?level=INFO&session=telegram:7")
            await browser_page.wait_for_selector('#log[data-live="on"]')
            log.warning("elsewhere session=telegram:8")
            log.warning("live <b>line</b> session=telegram:7")
            line = browser_page.locator("#log .line", has_text="live <b>line</b>")
            await line.wait_for()
            assert await line.get_attribute("class") == "line warning"
            assert await browser_page.locator("#log b").count() == 0  # text, never markup
            assert await browser_page.locator("#log", has_text="elsewhere").count() == 0
            assert await csp_violations(browser_page) == []
            assert await browser_page.page_errors() == []
    finally:
        root.removeHandler(gateway.logs)
        await gateway.stack.close()
