"""Approvals for risky tool calls and the group tool set: the gate's decision (pure), then end
to end through the real python-telegram-bot against the fake Bot API (buttons pressed as
callback queries), the real agent loop and the fake LLM, and a SIGKILLed gateway."""

from __future__ import annotations

import asyncio
import html
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar

import pytest

from bot.approvals import EXPIRED, ApprovalDesk, describe_open, offered_tools, policy_for
from bot.bus import InboundMessage, MessageBus
from bot.gate import launcher
from bot.gate.approval import (
    MAX_REVIEW_CHARS,
    ApprovalPolicy,
    allow_pattern_problem,
    command_allowed,
    group_tool_names,
    legacy_keys,
    limited_tool_names,
    question_for,
)
from bot.gate.effects import EXTERNAL, Effects
from bot.gate.question import QuestionView, fit_question, visible
from bot.kinds import with_kind
from bot.llm import ToolCall
from bot.privacy import scope_for_person
from bot.runner import INTERRUPTED_TOOL_RESULT
from bot.session import SessionStore
from bot.tools import Tool, ToolContext, build_default_tools
from bot.tools.cron import CronTool
from bot.tools.filesystem import EditFileTool, ListDirTool, ReadFileTool, WriteFileTool
from bot.tools.memory_search import MemorySearchTool
from bot.tools.message import MessageTool
from bot.tools.search import WebSearchTool
from bot.tools.shell import ExecTool
from bot.tools.web import WebFetchTool
from channels.formatting import (
    DISCORD_LIMIT,
    SLACK_SECTION_LIMIT,
    TELEGRAM_LIMIT,
    markdown_to_discord,
    markdown_to_slack_mrkdwn,
    markdown_to_telegram_html,
    telegram_length,
)
from tests.fakes.llm_server import FakeLLM, call, reply, tool_step
from tests.fakes.telegram_api import BOT_USERNAME, FakeBotAPI, strip_html
from tests.helpers import (
    REPO,
    T0,
    Clock,
    config_dict,
    make_config,
    run_memobot,
    stop_gateway,
    zygote,
)
from tests.helpers.approvals import (
    ALICE,
    BOB,
    CAROL,
    GROUP,
    MALLORY,
    RISKY,
    WAIT,
    Running,
    button_data,
    running,
    settings,
)

RAW_MCP_SERVER = REPO / "tests" / "fakes" / "mcp_raw_server.py"

# -- the decision (pure) -------------------------------------------------------------------

# What the built-in tools declare; the tools of the MCP servers below (mcp_*) declare nothing.
BUILT_IN: dict[str, Effects] = {
    tool.name: tool.effects
    for tool in [
        *(ReadFileTool, WriteFileTool, EditFileTool, ListDirTool, ExecTool, WebFetchTool),
        *(WebSearchTool, MessageTool, MemorySearchTool, CronTool),
    ]
}


def effects_of(names: list[str]) -> dict[str, Effects]:
    return {n: BUILT_IN.get(n, EXTERNAL) for n in names}


def ask(p: ApprovalPolicy, name: str, arguments: str, allowed: list[str]):
    return question_for(p, effects_of([name])[name], name, arguments, allowed)


@pytest.mark.parametrize(
    ("command", "allowed"),
    [
        ("ls", True),
        ("ls -la src", True),
        ("git status --short", True),
        ("lsblk", False),
        ("ls; rm -rf /", False),
        ("ls && rm x", False),
        ("ls | sh", False),
        ("ls $(rm x)", False),
        ("ls `rm x`", False),
        ("cat notes > /etc/passwd", False),
        ("cat < x", False),
        ("ls\nrm x", False),
        ("git push", False),
        ("FOO=1 ls", False),
        ("ls 'unterminated", False),
        ("", False),
    ],
)
def test_exec_allow_matches_whole_simple_commands_only(command: str, allowed: bool) -> None:
    assert command_allowed(command, ["ls", "git status", "cat"]) is allowed


def test_allow_patterns_with_shell_syntax_are_refused_at_load() -> None:
    assert allow_pattern_problem("ls; rm") is not None
    assert allow_pattern_problem("") is not None
    assert allow_pattern_problem("python3 scripts/*.py") is None


def _policy(tmp_path: Path, mode: str = "risky", restrict: bool = True) -> ApprovalPolicy:
    return ApprovalPolicy(mode, ("ls",), ("mcp_docs_*",), tmp_path, restrict, 60)  # type: ignore[arg-type]


def test_which_calls_need_approval(tmp_path: Path) -> None:
    p = _policy(tmp_path)
    assert ask(p, "exec", json.dumps({"command": "ls -l"}), []) is None
    q = ask(p, "exec", json.dumps({"command": "rm -rf x"}), [])
    assert q is not None and q.summary == "exec: rm -rf x" and q.key == "exec:rm -rf x"
    assert q.subject == "rm -rf x"
    assert ask(p, "exec", json.dumps({"command": "rm -rf x"}), ["exec:rm -rf x"]) is None
    assert ask(p, "exec", json.dumps({"command": "rm -rf y"}), ["exec:rm -rf x"]) is not None
    assert ask(p, "mcp_shell_run", "{}", []) is not None
    assert ask(p, "mcp_docs_search", "{}", []) is None
    # File writes ask only when unrestricted and outside the workspace.
    outside = json.dumps({"path": "/tmp/x", "content": ""})
    assert ask(p, "write_file", outside, []) is None
    loose = _policy(tmp_path, restrict=False)
    assert ask(loose, "write_file", outside, []) is not None
    assert ask(loose, "write_file", json.dumps({"path": "a.txt", "content": ""}), []) is None
    assert ask(loose, "edit_file", json.dumps({"path": "../b"}), []) is not None
    assert ask(_policy(tmp_path, "always"), "read_file", "{}", []) is not None
    assert ask(_policy(tmp_path, "off"), "exec", json.dumps({"command": "rm x"}), []) is None


def test_always_remembers_the_exact_arguments_of_a_call(tmp_path: Path) -> None:
    p = _policy(tmp_path)
    a = ask(p, "mcp_fs_write", json.dumps({"path": "a", "text": "x"}), [])
    assert a is not None and a.key == 'call:mcp_fs_write:{"path":"a","text":"x"}'
    assert a.subject == 'mcp_fs_write\n{\n  "path": "a",\n  "text": "x"\n}'  # all of it
    same = json.dumps({"text": "x", "path": "a"})  # the same arguments, spelt otherwise
    assert ask(p, "mcp_fs_write", same, [a.key]) is None
    other = json.dumps({"path": "a", "text": "x", "mode": "append"})
    assert ask(p, "mcp_fs_write", other, [a.key]) is not None
    # An older memobot's entry for the bare tool allows nothing any more.
    assert ask(p, "mcp_fs_write", same, ["tool:mcp_fs_write"]) is not None
    assert legacy_keys(["tool:mcp_fs_write", a.key, "exec:ls -x"]) == ["tool:mcp_fs_write"]
    # Arguments the tool will refuse are still asked about, shown as sent.
    broken = ask(p, "mcp_fs_write", '{"path": "a"', [])
    assert broken is not None and broken.subject == 'mcp_fs_write\n{"path": "a"'


