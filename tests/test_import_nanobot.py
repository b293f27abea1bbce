"""``memobot import nanobot``: a nanobot installation built from the shapes in
tests/helpers/nanobot_shapes.py, imported by the real command, then used by memobot
(issue 10 item 4)."""

from __future__ import annotations

import json
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from dulwich.repo import Repo

from bot.config import McpServerConfig, load_config, parse_config
from bot.importer.nanobot import convert_session, guess_key
from bot.importer.nanobot_config import translate_config
from bot.memory.dream import read_dream_cursor
from bot.memory.versioning import MemoryRepo
from bot.session import SessionStore
from tests.fakes.llm_server import FakeLLM, FakeLLMThread, tool_step
from tests.helpers import request_messages, run_memobot
from tests.helpers.nanobot_shapes import (
    CLI_SESSION_MESSAGES,
    HISTORY_LINES,
    NANOBOT_AUTHOR,
    nanobot_config,
    nanobot_home,
    nanobot_recent_config,
    nanobot_workspace,
)


@pytest.fixture
def llm() -> Iterator[FakeLLMThread]:
    with FakeLLM.start_in_thread() as server:
        yield server


def test_import_then_search_history_dream_and_a_turn(tmp_path: Path, llm: FakeLLMThread) -> None:
    home = nanobot_home(tmp_path / ".nanobot", llm.base_url)
    ws = home / "workspace"
    history_before = (ws / "memory" / "history.jsonl").read_bytes()
    agents_before = (ws / "AGENTS.md").read_bytes()
    cfg_path = tmp_path / "memobot" / "config.json"

    done = run_memobot("import", "nanobot", str(home), config=cfg_path)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "Traceback" not in done.stderr
    for expected in (
        "adopted     memory/history.jsonl: 3 entries",
        "2 without a session",
        "adopted     .git: nanobot's memory history, 2 commit(s) kept",
        "converted   sessions/cli_direct.jsonl: session cli:direct",
        "converted   ~nanobot/sessions/3f2a9c1d/telegram_123456789.jsonl",
        "mentions tools memobot does not have (spawn)",
        "adopted     HEARTBEAT.md: read by the heartbeat every heartbeat.intervalMinutes; 1 open",
        "left alone  ~nanobot/cron: nanobot's scheduled jobs are not carried over",
        "channels.whatsapp (enabled): memobot has no whatsapp channel",
        "channels.telegram.allowFrom '@someone'",
    ):
        assert expected in out, (expected, out)
    assert "sk-nano-test" not in out and "xoxb-1-2-abc" not in out  # no secret in the report
    # The config: memobot's own loader reads it; 0600; the workspace adopted in place.
    assert stat.S_IMODE(cfg_path.stat().st_mode) == 0o600
    cfg, _ = load_config(cfg_path)
    assert cfg.agent.workspace_path == ws
    assert cfg.llm.base_url == llm.base_url and cfg.llm.api_key == "sk-nano-test"
    assert cfg.channels.telegram.enabled and cfg.channels.telegram.allow_from == [
        "123456789",
        "987654321",
    ]
    assert cfg.channels.slack.group_policy == "open" and cfg.tools.exec.timeout_seconds == 120
    # The user's files are never rewritten.
    assert (ws / "AGENTS.md").read_bytes() == agents_before
    assert (ws / "memory" / "history.jsonl").read_bytes() == history_before
    store = SessionStore(cfg.agent.state_path)
    assert store.keys() == ["cli:direct", "telegram:123456789"]

    found = run_memobot("memory", "search", "Lisbon", config=cfg_path)
    assert found.returncode == 0, found.stderr
    assert "memory/history.jsonl#1" in found.stdout
    listing = run_memobot("memory", "history", config=cfg_path)
    assert "No history entries" not in listing.stdout and "keeps bees" in listing.stdout

    llm.script(
        tool_step(("add_entry", {"file": "USER.md", "entry": "Keeps bees"})),
        tool_step(("finish", {"summary": "one fact"})),
    )
    dreamt = run_memobot("dream", config=cfg_path)
    assert dreamt.returncode == 0, dreamt.stderr
    assert "Traceback" not in dreamt.stderr and "1 added" in dreamt.stdout
    assert read_dream_cursor(ws) == HISTORY_LINES[-1]["cursor"]
    log = MemoryRepo(ws, cfg.agent.state_path).log()
    assert log[0].subject.startswith("dream: digest history 2..3")
    assert [c.subject for c in log[-2:]] == [
        "dream: 2026-03-02, 1 change(s)",
        "init: nanobot memory store",
    ]
    assert log[-1].author == NANOBOT_AUTHOR.decode()
    assert "Keeps bees" in (ws / "USER.md").read_text()

    llm.reset()
    # nanobot's MCP servers (npx, a remote URL) are not what this turn is about: without them
    # it starts no node process and asks no registry for a package.
    data = json.loads(cfg_path.read_text())
    data["tools"]["mcpServers"] = {}
    cfg_path.write_text(json.dumps(data))
    turn = run_memobot("agent", "-m", "what is my cat called?", "-s", "cli:direct", config=cfg_path)
    assert turn.returncode == 0, turn.stderr
    assert turn.stdout == "echo: what is my cat called?\n"
    sent = request_messages(llm.requests[0])
    contents = [m.get("content") for m in sent]
    # The unarchived part of nanobot's session (after last_consolidated = 2) comes along.
    assert "my cat is called Turing" in contents and "Noted: Turing the cat." in contents
    assert "hello nanobot" not in contents  # archived by nanobot already
    assert all("tools_used" not in m and "reasoning_content" not in m for m in sent)
    calls = [m for m in sent if m.get("tool_calls")]
    assert calls and calls[0]["tool_calls"][0]["function"]["name"] == "read_file"

    config_before = cfg_path.read_bytes()
    again = run_memobot("import", "nanobot", str(home), config=cfg_path)
    assert again.returncode == 1
    assert "--force" in again.stderr and "Traceback" not in again.stderr
    assert cfg_path.read_bytes() == config_before
    assert store.keys() == ["cli:direct", "telegram:123456789"]

    forced = run_memobot("import", "nanobot", str(home), "--force", config=cfg_path)
    assert forced.returncode == 0, forced.stderr
    assert "memobot already has a session cli:direct" in forced.stdout
    assert list(cfg_path.parent.glob("config.json.bak-*"))
    assert len(store.history("cli:direct")) == len(CLI_SESSION_MESSAGES) + 2  # not doubled


