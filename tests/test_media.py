"""Files a message names by reference (bot/media.py): stored in the pending turn, fetched by
the message's channel just before its turn runs, in the chat's order, a failure a note."""

from __future__ import annotations

import asyncio
from pathlib import Path

from bot.bus import InboundMessage, MessageBus
from bot.intake import inbound_from_pending, pending_entry
from bot.kinds import with_kind
from bot.media import Fetched, FileRef, with_fetched
from bot.session.records import check_record
from tests.fakes.llm_server import FakeLLM
from tests.helpers import Harness, RecordingChannel, make_config
from tests.helpers.slack import last_user_text

PLAN = FileRef("F1", "plan.txt", 5, "text/plain", "https://files.example/F1", {"mode": "hosted"})
GONE = FileRef("F2", "gone.bin", url="https://files.example/F2")


def test_a_pending_turn_keeps_its_file_references_and_an_older_entry_reads_as_none():
    msg = with_kind(
        InboundMessage("slack", "D1", "U1", "see this", message_id="m1", files=(PLAN, GONE))
    )
    entry = pending_entry(msg)
    assert entry["files"] == [
        {
            "id": "F1",
            "name": "plan.txt",
            "size": 5,
            "mimetype": "text/plain",
            "url": "https://files.example/F1",
            "extra": {"mode": "hosted"},
        },
        {"id": "F2", "name": "gone.bin", "url": "https://files.example/F2"},
    ]
    assert inbound_from_pending("slack:D1", entry).files == (PLAN, GONE)
    # An entry an older memobot wrote (no "files") is read as it always was.
    old = {k: v for k, v in entry.items() if k != "files"}
    assert inbound_from_pending("slack:D1", old).files == ()
    assert "files" not in pending_entry(
        with_kind(InboundMessage("cli", "t", "u", "hi", message_id="m2"))
    )
    # The session file's shape check takes both, and refuses a file without an id.
    meta = {"_type": "metadata", "metadata": {"pending": [entry, old]}}
    assert check_record(meta).problems == ()
    bad = {**entry, "files": [{"name": "x"}]}
    assert check_record({"_type": "metadata", "metadata": {"pending": [bad]}}).problems


def test_fetched_files_become_media_and_the_others_a_note():
    msg = InboundMessage(
        "slack", "D1", "U1", "see this", message_id="m1", media=("/a",), files=(PLAN, GONE)
    )
    done = with_fetched(msg, [Fetched(PLAN, "/ws/plan.txt"), Fetched(GONE, None, "HTTP 404")])
    assert done.files == () and done.media == ("/a", "/ws/plan.txt")
    assert done.text == "see this\n[file gone.bin could not be fetched: HTTP 404]"
    # A file the channel did not answer for is not dropped in silence.
    assert "gone.bin could not be fetched" in with_fetched(msg, [Fetched(PLAN, "/p")]).text


async def test_without_a_channel_to_fetch_them_the_turn_is_told_why():
    msg = InboundMessage("matrix", "r1", "u", "", message_id="m1", files=(PLAN,))
    done = await MessageBus().fetch_media(msg)
    assert done.text == "[file plan.txt could not be fetched: no matrix channel is running here]"


class FetchingChannel(RecordingChannel):
    """A platform whose files come when ``gate`` opens; "gone.bin" never comes."""

    def __init__(self, harness: Harness, workspace: Path) -> None:
        super().__init__(harness, "cli")
        self.workspace = workspace
        self.gate = asyncio.Event()
        self.asked: list[str | None] = []

    async def fetch_media(self, msg: InboundMessage) -> list[Fetched]:
        self.asked.append(msg.message_id)
        await self.gate.wait()
        out = []
        for ref in msg.files:
            if ref.name == "gone.bin":
                out.append(Fetched(ref, None, "HTTP 404"))
                continue
            path = self.workspace / "media" / ref.name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("the plan")
            out.append(Fetched(ref, str(path)))
        return out


async def test_the_channel_fetches_before_the_turn_and_the_chat_keeps_its_order(tmp_path):
    async with FakeLLM() as llm:
        cfg = make_config(tmp_path, llm.base_url)
        harness = Harness(cfg, tmp_path / "config.json", channels=())
        channel = FetchingChannel(harness, cfg.agent.workspace_path)
        harness.manager = type(harness.manager)(
            harness.stack.bus, harness.stack.loop.ledger, [channel]
        )
        async with harness as h:
            first = h.expect("m1")
            bus = h.stack.bus
            msg = InboundMessage(
                "cli", "t", "user-1", "read it", message_id="m1", files=(PLAN, GONE)
            )
            assert await bus.publish_inbound(msg) == "accepted"
            second = await h.send("and then?", message_id="m2")
            for _ in range(100):
                if channel.asked:
                    break
                await asyncio.sleep(0.01)
            assert channel.asked == ["m1"] and llm.requests == []  # the turn waits for it
            pending = h.stack.store.get("cli:t").state.pending_entry("m1")
            assert pending is not None and len(pending["files"]) == 2
            channel.gate.set()
            answers = [(await asyncio.wait_for(f, 15)).text for f in (first, second)]
        assert answers == ["echo: read it", "echo: and then?"]
        seen = last_user_text(llm.requests[0])
        assert str(cfg.agent.workspace_path / "media" / "plan.txt") in seen
        assert "[file gone.bin could not be fetched: HTTP 404]" in seen
        assert channel.asked == ["m1"]  # a message without files is not fetched for


async def test_stop_while_the_files_come_ends_the_message_with_stopped(tmp_path):
    # A download may take minutes; /stop must not answer "nothing is running" meanwhile.
    async with FakeLLM() as llm:
        cfg = make_config(tmp_path, llm.base_url)
        harness = Harness(cfg, tmp_path / "config.json", channels=())
        channel = FetchingChannel(harness, cfg.agent.workspace_path)
        harness.manager = type(harness.manager)(
            harness.stack.bus, harness.stack.loop.ledger, [channel]
        )
        async with harness as h:
            first = h.expect("m1")
            msg = InboundMessage("cli", "t", "user-1", "read it", message_id="m1", files=(PLAN,))
            assert await h.stack.bus.publish_inbound(msg) == "accepted"
            for _ in range(100):
                if channel.asked:
                    break
                await asyncio.sleep(0.01)
            stop = await h.send("/stop", message_id="s1")
            assert (await asyncio.wait_for(stop, 15)).text == "Stopping the current answer."
            assert (await asyncio.wait_for(first, 15)).text == "Stopped."
            assert h.stack.store.get("cli:t").state.pending == ()
            after = await h.send("still there?", message_id="m2")
            assert (await asyncio.wait_for(after, 15)).text == "echo: still there?"
        assert len(llm.requests) == 1  # only the message after the stop reached the model
