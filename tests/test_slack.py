"""Slack channel through the real slack-bolt app and slack_sdk clients against a local fake of
Slack's wire (which keeps Slack's rules: ack deadline and redelivery, disconnects, rate limits).

The agent loop, the channel manager and the delivery ledger are the real ones; the model is the
fake LLM server and Slack is tests/fakes/slack_api.py (Web API + Socket Mode WebSocket).
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import time

import pytest
from slack_sdk.errors import SlackApiError

from channels.errors import (
    FatalChannelError,
    PermanentError,
    RetryAfter,
    TooLong,
    TransientError,
)
from channels.formatting import SLACK_LIMIT, markdown_to_slack_mrkdwn
from channels.slack_channel import channel as slack_channel
from channels.slack_channel.channel import (
    Identity,
    Ignored,
    Incoming,
    SlackEvent,
    proxy_settings,
    route,
    slack_to_text,
    split_chat_id,
)
from channels.slack_channel.errors import map_api_error
from channels.state import ChannelState
from tests.fakes.llm_server import FakeLLM, reply
from tests.fakes.slack_api import BOT_ID, BOT_TOKEN, BOT_USER_ID, FakeSlack
from tests.helpers import (
    VirtualClock,
    listed_commands,
    readme_commands,
    request_messages,
)
from tests.helpers.slack import (
    ALICE,
    CHAN,
    DM,
    MALLORY,
    Rig,
    dm,
    last_user_text,
    mention,
    quiet,
)

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def llm():
    async with FakeLLM() as server:
        yield server


@pytest.fixture
async def slack():
    # Slack's windows, shortened: 0.3 s between posts to a channel (Slack: about 1 s).
    users = {ALICE: {"id": ALICE, "profile": {"display_name": "alice"}}}
    async with FakeSlack(users=users, post_interval=0.3) as s:
        yield s


# --- conversations ----------------------------------------------------------------------------


async def test_dm_is_answered_in_the_dm(tmp_path, llm, slack):
    async with Rig(tmp_path, llm, slack) as rig:
        assert rig.channel.state == "connected"
        env = await slack.push_event(dm("hello there", "1700000001.000100"), event_id="Ev1")
        (post,) = await slack.wait_posts(1)
        assert slack.acked(env)
        assert (post.channel, post.thread_ts, post.mrkdwn) == (DM, None, True)
        assert post.text == "echo: hello there"
        (entry,) = llm.requests
        assert last_user_text(entry).startswith("hello there")
        (entry,) = rig.pending_entries(DM)
        assert entry["id"] == "1700000001.000100"  # the message ts: the same in every retry
        assert entry["sender_id"] == ALICE
        meta = entry["metadata"]
        assert (meta["is_group"], meta["is_admin"], meta["sender_name"]) == (False, True, "alice")


async def test_mention_is_answered_in_its_thread_without_the_mention(tmp_path, llm, slack):
    async with Rig(tmp_path, llm, slack) as rig:
        await slack.push_event(mention("what is up?", "1700000002.000100"), event_id="Ev2")
        (post,) = await slack.wait_posts(1)
        assert (post.channel, post.thread_ts) == (CHAN, "1700000002.000100")
        seen = last_user_text(llm.requests[0])
        assert seen.startswith("what is up?") and f"<@{BOT_USER_ID}>" not in seen

        # A later mention inside the thread continues the same session.
        later = mention("and now?", "1700000009.000100", thread_ts="1700000002.000100")
        await slack.push_event(later, event_id="Ev3")
        posts = await slack.wait_posts(2)
        assert posts[1].thread_ts == "1700000002.000100"
        history = [m.get("content") for m in request_messages(llm.requests[1])]
        assert "echo: what is up?" in history
        assert rig.session_file(f"{CHAN}:1700000002.000100").exists()
        assert rig.stack.store.get(f"slack:{CHAN}:1700000002.000100").metadata.get("seen_ids")


async def test_denied_sender_is_ignored_and_logged_once(tmp_path, llm, slack, caplog):
    caplog.set_level(logging.WARNING, logger="channels.access")
    async with Rig(tmp_path, llm, slack):
        envs = [
            await slack.push_event(dm("let me in", "1700000003.000100", MALLORY), event_id="E1"),
            await slack.push_event(mention("me too", "1700000003.000200", user=MALLORY), "E2"),
        ]
        for env in envs:
            await slack.wait_ack(env)  # ignored messages are acknowledged: no redelivery
        await quiet()
    assert slack.posts == [] and llm.requests == []
    refusals = [r for r in caplog.records if MALLORY in r.getMessage()]
    assert len(refusals) == 1
    assert "channels.slack.allowFrom" in refusals[0].getMessage()


async def test_help_lists_the_commands_the_readme_lists(tmp_path, llm, slack):
    async with Rig(tmp_path, llm, slack):
        await slack.push_event(dm("!help", "1700000004.000900"), event_id="H1")
        (post,) = await slack.wait_posts(1)
    assert listed_commands(post.text) == readme_commands("slack")  # !new..., /memobot
    assert llm.requests == []


async def test_whoami_answers_anyone_in_a_dm(tmp_path, llm, slack):
    async with Rig(tmp_path, llm, slack):
        await slack.push_event(dm(" /whoami", "1700000004.000100", MALLORY), event_id="W1")
        (post,) = await slack.wait_posts(1)
        assert MALLORY in post.text and "not allowed" in post.text
        assert post.channel == DM
        await slack.push_event(dm("/whoami", "1700000004.000200"), event_id="W2")
        posts = await slack.wait_posts(2)
        assert ALICE in posts[1].text and "not allowed" not in posts[1].text
        # In a channel a stranger's /whoami is not answered.
        env = await slack.push_event(mention("/whoami", "1700000004.000300", user=MALLORY), "W3")
        await slack.wait_ack(env)
        await quiet()
    assert len(slack.posts) == 2 and llm.requests == []


async def test_bots_edits_and_unmentioned_channel_messages_are_ignored(tmp_path, llm, slack):
    events = [
        {**dm("from a bot", "1700000005.000100"), "bot_id": "B0OTHER01"},
        {**dm("legacy bot", "1700000005.000200"), "subtype": "bot_message"},
        {**dm("myself", "1700000005.000300"), "user": BOT_USER_ID, "bot_id": BOT_ID},
        {
            **dm("", "1700000005.000400"),
            "subtype": "message_changed",
            "message": {"text": "edited", "user": ALICE},
        },
        {**dm("", "1700000005.000500"), "subtype": "message_deleted"},
        {
            "type": "message",
            "channel": CHAN,
            "channel_type": "channel",
            "user": ALICE,
            "text": "just chatting",
            "ts": "1700000005.000600",
        },
    ]
    async with Rig(tmp_path, llm, slack):
        envs = [await slack.push_event(e, event_id=f"B{i}") for i, e in enumerate(events)]
        for env in envs:
            await slack.wait_ack(env)
        await quiet()
    assert slack.posts == [] and llm.requests == []


async def test_open_group_policy_answers_plain_channel_messages_once(tmp_path, llm, slack):
    async with Rig(tmp_path, llm, slack, groupPolicy="open"):
        plain = {
            "type": "message",
            "channel": CHAN,
            "channel_type": "channel",
            "user": ALICE,
            "text": "anyone around?",
            "ts": "1700000006.000100",
        }
        await slack.push_event(plain, event_id="O1")
        (post,) = await slack.wait_posts(1)
        assert (post.thread_ts, post.text) == ("1700000006.000100", "echo: anyone around?")
        # One mention arrives as an app_mention *and* a message event: answered once.
        both = mention("hi bot", "1700000006.000200")
        await slack.push_event(both, event_id="O2")
        await slack.push_event({**both, "type": "message", "channel_type": "channel"}, "O3")
        await slack.wait_posts(2)
        await quiet()
    assert len(slack.posts) == 2 and len(llm.requests) == 2


# --- delivery semantics -----------------------------------------------------------------------


async def test_ack_is_sent_only_after_the_message_is_on_disk(tmp_path, llm, slack):
    ts = "1700000007.000100"
    async with Rig(tmp_path, llm, slack) as rig:
        intake = rig.stack.bus._intake
        assert intake is not None
        entered, gate = asyncio.Event(), asyncio.Event()

        async def slow_intake(msg):
            entered.set()
            await gate.wait()
            return await intake(msg)

        rig.stack.bus.set_intake(slow_intake)
        slack.on_ack = lambda _env: rig.pending_ids(DM)
        env = await slack.push_event(dm("keep this", ts), event_id="A1")
        await asyncio.wait_for(entered.wait(), 5)
        # Slack gives up waiting for the ack and redelivers while the first is still in intake.
        retry = await slack.push_event(dm("keep this", ts), event_id="A1", retry_attempt=1)
        await asyncio.sleep(0.3)
        assert slack.acks == [], "acknowledged before the intake finished"
        gate.set()
        for envelope in (env, retry):
            ack = await slack.wait_ack(envelope)
            assert ts in ack.probe, "an ack arrived before the pending entry was on disk"
        await slack.wait_posts(1)
        await quiet()
    assert len(slack.posts) == 1 and len(llm.requests) == 1


async def test_refused_intake_is_not_acknowledged_and_slacks_redelivery_is_answered_once(
    tmp_path, llm, slack
):
    slack.ack_deadline = 0.5  # Slack's is 3 s
    async with Rig(tmp_path, llm, slack) as rig:
        intake, verdicts = rig.stack.bus._intake, []
        assert intake is not None

        async def refuse_first(msg):  # as when memobot is stopping
            verdicts.append("refused" if not verdicts else await intake(msg))
            return verdicts[-1]

        rig.stack.bus.set_intake(refuse_first)
        env = await slack.push_event(dm("during shutdown", "1700000008.000100"), event_id="R1")
        (post,) = await slack.wait_posts(1)
        assert post.text == "echo: during shutdown"
        assert not slack.acked(env)
        # The fake redelivered the unacknowledged envelope, as Slack does, and stopped there.
        (_, _, attempt), *_ = [d for d in slack.deliveries if d[0] != env]
        assert attempt == 1 and slack.acked(slack.deliveries[1][0])
        await quiet(0.6)
    assert verdicts == ["refused", "accepted"]
    assert len(slack.deliveries) == 2 and len(slack.posts) == 1 and len(llm.requests) == 1


async def test_slack_retries_of_one_event_get_one_answer(tmp_path, llm, slack):
    llm.script(reply("the one answer", delay=1.0))
    event = dm("once please", "1700000010.000100")
    async with Rig(tmp_path, llm, slack) as rig:
        intake, intakes = rig.stack.bus._intake, []
        assert intake is not None

        async def counting_intake(msg):
            intakes.append(msg.message_id)
            return await intake(msg)

        rig.stack.bus.set_intake(counting_intake)
        first = await slack.push_event(event, event_id="Ev10")
        await slack.wait_ack(first)
        # Redelivered while the turn is still running...
        during = await slack.push_event(event, event_id="Ev10", retry_attempt=1)
        await slack.wait_ack(during)
        await slack.wait_posts(1)
        # ...and again after the answer went out.
        after = await slack.push_event(
            event, event_id="Ev10", retry_attempt=2, retry_reason="timeout"
        )
        await slack.wait_ack(after)
        await quiet(0.5)
    assert [p.text for p in slack.posts] == ["the one answer"]
    assert len(llm.requests) == 1
    assert intakes == ["1700000010.000100"]  # retries were dropped by event_id before intake


async def test_redelivery_after_a_restart_is_recognised_by_the_intake(tmp_path, llm, slack):
    event = dm("survive me", "1700000011.000100")
    async with Rig(tmp_path, llm, slack):
        await slack.push_event(event, event_id="Ev11")
        await slack.wait_posts(1)
    # A new process remembers no event ids; the message id in the session file decides.
    async with Rig(tmp_path, llm, slack):
        env = await slack.push_event(event, event_id="Ev11", retry_attempt=3)
        await slack.wait_ack(env)
        await quiet(0.5)
    assert len(slack.posts) == 1 and len(llm.requests) == 1


async def test_long_answer_is_split_into_several_posts_in_the_thread(tmp_path, llm, slack):
    """Slack allows about one post per second per channel: the pieces after the first are
    refused with 429 by the fake, waited out, and all delivered in order."""
    paragraphs = [f"Paragraph {i}: " + ("lorem ipsum dolor " * 30).strip() for i in range(20)]
    llm.script(reply("\n\n".join(paragraphs)))
    fast = {"channel": {"messages": 100, "perSeconds": 1, "burst": 10}}  # ours out of the way
    async with Rig(tmp_path, llm, slack, rateLimits=fast):
        await slack.push_event(mention("write a lot", "1700000012.000100"), event_id="L1")
        await slack.wait_posts(3)
        await quiet(0.5)
    assert len(slack.posts) >= 3
    assert all(p.thread_ts == "1700000012.000100" and p.channel == CHAN for p in slack.posts)
    assert slack.rate_limited >= len(slack.posts) - 1
    assert all(len(p.text) <= SLACK_LIMIT for p in slack.posts)
    joined = "\n".join(p.text for p in slack.posts)
    order = [joined.index(f"Paragraph {i}:") for i in range(20)]
    assert order == sorted(order)


async def test_our_pacing_keeps_pieces_within_the_channel_rate(tmp_path, llm, slack):
    """rateLimits just under the fake's one post per 0.3 s: no 429 at all, all in order."""
    paragraphs = [f"Paragraph {i}: " + ("lorem ipsum dolor " * 30).strip() for i in range(20)]
    llm.script(reply("\n\n".join(paragraphs)))
    paced = {"channel": {"messages": 1, "perSeconds": 0.35}}  # a margin for arrival jitter
    async with Rig(tmp_path, llm, slack, rateLimits=paced):
        await slack.push_event(mention("write a lot", "1700000014.000100"), event_id="P1")
        await slack.wait_posts(3)
        await quiet(0.5)
    assert slack.rate_limited == 0
    joined = "\n".join(p.text for p in slack.posts)
    order = [joined.index(f"Paragraph {i}:") for i in range(20)]
    assert order == sorted(order)


