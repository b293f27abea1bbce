"""What a nanobot installation looks like on disk, written down for the import tests.

The shapes follow nanobot's own field names (nanobot 0.3.x, HKUDS/nanobot):

``~/.nanobot/config.json`` (camelCase aliases of nanobot's pydantic schema)::

    {"agents": {"defaults": {"workspace", "model", "provider", "maxTokens", "temperature",
                             "maxToolIterations", "contextWindowTokens"}},
     "providers": {"<name>": {"apiKey", "apiBase", "extraHeaders"}},
     "channels": {"sendProgress", "telegram": {"enabled", "token", "allowFrom", "proxy"},
                  "discord": {"enabled", "token", "allowFrom", "gatewayUrl", "intents"},
                  "slack": {"enabled", "mode", "botToken", "appToken", "allowFrom",
                            "groupPolicy", "groupAllowFrom", "dm": {...}},
                  "whatsapp": {...}, ...},
     "gateway": {"host", "port", "heartbeat": {"enabled", "intervalS"}},
     "tools": {"web": {"proxy", "search": {"apiKey", "maxResults"}},
               "exec": {"timeout", "pathAppend"}, "restrictToWorkspace",
               "mcpServers": {"<name>": {"command", "args", "env"} | {"url", "headers"}}}}

``workspace/memory/history.jsonl``: one line per archived chunk,
``{"cursor": N, "timestamp": "YYYY-MM-DD HH:MM", "content": "..."}`` (local time, no zone),
sometimes with ``"session_key": "telegram:123"``; never memobot's ``"session"``.
``memory/.cursor`` and ``memory/.dream_cursor`` hold the last cursor written / digested.

``workspace/sessions/<key with ':' as '_'>.jsonl`` (or, in 0.3.5,
``~/.nanobot/sessions/<hash>/...``): a first metadata line
``{"_type": "metadata", "key", "created_at", "updated_at", "metadata": {}, "last_consolidated"}``
then message lines ``{"role", "content", "timestamp", "tools_used"?, "tool_calls"?, ...}``.

The workspace is a git repository written by nanobot's dulwich GitStore: it tracks
``.gitignore`` (``/*`` then ``!`` lines for the memory files), SOUL.md, USER.md,
memory/MEMORY.md and memory/.dream_cursor; commits are by ``nanobot <nanobot@dream>``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dulwich import porcelain

NANOBOT_AUTHOR = b"nanobot <nanobot@dream>"
NANOBOT_GITIGNORE = (
    "/*\n!memory/\n!SOUL.md\n!USER.md\n!.gitignore\nmemory/*\n!memory/MEMORY.md\n"
    "!memory/.dream_cursor\n"
)
NANOBOT_TRACKED = (".gitignore", "SOUL.md", "USER.md", "memory/MEMORY.md", "memory/.dream_cursor")

HISTORY_LINES: list[dict[str, Any]] = [
    {
        "cursor": 1,
        "timestamp": "2026-03-02 09:15",
        "session_key": "telegram:123456789",
        "content": "[2026-03-02 09:15] Ada said she is moving to Lisbon in April.",
    },
    {
        "cursor": 2,
        "timestamp": "2026-03-03 18:40",
        "content": "[2026-03-03 18:40] Ada asked for a packing checklist; she keeps bees.",
    },
    {
        "cursor": 3,
        "timestamp": "2026-03-04 08:05",
        "content": "[2026-03-04 08:05] Ada prefers answers in British English.",
    },
]

CLI_SESSION_MESSAGES: list[dict[str, Any]] = [
    {"role": "user", "content": "hello nanobot", "timestamp": "2026-03-04T08:00:00.000000"},
    {
        "role": "assistant",
        "content": "Hi Ada!",
        "timestamp": "2026-03-04T08:00:02.000000",
        "tools_used": [],
    },
    {"role": "user", "content": "my cat is called Turing", "timestamp": "2026-03-04T08:01:00"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "read_file", "arguments": '{"path": "USER.md"}'},
            }
        ],
        "timestamp": "2026-03-04T08:01:01",
    },
    {
        "role": "tool",
        "tool_call_id": "call_1",
        "name": "read_file",
        "content": "# User",
        "timestamp": "2026-03-04T08:01:02",
    },
    {
        "role": "assistant",
        "content": "Noted: Turing the cat.",
        "timestamp": "2026-03-04T08:01:03",
        "tools_used": ["read_file"],
        "reasoning_content": "thinking...",
    },
]

TELEGRAM_SESSION_MESSAGES: list[dict[str, Any]] = [
    {"role": "user", "content": "remind me about the bees", "timestamp": "2026-03-03T18:39:00"},
    {"role": "assistant", "content": "Of course.", "timestamp": "2026-03-03T18:39:05"},
]


def nanobot_config(workspace: Path, api_base: str) -> dict[str, Any]:
    return {
        "agents": {
            "defaults": {
                "workspace": str(workspace),
                "model": "fake-model",
                "provider": "custom",
                "maxTokens": 2048,
                "temperature": 0.2,
                "maxToolIterations": 40,
                "contextWindowTokens": 128000,
                "reasoningEffort": None,
            }
        },
        "providers": {
            "custom": {"apiKey": "sk-nano-test", "apiBase": api_base, "extraHeaders": None},
            "anthropic": {"apiKey": "", "apiBase": None},
            "openrouter": {"apiKey": "sk-or-unused", "apiBase": None},
        },
        "channels": {
            "sendProgress": True,
            "sendToolHints": False,
            "telegram": {
                "enabled": True,
                "token": "123456:ABC-DEF1234ghIkl-zyx57W2v1u123ew11",
                "allowFrom": ["123456789", "987654321|ada_l", "@someone"],
                "proxy": None,
                "replyToMessage": False,
            },
            "discord": {
                "enabled": False,
                "token": "",
                "allowFrom": [],
                "gatewayUrl": "wss://gateway.discord.gg/?v=10&encoding=json",
                "intents": 37377,
            },
            "slack": {
                "enabled": True,
                "mode": "socket",
                "botToken": "xoxb-1-2-abc",
                "appToken": "xapp-1-A1-abc",
                "replyInThread": True,
                "reactEmoji": "eyes",
                "allowFrom": ["U0123ABCD"],
                "groupPolicy": "open",
                "groupAllowFrom": [],
                "dm": {"enabled": True, "policy": "open", "allowFrom": []},
            },
            "whatsapp": {"enabled": True, "bridgeUrl": "ws://localhost:3001", "allowFrom": []},
            "email": {"enabled": False, "imapHost": ""},
        },
        "gateway": {"host": "0.0.0.0", "port": 18790, "heartbeat": {"enabled": True}},
        "tools": {
            "web": {"proxy": None, "search": {"apiKey": "BSA-secret", "maxResults": 5}},
            "exec": {"timeout": 120, "pathAppend": ""},
            "restrictToWorkspace": True,
            "mcpServers": {
                "filesystem": {
                    "command": "npx",
                    "args": ["-y", "@modelcontextprotocol/server-filesystem", "/tmp"],
                    "env": {},
                },
                "remote": {"url": "https://mcp.example.com/sse", "headers": {"X-Key": "k"}},
            },
        },
    }


def nanobot_recent_config(workspace: Path, api_base: str) -> dict[str, Any]:
    """A config as a recent nanobot (0.3.x, mid-2026) writes it: ``model_dump(by_alias=True)``
    of its schema, every default spelt out, with the settings a person changed."""
    return {
        "agents": {
            "defaults": {
                "workspace": str(workspace),
                "modelPreset": None,
                "model": "fake-model",
                "provider": "custom",
                "maxTokens": 8192,
                "contextWindowTokens": 65536,
                "contextBlockLimit": None,
                "temperature": 0.1,
                "fallbackModels": [],
                "maxToolIterations": 200,
                "maxConcurrentSubagents": 1,
                "failOnToolError": True,
                "maxToolResultChars": 16000,
                "providerRetryMode": "standard",
                "toolHintMaxLength": 40,
                "reasoningEffort": None,
                "timezone": "UTC",
                "timezoneMode": "manual",
                "botName": "nanobot",
                "botIcon": "🐈",
                "unifiedSession": False,
                "disabledSkills": [],
                "idleCompactAfterMinutes": 15,
                "idleCompactCheckIntervalSeconds": 60,
                "consolidationRatio": 0.5,
                "dream": {"enabled": True, "intervalH": 2, "modelOverride": None},
            }
        },
        "channels": {
            "sendProgress": True,
            "sendToolHints": True,
            "showReasoning": True,
            "extractDocumentText": True,
            "sendMaxRetries": 3,
            "transcriptionProvider": "groq",
            "transcriptionLanguage": None,
            "telegram": {
                "enabled": True,
                "token": "123456:ABC-DEF1234ghIkl-zyx57W2v1u123ew11",
                "mode": "polling",
                "allowFrom": ["123456789"],
                "proxy": None,
                "replyToMessage": False,
                "reactEmoji": "👀",
                "groupPolicy": "mention",
                "connectionPoolSize": 32,
                "poolTimeout": 5.0,
                "streaming": False,
                "inlineKeyboards": False,
                "richMessages": False,
                "streamEditInterval": 0.6,
                "webhookUrl": "",
            },
            "discord": {
                "enabled": False,
                "token": "",
                "allowFrom": [],
                "allowChannels": ["111222333"],
                "intents": 37377,
                "groupPolicy": "mention",
                "streaming": True,
            },
        },
        "transcription": {"enabled": True, "provider": None, "maxDurationSec": 120},
        "providers": {
            "custom": {
                "apiKey": "sk-nano-test",
                "apiBase": api_base,
                "apiType": "auto",
                "extraHeaders": {"X-Team": "bees"},
                "extraBody": None,
                "extraQuery": None,
                "proxy": "http://127.0.0.1:3128",
                "thinkingStyle": None,
            },
        },
        "api": {"host": "127.0.0.1", "port": 8900, "timeout": 120.0, "apiKey": ""},
        "gateway": {
            "host": "127.0.0.1",
            "port": 18790,
            "restartMode": "auto",
            "heartbeat": {"enabled": True, "intervalS": 1800, "keepRecentMessages": 8},
        },
        "tools": {
            "web": {
                "enable": False,
                "proxy": None,
                "userAgent": None,
                "search": {"provider": "duckduckgo", "apiKey": "", "maxResults": 5},
                "fetch": {"useJinaReader": True},
            },
            "exec": {"enable": True, "timeout": 60, "pathAppend": "", "sandbox": ""},
            "maxSessionMessagesPerMinute": 6,
            "restrictToWorkspace": True,
            "mcpServers": {},
            "ssrfWhitelist": [],
        },
        "modelPresets": {},
    }


def _jsonl(rows: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def _session(key: str, messages: list[dict[str, Any]], last_consolidated: int) -> str:
    meta = {
        "_type": "metadata",
        "key": key,
        "created_at": "2026-03-01T10:00:00.000000",
        "updated_at": "2026-03-04T08:01:03.000000",
        "metadata": {"title": "chat"},
        "last_consolidated": last_consolidated,
    }
    return _jsonl([meta, *messages])


def write_history(workspace: Path, dream_cursor: int = 1) -> None:
    memory = workspace / "memory"
    memory.mkdir(parents=True, exist_ok=True)
    (memory / "history.jsonl").write_text(_jsonl(HISTORY_LINES))
    (memory / ".cursor").write_text(str(HISTORY_LINES[-1]["cursor"]))
    (memory / ".dream_cursor").write_text(str(dream_cursor))


def write_memory_files(workspace: Path) -> None:
    (workspace / "memory").mkdir(parents=True, exist_ok=True)
    (workspace / "SOUL.md").write_text("# Soul\n\n- Be concise.\n")
    (workspace / "USER.md").write_text("# User\n\n- Name: Ada\n")
    (workspace / "memory" / "MEMORY.md").write_text("# Memory\n\n- Ada has a cat.\n")


def nanobot_git(workspace: Path, extra: tuple[str, ...] = ()) -> None:
    """The repository nanobot's GitStore makes: .gitignore and the memory files, two commits."""
    porcelain.init(str(workspace))
    (workspace / ".gitignore").write_text(NANOBOT_GITIGNORE + "".join(f"!{p}\n" for p in extra))
    paths = [str(workspace / p) for p in (*NANOBOT_TRACKED, *extra)]
    porcelain.add(str(workspace), paths=paths)
    porcelain.commit(
        str(workspace),
        message=b"init: nanobot memory store",
        author=NANOBOT_AUTHOR,
        committer=NANOBOT_AUTHOR,
    )
    with open(workspace / "USER.md", "a") as fh:
        fh.write("- Timezone: Europe/London\n")
    porcelain.add(str(workspace), paths=[str(workspace / "USER.md")])
    porcelain.commit(
        str(workspace),
        message=b"dream: 2026-03-02, 1 change(s)",
        author=NANOBOT_AUTHOR,
        committer=NANOBOT_AUTHOR,
    )


