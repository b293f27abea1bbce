"""A local fake of the Telegram Bot API for tests and benchmarks, spoken to by the real
python-telegram-bot through its ``base_url`` / ``base_file_url``.

It implements the HTTP shapes PTB uses at ``/bot<token>/<method>`` (form-encoded parameters,
``{"ok": ..., "result": ...}`` answers) and ``/file/bot<token>/<path>`` downloads:

* inline keyboards: ``reply_markup`` is recorded with each message (``markup``), a test
  presses a button with ``press`` (a ``callback_query`` update, as Telegram sends it; its
  ``data`` must be one of the message's buttons), ``answerCallbackQuery`` is recorded and
  refused for an unknown query id or when answered twice, as Telegram does;
* ``getUpdates`` with the real offset semantics: a call with ``offset=N`` *confirms* every update
  below N (they are forgotten), returns the queued updates from N on, and long-polls up to
  ``timeout`` seconds when there are none;
* ``sendMessage`` (recorded; HTML markup is checked and broken markup answers 400 "can't parse
  entities" as Telegram does), ``editMessageText`` (400 "message is not modified" when the
  visible text and its formatting entities stay the same, as Telegram compares them: a plain
  "a & b" edited into HTML "a &amp; b" is not modified; "message to edit not found" for an
  unknown one; edits are counted per message),
  ``deleteMessage``, ``sendDocument`` (multipart uploads up to 50 MB, kept in ``documents()``),
  ``sendMessageDraft`` (Bot API 9.3: private chats only, a non-zero
  ``draft_id``, 0 to 4,096 UTF-16 units, nothing stored), ``sendChatAction``, ``getFile``,
  ``getMe``, ``deleteWebhook``. The bot's messages as the chat now shows them are kept
  (``shown``), so tests count permanent copies;
* Telegram's length rules: text is measured after entity parsing (tags removed, entities
  decoded) in UTF-16 code units, 4,096 for a message or an edit ("Bad Request: message is too
  long") and 1,024 for a caption ("Bad Request: message caption is too long");
* Telegram's flood control when asked (``flood=FloodControl(...)``): per chat, per group and
  per bot, answered 429 with ``retry_after``;
* scriptable failures per method (``fail("sendMessage", 429, retry_after=1)``, a 409 conflict on
  ``getUpdates``, a 401), answers the SDK cannot read (``garble``: 200 with a result that is
  not a Message, e.g. ``result: null`` as telegram-test-api answers an edit, or
  ``NO_RESULT``, ``{"ok": true}`` alone, so python-telegram-bot raises an exception of no
  Telegram type), and an
  ``after_get_updates`` hook that runs once the answer carrying
  updates has been written (crash tests kill the daemon there);
* an older Bot API server (``missing_methods``): a method it does not know answers 404 "Not
  Found: method not found", as telegram-bot-api answers every unknown method (with a valid
  token; python-telegram-bot raises ``InvalidToken`` for it, as for a 401).

Updates are injected with helpers (``private_text``, ``group_text``, ``photo``...). Three ways to
run it: in-process (``async with FakeBotAPI() as api``), in a daemon thread for synchronous and
subprocess tests (``FakeBotAPI.start_in_thread()``), and ``python -m tests.fakes.telegram_api``.
Every public method is thread-safe.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import html
import itertools
import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.fakes.threaded import ServerThread

DEFAULT_TOKEN = "123456:TEST-TOKEN"
BOT_ID = 123456
BOT_USERNAME = "memobot_test_bot"
TEXT_LIMIT = 4096  # UTF-16 code units after entity parsing: messages and edits
CAPTION_LIMIT = 1024
DOCUMENT_LIMIT = 50 * 1024 * 1024  # what a bot may upload
# Parameters that stay strings; PTB JSON-encodes every other (non-string) value it sends.
_STRING_PARAMS = frozenset({"text", "parse_mode", "action", "file_id", "caption", "url"})
_HTML_TAGS = frozenset(
    {
        "b", "strong", "i", "em", "u", "ins", "s", "strike", "del", "a", "code", "pre",
        "span", "tg-spoiler", "tg-emoji", "blockquote",
    }
)  # fmt: skip
_TAG = re.compile(r"<(/?)([A-Za-z][A-Za-z0-9-]*)((?:\s[^<>]*)?)>")
_ENTITY = re.compile(r"&(?:lt|gt|amp|quot|#[0-9]+|#x[0-9A-Fa-f]+);")

Params = dict[str, Any]
Hook = Callable[[list[int]], None]


def html_problem(text: str) -> str | None:
    """Why Telegram would refuse ``text`` as parse_mode=HTML, or None if it parses.

    A simplified version of the server's check: only the supported tags, properly nested, and
    no bare ``<`` or ``&`` outside a tag or a character entity.
    """
    stack: list[str] = []
    pos = 0
    while pos < len(text):
        ch = text[pos]
        if ch == "<":
            m = _TAG.match(text, pos)
            if not m:
                return f"Unexpected end of name token at byte offset {pos}"
            closing, name = m.group(1) == "/", m.group(2).lower()
            if name not in _HTML_TAGS:
                return f'Unsupported start tag "{name}" at byte offset {pos}'
            if closing:
                if not stack or stack[-1] != name:
                    return f"Unexpected end tag at byte offset {pos}"
                stack.pop()
            else:
                stack.append(name)
            pos = m.end()
        elif ch == "&":
            m = _ENTITY.match(text, pos)
            if not m:
                return f"Unsupported entity at byte offset {pos}"
            pos = m.end()
        else:
            pos += 1
    if stack:
        return f'Can\'t find end tag corresponding to start tag "{stack[-1]}"'
    return None


def strip_html(text: str) -> str:
    """The text Telegram keeps of parse_mode=HTML: tags removed, entities (named and numeric)
    decoded. Only call it on text ``html_problem`` accepted."""
    return html.unescape(_TAG.sub("", text))


# Tags Telegram parses into the same entity type.
_ENTITY_TYPE = {"strong": "b", "em": "i", "ins": "u", "strike": "s", "del": "s"}


def html_entities(text: str) -> list[tuple[str, str, int, int]]:
    """The formatting entities Telegram makes of parse_mode=HTML ``text``: (type, attributes,
    UTF-16 offset, length) in order, empty ones dropped. Only call it on text ``html_problem``
    accepted. Plain text (no parse_mode) has none."""
    found: list[tuple[str, str, int, int]] = []
    opened: list[tuple[str, str, int]] = []
    pos = offset = 0
    for m in _TAG.finditer(text):
        offset += utf16_len(html.unescape(text[pos : m.start()]))
        pos = m.end()
        if m.group(1) != "/":
            name = m.group(2).lower()
            opened.append((_ENTITY_TYPE.get(name, name), m.group(3).strip(), offset))
            continue
        kind, attributes, start = opened.pop()
        if offset > start:
            found.append((kind, attributes, start, offset - start))
    return sorted(found, key=lambda e: (e[2], -e[3], e[0]))


def utf16_len(text: str) -> int:
    """Telegram measures entity offsets and lengths in UTF-16 code units."""
    return len(text.encode("utf-16-le")) // 2


def mention_entities(text: str, username: str) -> list[dict[str, Any]]:
    """The ``mention`` entities Telegram would attach for every ``@username`` in ``text``."""
    out = []
    for m in re.finditer(rf"@{re.escape(username)}\b", text):
        out.append(
            {"type": "mention", "offset": utf16_len(text[: m.start()]), "length": utf16_len(m[0])}
        )
    return out


@dataclass
class Call:
    """One API request as the fake saw it; ``at`` is its arrival, ``status`` 0 until answered."""

    method: str
    params: Params
    status: int = 200
    at: float = field(default_factory=time.monotonic)
    result: Any = None
    returned: list[int] = field(default_factory=list)  # getUpdates: update ids answered
    garbled: bool = False  # answered with a result the SDK cannot read (not delivered)


@dataclass(frozen=True)
class FloodControl:
    """Telegram's flood rules as the fake enforces them on sendMessage, editMessageText and
    sendMessageDraft:
    at most ``chat`` sends per ``chat_window`` seconds into one chat, ``group`` per
    ``group_window`` into one group (negative chat id), ``bot`` per ``bot_window`` in all.
    One more is answered 429 with ``retry_after`` (whole seconds, as Telegram sends them,
    unless ``fractional``: windows shortened for tests get hundredths)."""

    chat: int = 3
    chat_window: float = 1.0
    group: int = 20
    group_window: float = 60.0
    bot: int = 30
    bot_window: float = 1.0
    fractional: bool = False


NO_RESULT: Any = object()  # garble: an answer {"ok": true} without a result


@dataclass
class Failure:
    status: int
    description: str
    retry_after: float | None = None
    times: int = 1
    when: Callable[[Params], bool] | None = None
    delay: float = 0.0
    garble: bool = False
    result: Any = None  # garble: the result answered
    delivered: bool = False  # garble: the call was carried out all the same
    body: Any = None  # garble: the whole JSON answered instead of Telegram's (a proxy's)


class FakeBotAPI:
    """The fake server. See the module docstring.

    Args:
        token: the only token accepted; any other answers 401 Unauthorized.
        username: the bot's @username (``getMe``).
        host, port: where to listen (port 0 picks a free one).
        reply_delay: seconds before each sendMessage answers (benchmarks).
        missing_methods: Bot API methods this server does not know (404, see the module
            docstring), e.g. ``("sendMessageDraft",)`` for a server older than Bot API 9.3.
    """

    def __init__(
        self,
        *,
        token: str = DEFAULT_TOKEN,
        username: str = BOT_USERNAME,
        bot_id: int = BOT_ID,
        host: str = "127.0.0.1",
        port: int = 0,
        reply_delay: float = 0.0,
        flood: FloodControl | None = None,
        missing_methods: tuple[str, ...] = (),
    ) -> None:
        self.token = token
        self.missing_methods = frozenset(m.lower() for m in missing_methods)
        self.username = username
        self.bot_id = bot_id
        self.host = host
        self.port = port
        self.reply_delay = reply_delay
        self.flood = flood
        self.flooded = 0  # sends answered 429 by ``flood``
        self._flood_log: dict[str, list[float]] = {}  # bucket -> times of accepted sends
        self.after_get_updates: Hook | None = None
        self._lock = threading.Condition()
        self._updates: list[dict[str, Any]] = []
        self._update_ids = itertools.count(1000)
        self._message_ids = itertools.count(1)
        self._calls: list[Call] = []
        self._failures: dict[str, list[Failure]] = {}
        self._files: dict[str, tuple[str, bytes]] = {}  # file_id -> (file_path, content)
        self._chats: dict[int, dict[str, Any]] = {}
        # (chat id, message id) -> the bot's message as the chat shows it now
        self._shown: dict[tuple[int | str, int], dict[str, Any]] = {}
        self._documents: list[dict[str, Any]] = []  # sendDocument uploads, in order
        self.edits: dict[tuple[int | str, int], int] = {}  # edits accepted, per message
        self._queries: set[str] = set()  # callback_query ids handed out by ``press``
        self._runner: web.AppRunner | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._new_update: asyncio.Event | None = None
        self._stopping: asyncio.Event | None = None

    # -- addresses --

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """``channels.telegram.baseUrl``: PTB appends the token."""
        return f"{self.url}/bot"

    @property
    def base_file_url(self) -> str:
        return f"{self.url}/file/bot"

    @property
    def bot_user(self) -> dict[str, Any]:
        return {
            "id": self.bot_id,
            "is_bot": True,
            "first_name": "Memobot",
            "username": self.username,
            "can_join_groups": True,
            "can_read_all_group_messages": False,
            "supports_inline_queries": False,
        }

    # -- scripting (any thread) --

    def fail(
        self,
        method: str,
        status: int,
        description: str = "",
        *,
        retry_after: float | None = None,
        times: int = 1,
        when: Callable[[Params], bool] | None = None,
        delay: float = 0.0,
    ) -> None:
        """Answer the next ``times`` calls of ``method`` (matching ``when``) with an error.

        ``delay`` holds the answer back that long first; status 0 means no error at all, only
        the delay (a stalled connection).
        """
        description = description or _DEFAULT_ERRORS.get(status, "Error")
        with self._lock:
            self._failures.setdefault(method.lower(), []).append(
                Failure(status, description, retry_after, times, when, delay)
            )

    def garble(
        self,
        method: str,
        *,
        times: int = 1,
        when: Callable[[Params], bool] | None = None,
        result: Any = "garbled",
        delivered: bool = False,
        body: Any = None,
    ) -> None:
        """Answer the next ``times`` calls of ``method`` (matching ``when``) with HTTP 200 and
        ``result``, of the wrong shape (``None``: ``"result": null``); nothing is delivered,
        unless ``delivered``: then the call is carried out first (a server that did the send
        and answered oddly, as a 200 says it did). python-telegram-bot then raises a plain
        Python exception (AttributeError; KeyError for ``NO_RESULT``, an answer without a
        result), not a TelegramError. ``body``: the whole answer is that JSON instead, not
        Telegram's {"ok": ...} (a proxy or gateway in the way that answered 200); a string
        is answered as an HTML page (a captive portal)."""
        with self._lock:
            self._failures.setdefault(method.lower(), []).append(
                Failure(
                    200,
                    "",
                    None,
                    times,
                    when,
                    0.0,
                    True,
                    result=result,
                    delivered=delivered,
                    body=body,
                )
            )

    def add_file(self, content: bytes, suffix: str = ".jpg") -> dict[str, Any]:
        """Register a downloadable file; returns its ids and size, as in a PhotoSize."""
        folder = "photos" if suffix == ".jpg" else "documents"
        with self._lock:
            n = len(self._files) + 1
            file_id, unique = f"file-{n}-{time.monotonic_ns()}", f"uniq{n}x{time.monotonic_ns()}"
            self._files[file_id] = (f"{folder}/file_{n}{suffix}", content)
        return {"file_id": file_id, "file_unique_id": unique, "file_size": len(content)}

    def inject(self, message: dict[str, Any], kind: str = "message") -> int:
        """Queue an update carrying ``message``; returns its update_id."""
        with self._lock:
            update_id = next(self._update_ids)
            self._chats.setdefault(message["chat"]["id"], message["chat"])
            self._updates.append({"update_id": update_id, kind: message})
            self._lock.notify_all()
        self._wake()
        return update_id

    def inject_many(self, messages: list[dict[str, Any]]) -> list[int]:
        """Queue several updates at once, so one getUpdates answer carries them all."""
        with self._lock:
            ids = []
            for message in messages:
                update_id = next(self._update_ids)
                self._chats.setdefault(message["chat"]["id"], message["chat"])
                self._updates.append({"update_id": update_id, "message": message})
                ids.append(update_id)
            self._lock.notify_all()
        self._wake()
        return ids

    # -- message builders (plain dicts in the Bot API's shape) --

    def user(self, user_id: int = 1001, username: str | None = "alice", is_bot: bool = False):
        u: dict[str, Any] = {"id": user_id, "is_bot": is_bot, "first_name": f"User{user_id}"}
        if username:
            u["username"] = username
        return u

    def message(
        self,
        text: str | None,
        *,
        chat: dict[str, Any],
        sender: dict[str, Any],
        entities: list[dict[str, Any]] | None = None,
        reply_to: dict[str, Any] | None = None,
        thread_id: int | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        msg: dict[str, Any] = {
            "message_id": next(self._message_ids),
            "date": int(time.time()),
            "chat": chat,
            "from": sender,
            **extra,
        }
        if text is not None:
            msg["text"] = text
        if entities:
            msg["entities"] = entities
        if reply_to is not None:
            msg["reply_to_message"] = reply_to
        if thread_id is not None:
            msg["message_thread_id"] = thread_id
            msg["is_topic_message"] = True
        return msg

    def private_chat(self, user_id: int = 1001) -> dict[str, Any]:
        return {"id": user_id, "type": "private", "first_name": f"User{user_id}"}

    def group_chat(self, chat_id: int = -1001234, forum: bool = False) -> dict[str, Any]:
        chat = {"id": chat_id, "type": "supergroup", "title": "Test group"}
        if forum:
            chat["is_forum"] = True
        return chat

    def private_text(
        self, text: str, user_id: int = 1001, username: str | None = "alice", **kw: Any
    ) -> int:
        sender = self.user(user_id, username)
        return self.inject(self.message(text, chat=self.private_chat(user_id), sender=sender, **kw))

    def group_text(
        self,
        text: str,
        *,
        user_id: int = 1001,
        chat_id: int = -1001234,
        mention: bool | None = None,
        reply_to_bot: bool = False,
        thread_id: int | None = None,
        is_bot: bool = False,
        entities: list[dict[str, Any]] | None = None,
    ) -> int:
        """A group message. ``mention`` None/True: a mention entity for every ``@<bot>`` in the
        text, as Telegram would attach; False: none. ``entities`` replaces them outright."""
        if entities is None:
            entities = mention_entities(text, self.username) if mention is not False else []
        reply_to = self.bot_message(chat_id) if reply_to_bot else None
        if thread_id is not None and reply_to is None:
            # Telegram sets reply_to_message in a topic to the topic's creation message.
            reply_to = {
                "message_id": thread_id,
                "date": int(time.time()),
                "chat": self.group_chat(chat_id, forum=True),
                "from": self.user(1001, "alice"),
                "forum_topic_created": {"name": "topic", "icon_color": 7322096},
            }
        return self.inject(
            self.message(
                text,
                chat=self.group_chat(chat_id, forum=thread_id is not None),
                sender=self.user(user_id, f"user{user_id}", is_bot=is_bot),
                entities=entities,
                reply_to=reply_to,
                thread_id=thread_id,
            )
        )

    def bot_message(self, chat_id: int, text: str = "an earlier answer") -> dict[str, Any]:
        return {
            "message_id": next(self._message_ids),
            "date": int(time.time()),
            "chat": self._chats.get(chat_id) or self.group_chat(chat_id),
            "from": self.bot_user,
            "text": text,
        }

    def photo(
        self,
        content: bytes,
        caption: str | None = None,
        user_id: int = 1001,
        chat: dict[str, Any] | None = None,
    ) -> int:
        """A photo in three sizes; only the largest carries ``content``."""
        big = self.add_file(content, ".jpg")
        small = self.add_file(content[: max(1, len(content) // 10)], ".jpg")
        sizes = [
            {**small, "width": 90, "height": 60},
            {**big, "width": 1280, "height": 853},
        ]
        extra: dict[str, Any] = {"photo": sizes}
        if caption is not None:
            extra["caption"] = caption
        return self.inject(
            self.message(
                None,
                chat=chat or self.private_chat(user_id),
                sender=self.user(user_id, "alice"),
                **extra,
            )
        )

    # -- inspection (any thread) --

    # -- inline keyboards --

    @staticmethod
    def markup(call: Call) -> list[list[dict[str, Any]]]:
        """The inline keyboard a sendMessage carried (rows of buttons), [] when none."""
        markup = call.params.get("reply_markup")
        if not isinstance(markup, dict):
            return []
        return list(markup.get("inline_keyboard") or [])

    def press(self, sent: Call, data: str, user_id: int = 1001, username: str = "alice") -> int:
        """Press the button with callback ``data`` on the bot's message ``sent`` (a successful
        sendMessage), as ``user_id``: queues the ``callback_query`` update Telegram sends.
        A button the message does not have cannot be pressed (AssertionError)."""
        buttons = [b.get("callback_data") for row in self.markup(sent) for b in row]
        assert data in buttons, f"no button {data!r} on that message (buttons: {buttons})"
        with self._lock:
            update_id = next(self._update_ids)
            query_id = f"cq{update_id}"
            self._queries.add(query_id)
            self._updates.append(
                {
                    "update_id": update_id,
                    "callback_query": {
                        "id": query_id,
                        "from": self.user(user_id, username),
                        "message": sent.result,
                        "chat_instance": f"ci{sent.result['chat']['id']}",
                        "data": data,
                    },
                }
            )
            self._lock.notify_all()
        self._wake()
        return update_id

    def calls(self, method: str | None = None) -> list[Call]:
        with self._lock:
            return [c for c in self._calls if method is None or c.method == method.lower()]

    def calls_since(self, start: int) -> list[Call]:
        """Every call from number ``start`` on: for a watcher that reads the log as it grows
        (a copy of the whole log each time costs more the longer a soak runs)."""
        with self._lock:
            return self._calls[start:]

    def sent(self, chat_id: int | str | None = None) -> list[Call]:
        """Successful sendMessage calls, optionally to one chat."""
        return [
            c
            for c in self.calls("sendMessage")
            if c.status == 200
            and not c.garbled
            and (chat_id is None or str(c.params.get("chat_id")) == str(chat_id))
        ]

    def shown(self, chat_id: int | str | None = None) -> list[dict[str, Any]]:
        """The bot's messages the chat shows now (sent, edited, not deleted), oldest first;
        each with ``text`` (visible text), ``message_id`` and ``edits``."""
        with self._lock:
            return [
                {**m, "edits": self.edits.get(k, 0)}
                for k, m in sorted(self._shown.items(), key=lambda kv: kv[0][1])
                if chat_id is None or str(k[0]) == str(chat_id)
            ]

    def drafts(self, chat_id: int | str | None = None) -> list[Call]:
        """Accepted sendMessageDraft calls, optionally to one chat."""
        return [
            c
            for c in self.calls("sendMessageDraft")
            if c.status == 200 and (chat_id is None or str(c.params.get("chat_id")) == str(chat_id))
        ]

    @property
    def pending_updates(self) -> list[int]:
        """Ids of updates not yet confirmed by an offset."""
        with self._lock:
            return [u["update_id"] for u in self._updates]

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        """Block until ``predicate()`` (evaluated after every call) holds; TimeoutError else."""
        with self._lock:
            if not self._lock.wait_for(predicate, timeout):
                raise TimeoutError("the fake Bot API did not see what was expected in time")

    async def wait_for_async(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:  # noqa: ASYNC109 - same shape as wait_for
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise TimeoutError("the fake Bot API did not see what was expected in time")
            await asyncio.sleep(0.005)

    def wait_sent(
        self, n: int, chat_id: int | str | None = None, timeout: float = 10.0
    ) -> list[Call]:
        self.wait_for(lambda: len(self.sent(chat_id)) >= n, timeout)
        return self.sent(chat_id)

    async def wait_sent_async(
        self,
        n: int,
        chat_id: int | str | None = None,
        timeout: float = 10.0,  # noqa: ASYNC109 - same shape as wait_sent
    ) -> list[Call]:
        await self.wait_for_async(lambda: len(self.sent(chat_id)) >= n, timeout)
        return self.sent(chat_id)

    # -- lifecycle --

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._new_update = asyncio.Event()
        self._stopping = asyncio.Event()
        app = web.Application(client_max_size=DOCUMENT_LIMIT + 1024 * 1024)
        app.router.add_route("*", "/bot{token}/{method}", self._handle_method)
        app.router.add_get("/file/bot{token}/{path:.+}", self._handle_file)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        server = site._server
        assert server is not None and server.sockets
        self.port = server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._runner is None:
            return
        assert self._stopping is not None
        self._stopping.set()
        await asyncio.sleep(0)
        await self._runner.cleanup()
        self._runner = None

    async def __aenter__(self) -> FakeBotAPI:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @classmethod
    def start_in_thread(cls, **kwargs: Any) -> FakeBotAPIThread:
        return FakeBotAPIThread(cls(**kwargs))

    def _wake(self) -> None:
        loop, event = self._loop, self._new_update
        if loop is None or event is None or loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            event.set()
        else:
            loop.call_soon_threadsafe(event.set)

    # -- request handling --

    async def _handle_method(self, request: web.Request) -> web.StreamResponse:
        method = request.match_info["method"].lower()
        params = await _read_params(request)
        call = Call(method, params, status=0)  # logged on arrival; status 0 until answered
        with self._lock:
            self._calls.append(call)
        request["call"] = call
        if request.match_info["token"] != self.token:
            return self._answer(request, 401, "Unauthorized")
        if method in self.missing_methods:
            return self._answer(request, 404, "Not Found: method not found")
        failure = self._take_failure(method, params)
        if failure is not None and failure.delay:
            assert self._stopping is not None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), failure.delay)
        if failure is not None and failure.garble:
            handler = getattr(self, f"_m_{method}", None)
            if failure.delivered and handler is not None:
                await handler(request, params)
            call.garbled = True
            if failure.body is not None:
                with self._lock:
                    call.status, call.result = 200, failure.body
                    self._lock.notify_all()
                if isinstance(failure.body, str):  # a page, not JSON (a captive portal)
                    return web.Response(text=failure.body, content_type="text/html")
                return web.json_response(failure.body)
            return self._answer(request, 200, failure.result)
        if failure is not None and failure.status:
            extra = {"retry_after": failure.retry_after} if failure.retry_after else None
            return self._answer(request, failure.status, failure.description, extra)
        wait = self._flood_wait(method, params)
        if wait is not None:
            return self._answer(
                request, 429, f"Too Many Requests: retry after {wait:g}", {"retry_after": wait}
            )
        handler = getattr(self, f"_m_{method}", None)
        if handler is None:
            return self._answer(request, 404, "Not Found: method not found")
        return await handler(request, params)

    def _flood_wait(self, method: str, params: Params) -> float | None:
        """Seconds to tell the client to wait if this send breaks a flood rule; else None,
        and the send is counted."""
        rules = self.flood
        if rules is None or method not in ("sendmessage", "editmessagetext", "sendmessagedraft"):
            return None
        chat = _chat_id(params.get("chat_id"))
        buckets = [
            ("bot", rules.bot, rules.bot_window),
            (f"chat:{chat}", rules.chat, rules.chat_window),
        ]
        if isinstance(chat, int) and chat < 0:
            buckets.append((f"group:{chat}", rules.group, rules.group_window))
        now = time.monotonic()
        wait = 0.0
        with self._lock:
            for key, limit, window in buckets:
                recent = [t for t in self._flood_log.get(key, []) if now - t < window]
                self._flood_log[key] = recent
                if len(recent) >= limit:
                    wait = max(wait, recent[-limit] + window - now)
            if wait > 0:
                self.flooded += 1
                return (
                    round(wait + 0.005, 2) if rules.fractional else float(max(1, -int(-wait // 1)))
                )
            for key, _, _ in buckets:
                self._flood_log[key].append(now)
        return None

    def _take_failure(self, method: str, params: Params) -> Failure | None:
        with self._lock:
            for f in self._failures.get(method, []):
                if f.times > 0 and (f.when is None or f.when(params)):
                    f.times -= 1
                    return f
        return None

    def _answer(
        self,
        request: web.Request,
        status: int,
        result: Any,
        parameters: dict[str, Any] | None = None,
        returned: list[int] | None = None,
    ) -> web.Response:
        call: Call = request["call"]
        with self._lock:
            call.status, call.result, call.returned = status, result, returned or []
            self._lock.notify_all()
        if status == 200:
            return web.json_response(
                {"ok": True} if result is NO_RESULT else {"ok": True, "result": result}
            )
        body: dict[str, Any] = {"ok": False, "error_code": status, "description": result}
        if parameters:
            body["parameters"] = parameters
        return web.json_response(body, status=status)

    async def _m_getme(self, request: web.Request, params: Params) -> web.Response:
        return self._answer(request, 200, self.bot_user)

    async def _m_deletewebhook(self, request: web.Request, params: Params) -> web.Response:
        return self._answer(request, 200, True)

    async def _m_getupdates(self, request: web.Request, params: Params) -> web.StreamResponse:
        offset = params.get("offset")
        limit = int(params.get("limit") or 100)
        deadline = time.monotonic() + float(params.get("timeout") or 0)
        assert self._new_update is not None and self._stopping is not None
        while True:
            self._new_update.clear()
            with self._lock:
                if offset is not None:
                    # Confirmation: everything below the offset is forgotten for good.
                    self._updates = [u for u in self._updates if u["update_id"] >= int(offset)]
                batch = self._updates[:limit]
            remaining = deadline - time.monotonic()
            if batch or remaining <= 0 or self._stopping.is_set():
                break
            waiter = asyncio.ensure_future(self._new_update.wait())
            stop = asyncio.ensure_future(self._stopping.wait())
            await asyncio.wait({waiter, stop}, timeout=remaining, return_when="FIRST_COMPLETED")
            for t in (waiter, stop):
                t.cancel()
        ids = [u["update_id"] for u in batch]
        response = self._answer(request, 200, batch, returned=ids)
        hook = self.after_get_updates
        if not ids or hook is None:
            return response
        try:
            await response.prepare(request)
            await response.write_eof()
        except ConnectionResetError:  # the client is gone: it never saw these updates
            return response
        hook(ids)  # the answer has left: a crash test may kill the daemon right now
        return response

    async def _m_sendmessage(self, request: web.Request, params: Params) -> web.Response:
        if self.reply_delay:
            await asyncio.sleep(self.reply_delay)
        text = str(params.get("text") or "")
        problem = self._send_problem(params, text)
        if problem:
            return self._answer(request, 400, f"Bad Request: {problem}")
        shown, entities = _parsed(params, text)
        said = self._bot_said(params, shown)
        with self._lock:
            key = (_chat_id(params.get("chat_id")), said["message_id"])
            self._shown[key] = {
                "message_id": said["message_id"],
                "text": shown,
                "entities": entities,
            }
        return self._answer(request, 200, said)

    def _send_problem(self, params: Params, text: str) -> str | None:
        if not text.strip():
            return "message text is empty"
        mode = params.get("parse_mode")
        if mode == "HTML":
            problem = html_problem(text)
            if problem:
                return f"can't parse entities: {problem}"
            text = strip_html(text)
        elif mode:
            return f"unsupported parse_mode {mode}"
        if utf16_len(text) > TEXT_LIMIT:
            return "message is too long"
        caption = str(params.get("caption") or "")
        if mode == "HTML" and html_problem(caption) is None:
            caption = strip_html(caption)
        if utf16_len(caption) > CAPTION_LIMIT:
            return "message caption is too long"
        if _chat_id(params.get("chat_id")) not in self._chats:
            return "chat not found"
        return None

    def _bot_said(self, params: Params, text: str) -> dict[str, Any]:
        chat_id = _chat_id(params.get("chat_id"))
        msg: dict[str, Any] = {
            "message_id": next(self._message_ids),
            "date": int(time.time()),
            "chat": self._chats.get(chat_id, {"id": chat_id, "type": "private"}),
            "from": self.bot_user,
            "text": text,
        }
        if params.get("message_thread_id"):
            msg["message_thread_id"] = params["message_thread_id"]
            msg["is_topic_message"] = True
        if isinstance(params.get("reply_markup"), dict):
            msg["reply_markup"] = params["reply_markup"]
        return msg

    async def _m_senddocument(self, request: web.Request, params: Params) -> web.Response:
        """A multipart upload (PTB's InputFile); file_id/URL strings are not supported here."""
        form = await request.post()  # aiohttp keeps the parsed form: read again, files too
        document = form.get("document")
        if not isinstance(document, web.FileField):
            return self._answer(request, 400, "Bad Request: there is no document in the request")
        data = document.file.read()
        if len(data) > DOCUMENT_LIMIT:
            return self._answer(request, 413, "Request Entity Too Large")
        caption = str(params.get("caption") or "")
        if utf16_len(caption) > CAPTION_LIMIT:
            return self._answer(request, 400, "Bad Request: message caption is too long")
        if _chat_id(params.get("chat_id")) not in self._chats:
            return self._answer(request, 400, "Bad Request: chat not found")
        said = self._bot_said(params, "")
        del said["text"]
        said["document"] = {
            "file_id": f"doc-{said['message_id']}",
            "file_unique_id": f"docu{said['message_id']}",
            "file_name": document.filename,
            "file_size": len(data),
        }
        with self._lock:
            self._documents.append(
                {"chat_id": params.get("chat_id"), "file_name": document.filename, "data": data}
            )
        return self._answer(request, 200, said)

    def documents(self) -> list[dict[str, Any]]:
        """Every document sent (chat_id, file_name, data), oldest first."""
        with self._lock:
            return list(self._documents)

    async def _m_editmessagetext(self, request: web.Request, params: Params) -> web.Response:
        text = str(params.get("text") or "")
        problem = self._send_problem(params, text)
        if problem:
            return self._answer(request, 400, f"Bad Request: {problem}")
        shown, entities = _parsed(params, text)
        key = (_chat_id(params.get("chat_id")), int(params.get("message_id") or 0))
        with self._lock:
            current = self._shown.get(key)
            if current is None:
                return self._answer(request, 400, "Bad Request: message to edit not found")
            if current["text"] == shown and current["entities"] == entities:
                return self._answer(
                    request,
                    400,
                    "Bad Request: message is not modified: specified new message content and "
                    "reply markup are exactly the same as a current content and reply markup "
                    "of the message",
                )
            self._shown[key] = {"message_id": key[1], "text": shown, "entities": entities}
            self.edits[key] = self.edits.get(key, 0) + 1
        msg = self._bot_said(params, shown)
        msg["message_id"] = key[1]
        return self._answer(request, 200, msg)

    async def _m_deletemessage(self, request: web.Request, params: Params) -> web.Response:
        key = (_chat_id(params.get("chat_id")), int(params.get("message_id") or 0))
        with self._lock:
            if self._shown.pop(key, None) is None:
                return self._answer(request, 400, "Bad Request: message to delete not found")
        return self._answer(request, 200, True)

    async def _m_sendmessagedraft(self, request: web.Request, params: Params) -> web.Response:
        """Bot API 9.3: an animated draft in a private chat; nothing is stored."""
        chat = self._chats.get(_chat_id(params.get("chat_id")))  # type: ignore[arg-type]
        if chat is None:
            return self._answer(request, 400, "Bad Request: chat not found")
        if chat.get("type") != "private":
            return self._answer(
                request, 400, "Bad Request: message drafts can be sent only to private chats"
            )
        try:
            draft_id = int(params.get("draft_id") or 0)
        except (TypeError, ValueError):
            draft_id = 0
        if draft_id == 0:
            return self._answer(request, 400, "Bad Request: draft_id must be non-zero")
        text = str(params.get("text") or "")
        if params.get("parse_mode") == "HTML":
            problem = html_problem(text)
            if problem:
                return self._answer(request, 400, f"Bad Request: can't parse entities: {problem}")
            text = strip_html(text)
        if utf16_len(text) > TEXT_LIMIT:
            return self._answer(request, 400, "Bad Request: message is too long")
        return self._answer(request, 200, True)

    async def _m_answercallbackquery(self, request: web.Request, params: Params) -> web.Response:
        query_id = str(params.get("callback_query_id"))
        with self._lock:
            known = query_id in self._queries
            answered = [c for c in self._calls if c.method == "answercallbackquery"]
            twice = sum(str(c.params.get("callback_query_id")) == query_id for c in answered) > 1
        if not known or twice:
            return self._answer(
                request,
                400,
                "Bad Request: query is too old and response timeout expired or query ID is invalid",
            )
        return self._answer(request, 200, True)

    async def _m_editmessagereplymarkup(self, request: web.Request, params: Params) -> web.Response:
        return self._answer(request, 200, True)

    async def _m_sendchataction(self, request: web.Request, params: Params) -> web.Response:
        return self._answer(request, 200, True)

    async def _m_getfile(self, request: web.Request, params: Params) -> web.Response:
        with self._lock:
            entry = self._files.get(str(params.get("file_id")))
        if entry is None:
            return self._answer(request, 400, "Bad Request: invalid file_id")
        path, content = entry
        result = {
            "file_id": params["file_id"],
            "file_unique_id": f"u-{params['file_id']}",
            "file_size": len(content),
            "file_path": path,
        }
        return self._answer(request, 200, result)

    async def _handle_file(self, request: web.Request) -> web.Response:
        if request.match_info["token"] != self.token:
            return web.Response(status=401)
        path = request.match_info["path"]
        with self._lock:
            found = [content for p, content in self._files.values() if p == path]
            self._calls.append(Call("download", {"path": path}, 200 if found else 404))
        if not found:
            return web.Response(status=404)
        return web.Response(body=found[0], content_type="application/octet-stream")


_DEFAULT_ERRORS = {
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden: bot was blocked by the user",
    409: "Conflict: terminated by other getUpdates request; make sure that only one bot "
    "instance is running",
    429: "Too Many Requests: retry after 1",
    500: "Internal Server Error",
    502: "Bad Gateway",
}


def _parsed(params: Params, text: str) -> tuple[str, list[tuple[str, str, int, int]]]:
    """What a message of ``text`` shows: its visible text and its formatting entities."""
    if params.get("parse_mode") == "HTML":
        return strip_html(text), html_entities(text)
    return text, []


def _chat_id(value: Any) -> int | str:
    try:
        return int(value)
    except (TypeError, ValueError):
        return str(value)


async def _read_params(request: web.Request) -> Params:
    """PTB posts form fields whose non-string values are JSON; accept JSON bodies too."""
    raw: dict[str, Any] = dict(request.query)
    if request.content_type == "application/json":
        body = await request.json() if request.can_read_body else {}
        raw.update(body or {})
        return raw
    if request.can_read_body:
        form = await request.post()
        raw.update({k: v for k, v in form.items() if isinstance(v, str)})
    params: Params = {}
    for key, value in raw.items():
        if key in _STRING_PARAMS or not isinstance(value, str):
            params[key] = value
            continue
        try:
            params[key] = json.loads(value)
        except ValueError:
            params[key] = value
    return params


class FakeBotAPIThread:
    """A FakeBotAPI serving from a daemon thread (for sync and subprocess tests).

    Attribute access is delegated to the server (``handle.api``), whose public methods are
    thread-safe.
    """

    def __init__(self, api: FakeBotAPI, start_timeout: float = 10.0) -> None:
        self.api = api
        self._server = ServerThread(api.start, api.stop, "fake-telegram", start_timeout)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.api, name)

    @property
    def after_get_updates(self) -> Hook | None:
        return self.api.after_get_updates

    @after_get_updates.setter
    def after_get_updates(self, hook: Hook | None) -> None:
        self.api.after_get_updates = hook

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server and join the thread. Idempotent."""
        self._server.stop(timeout)

    def __enter__(self) -> FakeBotAPIThread:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


async def _serve(args: argparse.Namespace) -> None:
    api = FakeBotAPI(token=args.token, port=args.port)
    await api.start()
    print(f"fake Bot API at {api.base_url} (token {api.token})", flush=True)
    await asyncio.Event().wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--token", default=DEFAULT_TOKEN)
    asyncio.run(_serve(parser.parse_args(argv)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