async def test_rate_limit_waits_as_slack_asks_then_delivers(tmp_path, llm, slack):
    slack.post_script.append({"retry_after": 1})
    async with Rig(tmp_path, llm, slack):
        started = time.monotonic()
        await slack.push_event(dm("busy?", "1700000013.000100"), event_id="RL1")
        (post,) = await slack.wait_posts(1)
        waited = time.monotonic() - started
    assert post.text == "echo: busy?"
    assert slack.calls["chat.postMessage"] == 2
    assert waited >= 1.0


async def test_markdown_is_posted_as_mrkdwn(tmp_path, llm, slack):
    answer = "**Done.** See [the docs](https://example.com/docs) and `code`.\n\n- one\n- two"
    llm.script(reply(answer))
    async with Rig(tmp_path, llm, slack):
        await slack.push_event(dm("format it", "1700000014.000100"), event_id="M1")
        (post,) = await slack.wait_posts(1)
    assert post.text == markdown_to_slack_mrkdwn(answer)
    assert "**" not in post.text and "<https://example.com/docs|" in post.text
    assert post.mrkdwn is True


async def test_permanent_send_error_is_not_retried(tmp_path, llm, slack):
    slack.post_script.append({"error": "channel_not_found"})
    async with Rig(tmp_path, llm, slack) as rig:
        await slack.push_event(dm("anyone?", "1700000015.000100"), event_id="P1")
        await llm.wait_for_requests(1)
        await quiet(0.5)
        # Sent once, not retried (a short notice about the failure may follow it).
        assert not any(p.text == "echo: anyone?" for p in slack.posts)
        assert slack.calls["chat.postMessage"] == 1 + len(slack.posts)
        # The answer stays in the ledger, retrievable, not marked as sent.
        outbox = rig.stack.store.get(f"slack:{DM}").metadata.get("outbox") or []
        assert len(outbox) == 1 and outbox[0]["state"] != "sent"


