"""Dream's edits reviewed by an admin (memory.dreamReview): the proposal waits on the approval
desk with nothing written, in the admins' Telegram chat (the real python-telegram-bot against
the fake Bot API, the fake LLM); Deny skips, Allow writes and commits, only onto files that did
not change meanwhile; a non-admin cannot answer; a SIGKILLed gateway's old button still works.
With review off, every Dream commit names the history entries each change comes from."""

from __future__ import annotations

import argparse
import asyncio
import html
import json
import logging
import re
import signal
import subprocess
import time
from pathlib import Path

from bot.config import parse_config
from bot.llm import LLMProvider
from bot.memory.dream import Dream, read_dream_cursor
from bot.memory.history import HistoryArchive
from bot.memory.review import ProposalStore
from bot.memory.versioning import MemoryRepo, cmd_log
from bot.status import dream_line
from bot.workspace import init_workspace
from tests.fakes.llm_server import FakeLLM, tool_step
from tests.fakes.telegram_api import FakeBotAPI, strip_html
from tests.helpers import REPO, config_dict, make_config, stop_gateway, zygote
from tests.helpers.approvals import ALICE, BOB, WAIT, Running, button_data, running, settings
from tests.helpers.web import Browser

FACT = "Lives in Lyon"
EDIT = tool_step(
    ("add_entry", {"file": "USER.md", "entry": FACT, "section": "Facts", "sources": [1]})
)
FINISH = tool_step(("finish", {"summary": "stored where Ada lives"}))
REVIEW = {"dreamReview": True}
# Several messages in Alice's chat in a row: the per-chat pacing (1 a second) is not the point.
FAST = {
    "group": {"messages": 20, "perSeconds": 1},
    "chat": {"messages": 50, "perSeconds": 1, "burst": 20},
}


def commits(ws: Path) -> list[str]:
    return [c.message for c in MemoryRepo(ws, ws.parent / "state").log()]


async def proposed(tg: Running) -> tuple[str, object]:
    """Let Dream run over two entries of Alice's chat; the question it asked her (id, call)."""
    # Telegram lets a bot write only where it was written to: Alice asks for /status first.
    tg.api.private_text("/status")
    await tg.api.wait_for_async(lambda: bool(tg.api.sent(ALICE)), WAIT)
    dream = tg.stack.loop.dream
    await dream.archive.append(f"telegram:{ALICE}", "Ada said she moved to Lyon")
    await dream.archive.append(f"telegram:{ALICE}", "chit-chat about the weather")
    tg.llm.script(EDIT, FINISH)
    result = await dream.run()
    assert result.status == "proposed", result.describe()
    request = await tg.request(ALICE)
    return str(result.proposal), request


def unchanged(ws: Path, user_md: str, history: list[str]) -> None:
    """Nothing of the proposal was written: the file, the commits, the cursor as they were."""
    assert (ws / "USER.md").read_text() == user_md
    assert commits(ws) == history
    assert read_dream_cursor(ws) == 0


