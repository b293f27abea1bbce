"""The panel's chat through the real gateway pieces in this process (the agent loop, the channel
manager and the panel's chat channel) against the fake model: a message goes through the bus
and is answered as it is written, the transcript is the session's, an approval is answered
with its button, Stop stops, the model's HTML is shown as text, and nothing without a session
(the model's tools included) can drive the chat."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp

from bot.bus import MessageBus, OutboundMessage, StreamEvent
from bot.config import load_config
from bot.gateway import Gateway
from bot.session import SessionStore
from bot.web.screens import chat as chat_screen
from bot.web.screens.chat import NO_GATEWAY
from bot.web.transcript import SHOWN_MESSAGES
from channels.base import Channel
from channels.errors import FatalChannelError
from channels.manager import ChannelManager
from channels.web_channel.channel import WebChannel
from tests.fakes.llm_server import FakeLLM, reply, tool_step
from tests.helpers import write_config
from tests.helpers.web import Browser, browsing, chatting, panel_section

NAME = "first"
HERE = f"/chat/{NAME}"
KEY = f"web:{NAME}"
QUESTION_ID = re.compile(r'name="id" value="(ap-[0-9a-f]{12})"')


def config(tmp_path: Path, llm: FakeLLM, **tools: Any) -> tuple[Any, Path]:
    path = write_config(tmp_path, llm.base_url, web=panel_section(), tools=tools)
    cfg, _ = load_config(path)
    return cfg, path


@asynccontextmanager
async def running(
    tmp_path: Path, *steps: Any, **tools: Any
) -> AsyncIterator[tuple[FakeLLM, Gateway, Browser]]:
    """The fake model with ``steps`` scripted, a gateway's pieces with the panel, and a
    logged-in browser of it."""
    async with FakeLLM() as llm:
        llm.script(*steps)
        cfg, path = config(tmp_path, llm, **tools)
        async with chatting(cfg, path) as (gateway, browser):
            await browser.login()
            yield llm, gateway, browser


class Events:
    """A browser tab's event stream of one conversation, read as the page's script reads it."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self.response = response
        self.seen: list[tuple[str, Any]] = []

    async def until(self, event: str, test: Any = lambda data: True) -> Any:
        """Read until an ``event`` whose data passes ``test``; that data."""
        name = None
        async with asyncio.timeout(15):
            async for raw in self.response.content:
                line = raw.decode().rstrip("\n")
                if line.startswith("event: "):
                    name = line.removeprefix("event: ")
                elif line.startswith("data: ") and name is not None:
                    data = json.loads(line.removeprefix("data: "))
                    self.seen.append((name, data))
                    if name == event and test(data):
                        return data
                    name = None
        raise AssertionError(f"the stream ended before {event}: {self.seen}")


@asynccontextmanager
async def events(browser: Browser, path: str = HERE) -> AsyncIterator[Events]:
    async with browser.http.get(browser.base + path + "/events") as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
        yield Events(r)


async def say(browser: Browser, text: str, name: str = NAME) -> None:
    csrf = await browser.csrf(f"/chat/{name}")
    status, body, r = await browser.post(f"/chat/{name}/send", {"text": text, "csrf": csrf})
    assert status == 303 and r.headers["Location"] == f"/chat/{name}", body


async def transcript(browser: Browser) -> str:
    status, text, _ = await browser.get(HERE + "/transcript")
    assert status == 200
    return text