async def test_a_5xx_whose_body_is_not_json_is_network_trouble(tmp_path, llm, slack):
    """A proxy in front of Slack answers 502 with an HTML page labelled JSON: slack_sdk's
    error then carries aiohttp's response (no ``status_code``, no ``data``); it is still a
    5xx, retried with backoff, not an odd exception given up after three tries."""
    slack.answer_raw("chat.postMessage", "<html><h1>502 Bad Gateway</h1></html>", 502, times=4)
    async with Rig(tmp_path, llm, slack) as rig:
        clock = rig.manager.delivery.clock = VirtualClock()
        await slack.push_event(dm("anyone?", "1700000016.000100"), event_id="P2")
        (post,) = await slack.wait_posts(1)
        assert post.text == "echo: anyone?"
        assert clock.slept == [1.0, 1.5, 2.25, 3.375]


async def test_an_auth_test_answer_that_is_not_json_is_tried_again(
    tmp_path, llm, slack, monkeypatch
):
    """The same page in answer to the login: the connection is tried again (it was the end
    of the channel: reading the error raised inside the connect loop, which then stopped)."""
    monkeypatch.setattr(slack_channel, "CONNECT_BACKOFF_START", 0.05)
    slack.answer_raw("auth.test", "<html><h1>502 Bad Gateway</h1></html>", 502)
    async with Rig(tmp_path, llm, slack) as rig:
        await slack.wait_connected(1)
        assert rig.channel.state == "connected"
        await slack.push_event(dm("there?", "1700000018.000100"), event_id="C2")
        (post,) = await slack.wait_posts(1)
        assert post.text == "echo: there?"
    assert slack.calls["auth.test"] >= 2  # the unreadable answer, then ours (and bolt's own)