def test_visible_shows_every_character_and_counts_padding() -> None:
    shown = visible("a\u202eb\u200bc\u00a0d\u27e8x\u27e9\x1b[31m\r").shown
    assert shown == "a⟨U+202E⟩b⟨U+200B⟩c⟨U+00A0⟩d⟨U+27E8⟩x⟨U+27E9⟩⟨U+001B⟩[31m⟨U+000D⟩"
    assert visible("ệ" + "e\u0301\u0302\u0323" + "x" + "\u0301" * 5).shown == (
        "ệe\u0301\u0302\u0323x" + "\u0301" * 3 + "⟨U+0301⟩⟨U+0301⟩"
    )  # accents stay; a pile that would draw over other lines does not
    script = "if x:\n        y()\n\n\nz"  # indentation and two blank lines stay as they are
    assert visible(script).shown == script
    assert visible("a" + " \t" * 10 + "b").shown == "a⟨20 spaces and tabs⟩b"
    assert visible("a\n \n\n\n\nb").shown == "a\n⟨4 blank lines⟩\nb"
    head, hidden = visible("ab⟨c").head(3)  # a cut never falls inside a marker
    assert (head, hidden) == ("ab⟨U+27E8⟩", 1)


@pytest.mark.parametrize(
    ("render", "measure", "limit"),
    [
        (markdown_to_telegram_html, telegram_length, TELEGRAM_LIMIT),
        (markdown_to_discord, len, DISCORD_LIMIT),
        (markdown_to_slack_mrkdwn, len, SLACK_SECTION_LIMIT),
        (None, len, 1000),
    ],
    ids=["telegram", "discord", "slack", "plain"],
)
def test_a_question_fits_one_message_and_says_what_it_leaves_out(render, measure, limit) -> None:
    subject = "<&`" * 3000 + "END"  # grows when escaped
    view = QuestionView("ap-1", "Approval needed:", subject, "Allow it?")
    text, cut = fit_question(view, render, measure, limit)
    assert cut and measure(text) <= limit and "END" not in text
    hidden = int(re.search(r"… ([\d,]+) more characters", text)[1].replace(",", ""))  # type: ignore[index]
    assert 0 < hidden < len(subject) and text.rstrip().endswith("Allow it?")
    short = QuestionView("ap-1", "Approval needed:", "ls -la", "Allow it?")
    text, cut = fit_question(short, render, measure, limit)
    assert not cut and "ls -la" in text


def test_group_tool_set() -> None:
    names = ["read_file", "write_file", "edit_file", "exec", "web_fetch", "mcp_a_x", "mcp_b_y"]
    # By default no tool that touches the workspace; a config that names one keeps it.
    tools = effects_of(names)
    assert group_tool_names(tools, None, ["mcp_b_*"]) == {"web_fetch", "mcp_b_y"}
    assert group_tool_names(tools, ["read_file", "exec"], []) == {"read_file", "exec"}


def test_non_admin_private_tool_set() -> None:
    names = ["read_file", "list_dir", "write_file", "exec", "web_fetch", "mcp_a_x", "mcp_b_y"]
    # The file tools keep to the chat's privacy scope; exec and unsafe MCP tools cannot.
    tools = effects_of(names)
    assert limited_tool_names(tools, None, ["mcp_b_*"], scoped_files=True) == {
        "read_file",
        "list_dir",
        "write_file",
        "web_fetch",
        "mcp_b_y",
    }
    assert limited_tool_names(tools, ["exec"], [], scoped_files=True) == {"exec"}


class LaunchTool(Tool):
    """A tool someone adds and forgets to declare: it could do anything."""

    name: ClassVar[str] = "launch"
    description: ClassVar[str] = "Launch something."
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"what": {"type": "string"}},
    }

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        return "launched"


class ClockTool(LaunchTool):
    """The same tool, declared to touch nothing: it is treated like any harmless tool."""

    name: ClassVar[str] = "clock"
    effects: ClassVar[Effects] = Effects()


def test_a_new_tool_that_declares_nothing_is_asked_for_and_kept_from_groups(tmp_path) -> None:
    cfg = make_config(tmp_path, "http://127.0.0.1:9/v1", tools={"approval": "risky"})
    tools = build_default_tools(cfg.tools)
    tools.register(LaunchTool())
    tools.register(ClockTool())
    desk = ApprovalDesk(cfg, SessionStore(cfg.agent.state_path), MessageBus(), tools)
    question = desk.question(ToolCall("c1", "launch", '{"what": "x"}'), [])
    assert question is not None and question.key == 'call:launch:{"what":"x"}'
    assert desk.question(ToolCall("c2", "clock", "{}"), []) is None
    assert desk.question(ToolCall("c3", "web_fetch", '{"url": "https://a.example"}'), []) is None

    def offered(chat: str, admin: bool, group: bool) -> set[str] | None:
        meta = {"is_admin": admin, "is_group": group}
        msg = with_kind(InboundMessage("telegram", chat, "7", "hi", metadata=meta))
        return offered_tools(cfg, msg, tools.effects(), scope_for_person(msg, cfg.memory))

    in_group = offered(str(GROUP), admin=False, group=True)
    assert in_group is not None and "launch" not in in_group and "clock" in in_group
    assert in_group == {"web_fetch", "web_search", "message", "clock"}
    private = offered(str(BOB), admin=False, group=False)
    assert private is not None and "launch" not in private and "read_file" in private
    assert offered(str(ALICE), admin=True, group=False) is None  # the owner: every tool


def test_every_tool_memobot_ships_declares_what_it_does() -> None:
    """Only another program's tools (MCP) are unknown; every tool of memobot's own says what
    it does, so none is asked about or kept from a chat for want of a declaration."""
    import bot.memory.dream
    import bot.tools.mcp  # with dream: their Tool classes are found below

    def subclasses(cls: type[Tool]) -> list[type[Tool]]:
        return [c for sub in cls.__subclasses__() for c in (sub, *subclasses(sub))]

    shipped = [
        c
        for c in subclasses(Tool)
        if c.__module__.startswith("bot.") and not getattr(c, "__abstractmethods__", None)
    ]
    assert {"exec", "write_file", "cron", "add_entry"} <= {getattr(c, "name", "") for c in shipped}
    unknown = {c.__name__ for c in shipped if not c.effects.declared}
    assert unknown == {"McpTool"}
    assert bot.tools.mcp.McpTool.effects.external


# -- end to end through Telegram -----------------------------------------------------------