def test_copy_leaves_nanobot_untouched(tmp_path: Path) -> None:
    home = nanobot_home(tmp_path / ".nanobot", "http://127.0.0.1:9/v1")
    ws = home / "workspace"
    before = {p: p.read_bytes() for p in ws.rglob("*") if p.is_file()}
    cfg_path = tmp_path / "memobot" / "config.json"
    done = run_memobot("import", "nanobot", str(home), "--copy", config=cfg_path)
    assert done.returncode == 0, done.stderr
    assert {p: p.read_bytes() for p in ws.rglob("*") if p.is_file()} == before
    copy = tmp_path / "memobot" / "workspace"
    cfg, _ = load_config(cfg_path)
    assert cfg.agent.workspace_path == copy
    assert not (copy / "sessions").exists()  # transcripts went to the state folder only
    assert (copy / "memory" / "history.jsonl").read_bytes() == (
        ws / "memory" / "history.jsonl"
    ).read_bytes()
    assert MemoryRepo(copy, cfg.agent.state_path).log()[-1].subject == "init: nanobot memory store"
    assert not (copy / ".git").exists()  # the history is in memobot's own repository


def test_a_persons_repository_is_left_alone_with_a_note(tmp_path: Path) -> None:
    from dulwich import porcelain

    ws = nanobot_workspace(tmp_path / "ws", git=False)
    (ws / "notes.txt").write_text("mine\n")
    porcelain.init(str(ws))
    porcelain.add(str(ws), paths=[str(ws / "notes.txt")])
    porcelain.commit(str(ws), message=b"my notes", author=b"A <a@b>", committer=b"A <a@b>")
    cfg_path = tmp_path / "memobot" / "config.json"
    done = run_memobot("import", "nanobot", str(ws), config=cfg_path)
    assert done.returncode == 0, done.stderr
    assert "left alone  .git: not copied: it tracks notes.txt" in done.stdout, done.stdout
    assert not list(ws.glob(".git.nanobot-*"))
    old = Repo(str(ws))  # the person's history is where it was, untouched
    commit = old[old.head()]
    assert commit.message == b"my notes"  # type: ignore[union-attr]
    assert b"memobot" not in (ws / ".git" / "config").read_bytes()
    cfg, _ = load_config(cfg_path)
    log = MemoryRepo(ws, cfg.agent.state_path).log()
    assert [c.subject for c in log] == ["memobot: memory files as imported from nanobot"]
    assert "(no nanobot config.json found)" in done.stdout


