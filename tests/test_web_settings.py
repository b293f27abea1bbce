"""The Settings screen and the Access screen's ways in, over real HTTP against the panel on
127.0.0.1: a form saves only what changed (the rest of the file as written, ``${VAR}`` kept,
mode 0600), a wrong value is refused at its field with nothing written, secrets never reach
a page, a channel's token is asked of the (fake) platform before it is written, and a saved
change reaches a running gateway without a restart; a refused stranger is let in from the
panel and answered; a pairing approval is revoked."""

from __future__ import annotations

import json
import logging
import re
import stat
from pathlib import Path
from typing import Any

import pytest

from bot.config import load_config
from bot.config_help import parse_docs
from bot.pairing import PairingStore
from bot.web.config_form import MASK
from channels.refused import RefusedSenders
from tests.helpers import REPO, config_dict, telegram_in_process, write_config
from tests.helpers.telegram import settings as telegram_settings
from tests.helpers.web import GatewayInProcess, browsing, panel_section

NO_LLM = "http://127.0.0.1:9/v1"
STRANGER = 2002


@pytest.fixture(autouse=True)
def telegram_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TG_TOKEN", "123:SECRETfromENV")  # the file names it: ${TG_TOKEN}


def _write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    path.chmod(0o644)  # a save makes it 0600
    return path


def _config(tmp_path: Path, **extra: Any) -> tuple[Path, dict[str, Any]]:
    data = config_dict(tmp_path, NO_LLM, web=panel_section())
    data["channels"] = {"telegram": {"token": "${TG_TOKEN}", "allowFrom": ["1001"]}}
    data["llm"]["apiKey"] = "sk-SECRETinTHEfile"
    data["memory"] = {"maxChars": 5000}
    for k, v in extra.items():
        data[k] = v
    return _write(tmp_path, data), data


async def test_a_form_saves_what_changed_and_keeps_the_rest(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="bot.web")
    config, data = _config(tmp_path)
    cfg, _ = load_config(config)
    async with browsing(cfg, config) as b:
        await b.login()
        status, page, _ = await b.get("/settings/channels.telegram")
        assert status == 200 and "from ${TG_TOKEN}" in page
        assert "SECRETfromENV" not in page
        assert "user ids allowed to talk to the bot" in page  # the docs' help, at its field
        csrf = await b.csrf("/settings/llm")
        _, page, _ = await b.get("/settings/llm")
        assert "sk-SECRET" not in page and ">set<" in page
        form = {
            "csrf": csrf,
            "llm.model": "other-model",
            "llm.temperature": "0.2",
            "llm.apiKey": "",  # empty: kept
            "llm.maxTokens": "4096",  # as shown: not written into the file
        }
        status, _, r = await b.post("/settings/llm", form)
        assert status == 303 and r.headers["Location"] == "/settings/llm"
        _, page, _ = await b.get("/settings/llm")
        assert "Saved llm.model, llm.temperature." in page
        assert "counts when the gateway starts" in page
    after = json.loads(config.read_text())
    expected = json.loads(json.dumps(data))
    expected["llm"].update(model="other-model", temperature=0.2)
    assert after == expected  # the key, ${TG_TOKEN} and maxChars as written; no defaults added
    assert config.read_text() == json.dumps(expected, indent=2, ensure_ascii=False) + "\n"
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    assert "config: llm.model, llm.temperature changed by web" in caplog.text


async def test_a_wrong_value_is_refused_at_its_field_and_nothing_is_written(tmp_path):
    config, _ = _config(tmp_path)
    before = config.read_bytes()
    cfg, _ = load_config(config)
    async with browsing(cfg, config) as b:
        await b.login()
        csrf = await b.csrf("/settings/memory")
        form = {"csrf": csrf, "memory.maxChars": "lots", "memory.historyKeepDays": "30"}
        status, page, _ = await b.post("/settings/memory", form)
        assert status == 422
        field = re.search(r'<input[^>]*id="f-memory.maxChars"[^>]*>', page)
        assert field and 'aria-invalid="true"' in field.group(0)
        assert 'aria-describedby="e-memory.maxChars' in field.group(0)
        assert re.search(r'id="e-memory.maxChars"[^>]*>expected a whole number', page)
        other = re.search(r'<input[^>]*id="f-memory.historyKeepDays"[^>]*>', page)
        assert other and "aria-invalid" not in other.group(0)
        # A value the validator refuses by its own rule: at its field too.
        status, page, _ = await b.post("/settings/memory", {"csrf": csrf, "memory.maxChars": "5"})
        assert status == 422 and re.search(r'id="e-memory.maxChars"[^>]*>[^<]*200', page)
        # A channel's id list: the platform's id rule, at allowFrom.
        status, page, _ = await b.post(
            "/settings/channels.telegram",
            {"csrf": csrf, "channels.telegram.allowFrom": "1001\n@eve"},
        )
        assert status == 422 and 'id="e-channels.telegram.allowFrom"' in page
    assert config.read_bytes() == before