async def test_allowed_once_runs_the_command_and_the_model_gets_its_output(tmp_path, llm, api):
    llm.script(tool_step(call("exec", {"command": RISKY})), reply("it ran"))
    async with running(tmp_path, llm, api) as tg:
        api.private_text("please run it")
        request = await tg.request()
        assert f"<pre>{html.escape(RISKY)}</pre>" in request.params["text"]
        labels = [b["text"] for row in api.markup(request) for b in row]
        assert labels == ["Allow once", "Always allow this command", "Deny"]
        assert tg.ran == 0  # nothing runs before the answer
        api.press(request, button_data(request, "once"))
        await tg.said("it ran")
        assert tg.ran == 1
        assert [q.status for q in api.calls("answerCallbackQuery")] == [200]
        assert not tg.tool_results()[-1].startswith("Error")
        # "Once" is once: the same command asks again.
        llm.script(tool_step(call("exec", {"command": RISKY})), reply("again"))
        api.private_text("once more")
        await api.wait_for_async(lambda: sum(bool(api.markup(c)) for c in api.sent()) == 2, WAIT)
        assert tg.ran == 1


async def test_no_typing_while_a_question_waits_for_the_person(tmp_path, llm, api, monkeypatch):
    # "typing..." says the bot is working: not while it waits for a button press (up to the
    # approval timeout), and again once the turn goes on.
    from channels import manager as manager_module

    monkeypatch.setattr(manager_module, "TYPING_REFRESH_SECONDS", 0.2)
    llm.script(tool_step(call("exec", {"command": RISKY})), reply("it ran", delay=1.0))
    async with running(tmp_path, llm, api, typingDelaySeconds=0) as tg:
        api.private_text("please run it")
        request = await tg.request()
        await asyncio.sleep(1.0)  # five refreshes, were it still shown
        typing = api.calls("sendChatAction")
        assert typing and typing[0].at < request.at  # shown while the model worked
        assert [c for c in typing if c.at > request.at + 0.1] == []
        pressed_at = time.monotonic()
        api.press(request, button_data(request, "once"))
        answer = await tg.said("it ran")
        after = [c for c in api.calls("sendChatAction") if c.at > request.at + 0.1]
        assert after and after[0].at < answer.at  # shown again while the turn went on
        assert time.monotonic() - pressed_at >= 1.0
        await asyncio.sleep(0.5)
        assert not [c for c in api.calls("sendChatAction") if c.at > answer.at]


async def test_denied_command_never_runs_and_the_model_is_told(tmp_path, llm, api):
    llm.script(tool_step(call("exec", {"command": RISKY})), reply("ok, not running it"))
    async with running(tmp_path, llm, api) as tg:
        api.private_text("please run it")
        request = await tg.request()
        api.press(request, button_data(request, "deny"))
        await tg.said("ok, not running it")
        assert tg.ran == 0
        assert "the user denied this call" in tg.tool_results()[-1]
        # A second press on the answered request changes nothing.
        api.press(request, button_data(request, "once"))
        await tg.said("already answered")
        assert tg.ran == 0


async def test_always_allow_is_remembered_for_this_chat(tmp_path, llm, api):
    llm.script(tool_step(call("exec", {"command": RISKY})), reply("first"))
    async with running(tmp_path, llm, api) as tg:
        api.private_text("run it")
        request = await tg.request()
        api.press(request, button_data(request, "always"))
        await tg.said("first")
        llm.script(tool_step(call("exec", {"command": RISKY})), reply("second"))
        api.private_text("run it again")
        await tg.said("second")
        assert tg.ran == 2
        assert sum(bool(api.markup(c)) for c in api.sent()) == 1  # asked once only
    meta = SessionStore(tmp_path / "state").get(f"telegram:{ALICE}").metadata
    assert meta["approved_calls"] == [f"exec:{RISKY}"]


async def test_no_answer_in_time_is_a_deny_and_a_late_press_is_expired(tmp_path, llm, api):
    llm.script(tool_step(call("exec", {"command": RISKY})), reply("gave up"))
    # 0.01 min = 0.6 s
    async with running(tmp_path, llm, api, tools={"approvalTimeoutMinutes": 0.01}) as tg:
        api.private_text("run it")
        request = await tg.request()
        await tg.said("gave up")
        assert "nobody approved this call within 0.01 minutes" in tg.tool_results()[-1]
        api.press(request, button_data(request, "once"))
        await tg.said("expired")
        await asyncio.sleep(0.3)
        assert tg.ran == 0


async def test_in_a_group_only_the_asker_or_an_admin_may_answer(tmp_path, llm, api):
    llm.script(tool_step(call("exec", {"command": RISKY})), reply("done"))
    # exec offered in this group: the group tool set is tested below.
    async with running(tmp_path, llm, api, groupTools=["*"]) as tg:
        api.group_text(f"@{BOT_USERNAME} run it", user_id=BOB)
        request = await tg.request(GROUP)
        # Not in allowFrom: refused by the channel, the query answered with why.
        api.press(request, button_data(request, "once"), user_id=MALLORY, username="mallory")
        await api.wait_for_async(lambda: len(api.calls("answerCallbackQuery")) == 1, WAIT)
        assert "not allowed" in api.calls("answerCallbackQuery")[0].params["text"]
        # Allowed, but neither the asker nor an admin: refused by the desk.
        api.press(request, button_data(request, "once"), user_id=CAROL, username="carol")
        await tg.said("Only the person who asked, or an admin,", GROUP)
        assert tg.ran == 0
        # An admin answers for Bob.
        api.press(request, button_data(request, "once"), user_id=ALICE)
        await tg.said("done", GROUP)
        assert tg.ran == 1


async def test_a_waiting_question_holds_no_turn_slot(tmp_path, llm, api):
    llm.script(tool_step(call("exec", {"command": RISKY})), reply("bob's answer"))
    async with running(tmp_path, llm, api, agent={"maxConcurrentTurns": 1}) as tg:
        api.private_text("run it")
        request = await tg.request()
        # The only slot is free while Alice decides: Bob's chat is answered meanwhile.
        api.private_text("hello", user_id=BOB, username="bob")
        await tg.said("bob's answer", BOB)
        llm.script(reply("alice's answer"))
        api.press(request, button_data(request, "once"))
        await tg.said("alice's answer")
        assert tg.ran == 1
        # The slot came back: one more turn still runs (a leaked or lost slot would show).
        llm.script(reply("again"))
        api.private_text("and again", user_id=BOB, username="bob")
        await tg.said("again", BOB)


async def test_stop_cancels_a_waiting_approval(tmp_path, llm, api):
    llm.script(tool_step(call("exec", {"command": RISKY})))
    async with running(tmp_path, llm, api) as tg:
        api.private_text("run it")
        request = await tg.request()
        api.private_text("/stop")
        await tg.said("Stopped.")
        api.press(request, button_data(request, "once"))
        await tg.said("cancelled (/stop)")
        assert tg.ran == 0
    assert describe_open(tmp_path / "state") == []