async def test_a_refusal_for_one_workspace_or_channel_is_not_the_token(tmp_path, llm, slack):
    """An org app not granted the chat's workspace, or a post Enterprise Key Management
    suspended: that answer is refused, the channel lives on (only the login's refusal is
    the token's)."""
    slack.post_script += [{"error": "team_access_not_granted"}, {"error": "ekm_access_denied"}]
    async with Rig(tmp_path, llm, slack) as rig:
        await slack.push_event(dm("one", "1700000019.000100"), event_id="W1")
        await slack.push_event(dm("two", "1700000020.000100"), event_id="W2")
        await slack.push_event(dm("three", "1700000021.000100"), event_id="W3")
        await slack._wait(lambda: any(p.text == "echo: three" for p in slack.posts), 10)
        assert rig.channel.fatal is None and rig.channel.state == "connected"


async def test_files_are_downloaded_with_the_bot_token(tmp_path, llm, slack):
    url = slack.add_file("notes.txt", b"remember the milk\n")
    files = [
        {
            "id": "F01",
            "name": "notes.txt",
            "mimetype": "text/plain",
            "size": 18,
            "url_private": url,
        },
        {"id": "F02", "name": "huge.bin", "size": 30 * 1024 * 1024, "url_private": url},
        {"id": "F03", "name": "x.txt", "size": 3, "url_private": "https://evil.example/x.txt"},
    ]
    event = dm("see attached", "1700000016.000100", subtype="file_share", files=files)
    async with Rig(tmp_path, llm, slack) as rig:
        await slack.push_event(event, event_id="F1")
        # The same message again under another event id (Slack sends a mention as both
        # app_mention and message; a redelivery after a restart): recognised by its ts.
        await slack.wait_ack(await slack.push_event(event, event_id="F1b"))
        await slack.wait_posts(1)
        await quiet()
        saved = rig.cfg.agent.workspace_path / "media" / "slack" / DM / "F01-notes.txt"
    assert len(slack.posts) == 1 and len(llm.requests) == 1
    assert saved.read_bytes() == b"remember the milk\n"
    assert slack.file_auth == [f"Bearer {BOT_TOKEN}"]  # one download, with the token
    seen = last_user_text(llm.requests[0])
    assert str(saved) in seen
    assert "[file huge.bin could not be fetched: larger than 20 MB]" in seen
    assert "[file x.txt could not be fetched: unexpected file host evil.example]" in seen