async def test_an_answer_shows_as_it_is_written_and_the_page_reads_the_session(tmp_path):
    answer = reply("Hello **there**: a list of things.", pieces=4, hold="half")
    async with running(tmp_path, answer) as (llm, gateway, browser):
        async with events(browser) as stream:
            await say(browser, "hi, memobot")
            # Held after its first piece: the text so far reaches the tab, and a page
            # loaded now shows it too, reloading itself (no script) while the turn runs.
            data = await stream.until("text")
            assert data["text"] and "Hello **there**: a list of things.".startswith(data["text"])
            assert data["text"] != "Hello **there**: a list of things."
            _, page, _ = await browser.get(HERE)
            assert 'id="live"' in page and data["text"] in page
            assert '<noscript><meta http-equiv="refresh"' in page
            assert "memobot is answering" in page
            # Through the bus like any channel: a durable pending turn, the owner's.
            [pending] = gateway.stack.store.get(KEY).state.pending
            assert pending["text"] == "hi, memobot" and pending["sender_id"] == "owner"
            llm.release("half")
            await stream.until("state", lambda d: d["state"] == "done")
            await stream.until("refresh")
        _, page, _ = await browser.get(HERE)
        assert "Hello <b>there</b>: a list of things." in page
        assert "hi, memobot" in page and "runtime context" not in page
        assert 'http-equiv="refresh"' not in page and "memobot is answering" not in page
        session = gateway.stack.store.get(KEY)
        roles = [m["role"] for m in session.messages]
        assert roles == ["user", "assistant"]
        body = llm.requests[0]["body"]
        assert body["stream"] is True
        # The owner's turn: every tool (a guest's private chat is offered no exec).
        assert {"exec", "write_file"} <= {t["function"]["name"] for t in body["tools"]}
        # Several conversations: a new one has a name of its own, listed once used.
        csrf = await browser.csrf(HERE)
        status, _, r = await browser.post("/chat/new", {"csrf": csrf})
        other = r.headers["Location"]
        assert status == 303 and other.startswith("/chat/") and other != HERE
        await say(browser, "and here?", other.removeprefix("/chat/"))
        await gateway.stack.loop.wait_idle(f"web:{other.removeprefix('/chat/')}")
        _, index, _ = await browser.get("/chat")
        assert f'href="{HERE}"' in index and f'href="{other}"' in index


async def test_a_tool_call_waits_for_its_button_and_runs_once_allowed(tmp_path):
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "notes.txt").write_text("buy <i>milk</i>")
    steps = (
        tool_step(("read_file", {"path": "notes.txt"}), text="Let me look."),
        reply("The note says: buy <b>milk</b>."),
    )
    async with running(tmp_path, *steps, approval="always") as (llm, gateway, browser):
        async with events(browser) as stream:
            await say(browser, "what is in my notes?")
            await stream.until("state", lambda d: d["state"] == "waiting")
            _, page, _ = await browser.get(HERE)
            assert "Approval needed" in page and "read_file" in page
            assert 'http-equiv="refresh"' not in page  # waiting for the owner: no reloads
            for label in ("Allow once", "Always allow this exact call", "Deny"):
                assert f">{label}</button>" in page
            [approval_id] = set(QUESTION_ID.findall(page))
            assert len(llm.requests) == 1  # nothing ran yet
            csrf = await browser.csrf(HERE)
            answer = {"id": approval_id, "choice": "once", "csrf": csrf}
            status, _, _ = await browser.post(HERE + "/answer", answer)
            assert status == 303
            await stream.until("state", lambda d: d["state"] == "done")
        page = await transcript(browser)
        # The call as a folded line, its result inside; the answer; the press's notice.
        assert '<details class="tool"><summary>↳ read_file(' in page
        assert "buy &lt;i&gt;milk&lt;/i&gt;" in page
        assert "The note says: buy &lt;b&gt;milk&lt;/b&gt;." in page
        assert "Allowed once." in page and "Approval needed" not in page
        tool_results = [m for m in gateway.stack.store.get(KEY).messages if m["role"] == "tool"]
        assert [m["content"] for m in tool_results] == ["buy <i>milk</i>"]


async def test_stop_ends_the_answer_being_written(tmp_path):
    story = reply("A long story that goes on and on and on.", pieces=6, hold="mid")
    async with running(tmp_path, story) as (llm, _gateway, browser):
        async with events(browser) as stream:
            await say(browser, "tell me a story")
            written = (await stream.until("text"))["text"]
            csrf = await browser.csrf(HERE)
            status, _, _ = await browser.post(HERE + "/stop", {"csrf": csrf})
            assert status == 303
            await stream.until("state", lambda d: d["state"] == "done")
        llm.release("mid")
        page = await transcript(browser)
        assert f"{written.rstrip()}\n\n(stopped)" in page
        assert "Stopping the current answer." in page  # /stop's own reply, a notice


async def test_the_models_html_never_reaches_the_page_as_html(tmp_path):
    hostile = (
        '<script>alert(1)</script><img src=x onerror="alert(2)"> '
        "[click](javascript:alert(3)) **bold** [site](https://example.org)"
    )
    async with running(tmp_path, reply(hostile)) as (_llm, gateway, browser):
        await say(browser, "<b>me</b> too")
        await gateway.stack.loop.wait_idle(KEY)
        for text in (await transcript(browser), (await browser.get(HERE))[1]):
            assert "<script>alert" not in text and "<img" not in text
            assert "&lt;script&gt;alert(1)&lt;/script&gt;&lt;img src=x onerror=" in text
            assert "javascript:" not in text.replace("(javascript:alert(3))", "")
            assert 'href="javascript' not in text
            assert "<b>bold</b>" in text
            assert '<a href="https://example.org" rel="noopener noreferrer nofollow">' in text
            assert "&lt;b&gt;me&lt;/b&gt; too" in text  # the owner's words: text too