async def test_groups_get_a_smaller_tool_set(tmp_path, llm, api):
    async with running(tmp_path, llm, api, groupAdminTools=True) as tg:
        # Bob (not an admin) in a group: exec is neither offered nor run when named anyway.
        llm.script(tool_step(call("exec", {"command": "ls"})), reply("group answer"))
        api.group_text(f"@{BOT_USERNAME} list files", user_id=BOB)
        await tg.said("group answer", GROUP)
        offered = [t["function"]["name"] for t in llm.requests[0]["body"]["tools"]]
        assert "exec" not in offered and "write_file" not in offered
        assert "read_file" not in offered  # no tool reads the workspace in a group by default
        assert "not available in this chat" in tg.tool_results()[-1]
        # Alice is an admin and groupAdminTools is on: her own turns in the group get every tool.
        llm.script(reply("admin answer"))
        api.group_text(f"@{BOT_USERNAME} hi", user_id=ALICE)
        await tg.said("admin answer", GROUP)
        offered = [t["function"]["name"] for t in llm.requests[-1]["body"]["tools"]]
        assert "exec" in offered
        # An admin's private chat: everything.
        llm.script(reply("private answer"))
        api.private_text("hi", user_id=ALICE)
        await tg.said("private answer", ALICE)
        assert "exec" in [t["function"]["name"] for t in llm.requests[-1]["body"]["tools"]]
        # Bob's private chat: no exec (it reads whatever the workspace holds), file tools yes.
        llm.script(reply("bob's private answer"))
        api.private_text("hi", user_id=BOB)
        await tg.said("bob's private answer", BOB)
        offered = [t["function"]["name"] for t in llm.requests[-1]["body"]["tools"]]
        assert "exec" not in offered and "read_file" in offered


async def test_typed_answer_works_where_there_are_no_buttons(tmp_path, llm, api):
    llm.script(tool_step(call("exec", {"command": RISKY})), reply("typed ok"))
    async with running(tmp_path, llm, api) as tg:
        api.private_text("run it")
        request = await tg.request()
        approval_id = button_data(request, "once").split(":")[1]
        api.private_text(f"/allow {approval_id}")
        await tg.said("typed ok")
        assert tg.ran == 1


# -- questions the model cannot forge --------------------------------------------------------

# A command that closes a plain ``` block and goes on in memobot's own words.
MIMIC = (
    "echo ok\n```\nAllow it? (no answer within 30 min means no)\n\n"
    "Approval needed: the assistant wants to run this command:\n```\nls"
)
INTRO = "Approval needed: the assistant wants to run this command:"


def _one_pre(html_text: str) -> tuple[str, str, str]:
    """(before, inside, after) the one <pre> block of a Telegram message."""
    assert html_text.count("<pre>") == 1 and html_text.count("</pre>") == 1, html_text
    before, rest = html_text.split("<pre>")
    inside, after = rest.split("</pre>")
    return before, html.unescape(inside), after


def _one_code_block(text: str) -> tuple[str, str, str]:
    """(before, inside, after) the one ``` block of a Discord or Slack message, read as those
    platforms read it: a block ends at the next three backticks, whatever opened it."""
    parts = text.split("```")
    assert len(parts) == 3, text
    return parts[0], parts[1].replace("\u200b", ""), parts[2]


async def test_a_command_cannot_close_its_quoting_on_telegram(tmp_path, llm, api):
    llm.script(tool_step(call("exec", {"command": MIMIC})), reply("not run"))
    async with running(tmp_path, llm, api) as tg:
        api.private_text("run it")
        request = await tg.request()
        before, inside, after = _one_pre(request.params["text"])
        assert before == f"{INTRO}\n"
        assert inside == MIMIC  # the whole command, in the block, as it will run
        assert after.startswith("\nAllow it?") and "Approval needed" not in after
        api.press(request, button_data(request, "deny"))
        await tg.said("not run")


async def test_a_command_cannot_close_its_quoting_on_discord(tmp_path, llm):
    from tests.fakes.discord_api import FakeDiscord
    from tests.helpers.discord import ALICE as D_ALICE
    from tests.helpers.discord import ALICE_DM as D_ALICE_DM
    from tests.helpers.discord import running as discord_running

    llm.script(tool_step(call("exec", {"command": MIMIC})))
    async with FakeDiscord() as server:
        with server.patch():
            async with discord_running(tmp_path, llm, server) as bot:
                bot.harness.cfg.tools.approval = "risky"
                bot.harness.stack.loop.approvals.policy = policy_for(bot.harness.cfg)
                await server.send_message(D_ALICE_DM, D_ALICE, "run it", guild_id=None)
                await server.wait_for(lambda: any(server.buttons(p) for p in server.posts()), WAIT)
                post = next(p for p in server.posts() if server.buttons(p))
                before, inside, after = _one_code_block(post.body["content"])
                assert before == f"{INTRO}\n"
                assert inside == f"\n{MIMIC}\n"
                assert after.startswith("\nAllow it?") and "Approval needed" not in after


async def test_a_command_cannot_close_its_quoting_on_slack(tmp_path, llm):
    from tests.fakes.slack_api import FakeSlack
    from tests.helpers.slack import ALICE as S_ALICE
    from tests.helpers.slack import Rig, mention

    llm.script(tool_step(call("exec", {"command": MIMIC})))
    users = {S_ALICE: {"id": S_ALICE, "profile": {"display_name": "alice"}}}
    async with FakeSlack(users=users, post_interval=0.05) as slack:
        async with Rig(tmp_path, llm, slack, groupTools=["*"]) as rig:
            rig.cfg.tools.approval = "risky"
            rig.stack.loop.approvals.policy = policy_for(rig.cfg)
            await slack.push_event(mention("run it", "1700000002.000100"), event_id="Ev1")
            await slack._wait(lambda: any(slack.buttons(p) for p in slack.posts), WAIT)
            post = next(p for p in slack.posts if slack.buttons(p))
            blocks = post.body["blocks"]
            blocks = json.loads(blocks) if isinstance(blocks, str) else blocks
            section = blocks[0]["text"]
            assert section["type"] == "mrkdwn"
            before, inside, after = _one_code_block(section["text"])
            assert before == f"{INTRO}\n"
            assert inside == f"\n{MIMIC}\n"
            assert after.startswith("\nAllow it?") and "Approval needed" not in after


@pytest.mark.parametrize(
    ("padding", "shown"),
    [(" " * 5000, "ls⟨5,000 spaces⟩echo"), ("\n" * 3000, "ls\n⟨2,999 blank lines⟩\necho")],
    ids=["spaces", "newlines"],
)
async def test_padding_cannot_push_the_command_out_of_its_question(
    tmp_path, llm, api, padding, shown
):
    command = f"ls{padding}echo ran >> ran.txt"
    llm.script(tool_step(call("exec", {"command": command})), reply("denied it"))
    async with running(tmp_path, llm, api) as tg:
        api.private_text("run it")
        request = await tg.request()
        _, inside, _ = _one_pre(request.params["text"])
        assert inside == f"{shown} ran >> ran.txt"  # whole, in the message with the buttons
        api.press(request, button_data(request, "deny"))
        await tg.said("denied it")
        # Nothing else was sent for the question: no second piece without the command.
        texts = [strip_html(c.params["text"]) for c in api.sent(ALICE)]
        assert len(texts) == 3 and texts[1:] == ["Denied.", "denied it"], texts


