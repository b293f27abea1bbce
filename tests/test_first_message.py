"""Issue 29 item 2: a first Telegram message gets an answer. A fresh ``memobot onboard`` in a
terminal (a pty, typed answers) with the fake Telegram and the fake LLM, then the gateway, then
a first private message: the owner found during onboard is answered at once; without the
owner's id, the newcomer gets a pairing code the owner approves with ``memobot pairing``."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bot.config import load_config, parse_config
from bot.pairing import ALPHABET, PairingStore
from bot.service.doctor import check_channel_access
from channels.access import AccessPolicy
from tests.fakes.llm_server import FakeLLM, FakeLLMThread
from tests.fakes.slack_api import APP_TOKEN, BOT_TOKEN, FakeSlack
from tests.fakes.telegram_api import FakeBotAPI, FakeBotAPIThread
from tests.helpers import (
    REPO,
    closed_port,
    config_dict,
    run_memobot,
    start_gateway,
    stop_gateway,
    wait_for,
)
from tests.helpers.console import Pty

OWNER = 4242
NOWHERE = "http://127.0.0.1:9/v1"  # an LLM these tests never ask
CODE = re.compile(rf"code: ([{ALPHABET}]{{8}})\n")


@pytest.fixture
def llm() -> Iterator[FakeLLMThread]:
    with FakeLLM.start_in_thread() as server:
        yield server


@pytest.fixture
def telegram() -> Iterator[FakeBotAPIThread]:
    with FakeBotAPI.start_in_thread() as server:
        yield server


def onboard(config: Path, llm: FakeLLMThread, telegram: FakeBotAPIThread) -> Pty:
    """``memobot onboard`` on a terminal: the model from flags, the channel step asked."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "MEMOBOT_"))}
    argv = [sys.executable, "-m", "bot", "--config", str(config), "onboard"]
    argv += ["--base-url", llm.base_url, "--api-key", "test-key", "--model", "fake-model"]
    argv += ["--api-url", f"telegram={telegram.base_url}"]
    term = Pty(argv, {**env, "PYTHONPATH": str(REPO), "TERM": "dumb"})
    term.read_until("Which ones?")
    term.send("telegram\r")
    term.read_until("not shown")
    term.send(telegram.token + "\r")
    return term


def said(telegram: FakeBotAPIThread, chat: int, text: str, within: float = 30) -> str:
    def found() -> str | None:
        return next(
            (c.params["text"] for c in telegram.sent(chat) if text in c.params["text"]), None
        )

    assert wait_for(found, within), [c.params["text"] for c in telegram.sent(chat)]
    return found() or ""


def test_the_owner_found_in_onboard_gets_an_answer_to_the_first_message(
    tmp_path: Path, llm: FakeLLMThread, telegram: FakeBotAPIThread
) -> None:
    config = tmp_path / "home" / "config.json"
    term = onboard(config, llm, telegram)
    term.read_until("✓ telegram: token accepted")
    term.read_until("Find it now")
    term.send("\r")
    term.read_until("Send any message to your bot")
    telegram.private_text("hello bot", user_id=OWNER, username="owner")
    term.read_until(f"@owner (User{OWNER}), user id {OWNER}. Is that you?")
    term.send("y\r")
    assert term.wait() == 0, term.text
    assert "model fake-model answered" in term.text
    assert f"write to the bot; it answers you (user {OWNER})" in term.text
    cfg, _ = load_config(config)
    assert cfg.channels.telegram.enabled and cfg.channels.telegram.allow_from == [str(OWNER)]
    gateway = start_gateway(config)
    try:
        # The message sent while onboard looked was left for the gateway: it is answered.
        said(telegram, OWNER, "echo: hello bot")
    finally:
        stop_gateway(gateway)


def test_without_the_owners_id_a_first_message_gets_a_code_the_owner_approves(
    tmp_path: Path, llm: FakeLLMThread, telegram: FakeBotAPIThread
) -> None:
    config = tmp_path / "home" / "config.json"
    term = onboard(config, llm, telegram)
    term.read_until("Find it now")
    term.send("n\r")
    term.read_until("Enter for none")
    term.send("\r")
    assert term.wait() == 0, term.text
    assert "pairing approve CODE" in term.text
    gateway = start_gateway(config)
    try:
        telegram.private_text("hello bot", user_id=OWNER, username="owner")
        code = CODE.search(said(telegram, OWNER, "code: "))
        assert code is not None
        assert wait_for(lambda: code[1] in (config.parent / "gateway.log").read_text(), 10)
        listed = run_memobot("pairing", "list", config=config)
        assert f"waiting  {code[1]}  {OWNER} (@owner)" in listed.stdout
        approved = run_memobot("pairing", "approve", code[1], config=config)
        assert approved.returncode == 0, approved.stderr
        assert "channels add telegram --owner 4242" in approved.stdout
        said(telegram, OWNER, "You have been approved")
        telegram.private_text("and now?", user_id=OWNER, username="owner")
        said(telegram, OWNER, "echo: and now?")
    finally:
        stop_gateway(gateway)


