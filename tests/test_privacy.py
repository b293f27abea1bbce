"""Who sees what: one privacy scope per turn for the prompt, memory_search and the file tools.

The rules first (pure), then end to end: the real python-telegram-bot against the fake Bot
API, the real agent loop and tools, the fake LLM scripted to go after the owner's files. What
must never leak is checked in every request the model was sent, not only in the tool results.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from bot.bus import InboundMessage
from bot.config import ConfigError, MemoryConfig, parse_config
from bot.config_base import ChannelConfig
from bot.gate import Gate
from bot.kinds import with_kind
from bot.pairing import PairingStore
from bot.privacy import (
    PrivacyScope,
    group_scope,
    owner_scope,
    scope_for_person,
    scope_for_unattended,
)
from bot.tools import filesystem
from bot.tools.base import ToolContext
from bot.tools.filesystem import ListDirTool, ReadFileTool
from bot.workspace import chat_media_dir, init_workspace
from tests.fakes.llm_server import FakeLLM, call, reply, tool_step
from tests.fakes.telegram_api import FakeBotAPI
from tests.helpers import make_config, telegram_in_process

ALICE = 1001  # allowed, admin: the owner
BOB = 3003  # allowed, not an admin
PAIRED = 7007  # let in through pairing
GROUP = -1001234
WAIT = 30.0
WORKSPACE_TOOLS = {"read_file", "list_dir", "write_file", "edit_file", "exec"}
# What a group and a non-admin's private chat are offered by default (from the tools' declared
# effects): the tools that touch no workspace file; for the private chat, also the file tools.
GROUP_DEFAULT_TOOLS = frozenset(
    {"web_fetch", "web_search", "message", "memory_search", "cron", "spawn"}
)
DM_DEFAULT_TOOLS = GROUP_DEFAULT_TOOLS | {"read_file", "list_dir", "write_file", "edit_file"}
# What the owner's files hold; none of it may reach a request made for someone else.
SECRETS = {
    "USER.md": "- Name: Ada\n- Secret: USER-SECRET-karaoke\n",
    "memory/MEMORY.md": "- MEMORY-SECRET: the vault code is 1234\n",
    "HEARTBEAT.md": "- [ ] HEARTBEAT-SECRET: call the lawyer\n",
}
HISTORY_SECRET = "HISTORY-SECRET the owner planned a picnic with Ada"
MEDIA_SECRET = b"MEDIA-SECRET tax return 2025"


# -- the rules (pure) ----------------------------------------------------------------------


def _msg(chat: str, metadata: dict[str, Any], channel: str = "telegram") -> InboundMessage:
    return with_kind(InboundMessage(channel, chat, "7", "hi", message_id="m1", metadata=metadata))


def _hidden(scope: PrivacyScope, path: str, write: bool = False) -> bool:
    return scope.hidden(PurePosixPath(path), write=write) is not None


def test_the_scope_follows_the_sender_and_the_chat() -> None:
    memory = MemoryConfig()
    admin_dm = scope_for_person(_msg("1001", {"is_admin": True, "is_group": False}), memory)
    guest_dm = scope_for_person(_msg("3003", {"is_admin": False, "is_group": False}), memory)
    admin_group = scope_for_person(_msg("-1", {"is_admin": True, "is_group": True}), memory)
    assert (admin_dm.audience, admin_dm.owner_memory) == ("owner", True)
    assert (guest_dm.audience, guest_dm.owner_memory) == ("guest", False)
    # Everyone in a group reads the answer: an admin's group turn is the group's.
    assert (admin_group.audience, admin_group.owner_memory, admin_group.admin) == (
        "group",
        False,
        True,
    )
    # A channel message always says whether its sender is an admin; one that does not is not.
    assert scope_for_person(_msg("1001", {}), memory).audience == "guest"
    assert scope_for_person(_msg("t", {}, channel="cli"), memory).audience == "owner"
    shared = MemoryConfig(share_with_non_admins=True, share_in_groups=True)
    assert scope_for_person(_msg("3003", {"is_admin": False}), shared).owner_memory
    assert scope_for_person(_msg("-1", {"is_group": True}), shared).owner_memory
    # Scheduled turns, for now: a group's scope in a group, the owner's elsewhere.
    job = {"cron": {"job_id": "j"}, "is_admin": False}
    assert scope_for_unattended(_msg("3003", {**job, "is_group": False}), memory).is_owner
    assert scope_for_unattended(_msg("-1", {**job, "is_group": True}), memory).audience == "group"


def test_the_owners_files_are_hidden_outside_the_owners_scope() -> None:
    owner = owner_scope("telegram:1001")
    group = group_scope(_msg("-100123:45", {"is_group": True}), admin=False, share=False)
    for path in (
        "USER.md",
        "user.md",  # a case-insensitive disk
        ".USER.md.dream-tmp",
        "memory",
        "memory/MEMORY.md",
        "memory/history.jsonl",
        "memory/history-2026-01.jsonl",
        "memory/.cursor",
        "memory/.dream_cursor",
        ".git/logs/HEAD",
        "HEARTBEAT.md",
        "media/telegram/1001/doc.pdf",
        "media/telegram/-100123",  # the same group's other topic
        "media/discord",
        "media/notes.txt",
        "notes/2026-03-01.md",  # the owner's journal (the daily-notes skill)
    ):
        assert _hidden(group, path), path
        assert not _hidden(owner, path), path
    for path in ("SOUL.md", "AGENTS.md", "skills/x/SKILL.md", "notes.md", "."):
        assert not _hidden(group, path), path
    # This chat's own downloads, and the folders on the way to them (to list, not to write).
    assert chat_media_dir("telegram", "-100123:45") == PurePosixPath("media/telegram/-100123_45")
    assert not _hidden(group, "media/telegram/-100123_45/doc.pdf")
    assert not _hidden(group, "media/telegram/-100123_45/new.txt", write=True)
    assert not _hidden(group, "media/telegram") and _hidden(group, "media/telegram", write=True)
    # Prompt files every chat reads: readable, never rewritten from here.
    assert _hidden(group, "SOUL.md", write=True) and _hidden(group, "AGENTS.md", write=True)
    # Shared memory is shown, never written; the heartbeat list and other chats' files stay out.
    shared = group_scope(_msg("-100123:45", {"is_group": True}), admin=False, share=True)
    assert not _hidden(shared, "USER.md") and not _hidden(shared, "memory/MEMORY.md")
    # The archive holds other people's chats too: memory_search shares the owner's part.
    assert _hidden(shared, "memory/history.jsonl")
    assert _hidden(shared, "USER.md", write=True)
    assert _hidden(shared, "HEARTBEAT.md") and _hidden(shared, "media/telegram/1001/doc.pdf")


def test_a_chat_media_folder_cannot_climb_out() -> None:
    for chat in ("..", ".", "", "../../USER.md", "a/b"):
        folder = chat_media_dir("slack", chat)
        assert len(folder.parts) == 3 and folder.parts[2] not in ("..", "."), chat


def test_config_admins_and_sharing() -> None:
    # allowFrom "*" lets anyone talk, not anyone administer.
    assert ChannelConfig(allow_from=["*"]).admin_ids == []
    assert ChannelConfig(allow_from=["*", "5"]).admin_ids == ["5"]
    assert ChannelConfig(allow_from=["*"], admins=["*"]).admin_ids == ["*"]
    assert ChannelConfig().group_admin_tools is False
    with pytest.raises(ConfigError, match="shareWithNonAdmins"):
        parse_config({"memory": {"shareWithNonAdmins": "yes"}})
    with pytest.raises(ConfigError, match="not a tool name"):
        parse_config({"channels": {"telegram": {"dmTools": ["read_file; exec"]}}})
    with pytest.raises(ConfigError, match="not a tool name"):
        parse_config({"channels": {"telegram": {"groupTools": [""]}}})


# -- the file tools' second look at what they opened ----------------------------------------


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    init_workspace(tmp_path / "ws")
    (tmp_path / "ws" / "USER.md").write_text(SECRETS["USER.md"])
    return (tmp_path / "ws").resolve()


def _group_ctx(ws: Path, gate: Gate | None = None) -> ToolContext:
    scope = group_scope(_msg(str(GROUP), {"is_group": True}), admin=False, share=False)
    return ToolContext(workspace=ws, gate=gate, scope=scope)


def test_what_was_opened_is_checked_again(ws: Path) -> None:
    # A directory swapped for a link between the check and the open: the descriptor tells.
    ctx = _group_ctx(ws)
    guard = filesystem._guard("notes.md", ctx)
    with pytest.raises(filesystem.ToolError, match=r"not readable in this chat: notes\.md"):
        filesystem._read_window(ws / "USER.md", "notes.md", 1, None, guard)
    with pytest.raises(filesystem.ToolError, match="not readable in this chat"):
        filesystem._list(ws / "memory", "notes", lambda p: p == ws / "memory")
    # The owner's turn is not checked (no guard), and reads it.
    assert filesystem._guard("USER.md", ToolContext(workspace=ws)) is None


@pytest.mark.parametrize("confined", [False, True], ids=["plain", "gate"])
async def test_links_and_listings_in_a_group_scope(ws: Path, confined: bool) -> None:
    gate = Gate(ws, protected=[ws.parent / "state"]) if confined else None
    try:
        ctx = _group_ctx(ws, gate)
        (ws / "notes.md").symlink_to("USER.md")
        (ws / "old").symlink_to("memory")
        os.link(ws / "USER.md", ws / "copy.md")
        (ws / "plain.md").write_text("for everyone")
        read = ReadFileTool()
        for path in ("USER.md", "notes.md", "old/MEMORY.md", "copy.md", "memory/MEMORY.md"):
            with pytest.raises(filesystem.ToolError, match="not readable in this chat"):
                await read.run({"path": path}, ctx)
        assert await read.run({"path": "plain.md"}, ctx) == "for everyone"
        listing = await ListDirTool().run({}, ctx)
        names = {line.split()[0].rstrip("/") for line in listing.splitlines()}
        assert "plain.md" in names and "SOUL.md" in names
        assert not names & {"USER.md", "memory", "notes.md", "old", "copy.md", ".git"}
        with pytest.raises(filesystem.ToolError, match="not readable in this chat"):
            await ListDirTool().run({"path": "old"}, ctx)
        if gate is not None:  # the shared temp folder is every chat's
            (gate.policy.temp / "owner.txt").write_text("from the owner's command")
            with pytest.raises(filesystem.ToolError, match="temporary folder"):
                await read.run({"path": str(gate.policy.temp / "owner.txt")}, ctx)
    finally:
        if gate is not None:
            gate.close()


# -- end to end through Telegram -----------------------------------------------------------


@dataclass
class Running:
    api: FakeBotAPI
    llm: FakeLLM
    ws: Path

    async def said(self, text: str, chat: int) -> None:
        await self.api.wait_for_async(
            lambda: any(text in c.params["text"] for c in self.api.sent(chat)), WAIT
        )

    def bodies(self, start: int = 0) -> str:
        """Every request the model was sent from ``start`` on, as one JSON text."""
        return json.dumps([r["body"] for r in self.llm.requests[start:]], ensure_ascii=False)

    def offered(self, index: int = -1) -> set[str]:
        return {t["function"]["name"] for t in self.llm.requests[index]["body"].get("tools", [])}

    def system_prompt(self, index: int = -1) -> str:
        return str(self.llm.requests[index]["body"]["messages"][0]["content"])

    def tool_results(self, start: int = 0) -> list[str]:
        return [
            str(m.get("content"))
            for r in self.llm.requests[start:]
            for m in r["body"]["messages"]
            if m.get("role") == "tool"
        ]

    def document(self, chat: int, content: bytes, caption: str) -> None:
        doc = {**self.api.add_file(content, ".txt"), "file_name": "doc.txt"}
        who = ALICE if chat == GROUP else chat
        chat_obj = self.api.group_chat(chat) if chat == GROUP else self.api.private_chat(chat)
        self.api.inject(
            self.api.message(
                None, chat=chat_obj, sender=self.api.user(who), document=doc, caption=caption
            )
        )


def _owner_workspace(ws: Path) -> None:
    init_workspace(ws)
    for rel, text in SECRETS.items():
        (ws / rel).write_text(text)
    entry = {
        "cursor": 1,
        "timestamp": "2026-01-02T10:00:00.000Z",
        "session": f"telegram:{ALICE}",
        "content": HISTORY_SECRET,
    }
    (ws / "memory" / "history.jsonl").write_text(json.dumps(entry) + "\n")
    (ws / "memory" / ".cursor").write_text("1\n")


@asynccontextmanager
async def running(
    tmp_path: Path, llm: FakeLLM, api: FakeBotAPI, memory: dict[str, Any] | None = None, **tg: Any
) -> AsyncIterator[Running]:
    ws = tmp_path / "ws"
    _owner_workspace(ws)
    telegram = {
        "enabled": True,
        "token": api.token,
        "baseUrl": api.base_url,
        "allowFrom": [str(ALICE), str(BOB)],
        "admins": [str(ALICE)],
        "groupPolicy": "open",
        "pollTimeoutSeconds": 2,
        "rateLimits": {"group": {"messages": 20, "perSeconds": 1}},
        **tg,
    }
    cfg = make_config(tmp_path, llm.base_url, channels={"telegram": telegram}, memory=memory or {})
    async with telegram_in_process(cfg, tmp_path / "config.json"):
        yield Running(api, llm, ws)


async def test_a_group_cannot_read_the_owners_files(tmp_path, llm, api):
    async with running(tmp_path, llm, api, groupTools=["read_file", "list_dir", "edit_file"]) as tg:
        # The owner sends a document in her private chat: it lands in her chat's folder.
        tg.document(ALICE, MEDIA_SECRET, "keep this")
        await tg.said("echo: keep this", ALICE)
        (owner_doc,) = (tg.ws / "media" / "telegram" / str(ALICE)).iterdir()
        # Someone in the group sends one too: the group's own, readable there.
        tg.document(GROUP, b"GROUP-DOC agenda", "our agenda")
        await tg.said("echo: our agenda", GROUP)
        (group_doc,) = (tg.ws / "media" / "telegram" / str(GROUP)).iterdir()
        (tg.ws / "notes.md").symlink_to("USER.md")
        os.link(tg.ws / "USER.md", tg.ws / "copy.md")
        start = len(llm.requests)
        attacks = [
            ("read_file", {"path": "USER.md"}),
            ("read_file", {"path": "memory/MEMORY.md"}),
            ("read_file", {"path": "memory/history.jsonl"}),
            ("read_file", {"path": "HEARTBEAT.md"}),
            ("read_file", {"path": str(owner_doc)}),
            ("read_file", {"path": "notes.md"}),
            ("read_file", {"path": "copy.md"}),
            ("read_file", {"path": str(tg.ws / "memory" / ".." / "USER.md")}),
            ("edit_file", {"path": "USER.md", "old_text": "Secret", "new_text": "x"}),
            ("list_dir", {"path": "memory"}),
            ("list_dir", {"path": f"media/telegram/{ALICE}"}),
        ]
        allowed = [
            ("read_file", {"path": str(group_doc)}),
            ("read_file", {"path": "SOUL.md"}),
            ("list_dir", {}),
            ("list_dir", {"path": "media/telegram"}),
        ]
        llm.script(tool_step(*attacks, *allowed), reply("nothing found"))
        api.group_text("what do you know about the owner?", user_id=BOB)
        await tg.said("nothing found", GROUP)
        results = tg.tool_results(start)[-len(attacks) - len(allowed) :]
        for (name, args), result in zip(attacks, results, strict=False):
            assert result.startswith("Error: not "), (name, args, result)
            assert "in this chat" in result, (name, args, result)
        group_read, soul, root, media = results[len(attacks) :]
        assert group_read == "GROUP-DOC agenda"
        assert "## " not in soul and not soul.startswith("Error")
        assert "SOUL.md" in root and "USER.md" not in root and "memory/" not in root
        assert "HEARTBEAT.md" not in root and "notes.md" not in root and "copy.md" not in root
        assert media.strip() == f"{GROUP}/"
        sent = tg.bodies(start)
        for secret in ("USER-SECRET", "MEMORY-SECRET", "HEARTBEAT-SECRET", "HISTORY-SECRET"):
            assert secret not in sent, secret
        assert "MEDIA-SECRET" not in sent and str(ALICE) + "/" not in media
        assert owner_doc.read_bytes() == MEDIA_SECRET  # still the owner's, untouched
        assert (tg.ws / "USER.md").read_text() == SECRETS["USER.md"]


async def test_by_default_a_group_gets_no_tool_that_reads_the_workspace(tmp_path, llm, api):
    async with running(tmp_path, llm, api) as tg:
        llm.script(tool_step(call("read_file", {"path": "USER.md"})), reply("group answer"))
        api.group_text("hello", user_id=BOB)
        await tg.said("group answer", GROUP)
        offered = tg.offered(0)
        assert offered and offered <= GROUP_DEFAULT_TOOLS and not offered & WORKSPACE_TOOLS
        assert "not available in this chat" in tg.tool_results()[-1]
        assert "USER-SECRET" not in tg.bodies()
        # An admin's own turn in the group too (groupAdminTools is off by default).
        llm.script(reply("admin group answer"))
        api.group_text("hello again", user_id=ALICE)
        await tg.said("admin group answer", GROUP)
        assert not tg.offered() & WORKSPACE_TOOLS
        assert "USER-SECRET" not in tg.system_prompt()


async def test_a_non_admins_private_chat_does_not_get_the_owners_memory(tmp_path, llm, api):
    store = PairingStore(tmp_path / "state", "telegram")
    approved = store.approve(store.request(str(PAIRED), "stranger", str(PAIRED)) or "")
    assert approved is not None
    search = call("memory_search", {"query": "picnic"})
    read = call("read_file", {"path": "USER.md"})
    async with running(tmp_path, llm, api) as tg:
        for who in (BOB, PAIRED):
            start = len(llm.requests)
            llm.script(tool_step(search, read), reply(f"answer for {who}"))
            api.private_text("tell me about the owner", user_id=who, username=None)
            await tg.said(f"answer for {who}", who)
            assert "USER-SECRET" not in tg.system_prompt(start)
            assert "MEMORY-SECRET" not in tg.system_prompt(start)
            found, refused = tg.tool_results(start)[-2:]
            assert found.startswith("No matches"), found
            assert refused.startswith("Error: not readable in this chat: USER.md"), refused
            for secret in ("USER-SECRET", "MEMORY-SECRET", "HISTORY-SECRET"):
                assert secret not in tg.bodies(start), (who, secret)
            offered = tg.offered(start)
            assert "exec" not in offered and offered <= DM_DEFAULT_TOOLS
        # The owner's private chat still gets everything.
        start = len(llm.requests)
        llm.script(tool_step(search, read), reply("answer for the owner"))
        api.private_text("what do you know?", user_id=ALICE)
        await tg.said("answer for the owner", ALICE)
        prompt = tg.system_prompt(start)
        assert "USER-SECRET" in prompt and "MEMORY-SECRET" in prompt
        found, content = tg.tool_results(start)[-2:]
        assert "HISTORY-SECRET" in found
        assert "USER-SECRET" in content
        assert "exec" in tg.offered(start)


async def test_sharing_with_non_admins_is_a_setting(tmp_path, llm, api):
    memory = {"shareWithNonAdmins": True}
    write = call("write_file", {"path": "USER.md", "content": "- Name: Bob\n"})
    async with running(tmp_path, llm, api, memory=memory) as tg:
        llm.script(tool_step(call("memory_search", {"query": "picnic"}), write), reply("shared"))
        api.private_text("hello", user_id=BOB, username="bob")
        await tg.said("shared", BOB)
        assert "USER-SECRET" in tg.system_prompt(0)
        found, written = tg.tool_results()[-2:]
        assert "HISTORY-SECRET" in found
        # Shown, never rewritten: Bob's facts do not belong in the owner's USER.md.
        assert written.startswith("Error: not writable in this chat: USER.md"), written
        assert (tg.ws / "USER.md").read_text() == SECRETS["USER.md"]


def test_with_sharing_on_a_chat_still_reads_only_its_own_chat_memory() -> None:
    """Sharing the owner's memory with a group is the owner's choice; what Dream keeps about
    another group (memory/chats/<chat>.md) is that group's, whatever the setting."""
    shared = group_scope(_msg("-100123:45", {"is_group": True}), admin=False, share=True)
    own = "memory/chats/telegram%3A-100123%3A45.md"
    assert not _hidden(shared, "memory/MEMORY.md")  # shared, as the setting says
    assert not _hidden(shared, own)
    assert _hidden(shared, "memory/chats/telegram%3A-100999.md")
    assert _hidden(shared, own, write=True)  # read, never written from the chat