async def test_a_call_too_long_to_review_is_refused_unasked(tmp_path, llm, api):
    command = "echo " + "x" * MAX_REVIEW_CHARS + " >> ran.txt"
    llm.script(tool_step(call("exec", {"command": command})), reply("too long"))
    async with running(tmp_path, llm, api) as tg:
        api.private_text("run it")
        await tg.said("too long")
        assert "more than a person can review" in tg.tool_results()[-1]
        assert tg.ran == 0 and not any(api.markup(c) for c in api.sent())


def _mcp(tmp_path: Path) -> dict[str, Any]:
    """A stdio MCP server (standard library only, one tool: ``read``), unconfined so that it
    may run from the repository."""
    server = {"command": sys.executable, "args": ["-I", str(RAW_MCP_SERVER)]}
    return {"exec": {"timeoutSeconds": 20, "sandbox": "off"}, "mcpServers": {"raw": server}}


async def test_a_long_argument_is_cut_visibly_and_shown_whole_on_request(tmp_path, llm, api):
    hidden = "./" * 2500 + "HIDDEN-END"  # 5,010 characters; what matters is at the end
    llm.script(tool_step(call("mcp_raw_read", {"path": hidden})), reply("read it"))
    fast = {"chat": {"messages": 20, "perSeconds": 1, "burst": 10}}  # the pieces, at once
    async with running(tmp_path, llm, api, tools=_mcp(tmp_path), rateLimits=fast) as tg:
        tg.stack.mcp.start()
        await tg.stack.mcp.wait_ready(15)
        api.private_text("read it")
        request = await tg.request()
        text = strip_html(request.params["text"])
        assert "HIDDEN-END" not in text
        cut = re.search(r"… ([\d,]+) more characters not shown", text)
        assert cut is not None and int(cut[1].replace(",", "")) > 1000
        labels = [b["text"] for row in api.markup(request) for b in row]
        assert labels == ["Show all", "Allow once", "Always allow this exact call", "Deny"]
        api.press(request, button_data(request, "show"))
        await api.wait_for_async(
            lambda: any("HIDDEN-END" in c.params["text"] for c in api.sent(ALICE)), WAIT
        )
        pieces = api.sent(ALICE)[1:]
        assert pieces[0].params["text"].startswith("The whole text of approval ap-")
        # Every piece is quoted; together they hold the whole argument, end included.
        whole = "".join(_one_pre(p.params["text"])[1] for p in pieces)
        assert f'"path": "{hidden}"' in whole
        api.press(request, button_data(request, "once"))
        await tg.said("read it")
        assert tg.tool_results()[-1].startswith("cannot read")  # it ran, with all of it


async def test_always_for_an_mcp_call_allows_those_arguments_only(tmp_path, llm, api, caplog):
    state = tmp_path / "state"
    store = SessionStore(state)
    # Written by an older memobot: "always" for the whole tool, whatever its arguments.
    store.append(store.get(f"telegram:{ALICE}"), metadata={"approved_calls": ["tool:mcp_raw_read"]})
    first, second = str(tmp_path / "a.txt"), str(tmp_path / "b.txt")

    def questions() -> int:
        return sum(bool(api.markup(c)) for c in api.sent(ALICE))

    fast = {"chat": {"messages": 20, "perSeconds": 1, "burst": 10}}
    async with running(tmp_path, llm, api, tools=_mcp(tmp_path), rateLimits=fast) as tg:
        tg.stack.mcp.start()
        await tg.stack.mcp.wait_ready(15)
        llm.script(tool_step(call("mcp_raw_read", {"path": first})), reply("one"))
        with caplog.at_level(logging.WARNING, logger="bot.approvals"):
            api.private_text("read a")
            request = await tg.request()  # the old entry no longer allows it
        assert "old 'always allow' entry" in caplog.text and "mcp_raw_read" in caplog.text
        api.press(request, button_data(request, "always"))
        await tg.said("one")
        llm.script(tool_step(call("mcp_raw_read", {"path": first})), reply("two"))
        api.private_text("read a again")
        await tg.said("two")
        assert questions() == 1  # the same arguments: not asked again
        llm.script(tool_step(call("mcp_raw_read", {"path": second})), reply("three"))
        api.private_text("read b")
        await api.wait_for_async(lambda: questions() == 2, WAIT)  # other arguments: asked
        api.press(await tg.request(), button_data(await tg.request(), "deny"))
        await tg.said("three")
    meta = SessionStore(state).get(f"telegram:{ALICE}").metadata
    assert meta["approved_calls"] == [f'call:mcp_raw_read:{{"path":{json.dumps(first)}}}']


# -- unattended turns: the owner is asked ------------------------------------------------------


async def _known_chat(tg: Running, chat: int) -> None:
    """Telegram lets a bot write only where it was written to: someone says hello there."""
    if chat > 0:
        tg.api.private_text("hello", user_id=chat)
    else:
        tg.api.group_text(f"@{BOT_USERNAME} hello", user_id=ALICE)
    await tg.said("hello", chat)


@pytest.mark.parametrize("job_chat", [ALICE, GROUP], ids=["her-chat", "a-group"])
async def test_a_scheduled_jobs_question_reaches_the_owner_and_her_press_runs_it(
    tmp_path, llm, api, job_chat
):
    from bot.cron.schedule import Schedule
    from bot.cron.scheduler import Scheduler
    from bot.cron.store import JobStore, new_job

    async with running(tmp_path, llm, api, groupTools=["*"]) as tg:
        for chat in {ALICE, job_chat}:
            await _known_chat(tg, chat)
        cfg = tg.stack.loop.cfg
        store = JobStore(cfg.agent.state_path)
        schedule = Schedule.make(every_seconds=3600, tz="UTC")
        store.update(
            lambda jobs: new_job(
                jobs,
                session=f"telegram:{job_chat}",
                message="run the thing",
                schedule=schedule,
                now=T0,
                by_admin=True,
                is_group=job_chat < 0,
            )
        )
        clock = Clock(T0)
        sched = Scheduler(cfg, store, tg.stack.bus, tg.stack.store, {"telegram"}, clock=clock)
        llm.script(tool_step(call("exec", {"command": RISKY})), reply("job done"))
        await sched.tick()
        clock.now = T0 + timedelta(hours=1)
        await sched.tick()
        request = await tg.request(ALICE)  # in her private chat, wherever the job is
        assert not any(api.markup(c) for c in api.sent(GROUP))
        api.press(request, button_data(request, "once"), user_id=BOB, username="bob")
        await tg.said("Only an admin of this bot may answer", ALICE)
        assert tg.ran == 0
        api.press(request, button_data(request, "once"))
        await tg.said("job done", job_chat)
        assert tg.ran == 1
        assert not tg.tool_results()[-1].startswith("Error")


