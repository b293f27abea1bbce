"""The panel's first hour in Chromium, against a gateway's agent and a real Telegram channel
in this process (the fake Bot API, the fake model): a stranger is refused, the owner sees
them in the panel and lets them in, and their next message is answered; a wrong setting is
refused with its field marked, and a right one takes effect without a restart."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from bot.config import load_config
from tests.fakes.llm_server import FakeLLM
from tests.fakes.telegram_api import FakeBotAPI
from tests.helpers import telegram_in_process, write_config
from tests.helpers.browser import BROWSER_TEST, csp_violations
from tests.helpers.web import GatewayInProcess, browsing, panel_section

if TYPE_CHECKING:
    from playwright.async_api import Page

pytestmark = BROWSER_TEST
STRANGER = 2002


async def test_first_hour_a_refused_sender_is_let_in_from_the_panel(
    browser_page: Page, tmp_path: Path
) -> None:
    async with FakeLLM() as llm, FakeBotAPI() as api:
        # What `memobot onboard` leaves when no owner id was given: Telegram on, nobody in
        # allowFrom (so strangers get a pairing code, the default).
        telegram = {"enabled": True, "token": api.token, "baseUrl": api.base_url}
        config = write_config(
            tmp_path, llm.base_url, channels={"telegram": telegram}, web=panel_section()
        )
        cfg, _ = load_config(config)
        async with telegram_in_process(cfg, config) as (stack, channel, _manager):
            gateway = GatewayInProcess(cfg, config, stack, [channel])
            async with browsing(cfg, config, gateway=gateway) as panel:
                api.private_text("hello?", user_id=STRANGER, username="owner")
                await api.wait_sent_async(1, STRANGER, 30)  # its pairing code
                page = browser_page
                await page.goto(panel.link())
                await page.wait_for_url(panel.base + "/")
                await page.get_by_role("link", name="Access").click()
                section = page.get_by_role("region", name="telegram")
                let_in = page.get_by_role("button", name="Let in", exact=True)
                row = section.get_by_role("row").filter(has=let_in)
                await row.get_by_role("cell", name=str(STRANGER), exact=True).wait_for()
                await row.get_by_role("cell", name="@owner", exact=True).wait_for()
                await row.get_by_role("button", name="Let in", exact=True).click()
                await page.wait_for_url(panel.base + "/access")
                notice = page.get_by_role("status").filter(has_text="Let in telegram user")
                await notice.wait_for()
                assert "Applied now: channels.telegram.allowFrom" in await notice.inner_text()
                api.private_text("now?", user_id=STRANGER, username="owner")
                await api.wait_for_async(
                    lambda: any("echo: now?" in c.params["text"] for c in api.sent(STRANGER)),
                    30,
                )
                saved = json.loads(config.read_text())["channels"]["telegram"]
                assert saved["allowFrom"] == [str(STRANGER)]
                assert llm.requests  # answered by the model
                assert await csp_violations(page) == []


async def test_a_wrong_setting_is_marked_and_a_right_one_applies_at_once(
    browser_page: Page, tmp_path: Path
) -> None:
    async with FakeLLM() as llm, FakeBotAPI() as api:
        telegram = {
            "enabled": True,
            "token": api.token,
            "baseUrl": api.base_url,
            "allowFrom": ["1001"],
        }
        config = write_config(
            tmp_path, llm.base_url, channels={"telegram": telegram}, web=panel_section()
        )
        cfg, _ = load_config(config)
        async with telegram_in_process(cfg, config) as (stack, channel, _manager):
            gateway = GatewayInProcess(cfg, config, stack, [channel])
            async with browsing(cfg, config, gateway=gateway) as panel:
                page = browser_page
                await page.goto(panel.link())
                await page.wait_for_url(panel.base + "/")
                await page.goto(panel.base + "/settings/llm")
                before = config.read_bytes()
                await page.get_by_label("temperature", exact=True).fill("hot")
                await page.get_by_label("model", exact=True).fill("model-two")
                await page.get_by_role("button", name="Save").click()
                field = page.get_by_label("temperature", exact=True)
                assert await field.get_attribute("aria-invalid") == "true"
                described = await field.get_attribute("aria-describedby") or ""
                error = page.locator(f"[id='{described.split()[0]}']")
                assert "expected a number" in await error.inner_text()
                assert config.read_bytes() == before  # nothing written, the model neither
                await field.fill("0.3")
                await page.get_by_role("button", name="Save").click()
                await page.wait_for_url(panel.base + "/settings/llm")
                notice = page.get_by_role("status").filter(has_text="Saved")
                assert "Applied now: llm.model, llm.temperature" in await notice.inner_text()
                api.private_text("hi", user_id=1001)
                await api.wait_for_async(lambda: bool(api.sent(1001)), 30)
                assert llm.requests[-1]["model"] == "model-two"  # no restart
                assert await csp_violations(page) == []


async def test_a_pairing_code_approved_in_the_browser_lets_the_stranger_in(
    browser_page: Page, tmp_path: Path
) -> None:
    async with FakeLLM() as llm, FakeBotAPI() as api:
        telegram = {
            "enabled": True,
            "token": api.token,
            "baseUrl": api.base_url,
            "allowFrom": ["1001"],
            "dmPolicy": "pairing",
        }
        config = write_config(
            tmp_path, llm.base_url, channels={"telegram": telegram}, web=panel_section()
        )
        cfg, _ = load_config(config)
        async with telegram_in_process(cfg, config) as (stack, channel, _manager):
            gateway = GatewayInProcess(cfg, config, stack, [channel])
            async with browsing(cfg, config, gateway=gateway) as panel:
                api.private_text("hello?", user_id=STRANGER, username="eve")
                (sent,) = await api.wait_sent_async(1, STRANGER, 30)
                code = sent.params["text"].split("code: ")[1][:8]
                page = browser_page
                await page.goto(panel.link())
                await page.wait_for_url(panel.base + "/")
                await page.get_by_role("link", name="Access").click()
                row = page.get_by_role("row").filter(has_text=code)
                await row.get_by_role("button", name="Approve").click()
                await page.wait_for_url(panel.base + "/access")
                await page.get_by_role("status").filter(has_text="Approved telegram").wait_for()
                assert await page.get_by_role("row").filter(has_text=code).count() == 0
                api.private_text("now?", user_id=STRANGER, username="eve")
                await api.wait_for_async(
                    lambda: any("echo: now?" in c.params["text"] for c in api.sent(STRANGER)),
                    30,
                )
                assert await csp_violations(page) == []