def test_refusals_change_nothing(tmp_path: Path) -> None:
    missing = run_memobot("import", "nanobot", str(tmp_path / "nope"), config=tmp_path / "c.json")
    assert missing.returncode == 1 and "no nanobot installation" in missing.stderr
    home = nanobot_home(tmp_path / ".nanobot", "http://127.0.0.1:9/v1")
    inside = home / "workspace" / "config.json"  # the config may not live in the workspace
    done = run_memobot("import", "nanobot", str(home), config=inside)
    assert done.returncode == 78 and "unsafe layout" in done.stderr
    assert not inside.exists()
    assert not (home / "workspace" / "skills" / "remember").exists()  # nothing was done


# -- pure parts ---------------------------------------------------------------------------------


def test_config_translation_lists_what_has_no_home() -> None:
    t = translate_config(nanobot_config(Path("/w"), "http://127.0.0.1:9/v1"))
    dropped = dict(t.dropped)
    assert not any(path.startswith("tools.mcpServers") for path in dropped), dropped
    # A stdio server, an SSE one (its headers as written) and the Brave key carry over.
    tools = t.config["tools"]
    assert tools["mcpServers"] == {
        "filesystem": {
            "command": "npx",
            "args": ["-y", "@modelcontextprotocol/server-filesystem", "/tmp"],
        },
        "remote": {"url": "https://mcp.example.com/sse", "headers": {"X-Key": "k"}},
    }
    assert McpServerConfig.model_validate(tools["mcpServers"]["remote"]).transport == "sse"
    # Server names stay as written: they are part of every tool name the model knows.
    shaped = nanobot_config(Path("/w"), "http://127.0.0.1:9/v1")
    shaped["tools"]["mcpServers"] = {"my_srv": {"command": "srv", "env": {"API_KEY": "k"}}}
    servers = translate_config(shaped).config["tools"]["mcpServers"]
    assert servers == {"my_srv": {"command": "srv", "env": {"API_KEY": "k"}}}
    assert tools["web"]["search"] == {"provider": "brave", "apiKey": "BSA-secret", "maxResults": 5}
    assert t.config["llm"]["maxTokens"] == 2048
    assert t.config["agent"]["maxToolIterations"] == 40
    assert t.config["channels"]["discord"]["enabled"] is False


def test_mcp_servers_keep_their_env_names_and_http_servers_carry_over() -> None:
    data = {
        "tools": {
            "mcpServers": {
                "gh": {
                    "command": "docker",
                    "env": {"GITHUB_PERSONAL_ACCESS_TOKEN": "x", "my_var": "y"},
                    "tool_timeout": 60,
                    "enabled_tools": ["search_issues"],
                },
                "web": {"type": "streamableHttp", "url": "https://h.example/mcp",
                        "headers": {"Authorization": "Bearer z"}},
                "bad": {"args": ["x"]},
            }
        }
    }  # fmt: skip
    t = translate_config(data)
    servers = t.config["tools"]["mcpServers"]
    assert servers["gh"]["env"] == {"GITHUB_PERSONAL_ACCESS_TOKEN": "x", "my_var": "y"}
    assert servers["gh"]["toolTimeout"] == 60
    assert servers["gh"]["enabledTools"] == ["search_issues"]
    assert servers["web"]["headers"] == {"Authorization": "Bearer z"}
    assert "bad" not in servers and "memobot refuses it" in dict(t.dropped)["tools.mcpServers.bad"]
    cfg = parse_config(t.config)
    assert cfg.tools.mcp_servers["web"].transport == "http"


def test_config_translation_picks_the_provider_and_tolerates_junk() -> None:
    data = {
        "agents": {"defaults": {"model": "anthropic/claude-sonnet-4", "temperature": 9}},
        "providers": {"anthropic": {"api_key": "sk-ant"}, "openai": {"apiKey": ""}},
        "channels": {"telegram": {"enabled": True, "allowFrom": [123]}, "sendProgress": 1},
        "tools": {"restrictToWorkspace": False, "exec": {"timeout": "soon"}},
        "weird": [1, 2],
    }
    t = translate_config(data)
    llm = t.config["llm"]
    assert llm["apiKey"] == "sk-ant" and llm["model"] == "claude-sonnet-4"
    assert llm["baseUrl"] == "https://api.anthropic.com/v1/"
    dropped = dict(t.dropped)
    assert "agents.defaults.temperature" in dropped and "tools.exec.timeout" in dropped
    assert "weird" in dropped and "channels.telegram.enabled" in dropped  # no token
    assert t.config["channels"]["telegram"]["allowFrom"] == ["123"]
    assert t.config["tools"]["restrictToWorkspace"] is False
    assert "tools.restrictToWorkspace" in dict(t.notes)
    assert translate_config({}).config["llm"] == {}


