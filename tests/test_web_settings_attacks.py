"""The Settings and Access screens attacked: a secret echoed by an error, a save over a file
the panel could not read, a hand edit lost to a stale form, a ``${VAR}`` written out
expanded, nesting deeper than the parser goes, a stranger's name and a flood of strangers."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

import pytest

from bot.config import Config, load_config
from bot.web.config_form import MASK
from channels.refused import MAX_KEPT, RefusedSenders
from tests.helpers import config_dict, telegram_in_process, write_config
from tests.helpers.telegram import settings as telegram_settings
from tests.helpers.web import GatewayInProcess, browsing, panel_section

NO_LLM = "http://127.0.0.1:9/v1"
PAT = "ghp_PLAINsecretOF40chars"  # a name no secret-name rule knows: only its map says so


@pytest.fixture(autouse=True)
def telegram_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TG_TOKEN", "123:SECRETfromENV")


def _write(tmp_path: Path, **extra: Any) -> tuple[Path, dict[str, Any]]:
    data = config_dict(tmp_path, NO_LLM, web=panel_section())
    data["channels"] = {"telegram": {"token": "${TG_TOKEN}", "allowFrom": ["1001"]}}
    data["tools"]["mcpServers"] = {"gh": {"command": "gh-mcp", "env": {"GH_PAT": PAT}}}
    data.update(extra)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path, data


async def test_a_refused_mcp_server_is_not_echoed_with_its_environment(tmp_path, monkeypatch):
    """The env value is shown masked; a save that drops the command sent it back unmasked
    to the validator, whose error quoted the server (env and all) to the page."""
    config, _ = _write(tmp_path)
    before = config.read_bytes()
    cfg, _ = load_config(config)
    async with browsing(cfg, config) as b:
        await b.login()
        _, page, _ = await b.get("/settings/tools")
        assert PAT not in page
        csrf = await b.csrf("/settings/tools")
        servers = json.dumps({"gh": {"env": {"GH_PAT": MASK}}})  # the command deleted
        form = {"csrf": csrf, "tools.mcpServers": servers}
        status, page, _ = await b.post("/settings/tools", form)
        assert status == 422 and "set either command" in page
        assert PAT not in page and "PLAINsecret" not in page
    assert config.read_bytes() == before


def _field_value(page: str, name: str) -> str:
    found = re.search(rf'<input[^>]*name="{re.escape(name)}"[^>]*>', page)
    assert found, name
    value = re.search(r'value="([^"]*)"', found.group(0))
    return value.group(1) if value else ""


async def test_a_form_over_a_file_the_panel_cannot_read_writes_nothing(tmp_path, monkeypatch):
    """A hand edit that broke the JSON: the form shows the defaults, and a save wrote those
    and the one change as the whole file (tokens, keys, channels: gone)."""
    config, _ = _write(tmp_path)
    cfg, _ = load_config(config)
    async with browsing(cfg, config) as b:
        await b.login()
        csrf = await b.csrf("/settings/memory")
        broken = config.read_text().rstrip()[:-1] + ",}"  # a trailing comma, by hand
        config.write_text(broken)
        status, page, _ = await b.get("/settings/memory")
        assert status == 200 and "Saving is off until the file is fixed by hand" in page
        version = _field_value(page, "version")
        form = {"csrf": csrf, "version": version, "memory.maxChars": "5000"}
        status, page, _ = await b.post("/settings/memory", form)
        assert status == 409 and "Nothing was saved" in page
        status, page, _ = await b.post("/settings/raw", {"csrf": csrf, "json": "{}"})
        assert status == 409 and "Nothing was saved" in page
        assert config.read_text() == broken


async def test_a_hand_edit_made_while_a_form_was_open_is_not_undone(tmp_path, monkeypatch):
    """Every field goes back with the form: one edited by hand meanwhile was set back to
    what the page showed."""
    config, data = _write(tmp_path)
    cfg, _ = load_config(config)
    async with browsing(cfg, config) as b:
        await b.login()
        _, page, _ = await b.get("/settings/llm")
        csrf, version = await b.csrf("/settings/llm"), _field_value(page, "version")
        model = _field_value(page, "llm.model")
        _, raw_page, _ = await b.get("/settings/raw")
        raw_version = _field_value(raw_page, "version")
        data["llm"]["model"] = "edited-by-hand"
        config.write_text(json.dumps(data, indent=2))
        form = {"csrf": csrf, "version": version, "llm.model": model, "llm.temperature": "0.3"}
        status, page, _ = await b.post("/settings/llm", form)
        assert status == 409 and "changed since this page was opened" in page
        assert _field_value(page, "llm.model") == "edited-by-hand"  # the file as it is now
        shown = json.dumps({**data, "llm": {**data["llm"], "model": "from-raw"}})
        form = {"csrf": csrf, "version": raw_version, "json": shown}
        status, page, _ = await b.post("/settings/raw", form)
        assert status == 409 and "changed since this page was opened" in page
        assert json.loads(config.read_text())["llm"]["model"] == "edited-by-hand"
        kept = re.search(r"<textarea[^>]*readonly[^>]*>(.*?)</textarea>", page, re.S)
        assert kept and "from-raw" in kept[1]  # what was typed, to copy from
        area = re.search(r'<textarea[^>]*name="json"[^>]*>(.*?)</textarea>', page, re.S)
        assert area and "edited-by-hand" in area[1]  # the form: the file as it is now
        # From the page as it is now, the save is made.
        form = {"csrf": csrf, "version": _field_value(page, "version"), "json": shown}
        status, _, _ = await b.post("/settings/raw", form)
        assert status == 303 and json.loads(config.read_text())["llm"]["model"] == "from-raw"


def test_a_save_made_from_an_older_read_of_the_file_writes_nothing(tmp_path):
    from bot.config import ConfigChanged, read_versioned, set_options

    config, data = _write(tmp_path)
    raw, version = read_versioned(config)
    config.write_text(json.dumps({**data, "memory": {"maxChars": 6000}}))
    edited = config.read_bytes()
    with pytest.raises(ConfigChanged):
        set_options(config, raw, {("memory", "maxChars"): 5000}, version)
    assert config.read_bytes() == edited


async def test_let_in_keeps_the_ids_written_as_references_and_refuses_everyone(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("OWNER_ID", "1001")
    config, data = _write(tmp_path)
    data["channels"]["telegram"]["allowFrom"] = ["${OWNER_ID}"]
    config.write_text(json.dumps(data, indent=2))
    cfg, _ = load_config(config)
    async with browsing(cfg, config) as b:
        await b.login()
        csrf = await b.csrf()
        form = {"csrf": csrf, "channel": "telegram", "id": "2002"}
        assert (await b.post("/access/let-in", form))[0] == 303
        saved = json.loads(config.read_text())["channels"]["telegram"]
        assert saved["allowFrom"] == ["${OWNER_ID}", "2002"]
        assert saved["admins"] == ["${OWNER_ID}"]  # pinned as written
        assert (await b.post("/access/let-in", {**form, "id": "*"}))[0] == 303
        _, page, _ = await b.get("/access")
        assert "Let in lets one person in" in page
    assert json.loads(config.read_text())["channels"]["telegram"] == saved


async def test_json_nested_past_the_parser_is_refused_not_a_server_error(tmp_path):
    config, _ = _write(tmp_path)
    before = config.read_bytes()
    cfg, _ = load_config(config)
    async with browsing(cfg, config) as b:
        await b.login()
        csrf = await b.csrf("/settings/raw")
        for deep in ("[" * 2000, '{"a":' * 300 + "1" + "}" * 300):
            form = {"csrf": csrf, "tools.mcpServers": deep}
            status, page, _ = await b.post("/settings/tools", form)
            assert status == 422 and "levels deep" in page
            status, page, _ = await b.post("/settings/raw", {"csrf": csrf, "json": deep})
            assert status == 422 and "levels deep" in page
    assert config.read_bytes() == before


async def test_a_crowd_of_strangers_costs_a_few_writes_not_a_thread_each(tmp_path, monkeypatch):
    """Each new id is a refusal noted: written one at a time, what was noted meanwhile in
    the next write, so the worker threads other work needs are never all taken."""
    import threading

    from channels import refused as refused_module
    from channels.access import AccessPolicy

    writes: list[int] = []
    first_started, release = threading.Event(), threading.Event()
    real = refused_module.replace_durably

    def slow_first(path: Path, text: str, sync: bool = True) -> None:
        writes.append(len(json.loads(text)))
        if len(writes) == 1:
            first_started.set()
            release.wait(10)
        real(path, text, sync=sync)

    monkeypatch.setattr(refused_module, "replace_durably", slow_first)
    record = RefusedSenders(tmp_path, "discord")
    policy = AccessPolicy("discord", ["1"], refused=record)
    policy.deny("100", "first", chat="group")
    assert first_started.wait(10)  # the first write is at work, and slow
    for i in range(500):
        policy.deny(str(1000 + i), f"raider{i}", chat="group")
    release.set()
    await record.settled()
    assert len(writes) == 2  # the first, then the 500 at once
    rows = record.listing()
    assert [r.sender_id for r in rows[:2]] == ["1499", "1498"] and len(rows) == MAX_KEPT


def test_denied_senders_are_remembered_in_bounded_memory():
    from channels.access import MAX_REMEMBERED, AccessPolicy

    policy = AccessPolicy("telegram", ["1"])
    for i in range(MAX_REMEMBERED + 50):
        assert policy.deny(str(10_000 + i), now=float(i))
    assert len(policy._denied_logged) == MAX_REMEMBERED
    later = float(MAX_REMEMBERED + 60)  # within the hour of the latest ones
    assert not policy.deny(str(10_000 + MAX_REMEMBERED + 49), now=later)  # remembered: quiet
    assert policy.deny("10000", now=later)  # the oldest was forgotten: logged again


async def test_a_strangers_name_cannot_disguise_itself_on_the_access_page(tmp_path):
    """The name is the stranger's to choose: shown escaped, without the characters that
    reorder or hide text, on one line, short."""
    config, _ = _write(tmp_path)
    cfg, _ = load_config(config)
    name = "\u202eevil\u200b <b>owner</b>\n${TG_TOKEN}\x00" + "x" * 500
    record = RefusedSenders(cfg.agent.state_path, "telegram")
    record.note("2002", name, "private")
    await record.settled()
    row = record.listing()[0]
    assert row.name.startswith("evil <b>owner</b> ${TG_TOKEN}x") and len(row.name) == 100
    async with browsing(cfg, config) as b:
        await b.login()
        _, page, _ = await b.get("/access")
    assert "evil &lt;b&gt;owner&lt;/b&gt; ${TG_TOKEN}x" in page
    assert "\u202e" not in page and "\u200b" not in page and "<b>owner" not in page
    assert "SECRETfromENV" not in page


async def test_a_save_that_takes_the_panel_away_says_so(tmp_path, llm, api):
    """The owner turning the panel off, or moving it, from the panel: what the next start
    does to the page they are on is said, not left to be found out."""
    config = write_config(
        tmp_path, llm.base_url, channels={"telegram": telegram_settings(api)}, web=panel_section()
    )
    cfg, _ = load_config(config)
    async with telegram_in_process(cfg, config) as (stack, channel, _manager):
        gateway = GatewayInProcess(cfg, config, stack, [channel])
        async with browsing(cfg, config, gateway=gateway) as b:
            await b.login()
            csrf = await b.csrf("/settings/web")
            assert (await b.post("/settings/web", {"csrf": csrf, "web.enabled": "false"}))[0] == 303
            _, page, _ = await b.get("/settings/web")
            assert "Takes a restart of the gateway: web.enabled." in page
            assert "this page will be gone" in page
            form = {"csrf": csrf, "web.enabled": "true", "web.listen": "127.0.0.1:8999"}
            assert (await b.post("/settings/web", form))[0] == 303
            _, page, _ = await b.get("/settings/web")
            assert f"the panel is at http://127.0.0.1:8999, no longer at {b.base}" in page


SECRETS = {
    "llm.headers": "S2headerVALUE",
    "llm.proxy password": "S5proxyPW",
    "llm.baseUrl password": "S6basePW",
    "llm.baseUrl query key": "S7queryKEY",
    "a fallback's key": "S3fallbackKEY",
    "an MCP url path": "sk-ak-S8pathTOKENaaaaaaaaaaaa",
    "an MCP header": "S9mcpHEADER",
    "an MCP env": "S10envVALUE",
    "an MCP url password": "S15mcpPW",
    "a search key": "S12searchKEY",
    "a Telegram token": "123:S11telegramTOKEN",
    "a Slack bot token": "xoxb-S13slackBOT",
    "a Discord token": "S16discordTOKEN",
}


async def test_no_page_of_settings_shows_a_secret_written_anywhere_in_the_file(tmp_path):
    """Every place a secret can sit (a key, a header, an env value, a URL's password, query
    or path): masked on every form, in the raw view, and on the pages of a refused save."""
    from bot.web.screens.settings import _sections

    s = SECRETS
    data = config_dict(tmp_path, NO_LLM, web=panel_section())
    data["llm"] |= {
        "headers": {"X-Custom": s["llm.headers"]},
        "proxy": f"http://u:{s['llm.proxy password']}@127.0.0.1:3128",
        "baseUrl": f"http://u:{s['llm.baseUrl password']}@127.0.0.1:9/v1?api_key="
        + s["llm.baseUrl query key"],
        "fallbacks": [{"baseUrl": "http://127.0.0.1:8/v1", "apiKey": s["a fallback's key"]}],
    }
    del data["llm"]["apiKey"]  # a baseUrl with a password takes none
    data["tools"] |= {
        "mcpServers": {
            "z": {
                "url": "https://mcp.example/mcp/" + s["an MCP url path"] + "/sse",
                "headers": {"X-Id": s["an MCP header"]},
            },
            "e": {"command": "x", "env": {"PAT": s["an MCP env"]}},
            "u": {"url": f"https://user:{s['an MCP url password']}@mcp.example/mcp"},
        },
        "web": {"search": {"apiKey": s["a search key"]}},
    }
    data["channels"] = {
        "telegram": {"token": s["a Telegram token"], "allowFrom": ["1"]},
        "slack": {"botToken": s["a Slack bot token"], "appToken": "xapp-1-A1-S14"},
        "discord": {"token": s["a Discord token"]},
    }
    config = tmp_path / "config.json"
    config.write_text(json.dumps(data, indent=2))
    cfg, _ = load_config(config)

    def leaked(page: str) -> list[str]:
        return [where for where, secret in s.items() if secret in html.unescape(page)]

    async with browsing(cfg, config) as b:
        await b.login()
        for path in ["/settings/raw", *("/settings/" + ".".join(x) for x in _sections())]:
            status, page, _ = await b.get(path)
            assert status == 200 and leaked(page) == [], path
        csrf = await b.csrf("/settings/raw")
        _, page, _ = await b.get("/settings/raw")
        shown = json.loads(
            html.unescape(re.search(r"<textarea[^>]*>(.*?)</textarea>", page, re.S)[1])
        )
        shown["llm"]["temperature"] = "hot"
        del shown["tools"]["mcpServers"]["e"]["command"]
        status, page, _ = await b.post("/settings/raw", {"csrf": csrf, "json": json.dumps(shown)})
        assert status == 422 and "set either command" in page and leaked(page) == []
        form = {"csrf": csrf, "llm.temperature": "hot", "llm.fallbacks": "[5]"}
        status, page, _ = await b.post("/settings/llm", form)
        assert status == 422 and leaked(page) == []
        # The masks sent back as shown keep every secret where it was.
        del shown["llm"]["temperature"]
        shown["tools"]["mcpServers"]["e"]["command"] = "x"
        status, _, _ = await b.post("/settings/raw", {"csrf": csrf, "json": json.dumps(shown)})
        assert status == 303
    assert json.loads(config.read_text()) == data


async def test_revoking_a_pairing_says_when_allowfrom_still_lets_them_in(tmp_path):
    from bot.pairing import PairingStore

    config, data = _write(tmp_path)
    data["channels"]["telegram"]["allowFrom"] = ["1001", "2002"]
    config.write_text(json.dumps(data))
    cfg, _ = load_config(config)
    store = PairingStore(cfg.agent.state_path, "telegram")
    code = store.request("2002", "@eve", "2002")
    assert code and store.approve(code)
    async with browsing(cfg, config) as b:
        await b.login()
        form = {"csrf": await b.csrf(), "channel": "telegram", "id": "2002"}
        assert (await b.post("/access/revoke", form))[0] == 303
        _, page, _ = await b.get("/access")
    assert "Revoked telegram user 2002" in page
    assert "They can still talk: channels.telegram.allowFrom lists &#x27;2002&#x27;" in page


async def test_half_a_character_in_json_is_refused_not_a_server_error(tmp_path):
    config, data = _write(tmp_path)
    before = config.read_bytes()
    cfg, _ = load_config(config)
    async with browsing(cfg, config) as b:
        await b.login()
        csrf = await b.csrf("/settings/raw")
        text = json.dumps({**data, "llm": {**data["llm"], "model": "\ud800"}})
        status, page, _ = await b.post("/settings/raw", {"csrf": csrf, "json": text})
        assert status == 422 and "half a character" in page
    assert config.read_bytes() == before


def test_a_strangers_name_is_one_line_in_the_log_and_the_pairing_list(tmp_path, caplog):
    """A name with a line break in it forged a log line of its own (the plain text log), and
    a right-to-left override reversed what the pairing list showed after it."""
    from bot.pairing import PairingStore
    from channels.access import AccessPolicy

    forged = "eve\n2026-12-06 18:00:00 INFO bot.web: config: web.listen changed by web\u202e"
    policy = AccessPolicy("telegram", ["1"])
    with caplog.at_level("WARNING", logger="channels.access"):
        assert policy.deny("2002", forged)
    (record,) = [r for r in caplog.records if "2002" in r.getMessage()]
    assert "\n" not in record.getMessage() and "\u202e" not in record.getMessage()
    store = PairingStore(tmp_path, "telegram")
    assert store.request("2003", forged, "2003")
    (waiting,) = store.listing().waiting
    assert "\n" not in waiting.who and "\u202e" not in waiting.who


async def test_a_fallbacks_key_goes_with_its_server_never_to_another(tmp_path):
    """Two fallbacks swapped in their JSON, each key shown masked: the masks were put back
    by position, so each server was sent the other one's key."""
    config, data = _write(tmp_path)
    data["llm"]["fallbacks"] = [
        {"baseUrl": "https://a.example/v1", "apiKey": "KEY-of-A-aaaa", "model": "a"},
        {"baseUrl": "https://b.example/v1", "apiKey": "KEY-of-B-bbbb", "model": "b"},
    ]
    config.write_text(json.dumps(data))
    cfg, _ = load_config(config)
    async with browsing(cfg, config) as b:
        await b.login()
        _, page, _ = await b.get("/settings/llm")
        area = re.search(r'<textarea[^>]*name="llm.fallbacks"[^>]*>(.*?)</textarea>', page, re.S)
        assert area and "KEY-of" not in page
        shown = json.loads(html.unescape(area[1]))
        assert shown[0]["apiKey"] == MASK
        csrf = await b.csrf("/settings/llm")
        swapped = json.dumps([shown[1], {**shown[0], "model": "a2"}])
        form = {"csrf": csrf, "llm.fallbacks": swapped}
        assert (await b.post("/settings/llm", form))[0] == 303
        saved = json.loads(config.read_text())["llm"]["fallbacks"]
        assert [(f["baseUrl"], f["apiKey"]) for f in saved] == [
            ("https://b.example/v1", "KEY-of-B-bbbb"),
            ("https://a.example/v1", "KEY-of-A-aaaa"),
        ]
        before = config.read_bytes()
        moved = [{**shown[1], "baseUrl": "https://evil.example/v1"}, shown[0]]
        form = {"csrf": csrf, "llm.fallbacks": json.dumps(moved)}
        status, page, _ = await b.post("/settings/llm", form)
        assert status == 422 and "write the value itself here" in page
        assert config.read_bytes() == before