async def test_a_file_slack_no_longer_has_is_a_note_and_the_chat_goes_on(tmp_path, llm, slack):
    # Deleted between the message and its turn (the fake answers 404 for a file it does not
    # hold): the turn runs with a note, and the chat's next message is answered too.
    gone = {"id": "F04", "name": "gone.txt", "size": 3, "url_private": f"{slack.url}/files/gone"}
    event = dm("what does it say?", "1700000016.000200", subtype="file_share", files=[gone])
    async with Rig(tmp_path, llm, slack) as rig:
        await slack.push_event(event, event_id="F4")
        await slack.push_event(dm("anyone there?", "1700000016.000300"), event_id="F5")
        posts = await slack.wait_posts(2)
        assert rig.pending_ids(DM) == {"1700000016.000200", "1700000016.000300"}
        await quiet()
    assert [p.text.splitlines()[0] for p in posts] == [
        "echo: what does it say?",
        "echo: anyone there?",
    ]
    first = last_user_text(llm.requests[0])
    assert "[file gone.txt could not be fetched: download failed: HTTP 404]" in first
    assert rig.stack.store.get(f"slack:{DM}").state.pending == ()


# --- connection -------------------------------------------------------------------------------


async def test_reconnects_after_slack_drops_the_socket(tmp_path, llm, slack):
    async with Rig(tmp_path, llm, slack) as rig:
        await slack.wait_connected(1)
        await slack.drop_connections()
        await slack.wait_connected(2)
        for _ in range(100):
            if rig.channel.state == "connected":
                break
            await asyncio.sleep(0.05)
        assert rig.channel.state == "connected"
        await slack.push_event(dm("still there?", "1700000017.000100"), event_id="C1")
        (post,) = await slack.wait_posts(1)
        assert post.text == "echo: still there?"
    assert slack.calls["apps.connections.open"] == 2


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (403, "<html><body>Forbidden by proxy policy</body></html>"),  # a proxy on the way
        (200, '{"ok": false, "error": "team_added_to_org"}'),  # a migration, for a while
    ],
)
async def test_a_reconnect_refused_for_another_reason_than_the_token_is_tried_again(
    tmp_path, llm, slack, status, body
):
    # Only a refused token (channels.errors' FatalChannelError) fails the channel for good
    # while slack_sdk reconnects; anything else may pass, and the next try connects.
    async with Rig(tmp_path, llm, slack) as rig:
        await slack.wait_connected(1)
        slack.answer_raw("apps.connections.open", body, status=status)
        await slack.drop_connections()
        await slack.wait_connected(2, timeout=30.0)
        assert rig.channel.state != "failed"
        await slack.push_event(dm("still there?", "1700000017.000200"), event_id="C2")
        (post,) = await slack.wait_posts(1)
        assert post.text == "echo: still there?"


async def test_rejected_app_token_fails_the_channel_clearly(tmp_path, llm, caplog):
    caplog.set_level(logging.ERROR, logger="channels.slack_channel.channel")
    async with FakeSlack(app_token="xapp-some-other-token") as slack:
        async with Rig(tmp_path, llm, slack) as rig:
            assert rig.channel.state == "failed"
            assert slack.connections == 0
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "channels.slack.appToken" in messages and "invalid_auth" in messages


# --- pure parts -------------------------------------------------------------------------------

ME = Identity(BOT_USER_ID, BOT_ID)


def test_route_sessions_and_gating():
    routed = route(SlackEvent.model_validate(mention("hi", "1.5", thread_ts="1.2")), ME, "mention")
    assert isinstance(routed, Incoming)
    assert (routed.chat_id, routed.thread_ts, routed.message_id) == (f"{CHAN}:1.2", "1.2", "1.5")
    assert routed.text == "hi"
    direct = route(SlackEvent.model_validate(dm("yo", "2.0")), ME, "mention")
    assert isinstance(direct, Incoming) and (direct.chat_id, direct.thread_ts) == (DM, None)
    plain = SlackEvent.model_validate(
        {"type": "message", "channel": CHAN, "channel_type": "channel", "user": ALICE, "ts": "3"}
    )
    assert isinstance(route(plain, ME, "mention"), Ignored)
    assert isinstance(route(plain, ME, "open"), Incoming)
    edited = SlackEvent.model_validate({**dm("x", "4"), "subtype": "message_changed"})
    assert isinstance(route(edited, ME, "open"), Ignored)


