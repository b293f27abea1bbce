"""The panel's Approvals screen with the real agent loop in this process (a recording channel
in Telegram's place) and the fake LLM: an answer in the panel is the button press (the waiting
turn goes on, the chat's buttons then say it was answered, and the other way round), the
model's text is shown escaped, and a remembered rule removed in the panel is asked about again
at the next call."""

from __future__ import annotations

import asyncio
import html
import json
import logging
import re
from pathlib import Path
from types import SimpleNamespace

from bot.bus import InboundMessage, OutboundMessage
from bot.config import load_config
from bot.kinds import APPROVAL_KEY
from bot.llm import ToolCall
from tests.fakes.llm_server import call, reply, tool_step
from tests.helpers import Harness, write_config
from tests.helpers.web import Browser, browsing, panel_section

# The model's text, with markup in it: shown as text, never as the panel's HTML.
COMMAND = 'echo "<b>x</b>" >> ran.txt'
SHOWN = html.escape(COMMAND, quote=True)
CHAT_ID = "1001"
KEY = f"telegram:{CHAT_ID}"
ADMIN_IN_PRIVATE = {"is_admin": True, "is_group": False}
WAIT = 30.0  # seconds; generous: the machine running the suite may be busy


def answer_form(page: str, choice: str) -> dict[str, str]:
    """The fields of the ``choice`` button's form on the Approvals page."""
    for form in re.findall(r'<form method="post" action="/approvals/answer">(.*?)</form>', page):
        fields = dict(re.findall(r'name="([a-z]+)" value="([^"]*)"', form))
        if fields.get("choice") == choice:
            return {k: html.unescape(v) for k, v in fields.items()}
    raise AssertionError(f"no {choice} button on the page")


async def notice(browser: Browser) -> str:
    _, page, _ = await browser.get("/approvals")
    found = re.search(r'<p class="notice" role="status">(.*?)</p>', page)
    return html.unescape(found.group(1)) if found else ""


async def test_an_answer_in_the_panel_is_the_button_press(tmp_path: Path, llm, caplog):
    caplog.set_level(logging.INFO)
    config = write_config(
        tmp_path,
        llm.base_url,
        tools={"exec": {"timeoutSeconds": 20}, "approval": "risky"},
        web=panel_section(),
    )
    cfg, _ = load_config(config)
    ran = tmp_path / "ws" / "ran.txt"
    llm.script(tool_step(call("exec", {"command": COMMAND})), reply("it ran"))
    async with Harness(cfg, config, channels=("telegram",)) as harness:
        stack = harness.stack
        chat = Chat(harness)
        gateway = SimpleNamespace(stack=stack, scheduler=None)
        async with browsing(cfg, config, gateway=gateway) as browser:
            await browser.login()
            answered = await chat.say("please run it")
            first = await chat.question()
            _, page, _ = await browser.get("/approvals")
            assert SHOWN in page and "<b>x</b>" not in page
            assert "Always allow this command" in page
            once = answer_form(page, "once")
            assert not ran.exists()
            status, _, _ = await browser.post("/approvals/answer", once)
            assert status == 303
            assert await notice(browser) == "Allowed once."
            # The waiting turn went on and ran the command, once.
            assert (await asyncio.wait_for(answered, WAIT)).text == "it ran"
            assert ran.read_text().splitlines() == ["<b>x</b>"]
            told = f"Approval {once['id']} was answered in the control panel: Allowed once."
            assert told in chat.said()
            assert f"session={KEY} answered once by web" in caplog.text
            # Then the chat's button: answered already, nothing runs again.
            await chat.press(first, "once")
            assert chat.said()[-1] == "This approval was already answered."
            # The panel's form sent again: the same answer, recorded once.
            await browser.post("/approvals/answer", once)
            assert await notice(browser) == "Your answer was recorded already."
            await browser.post("/approvals/answer", {**once, "token": "another-request"})
            assert await notice(browser) == "This approval was already answered."

            # Answered in the chat first ("always"): the panel's answer is refused.
            llm.script(tool_step(call("exec", {"command": COMMAND})), reply("ran again"))
            answered = await chat.say("and again")
            second = await chat.question(2)
            _, page, _ = await browser.get("/approvals")
            deny = answer_form(page, "deny")
            await chat.press(second, "always")
            assert (await asyncio.wait_for(answered, WAIT)).text == "ran again"
            await browser.post("/approvals/answer", deny)
            assert await notice(browser) == "This approval was already answered."
            assert len(ran.read_text().splitlines()) == 2

            # The rule "always" remembered, shown escaped, removed: the next call asks again.
            _, page, _ = await browser.get("/approvals")
            rule = re.search(r'name="rule" value="([^"]*)"', page)
            assert rule and html.unescape(rule[1]) == f"exec:{COMMAND}"
            assert f"<code>exec:{SHOWN}</code>" in page
            session = stack.store.get(KEY)
            again = ToolCall("c-next", "exec", json.dumps({"command": COMMAND}))
            assert stack.loop.approvals.question(again, list(session.state.approved_calls)) is None
            status, _, _ = await browser.post(
                "/approvals/forget",
                {"csrf": deny["csrf"], "key": KEY, "rule": html.unescape(rule[1])},
            )
            assert status == 303
            assert "asked about again" in await notice(browser)
            assert f"a remembered rule of session={KEY} removed by web" in caplog.text
            # What the gate asks at this chat's next call: this command again.
            assert stack.loop.approvals.question(again, list(session.state.approved_calls))


class Chat:
    """The owner's private Telegram chat, as the channel would publish it (a button press is
    an inbound message carrying the approval's id and choice)."""

    def __init__(self, harness: Harness) -> None:
        self.harness = harness
        self.presses = 0

    async def say(self, text: str) -> asyncio.Future[OutboundMessage]:
        return await self.harness.send(
            text, chat=CHAT_ID, channel="telegram", metadata=ADMIN_IN_PRIVATE
        )

    async def question(self, n: int = 1) -> str:
        """The id of the ``n``-th approval question shown in the chat."""
        for _ in range(int(WAIT / 0.01)):
            asked = [m for m in self.harness.outbox if APPROVAL_KEY in m.metadata]
            if len(asked) >= n:
                return str(asked[n - 1].metadata[APPROVAL_KEY]["id"])
            await asyncio.sleep(0.01)
        raise AssertionError("no approval question was shown")

    async def press(self, approval_id: str, choice: str) -> None:
        self.presses += 1
        before = len(self.said())
        press = InboundMessage(
            "telegram",
            CHAT_ID,
            "user-1",
            f"/{choice}",
            message_id=f"press-{self.presses}",
            metadata={**ADMIN_IN_PRIVATE, APPROVAL_KEY: {"id": approval_id, "choice": choice}},
        )
        await self.harness.stack.bus.publish_inbound(press)
        for _ in range(int(WAIT / 0.01)):
            if len(self.said()) > before:
                return
            await asyncio.sleep(0.01)

    def said(self) -> list[str]:
        return [m.text for m in self.harness.outbox if not m.final and m.chat_id == CHAT_ID]


async def test_without_the_gateway_questions_are_shown_but_not_answered(tmp_path: Path):
    config = write_config(tmp_path, "http://127.0.0.1:9/v1", web=panel_section())
    cfg, _ = load_config(config)
    async with browsing(cfg, config) as browser:
        await browser.login()
        csrf = await browser.csrf("/approvals")
        form = {"csrf": csrf, "key": KEY, "id": "ap-000000000000", "choice": "once"}
        await browser.post("/approvals/answer", {**form, "token": "a" * 16})
        assert "Answering needs the gateway" in await notice(browser)