def test_a_refusal_noted_while_the_gateway_stops_does_not_stop_the_record(tmp_path):
    """The loop's worker threads shut down (a stop): the refusal cannot be written then, and
    the record must not stay marked as being written, or it would never be written again."""
    import asyncio

    record = RefusedSenders(tmp_path, "telegram")
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(loop.shutdown_default_executor())

        async def refused_while_stopping() -> None:
            record.note("2002", "eve", "private")

        loop.run_until_complete(refused_while_stopping())
    finally:
        loop.close()
    record.note("2003", "mallory", "group")  # later, with no loop: written at once
    assert [r.sender_id for r in record.listing()] == ["2003", "2002"]


async def test_a_save_that_opens_a_channel_to_everyone_says_so(tmp_path):
    config, _ = _write(tmp_path)
    cfg, _ = load_config(config)
    async with browsing(cfg, config) as b:
        await b.login()
        csrf = await b.csrf("/settings/channels.telegram")
        form = {"csrf": csrf, "channels.telegram.allowFrom": "1001\n*"}
        assert (await b.post("/settings/channels.telegram", form))[0] == 303
        _, page, _ = await b.get("/settings/channels.telegram")
        assert "Saved channels.telegram.allowFrom." in page
        assert "allowFrom has &quot;*&quot;: anyone who finds the bot can talk to it" in page
        form = {"csrf": csrf, "channels.telegram.dmPolicy": "pairing"}
        assert (await b.post("/settings/channels.telegram", form))[0] == 303
        _, page, _ = await b.get("/settings/channels.telegram")
        assert "Saved channels.telegram.dmPolicy." in page
        assert "anyone who finds" not in page  # said once, when it was opened