# -- the default private-chat policy -----------------------------------------------------------


@pytest.mark.parametrize(
    ("section", "policy"),
    [
        ({}, "pairing"),  # nobody listed: strangers get a code, never silence
        ({"allowFrom": ["1"]}, "allowlist"),  # the owner is listed: they chose
        ({"dmPolicy": "allowlist"}, "allowlist"),  # written: kept as written
        ({"allowFrom": ["1"], "dmPolicy": "pairing"}, "pairing"),
    ],
)
def test_an_unset_dm_policy_pairs_only_while_nobody_is_listed(
    tmp_path: Path, section: dict, policy: str
) -> None:
    cfg = parse_config(
        config_dict(tmp_path, "http://127.0.0.1:1/v1", channels={"telegram": section})
    )
    access = AccessPolicy.for_channel("telegram", cfg.channels.telegram, tmp_path)
    assert access.dm_policy == policy


def test_a_reload_that_lists_someone_ends_the_default_pairing(tmp_path: Path) -> None:
    cfg = parse_config(config_dict(tmp_path, NOWHERE))
    access = AccessPolicy.for_channel("telegram", cfg.channels.telegram, tmp_path)
    assert access.dm_policy == "pairing"
    listed = cfg.channels.telegram.model_copy(update={"allow_from": ["1"]})
    assert access.reloaded(listed).dm_policy == "allowlist"
    written = cfg.channels.telegram.model_copy(update={"dm_policy": "pairing", "allow_from": ["1"]})
    kept = AccessPolicy.for_channel("telegram", written, tmp_path)
    assert kept.reloaded(written).dm_policy == "pairing"


# -- doctor --------------------------------------------------------------------------------------


def test_doctor_warns_of_a_channel_that_refuses_everyone(
    tmp_path: Path, telegram: FakeBotAPIThread
) -> None:
    refusing = {
        "enabled": True,
        "token": telegram.token,
        "baseUrl": telegram.base_url,
        "dmPolicy": "allowlist",
    }
    config = tmp_path / "config.json"
    data = config_dict(tmp_path, f"http://127.0.0.1:{closed_port()}/v1")
    data["channels"] = {"telegram": refusing}
    config.write_text(json.dumps(data))
    done = run_memobot("doctor", config=config, env={"MEMOBOT_UNIT_DIR": str(tmp_path / "u")})
    assert (
        '! channel telegram: allowFrom is empty and dmPolicy is "allowlist": every message is '
        "refused" in done.stdout
    ), done.stdout
    assert "fix: " in done.stdout and "channels add telegram --owner YOUR_ID" in done.stdout


def test_doctor_is_quiet_when_someone_can_get_in(tmp_path: Path) -> None:
    def warnings(section: dict) -> list[str]:
        tg = {"enabled": True, "token": "1:x", **section}
        cfg = parse_config(
            config_dict(tmp_path, "http://127.0.0.1:1/v1", channels={"telegram": tg})
        )
        return [c.text for c in check_channel_access(cfg)]

    assert warnings({"dmPolicy": "allowlist"})  # refuses everyone
    assert warnings({}) == []  # pairing by default
    assert warnings({"allowFrom": ["1"], "dmPolicy": "allowlist"}) == []
    # Someone let in through pairing earlier still gets in.
    store = PairingStore(tmp_path / "state", "telegram")
    store.approve(store.request("77", "", "77") or "")
    assert warnings({"dmPolicy": "allowlist"}) == []


# -- memobot channels add ------------------------------------------------------------------------