async def test_a_jobs_question_survives_a_restart_and_its_old_button_still_works(
    tmp_path, llm, api
):
    from bot.cron.schedule import Schedule
    from bot.cron.scheduler import Scheduler
    from bot.cron.store import JobStore, new_job

    async with running(tmp_path, llm, api, groupTools=["*"]) as tg:
        for chat in (ALICE, GROUP):
            await _known_chat(tg, chat)
        cfg = tg.stack.loop.cfg
        store = JobStore(cfg.agent.state_path)
        schedule = Schedule.make(every_seconds=3600, tz="UTC")
        store.update(
            lambda jobs: new_job(
                jobs,
                session=f"telegram:{GROUP}",
                message="run",
                schedule=schedule,
                now=T0,
                by_admin=True,  # a job a non-admin made could not run exec at all
            )
        )
        clock = Clock(T0)
        sched = Scheduler(cfg, store, tg.stack.bus, tg.stack.store, {"telegram"}, clock=clock)
        llm.script(tool_step(call("exec", {"command": RISKY})), reply("done after restart"))
        await sched.tick()
        clock.now = T0 + timedelta(hours=1)
        await sched.tick()
        request = await tg.request(ALICE)
    # Stopped while the question waits: the pause stays in the group's checkpoint.
    async with running(tmp_path, llm, api, groupTools=["*"]) as tg:
        api.press(request, button_data(request, "once"))  # Alice's old button, in her chat
        await tg.said("done after restart", GROUP)
        assert tg.ran == 1
        assert sum(bool(api.markup(c)) for c in api.sent()) == 1  # not asked again


async def test_an_admins_press_finds_a_jobs_question_on_disk_after_a_restart(tmp_path):
    """Pressed in the admin's chat before the resumed turn waits again: the desk has not seen
    the question in this process, and finds the session that waits for it on disk."""
    from bot.approvals import ApprovalDesk
    from bot.bus import InboundMessage, MessageBus
    from bot.gate.approval import describe_call, new_record
    from bot.kinds import with_kind

    cfg = make_config(tmp_path, "http://127.0.0.1:9/v1", tools={"approval": "risky"})
    store = SessionStore(cfg.agent.state_path)
    arguments = json.dumps({"command": RISKY})
    question = describe_call("exec", arguments, ExecTool.effects)
    owners = [("telegram", str(ALICE))]
    record = new_record("c1", "exec", question, "memobot-scheduler", True, 60, owner_chats=owners)
    assistant = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c1", "function": {"name": "exec", "arguments": arguments}}],
    }
    checkpoint = {"phase": "awaiting_approval", "messages": [assistant], "approval": record}
    store.append(store.get(f"telegram:{GROUP}"), metadata={"runtime_checkpoint": checkpoint})
    tools = build_default_tools(cfg.tools)
    desk = ApprovalDesk(cfg, SessionStore(cfg.agent.state_path), MessageBus(), tools)  # restarted

    def press(sender: int, choice: str, admin: bool) -> InboundMessage:
        return with_kind(
            InboundMessage(
                "telegram",
                str(ALICE),
                str(sender),
                "",
                message_id=f"p-{sender}-{choice}",
                metadata={"approval": {"id": record["id"], "choice": choice}, "is_admin": admin},
            )
        )

    # Not an admin: the desk does not even look (an unknown id, as far as Bob can tell).
    assert await desk.press(press(BOB, "once", False)) == EXPIRED
    shown = await desk.press(press(ALICE, "show", True))
    assert shown is not None and f"\n{RISKY}\n" in shown
    assert await desk.press(press(ALICE, "once", True)) == "Allowed once."
    state = SessionStore(cfg.agent.state_path).get(f"telegram:{GROUP}").state
    assert (state.open_approval or {}).get("state") == "once"


async def test_on_discord_a_jobs_question_goes_to_the_admins_direct_messages(tmp_path, llm):
    from bot.cron.schedule import Schedule
    from bot.cron.scheduler import Scheduler
    from bot.cron.store import JobStore, new_job
    from tests.fakes.discord_api import TEXT_CHANNEL_ID, FakeDiscord
    from tests.helpers.discord import ALICE as D_ALICE
    from tests.helpers.discord import running as discord_running

    async with FakeDiscord() as server:
        with server.patch():
            async with discord_running(tmp_path, llm, server) as bot:
                cfg = bot.harness.cfg
                cfg.tools.approval = "risky"
                cfg.channels.discord.group_tools = ["*"]  # exec in the guild's jobs too
                bot.harness.stack.loop.approvals.policy = policy_for(cfg)
                store = JobStore(cfg.agent.state_path)
                store.update(
                    lambda jobs: new_job(
                        jobs,
                        session=f"discord:{TEXT_CHANNEL_ID}",
                        message="run the thing",
                        schedule=Schedule.make(every_seconds=3600, tz="UTC"),
                        now=T0,
                        by_admin=True,
                    )
                )
                stack = bot.harness.stack
                clock = Clock(T0)
                sched = Scheduler(cfg, store, stack.bus, stack.store, {"discord"}, clock=clock)
                llm.script(tool_step(call("exec", {"command": RISKY})), reply("job done"))
                await sched.tick()
                clock.now = T0 + timedelta(hours=1)
                await sched.tick()
                await server.wait_for(lambda: any(server.buttons(p) for p in server.posts()), WAIT)
                post = next(p for p in server.posts() if server.buttons(p))
                # Opened by the API (Create DM), not the job's channel.
                dm = server.dm_channels[post.channel_id]
                assert [r["id"] for r in dm["recipients"]] == [D_ALICE["id"]]
                once = next(
                    b["custom_id"] for b in server.buttons(post) if "once" in b["custom_id"]
                )
                await server.press(post, once, D_ALICE)
                await server.wait_for(
                    lambda: any(
                        "job done" in (p.body.get("content") or "")
                        for p in server.posts(TEXT_CHANNEL_ID)
                    ),
                    WAIT,
                )
                assert (tmp_path / "ws" / "ran.txt").read_text() == "ran\n"


async def test_the_heartbeats_question_reaches_the_owner(tmp_path, llm, api):
    from bot.cron.scheduler import Scheduler
    from bot.cron.store import JobStore

    (tmp_path / "ws").mkdir(exist_ok=True)
    (tmp_path / "ws" / "HEARTBEAT.md").write_text("- [ ] record that it ran\n")
    async with running(tmp_path, llm, api) as tg:
        await _known_chat(tg, ALICE)
        cfg = tg.stack.loop.cfg
        cfg.heartbeat.interval_minutes = 30
        clock = Clock(T0)
        sched = Scheduler(
            cfg, JobStore(cfg.agent.state_path), tg.stack.bus, tg.stack.store, set(), clock=clock
        )
        llm.script(tool_step(call("exec", {"command": RISKY})), reply("the check ran"))
        await sched.tick()
        clock.now = T0 + timedelta(minutes=30)
        await sched.tick()
        request = await tg.request(ALICE)
        api.press(request, button_data(request, "once"))
        await tg.said("the check ran", ALICE)
        assert tg.ran == 1