async def test_every_change_the_panel_can_make_needs_its_origin_and_its_form_token(tmp_path):
    """Each POST route there is (Settings, the raw view, Let in, Revoke, and any added
    later), with a form that would change the config: refused from another origin, and
    without the session's form token; the file untouched."""
    config, _ = _write(tmp_path)
    before = config.read_bytes()
    cfg, _ = load_config(config)
    form = {
        "json": json.dumps({"tools": {"exec": {"sandbox": False}}}),
        "tools.exec.sandbox": "false",
        "llm.model": "evil",
        "channel": "telegram",
        "id": "666",
        "admin": "yes",
    }
    async with browsing(cfg, config) as b:
        await b.login()
        csrf = await b.csrf()
        posts = sorted(
            {
                r.resource.canonical.replace("{section}", "tools")
                for r in b.panel.app.router.routes()
                if r.method == "POST" and r.resource is not None
            }
            - {"/login"}
        )
        assert {"/settings/raw", "/settings/tools", "/access/let-in"} <= set(posts)
        for path in posts:
            for origin in ("http://evil.example", None):
                status, _, _ = await b.post(path, {**form, "csrf": csrf}, origin=origin)
                assert status == 403, (path, origin)
            status, _, _ = await b.post(path, form)
            assert status == 403, path
    assert config.read_bytes() == before