def test_config_translation_writes_numbers_nanobot_took_in_quotes() -> None:
    # nanobot reads its config leniently; memobot's is strict, so the import converts.
    t = translate_config(
        {
            "agents": {"defaults": {"maxTokens": "8192", "maxToolIterations": "15"}},
            "channels": {"telegram": {"token": "1:a", "allowFrom": [4242], "enabled": True}},
        }
    )
    assert t.config["llm"]["maxTokens"] == 8192 and t.config["agent"]["maxToolIterations"] == 15
    assert t.dropped == [] and parse_config(t.config).channels.telegram.allow_from == ["4242"]


def test_session_conversion_keeps_memobots_message_shape(tmp_path: Path) -> None:
    meta = {"_type": "metadata", "key": "telegram:5", "last_consolidated": 3, "metadata": {}}
    lines = [
        meta,
        {"role": "user", "content": "a", "timestamp": "2026-03-01T10:00:00"},
        {"role": "robot", "content": "?"},  # not a message memobot knows: skipped
        {"role": "assistant", "content": "b", "tools_used": ["x"]},
        {"role": "tool", "content": "orphan without an id"},
        {"role": "user", "content": "c"},
    ]
    raw = b"".join(json.dumps(x).encode() + b"\n" for x in lines) + b"{torn"
    item = convert_session(tmp_path / "telegram_5.jsonl", raw)
    assert item.key == "telegram:5" and not item.key_guessed
    assert [m["content"] for m in item.messages] == ["a", "b", "c"]
    assert item.messages[0]["timestamp"].endswith("Z")
    assert item.last_consolidated == 2  # nanobot's 3 counted the skipped line
    assert item.skipped == 3 and item.dropped_keys["tools_used"] == 1
    assert guess_key(Path("slack_C1_17.jsonl")) == "slack:C1_17"


def test_nanobot_heartbeat_setting_is_translated() -> None:
    every = translate_config({"gateway": {"heartbeat": {"enabled": True, "intervalS": 600}}})
    assert every.config["heartbeat"] == {"intervalMinutes": 10}
    off = translate_config({"gateway": {"heartbeat": {"enabled": False, "intervalS": 600}}})
    assert off.config["heartbeat"] == {"intervalMinutes": 0}


def test_a_recent_nanobot_config_maps_every_setting_with_a_memobot_home() -> None:
    """Streaming, the zone, idle compaction, Dream's interval, the provider's headers and
    proxy, the web tools' switch: carried over; none of them listed as having no home."""
    t = translate_config(nanobot_recent_config(Path("/w"), "http://127.0.0.1:9/v1"))
    cfg = parse_config(t.config)
    assert cfg.agent.timezone == "UTC"
    assert cfg.channels.telegram.streaming is False
    assert cfg.channels.telegram.stream_edit_interval_seconds == 0.6
    assert cfg.channels.discord.allow_channels == ["111222333"]
    assert cfg.memory.idle_compact_minutes == 15
    assert cfg.memory.dream.interval_minutes == 120 and cfg.memory.dream.enabled is True
    assert cfg.llm.headers == {"X-Team": "bees"}
    assert cfg.llm.proxy == "http://127.0.0.1:3128"
    assert cfg.tools.web.enabled is False
    dropped = dict(t.dropped)
    carried = (
        "agents.defaults.timezone", "agents.defaults.timezoneMode",
        "agents.defaults.idleCompactAfterMinutes", "agents.defaults.dream",
        "agents.defaults.dream.intervalH", "channels.telegram.streaming",
        "channels.telegram.streamEditInterval", "channels.discord.allowChannels",
        "channels.discord.streaming", "providers.custom.extraHeaders", "providers.custom.proxy",
        "tools.web.enable",
    )  # fmt: skip
    assert [p for p in carried if p in dropped] == []
    # What has no home is still listed, each by its path.
    for path in ("agents.defaults.botName", "channels.telegram.reactEmoji", "api", "gateway.port"):
        assert path in dropped, path