def test_a_file_with_null_fields_does_not_drop_its_message():
    # One file described with nulls made the whole event malformed: ignored, never answered.
    odd = {"id": "F1", "name": None, "size": None, "mimetype": None, "url_private": None}
    event = SlackEvent.model_validate(dm("see the file", "6.0", files=[odd]))
    assert route(event, ME, "mention").files[0].id == "F1"


def test_slack_text_is_made_readable():
    wire = "see <https://a.io/x|the page> &amp; <https://b.io> in <#C1|general>, <!here> &lt;3"
    assert (
        slack_to_text(wire) == "see the page (https://a.io/x) & https://b.io in #general, @here <3"
    )
    assert slack_to_text("ping <@U123> and <@U9|bob>") == "ping <@U123> and @bob"


def test_chat_ids_split_into_channel_and_thread():
    assert split_chat_id("C1:1700.1") == ("C1", "1700.1")
    assert split_chat_id("D1") == ("D1", None)


def test_api_errors_map_to_the_retry_vocabulary():
    limited = map_api_error(429, "ratelimited", "7")
    assert isinstance(limited, RetryAfter) and limited.seconds == 7
    assert isinstance(map_api_error(200, "invalid_auth"), FatalChannelError)
    assert isinstance(map_api_error(200, "account_inactive"), FatalChannelError)
    assert isinstance(map_api_error(503, None), TransientError)
    assert isinstance(map_api_error(200, "internal_error"), TransientError)
    for code in ("channel_not_found", "not_in_channel"):
        assert isinstance(map_api_error(200, code), PermanentError)
    assert isinstance(map_api_error(200, "msg_too_long"), TooLong)
    # The token's only at the login: elsewhere that workspace's or that post's.
    for code in ("team_access_not_granted", "ekm_access_denied", "not_allowed_token_type"):
        assert isinstance(map_api_error(200, code, method="auth.test"), FatalChannelError)
        assert type(map_api_error(200, code, method="chat.postMessage")) is PermanentError


async def test_proxy_settings():
    assert proxy_settings("") == (None, None)
    assert proxy_settings("http://proxy:3128") == ("http://proxy:3128", None)
    url, connector = proxy_settings("socks5h://127.0.0.1:1080")
    assert url is None and connector is not None
    made = connector()
    from aiohttp_socks import ProxyConnector

    assert isinstance(made, ProxyConnector)
    await made.close()


# --- Slack's rules: deadline, commands, threads, disconnects ----------------------------------


def with_files_on_disk(rig: Rig) -> set[str]:
    """The ids of the DM's pending turns on disk that name files."""
    return {p["id"] for p in rig.pending_entries(DM) if p.get("files")}


async def test_ack_beats_the_deadline_while_a_file_downloads_slowly(tmp_path, llm, slack):
    # Slack's deadline is 3 s and downloads may take minutes; shortened, with room for a
    # loaded machine between the ack (milliseconds) and the deadline.
    slack.ack_deadline = 2.0
    slack.file_delay = 3.0
    url = slack.add_file("big.txt", b"slow but here\n")
    ts = "1700000020.000100"
    file = {"id": "F20", "name": "big.txt", "size": 14, "url_private": url}
    event = dm("read this", ts, subtype="file_share", files=[file])
    async with Rig(tmp_path, llm, slack) as rig:
        slack.on_ack = lambda _env: with_files_on_disk(rig)
        started = time.monotonic()
        env = await slack.push_event(event, event_id="D1")
        ack = await slack.wait_ack(env)
        assert ack.at - started < slack.ack_deadline, "the ack waited for the download"
        assert not ack.late
        assert ts in ack.probe, "acknowledged before the message and its files were on disk"
        assert slack.file_auth == [], "the download started before the ack"
        (post,) = await slack.wait_posts(1)
        assert post.text.startswith("echo: read this")
        saved = rig.cfg.agent.workspace_path / "media" / "slack" / DM / "F20-big.txt"
        assert str(saved) in last_user_text(llm.requests[0])
        (entry,) = rig.pending_entries(DM)
        assert entry["files"] == [{"id": "F20", "name": "big.txt", "size": 14, "url": url}]
        assert BOT_TOKEN not in rig.session_file(DM).read_text()
        assert rig.stack.store.get(f"slack:{DM}").state.pending == ()
    assert [d[2] for d in slack.deliveries] == [0]  # never redelivered
    assert saved.read_bytes() == b"slow but here\n"


async def test_files_not_fetched_before_a_stop_are_fetched_after_the_restart(tmp_path, llm, slack):
    url = slack.add_file("n.txt", b"note\n")
    event = dm(
        "kept",
        "1700000021.000100",
        subtype="file_share",
        files=[{"id": "F21", "name": "n.txt", "size": 5, "url_private": url}],
    )
    slack.file_delay = 10.0  # the first process stops before the download finishes
    async with Rig(tmp_path, llm, slack) as rig:
        await slack.wait_ack(await slack.push_event(event, event_id="I1"))
        await slack._wait(lambda: len(slack.file_auth) == 1, 10)  # downloading now
    assert with_files_on_disk(rig) == {"1700000021.000100"}
    slack.file_delay = 0.0
    async with Rig(tmp_path, llm, slack) as rig:
        (post,) = await slack.wait_posts(1)
        await quiet()
    assert post.text.startswith("echo: kept") and len(llm.requests) == 1
    saved = rig.cfg.agent.workspace_path / "media" / "slack" / DM / "F21-n.txt"
    assert str(saved) in last_user_text(llm.requests[0]) and saved.read_bytes() == b"note\n"