async def test_infinity_and_nan_are_not_numbers_a_save_writes(tmp_path):
    """Python's JSON parser takes them: an endless timeout was saved, as a file other JSON
    tools refuse to read."""
    config, data = _write(tmp_path)
    before = config.read_bytes()
    cfg, _ = load_config(config)
    async with browsing(cfg, config) as b:
        await b.login()
        csrf = await b.csrf("/settings/llm")
        for word in ("Infinity", "-Infinity", "NaN"):
            form = {"csrf": csrf, "llm.timeoutSeconds": word}
            status, page, _ = await b.post("/settings/llm", form)
            assert status == 422 and 'id="e-llm.timeoutSeconds"' in page, word
        raw = json.dumps(data).replace('"timeoutSeconds": 10', '"timeoutSeconds": Infinity')
        assert "Infinity" in raw
        status, page, _ = await b.post("/settings/raw", {"csrf": csrf, "json": raw})
        assert status == 422 and "Infinity is not a number JSON has" in page
    assert config.read_bytes() == before


async def test_a_form_sets_only_the_fields_of_its_own_section(tmp_path):
    """Fields a form does not have, sent with it anyway (the sandbox, the state folder, the
    panel's address and password hash), change nothing; the hash is not settable from its
    own form either (memobot web --set-password only)."""
    from bot.web.passwords import hash_password

    config, data = _write(tmp_path, web=panel_section(passwordHash=hash_password("pw")))
    config.write_text(json.dumps(data))
    cfg, _ = load_config(config)
    injected = {
        "tools.exec.sandbox": "off",
        "agent.stateDir": str(tmp_path / "elsewhere"),
        "web.passwordHash": "scrypt$16384$8$1$AAAA$BBBB",
        "clear:web.passwordHash": "on",
        "web.listen": "0.0.0.0:8080",
        "llm.apiKey": "sk-typed-here-0000000000",
    }
    async with browsing(cfg, config) as b:
        await b.login()
        csrf = await b.csrf("/settings/memory")
        form = {"csrf": csrf, "memory.maxChars": "6000", **injected}
        assert (await b.post("/settings/memory", form))[0] == 303
        for field in (
            {"web.passwordHash": hash_password("evil")},
            {"clear:web.passwordHash": "on"},
        ):
            form = {"csrf": csrf, "web.enabled": "true", **field}
            assert (await b.post("/settings/web", form))[0] == 303
            assert "Nothing changed." in (await b.get("/settings/web"))[1]
    saved = json.loads(config.read_text())
    expected = json.loads(json.dumps(data))
    expected["memory"] = {**expected.get("memory", {}), "maxChars": 6000}
    assert saved == expected
    assert saved["web"]["passwordHash"] == data["web"]["passwordHash"]


