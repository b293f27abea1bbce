"""Pairing (channels.<name>.dmPolicy "pairing") through the real python-telegram-bot against the
fake Bot API, the real agent loop, the real CLI in a subprocess and the real state files."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from bot.app import AgentStack
from bot.config import Config
from bot.pairing import ALPHABET, MAX_PENDING, PairingStore, announce_approvals, stores
from bot.service.daemon import ServiceHooks
from tests.fakes.llm_server import FakeLLM, reply
from tests.fakes.telegram_api import BOT_USERNAME, FakeBotAPI
from tests.helpers import (
    config_dict,
    make_config,
    run_memobot,
    telegram_in_process,
    write_config,
)
from tests.helpers.telegram import settings as telegram_settings

OWNER = 1001  # in allowFrom, admin
STRANGER = 2002
GROUP = -1001234
CODE = re.compile(rf"code: ([{ALPHABET}]{{8}})\n")


@dataclass
class Running:
    api: FakeBotAPI
    llm: FakeLLM
    stack: AgentStack
    tmp: Path
    config: Path
    cfg: Config
    channel: Any

    def codes(self, chat: int) -> list[str]:
        return [m[1] for c in self.api.sent(chat) if (m := CODE.search(c.params["text"]))]

    async def said(self, text: str, chat: int) -> None:
        await self.api.wait_for_async(
            lambda: any(text in c.params["text"] for c in self.api.sent(chat)), 30
        )

    def store(self) -> PairingStore:
        return PairingStore(self.tmp / "state", "telegram")


@asynccontextmanager
async def running(
    tmp_path: Path, llm: FakeLLM, api: FakeBotAPI, **tg: Any
) -> AsyncIterator[Running]:
    settings = telegram_settings(api, **{"dmPolicy": "pairing", **tg})  # OWNER is Alice
    config = write_config(tmp_path, llm.base_url, channels={"telegram": settings})
    cfg = make_config(tmp_path, llm.base_url, channels={"telegram": settings})
    async with telegram_in_process(cfg, config) as (stack, channel, _manager):
        announcer = asyncio.create_task(
            announce_approvals(
                stores(cfg.agent.state_path, ["telegram"]), stack.loop.announce_once, every=0.1
            )
        )
        try:
            yield Running(api, llm, stack, tmp_path, config, cfg, channel)
        finally:
            announcer.cancel()
            await asyncio.gather(announcer, return_exceptions=True)


async def _cli(*args: str, config: Path) -> Any:
    return await asyncio.to_thread(run_memobot, "pairing", *args, config=config)


async def test_a_stranger_gets_one_code_and_is_let_in_by_the_cli(tmp_path, llm, api):
    async with running(tmp_path, llm, api) as tg:
        api.private_text("hello?", user_id=STRANGER, username="eve")
        await api.wait_sent_async(1, STRANGER, 30)
        [code] = tg.codes(STRANGER)
        api.private_text("anyone?", user_id=STRANGER, username="eve")
        api.private_text("hello??", user_id=STRANGER, username="eve")
        await asyncio.sleep(0.5)
        assert len(api.sent(STRANGER)) == 1  # one reply per sender per hour
        assert llm.requests == []  # nothing a stranger says is processed
        listing = (await _cli("list", config=tg.config)).stdout
        assert f"waiting  {code}  {STRANGER} (@eve)" in listing
        # Lower case and spaces are accepted: people read codes aloud.
        approved = await _cli("approve", f"{code[:4].lower()} {code[4:]}", config=tg.config)
        assert approved.returncode == 0, approved.stderr
        await tg.said("You have been approved", STRANGER)
        # The running gateway lets them in at once, without a reload.
        api.private_text("now?", user_id=STRANGER, username="eve")
        await tg.said("echo: now?", STRANGER)
        await asyncio.sleep(0.5)
        approvals = [c for c in api.sent(STRANGER) if "approved" in c.params["text"]]
        assert len(approvals) == 1
        # The config's allowFrom is never rewritten.
        assert json.loads(tg.config.read_text())["channels"]["telegram"]["allowFrom"] == ["1001"]
        # A code works once.
        assert (await _cli("approve", code, config=tg.config)).returncode == 1
        # Revoked: refused again (and no new code within the hour).
        revoked = await _cli("revoke", "telegram", str(STRANGER), config=tg.config)
        assert revoked.returncode == 0
        before = len(llm.requests)
        api.private_text("still here?", user_id=STRANGER, username="eve")
        await asyncio.sleep(0.8)
        assert len(llm.requests) == before


async def test_codes_expire_after_an_hour(tmp_path, llm, api):
    async with running(tmp_path, llm, api) as tg:
        api.private_text("hello?", user_id=STRANGER)
        await api.wait_sent_async(1, STRANGER, 30)
        [code] = tg.codes(STRANGER)
        # An hour later (the file's clock moved back instead of waiting an hour).
        path = tg.store().path
        data = json.loads(path.read_text())
        data["pending"][0]["created"] -= 3601
        data["replied"] = {k: t - 3601 for k, t in data["replied"].items()}
        path.write_text(json.dumps(data))
        result = await _cli("approve", code, config=tg.config)
        assert result.returncode == 1 and "expire" in result.stdout
        # The next message after the hour gets a new code.
        api.private_text("hello again", user_id=STRANGER)
        await api.wait_sent_async(2, STRANGER, 30)
        [_, second] = tg.codes(STRANGER)
        assert second != code


async def test_a_refused_code_lets_nobody_in_and_gives_no_new_code_that_hour(tmp_path, llm, api):
    async with running(tmp_path, llm, api) as tg:
        api.private_text("hello?", user_id=STRANGER)
        await api.wait_sent_async(1, STRANGER, 30)
        [code] = tg.codes(STRANGER)
        refused = await _cli("refuse", code.lower(), config=tg.config)
        assert refused.returncode == 0 and f"Refused telegram user {STRANGER}" in refused.stdout
        assert tg.store().listing().waiting == []
        assert (await _cli("approve", code, config=tg.config)).returncode == 1
        assert (await _cli("refuse", code, config=tg.config)).returncode == 1
        api.private_text("hello??", user_id=STRANGER)
        await asyncio.sleep(0.5)
        assert len(api.sent(STRANGER)) == 1 and llm.requests == []


async def test_at_most_three_codes_wait_per_channel(tmp_path, llm, api):
    async with running(tmp_path, llm, api) as tg:
        strangers = [3001, 3002, 3003, 3004]
        for user in strangers:
            api.private_text("hi", user_id=user, username=None)
            await asyncio.sleep(0.05)
        await api.wait_for_async(
            lambda: sum(len(api.sent(u)) for u in strangers) >= MAX_PENDING, 30
        )
        await asyncio.sleep(0.5)
        assert [len(api.sent(u)) for u in strangers] == [1, 1, 1, 0]
        assert len(tg.store().snapshot()["pending"]) == MAX_PENDING


async def test_groups_never_pair_and_an_admin_approves_from_chat(tmp_path, llm, api):
    async with running(tmp_path, llm, api) as tg:
        api.group_text(f"@{BOT_USERNAME} let me in", user_id=STRANGER, chat_id=GROUP)
        await asyncio.sleep(0.5)
        assert api.sent(GROUP) == [] and api.sent(STRANGER) == []
        assert not tg.store().path.exists()
        api.private_text("hello?", user_id=STRANGER)
        await api.wait_sent_async(1, STRANGER, 30)
        [code] = tg.codes(STRANGER)
        # A stranger cannot approve themselves: they cannot reach the bot at all.
        api.private_text(f"/approve {code}", user_id=STRANGER)
        await asyncio.sleep(0.3)
        assert tg.store().approved_ids() == frozenset()
        api.private_text(f"/approve {code}", user_id=OWNER)
        await tg.said(f"Approved telegram user {STRANGER}", OWNER)
        await tg.said("You have been approved", STRANGER)
        llm.script(reply("welcome"))
        api.private_text("thanks", user_id=STRANGER)
        await tg.said("welcome", STRANGER)


async def test_allowlist_policy_gives_no_code(tmp_path, llm, api):
    async with running(tmp_path, llm, api, dmPolicy="allowlist"):
        api.private_text("hello?", user_id=STRANGER)
        await asyncio.sleep(0.5)
        assert api.sent(STRANGER) == []


async def test_a_reload_that_changes_allow_from_keeps_pairing(tmp_path, llm, api):
    """SIGHUP with a new allowFrom: the people let in by pairing stay in, and a stranger
    still gets a code (the channel's dmPolicy and pairing store survive the reload)."""
    async with running(tmp_path, llm, api) as tg:
        api.private_text("hello?", user_id=STRANGER)
        await api.wait_sent_async(1, STRANGER, 30)
        [code] = tg.codes(STRANGER)
        assert (await _cli("approve", code, config=tg.config)).returncode == 0
        await tg.said("You have been approved", STRANGER)
        # The owner adds a friend by hand and reloads: the gateway's SIGHUP path.
        data = config_dict(tmp_path, llm.base_url)
        data["channels"] = json.loads(tg.config.read_text())["channels"]
        data["channels"]["telegram"]["allowFrom"] = [str(OWNER), "4004"]
        tg.config.write_text(json.dumps(data))
        gateway = SimpleNamespace(cfg=tg.cfg, stack=tg.stack, channels=[tg.channel])
        hooks = ServiceHooks(gateway, tg.config)  # type: ignore[arg-type]
        hooks.reload()
        hooks.close()
        assert tg.cfg.channels.telegram.allow_from == [str(OWNER), "4004"]
        api.private_text("still in?", user_id=STRANGER)
        await tg.said("echo: still in?", STRANGER)
        api.private_text("hello?", user_id=3003)
        await api.wait_sent_async(1, 3003, 30)
        assert len(tg.codes(3003)) == 1


async def test_discord_dm_from_a_stranger_gets_a_code(tmp_path, llm):
    from tests.fakes.discord_api import FakeDiscord
    from tests.helpers.discord import BOB, BOB_DM
    from tests.helpers.discord import running as discord_running

    async with FakeDiscord() as server:
        with server.patch():
            async with discord_running(tmp_path, llm, server, dmPolicy="pairing"):
                await server.send_message(BOB_DM, BOB, "hello?", guild_id=None)
                await server.send_message(BOB_DM, BOB, "hello??", guild_id=None)
                [post] = await server.wait_posts(1, BOB_DM, 30)
                await asyncio.sleep(0.3)
                assert len(server.posts(BOB_DM)) == 1
                [code] = CODE.findall(post.body["content"] + "\n")
                approved = PairingStore(tmp_path / "state", "discord").approve(code)
                assert approved is not None and approved.sender_id == BOB["id"]
                await server.send_message(BOB_DM, BOB, "now?", guild_id=None)
                await server.wait_for(
                    lambda: any(
                        "echo: now?" in (p.body.get("content") or "") for p in server.posts(BOB_DM)
                    ),
                    30,
                )
    assert llm.requests and len(llm.requests) == 1  # only the message after the approval


async def test_slack_dm_from_a_stranger_gets_a_code(tmp_path, llm):
    from tests.fakes.slack_api import FakeSlack
    from tests.helpers.slack import DM, MALLORY, Rig, dm

    async with FakeSlack(post_interval=0.05) as slack:
        async with Rig(tmp_path, llm, slack, dmPolicy="pairing"):
            await slack.push_event(dm("hello?", "1700000001.000100", user=MALLORY), "Ev1")
            await slack.push_event(dm("hello??", "1700000002.000100", user=MALLORY), "Ev2")
            [post] = await slack.wait_posts(1, 30)
            await asyncio.sleep(0.3)
            assert len(slack.posts) == 1 and post.channel == DM
            assert CODE.search(post.text + "\n") and MALLORY in post.text
    assert llm.requests == []