async def test_the_raw_view_masks_secrets_and_keeps_them_when_saved(tmp_path):
    config, _ = _config(tmp_path)
    cfg, _ = load_config(config)
    async with browsing(cfg, config) as b:
        await b.login()
        _, page, _ = await b.get("/settings/raw")
        assert "sk-SECRETinTHEfile" not in page and "${TG_TOKEN}" in page
        shown = json.loads(re.search(r"<textarea[^>]*>(.*?)</textarea>", page, re.S).group(1)
                           .replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">")
                           .replace("&#x27;", "'").replace("&amp;", "&"))  # fmt: skip
        assert shown["llm"]["apiKey"] == MASK
        shown["agent"]["maxToolIterations"] = 7
        csrf = await b.csrf("/settings/raw")
        status, _, _ = await b.post("/settings/raw", {"csrf": csrf, "json": json.dumps(shown)})
        assert status == 303
        saved = json.loads(config.read_text())
        assert saved["llm"]["apiKey"] == "sk-SECRETinTHEfile"  # the mask kept it
        assert saved["channels"]["telegram"]["token"] == "${TG_TOKEN}"
        assert saved["agent"]["maxToolIterations"] == 7
        before = config.read_bytes()
        shown["agent"]["maxToolIterations"] = "many"
        status, page, _ = await b.post("/settings/raw", {"csrf": csrf, "json": json.dumps(shown)})
        assert status == 422 and "agent.maxToolIterations: expected a whole number" in page
        assert 'aria-invalid="true"' in page and "sk-SECRET" not in page
        status, page, _ = await b.post("/settings/raw", {"csrf": csrf, "json": "{oops"})
        assert status == 422 and "not valid JSON" in page
        assert config.read_bytes() == before


async def test_a_channel_token_is_asked_of_the_platform_before_it_is_written(tmp_path, api):
    config = write_config(
        tmp_path, NO_LLM, web=panel_section(), channels={"telegram": {"baseUrl": api.base_url}}
    )
    cfg, _ = load_config(config)
    async with browsing(cfg, config) as b:
        await b.login()
        csrf = await b.csrf("/settings/channels.telegram")
        form = {
            "csrf": csrf,
            "channels.telegram.enabled": "true",
            "channels.telegram.token": "999:WRONGtoken",
        }
        before = config.read_bytes()
        status, page, _ = await b.post("/settings/channels.telegram", form)
        assert status == 422 and "refused the token" in page
        assert re.search(r'id="e-channels.telegram.token"', page)
        assert "WRONGtoken" not in page and config.read_bytes() == before
        form["channels.telegram.token"] = api.token
        status, _, _ = await b.post("/settings/channels.telegram", form)
        assert status == 303
        _, page, _ = await b.get("/settings/channels.telegram")
        assert "token accepted by 127.0.0.1" in page and api.token not in page
    assert json.loads(config.read_text())["channels"]["telegram"]["token"] == api.token