async def test_a_damaged_pairing_file_is_said_not_a_server_error(tmp_path):
    config, _ = _write(tmp_path)
    cfg, _ = load_config(config)
    folder = cfg.agent.state_path / "pairing"
    folder.mkdir(parents=True)
    (folder / "telegram.json").write_text("{not json")
    async with browsing(cfg, config) as b:
        await b.login()
        csrf = await b.csrf()
        for path, form in (
            ("/access/approve", {"code": "ABCD-EFGH"}),
            ("/access/refuse", {"code": "ABCD-EFGH"}),
            ("/access/revoke", {"channel": "telegram", "id": "2002"}),
        ):
            status, _, _ = await b.post(path, {"csrf": csrf, **form})
            assert status == 303, path
            _, page, _ = await b.get("/access")
            assert "Nothing changed:" in page and "damaged" in page, path


def _defaults_with_a_free_panel_port(tmp_path: Path) -> Config:
    """The defaults, but for the panel's address: 127.0.0.1:8765 may be another test's."""
    spare = tmp_path / "defaults.json"
    spare.write_text(json.dumps({"web": {"listen": panel_section()["listen"]}}))
    return load_config(spare)[0]


async def test_a_wrong_choice_in_the_file_is_shown_as_written_not_replaced(tmp_path):
    """ "enabled": "false" (in quotes) showed as true, and an unknown dmPolicy as the first
    choice: a save of the section's other fields then put that choice in its place."""
    config, data = _write(tmp_path)
    data["channels"]["telegram"] |= {"enabled": "false", "dmPolicy": "pair"}
    config.write_text(json.dumps(data))
    before = config.read_bytes()
    cfg = _defaults_with_a_free_panel_port(tmp_path)
    async with browsing(cfg, config) as b:
        await b.login()
        status, page, _ = await b.get("/settings/channels.telegram")
        assert status == 200 and "does not load now" in page
        selected = {}  # what a browser sends for each select: its selected option
        for m in re.finditer(r'<select[^>]*name="([^"]+)"[^>]*>(.*?)</select>', page, re.S):
            chosen = re.search(r'<option value="([^"]*)" selected', m[2])
            first = re.search(r'<option value="([^"]*)"', m[2])
            assert first
            selected[m[1]] = html.unescape((chosen or first)[1])
        assert selected["channels.telegram.enabled"] == '"false"'
        assert selected["channels.telegram.dmPolicy"] == "pair"
        form = {"csrf": await b.csrf("/settings/channels.telegram"), **selected}
        form["channels.telegram.allowFrom"] = "1001\n1002"
        status, page, _ = await b.post("/settings/channels.telegram", form)
        assert status == 422 and config.read_bytes() == before
        assert 'id="e-channels.telegram.enabled"' in page
        assert 'id="e-channels.telegram.dmPolicy"' in page
        form |= {"channels.telegram.enabled": "false", "channels.telegram.dmPolicy": "pairing"}
        assert (await b.post("/settings/channels.telegram", form))[0] == 303
    saved = json.loads(config.read_text())["channels"]["telegram"]
    assert saved["enabled"] is False and saved["dmPolicy"] == "pairing"
    assert saved["allowFrom"] == ["1001", "1002"]