async def test_an_old_inbox_is_moved_into_the_intake_once(tmp_path, llm, slack):
    # What an earlier version left in state/channels/slack.json: acknowledged to Slack, its
    # file not fetched yet. The upgrade answers it once, with its file, and drops the inbox.
    url = slack.add_file("old.txt", b"from before\n")
    old = {
        "event_id": "Ev0OLD",
        "chat_id": DM,
        "channel": DM,
        "thread_ts": None,
        "user": ALICE,
        "text": "left in the inbox",
        "message_id": "1700000027.000100",
        "is_dm": True,
        "files": [{"id": "F27", "name": "old.txt", "size": 12, "url_private": url}],
        "sender_name": "alice",
        "team": "",
    }
    state = tmp_path / "state" / "channels" / "slack.json"
    state.parent.mkdir(parents=True)
    state.write_text(json.dumps({"inbox": [old], "threads": [f"{CHAN}:1.1"]}))
    async with Rig(tmp_path, llm, slack) as rig:
        (post,) = await slack.wait_posts(1)
        assert json.loads(state.read_text()) == {"threads": [f"{CHAN}:1.1"]}
    assert post.text.startswith("echo: left in the inbox")
    saved = rig.cfg.agent.workspace_path / "media" / "slack" / DM / "F27-old.txt"
    assert str(saved) in last_user_text(llm.requests[0])
    assert saved.read_bytes() == b"from before\n"
    # A crash after the move but before slack.json was rewritten: the next start finds the
    # entry again, and the intake knows the message.
    state.write_text(json.dumps({"inbox": [old], "threads": [f"{CHAN}:1.1"]}))
    async with Rig(tmp_path, llm, slack):
        await quiet()
        assert json.loads(state.read_text()) == {"threads": [f"{CHAN}:1.1"]}
    assert len(slack.posts) == 1 and len(llm.requests) == 1


async def test_an_unreadable_old_inbox_entry_is_dropped_and_the_gateway_starts(
    tmp_path, llm, slack, caplog
):
    # A hand-edited slack.json: an entry with a field of the wrong type raised at start (the
    # gateway stopped at every start); now it is dropped, named by its id, never its text.
    base = {"event_id": "Ev1", "chat_id": DM, "channel": DM, "user": ALICE, "is_dm": True}
    bad = {**base, "message_id": "1700000028.000100", "text": ["secret words"]}
    good = {**base, "event_id": "Ev2", "message_id": "1700000028.000200", "text": "still here"}
    state = tmp_path / "state" / "channels" / "slack.json"
    state.parent.mkdir(parents=True)
    state.write_text(json.dumps({"inbox": [bad, good], "threads": 5}))
    async with Rig(tmp_path, llm, slack):
        (post,) = await slack.wait_posts(1)
        assert json.loads(state.read_text()) == {"threads": []}
    assert post.text.startswith("echo: still here")
    assert "old inbox entry of message 1700000028.000100 unreadable (text)" in caplog.text
    assert "secret words" not in caplog.text


async def test_an_old_inbox_moved_while_slack_json_cannot_be_written_starts_all_the_same(
    tmp_path, llm, slack, monkeypatch
):
    old = {"event_id": "Ev3", "chat_id": DM, "channel": DM, "user": ALICE, "is_dm": True}
    old |= {"message_id": "1700000029.000100", "text": "moved anyway"}
    state = tmp_path / "state" / "channels" / "slack.json"
    state.parent.mkdir(parents=True)
    state.write_text(json.dumps({"inbox": [old]}))

    def full_disk(self, data, durable=True):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ChannelState, "save", full_disk)
    async with Rig(tmp_path, llm, slack):
        (post,) = await slack.wait_posts(1)
    assert post.text.startswith("echo: moved anyway")


async def test_slash_command_and_bang_commands_stop_a_running_answer(tmp_path, llm, slack):
    llm.script(reply("too late", delay=5.0), reply("also too late", delay=5.0))
    async with Rig(tmp_path, llm, slack):
        await slack.push_event(dm("think hard", "1700000022.000100"), event_id="S1")
        await llm.wait_for_requests(1)
        env = await slack.push_command("stop", user=ALICE, channel=DM)
        await slack.wait_ack(env)
        posts = await slack.wait_posts(2)
        assert {p.text for p in posts} == {"Stopping the current answer.", "Stopped."}
        # "!stop" as plain text: Slack clients do not take it as a slash command.
        await slack.push_event(dm("think again", "1700000022.000200"), event_id="S2")
        await llm.wait_for_requests(2)
        await slack.push_event(dm("!stop", "1700000022.000300"), event_id="S3")
        posts = await slack.wait_posts(4)
        assert {p.text for p in posts[2:]} == {"Stopping the current answer.", "Stopped."}
        # whoami is answered in the command's acknowledgement, visible to the sender only.
        ack = await slack.wait_ack(await slack.push_command("whoami", user=MALLORY, channel=DM))
        assert ack.payload and MALLORY in ack.payload["text"]
        assert "not allowed" in ack.payload["text"]
        await quiet()
    assert all("too late" not in p.text for p in slack.posts) and len(slack.posts) == 4


