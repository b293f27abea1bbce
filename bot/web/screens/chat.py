"""Chat: the owner talks to memobot from the browser, through the bus like any channel.

Each conversation is a session ``web:<name>`` of the panel's chat channel
(``channels.web_channel``), which a running gateway runs while its panel is on. A message is
a form POST the channel publishes (durable before the page hears "sent"); Stop is "/stop";
an approval question's buttons are presses, as a platform's buttons are. The transcript is
read from the session itself, so a reload shows what is there; while a turn runs, the page
reloads itself (without script) or its script (``static/chat.js``) follows the conversation's
event stream (SSE): the answer as it is written, tool calls, the turn's state, and a
"refresh" whenever the session has something new to show.

With ``memobot web`` alone (no gateway) nobody answers: the conversations are shown as they
are, and nothing that could not work is offered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import secrets
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from aiohttp import web

from bot.approvals import ApprovalDesk
from bot.bus import no_surrogates
from bot.gate.approval import APPROVAL_ID, CHOICES
from bot.session import SessionStore
from bot.session.reading import read_page
from bot.web.render import Html, join, tag, void
from bot.web.server import page_response, see_other
from bot.web.sessions import COOKIE
from bot.web.transcript import SHOWN_MESSAGES, Conversation, transcript_html
from bot.web.views import Frame, csrf_field, page, post_button, table
from channels.web_channel.channel import WebChannel
from channels.web_channel.spec import NAME as CHANNEL

if TYPE_CHECKING:
    from bot.web.server import Panel

log = logging.getLogger(__name__)
NAV = ("/chat", "Chat")

NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,47}")
# The send form's one-time id (``ONCE_FIELD``): a message posted twice (a double click, a
# browser resending the request) is one message, as a platform's redelivery is.
ONCE_FIELD = "once"
ONCE = re.compile(r"[0-9a-f]{16}")
KEEP_ALIVE_SECONDS = 25.0  # a comment on an idle event stream, so a dead one is noticed
RELOAD_SECONDS = 3  # how often a page without script reloads itself while a turn runs
MAX_MESSAGE_CHARS = 20_000
NO_GATEWAY = (
    "Chatting needs the running gateway (memobot gateway): nobody would answer now. The "
    "conversations are shown as they are."
)


@dataclass(frozen=True, slots=True)
class Live:
    """What a chat needs of the running gateway."""

    channel: WebChannel
    store: SessionStore
    desk: ApprovalDesk


def live_chat(panel: Panel) -> Live | None:
    gateway = panel.gateway
    if gateway is None:
        return None
    channel = gateway.manager.channels.get(CHANNEL)
    if not isinstance(channel, WebChannel):
        return None
    return Live(channel, gateway.stack.store, gateway.stack.loop.approvals)


def new_name(now: float | None = None) -> str:
    """A conversation's name: when it was started, and a few random letters."""
    stamp = time.strftime("%Y%m%d-%H%M", time.localtime(now))
    return f"{stamp}-{secrets.token_hex(2)}"


def conversations(store: SessionStore) -> list[tuple[str, float]]:
    """(name, last change) of every conversation, the latest first."""
    found = []
    for key in store.keys():
        channel, _, name = key.partition(":")
        if channel != CHANNEL:
            continue
        with contextlib.suppress(OSError):
            found.append((name, store.path_for(key).stat().st_mtime))
    return sorted(found, key=lambda f: f[1], reverse=True)


def read_conversation(store: SessionStore, name: str, desk: ApprovalDesk | None) -> Conversation:
    """The conversation as its session holds it: its newest messages, read from the files
    without loading the session whole, and its state as the store has it (in a worker
    thread: it reads the files)."""
    key = f"{CHANNEL}:{name}"
    path = store.path_for(key)
    state = store.peek_state(key)
    if state is None:
        return Conversation(name, ())
    shown = read_page(key, path, None, SHOWN_MESSAGES)
    for _ in range(3):
        # The state and the files are read at two moments: a turn that ended in between has
        # its messages in the files and its checkpoint still in the state read before, and
        # the page showed its tool calls twice. Read again until the two agree.
        now = store.peek_state(key)
        if now is None or (now.pending, now.checkpoint) == (state.pending, state.checkpoint):
            break
        state = now
        shown = read_page(key, path, None, SHOWN_MESSAGES)
    messages = [m for _, m in shown.messages if m is not None]
    question = desk.open_question(state) if desk is not None else None
    return Conversation(
        name, messages, state.pending, state.checkpoint, question, left_out=shown.start
    )