async def test_ids_written_as_numbers_are_fixed_by_saving_the_form(tmp_path):
    """allowFrom [1001] (numbers) shows as the text 1001; sent back as shown it counted as no
    change, so the error at allowFrom could not be fixed from the form at all."""
    config, data = _write(tmp_path)
    data["channels"]["telegram"]["allowFrom"] = [1001]
    config.write_text(json.dumps(data))
    cfg = _defaults_with_a_free_panel_port(tmp_path)
    async with browsing(cfg, config) as b:
        await b.login()
        _, page, _ = await b.get("/settings/channels.telegram")
        area = re.search(r'name="channels.telegram.allowFrom"[^>]*>(.*?)</textarea>', page, re.S)
        assert area and area[1].strip() == "1001"
        form = {"csrf": await b.csrf(), "channels.telegram.allowFrom": "1001\r\n"}
        assert (await b.post("/settings/channels.telegram", form))[0] == 303
        _, page, _ = await b.get("/settings/channels.telegram")
        assert "Saved channels.telegram.allowFrom." in page
        # Sent back again as shown, with every other field: no change at all.
        form = {"csrf": await b.csrf(), "channels.telegram.allowFrom": "1001"}
        form["channels.telegram.streamEditIntervalSeconds"] = "1.0"
        assert (await b.post("/settings/channels.telegram", form))[0] == 303
        _, page, _ = await b.get("/settings/channels.telegram")
        assert "Nothing changed." in page
    assert json.loads(config.read_text())["channels"]["telegram"]["allowFrom"] == ["1001"]