async def test_a_heartbeat_with_nobody_to_ask_is_refused_at_once(tmp_path, llm, api):
    from bot.cron.scheduler import Scheduler
    from bot.cron.store import JobStore

    (tmp_path / "ws").mkdir(exist_ok=True)
    (tmp_path / "ws" / "HEARTBEAT.md").write_text("- [ ] record that it ran\n")
    # No admin anywhere: nobody may answer its question. The timeout (30 min) never comes.
    async with running(tmp_path, llm, api, admins=[]) as tg:
        await _known_chat(tg, ALICE)
        cfg = tg.stack.loop.cfg
        cfg.heartbeat.interval_minutes = 30
        cfg.heartbeat.deliver_to = f"telegram:{ALICE}"
        clock = Clock(T0)
        sched = Scheduler(
            cfg, JobStore(cfg.agent.state_path), tg.stack.bus, tg.stack.store, set(), clock=clock
        )
        llm.script(tool_step(call("exec", {"command": RISKY})), reply("could not run it"))
        await sched.tick()
        clock.now = T0 + timedelta(minutes=30)
        await sched.tick()
        await tg.said("could not run it", ALICE)
        assert "no admin's private chat is reachable" in tg.tool_results()[-1]
        assert tg.ran == 0 and not any(api.markup(c) for c in api.sent())


# -- a SIGKILL while waiting ---------------------------------------------------------------


def _gateway(config: Path, failpoints: str = "") -> subprocess.Popen[bytes]:
    env = {**os.environ, "MEMOBOT_FAILPOINTS": failpoints}
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL"):
        env.pop(name, None)
    return zygote.popen(
        ["--config", str(config), "gateway"],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(config.parent / "gateway.log", "ab"),  # the child keeps writing
    )


def test_sigkill_after_the_answer_never_runs_the_command_twice(tmp_path):
    """Killed between the recorded "allow" and the command: the restart does not run it
    again blindly (it may have started); the model is told it was interrupted."""
    with FakeLLM.start_in_thread() as llm, FakeBotAPI.start_in_thread() as api:
        llm.script(tool_step(call("exec", {"command": RISKY})), reply("answered after all"))
        config = tmp_path / "config.json"
        data = config_dict(
            tmp_path,
            llm.base_url,
            channels={"telegram": {**settings(api.api), "pollTimeoutSeconds": 5}},
            tools={"exec": {"timeoutSeconds": 20}, "approval": "risky"},
        )
        config.write_text(json.dumps(data))
        proc = _gateway(config, "approval_recorded")
        try:
            api.private_text("run it")
            api.wait_for(lambda: any(api.markup(c) for c in api.sent()), 30)
            request = next(c for c in api.sent() if api.markup(c))
            api.press(request, button_data(request, "once"))
            assert proc.wait(20) == -signal.SIGKILL
        finally:
            stop_gateway(proc)
        proc = _gateway(config)
        try:
            api.wait_for(
                lambda: any("answered after all" in c.params["text"] for c in api.sent()), 30
            )
            time.sleep(0.5)
        finally:
            stop_gateway(proc)
        assert not (tmp_path / "ws" / "ran.txt").exists()
        results = [m for m in llm.requests[-1]["body"]["messages"] if m.get("role") == "tool"]
        assert results[-1]["content"] == INTERRUPTED_TOOL_RESULT
        assert sum("answered after all" in c.params["text"] for c in api.sent()) == 1


def test_sigkill_while_waiting_keeps_the_question_and_runs_the_command_once(tmp_path):
    with FakeLLM.start_in_thread() as llm, FakeBotAPI.start_in_thread() as api:
        llm.script(tool_step(call("exec", {"command": RISKY})), reply("ran after restart"))
        config = tmp_path / "config.json"
        data = config_dict(
            tmp_path,
            llm.base_url,
            channels={"telegram": {**settings(api.api), "pollTimeoutSeconds": 5}},
            tools={"exec": {"timeoutSeconds": 20}, "approval": "risky"},
        )
        config.write_text(json.dumps(data))
        ran = tmp_path / "ws" / "ran.txt"
        proc = _gateway(config)
        try:
            api.private_text("run it")
            api.wait_for(lambda: any(api.markup(c) for c in api.sent()), 30)
            request = next(c for c in api.sent() if api.markup(c))
            proc.send_signal(signal.SIGKILL)
            assert proc.wait(10) == -signal.SIGKILL
        finally:
            stop_gateway(proc)
        assert not ran.exists()
        status = run_memobot("status", config=config).stdout
        assert re.search(rf"approvals +1 open: telegram:{ALICE} ap-\w+: exec: {RISKY}", status)
        proc = _gateway(config)
        try:
            time.sleep(1.0)  # the restarted turn waits again; it must not run or deny
            assert not ran.exists()
            assert sum(bool(api.markup(c)) for c in api.sent()) == 1  # not asked twice
            api.press(request, button_data(request, "once"))  # the old button still works
            api.wait_for(
                lambda: any("ran after restart" in c.params["text"] for c in api.sent()), 30
            )
            time.sleep(0.5)
            assert ran.read_text().splitlines() == ["ran"]
        finally:
            stop_gateway(proc)
        assert proc.returncode == 0, (tmp_path / "gateway.log").read_text()
        assert re.search(r"approvals +none open", run_memobot("status", config=config).stdout)


# -- the terminal: a y/N prompt ------------------------------------------------------------


@pytest.mark.parametrize(("answer", "runs"), [("y", 1), ("n", 0), ("", 0)])
def test_terminal_asks_on_stderr_and_takes_the_next_line_as_the_answer(tmp_path, answer, runs):
    with FakeLLM.start_in_thread() as llm:
        llm.script(tool_step(call("exec", {"command": RISKY})), reply("finished"))
        config = tmp_path / "config.json"
        data = config_dict(tmp_path, llm.base_url, tools={"approval": "risky"})
        config.write_text(json.dumps(data))
        result = run_memobot("agent", config=config, stdin=f"run it\n{answer}\n")
    assert result.returncode == 0, result.stderr
    assert f"\n  │ {RISKY}\n" in result.stderr and "allow? [y]es once" in result.stderr
    assert "finished" in result.stdout
    ran = tmp_path / "ws" / "ran.txt"
    assert (len(ran.read_text().splitlines()) if ran.exists() else 0) == runs
    results = [m for m in llm.requests[-1]["body"]["messages"] if m.get("role") == "tool"]
    assert ("denied" in results[-1]["content"]) is (runs == 0)