async def test_a_refused_stranger_is_let_in_from_the_panel_and_answered(tmp_path, llm, api, caplog):
    """The running gateway's reload path: the saved allowFrom counts at once."""
    caplog.set_level(logging.INFO, logger="bot.web")
    telegram = telegram_settings(api, dmPolicy="allowlist")
    config = write_config(
        tmp_path, llm.base_url, channels={"telegram": telegram}, web=panel_section()
    )
    cfg, _ = load_config(config)
    async with telegram_in_process(cfg, config) as (stack, channel, _manager):
        gateway = GatewayInProcess(cfg, config, stack, [channel])
        async with browsing(cfg, config, gateway=gateway) as b:
            api.private_text("hello?", user_id=STRANGER, username="eve")
            await api.wait_for_async(lambda: bool(channel.policy.refused.listing()), 30)
            assert llm.requests == []
            await b.login()
            _, page, _ = await b.get("/access")
            assert "Refused recently" in page and f"<code>{STRANGER}</code>" in page
            assert "@eve" in page
            csrf = await b.csrf()
            form = {"csrf": csrf, "channel": "telegram", "id": str(STRANGER)}
            status, _, _ = await b.post("/access/let-in", form)
            assert status == 303
            _, page, _ = await b.get("/access")
            assert f"Let in telegram user {STRANGER} as a guest" in page
            assert "Applied now: channels.telegram.allowFrom" in page
            assert "Refused recently" not in page  # let in: no longer listed
            saved = json.loads(config.read_text())["channels"]["telegram"]
            assert saved["allowFrom"] == ["1001", str(STRANGER)]
            assert saved["admins"] == ["1001"]  # a guest: the admins pinned as they were
            assert not channel.policy.is_admin(str(STRANGER))
            api.private_text("now?", user_id=STRANGER, username="eve")
            await api.wait_for_async(
                lambda: any("echo: now?" in c.params["text"] for c in api.sent(STRANGER)), 30
            )
            assert f"telegram user {STRANGER} let in as a guest (allowFrom) by web" in caplog.text


async def test_a_setting_saved_reaches_the_running_gateway(tmp_path, llm, api):
    config = write_config(
        tmp_path, llm.base_url, channels={"telegram": telegram_settings(api)}, web=panel_section()
    )
    cfg, _ = load_config(config)
    async with telegram_in_process(cfg, config) as (stack, channel, _manager):
        gateway = GatewayInProcess(cfg, config, stack, [channel])
        async with browsing(cfg, config, gateway=gateway) as b:
            await b.login()
            csrf = await b.csrf("/settings/llm")
            form = {"csrf": csrf, "llm.model": "model-two", "llm.proxy": "http://127.0.0.1:1"}
            status, _, _ = await b.post("/settings/llm", form)
            assert status == 303
            _, page, _ = await b.get("/settings/llm")
            assert "Applied now: llm.model." in page
            assert "Takes a restart of the gateway: llm.proxy." in page
            assert cfg.llm.model == "model-two" and stack.provider.model == "model-two"
            assert cfg.llm.proxy == ""  # never half-applied


async def test_a_pairing_approval_is_revoked_from_the_panel(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="bot.web")
    config, _ = _config(tmp_path)
    cfg, _ = load_config(config)
    store = PairingStore(cfg.agent.state_path, "telegram")
    code = store.request(str(STRANGER), "@eve", str(STRANGER))
    assert code and store.approve(code)
    async with browsing(cfg, config) as b:
        await b.login()
        _, page, _ = await b.get("/access")
        assert "Let in through pairing" in page and "Revoke" in page
        csrf = await b.csrf()
        form = {"csrf": csrf, "channel": "telegram", "id": str(STRANGER)}
        assert (await b.post("/access/revoke", form))[0] == 303
        _, page, _ = await b.get("/access")
        assert f"Revoked telegram user {STRANGER}" in page
    assert str(STRANGER) not in store.approved_ids()
    assert f"telegram user {STRANGER} revoked by web" in caplog.text


def test_the_refused_record_is_bounded_and_newest_first(tmp_path):
    clock = iter(range(100)).__next__
    record = RefusedSenders(tmp_path, "telegram", clock=lambda: float(clock()))
    for i in range(25):
        record.note(str(i), f"@u{i}", "private")
    record.note("3", "@again", "group")
    rows = record.listing()
    assert len(rows) == 20 and rows[0].sender_id == "3" and rows[0].chat == "group"
    assert [r.sender_id for r in rows[1:4]] == ["24", "23", "22"]
    assert stat.S_IMODE(record.path.stat().st_mode) == 0o600


def test_the_panels_help_is_the_docs_word_for_word():
    docs = parse_docs((REPO / "docs" / "configuration.md").read_text(encoding="utf-8"))
    shipped = json.loads((REPO / "bot" / "config_help.json").read_text(encoding="utf-8"))
    assert shipped == docs, "run: python -m bot.config_help (after editing docs/configuration.md)"