def _browser_form(page: str) -> dict[str, str]:
    """What a browser sends for the settings form on ``page``, untouched."""
    form = re.search(r'<form[^>]*class="settings"[^>]*>(.*?)</form>', page, re.S)
    assert form
    body, sent = form[1], {}
    for tag_ in re.findall(r"<input[^>]*>", body):
        name = re.search(r'name="([^"]+)"', tag_)
        kind = re.search(r'type="([^"]+)"', tag_)
        if not name or (kind and kind[1] == "checkbox") or " disabled" in tag_:
            continue
        value = re.search(r'value="([^"]*)"', tag_)
        sent[html.unescape(name[1])] = html.unescape(value[1]) if value else ""
    for name, text in re.findall(r'<textarea[^>]*name="([^"]+)"[^>]*>(.*?)</textarea>', body, re.S):
        sent[html.unescape(name)] = html.unescape(text).removeprefix("\n").replace("\n", "\r\n")
    for name, options in re.findall(r'<select[^>]*name="([^"]+)"[^>]*>(.*?)</select>', body, re.S):
        chosen = re.search(r'<option value="([^"]*)" selected', options)
        first = re.search(r'<option value="([^"]*)"', options)
        assert first
        sent[html.unescape(name)] = html.unescape((chosen or first)[1])
    return sent