def test_channels_add_checks_the_token_then_writes_only_the_channel(
    tmp_path: Path, telegram: FakeBotAPIThread
) -> None:
    config = tmp_path / "config.json"
    data = config_dict(tmp_path, NOWHERE, memory={"historyKeepDays": 30})
    data["llm"]["apiKey"] = "${MY_LLM_KEY}"  # stays a reference: never written out expanded
    config.write_text(json.dumps(data))
    config.chmod(0o600)
    env = {"MY_LLM_KEY": "sk-secret-value"}
    url = ["--api-url", telegram.base_url]
    refused = run_memobot(
        "channels", "add", "telegram", "--token", "1:WRONG", *url, config=config, env=env
    )
    assert refused.returncode == 1 and "Nothing written" in refused.stderr
    assert json.loads(config.read_text()) == data
    added = run_memobot(
        "channels",
        "add",
        "telegram",
        "--token",
        telegram.token,
        "--owner",
        str(OWNER),
        *url,
        config=config,
        env=env,
    )
    assert added.returncode == 0, added.stderr
    assert "✓ telegram: token accepted" in added.stdout
    assert "write to the bot; it answers you" in added.stdout
    written = json.loads(config.read_text())
    assert written["channels"] == {
        "telegram": {
            "enabled": True,
            "token": telegram.token,
            "baseUrl": telegram.base_url,
            "allowFrom": [str(OWNER)],
        }
    }
    assert {k: v for k, v in written.items() if k != "channels"} == data
    assert config.stat().st_mode & 0o777 == 0o600


def _add(config: Path, *argv: str) -> int:
    from bot.cli import build_parser
    from bot.onboard import run_channels

    return run_channels(build_parser().parse_args(["channels", "add", *argv]), config)


def test_channels_add_refuses_what_cannot_work(tmp_path: Path, capsys) -> None:
    config = tmp_path / "config.json"
    assert _add(config, "telegram", "--token", "1:x") == 78  # no config yet
    assert "onboard" in capsys.readouterr().err
    config.write_text(json.dumps(config_dict(tmp_path, NOWHERE)))
    assert _add(config, "slack", "--token", "xoxb-1") == 2
    assert "slack takes --bot-token, --app-token, not --token" in capsys.readouterr().err
    assert _add(config, "telegram", "--token", "1:x", "--owner", "@alice") == 2
    assert "numeric user id" in capsys.readouterr().err
    assert _add(config, "discord") == 2
    assert "discord needs token: give --token" in capsys.readouterr().err
    assert _add(config, "discord", "--token", "t", "--api-url", "http://x") == 2


async def test_channels_add_slack_and_the_policy_that_refused_everyone(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    data = config_dict(tmp_path, NOWHERE)
    # As an older onboard wrote every default: nobody listed, and an explicit allowlist.
    data["channels"] = {"slack": {"allowFrom": [], "dmPolicy": "allowlist"}}
    config.write_text(json.dumps(data))
    async with FakeSlack() as slack:
        argv = ["slack", "--bot-token", BOT_TOKEN, "--app-token", APP_TOKEN]
        code = await asyncio.to_thread(_add, config, *argv, "--api-url", slack.api_url)
    assert code == 0
    section = json.loads(config.read_text())["channels"]["slack"]
    assert section["dmPolicy"] == "pairing" and section["enabled"] is True
    assert section["botToken"] == BOT_TOKEN and section["appToken"] == APP_TOKEN


# -- the model, checked before onboard saves -------------------------------------------------------


def test_onboard_says_the_model_is_unreachable_and_saves_only_when_told(tmp_path: Path) -> None:
    config = tmp_path / "home" / "config.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "MEMOBOT_"))}
    url = f"http://127.0.0.1:{closed_port()}/v1"
    argv = [sys.executable, "-m", "bot", "--config", str(config), "onboard"]
    term = Pty([*argv, "--base-url", url, "--model", "llama3.1"], {**env, "TERM": "dumb"})
    term.read_until("Save this config anyway? [y/N]")
    assert f"✗ LLM {url} unreachable: cannot reach the LLM endpoint" in term.text
    term.send("\r")
    assert term.wait() == 1, term.text
    assert "Nothing written" in term.text and not config.exists()


async def test_the_channel_step_retries_a_refused_token_and_takes_a_typed_owner(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from bot.config import Config
    from bot.onboard import ask_channels

    answers = iter(["slack", "y", "U0BADID!", "U0OWNER1"])
    secrets = iter(["xoxb-wrong", APP_TOKEN, BOT_TOKEN, APP_TOKEN])
    cfg = Config()
    async with FakeSlack() as slack:
        plans = await asyncio.to_thread(
            ask_channels,
            cfg,
            tmp_path / "config.json",
            lambda q: next(answers),
            lambda q: next(secrets),
            {"slack": slack.api_url},
        )
    out = capsys.readouterr().out
    assert "✗ slack botToken" in out and "xoxb-wrong" not in out
    assert "is not a Slack member id" in out  # the typed id was checked, then asked again
    assert [p.owner for p in plans] == ["U0OWNER1"]
    slack_cfg = cfg.channels.slack
    assert slack_cfg.enabled and slack_cfg.bot_token == BOT_TOKEN
    assert slack_cfg.allow_from == ["U0OWNER1"] and slack_cfg.api_url == slack.api_url


def test_onboard_adds_a_channel_to_an_existing_config_as_written(
    tmp_path: Path, telegram: FakeBotAPIThread
) -> None:
    config = tmp_path / "config.json"
    data = config_dict(tmp_path, NOWHERE)
    data["llm"]["apiKey"] = "${MY_LLM_KEY}"
    config.write_text(json.dumps(data))
    config.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "MEMOBOT_"))}
    argv = [sys.executable, "-m", "bot", "--config", str(config), "onboard"]
    argv += ["--api-url", f"telegram={telegram.base_url}"]
    term = Pty(argv, {**env, "MY_LLM_KEY": "sk-secret-value", "TERM": "dumb"})
    term.read_until("Which ones?")
    term.send("telegram\r")
    term.read_until("not shown")
    term.send(telegram.token + "\r")
    term.read_until("Find it now")
    term.send("n\r")
    term.read_until("Enter for none")
    term.send(f"{OWNER}\r")
    assert term.wait() == 0, term.text
    written = json.loads(config.read_text())
    assert written["llm"]["apiKey"] == "${MY_LLM_KEY}"  # not written out expanded
    assert written["channels"]["telegram"]["allowFrom"] == [str(OWNER)]
    assert {k: v for k, v in written.items() if k != "channels"} == data