def nanobot_workspace(workspace: Path, git: bool = True) -> Path:
    """A nanobot workspace: prompt files, memory, history, a session, a git repository."""
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "AGENTS.md").write_text(
        "# Agent Instructions\n\nUse the `spawn` tool for long tasks and `cron` to schedule "
        "reminders.\n"
    )
    (workspace / "TOOLS.md").write_text("# Tools\n\n- web_search: search the web\n- exec\n")
    (workspace / "HEARTBEAT.md").write_text("# Heartbeat Tasks\n\n- [ ] check the weather\n")
    write_memory_files(workspace)
    write_history(workspace)
    skill = workspace / "skills" / "packing"
    skill.mkdir(parents=True)
    (skill / "SKILL.md").write_text(
        "---\nname: packing\ndescription: Make a packing checklist\n---\n\n1. Ask where.\n"
    )
    sessions = workspace / "sessions"
    sessions.mkdir()
    (sessions / "cli_direct.jsonl").write_text(_session("cli:direct", CLI_SESSION_MESSAGES, 2))
    if git:
        nanobot_git(workspace)
    return workspace


def nanobot_home(home: Path, api_base: str) -> Path:
    """``~/.nanobot``: config.json, the workspace, and 0.3.5's hashed sessions folder."""
    home.mkdir(parents=True, exist_ok=True)
    workspace = nanobot_workspace(home / "workspace")
    (home / "config.json").write_text(json.dumps(nanobot_config(workspace, api_base), indent=2))
    hashed = home / "sessions" / "3f2a9c1d"
    hashed.mkdir(parents=True)
    (hashed / "telegram_123456789.jsonl").write_text(
        _session("telegram:123456789", TELEGRAM_SESSION_MESSAGES, 0)
    )
    (home / "cron").mkdir()
    (home / "cron" / "jobs.json").write_text('{"version": 1, "jobs": []}\n')
    return home