async def test_the_edit_waits_for_an_admin_and_deny_skips_it(tmp_path, llm, api, caplog):
    caplog.set_level(logging.INFO)
    async with running(tmp_path, llm, api, memory=REVIEW, rateLimits=FAST) as tg:
        ws = tmp_path / "ws"
        user_md, history = (ws / "USER.md").read_text(), commits(ws)
        pid, request = await proposed(tg)
        unchanged(ws, user_md, history)
        # The question: the diff and the entry each change comes from, Allow and Deny only.
        text = strip_html(request.params["text"])
        assert f"+- {FACT}" in text and f"USER.md: {FACT} (history #1)" in text
        assert "#1..#2" in text and f"/deny {pid}" in text
        labels = [b["text"] for row in api.markup(request) for b in row]
        assert labels == ["Allow", "Deny"]
        # Kept in the state folder, never in the workspace the model writes.
        assert (tmp_path / "state" / "dream" / "review.json").exists()
        assert FACT not in "".join(p.read_text(errors="replace") for p in ws.rglob("*.md"))

        assert f"proposal {pid} waits for an admin's answer" in dream_line(tg.stack.loop.cfg)
        # A person who is no admin cannot answer it, typed or pressed.
        api.private_text(f"/allow {pid}", user_id=BOB, username="bob")
        await tg.said("Only an admin of this bot may answer", BOB)
        api.press(request, button_data(request, "once"), user_id=BOB, username="bob")
        await tg.said("Only an admin of this bot may answer", ALICE)
        unchanged(ws, user_md, history)
        # While it waits, Dream does not run again (the model is not asked).
        asked = len(llm.requests)
        again = await tg.stack.loop.dream.run()
        assert again.status == "waiting" and pid in again.describe()
        assert len(llm.requests) == asked

        api.press(request, button_data(request, "deny"))
        await tg.said("Denied: nothing was written", ALICE)
        assert (ws / "USER.md").read_text() == user_md and commits(ws) == history
        assert read_dream_cursor(ws) == 2  # past what it considered
        assert f"dream: proposal {pid} denied by {ALICE}" in caplog.text
        assert ProposalStore(tmp_path / "state").open() is None
        assert (await tg.stack.loop.dream.run()).status == "nothing"
        # A later press of the other button: answered already, nothing happens.
        api.press(request, button_data(request, "once"))
        await tg.said("This approval was already answered.", ALICE)
        assert (ws / "USER.md").read_text() == user_md


async def test_allow_writes_and_commits_it_naming_its_entries(tmp_path, llm, api, capsys):
    async with running(tmp_path, llm, api, memory=REVIEW, rateLimits=FAST) as tg:
        ws = tmp_path / "ws"
        history = commits(ws)
        pid, request = await proposed(tg)
        api.press(request, button_data(request, "once"))
        await tg.said("Allowed: Dream's changes are written", ALICE)
        assert f"- {FACT}" in (ws / "USER.md").read_text()
        assert read_dream_cursor(ws) == 2
        new = commits(ws)
        assert len(new) == len(history) + 1
        assert f"- USER.md: {FACT} (history #1)" in new[0]
        assert f"Reviewed: allowed by {ALICE} ({pid})" in new[0]
        api.press(request, button_data(request, "deny"))  # too late: nothing is undone
        await tg.said("This approval was already answered.", ALICE)
        assert f"- {FACT}" in (ws / "USER.md").read_text()
    cfg = make_config(tmp_path, "http://127.0.0.1:9/v1")
    assert cmd_log(cfg, argparse.Namespace(limit=None)) == 0
    out = capsys.readouterr().out
    assert "dream: digest history 1..2 (2 entries)" in out
    assert f"    - USER.md: {FACT} (history #1)" in out


async def test_allow_never_overwrites_a_newer_edit(tmp_path, llm, api):
    async with running(tmp_path, llm, api, memory=REVIEW, rateLimits=FAST) as tg:
        ws = tmp_path / "ws"
        history = commits(ws)
        _, request = await proposed(tg)
        newer = (ws / "USER.md").read_text() + "- Edited by hand meanwhile\n"
        (ws / "USER.md").write_text(newer)
        api.press(request, button_data(request, "once"))
        await tg.said("Not written: USER.md changed since Dream proposed this", ALICE)
        assert (ws / "USER.md").read_text() == newer
        assert commits(ws) == history and read_dream_cursor(ws) == 0
        # The next run goes over the same entries again (and may propose again).
        llm.script(FINISH)
        result = await tg.stack.loop.dream.run()
        assert result.status == "done" and result.entries == 2
        assert read_dream_cursor(ws) == 2