async def test_the_chat_cannot_be_driven_without_a_session(tmp_path):
    async with running(tmp_path) as (llm, gateway, browser):
        csrf = await browser.csrf(HERE)
        async with aiohttp.ClientSession() as stranger:
            headers = {"Origin": browser.base}
            form = {"text": "hello", "csrf": csrf}  # even with a token seen elsewhere
            for action in ("send", "stop", "answer"):
                async with stranger.post(
                    f"{browser.base}{HERE}/{action}", data=form, headers=headers
                ) as r:
                    assert r.status == 403 and "Log in first" in await r.text()
            async with stranger.get(f"{browser.base}{HERE}/events") as r:
                assert r.url.path == "/login"  # no stream without a session
        # A logged-in browser still needs the form's token and its own origin.
        status, _, _ = await browser.post(HERE + "/send", {"text": "hello"})
        assert status == 403
        status, _, _ = await browser.post(
            HERE + "/send", {"text": "hello", "csrf": csrf}, origin="http://evil.example"
        )
        assert status == 403
        assert llm.requests == [] and gateway.stack.store.keys() == []


async def test_the_models_tools_cannot_reach_the_panel(tmp_path):
    """The model's web_fetch refuses the panel's loopback address (and a GET could change
    nothing anyway); what its commands ask the panel they ask without a session
    (test_web_security.py)."""
    async with running(tmp_path) as (llm, gateway, browser):
        target = f"{browser.base}/chat/other/send?text=hello"
        llm.script(tool_step(("web_fetch", {"url": target})), reply("I could not."))
        await say(browser, "fetch it")
        await gateway.stack.loop.wait_idle(KEY)
        [result] = [m for m in gateway.stack.store.get(KEY).messages if m["role"] == "tool"]
        assert "loopback" in result["content"]
        assert gateway.stack.store.keys() == [KEY]  # no web:other


async def test_without_a_gateway_the_chat_offers_nothing_that_cannot_work(tmp_path):
    """It shows what the session holds (a long one: its newest messages) and nothing to do."""
    async with FakeLLM() as llm:
        cfg, path = config(tmp_path, llm)
        store = SessionStore(cfg.agent.state_path)
        said = [
            {"role": "user" if i % 2 == 0 else "assistant", "content": f"line {i}"}
            for i in range(SHOWN_MESSAGES + 6)
        ]
        store.append(store.get(KEY), said)
        async with browsing(cfg, path) as browser:
            await browser.login()
            _, page, _ = await browser.get(HERE)
            assert "6 earlier messages are not shown" in page
            assert 'href="/chats/view?key=web%3Afirst"' in page  # the whole of it, paged
            assert "line 5<" not in page and "line 6<" in page and f"line {len(said) - 1}<" in page
            _, index, _ = await browser.get("/chat")
            assert NO_GATEWAY in index and "New conversation" not in index
            assert NO_GATEWAY in page
            assert "<textarea" not in page and "/send" not in page and "Stop" not in page
            csrf = await browser.csrf("/chat")
            status, _, _ = await browser.post(HERE + "/send", {"text": "hi", "csrf": csrf})
            assert status == 409 and llm.requests == []


class Platform(Channel):
    name = "telegram"

    async def send_chunk(
        self, msg: OutboundMessage, chunk: str, plain: bool = False, *, first: bool = False
    ) -> None:
        pass


def test_the_panels_chat_keeps_no_gateway_running_whose_platforms_all_failed():
    bus = MessageBus()
    platform = Platform(bus)
    manager = ChannelManager(bus, None, [platform, WebChannel(bus)])  # type: ignore[arg-type]
    failed: list[list[Channel]] = []
    manager.on_all_failed = failed.append
    platform.fail(FatalChannelError("token refused"))
    assert [[c.name for c in channels] for channels in failed] == [["telegram"]]