def routes(panel: Panel) -> list[web.RouteDef]:
    def store_of(live: Live | None) -> SessionStore:
        # The gateway's own store (its cache holds what a turn just wrote); alone, the files.
        return live.store if live is not None else SessionStore(panel.state_dir)

    def name_of(request: web.Request) -> str:
        name = request.match_info["name"]
        if not NAME.fullmatch(name):
            raise web.HTTPNotFound()
        return name

    def needs_live() -> Live:
        live = live_chat(panel)
        if live is None:
            raise web.HTTPConflict(text=NO_GATEWAY)
        return live

    async def conversation_of(name: str, live: Live | None) -> Conversation:
        store, desk = store_of(live), live.desk if live else None
        found = await asyncio.to_thread(read_conversation, store, name, desk)
        if live is None:
            return found
        return replace(found, writing=live.channel.writing(name), notes=live.channel.notes(name))

    async def index(request: web.Request) -> web.Response:
        live = live_chat(panel)
        found = await asyncio.to_thread(conversations, store_of(live))
        frame = panel.frame(request, await panel.gateway_running())
        return page_response(index_page(found, frame, live is not None))

    async def new(request: web.Request) -> web.Response:
        needs_live()
        return see_other(f"/chat/{new_name()}")

    async def show(request: web.Request) -> web.Response:
        name = name_of(request)
        live = live_chat(panel)
        conversation = await conversation_of(name, live)
        frame = panel.frame(request, await panel.gateway_running())
        # In a worker thread, as every rendering of a transcript: up to 200 of the model's
        # answers through Markdown is CPU work that must not hold the gateway's loop.
        shown = await asyncio.to_thread(conversation_page, conversation, frame, live is not None)
        return page_response(shown)

    async def transcript(request: web.Request) -> web.Response:
        """The transcript alone, for the page's script to put in place."""
        name = name_of(request)
        live = live_chat(panel)
        conversation = await conversation_of(name, live)
        csrf = panel.csrf() if live is not None else None
        return page_response(await asyncio.to_thread(transcript_html, conversation, csrf))

    async def events(request: web.Request) -> web.StreamResponse:
        name = name_of(request)
        live = needs_live()
        session_id = request.cookies.get(COOKIE)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        with live.channel.listen(name) as listener, contextlib.suppress(ConnectionError):
            # Sent at once (the headers with it): the browser's stream is open from here on,
            # and it reconnects within seconds when the panel restarts.
            await response.write(b"retry: 3000\n\n")
            # Ends with the panel, and at a logout or the session's expiry (the stream
            # outlives no session, and keeps none alive: it is no use of the panel).
            while panel.sessions.alive(session_id) and not panel.closing.is_set():
                if not await _woken(listener.wake, panel.closing, KEEP_ALIVE_SECONDS):
                    await response.write(b": still here\n\n")
                    continue
                # no_surrogates: a streamed reply's text is the provider's, as it came.
                lines = [f"event: {e}\ndata: {no_surrogates(d)}\n\n" for e, d in listener.take()]
                await response.write("".join(lines).encode("utf-8"))
        return response

    async def send(request: web.Request) -> web.Response:
        name = name_of(request)
        live = needs_live()
        form = await request.post()
        # A browser sends a textarea's line breaks as CRLF, and counts them as one character
        # for its maxlength: counted (and kept) as the model will see them.
        text = str(form.get("text", "")).replace("\r\n", "\n").strip()
        if not text:
            return await refused(request, name, live, "Nothing to send: the message was empty.")
        if len(text) > MAX_MESSAGE_CHARS:
            why = f"Not sent: more than {MAX_MESSAGE_CHARS:,} characters."
            return await refused(request, name, live, why, text)
        once = str(form.get(ONCE_FIELD, ""))
        verdict = await live.channel.say(name, text, once if ONCE.fullmatch(once) else None)
        if verdict == "refused":
            why = (
                "Not sent: memobot is stopping, or could not store it (the Logs say why). "
                "Send it again in a moment."
            )
            return await refused(request, name, live, why, text, 503)
        if verdict == "duplicate":
            log.info(
                "web chat: a message posted again was not sent twice session=%s:%s", CHANNEL, name
            )
        else:
            log.info("web chat: the owner wrote in session=%s:%s (by web)", CHANNEL, name)
        log.debug("web chat: session=%s:%s text=%r", CHANNEL, name, text)
        return see_other(f"/chat/{name}")

    async def refused(
        request: web.Request, name: str, live: Live, why: str, text: str = "", status: int = 422
    ) -> web.Response:
        """The conversation again, saying why the message was not sent, with its text still
        in the box: not a redirect (the page's script tells a refusal from "sent" by it, and
        the words are not lost)."""
        conversation = await conversation_of(name, live)
        frame = replace(panel.frame(request, True), notice=why)
        shown = await asyncio.to_thread(conversation_page, conversation, frame, True, text)
        return page_response(shown, status)

    async def stop(request: web.Request) -> web.Response:
        name = name_of(request)
        live = needs_live()
        log.info("web chat: stop asked in session=%s:%s by web", CHANNEL, name)
        await live.channel.say(name, "/stop")
        return see_other(f"/chat/{name}")

    async def answer(request: web.Request) -> web.Response:
        name = name_of(request)
        live = needs_live()
        form = await request.post()
        approval_id, choice = str(form.get("id", "")), str(form.get("choice", ""))
        if choice not in CHOICES or not APPROVAL_ID.fullmatch(approval_id):
            return panel.back(f"/chat/{name}", "That is not an answer to an approval.")
        log.info(
            "web chat: approval %s answered %s by web session=%s:%s",
            approval_id,
            choice,
            CHANNEL,
            name,
        )
        await live.channel.press(name, approval_id, choice)
        return see_other(f"/chat/{name}")

    return [
        web.get("/chat", index),
        web.post("/chat/new", new),
        web.get("/chat/{name}", show),
        web.get("/chat/{name}/transcript", transcript),
        web.get("/chat/{name}/events", events),
        web.post("/chat/{name}/send", send),
        web.post("/chat/{name}/stop", stop),
        web.post("/chat/{name}/answer", answer),
    ]