def test_finding_the_owner_skips_someone_else_and_leaves_every_message_for_the_gateway(
    telegram: FakeBotAPIThread, capsys: pytest.CaptureFixture[str]
) -> None:
    from bot.onboard import _find_owner, setup_specs

    spec = setup_specs()["telegram"]
    section = parse_config(
        {"channels": {"telegram": {"token": telegram.token, "baseUrl": telegram.base_url}}}
    ).channels.telegram
    telegram.group_text("hi all", user_id=77)  # a group: never the owner's private chat
    telegram.private_text("hi", user_id=77, username="someone")
    telegram.private_text("it's me", user_id=OWNER, username="owner")
    answers, asked = iter(["n", "y"]), []
    assert _find_owner(spec, section, lambda q: asked.append(q) or next(answers)) == str(OWNER)
    assert ["@someone" in q for q in asked] == [True, False]
    assert all("offset" not in c.params for c in telegram.calls("getUpdates"))
    assert len(telegram.pending_updates) == 3
    # Another gateway polling the same bot: said, and the id is typed instead.
    telegram.fail("getUpdates", 409, "Conflict: terminated by other getUpdates request")
    assert _find_owner(spec, section, lambda q: "y") is None
    assert "Could not read the bot's messages (HTTP 409: Conflict" in capsys.readouterr().out


def test_channels_add_an_owner_to_a_channel_that_has_its_token(
    tmp_path: Path, telegram: FakeBotAPIThread
) -> None:
    """After approving their own pairing code (a guest), the owner becomes the admin."""
    config = tmp_path / "config.json"
    tg = {"enabled": True, "token": telegram.token, "baseUrl": telegram.base_url}
    config.write_text(json.dumps(config_dict(tmp_path, NOWHERE, channels={"telegram": tg})))
    assert _add(config, "telegram", "--owner", str(OWNER)) == 0
    cfg, _ = load_config(config)
    assert cfg.channels.telegram.allow_from == [str(OWNER)]
    assert cfg.channels.telegram.admin_ids == [str(OWNER)]
    assert [c.method for c in telegram.calls()] == ["getme"]  # the token checked again


async def test_channels_add_keeps_an_id_written_as_a_reference(tmp_path: Path, monkeypatch) -> None:
    """--owner appended to allowFrom as loaded wrote ${OWNER_A}'s value into the file."""
    monkeypatch.setenv("OWNER_A", "U0OWNER1")
    config = tmp_path / "config.json"
    data = config_dict(tmp_path, NOWHERE)
    data["channels"] = {"slack": {"allowFrom": ["${OWNER_A}"], "admins": ["${OWNER_A}"]}}
    config.write_text(json.dumps(data))
    async with FakeSlack() as slack:
        argv = ["slack", "--bot-token", BOT_TOKEN, "--app-token", APP_TOKEN, "--owner", "U0OWNER2"]
        code = await asyncio.to_thread(_add, config, *argv, "--api-url", slack.api_url)
    assert code == 0
    section = json.loads(config.read_text())["channels"]["slack"]
    assert section["allowFrom"] == ["${OWNER_A}", "U0OWNER2"]
    assert section["admins"] == ["${OWNER_A}", "U0OWNER2"]