async def test_a_logout_ends_the_event_stream(tmp_path, monkeypatch):
    monkeypatch.setattr(chat_screen, "KEEP_ALIVE_SECONDS", 0.05)
    async with running(tmp_path) as (_llm, _gateway, browser):
        csrf = await browser.csrf(HERE)
        async with events(browser) as stream:
            status, _, _ = await browser.post("/logout", {"csrf": csrf})
            assert status == 303
            async with asyncio.timeout(10):
                rest = await stream.response.content.read()  # to its end
            assert stream.response.content.at_eof() and b"event:" not in rest


async def test_a_turn_cut_by_a_restart_is_answered_after_it(tmp_path):
    """The panel's chat is one of the gateway's channels: its interrupted turns are resumed
    at the next start, and the answer is in the transcript."""
    async with FakeLLM() as llm:
        llm.script(reply("Half an answ", hold="never"), reply("Answered after the restart."))
        cfg, path = config(tmp_path, llm)
        async with chatting(cfg, path) as (_gateway, browser):
            await browser.login()
            async with events(browser) as stream:
                await say(browser, "are you there?")
                await stream.until("text")
        async with chatting(cfg, path) as (gateway, browser):
            await browser.login()
            await gateway.stack.loop.wait_idle(KEY)
            page = await transcript(browser)
            assert "are you there?" in page and "Answered after the restart." in page
            assert page.count('class="msg you"') == 1  # answered once, asked once


def form_once(page: str) -> str:
    found = re.search(r'name="once" value="([0-9a-f]{16})"', page)
    assert found, page
    return found.group(1)


async def test_a_refused_message_is_said_so_with_its_text_kept(tmp_path):
    """A refusal is no redirect (the page's script took every redirect for "sent" and
    emptied the box): the page says why, its text still in the box. Line breaks count once,
    as the browser's maxlength counts them, though it posts them as CRLF."""
    async with running(tmp_path, reply("Got it.")) as (_llm, gateway, browser):
        csrf = await browser.csrf(HERE)
        lines = "ab\r\n" * 6000  # 24,000 characters posted, 18,000 in the box
        status, _, _ = await browser.post(HERE + "/send", {"text": lines, "csrf": csrf})
        assert status == 303
        await gateway.stack.loop.wait_idle(KEY)
        [said] = [m for m in gateway.stack.store.get(KEY).messages if m["role"] == "user"]
        assert "\r" not in str(said["content"])
        too_long = "x" * 20_001 + "</textarea><b>"
        status, page, _ = await browser.post(HERE + "/send", {"text": too_long, "csrf": csrf})
        assert status == 422 and "Not sent: more than 20,000 characters." in page
        assert f"{'x' * 20_001}&lt;/textarea&gt;&lt;b&gt;</textarea>" in page
        gateway.stack.bus.accepting = False  # memobot stopping
        status, page, _ = await browser.post(HERE + "/send", {"text": "later", "csrf": csrf})
        assert status == 503 and "memobot is stopping" in page and ">later</textarea>" in page
        assert len(gateway.stack.store.get(KEY).messages) == 2


async def test_a_message_posted_twice_is_sent_once(tmp_path):
    """The same form posted again (a double click, a browser resending the request) is one
    message; the next form is a new one."""
    async with running(tmp_path, reply("One."), reply("Two.")) as (llm, gateway, browser):
        _, page, _ = await browser.get(HERE)
        once, csrf = form_once(page), await browser.csrf(HERE)
        form = {"text": "hello", "csrf": csrf, "once": once}
        for _ in range(2):
            status, _, r = await browser.post(HERE + "/send", form)
            assert status == 303 and r.headers["Location"] == HERE
        await gateway.stack.loop.wait_idle(KEY)
        _, page, _ = await browser.get(HERE)
        assert form_once(page) != once
        await say(browser, "hello")  # the same words in a new form: a message of its own
        await gateway.stack.loop.wait_idle(KEY)
        said = [m for m in gateway.stack.store.get(KEY).messages if m["role"] == "user"]
        assert len(said) == 2 and len(llm.requests) == 2


