"""The agent loop end to end, in-process, against the fake OpenAI-compatible server."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
from pathlib import Path

import pytest

from bot.bus import InboundMessage
from bot.runner import CLOSING_NOTES, INTERRUPTED_TOOL_RESULT
from bot.session import SessionStore
from tests.fakes.llm_server import FakeLLM, error, reply, tool_step
from tests.helpers import Harness, listed_commands, make_config, readme_commands, request_messages


@pytest.fixture
async def llm():
    async with FakeLLM() as server:
        yield server


def harness(tmp_path: Path, server: FakeLLM, **sections) -> Harness:
    cfg = make_config(tmp_path, server.base_url, **sections)
    return Harness(cfg, tmp_path / "config.json")


def session_messages(tmp_path: Path, key: str = "cli:t") -> list[dict]:
    return SessionStore(tmp_path / "state").history(key)


async def test_plain_turn(tmp_path: Path, llm: FakeLLM) -> None:
    llm.script(reply("Hello there!"))
    async with harness(tmp_path, llm) as h:
        assert await h.ask("hi") == "Hello there!"
    [req] = llm.requests
    assert req["headers"]["authorization"] == "Bearer test-key"
    msgs = request_messages(req)
    assert msgs[0]["role"] == "system" and "memobot" in msgs[0]["content"]
    assert "## SOUL.md" in msgs[0]["content"]  # workspace files are in the system prompt
    assert msgs[-1]["role"] == "user" and msgs[-1]["content"].startswith("hi\n\n[runtime context")
    assert "channel: cli" in msgs[-1]["content"] and "chat: t" in msgs[-1]["content"]
    stored = session_messages(tmp_path)
    assert [m["role"] for m in stored] == ["user", "assistant"]
    # Stored exactly as sent, so the next request repeats it byte for byte.
    assert stored[0]["content"] == msgs[-1]["content"]


async def test_an_answer_emptied_by_the_token_budget_says_so(tmp_path: Path, llm: FakeLLM) -> None:
    """A reasoning model can spend the whole budget thinking: an empty answer cut by the
    budget (finish_reason "length") names the setting to raise; any other empty answer says
    it was empty."""
    llm.script(reply("", finish_reason="length"), reply(""))
    async with harness(tmp_path, llm, llm={"maxTokens": 300}) as h:
        assert await h.ask("think hard") == (
            "(the model used its whole answer budget, llm.maxTokens = 300, before writing an "
            "answer; raise llm.maxTokens)"
        )
        assert await h.ask("again") == "(the model returned an empty answer)"
    sent = [
        r["body"].get("max_tokens", r["body"].get("max_completion_tokens")) for r in llm.requests
    ]
    assert sent == [300, 300]  # the budget named is the one sent


async def test_multi_step_tool_turn(tmp_path: Path, llm: FakeLLM) -> None:
    llm.script(
        tool_step(("write_file", {"path": "notes/a.txt", "content": "alpha"})),
        tool_step(("read_file", {"path": "notes/a.txt"}), ("list_dir", {"path": "notes"})),
        reply("The file says alpha."),
    )
    async with harness(tmp_path, llm) as h:
        assert await h.ask("write and read") == "The file says alpha."
    assert (tmp_path / "ws" / "notes" / "a.txt").read_text() == "alpha"
    third = request_messages(llm.requests[2])
    tool_results = [m for m in third if m["role"] == "tool"]
    assert len(tool_results) == 3
    assert "alpha" in tool_results[1]["content"] and "a.txt" in tool_results[2]["content"]
    roles = [m["role"] for m in session_messages(tmp_path)]
    assert roles == ["user", "assistant", "tool", "assistant", "tool", "tool", "assistant"]


async def test_tool_errors_go_back_to_the_model(tmp_path: Path, llm: FakeLLM) -> None:
    llm.script(
        tool_step(("read_file", {"path": "missing.txt"}), ("no_such_tool", {})),
        reply("That file does not exist."),
    )
    async with harness(tmp_path, llm) as h:
        assert await h.ask("read it") == "That file does not exist."
    results = [m for m in request_messages(llm.requests[1]) if m["role"] == "tool"]
    assert results[0]["content"].startswith("Error:") and "missing.txt" in results[0]["content"]
    assert results[1]["content"].startswith("Error: unknown tool")


async def test_prompt_prefix_is_stable_over_ten_turns(tmp_path: Path, llm: FakeLLM) -> None:
    async with harness(tmp_path, llm) as h:
        for i in range(10):
            if i == 4:
                llm.script(tool_step(("list_dir", {})), reply("listed"))
            await h.ask(f"message {i}")
    bodies = [r["body"] for r in llm.requests]
    assert len(bodies) == 11
    for prev, nxt in itertools.pairwise(bodies):
        sent = json.dumps(prev["messages"])[:-1]
        # Every request starts with exactly the messages of the one before it.
        assert json.dumps(nxt["messages"]).startswith(sent)
        assert prev["tools"] == nxt["tools"]


async def test_retry_then_success(tmp_path: Path, llm: FakeLLM) -> None:
    llm.script(error(500), error(429, retry_after=0), reply("made it"))
    async with harness(tmp_path, llm) as h:
        assert await h.ask("hi") == "made it"
    assert [r["status"] for r in llm.requests] == [500, 429, 200]


async def test_retry_after_is_honoured(tmp_path: Path, llm: FakeLLM) -> None:
    llm.script(error(429, retry_after=0.6), reply("after waiting"))
    async with harness(tmp_path, llm) as h:
        assert await h.ask("hi") == "after waiting"
    first, second = llm.requests
    assert second["time"] - first["time"] >= 0.55  # backoff alone would be ~0.01 s


async def test_retry_exhaustion_keeps_the_message(tmp_path: Path, llm: FakeLLM) -> None:
    llm.script(error(503), error(503), error(503))
    async with harness(tmp_path, llm) as h:
        answer = await h.ask("remember the milk")
        assert "unavailable" in answer and "try again" in answer
        assert len(llm.requests) == 3  # llm.retry.attempts
        assert await h.ask("and now?") == "echo: and now?"
    stored = session_messages(tmp_path)
    assert stored[0]["role"] == "user" and "remember the milk" in stored[0]["content"]
    last = request_messages(llm.requests[-1])
    assert any("remember the milk" in str(m["content"]) for m in last)


async def test_client_errors_are_not_retried(tmp_path: Path, llm: FakeLLM) -> None:
    llm.script(error(401))
    async with harness(tmp_path, llm) as h:
        answer = await h.ask("hi")
    assert len(llm.requests) == 1
    assert "401" in answer and "apiKey" in answer


async def test_timeouts_are_retried(tmp_path: Path, llm: FakeLLM) -> None:
    llm.script(reply("too late", delay=3), reply("in time"))
    async with harness(tmp_path, llm, llm={"timeoutSeconds": 0.5}) as h:
        assert await h.ask("hi") == "in time"


async def test_unreachable_llm_gives_clear_message(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, "http://127.0.0.1:9/v1")  # nothing listens on port 9
    async with Harness(cfg, tmp_path / "c.json") as h:
        answer = await h.ask("hi")
    assert "unavailable" in answer
    assert "hi" in session_messages(tmp_path)[0]["content"]


async def test_max_tool_iterations(tmp_path: Path, llm: FakeLLM) -> None:
    llm.script(*[tool_step(("list_dir", {})) for _ in range(3)])
    async with harness(tmp_path, llm, agent={"maxToolIterations": 2}) as h:
        answer = await h.ask("loop forever")
    assert "2 tool steps" in answer and "maxToolIterations" in answer
    assert len(llm.requests) == 2


async def test_turns_of_one_chat_run_in_order(tmp_path: Path, llm: FakeLLM) -> None:
    llm.script(reply("first", delay=0.3))
    async with harness(tmp_path, llm) as h:
        futs = [await h.send(f"m{i}") for i in range(3)]
        answers = [(await asyncio.wait_for(f, 10)).text for f in futs]
    assert answers == ["first", "echo: m1", "echo: m2"]
    # The second request already contains the first answer.
    assert any(m.get("content") == "first" for m in request_messages(llm.requests[1]))


async def test_chats_run_concurrently(tmp_path: Path, llm: FakeLLM) -> None:
    llm.configure(delay=0.5)
    async with harness(tmp_path, llm, agent={"maxConcurrentTurns": 5}) as h:
        futs = [await h.send("hello", chat=f"c{i}") for i in range(5)]
        await asyncio.wait_for(asyncio.gather(*futs), 10)
    # All five requests were in flight at once: each arrived before the first one was answered
    # (an order, not a duration, so a loaded machine cannot fail it).
    assert len(llm.requests) == 5
    assert max(r["time"] for r in llm.requests) < min(r["answered_at"] for r in llm.requests)


async def test_concurrency_limit_is_respected(tmp_path: Path, llm: FakeLLM) -> None:
    llm.configure(delay=0.4)
    async with harness(tmp_path, llm, agent={"maxConcurrentTurns": 2}) as h:
        futs = [await h.send("hello", chat=f"c{i}") for i in range(4)]
        await asyncio.wait_for(asyncio.gather(*futs), 10)
    # Most requests the model had waiting at once (from arrival to its answer): the limit, and
    # reached. Counted from the order of events, so a loaded machine cannot fail it.
    events = sorted(
        [(r["time"], 1) for r in llm.requests] + [(r["answered_at"], -1) for r in llm.requests]
    )
    waiting = [sum(step for _, step in events[: i + 1]) for i in range(len(events))]
    assert len(llm.requests) == 4 and max(waiting) == 2


async def test_a_crashing_turn_does_not_stop_other_chats(tmp_path: Path, llm: FakeLLM) -> None:
    llm.script(reply("slow", delay=0.5, when_user_contains="doomed"))
    async with harness(tmp_path, llm) as h:
        doomed = await h.send("doomed", chat="broken")
        await llm.wait_for_requests(1)
        # The session file turns into a folder under the running turn: its final write fails.
        path = h.stack.store.path_for("cli:broken")
        path.unlink()
        path.mkdir()
        assert "went wrong" in (await asyncio.wait_for(doomed, 10)).text
        assert await h.ask("still there?", chat="fine") == "echo: still there?"


async def test_unstorable_message_is_refused_with_a_reason(tmp_path: Path, llm: FakeLLM) -> None:
    async with harness(tmp_path, llm) as h:
        (tmp_path / "state" / "sessions" / "cli%3Abroken.jsonl").mkdir(parents=True)
        fut = await h.send("hi", chat="broken")
        assert (await asyncio.wait_for(fut, 5)).text == "<refused>"
        assert any("could not store your message" in m.text for m in h.outbox)
        assert await h.ask("fine?", chat="ok") == "echo: fine?"
    assert llm.requests[0]["last_user"].startswith("fine?")


async def test_new_archives_and_starts_fresh(tmp_path: Path, llm: FakeLLM) -> None:
    llm.script(
        tool_step(
            ("save_summary", {"summary": "Ada introduced herself.", "facts": ["Name: Ada"]}),
            when_user_contains="Conversation excerpt",
        )
    )
    async with harness(tmp_path, llm) as h:
        await h.ask("my name is Ada")
        await h.ask("I like tea")
        answer = await h.ask("/new")
        assert "New conversation" in answer and "4 messages" in answer
        await h.ask("who am I?")
    history = (tmp_path / "ws" / "memory" / "history.jsonl").read_text().splitlines()
    entry = json.loads(history[0])
    assert entry["cursor"] == 1 and entry["session"] == "cli:t"
    assert "Ada introduced herself." in entry["content"] and "- Name: Ada" in entry["content"]
    assert (tmp_path / "ws" / "memory" / ".cursor").read_text().strip() == "1"
    summary_request = llm.requests[2]["body"]
    assert summary_request["tool_choice"]["function"]["name"] == "save_summary"
    assert "my name is Ada" in summary_request["messages"][1]["content"]
    last = request_messages(llm.requests[-1])
    assert [m["role"] for m in last] == ["system", "user"]  # nothing old in the prompt
    # Nothing is deleted from the session file; the pointer moved past it.
    store = SessionStore(tmp_path / "state")
    session = store.get("cli:t")
    assert session.count == 6 and session.last_consolidated == 4
    assert len(store.history("cli:t")) == 6


async def test_status_and_help(tmp_path: Path, llm: FakeLLM) -> None:
    async with harness(tmp_path, llm) as h:
        await h.ask("hello")
        status = await h.ask("/status")
        help_text = await h.ask("/help")
    assert "model: fake-model" in status and "2 messages" in status and "uptime" in status
    assert listed_commands(help_text) == readme_commands("cli")  # no /whoami: no platform id
    assert len(llm.requests) == 1  # commands never reach the model


async def test_stop_cancels_only_this_chat(tmp_path: Path, llm: FakeLLM) -> None:
    pid_file = tmp_path / "ws" / "sleeper.pid"
    llm.script(
        tool_step(
            ("exec", {"command": "echo $$ > sleeper.pid; exec sleep 30"}),
            when_user_contains="long job",
        ),
        reply("other chat answered", delay=0.8, when_user_contains="other"),
    )
    async with harness(tmp_path, llm) as h:
        long_job = await h.send("long job", chat="a")
        other = await h.send("other", chat="b")
        for _ in range(100):
            if pid_file.exists() and pid_file.read_text().strip():
                break
            await asyncio.sleep(0.05)
        pid = int(pid_file.read_text())
        assert "Stopping" in await h.ask("/stop", chat="a")
        assert (await asyncio.wait_for(long_job, 10)).text == "Stopped."
        assert (await asyncio.wait_for(other, 10)).text == "other chat answered"
        assert "Nothing is running" in await h.ask("/stop", chat="a")
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    stored = session_messages(tmp_path, "cli:a")
    assert [m["role"] for m in stored] == ["user", "assistant", "tool", "assistant"]
    assert stored[2]["content"] == INTERRUPTED_TOOL_RESULT
    assert stored[3]["content"] == CLOSING_NOTES["stopped"]  # the next turn can begin
    meta = SessionStore(tmp_path / "state").get("cli:a").metadata
    assert "runtime_checkpoint" not in meta


async def test_long_history_is_trimmed_to_the_context_window(tmp_path: Path, llm: FakeLLM) -> None:
    async with harness(tmp_path, llm, llm={"contextWindowTokens": 4096, "maxTokens": 512}) as h:
        for i in range(40):
            await h.ask(f"{i} " + "words " * 60)
    last = request_messages(llm.requests[-1])
    assert len(last) < 80  # trimmed
    assert last[1]["role"] == "user"  # the window opens on a user message, never a tool result
    assert sum(len(str(m["content"])) for m in last) / 4 < 4096


async def test_group_chats_do_not_see_private_memory(tmp_path: Path, llm: FakeLLM) -> None:
    async with harness(tmp_path, llm) as h:
        (tmp_path / "ws" / "USER.md").write_text("- Name: Ada\n- Secret: likes karaoke\n")
        await h.ask("private hello")
        group = await h.send("group hello", chat="g1", metadata={"is_group": True})
        await asyncio.wait_for(group, 10)
    private_prompt = request_messages(llm.requests[0])[0]["content"]
    group_prompt = request_messages(llm.requests[1])[0]["content"]
    assert "likes karaoke" in private_prompt
    assert "likes karaoke" not in group_prompt and "## USER.md" not in group_prompt
    assert "## SOUL.md" in group_prompt  # behaviour rules still apply


async def test_share_in_groups_opt_in(tmp_path: Path, llm: FakeLLM) -> None:
    async with harness(tmp_path, llm, memory={"shareInGroups": True}) as h:
        (tmp_path / "ws" / "USER.md").write_text("- Name: Ada\n")
        fut = await h.send("group hello", chat="g1", metadata={"is_group": True})
        await asyncio.wait_for(fut, 10)
    assert "- Name: Ada" in request_messages(llm.requests[0])[0]["content"]


async def test_agent_memory_edits_are_committed(tmp_path: Path, llm: FakeLLM) -> None:
    from bot.memory.versioning import MemoryRepo

    llm.script(
        tool_step(
            (
                "edit_file",
                {"path": "USER.md", "old_text": "- Name: (unknown)", "new_text": "- Name: Ada"},
            )
        ),
        reply("Noted, Ada."),
    )
    async with harness(tmp_path, llm) as h:
        assert await h.ask("remember that my name is Ada") == "Noted, Ada."
        for _ in range(50):
            if len(MemoryRepo(tmp_path / "ws", tmp_path / "state").log()) == 2:
                break
            await asyncio.sleep(0.05)
    commit, initial = MemoryRepo(tmp_path / "ws", tmp_path / "state").log()
    assert "from the template" in initial.message
    assert "agent: memory edited in session cli:t" in commit.message
    assert "+- Name: Ada" in MemoryRepo(tmp_path / "ws", tmp_path / "state").diff()


async def test_memory_search_in_groups_sees_only_that_chat(tmp_path: Path, llm: FakeLLM) -> None:
    from bot.memory.history import HistoryArchive

    archive = HistoryArchive(tmp_path / "ws")
    await archive.append("cli:g1", "the group planned a picnic on Saturday")
    await archive.append("cli:t", "the owner planned a private picnic with Ada")
    search = ("memory_search", {"query": "picnic"})
    llm.script(
        tool_step(search, when_user_contains="group"),
        reply("ok", when_user_contains="group"),
        tool_step(search, when_user_contains="owner"),
        reply("ok", when_user_contains="owner"),
    )
    async with harness(tmp_path, llm) as h:
        fut = await h.send("group search", chat="g1", metadata={"is_group": True})
        await asyncio.wait_for(fut, 10)
        await h.ask("owner search")
    group_result = request_messages(llm.requests[1])[-1]["content"]
    owner_result = request_messages(llm.requests[3])[-1]["content"]
    assert "group planned" in group_result and "Ada" not in group_result
    assert "Ada" in owner_result and "group planned" in owner_result


async def test_legacy_history_is_migrated_at_start(tmp_path: Path, llm: FakeLLM) -> None:
    from bot.workspace import init_workspace

    init_workspace(tmp_path / "ws")
    (tmp_path / "ws" / "memory" / "HISTORY.md").write_text(
        "[2026-01-02 10:00] Talked about the garden.\n\n[2026-01-03 11:30] Bought seeds.\n"
    )
    async with harness(tmp_path, llm) as h:
        await h.ask("/new")
        await h.ask("hello")
        await h.ask("/new")
    lines = (tmp_path / "ws" / "memory" / "history.jsonl").read_text().splitlines()
    import json as _json

    entries = [_json.loads(line) for line in lines]
    assert [e["cursor"] for e in entries] == [1, 2, 3]
    assert "garden" in entries[0]["content"] and entries[2]["session"] == "cli:t"
    assert (tmp_path / "ws" / "memory" / "HISTORY.md.bak").exists()


async def test_voice_messages_are_transcribed_when_configured(tmp_path: Path, llm: FakeLLM) -> None:
    voice = tmp_path / "ws" / "media" / "note.ogg"
    voice.parent.mkdir(parents=True)
    voice.write_bytes(b"OggS" + b"\0" * 60)
    async with harness(tmp_path, llm, llm={"transcriptionModel": "whisper-1"}) as h:
        fut = h.expect("v1")
        await h.stack.bus.publish_inbound(
            InboundMessage(
                "cli",
                "t",
                "u",
                "[a voice message is attached]",
                media=(str(voice),),
                message_id="v1",
            )
        )
        await asyncio.wait_for(fut, 10)
    assert llm.transcriptions == [{"model": "whisper-1", "filename": "note.ogg"}]
    sent = request_messages(llm.requests[0])[-1]["content"]
    assert "[voice message transcript: transcript by whisper-1 of note.ogg (64 bytes)]" in sent


async def test_voice_messages_are_not_transcribed_by_default(tmp_path: Path, llm: FakeLLM) -> None:
    voice = tmp_path / "v.ogg"
    voice.write_bytes(b"OggS")
    async with harness(tmp_path, llm) as h:
        fut = h.expect("v2")
        await h.stack.bus.publish_inbound(
            InboundMessage("cli", "t", "u", "voice", media=(str(voice),), message_id="v2")
        )
        await asyncio.wait_for(fut, 10)
    assert llm.transcriptions == []
    assert str(voice) in request_messages(llm.requests[0])[-1]["content"]