async def test_thread_follow_up_without_a_mention_is_answered(tmp_path, llm, slack):
    root = "1700000023.000100"
    follow_up = {
        "type": "message",
        "channel": CHAN,
        "channel_type": "channel",
        "user": ALICE,
        "text": "and one more thing",
        "ts": "1700000023.000300",
        "thread_ts": root,
    }
    elsewhere = {**follow_up, "ts": "1700000023.000400", "thread_ts": "1600000000.000100"}
    async with Rig(tmp_path, llm, slack):
        await slack.push_event(mention("start here", root), event_id="T1")
        await slack.wait_posts(1)
        await slack.push_event(follow_up, event_id="T2")
        await slack.wait_ack(await slack.push_event(elsewhere, event_id="T3"))
        await slack.wait_posts(2)
        # In a channel, /memobot acts on the thread the sender last wrote to memobot in.
        await slack.wait_ack(await slack.push_command("status", user=ALICE, channel=CHAN))
        posts = await slack.wait_posts(3)
        await quiet()
    assert [(p.thread_ts, p.text) for p in posts[:2]] == [
        (root, "echo: start here"),
        (root, "echo: and one more thing"),
    ]
    assert posts[2].thread_ts == root and "uptime" in posts[2].text.lower()
    assert len(slack.posts) == 3  # the thread memobot is not in stays unanswered


async def test_a_slow_users_info_does_not_hold_the_ack(tmp_path, llm, slack):
    slack.users_delay = 5.0
    async with Rig(tmp_path, llm, slack):
        started = time.monotonic()
        ack = await slack.wait_ack(await slack.push_event(dm("hi", "1700000026.000100"), "U1"))
        assert ack.at - started < slack.ack_deadline  # 3 s, and users.info takes 5
        (post,) = await slack.wait_posts(1)
    assert post.text == "echo: hi"


async def test_dm_thread_is_answered_in_the_thread(tmp_path, llm, slack):
    async with Rig(tmp_path, llm, slack) as rig:
        event = dm("in a thread", "1700000024.000200", thread_ts="1700000024.000100")
        await slack.push_event(event, event_id="DT1")
        (post,) = await slack.wait_posts(1)
        assert (post.channel, post.thread_ts, post.text) == (
            DM,
            "1700000024.000100",
            "echo: in a thread",
        )
        assert rig.session_file(f"{DM}:1700000024.000100").exists()


async def test_disconnect_refresh_requested_reconnects_and_keeps_working(tmp_path, llm, slack):
    async with Rig(tmp_path, llm, slack) as rig:
        await slack.send_disconnect("refresh_requested")
        await slack.wait_connected(2)
        await slack.push_event(dm("still with me?", "1700000025.000100"), event_id="X1")
        (post,) = await slack.wait_posts(1)
        assert post.text == "echo: still with me?"
        assert rig.channel.state != "failed"
    assert slack.calls["apps.connections.open"] == 2


async def test_disconnect_link_disabled_fails_the_channel(tmp_path, llm, slack):
    async with Rig(tmp_path, llm, slack) as rig:
        await slack.send_disconnect("link_disabled")
        for _ in range(50):
            if rig.channel.state == "failed":
                break
            await asyncio.sleep(0.02)
        assert rig.channel.state == "failed" and "Socket Mode" in rig.channel.state_detail
        await quiet()
    assert slack.connections == 1 and slack.calls["apps.connections.open"] == 1


async def test_unknown_web_api_method_is_refused_as_slack_does(tmp_path, llm, slack):
    async with Rig(tmp_path, llm, slack) as rig:
        assert rig.channel.web is not None
        with pytest.raises(SlackApiError) as caught:
            await rig.channel.web.api_call("chat.postEphemeralTypo")
    assert caught.value.response["error"] == "unknown_method"
    assert caught.value.response.status_code == 200


async def test_a_message_with_a_lone_surrogate_is_taken_and_answered(tmp_path, llm, slack):
    # JSON may carry "\ud800" alone; UTF-8 cannot hold it, and the journal refused the
    # message: never taken, redelivered by Slack and refused again, never answered.
    async with Rig(tmp_path, llm, slack):
        await slack.wait_connected(1)
        await slack.push_event(dm("bad \ud800 text", "1700000017.000300"), event_id="S1")
        (post,) = await slack.wait_posts(1)
        assert post.text == "echo: bad \ufffd text"