async def test_an_answer_recorded_before_a_crash_is_carried_out_at_the_next_start(tmp_path, llm):
    """The answer is durable before it is acted on: a fresh Dream and desk over the same
    state folder (what a restart builds) land an Allow that was recorded but not carried out;
    a proposal ``memobot dream`` made (never asked) is asked at the start."""
    from bot.bus import MessageBus
    from bot.memory.review import DreamReview

    cfg = make_config(tmp_path, llm.base_url, memory=REVIEW)
    ws, state = cfg.agent.workspace_path, cfg.agent.state_path
    init_workspace(ws)
    archive = HistoryArchive(ws)
    await archive.append("cli:main", "Ada said she moved to Lyon")
    llm.script(EDIT, FINISH)
    provider = LLMProvider(cfg.llm)
    try:
        first = Dream(cfg.memory, ws, provider, archive, state_dir=state)
        result = await first.run()  # as `memobot dream`: nobody to ask from here
        store = ProposalStore(state)
        assert result.status == "proposed" and store.open().asked_in is None
        history = commits(ws)
        restarted = Dream(cfg.memory, ws, provider, HistoryArchive(ws), state_dir=state)
        await DreamReview(restarted, MessageBus()).resume()
        assert store.open().asked_in == ()  # asked (in no chat: none is known here)
        assert store.decide(str(result.proposal), "once", "1001", "press-1") is not None
        # ... and the process died here. The next start carries the answer out.
        again = Dream(cfg.memory, ws, provider, HistoryArchive(ws), state_dir=state)
        await DreamReview(again, MessageBus()).resume()
    finally:
        await provider.close()
    assert f"- {FACT}" in (ws / "USER.md").read_text()
    assert len(commits(ws)) == len(history) + 1 and read_dream_cursor(ws) == 1
    assert store.open() is None and store.closed(str(result.proposal))["outcome"] == "applied"


# -- review off: every commit names its entries -------------------------------------------


async def test_each_change_names_the_history_entries_it_comes_from(tmp_path, llm):
    cfg = make_config(tmp_path, llm.base_url)
    ws = cfg.agent.workspace_path
    init_workspace(ws)
    archive = HistoryArchive(ws)
    for text in ("Ada moved to Lyon", "Ada drinks tea", "weather"):
        await archive.append("telegram:1", text)
    llm.script(
        tool_step(
            ("add_entry", {"file": "USER.md", "entry": FACT, "sources": ["#1"]}),
            ("add_entry", {"file": "USER.md", "entry": "Drinks tea", "sources": [9]}),
            ("add_entry", {"file": "SOUL.md", "entry": "Be brief"}),
        ),
        tool_step(("add_entry", {"file": "USER.md", "entry": "Drinks tea", "sources": [2, 1]})),
        FINISH,
    )
    provider = LLMProvider(cfg.llm)
    dream = Dream(cfg.memory, ws, provider, archive, state_dir=cfg.agent.state_path)
    try:
        result = await dream.run()
    finally:
        await provider.close()
    assert result.status == "done", result.describe()
    message = commits(ws)[0]
    assert f"- USER.md: {FACT} (history #1)" in message
    assert "- USER.md: Drinks tea (history #1, #2)" in message
    assert "- SOUL.md: Be brief (history #1..#3, not named)" in message
    # A source that is not one of the run's entries is the model's error to correct.
    results = [m["content"] for m in llm.requests[1]["body"]["messages"] if m["role"] == "tool"]
    assert "sources: 9 is not one of the new history entries (#1..#3)" in results[1]


# -- a SIGKILL between the proposal and the answer -----------------------------------------


def _gateway(config: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("OPENAI_")}
    env["MEMOBOT_FAILPOINTS"] = ""
    return zygote.popen(
        ["--config", str(config), "-v", "gateway"],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(config.parent / "gateway.log", "ab"),  # the child keeps writing
    )


