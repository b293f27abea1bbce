"""Config validation: JSON paths in errors, unknown keys refused, env expansion, file mode."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from bot.config import Config, ConfigError, load_config, parse_config, save_config

REPO = Path(__file__).resolve().parents[1]


def _error(data: object) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(data, "cfg.json")
    return str(info.value)


def test_defaults_are_valid() -> None:
    cfg = parse_config({})
    assert cfg.llm.retry.attempts >= 1
    assert cfg.tools.restrict_to_workspace is True
    assert cfg.channels.telegram.allow_from == []


def test_unknown_key_names_its_path() -> None:
    msg = _error({"llm": {"retry": {"atempts": 3}}})
    assert "llm.retry.atempts" in msg and "unknown option" in msg


def test_wrong_type_names_path_and_expectation() -> None:
    msg = _error({"agent": {"maxToolIterations": "many"}})
    assert "agent.maxToolIterations" in msg and "a whole number" in msg


@pytest.mark.parametrize(
    ("data", "path", "hint"),
    [
        ({"llm": {"temperature": "0.5"}}, "llm.temperature", "a number, without quotes: write 0.5"),
        (
            {"agent": {"maxToolIterations": "20"}},
            "agent.maxToolIterations",
            "a whole number, without quotes: write 20",
        ),
        (
            {"channels": {"telegram": {"allowFrom": ["1", 4242]}}},
            "channels.telegram.allowFrom[1]",
            'a string, in quotes: write "4242"',
        ),
        (
            {"channels": {"slack": {"admins": [7]}}},
            "channels.slack.admins[0]",
            'a string, in quotes: write "7"',
        ),
        ({"tools": {"exec": {"enabled": "false"}}}, "tools.exec.enabled", "true or false"),
        ({"memory": {"dream": {"enabled": 1}}}, "memory.dream.enabled", "true or false"),
    ],
)
def test_strict_types_say_how_to_write_the_value(
    data: dict[str, object], path: str, hint: str
) -> None:
    # Each was quietly converted before: a quoted number, an id without quotes.
    msg = _error(data)
    assert f"{path}: expected {hint}" in msg and "got" in msg


def test_a_placeholder_gives_a_number_or_boolean_its_type(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # An environment variable is text: "${N}" for a number still works; written text not.
    for name, value in {"MB_N": "15", "MB_T": "0.2", "MB_ON": "false", "MB_ID": "4242"}.items():
        monkeypatch.setenv(name, value)
    cfg = parse_config(
        {
            "agent": {"maxToolIterations": "${MB_N}"},
            "llm": {"temperature": "${MB_T}"},
            "tools": {"exec": {"enabled": "${MB_ON}"}},
            "channels": {"telegram": {"allowFrom": ["${MB_ID}"]}},
        }
    )
    assert cfg.agent.max_tool_iterations == 15 and cfg.llm.temperature == 0.2
    assert cfg.tools.exec.enabled is False and cfg.channels.telegram.allow_from == ["4242"]
    assert "agent.maxToolIterations" in _error({"agent": {"maxToolIterations": "x${MB_N}"}})
    assert "tools.exec.enabled" in _error({"tools": {"exec": {"enabled": "${MB_N}"}}})


def test_out_of_range_and_list_index_paths() -> None:
    assert "llm.temperature" in _error({"llm": {"temperature": 5}})
    msg = _error({"channels": {"telegram": {"allowFrom": ["1", {"id": 2}]}}})
    assert "channels.telegram.allowFrom[1]" in msg


def test_env_expansion_and_missing_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MB_TEST_KEY", "sk-from-env")
    cfg = parse_config({"llm": {"apiKey": "${MB_TEST_KEY}"}})
    assert cfg.llm.api_key == "sk-from-env"
    monkeypatch.delenv("MB_TEST_KEY")
    msg = _error({"llm": {"apiKey": "${MB_TEST_KEY}"}})
    assert "llm.apiKey" in msg and "MB_TEST_KEY" in msg


def test_systemd_credentials_fill_placeholders(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "TELEGRAM_TOKEN").write_text("123:abc\n")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    cfg = parse_config({"channels": {"telegram": {"token": "${TELEGRAM_TOKEN}"}}})
    assert cfg.channels.telegram.token == "123:abc"
    msg = _error({"llm": {"apiKey": "${NOPE}"}})
    assert "llm.apiKey" in msg and "NOPE" in msg and "credential" in msg


def test_openai_env_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    cfg = parse_config({})
    assert cfg.llm.resolved_api_key() == "sk-env"
    assert cfg.llm.resolved_base_url() == "http://127.0.0.1:9/v1"
    cfg = parse_config({"llm": {"apiKey": "sk-file"}})
    assert cfg.llm.resolved_api_key() == "sk-file"


def test_malformed_json_names_line(tmp_path: Path) -> None:
    p = tmp_path / "config.json"
    p.write_text('{\n  "llm": {"model": "x",}\n}\n')
    with pytest.raises(ConfigError) as info:
        load_config(p)
    assert str(p) in str(info.value) and "line 2" in str(info.value)


def test_save_is_mode_0600_and_round_trips(tmp_path: Path) -> None:
    p = tmp_path / "sub" / "config.json"
    cfg = Config()
    cfg.llm.model = "m1"
    save_config(cfg, p)
    assert stat.S_IMODE(p.stat().st_mode) == 0o600
    loaded, _ = load_config(p)
    assert loaded.llm.model == "m1"
    assert "baseUrl" in p.read_text()  # camelCase on disk


def test_example_config_lists_every_option() -> None:
    example = json.loads((REPO / "config.example.json").read_text())
    parse_config(example, "config.example.json")  # valid as shipped

    def keys(obj: object, prefix: str = "") -> set[str]:
        if not isinstance(obj, dict):
            return set()
        out = set()
        for k, v in obj.items():
            out.add(prefix + k)
            out |= keys(v, prefix + k + ".")
        return out

    defaults = json.loads(Config().model_dump_json(by_alias=True))
    assert keys(defaults) <= keys(example), sorted(keys(defaults) - keys(example))


def test_docs_document_every_option() -> None:
    readme = (REPO / "docs" / "configuration.md").read_text()
    defaults = json.loads(Config().model_dump_json(by_alias=True))
    common = set(
        json.loads(Config().channels.telegram.__class__.__base__().model_dump_json(by_alias=True))
    )

    def leaves(obj: dict, prefix: str = "") -> list[str]:
        out = []
        for k, v in obj.items():
            if isinstance(v, dict):
                out += leaves(v, prefix + k + ".")
            else:
                out.append(prefix + k)
        return out

    missing = []
    for key in leaves(defaults):
        parts = key.split(".")
        if parts[0] == "channels" and parts[2] in common:
            key = f"channels.<name>.{parts[2]}"
        if f"`{key}`" not in readme:
            missing.append(key)
    assert not missing, f"docs/configuration.md lacks: {missing}"


@pytest.mark.parametrize("key", ["sk-live-abc\n", "sk-live-ab c", "sk-live-abcé"])
def test_an_api_key_no_header_can_carry_is_refused_without_echoing_it(key: str) -> None:
    """A key with a line break, a space or a non-ASCII letter failed every model call with an
    error naming no setting; it is a config error now, and the key is not shown."""
    for llm in ({"apiKey": key}, {"apiKey": "sk-ok", "fallbacks": [{"apiKey": key}]}):
        with pytest.raises(ConfigError) as info:
            parse_config({"llm": llm})
        text = str(info.value)
        assert "apiKey: " in text and "copy it again" in text
        assert "sk-live" not in text and "abc" not in text
    assert parse_config({"llm": {"apiKey": "sk-proj_A1-b2.c3=="}}).llm.api_key


def test_a_missing_slack_token_shows_the_slack_section_redacted() -> None:
    """The error pointed at `channels` and printed the first section there (Telegram's) as
    what it got (issue 29)."""
    data = {
        "channels": {
            "telegram": {"enabled": True, "token": "123:TELEGRAM-SECRET", "allowFrom": ["1"]},
            "slack": {"enabled": True, "botToken": "xoxb-SLACK-SECRET"},
        }
    }
    with pytest.raises(ConfigError) as caught:
        parse_config(data)
    lines = str(caught.value).splitlines()[1:]
    assert len(lines) == 1, lines
    assert lines[0].startswith("  channels.slack: ") and "appToken is required" in lines[0]
    assert '"enabled": false' in lines[0]
    assert "telegram" not in lines[0].lower() and "SECRET" not in lines[0]
    assert '"botToken": "***"' in lines[0]


def test_a_section_shown_in_an_error_is_redacted_before_it_is_cut() -> None:
    """The section is shown cut to 80 characters: cut first, a token across the cut was no
    longer the whole secret the filter knows, and its first part was printed (a Slack-
    compatible server's bot token, which has no xoxb- shape to be recognised by)."""
    token = "zz-" + "secretpart" * 6
    data = {"channels": {"slack": {"enabled": True, "allowFrom": ["U1"], "botToken": token}}}
    with pytest.raises(ConfigError) as caught:
        parse_config(data)
    text = str(caught.value)
    assert "appToken is required" in text
    assert "secretpart" not in text and "zz-" not in text


def test_a_refused_mcp_server_is_shown_without_its_environment() -> None:
    """A server refused as a whole is quoted as what the field got: its env values are
    secrets whatever their names (GH_PAT), as its headers are."""
    server = {"env": {"GH_PAT": "ghp_PLAINsecretOF40chars"}, "headers": {"X-Id": "hdr-SECRET1"}}
    with pytest.raises(ConfigError) as caught:
        parse_config({"tools": {"mcpServers": {"gh": server}}})
    text = str(caught.value) + repr(caught.value.fields)
    assert "set either command" in text and '"GH_PAT": "***"' in text
    assert "PLAINsecret" not in text and "hdr-SECRET1" not in text