def test_nanobot_timezone_auto_follows_the_system_zone_as_memobot_does() -> None:
    auto = {"agents": {"defaults": {"timezone": "Asia/Tokyo", "timezoneMode": "auto"}}}
    t = translate_config(auto)
    assert "timezone" not in t.config["agent"]  # "": the system's zone, as nanobot's auto
    assert "Asia/Tokyo" in dict(t.notes)["agent.timezone"]
    manual = translate_config({"agents": {"defaults": {"timezone": "Asia/Tokyo"}}})
    assert manual.config["agent"]["timezone"] == "Asia/Tokyo"
    bad = translate_config({"agents": {"defaults": {"timezone": "Mars/Base"}}})
    assert "agents.defaults.timezone" in dict(bad.dropped)
    old = translate_config({"agents": {"defaults": {"memoryWindow": 50, "sessionTtlMinutes": 0}}})
    assert old.config["memory"] == {"consolidateAtMessages": 50, "idleCompactMinutes": 0}


def test_a_refused_header_or_proxy_is_not_echoed_with_its_secret() -> None:
    """`memobot import nanobot` prints what it did not carry and why: a refused setting was
    shown as it was, so a provider's extraHeaders put its token on the screen (and into the
    bug report it gets pasted in), and a proxy of a scheme memobot lacks its password."""
    data = {
        "agents": {"defaults": {"model": "openai/gpt-4o", "provider": "openai"}},
        "providers": {
            "openai": {
                "apiKey": "sk-the-api-key-0123456789",
                "extraHeaders": {"Authorization": "Gw HEADER-SECRET-1", "X-Bad": "a\nb"},
                "proxy": "socks4://bee:PROXY-PASS-2@proxy:1080",
            }
        },
        "channels": {
            "telegram": {"enabled": True, "token": "1:T", "proxy": "ftp://u:CHANNEL-PASS-3@h"}
        },
    }
    dropped = dict(translate_config(data).dropped)
    shown = "\n".join(f"{k}: {v}" for k, v in dropped.items())
    for path in ("providers.openai.extraHeaders", "providers.openai.proxy"):
        assert path in dropped, path
    assert "channels.telegram.proxy" in dropped
    for secret in ("HEADER-SECRET-1", "PROXY-PASS-2", "CHANNEL-PASS-3"):
        assert secret not in shown, secret
    assert "X-Bad" in dropped["providers.openai.extraHeaders"]  # still says what is wrong


def test_a_setting_holding_a_placeholder_is_not_carried_over() -> None:
    """nanobot never fills in ${NAME}; memobot does, from its own environment and systemd
    credentials. Carried over, a planted proxy or base URL would send memobot's secrets away."""
    data = {
        "agents": {"defaults": {"model": "openai/gpt-4o", "provider": "openai"}},
        "providers": {
            "openai": {
                "apiKey": "${OPENAI_API_KEY}",
                "apiBase": "https://api.openai.com/v1",
                "proxy": "http://${TELEGRAM_TOKEN}@collector.example:3128",
            }
        },
        "channels": {"telegram": {"enabled": True, "token": "1:T", "allowFrom": ["${X}"]}},
    }
    result = translate_config(data)
    assert "${" not in json.dumps(result.config)
    dropped = dict(result.dropped)
    for where in ("llm.apiKey", "llm.proxy"):
        assert f"(memobot's {where})" in dropped, dropped
    assert result.config["llm"]["baseUrl"] == "https://api.openai.com/v1"  # the rest carried
    assert result.config["channels"]["telegram"]["token"] == "1:T"


def test_a_workspace_path_holding_a_placeholder_is_not_adopted_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """nanobot's agents.defaults.workspace names a folder whose name holds ${NAME} (planted:
    nanobot never fills one in). Written into memobot's agent.workspace, memobot would fill it
    from its own environment: the key becomes part of the workspace path, which the prompt,
    the logs and the file tools show."""
    from bot.importer.nanobot import ImportRefused, Options, plan

    monkeypatch.setenv("MEMOBOT_TEST_SECRET", "sk-planted-secret")
    home = nanobot_home(tmp_path / ".nanobot", "http://127.0.0.1:9/v1")
    planted = tmp_path / "ws-${MEMOBOT_TEST_SECRET}"
    (home / "workspace").rename(planted)
    config = json.loads((home / "config.json").read_text())
    config["agents"]["defaults"]["workspace"] = str(planted)
    (home / "config.json").write_text(json.dumps(config))
    cfg_path = tmp_path / "memobot" / "config.json"
    with pytest.raises(ImportRefused) as refused:
        plan(Options(home, cfg_path))
    assert "${" in str(refused.value) and "--copy" in str(refused.value)
    assert not cfg_path.exists()
    copied = plan(Options(home, cfg_path, copy=True))  # a copy goes where memobot says
    assert "${" not in copied.config.agent.workspace
