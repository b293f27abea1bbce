"""A local fake of Slack's Web API and Socket Mode WebSocket, for the real slack_sdk clients.

One aiohttp server on 127.0.0.1 serves both sides of the wire:

* Web API under ``/api/``: ``auth.test``, ``apps.connections.open`` (answers with this server's
  own ``ws://127.0.0.1:PORT/link/?ticket=N``), ``chat.postMessage`` (recorded; answers can be
  scripted: a 429 with ``Retry-After`` or any ``{"ok": false, "error": ...}``), ``users.info``.
  Tokens are checked like Slack does: a wrong one gets ``invalid_auth``; a method it does not
  know gets ``{"ok": false, "error": "unknown_method"}``. ``answer_raw`` makes a method answer
  a body labelled JSON that does not parse, as a proxy in front of Slack may (slack_sdk then
  raises a ``SlackApiError`` carrying aiohttp's response, not a ``SlackResponse``).
* ``chat.update`` and ``chat.delete`` of the bot's messages (``message_not_found`` for others);
  ``shown()`` is what each channel shows now, with the number of edits per message;
  ``unchanged_updates`` are the accepted updates that changed nothing.
* ``chat.postMessage`` is rate-limited like Slack's (about one message per second per channel):
  a faster post gets HTTP 429 ``ratelimited`` with ``Retry-After`` in whole seconds (tenths
  when ``post_interval`` is shortened below 1 s for tests), and is not posted
  (``rate_limited`` counts them).
* Slack's streaming methods for apps, with the rules Slack documents: ``chat.startStream``
  needs ``thread_ts`` (else ``invalid_arguments``) and, outside a DM, ``recipient_user_id`` and
  ``recipient_team_id`` (``missing_recipient_user_id`` / ``missing_recipient_team_id``);
  ``markdown_text`` holds at most 12,000 characters per call (``msg_too_long``);
  ``chat.appendStream`` / ``chat.stopStream`` refuse a message that is not streaming (stopped,
  or older than ``stream_lifetime``, about 5 minutes on Slack) with
  ``message_not_in_streaming_state``, and a wrong ts with ``message_not_found``.
  ``streaming_error`` makes ``chat.startStream`` answer that error (``unknown_method``,
  ``missing_scope``...: a workspace or app where streaming is not available). A streamed
  message keeps its Markdown in blocks: ``chat.update`` replaces what it shows only with
  ``blocks`` given (``[]`` removes them; Slack keeps a message's blocks otherwise). An update
  of a message still streaming is refused (``cant_update_message``): Slack documents no
  update of a live stream, so memobot stops a stream before it edits it.
  ``shown()`` entries carry ``streaming`` and ``appends``.
* ``/files/<name>``: downloads of registered files, only with the bot token as bearer;
  ``file_delay`` makes them slow; a file it does not hold answers 404 (deleted on Slack);
  the next ``file_failures`` downloads answer 503 (Slack's passing trouble).
  ``files.info`` describes the files a test put in ``file_info`` (``file_not_found``
  otherwise): Slack sends a Slack Connect channel's file in an event without its URL
  (``file_access: check_file_info``), and only ``files.info`` gives it.
* ``/link/``: the Socket Mode WebSocket. It greets with ``hello``; the test pushes
  ``events_api`` envelopes with ``push_event`` (``slash_commands`` with ``push_command``) and the
  server records every ack the client sends back (``acks``), calling ``on_ack`` at the moment
  each one arrives, and marks one that came after the deadline ``late``. An envelope not
  acknowledged within ``ack_deadline`` seconds (Slack: 3) is delivered again as a new
  envelope with the same ``event_id``, ``retry_attempt`` 1, 2, 3 and ``retry_reason``
  "timeout", as Slack does. ``send_disconnect`` sends a ``disconnect`` envelope and closes
  that connection shortly after. ``push_action`` clicks a Block Kit button of a posted
  message (an ``interactive`` envelope with a ``block_actions`` payload; only a
  button the message has can be clicked).

Use it as ``async with FakeSlack() as slack:`` and point the channel at ``slack.api_url``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import WSMsgType, web

BOT_TOKEN = "xoxb-test-bot-token"
APP_TOKEN = "xapp-test-app-token"
BOT_USER_ID = "UBOT0001"
BOT_ID = "BBOT0001"
TEAM_ID = "T0000001"
UPLOAD_LIMIT = 1024 * 1024 * 1024  # Slack: files up to 1 GB
APP_ID = "A0000001"


@dataclass(slots=True)
class Ack:
    envelope_id: str
    payload: dict[str, Any] | None
    at: float
    probe: Any = None  # what ``on_ack`` returned when this ack arrived
    late: bool = False  # past the ack deadline: Slack has already delivered it again


@dataclass(slots=True)
class Post:
    channel: str
    text: str
    thread_ts: str | None
    mrkdwn: bool | None
    ts: str
    body: dict[str, Any] = field(default_factory=dict)
    at: float = 0.0  # monotonic, when it was posted


class FakeSlack:
    def __init__(
        self,
        *,
        bot_token: str = BOT_TOKEN,
        app_token: str = APP_TOKEN,
        users: dict[str, dict[str, Any]] | None = None,
        ack_deadline: float = 3.0,
        max_retries: int = 3,
        post_interval: float = 1.0,
        streaming_error: str | None = None,
        stream_lifetime: float = 300.0,
    ) -> None:
        self.bot_token = bot_token
        self.app_token = app_token
        self.users = users or {}
        self.port = 0
        self.posts: list[Post] = []
        self.post_script: list[dict[str, Any]] = []  # FIFO of answers for chat.postMessage
        self._raw: dict[str, list[tuple[int, str]]] = {}  # method -> (status, body) to answer
        self.acks: list[Ack] = []
        self.on_ack: Callable[[str], Any] | None = None
        self.calls: dict[str, int] = {}
        self.uploads: list[dict[str, Any]] = []  # files shared by files.completeUploadExternal
        self.upload_error: str | None = None  # e.g. "missing_scope": an app without files:write
        self._pending_files: dict[str, dict[str, Any]] = {}
        self.files: dict[str, bytes] = {}
        self.file_auth: list[str | None] = []
        self.file_info: dict[str, dict[str, Any]] = {}  # file id -> files.info's "file"
        self.connections = 0
        self.ack_deadline = ack_deadline
        self.max_retries = max_retries
        self.post_interval = post_interval  # chat.postMessage: one per channel per interval
        self.rate_limited = 0
        self.file_delay = 0.0
        self.file_failures = 0  # the next downloads answered 503
        self.users_delay = 0.0  # a slow users.info
        self.deliveries: list[tuple[str, str, int]] = []  # (envelope id, event id, attempt)
        self._sent_at: dict[str, float] = {}  # envelope id -> when it was pushed (monotonic)
        self._last_post: dict[str, float] = {}
        self._last_update: dict[str, float] = {}
        self.shown_messages: dict[str, dict[str, Any]] = {}  # ts -> channel, text, edits
        self.updates: list[dict[str, Any]] = []  # accepted chat.update bodies
        # ... of them, those that left the message as it was (Slack takes them all the same)
        self.unchanged_updates: list[dict[str, Any]] = []
        self.streaming_error = streaming_error
        self.stream_lifetime = stream_lifetime
        self.streams: list[dict[str, Any]] = []  # accepted chat.startStream bodies (with ts)
        self.stream_calls: list[tuple[str, str, str | None]] = []  # (method, ts, error)
        self._timers: set[asyncio.Task[None]] = set()
        self._stopping = asyncio.Event()
        self._sockets: list[web.WebSocketResponse] = []
        self._envelopes = itertools.count(1)
        self._ts = itertools.count(1)
        self._changed = asyncio.Condition()
        self._runner: web.AppRunner | None = None

    # -- lifecycle --

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def api_url(self) -> str:
        return f"{self.url}/api/"

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/api/{method}", self._api)
        app.router.add_get("/files/{name}", self._file)
        app.router.add_post("/upload/{file_id}", self._upload)
        app.router.add_get("/link/", self._socket)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None and server.sockets
        self.port = server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        self._stopping.set()
        for timer in list(self._timers):
            timer.cancel()
        await asyncio.gather(*self._timers, return_exceptions=True)
        for ws in list(self._sockets):
            await ws.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeSlack:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- test controls --

    def add_file(self, name: str, data: bytes) -> str:
        """Register a file; returns its ``url_private``."""
        self.files[name] = data
        return f"{self.url}/files/{name}"

    def answer_raw(self, method: str, body: str, status: int = 200, times: int = 1) -> None:
        """The next ``times`` calls of ``method`` get ``body`` (labelled application/json,
        and not JSON) with ``status``; nothing else happens."""
        self._raw.setdefault(method, []).extend([(status, body)] * times)

    async def wait_connected(self, n: int = 1, timeout: float = 10.0) -> None:  # noqa: ASYNC109
        await self._wait(lambda: self.connections >= n and bool(self._sockets), timeout)

    async def push_event(
        self,
        event: dict[str, Any],
        event_id: str,
        *,
        retry_attempt: int = 0,
        retry_reason: str = "",
    ) -> str:
        """Send one ``events_api`` envelope to every connected client; returns its envelope id.

        Unacknowledged after ``ack_deadline`` seconds, it is delivered again (see the module)."""
        payload = {
            "token": "verification-token",
            "team_id": TEAM_ID,
            "api_app_id": APP_ID,
            "event": event,
            "type": "event_callback",
            "event_id": event_id,
            "event_time": int(time.time()),
            "authorizations": [{"team_id": TEAM_ID, "user_id": BOT_USER_ID, "is_bot": True}],
        }
        return await self._deliver("events_api", payload, event_id, retry_attempt, retry_reason)

    async def push_command(
        self, text: str, *, user: str, channel: str, command: str = "/memobot"
    ) -> str:
        """A slash command as Slack sends it over Socket Mode; returns its envelope id."""
        n = next(self._envelopes)
        payload = {
            "token": "verification-token",
            "team_id": TEAM_ID,
            "team_domain": "fake",
            "channel_id": channel,
            "channel_name": "directmessage" if channel.startswith("D") else "general",
            "user_id": user,
            "user_name": user.lower(),
            "command": command,
            "text": text,
            "api_app_id": APP_ID,
            "is_enterprise_install": "false",
            "response_url": f"{self.url}/commands/{n}",
            "trigger_id": f"trigger-{n}",
        }
        return await self._deliver("slash_commands", payload, f"command-{n}", 0, "")

    @staticmethod
    def buttons(post: Post) -> list[dict[str, Any]]:
        """The Block Kit buttons a posted message carries."""
        blocks = post.body.get("blocks") or []
        if isinstance(blocks, str):  # form-encoded posts carry JSON text
            blocks = json.loads(blocks)
        return [
            e
            for b in blocks
            if b.get("type") == "actions"
            for e in b.get("elements") or []
            if e.get("type") == "button"
        ]

    async def push_action(self, post: Post, action_id: str, *, user: str) -> str:
        """``user`` clicks the button ``action_id`` on ``post``; returns the envelope id."""
        button = next((b for b in self.buttons(post) if b.get("action_id") == action_id), None)
        assert button is not None, f"no button {action_id!r} on that message"
        n = next(self._envelopes)
        message: dict[str, Any] = {"type": "message", "ts": post.ts, "text": post.text}
        if post.thread_ts:
            message["thread_ts"] = post.thread_ts
        payload = {
            "type": "block_actions",
            "team": {"id": TEAM_ID, "domain": "fake"},
            "user": {"id": user, "username": user.lower(), "team_id": TEAM_ID},
            "api_app_id": APP_ID,
            "token": "verification-token",
            "container": {"type": "message", "message_ts": post.ts, "channel_id": post.channel},
            "trigger_id": f"trigger-{n}",
            "channel": {"id": post.channel, "name": "general"},
            "message": message,
            "response_url": f"{self.url}/actions/{n}",
            "actions": [
                {
                    "type": "button",
                    "action_id": action_id,
                    "block_id": "approval",
                    "text": button.get("text"),
                    "value": button.get("value", ""),
                    "action_ts": f"{time.time():.6f}",
                }
            ],
        }
        return await self._deliver("interactive", payload, f"action-{n}", 0, "")

    async def _deliver(
        self, kind: str, payload: dict[str, Any], event_id: str, attempt: int, reason: str
    ) -> str:
        envelope_id = f"env-{next(self._envelopes)}"
        envelope: dict[str, Any] = {
            "envelope_id": envelope_id,
            "type": kind,
            "accepts_response_payload": kind != "events_api",
            "payload": payload,
        }
        if kind == "events_api":
            envelope["retry_attempt"] = attempt
            envelope["retry_reason"] = reason
        self.deliveries.append((envelope_id, event_id, attempt))
        self._sent_at[envelope_id] = time.monotonic()
        await self.push_raw(envelope)
        if kind == "events_api" and attempt < self.max_retries:
            timer = asyncio.create_task(self._redeliver(envelope_id, payload, event_id, attempt))
            self._timers.add(timer)
            timer.add_done_callback(self._timers.discard)
        return envelope_id

    async def _redeliver(
        self, envelope_id: str, payload: dict[str, Any], event_id: str, attempt: int
    ) -> None:
        await asyncio.sleep(self.ack_deadline)
        if self.acked(envelope_id):
            return
        # Slack holds it until an app connection is there again.
        async with self._changed:
            await self._changed.wait_for(lambda: bool(self._sockets))
        await self._deliver("events_api", payload, event_id, attempt + 1, "timeout")

    async def send_disconnect(self, reason: str, close_after: float = 0.2) -> None:
        """A ``disconnect`` envelope (``warning``, ``refresh_requested``, ``link_disabled``) on
        every connection, which Slack then closes."""
        sockets = list(self._sockets)
        message = {"type": "disconnect", "reason": reason, "debug_info": {"host": "fake"}}
        for ws in sockets:
            await ws.send_str(json.dumps(message))
        await asyncio.sleep(close_after)
        for ws in sockets:
            await ws.close()

    async def push_raw(self, message: dict[str, Any]) -> None:
        if not self._sockets:
            raise RuntimeError("no Socket Mode client is connected")
        for ws in list(self._sockets):
            await ws.send_str(json.dumps(message))

    async def drop_connections(self) -> None:
        """Close every WebSocket as Slack does when it rotates a connection."""
        for ws in list(self._sockets):
            await ws.close()

    async def wait_ack(self, envelope_id: str, timeout: float = 10.0) -> Ack:  # noqa: ASYNC109
        await self._wait(lambda: any(a.envelope_id == envelope_id for a in self.acks), timeout)
        return next(a for a in self.acks if a.envelope_id == envelope_id)

    def acked(self, envelope_id: str) -> bool:
        return any(a.envelope_id == envelope_id for a in self.acks)

    async def wait_posts(self, n: int, timeout: float = 10.0) -> list[Post]:  # noqa: ASYNC109
        await self._wait(lambda: len(self.posts) >= n, timeout)
        return list(self.posts)

    async def _wait(self, predicate: Callable[[], bool], seconds: float) -> None:
        async with asyncio.timeout(seconds), self._changed:
            await self._changed.wait_for(predicate)

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    # -- Web API --

    @staticmethod
    def _ok(**data: Any) -> web.Response:
        return web.json_response({"ok": True, **data})

    @staticmethod
    def _error(error: str, status: int = 200, headers: dict[str, str] | None = None):
        return web.json_response({"ok": False, "error": error}, status=status, headers=headers)

    async def _api(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        self.calls[method] = self.calls.get(method, 0) + 1
        if self._raw.get(method):
            status, text = self._raw[method].pop(0)
            return web.Response(text=text, status=status, content_type="application/json")
        token = request.headers.get("Authorization", "").removeprefix("Bearer ")
        body: dict[str, Any] = dict(request.query)
        if request.content_type == "application/json":
            body.update(await request.json())
        elif request.method == "POST":
            body.update(await request.post())
        if method == "apps.connections.open":
            if token != self.app_token:
                return self._error("invalid_auth")
            return self._ok(url=f"ws://127.0.0.1:{self.port}/link/?ticket={self.connections + 1}")
        if token != self.bot_token:
            return self._error("invalid_auth")
        if method == "auth.test":
            return self._ok(
                url="https://fake.slack.test/",
                team="Fake",
                user="memobot",
                team_id=TEAM_ID,
                user_id=BOT_USER_ID,
                bot_id=BOT_ID,
            )
        if method == "chat.postMessage":
            return await self._post_message(body)
        if method == "chat.update":
            return await self._update(body)
        if method == "chat.startStream":
            return await self._start_stream(body)
        if method in ("chat.appendStream", "chat.stopStream"):
            return await self._stream_call(method, body)
        if method == "chat.delete":
            if self.shown_messages.pop(str(body.get("ts")), None) is None:
                return self._error("message_not_found")
            await self._notify()
            return self._ok(channel=body.get("channel"), ts=body.get("ts"))
        if method == "files.getUploadURLExternal":
            return self._upload_url(body)
        if method == "files.completeUploadExternal":
            return await self._complete_upload(body)
        if method == "files.info":
            info = self.file_info.get(str(body.get("file")))
            return self._ok(file=info) if info is not None else self._error("file_not_found")
        if method == "users.info":
            if self.users_delay:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), self.users_delay)
            user = self.users.get(str(body.get("user")))
            if user is None:
                return self._error("user_not_found")
            return self._ok(user=user)
        return self._error("unknown_method")

    def _upload_url(self, body: dict[str, Any]) -> web.Response:
        """Step 1 of an upload: Slack wants the name and the exact length up front."""
        if self.upload_error is not None:
            return self._error(self.upload_error)
        filename, length = str(body.get("filename") or ""), str(body.get("length") or "")
        if not filename or not length.isdigit():
            return self._error("invalid_arguments")
        if int(length) > UPLOAD_LIMIT:
            return self._error("file_too_large")
        file_id = f"F{len(self._pending_files) + len(self.uploads) + 1:08d}"
        self._pending_files[file_id] = {"filename": filename, "length": int(length)}
        return self._ok(
            upload_url=f"http://127.0.0.1:{self.port}/upload/{file_id}", file_id=file_id
        )

    async def _upload(self, request: web.Request) -> web.Response:
        """Step 2: the bytes, to the URL step 1 gave (no token: the URL is the secret)."""
        pending = self._pending_files.get(request.match_info["file_id"])
        data = await request.read()
        if pending is None or len(data) != pending["length"]:
            return web.Response(status=400, text="bad upload")
        pending["data"] = data
        return web.Response(text=f"OK - {len(data)}")

    async def _complete_upload(self, body: dict[str, Any]) -> web.Response:
        """Step 3: the uploaded files are shared into the channel (or thread)."""
        try:
            files = json.loads(str(body.get("files") or "[]"))
        except ValueError:
            return self._error("invalid_arguments")
        done = []
        for f in files:
            pending = self._pending_files.pop(str(f.get("id")), None)
            if pending is None or "data" not in pending:
                return self._error("file_not_found")
            self.uploads.append(
                {
                    "channel": body.get("channel_id"),
                    "thread_ts": body.get("thread_ts"),
                    "filename": pending["filename"],
                    "data": pending["data"],
                }
            )
            done.append({"id": f.get("id"), "title": f.get("title")})
        await self._notify()
        return self._ok(files=done)

    def shown(self, channel: str | None = None) -> list[dict[str, Any]]:
        """The bot's messages as the channel shows them now, oldest first."""
        for m in self.shown_messages.values():
            self._streaming(m)  # a stream past its lifetime shows as ended
        return [
            {"ts": ts, **m}
            for ts, m in sorted(self.shown_messages.items())
            if channel is None or m["channel"] == channel
        ]

    def _limited(self, last_by_channel: dict[str, float], channel: str) -> web.Response | None:
        now = time.monotonic()
        last = last_by_channel.get(channel)
        if last is not None and now - last < self.post_interval:
            self.rate_limited += 1
            remaining = self.post_interval - (now - last)
            # Slack sends whole seconds; a window shortened for tests gets tenths.
            wait = (
                str(max(1, math.ceil(remaining))) if self.post_interval >= 1 else f"{remaining:.2f}"
            )
            return self._error("ratelimited", status=429, headers={"Retry-After": wait})
        return None

    async def _update(self, body: dict[str, Any]) -> web.Response:
        channel, ts = str(body.get("channel")), str(body.get("ts"))
        shown = self.shown_messages.get(ts)
        if shown is None or shown["channel"] != channel:
            return self._error("message_not_found")
        if self._streaming(shown):
            return self._error("cant_update_message")
        limited = self._limited(self._last_update, channel)
        if limited is not None:
            return limited
        text = str(body.get("text", ""))
        if len(text) > 40000:
            return self._error("msg_too_long")
        self._last_update[channel] = time.monotonic()
        before = (shown["text"], bool(shown.get("blocks")))
        if "blocks" in body:
            shown["blocks"] = bool(body["blocks"] not in ([], "[]", ""))
        if not shown.get("blocks"):  # blocks kept: they, not the text, are what shows
            shown["text"] = text
        shown["edits"] += 1
        shown["updated_at"] = time.monotonic()
        self.updates.append(body)
        if (shown["text"], bool(shown.get("blocks"))) == before:
            self.unchanged_updates.append(body)
        await self._notify()
        return self._ok(channel=channel, ts=ts, text=text)

    # -- streaming --

    MARKDOWN_TEXT_MAX = 12000  # characters of markdown_text per streaming call

    def _streaming(self, shown: dict[str, Any]) -> bool:
        """Whether ``shown`` is still a live stream (Slack ends one after its lifetime)."""
        if not shown.get("streaming"):
            return False
        if time.monotonic() - shown["started"] > self.stream_lifetime:
            shown["streaming"] = False
        return bool(shown["streaming"])

    async def _start_stream(self, body: dict[str, Any]) -> web.Response:
        channel = str(body.get("channel") or "")
        thread_ts = body.get("thread_ts")
        text = body.get("markdown_text") or ""
        error = None
        if self.streaming_error:
            error = self.streaming_error
        elif not channel or not thread_ts:
            error = "invalid_arguments"
        elif not channel.startswith("D") and not body.get("recipient_user_id"):
            error = "missing_recipient_user_id"
        elif not channel.startswith("D") and not body.get("recipient_team_id"):
            error = "missing_recipient_team_id"
        elif len(text) > self.MARKDOWN_TEXT_MAX:
            error = "msg_too_long"
        if error is not None:
            self.stream_calls.append(("chat.startStream", "", error))
            return self._error(error)
        ts = f"1700000100.{next(self._ts):06d}"
        self.streams.append({**body, "ts": ts, "at": time.monotonic()})
        self.stream_calls.append(("chat.startStream", ts, None))
        self.shown_messages[ts] = {
            "channel": channel,
            "text": text,
            "edits": 0,
            "appends": 0,
            "streaming": True,
            "started": time.monotonic(),
            "blocks": True,  # a streamed message's Markdown is in blocks
            "thread_ts": thread_ts,
        }
        await self._notify()
        return self._ok(channel=channel, ts=ts)

    async def _stream_call(self, method: str, body: dict[str, Any]) -> web.Response:
        channel, ts = str(body.get("channel") or ""), str(body.get("ts") or "")
        shown = self.shown_messages.get(ts)
        text = body.get("markdown_text")
        error = None
        if shown is None or shown["channel"] != channel:
            error = "message_not_found"
        elif not self._streaming(shown):
            error = "message_not_in_streaming_state"
        elif method == "chat.appendStream" and not text:
            error = "invalid_arguments"
        elif len(text or "") > self.MARKDOWN_TEXT_MAX:
            error = "msg_too_long"
        self.stream_calls.append((method, ts, error))
        if error is not None:
            return self._error(error)
        assert shown is not None
        shown["text"] += text or ""
        if method == "chat.appendStream":
            shown["appends"] += 1
        else:
            shown["streaming"] = False
        await self._notify()
        return self._ok(channel=channel, ts=ts)

    def stream_ended(self, ts: str) -> None:
        """Slack ends the stream ``ts`` on its side (its lifetime passed)."""
        self.shown_messages[ts]["streaming"] = False

    async def _post_message(self, body: dict[str, Any]) -> web.Response:
        channel = str(body.get("channel"))
        now = time.monotonic()
        limited = self._limited(self._last_post, channel)
        if limited is not None:
            return limited
        if self.post_script:
            step = self.post_script.pop(0)
            if "retry_after" in step:
                return self._error(
                    "ratelimited", status=429, headers={"Retry-After": str(step["retry_after"])}
                )
            return self._error(step["error"], status=step.get("status", 200))
        mrkdwn = body.get("mrkdwn")
        if isinstance(mrkdwn, str):
            mrkdwn = mrkdwn.lower() in ("1", "true")
        self._last_post[channel] = now
        ts = f"1700000100.{next(self._ts):06d}"
        self.posts.append(
            Post(
                channel=str(body.get("channel")),
                text=str(body.get("text", "")),
                thread_ts=body.get("thread_ts"),
                mrkdwn=mrkdwn,
                ts=ts,
                body=body,
                at=now,
            )
        )
        self.shown_messages[ts] = {
            "channel": channel,
            "text": str(body.get("text", "")),
            "edits": 0,
        }
        await self._notify()
        return self._ok(channel=body.get("channel"), ts=ts)

    async def _file(self, request: web.Request) -> web.Response:
        auth = request.headers.get("Authorization")
        self.file_auth.append(auth)
        await self._notify()  # a test may wait for a download to have begun
        if self.file_delay:
            with contextlib.suppress(TimeoutError):  # a slow download ends when the fake stops
                await asyncio.wait_for(self._stopping.wait(), self.file_delay)
        if self.file_failures:  # Slack's passing trouble
            self.file_failures -= 1
            raise web.HTTPServiceUnavailable()
        data = self.files.get(request.match_info["name"])
        if data is None:
            raise web.HTTPNotFound()
        if auth != f"Bearer {self.bot_token}":
            # Slack answers an unauthenticated file request with its HTML login page.
            return web.Response(text="<html>sign in</html>", content_type="text/html")
        return web.Response(body=data, content_type="application/octet-stream")

    # -- Socket Mode --

    async def _socket(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(autoping=True)
        await ws.prepare(request)
        self.connections += 1
        self._sockets.append(ws)
        await ws.send_str(
            json.dumps(
                {
                    "type": "hello",
                    "num_connections": 1,
                    "debug_info": {"host": "fake", "approximate_connection_time": 3600},
                    "connection_info": {"app_id": APP_ID},
                }
            )
        )
        await self._notify()
        try:
            async for msg in ws:
                if msg.type != WSMsgType.TEXT:
                    continue
                data = json.loads(msg.data)
                if "envelope_id" in data:
                    envelope_id = data["envelope_id"]
                    probe = self.on_ack(envelope_id) if self.on_ack else None
                    now = time.monotonic()
                    sent = self._sent_at.get(envelope_id, now)
                    late = now - sent > self.ack_deadline
                    self.acks.append(Ack(envelope_id, data.get("payload"), now, probe, late))
                    await self._notify()
        finally:
            self._sockets.remove(ws)
            await self._notify()
        return ws