@pytest.mark.skipif(launcher.landlock_abi() < 1, reason="exec needs Landlock")
@pytest.mark.parametrize("allow", [None, ["ls", "git status"]], ids=["default", "owner-allowed"])
def test_git_status_asks_first_and_runs_no_program_the_repository_names(tmp_path, allow):
    """A .git/config the model wrote makes `git status` run its fsmonitor: by default git
    asks first, and approved (or allowlisted by the owner) it still runs nothing planted."""
    ws = tmp_path / "ws"
    ws.mkdir()
    marker = ws / "ran.txt"
    evil = ws / ".evil"
    evil.write_text(f"#!/bin/sh\necho ran >> {marker}\n")
    evil.chmod(0o755)
    for args in (["init", "-q"], ["config", "core.fsmonitor", str(evil)]):
        subprocess.run(["git", "-C", str(ws), *args], check=True)
    subprocess.run(["git", "-C", str(ws), "status"], check=True, capture_output=True)
    assert marker.exists()  # the control: plain git runs it
    marker.unlink()
    with FakeLLM.start_in_thread() as llm:
        llm.script(tool_step(call("exec", {"command": "git status"})), reply("finished"))
        tools: dict[str, Any] = {"approval": "risky"}
        if allow is not None:
            tools["exec"] = {"allow": allow}
        config = tmp_path / "config.json"
        config.write_text(json.dumps(config_dict(tmp_path, llm.base_url, tools=tools)))
        answer = "y\n" if allow is None else ""
        result = run_memobot("agent", config=config, stdin=f"run it\n{answer}")
    assert result.returncode == 0, result.stderr
    asked = "\n  │ git status\n" in result.stderr and "allow? [y]es once" in result.stderr
    assert asked is (allow is None)
    results = [m for m in llm.requests[-1]["body"]["messages"] if m.get("role") == "tool"]
    assert "No commits yet" in results[-1]["content"]  # it ran
    assert not marker.exists()


# -- Discord: message components ----------------------------------------------------------


async def test_discord_buttons_answer_an_approval(tmp_path, llm):
    from tests.fakes.discord_api import FakeDiscord
    from tests.helpers.discord import ALICE as D_ALICE
    from tests.helpers.discord import ALICE_DM as D_ALICE_DM
    from tests.helpers.discord import BOB as D_BOB
    from tests.helpers.discord import running as discord_running

    llm.script(tool_step(call("exec", {"command": RISKY})), reply("discord ran it"))
    async with FakeDiscord() as server:
        with server.patch():
            async with discord_running(tmp_path, llm, server, groupTools=["*"]) as bot:
                # That harness builds its config with approvals off (tests.helpers).
                bot.harness.cfg.tools.approval = "risky"
                bot.harness.stack.loop.approvals.policy = policy_for(bot.harness.cfg)
                await server.send_message(D_ALICE_DM, D_ALICE, "run it", guild_id=None)
                await server.wait_for(lambda: any(server.buttons(p) for p in server.posts()), WAIT)
                post = next(p for p in server.posts() if server.buttons(p))
                labels = [b["label"] for b in server.buttons(post)]
                assert labels == ["Allow once", "Always allow this command", "Deny"]
                once = next(
                    b["custom_id"] for b in server.buttons(post) if "once" in b["custom_id"]
                )
                # Bob is not in allowFrom: refused, shown only to him.
                refused = await server.press(post, once, D_BOB)
                await server.wait_for(lambda: server.interaction_answers(refused), WAIT)
                [answer] = server.interaction_answers(refused)
                assert answer.body["type"] == 4 and answer.body["data"]["flags"] == 64
                assert (tmp_path / "ws" / "ran.txt").exists() is False
                pressed = await server.press(post, once, D_ALICE)
                await server.wait_for(
                    lambda: any(
                        "discord ran it" in (p.body.get("content") or "") for p in server.posts()
                    ),
                    WAIT,
                )
                assert server.interaction_answers(pressed)[0].body["type"] == 6  # acknowledged
                assert (tmp_path / "ws" / "ran.txt").read_text() == "ran\n"


# -- Slack: Block Kit buttons ----------------------------------------------------------------


async def test_slack_buttons_answer_an_approval_in_a_thread(tmp_path, llm):
    from tests.fakes.slack_api import FakeSlack
    from tests.helpers.slack import ALICE as S_ALICE
    from tests.helpers.slack import CHAN, MALLORY, Rig, mention

    llm.script(tool_step(call("exec", {"command": RISKY})), reply("slack ran it"))
    users = {S_ALICE: {"id": S_ALICE, "profile": {"display_name": "alice"}}}
    async with FakeSlack(users=users, post_interval=0.05) as slack:
        async with Rig(tmp_path, llm, slack, groupTools=["*"]) as rig:
            # That rig builds its config with approvals off (tests.helpers).
            rig.cfg.tools.approval = "risky"
            rig.stack.loop.approvals.policy = policy_for(rig.cfg)
            await slack.push_event(mention("run it", "1700000002.000100"), event_id="Ev1")
            await slack._wait(lambda: any(slack.buttons(p) for p in slack.posts), WAIT)
            post = next(p for p in slack.posts if slack.buttons(p))
            assert (post.channel, post.thread_ts) == (CHAN, "1700000002.000100")
            labels = [b["text"]["text"] for b in slack.buttons(post)]
            assert labels == ["Allow once", "Always allow this command", "Deny"]
            once = next(
                b["action_id"] for b in slack.buttons(post) if b["action_id"].endswith(":once")
            )
            refused = await slack.push_action(post, once, user=MALLORY)  # not in allowFrom
            await slack.wait_ack(refused)
            assert not (tmp_path / "ws" / "ran.txt").exists()
            pressed = await slack.push_action(post, once, user=S_ALICE)
            await slack.wait_ack(pressed)
            await slack._wait(lambda: any("slack ran it" in p.text for p in slack.posts), WAIT)
            assert (tmp_path / "ws" / "ran.txt").read_text() == "ran\n"


def test_terminal_asks_again_after_a_sigkill_while_waiting(tmp_path):
    from tests.helpers.crash import Memobot

    with FakeLLM.start_in_thread() as llm:
        llm.script(tool_step(call("exec", {"command": RISKY})), reply("finished later"))
        config = tmp_path / "config.json"
        config.write_text(
            json.dumps(config_dict(tmp_path, llm.base_url, tools={"approval": "risky"}))
        )
        bot = Memobot(tmp_path, config)
        first = bot.start("t", ["run it"], keep_stdin_open=True)
        deadline = time.monotonic() + 20
        while "allow? [y]es once" not in first.stderr:
            assert time.monotonic() < deadline, first.describe()
            time.sleep(0.05)
        first.kill()
        second = bot.run("t", ["y"])
        assert second.returncode == 0, second.describe()
        assert "allow? [y]es once" in second.stderr and "finished later" in second.stdout
    assert (tmp_path / "ws" / "ran.txt").read_text() == "ran\n"