def test_sigkill_while_the_proposal_waits_keeps_its_button_working(tmp_path):
    from bot.app import initial_memory_commit

    with FakeLLM.start_in_thread() as llm, FakeBotAPI.start_in_thread() as api:
        config = tmp_path / "config.json"
        data = config_dict(
            tmp_path,
            llm.base_url,
            channels={"telegram": {**settings(api.api), "pollTimeoutSeconds": 5}},
            memory=REVIEW,
        )
        config.write_text(json.dumps(data))
        cfg = parse_config(data)
        ws, state = cfg.agent.workspace_path, cfg.agent.state_path
        init_workspace(ws)
        initial_memory_commit(ws, state)
        archive = HistoryArchive(ws)
        asyncio.run(archive.append(f"telegram:{ALICE}", "Ada said she moved to Lyon"))
        user_md, history = (ws / "USER.md").read_text(), commits(ws)
        llm.script(EDIT, FINISH)
        proc = _gateway(config)
        try:
            api.private_text("/dream")
            api.wait_for(lambda: any(api.markup(c) for c in api.sent(ALICE)), WAIT)
            request = next(c for c in api.sent(ALICE) if api.markup(c))
            proc.send_signal(signal.SIGKILL)
            assert proc.wait(10) == -signal.SIGKILL
        finally:
            stop_gateway(proc)
        assert (ws / "USER.md").read_text() == user_md and commits(ws) == history
        assert read_dream_cursor(ws) == 0
        proc = _gateway(config)
        try:
            api.press(request, button_data(request, "once"))  # the old button
            api.wait_for(
                lambda: any("Allowed: Dream's changes" in c.params["text"] for c in api.sent()),
                WAIT,
            )
            time.sleep(0.3)
            assert sum(bool(api.markup(c)) for c in api.sent()) == 1  # not asked again
        finally:
            stop_gateway(proc)
        assert proc.returncode == 0, (tmp_path / "gateway.log").read_text()
        assert f"- {FACT}" in (ws / "USER.md").read_text()
        assert len(commits(ws)) == len(history) + 1 and read_dream_cursor(ws) == 1


# -- the panel's Approvals screen ------------------------------------------------------------


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


async def test_the_panel_shows_the_proposal_escaped_and_answers_it(tmp_path, llm, caplog):
    from types import SimpleNamespace

    from bot.config import load_config
    from tests.helpers import Harness, write_config
    from tests.helpers.web import browsing, panel_section

    caplog.set_level(logging.INFO)
    config = write_config(tmp_path, llm.base_url, memory=REVIEW, web=panel_section())
    cfg, _ = load_config(config)
    marked = "<b>Ada</b> lives in Lyon"
    async with Harness(cfg, config, channels=("telegram",)) as harness:
        dream = harness.stack.loop.dream
        await dream.archive.append("cli:main", "Ada said she moved to Lyon")
        llm.script(tool_step(("add_entry", {"file": "USER.md", "entry": marked})), FINISH)
        result = await dream.run()
        assert result.status == "proposed"
        # No admin chat is known to this channel: the panel is where it is answered.
        assert "no admin's private chat to ask in" in caplog.text
        gateway = SimpleNamespace(stack=harness.stack, scheduler=None)
        async with browsing(cfg, config, gateway=gateway) as browser:
            await browser.login()
            _, page, _ = await browser.get("/approvals")
            assert "&lt;b&gt;Ada&lt;/b&gt; lives in Lyon" in page and marked not in page
            assert "Dream wants to change the long-term memory" in page
            assert marked not in (tmp_path / "ws" / "USER.md").read_text()
            allow = answer_form(page, "once")
            assert allow["key"] == "dream" and allow["id"] == result.proposal
            status, _, _ = await browser.post("/approvals/answer", allow)
            assert status == 303
            assert (await notice(browser)).startswith("Allowed: Dream's changes are written")
            assert f"- {marked}" in (tmp_path / "ws" / "USER.md").read_text()
            assert f"{result.proposal} session=dream answered once by web" in caplog.text
            await browser.post("/approvals/answer", {**allow, "token": "another-request"})
            assert await notice(browser) == "This approval was already answered."
            _, page, _ = await browser.get("/approvals")
            assert "Dream wants to change" not in page