async def test_the_state_line_is_the_sessions(tmp_path):
    """The line saying memobot answers is read with the transcript: a command's reply (a
    notice, no streamed turn ends) leaves it empty, a turn under way sets it."""
    story = reply("A story.", pieces=2, hold="half")
    async with running(tmp_path, story) as (llm, _gateway, browser):
        await say(browser, "/help")
        page = await transcript(browser)
        assert "/stop" in page and '<p id="state" class="state" role="status"></p>' in page
        async with events(browser) as stream:
            await say(browser, "tell me a story")
            await stream.until("text")
            assert "memobot is answering" in await transcript(browser)
            llm.release("half")
            await stream.until("state", lambda d: d["state"] == "done")
        assert '<p id="state" class="state" role="status"></p>' in await transcript(browser)


async def test_an_answer_names_an_approval_or_is_refused(tmp_path, caplog):
    async with running(tmp_path) as (_llm, _gateway, browser):
        csrf = await browser.csrf(HERE)
        form = {"id": "ap-1\nFORGED log line", "choice": "once", "csrf": csrf}
        status, _, _ = await browser.post(HERE + "/answer", form)
        assert status == 303
        assert "FORGED" not in caplog.text
        assert "That is not an answer to an approval." in (await browser.get(HERE))[1]


async def test_the_event_stream_ends_when_its_session_expires(tmp_path, monkeypatch):
    """An open stream is no use of the panel: it keeps no session alive and outlives none."""
    monkeypatch.setattr(chat_screen, "KEEP_ALIVE_SECONDS", 0.05)
    async with running(tmp_path) as (_llm, _gateway, browser):
        sessions = browser.panel.sessions
        async with events(browser) as stream:
            now = sessions.clock()
            sessions.clock = lambda: now + sessions.idle_seconds + 1
            async with asyncio.timeout(10):
                await stream.response.content.read()  # to its end
            assert stream.response.content.at_eof()


async def test_a_transcript_is_rendered_off_the_gateways_loop(tmp_path, monkeypatch):
    """Rendering 200 of the model's answers is CPU work (a long answer's Markdown takes
    tenths of a second): in a worker thread, never on the loop every chat runs on."""
    on_loop: list[bool] = []

    def rendering(text: str) -> str:
        try:
            asyncio.get_running_loop()
            on_loop.append(True)
        except RuntimeError:
            on_loop.append(False)
        return text

    monkeypatch.setattr("bot.web.transcript.markdown_to_html", rendering)
    async with running(tmp_path, reply("Hello.")) as (_llm, gateway, browser):
        await say(browser, "hi")
        await gateway.stack.loop.wait_idle(KEY)
        await transcript(browser)
        await browser.get(HERE)
        csrf = await browser.csrf(HERE)
        await browser.post(HERE + "/send", {"text": "x" * 20_001, "csrf": csrf})
        assert on_loop and not any(on_loop), on_loop


def test_a_streamed_reply_is_made_json_once_per_read_not_per_piece(monkeypatch):
    """Each piece of a streaming reply is the whole text so far: a tab's queue keeps only the
    latest, and serialising every piece as it came (thousands of them, each up to the whole
    answer) held the loop for seconds per tab on a long answer."""
    import channels.web_channel.channel as web

    made: list[object] = []
    dumps = json.dumps
    monkeypatch.setattr(
        web.json, "dumps", lambda data, **kw: made.append(data) or dumps(data, **kw)
    )
    listener = web.Listener()
    text = "word " * 20_000
    for i in range(1000):
        listener.push("text", {"text": text[: 100 * i]})
    listener.push("state", {"state": "done"})
    taken = listener.take()
    assert [e for e, _ in taken] == ["text", "state"]
    assert json.loads(taken[0][1]) == {"text": text[:99_900]}
    assert len(made) == 2


async def test_a_lone_surrogate_the_model_wrote_breaks_no_page(tmp_path):
    """A tool call's arguments holding JSON's "\\udc00" (valid text until decoded) made the
    conversation's page a 500 for good; a streamed text holding one broke the event stream."""
    async with running(tmp_path) as (_llm, gateway, browser):
        call = {"id": "c1", "function": {"name": "exec", "arguments": '{"a": "x\\udc00y"}'}}
        store = gateway.stack.store
        store.append(
            store.get(KEY),
            [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "done"},
            ],
        )
        for path in (HERE, HERE + "/transcript", "/chats/view?key=web%3Afirst"):
            status, page, _ = await browser.get(path)
            assert status == 200 and "x\ufffdy" in page
        channel = gateway.manager.channels["web"]
        async with events(browser) as stream:
            channel.show_stream(StreamEvent("web", NAME, "web-m-1", "text", "half \ud83d"))
            assert await stream.until("text") == {"text": "half \ufffd"}
