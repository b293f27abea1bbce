"""The panel's chat in Chromium, against the gateway's pieces in this process and the fake
model: an answer shows while it is written, and a tool call runs once its button allows it
(at a phone's width). The page's script must break no Content-Security-Policy rule."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from bot.config import load_config
from tests.fakes.llm_server import FakeLLM, reply, tool_step
from tests.helpers import write_config
from tests.helpers.browser import BROWSER_TEST, TIMEOUT_MS, csp_violations
from tests.helpers.web import Browser, chatting, panel_section

if TYPE_CHECKING:
    from playwright.async_api import Page

pytestmark = BROWSER_TEST

ANSWER = "<i>Hi</i> there! Here is **your** plan for today."


async def open_new_conversation(page: Page, panel: Browser) -> None:
    await page.goto(panel.link())
    await page.wait_for_url(panel.base + "/")
    await page.get_by_role("link", name="Chat", exact=True).click()
    await page.get_by_role("button", name="New conversation").click()
    await page.wait_for_url(panel.base + "/chat/*")


async def test_an_answer_shows_while_it_is_written(browser_page: Page, tmp_path: Path) -> None:
    from playwright.async_api import expect

    async with FakeLLM() as llm:
        # Held after its second piece ("<i>Hi</i>", " there! H") until the test has seen the
        # page show it.
        llm.script(reply(ANSWER, pieces=6, hold="half", hold_after_chunks=3), reply("Second."))
        path = write_config(tmp_path, llm.base_url, web=panel_section())
        cfg, _ = load_config(path)
        async with chatting(cfg, path) as (gateway, panel):
            page = browser_page
            await open_new_conversation(page, panel)
            await page.get_by_label("Message").fill("plan my day")
            await page.get_by_role("button", name="Send").click()
            live = page.locator("#live-text")
            # The model's text as text, never as HTML: the tag shows, no element is made.
            await expect(live).to_have_text("<i>Hi</i> there! H", timeout=TIMEOUT_MS)
            await expect(live.locator("i")).to_have_count(0)
            await expect(page.locator("#state")).to_have_text("memobot is answering…")
            await expect(page.get_by_text("plan my day")).to_be_visible()  # the owner's words
            assert ANSWER.removesuffix(".") not in await page.content()
            llm.release("half")
            answer = page.locator("#transcript article.bot .md")
            await expect(answer).to_have_text(ANSWER.replace("**", ""), timeout=TIMEOUT_MS)
            await expect(answer.locator("i")).to_have_count(0)
            assert await answer.locator("b").inner_text() == "your"  # Markdown, rendered
            await expect(page.locator("#live")).to_be_hidden()
            await expect(page.locator("#state")).to_be_empty()
            assert await page.get_by_label("Message").input_value() == ""
            # The next message is one of its own (a form posted again would be the same one).
            await page.get_by_label("Message").fill("and then?")
            await page.get_by_role("button", name="Send").click()
            await expect(answer.last).to_have_text("Second.", timeout=TIMEOUT_MS)
            # A message not sent says so, its words still in the box.
            gateway.stack.bus.accepting = False
            await page.get_by_label("Message").fill("are you stopping?")
            await page.get_by_role("button", name="Send").click()
            await expect(page.locator(".notice")).to_contain_text("memobot is stopping")
            assert await page.get_by_label("Message").input_value() == "are you stopping?"
            assert await csp_violations(page) == []
            assert await page.page_errors() == []


async def test_a_tool_call_runs_once_its_button_allows_it(
    browser_page: Page, tmp_path: Path
) -> None:
    from playwright.async_api import expect

    async with FakeLLM() as llm:
        llm.script(
            tool_step(("read_file", {"path": "notes.txt"})),
            reply("Your note says: buy milk."),
        )
        path = write_config(
            tmp_path, llm.base_url, web=panel_section(), tools={"approval": "always"}
        )
        cfg, _ = load_config(path)
        cfg.agent.workspace_path.mkdir(parents=True, exist_ok=True)
        (cfg.agent.workspace_path / "notes.txt").write_text("buy milk")
        async with chatting(cfg, path) as (_gateway, panel):
            page = browser_page
            await page.set_viewport_size({"width": 390, "height": 844})
            await open_new_conversation(page, panel)
            await page.get_by_label("Message").fill("what do my notes say?")
            await page.get_by_role("button", name="Send").click()
            question = page.get_by_role("region", name="Approval needed")
            await expect(question).to_contain_text("read_file", timeout=TIMEOUT_MS)
            await expect(page.locator("#state")).to_contain_text("waits for your answer")
            assert len(llm.requests) == 1  # nothing ran before the button
            width = await page.evaluate("document.documentElement.scrollWidth")
            assert width <= 390, f"the page is {width} px wide at a phone's 390"
            await question.get_by_role("button", name="Allow once").click()
            answer = page.locator("#transcript article.bot .md").last
            await expect(answer).to_have_text("Your note says: buy milk.", timeout=TIMEOUT_MS)
            await expect(question).to_have_count(0)
            call = page.locator("details.tool")
            await expect(call.locator("summary")).to_contain_text("read_file")
            await call.locator("summary").click()
            await expect(call.locator("pre").last).to_have_text("buy milk")
            assert "Allowed once." in await page.locator(".notes").inner_text()
            assert await csp_violations(page) == []
            assert await page.page_errors() == []
