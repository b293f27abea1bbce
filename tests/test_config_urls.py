"""URL settings are checked when the config loads: a scheme, a host, the Telegram Bot API URL's
known shapes put right or refused with the form expected, one trailing-slash rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bot.config import ConfigError, parse_config
from bot.service.probes import check_token, token_probes
from tests.fakes.telegram_api import FakeBotAPI
from tests.helpers import run_memobot


def _error(data: dict[str, object]) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(data, "cfg.json")
    return str(info.value)


def _telegram(**settings: object) -> dict[str, object]:
    return {"channels": {"telegram": {"enabled": True, "token": "123:abc", **settings}}}


async def test_a_telegram_base_url_with_a_slash_or_without_bot_reaches_the_api(
    api: FakeBotAPI,
) -> None:
    # Before: ".../bot/" sent /bot/<token>/getMe (a 404, read as a refused token) and a bare
    # host glued the token to the port; both are the one Bot API URL now.
    from channels.telegram_channel.channel import build_bot

    for given in (api.base_url + "/", api.url, api.url + "/", api.base_url + "{token}"):
        cfg = parse_config(_telegram(token=api.token, baseUrl=given))
        telegram = cfg.channels.telegram
        assert telegram.base_url == api.base_url, given
        check = await check_token(token_probes(cfg)[0])
        assert check.status == "ok", (given, check)
        bot, _ = build_bot(telegram)
        assert bot.base_url == f"{api.base_url}{api.token}"
        assert bot.base_file_url == f"{api.base_file_url}{api.token}"


def test_a_telegram_base_url_without_a_scheme_is_refused_with_the_form() -> None:
    msg = _error(_telegram(baseUrl="api.telegram.org/bot"))
    assert "channels.telegram.baseUrl: 'api.telegram.org/bot' has no scheme" in msg
    assert "'https://api.telegram.org/bot'" in msg


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ("http://localhost:8081/api", "does not end in /bot"),
        ("https://api.telegram.org/bot123:SECRET/", "the bot token must not be in the URL"),
        ("https://api.telegram.org/bot?x=1", "must not have a ?query"),
        ("ftp://api.telegram.org/bot", "must start with http:// or https://"),
        ("https:///bot", "has no host name"),
        ("https://api.telegram.org:port/bot", "is not a valid URL"),
    ],
)
def test_other_telegram_base_urls_are_refused(given: str, said: str) -> None:
    msg = _error(_telegram(baseUrl=given))
    assert "channels.telegram.baseUrl" in msg and said in msg
    assert "SECRET" not in msg
    if "/bot" in said:
        assert "http://localhost:8081/bot" in msg  # the expected form, for a local server


def test_the_telegram_file_url_has_its_own_form() -> None:
    cfg = parse_config(_telegram(baseFileUrl="http://localhost:8081/"))
    assert cfg.channels.telegram.base_file_url == "http://localhost:8081/file/bot"
    assert "does not end in /file/bot" in _error(_telegram(baseFileUrl="http://h/bot"))


def test_url_fields_need_a_scheme_and_a_trailing_slash_means_nothing() -> None:
    cfg = parse_config(
        {
            "llm": {
                "baseUrl": "http://localhost:11434/v1/",
                "fallbacks": [{"baseUrl": "https://api.example.com/v1/"}],
            },
            "tools": {"web": {"search": {"provider": "searxng", "baseUrl": "http://sx:8888/"}}},
            "channels": {"slack": {"apiUrl": "http://localhost:9/api"}},
        }
    )
    assert cfg.llm.base_url == "http://localhost:11434/v1"
    assert cfg.llm.fallbacks[0].base_url == "https://api.example.com/v1"
    assert cfg.tools.web.search.base_url == "http://sx:8888"
    # Slack's SDK resolves method names against it: without the slash "api" is dropped.
    assert cfg.channels.slack.api_url == "http://localhost:9/api/"
    for data, path in (
        ({"llm": {"baseUrl": "localhost:11434/v1"}}, "llm.baseUrl"),
        ({"llm": {"fallbacks": [{"baseUrl": "api.example.com"}]}}, "llm.fallbacks[0].baseUrl"),
        ({"channels": {"slack": {"apiUrl": "slack.com/api"}}}, "channels.slack.apiUrl"),
        ({"llm": {"proxy": "proxy.lan:3128"}}, "llm.proxy"),
        ({"channels": {"discord": {"proxy": "socks5://"}}}, "channels.discord.proxy"),
        ({"tools": {"mcpServers": {"m": {"url": "http://"}}}}, "tools.mcpServers.m"),
    ):
        msg = _error(data)
        assert path in msg and ("scheme" in msg or "host" in msg), msg
    assert "socks5h://" in _error({"llm": {"proxy": "proxy.lan:3128"}})  # proxies only
    assert "socks5" not in _error({"llm": {"baseUrl": "ftp://x"}})


def test_a_malformed_url_stops_a_command_with_exit_78_and_the_field(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(_telegram(baseUrl="api.telegram.org/bot")))
    result = run_memobot("status", config=config)
    assert result.returncode == 78, result.stderr
    assert "channels.telegram.baseUrl" in result.stderr and "Traceback" not in result.stderr


def test_onboard_writes_no_url_that_would_not_load(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from bot import cli

    config = tmp_path / "config.json"
    args = ["--config", str(config), "onboard", "--model", "m", "--base-url"]
    assert cli.main([*args, "localhost:11434/v1"]) == 78
    err = capsys.readouterr().err
    assert "llm.baseUrl" in err and "'http://localhost:11434/v1'" in err
    assert not config.exists()
    assert cli.main([*args, "http://localhost:11434/v1/"]) == 0
    assert json.loads(config.read_text())["llm"]["baseUrl"] == "http://localhost:11434/v1"