async def _woken(wake: asyncio.Event, closing: asyncio.Event, seconds: float) -> bool:
    """Wait until ``wake`` or ``closing`` is set, at most ``seconds``; whether ``wake`` was."""
    waits = [asyncio.ensure_future(wake.wait()), asyncio.ensure_future(closing.wait())]
    try:
        await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
    return wake.is_set() and not closing.is_set()


def index_page(found: list[tuple[str, float]], frame: Frame, live: bool) -> Html:
    parts: list[object] = []
    if live:
        parts.append(post_button("/chat/new", "New conversation", frame.csrf, True))
    else:
        parts.append(tag("p", NO_GATEWAY, class_="banner", role="status"))
    if found:
        rows: list[list[object]] = [
            [tag("a", name, href=f"/chat/{name}"), _when(at)] for name, at in found
        ]
        parts.append(table(("Conversation", "Last change"), rows))
    else:
        parts.append(tag("p", "No conversation yet.", class_="muted"))
    return page("Chat", join(parts), frame)


def _when(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(at))


def conversation_page(
    conversation: Conversation, frame: Frame, live: bool, draft: str = ""
) -> Html:
    """The conversation; ``draft``: the text of a message not sent, in the box again."""
    name = conversation.name
    head: list[Html] = [tag("script", "", src="/static/chat.js", defer=True)]
    if live and conversation.working:
        # Without script the page follows the turn by reloading itself; with it, the event
        # stream does (a meta refresh cannot be taken back once the page has it).
        refresh = void("meta", http_equiv="refresh", content=str(RELOAD_SECONDS))
        head.append(tag("noscript", refresh))
    top = [tag("a", "All conversations", href="/chat")]
    if live:
        top += [" ", post_button("/chat/new", "New conversation", frame.csrf)]
    parts: list[object] = [tag("div", join(top), class_="chat-top")]
    if not live:
        parts.append(tag("p", NO_GATEWAY, class_="banner", role="status"))
    csrf = frame.csrf if live else None
    parts.append(
        tag("div", transcript_html(conversation, csrf), id="transcript", class_="transcript")
    )
    if live:
        form = join(
            [
                csrf_field(frame.csrf),
                void("input", type="hidden", name=ONCE_FIELD, value=secrets.token_hex(8)),
                tag("label", "Message", for_="text", class_="muted"),
                tag(
                    "textarea",
                    draft,
                    id="text",
                    name="text",
                    rows="3",
                    required=True,
                    maxlength=str(MAX_MESSAGE_CHARS),
                ),
                tag("button", "Send", type="submit", class_="primary"),
            ]
        )
        parts.append(
            tag("form", form, method="post", action=f"/chat/{name}/send", id="say", class_="say")
        )
        parts.append(post_button(f"/chat/{name}/stop", "Stop", frame.csrf))
    body = tag("div", join(parts), id="chat", class_="chat", data_name=name)
    return page(f"Chat: {name}", body, frame, head=join(head))