async def test_every_form_sent_back_untouched_changes_nothing(tmp_path):
    """Each section's form as a browser sends it with nothing edited (every field, its
    defaults, masked secrets, ${VAR} references): nothing written, no default added."""
    from bot.web.screens.settings import _sections

    config, data = _write(tmp_path)
    data["llm"]["fallbacks"] = [{"baseUrl": "https://a.example/v1", "apiKey": "KEY-a-aaaa"}]
    config.write_text(json.dumps(data, indent=2))
    before = config.read_bytes()
    cfg, _ = load_config(config)
    async with browsing(cfg, config) as b:
        await b.login()
        for section in _sections():
            path = "/settings/" + ".".join(section)
            _, page, _ = await b.get(path)
            status, _, _ = await b.post(path, _browser_form(page))
            assert status == 303, path
            _, page, _ = await b.get(path)
            assert "Nothing changed." in page, path
    assert config.read_bytes() == before


async def test_a_stranger_given_no_code_is_not_listed_as_given_one(tmp_path):
    """Three strangers take the channel's three codes; the fourth (the owner's friend) gets
    none, and was listed "given a pairing code" all the same, so the owner waited for one."""
    from bot.pairing import PairingStore
    from channels.access import AccessPolicy

    record = RefusedSenders(tmp_path, "telegram")
    policy = AccessPolicy("telegram", [], None, PairingStore(tmp_path, "telegram"), None, record)
    for i in range(3):
        assert await policy.pairing_reply(str(3000 + i), f"@raider{i}", str(3000 + i))
    assert await policy.pairing_reply("2002", "@friend", "2002") is None
    await record.settled()
    rows = {r.sender_id: r for r in record.listing()}
    assert rows["3000"].paired and not rows["2002"].paired
