"""Telegram through python-telegram-bot's ``Bot``, with memobot driving the long poll itself.

Why not PTB's ``Application``/``Updater``: they confirm an update to Telegram (the next
``getUpdates`` offset) as soon as it is fetched, before anything is stored. Here the offset is
ours. Telegram keeps every update at or above the offset of the last ``getUpdates`` call and
forgets everything below it, so an update is confirmed only by a later call. The loop:

1. ``getUpdates(offset=N)``: fetch a batch (and confirm everything below N);
2. each update is either published with ``bus.publish_inbound`` (which returns only once the
   message is durable in its session, or recognised as a redelivery) or deliberately dropped
   (denied sender, not addressed to us in a group, another bot, not a message);
3. N becomes the last handled ``update_id + 1``, used by the next call and saved in
   state/channels/telegram.json (at most once a second, and at stop; not fsynced).

A SIGKILL anywhere in 1-3 means Telegram sends the unconfirmed updates again after the restart:
nothing is lost, and intake answers "duplicate" for anything already stored, so nothing is
answered twice. The id that makes this work is ``<chat id>:<message id>``: Telegram message ids
are unique within a chat and identical in every redelivery of the same update. For the same
reason the saved offset is only a shortcut for the first poll after a restart: an older one (or
none) brings updates again, which intake recognises, never fewer, because only a ``getUpdates``
call confirms anything to Telegram.

python-telegram-bot is imported only by this module, and only when Telegram is enabled. Its
HTTP goes through ``AiohttpRequest`` (PTB's documented ``BaseRequest`` extension point) rather
than the default httpx-based ``HTTPXRequest``: measured against the local fake Bot API, a call
costs about 0.25 ms of CPU on aiohttp against 1.6 ms on httpx, and a reply takes two calls
(typing, sendMessage). aiohttp is loaded in the gateway anyway, and aiohttp-socks gives socks5.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import re
import time
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import aiohttp
from telegram import (
    Bot,
    CallbackQuery,
    InlineKeyboardButton,
    InlineKeyboardMarkup,
    InputFile,
    Message,
    MessageEntity,
    ReplyParameters,
    Update,
    User,
)
from telegram.constants import ChatAction, ParseMode
from telegram.error import (
    BadRequest,
    ChatMigrated,
    Conflict,
    InvalidToken,
    NetworkError,
    TelegramError,
    TimedOut,
)
from telegram.error import RetryAfter as PTBRetryAfter
from telegram.request import BaseRequest, RequestData

from bot import workspace_files
from bot.bus import InboundMessage, Intake, MessageBus, OutboundMessage
from bot.commands import CHANNEL_COMMANDS, CommandSyntax
from bot.gate.question import QuestionView, fit_question
from bot.proxy import http_proxy, socks_connector
from bot.workspace import chat_media_dir
from channels.access import (
    AccessPolicy,
    approval_buttons,
    parse_press,
    question_view,
    whoami_text,
)
from channels.base import Channel, PreviewMode, State
from channels.errors import (
    AcceptedUnreadable,
    FatalChannelError,
    SendError,
    TransientError,
)
from channels.formatting import (
    TELEGRAM_LIMIT,
    markdown_to_telegram_html,
    render_chunks,
    split_telegram_html,
    strip_telegram_html,
    telegram_length,
    utf16_len,
)
from channels.pacing import Limit
from channels.retry import Reconnect
from channels.state import ChannelState
from channels.telegram_channel.config import TelegramConfig
from channels.telegram_channel.errors import (
    OPTIONAL_METHODS,
    TOKEN_REJECTED,
    flood,
    send_error,
)

log = logging.getLogger(__name__)

CHANNEL = "telegram"
ALLOWED_UPDATES = ("message", "callback_query")
POLL_MARGIN_SECONDS = 10.0  # a getUpdates silent for pollTimeout + this is restarted
# Telegram refuses a second poller (409) and a flood at once: a getUpdates still open this
# long after a refusal is a working connection again, though it may wait pollTimeoutSeconds
# before it returns (until then "reconnecting (409 Conflict)" stayed after the conflict ended).
POLL_ACCEPTED_SECONDS = 2.0
OFFSET_SAVE_SECONDS = 1.0  # the saved offset is a shortcut for the first poll after a restart
# Chats of one batch taken in at once: about the worker threads that store them; more would
# only queue there, ahead of the running turns' own writes, after a backlog of 100 updates.
INTAKE_CHATS_AT_ONCE = 8
MEDIA_MAX_BYTES = 20 * 1024 * 1024  # also the cloud Bot API's own getFile limit
GROUP_TYPES = frozenset({"group", "supergroup", "channel"})
_COMMAND = re.compile(r"^/([A-Za-z0-9_]+)(?:@([A-Za-z0-9_]+))?(?:\s|$)")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


# -- pure helpers ----------------------------------------------------------------------------


def chat_key(chat_id: int, thread_id: int | None) -> str:
    """Our chat id: the Telegram chat, plus the forum topic so each topic is its own session."""
    return f"{chat_id}:{thread_id}" if thread_id else str(chat_id)


def split_chat_key(key: str) -> tuple[int, int | None]:
    """The Telegram chat id and forum topic (if any) an outbound message goes to."""
    chat, _, thread = key.partition(":")
    return int(chat), int(thread) if thread else None


def telegram_message_id(message_id: str | None) -> int | None:
    """The Telegram message id inside our ``<chat>:<message>`` id (None if not ours)."""
    if not message_id:
        return None
    tail = message_id.rsplit(":", 1)[-1]
    return int(tail) if tail.isdigit() else None


def command_target(text: str) -> tuple[str, str] | None:
    """``(command, bot)`` for a text starting with ``/command[@bot]``; bot is "" when absent."""
    m = _COMMAND.match(text)
    return (m.group(1).lower(), (m.group(2) or "").lower()) if m else None


def _utf16_cut(text: str, spans: Sequence[tuple[int, int]]) -> str:
    """Remove ``(offset, length)`` spans, measured in UTF-16 code units as Telegram does."""
    data = text.encode("utf-16-le")
    for offset, length in sorted(spans, reverse=True):
        data = data[: offset * 2] + data[(offset + length) * 2 :]
    return data.decode("utf-16-le")


def _entities(message: Message) -> tuple[str, dict[MessageEntity, str]]:
    kinds = [MessageEntity.MENTION, MessageEntity.TEXT_MENTION]
    if message.text is not None:
        return message.text, message.parse_entities(kinds)
    return message.caption or "", message.parse_caption_entities(kinds)


def _mentions_of(message: Message, me: User) -> list[MessageEntity]:
    """Entities that name this bot: ``@ourname`` (exactly, not a prefix) or a text mention."""
    username = (me.username or "").lower()
    _, found = _entities(message)
    return [
        e
        for e, value in found.items()
        if (e.type == MessageEntity.MENTION and value[1:].lower() == username)
        or (e.type == MessageEntity.TEXT_MENTION and e.user is not None and e.user.id == me.id)
    ]


def _replies_to_bot(message: Message, me: User) -> bool:
    parent = message.reply_to_message
    if parent is None or parent.from_user is None or parent.from_user.id != me.id:
        return False
    # In a forum topic every message "replies" to the topic's first message; not a real reply.
    return not (message.is_topic_message and parent.message_id == message.message_thread_id)


def addressed_to_bot(message: Message, me: User) -> bool:
    """A group message is for us when it mentions or replies to us or is a command for us."""
    text = message.text or message.caption or ""
    command = command_target(text)
    if command is not None:
        return command[1] in ("", (me.username or "").lower())
    return _replies_to_bot(message, me) or bool(_mentions_of(message, me))


def text_without_mention(message: Message, me: User) -> str:
    """The text (or caption) with ``@ourname`` removed; the model does not need to see it."""
    text, _ = _entities(message)
    spans = [(e.offset, e.length) for e in _mentions_of(message, me) if e.type == "mention"]
    if not spans:
        return text
    return re.sub(r"[ \t]{2,}", " ", _utf16_cut(text, spans)).strip() or text


@dataclass(frozen=True, slots=True)
class _Attachment:
    kind: str  # photo, document, audio, video, voice, video_note, animation
    file_id: str
    file_unique_id: str
    file_size: int | None
    file_name: str | None
    default_ext: str


def attachments(message: Message) -> list[_Attachment]:
    """Files a message carries; for a photo only its largest size."""
    found: list[_Attachment] = []
    if message.photo:
        best = max(message.photo, key=lambda p: (p.file_size or 0, p.width * p.height))
        found.append(
            _Attachment("photo", best.file_id, best.file_unique_id, best.file_size, None, ".jpg")
        )
    for kind, ext in (
        ("document", ""),
        ("audio", ".mp3"),
        ("video", ".mp4"),
        ("voice", ".ogg"),
        ("video_note", ".mp4"),
        ("animation", ".mp4"),
    ):
        item = getattr(message, kind, None)
        if item is not None:
            name = getattr(item, "file_name", None)
            found.append(
                _Attachment(kind, item.file_id, item.file_unique_id, item.file_size, name, ext)
            )
    return found


def _file_ext(att: _Attachment, file_path: str | None) -> str:
    for candidate in (att.file_name, file_path):
        suffix = Path(candidate or "").suffix
        if suffix and len(suffix) <= 10 and not _UNSAFE.search(suffix[1:]):
            return suffix.lower()
    return att.default_ext or ".bin"


# The answers (HTTP status, body) to the platform call in progress (TelegramChannel.calling),
# so that an answer python-telegram-bot could not read is told apart from one that never came.
# A list, not a value: PTB may run the request in a copied context. The body is looked at only
# when PTB failed to read it (_took): a 200 is Telegram's word only when it says {"ok": true};
# a proxy or relay in front of the Bot API answering 200 with its own JSON took nothing.
_ANSWERED: ContextVar[list[tuple[int, bytes]] | None] = ContextVar(
    "telegram_answered", default=None
)
# Calls that make something new in the chat: done twice, they show twice.
_NOT_REPEATABLE = frozenset({"sendMessage", "sendDocument"})


def _took(status: int, body: bytes) -> bool:
    """Whether an answer says the Bot API carried the call out: 200 and {"ok": true}."""
    if status != 200:
        return False
    try:
        answer = json.loads(body)
    except ValueError:
        return False
    return isinstance(answer, dict) and answer.get("ok") is True


class AiohttpRequest(BaseRequest):
    """python-telegram-bot's networking on an aiohttp session (see the module docstring).

    Timeouts keep PTB's meaning: ``DEFAULT_NONE`` takes this object's default, ``None`` waits
    forever. Failures surface as PTB's own errors (``TimedOut``, ``NetworkError``), so the
    mapping in ``send_error`` and the poll loop's handling are the same as with HTTPXRequest.
    """

    def __init__(
        self,
        *,
        connections: int,
        read_timeout: float | None,
        connect_timeout: float | None = 5.0,
        pool_timeout: float | None = 1.0,
        proxy: str = "",
    ) -> None:
        self._connections = connections
        self._read_timeout = read_timeout
        self._connect_timeout = connect_timeout
        self._pool_timeout = pool_timeout
        self._proxy = proxy
        self._http_proxy: str | None = None
        self._session: aiohttp.ClientSession | None = None

    @property
    def read_timeout(self) -> float | None:
        return self._read_timeout

    async def initialize(self) -> None:
        self._open()

    async def shutdown(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector, self._http_proxy = _proxy_connector(self._proxy, self._connections)
            self._session = aiohttp.ClientSession(
                connector=connector, headers={"User-Agent": self.USER_AGENT}
            )
        return self._session

    def _timeout(self, read: Any, connect: Any, pool: Any) -> aiohttp.ClientTimeout:
        def pick(value: Any, default: float | None) -> float | None:
            return default if value is BaseRequest.DEFAULT_NONE else value

        connect_s = pick(connect, self._connect_timeout)
        pool_s = pick(pool, self._pool_timeout)
        # aiohttp's "connect" covers waiting for a pooled connection plus connecting.
        acquire = None if connect_s is None or pool_s is None else connect_s + pool_s
        return aiohttp.ClientTimeout(
            total=None,
            connect=acquire,
            sock_connect=connect_s,
            sock_read=pick(read, self._read_timeout),
        )

    async def do_request(
        self,
        url: str,
        method: str,
        request_data: RequestData | None = None,
        read_timeout: Any = BaseRequest.DEFAULT_NONE,
        write_timeout: Any = BaseRequest.DEFAULT_NONE,  # aiohttp has no write timeout
        connect_timeout: Any = BaseRequest.DEFAULT_NONE,
        pool_timeout: Any = BaseRequest.DEFAULT_NONE,
    ) -> tuple[int, bytes]:
        session = self._open()
        data: aiohttp.FormData | dict[str, str] | None = None
        if request_data is not None:
            data = request_data.json_parameters
            if request_data.contains_files:
                form = aiohttp.FormData(data)
                for name, (filename, content, mime) in request_data.multipart_data.items():
                    form.add_field(name, content, filename=filename, content_type=mime)
                data = form
        try:
            async with session.request(
                method,
                url,
                data=data,
                proxy=self._http_proxy,
                timeout=self._timeout(read_timeout, connect_timeout, pool_timeout),
            ) as response:
                body = await response.read()
                if (answered := _ANSWERED.get()) is not None:
                    answered.append((response.status, body))
                return response.status, body
        except TimeoutError as exc:
            raise TimedOut(f"no answer from Telegram in time ({type(exc).__name__})") from exc
        except aiohttp.ClientError as exc:
            raise NetworkError(f"aiohttp.{type(exc).__name__}: {exc}") from exc


def _proxy_connector(proxy: str, connections: int) -> tuple[aiohttp.BaseConnector, str | None]:
    """(connector, http proxy URL) for ``channels.telegram.proxy``.

    http(s) proxies go through aiohttp's ``proxy=``; socks5 needs an aiohttp-socks connector
    (``socks5h``: the proxy resolves host names).
    """
    connector = socks_connector(proxy, limit=connections)
    if connector is not None:
        return connector, None
    return aiohttp.TCPConnector(limit=connections), http_proxy(proxy)


def build_bot(cfg: TelegramConfig) -> tuple[Bot, list[AiohttpRequest]]:
    """A ``Bot`` with two HTTP sessions: one for the long poll, one for everything else.

    ``baseUrl``/``baseFileUrl`` keep python-telegram-bot's meaning (the token is appended).
    When only ``baseUrl`` is set and ends in ``/bot``, the file URL is derived from it
    (``.../file/bot``), which is what a local Bot API server serves.
    Returns the bot and its HTTP sessions (for closing).
    """
    # PTB adds the long-poll timeout to the poll's read timeout (get_updates).
    poll_request = AiohttpRequest(connections=1, read_timeout=5.0, proxy=cfg.proxy)
    request = AiohttpRequest(connections=128, read_timeout=20.0, proxy=cfg.proxy)
    urls: dict[str, str] = {}
    if cfg.base_url:
        urls["base_url"] = cfg.base_url
        if not cfg.base_file_url and cfg.base_url.rstrip("/").endswith("/bot"):
            urls["base_file_url"] = cfg.base_url.rstrip("/")[: -len("/bot")] + "/file/bot"
    if cfg.base_file_url:
        urls["base_file_url"] = cfg.base_file_url
    bot = Bot(cfg.token, request=request, get_updates_request=poll_request, **urls)
    return bot, [request, poll_request]


class _Refused(Exception):
    """Intake refused a message (shutting down or storage failing): do not confirm it."""


# -- the channel -----------------------------------------------------------------------------


class TelegramChannel(Channel):
    name = CHANNEL
    sends_files = True
    command_syntax = CommandSyntax(answers=CHANNEL_COMMANDS)  # /whoami: see _normalise
    optional_methods = OPTIONAL_METHODS

    def __init__(
        self, bus: MessageBus, cfg: TelegramConfig, workspace: Path, state_dir: Path
    ) -> None:
        super().__init__(bus)
        self.cfg = cfg
        self.policy = AccessPolicy.for_channel(CHANNEL, cfg, state_dir)
        self.workspace = workspace
        self.offset_state = ChannelState(state_dir, CHANNEL)
        self.offset: int | None = None
        self._offset_saved: tuple[int | None, float] = (None, 0.0)  # (offset, monotonic time)
        self._offset_write: asyncio.Task[None] | None = None
        self.bot: Bot | None = None
        self._clients: list[AiohttpRequest] = []
        self.me: User | None = None
        self.poll_timeout = cfg.poll_timeout_seconds
        self.streaming = cfg.streaming
        self.stream_interval = cfg.stream_edit_interval_seconds
        self.typing_delay = cfg.typing_delay_seconds
        self._task: asyncio.Task[None] | None = None
        self.reconnect = Reconnect()

    # -- lifecycle --

    async def start(self) -> None:
        """Return at once; connecting and polling run in a background task."""
        self.policy.log_startup()
        self.offset = self._load_offset()
        self._set_state("starting")
        self.bot, self._clients = build_bot(self.cfg)
        self._task = asyncio.create_task(self._run(), name="telegram-poll")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self._offset_write is not None:
            await asyncio.gather(self._offset_write, return_exceptions=True)
        await asyncio.to_thread(self._write_offset)
        # Closed directly: Bot.shutdown() skips clients when getMe never succeeded.
        await asyncio.gather(*(c.shutdown() for c in self._clients), return_exceptions=True)
        self._clients = []
        self._set_state("stopped")

    def _set_state(self, state: State, detail: str = "", level: int = logging.INFO) -> None:
        """Log a state change once, not once per failed attempt."""
        if self.set_state(state, detail):
            log.log(level, "telegram: %s%s", state, f" ({detail})" if detail else "")

    # -- polling --

    async def _run(self) -> None:
        try:
            if not await self._connect():
                return
            while (outcome := await self._poll_once()) != "stop":
                # After a network failure getMe proves the way back (a long poll with nothing
                # to deliver would leave the state unknown for up to pollTimeoutSeconds).
                if outcome == "lost" and not await self._connect():
                    return
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug must not silently end intake: say so, loudly, with state
            log.exception("telegram: the poll loop crashed")
            self._set_state("failed", "poll loop crashed; see the log", logging.ERROR)

    async def _connect(self) -> bool:
        """getMe until it works (the bot's id and @username, needed for group gating), then
        "connected". False when the token is rejected."""
        assert self.bot is not None
        while True:
            try:
                async with asyncio.timeout(POLL_MARGIN_SECONDS + 5):
                    me = await self.bot.get_me()
            except InvalidToken:
                self._token_rejected()
                return False
            except PTBRetryAfter as exc:
                await self._retry_later("Telegram asked to slow down", flood(exc))
                continue
            except (TelegramError, TimeoutError) as exc:
                await self._retry_later(f"cannot reach Telegram: {_describe(exc)}", exc)
                continue
            if self.me is None:
                log.info("telegram: logged in as @%s (id %s)", me.username, me.id)
            self.me = me
            self.reconnect.succeeded()
            self._set_state("connected")
            return True

    def _token_rejected(self) -> None:
        self.fail(FatalChannelError(TOKEN_REJECTED))

    async def _retry_later(self, detail: str, cause: Exception) -> None:
        """ "reconnecting", then the shared reconnect policy's wait after ``cause``."""
        self._set_state("reconnecting", detail, logging.WARNING)
        await self.reconnect.pause(cause)

    async def _poll_once(self) -> Literal["ok", "lost", "stop"]:
        """One getUpdates and its batch.

        "lost": the connection failed (reconnect first); "stop": the token was rejected.
        """
        assert self.bot is not None
        try:
            async with asyncio.timeout(self.poll_timeout + POLL_MARGIN_SECONDS):
                updates = await self._get_updates()
        except TimeoutError as exc:
            await self._retry_later(
                f"getUpdates gave no answer for {self.poll_timeout + POLL_MARGIN_SECONDS:.0f} s; "
                "restarting the poll",
                exc,
            )
            return "lost"
        except InvalidToken:
            self._token_rejected()  # the process keeps running; other channels are unaffected
            return "stop"
        except Conflict as exc:
            await self._conflict(exc)
            return "ok"
        except PTBRetryAfter as exc:
            await self._retry_later("Telegram asked to slow down", flood(exc))
            return "ok"
        except NetworkError as exc:
            await self._retry_later(f"getUpdates failed: {_describe(exc)}", exc)
            return "lost"
        except TelegramError as exc:
            await self._retry_later(f"getUpdates failed: {_describe(exc)}", exc)
            return "ok"
        self.reconnect.succeeded()
        self._set_state("connected")
        if updates:
            try:
                await self._handle_batch(updates)
            except _Refused as exc:
                await self._retry_later(f"{exc}; it stays unconfirmed and comes again", exc)
        return "ok"

    async def _get_updates(self) -> Sequence[Update]:
        """One getUpdates; when the channel is not "connected", "connected" as soon as the
        request has stayed open ``POLL_ACCEPTED_SECONDS`` (a long poll may take
        pollTimeoutSeconds to answer)."""
        assert self.bot is not None
        call = asyncio.ensure_future(
            self.bot.get_updates(
                offset=self.offset, timeout=self.poll_timeout, allowed_updates=list(ALLOWED_UPDATES)
            )
        )
        try:
            if self.state != "connected":
                done, _ = await asyncio.wait({call}, timeout=POLL_ACCEPTED_SECONDS)
                if not done:
                    self._set_state("connected")
            return await call
        finally:
            call.cancel()  # a stop or the poll's timeout: the request goes with it

    async def _conflict(self, exc: Conflict) -> None:
        assert self.bot is not None
        if "webhook" in exc.message.lower():
            log.warning("telegram: a webhook is set for this bot; removing it to poll instead")
            try:
                await self.bot.delete_webhook(drop_pending_updates=False)
                return
            except TelegramError as err:
                log.warning("telegram: deleteWebhook failed: %s", _describe(err))
        await self._retry_later(
            "another bot instance is polling with this token (409 Conflict); stop the other "
            "instance, retrying",
            exc,
        )

    async def _handle_batch(self, updates: Sequence[Update]) -> None:
        """Publish every update of a batch, then move the confirmed offset past it.

        Chats are taken in side by side, each chat's updates in order: one after another, a
        batch from 50 chats was 50 durable writes in a row (0.33 s before the last was
        stored, bench_telegram.py). The offset moves past an update only once it and every
        update before it are stored, so on a refusal that update and everything after it
        come again in the next ``getUpdates`` (intake recognises those already stored).
        """
        chats: dict[int | None, list[int]] = {}
        for i, update in enumerate(updates):
            chat = update.effective_chat
            chats.setdefault(chat.id if chat else None, []).append(i)
        stored = [False] * len(updates)
        refusal: list[BaseException] = []
        at_once = asyncio.Semaphore(INTAKE_CHATS_AT_ONCE)

        async def take_in(indexes: list[int]) -> None:
            async with at_once:
                for i in indexes:
                    try:
                        if await self._handle_update(updates[i]) == "refused":
                            raise _Refused(
                                "memobot refused a message (shutting down or storage failing)"
                            )
                    except _Refused as exc:
                        refusal.append(exc)
                        return  # this chat's later updates wait for the redelivery
                    stored[i] = True

        try:
            await asyncio.gather(*(take_in(indexes) for indexes in chats.values()))
        finally:  # also when stopped midway: what is stored need not come again
            offset = self.offset
            for update, done in zip(updates, stored, strict=True):
                if not done:
                    break
                offset = update.update_id + 1
            if offset != self.offset:
                self._save_offset(offset)
        if refusal:
            raise refusal[0]

    async def _handle_update(self, update: Update) -> Intake | None:
        """Publish one update; None when it is deliberately dropped."""
        self.touch()
        if update.callback_query is not None:
            return await self._handle_press(update.callback_query)
        message = update.message
        if message is None:
            return None
        try:
            inbound = await self._normalise(message)
        except Exception:
            # A message this code cannot handle must not block every later one forever.
            log.exception("telegram: update %s dropped: could not be read", update.update_id)
            return None
        if inbound is None:
            return None
        try:
            return await self.bus.publish_inbound(inbound)
        except Exception as exc:
            log.exception("telegram: intake failed for update %s", update.update_id)
            raise _Refused(f"intake failed ({type(exc).__name__})") from exc

    # -- the offset on disk --

    def _load_offset(self) -> int | None:
        value = self.offset_state.load().get("offset")
        offset = value if isinstance(value, int) and not isinstance(value, bool) else None
        self._offset_saved = (offset, time.monotonic())
        return offset

    def _save_offset(self, offset: int | None) -> None:
        """The offset the next getUpdates confirms; on disk at most once a second (a file
        write per batch cost more than the rest of intake), and at stop.

        The write runs in a worker thread: renaming over the old file makes ext4 push the new
        one's data out first, which took up to 36 ms on a busy disk, a stall of every chat on
        the event loop. One write at a time; a write writes the newest offset."""
        if offset is None:
            return
        self.offset = offset
        due = time.monotonic() - self._offset_saved[1] >= OFFSET_SAVE_SECONDS
        if due and self._offset_write is None:
            self._offset_write = asyncio.create_task(
                asyncio.to_thread(self._write_offset), name="telegram-offset"
            )
            self._offset_write.add_done_callback(self._offset_written)

    def _offset_written(self, task: asyncio.Task[None]) -> None:
        self._offset_write = None

    def _write_offset(self) -> None:
        if self.offset is None or self.offset == self._offset_saved[0]:
            return
        try:
            # Not fsynced: an older offset after a power cut only brings redeliveries.
            self.offset_state.save({"offset": self.offset}, durable=False)
        except OSError as exc:
            # Not fatal: intake already stored every message, a redelivery is a duplicate.
            log.error("telegram: cannot save the update offset (%s)", exc)
        self._offset_saved = (self.offset, time.monotonic())

    # -- inbound --

    async def _normalise(self, message: Message) -> InboundMessage | None:
        """Turn a Telegram message into an InboundMessage, or None when it is not for us."""
        assert self.me is not None
        sender = message.from_user
        if sender is None or sender.is_bot:
            return None  # other bots, itself, anonymous admins: never a conversation partner
        is_group = message.chat.type in GROUP_TYPES
        sender_id = str(sender.id)
        text = message.text or message.caption or ""
        command = command_target(text)
        if not is_group and command and command[0] == "whoami":
            await self._whoami(message, sender_id)
            return None
        if is_group and not self._group_accepts(message):
            return None
        if not self.policy.allowed(sender_id):
            if not is_group and self.policy.dm_policy == "pairing":
                await self._pairing_reply(message, sender)
                return None
            name = f"@{sender.username}" if sender.username else ""
            self.policy.deny(sender_id, name, chat="group" if is_group else "private")
            return None
        if is_group and command and command[0] == "whoami":
            await self._whoami(message, sender_id)
            return None
        if is_group:
            text = text_without_mention(message, self.me)
        thread = message.message_thread_id if message.is_topic_message else None
        chat = chat_key(message.chat.id, thread)
        media, notes = await self._download_media(message, chat)
        if media and not text and not notes:
            text = f"[sent a {attachments(message)[0].kind.replace('_', ' ')}]"
        if notes:
            text = "\n".join([text, *notes]) if text else "\n".join(notes)
        if not text and not media:
            return None  # service messages (joins, pins...) and stickers: nothing to answer
        parent = message.reply_to_message
        is_reply = parent is not None and not (thread and parent.message_id == thread)
        return InboundMessage(
            channel=CHANNEL,
            chat_id=chat,
            sender_id=sender_id,
            text=text,
            media=tuple(media),
            message_id=f"{message.chat.id}:{message.message_id}",
            reply_to=f"{message.chat.id}:{parent.message_id}" if is_reply and parent else None,
            metadata={
                "is_group": is_group,
                "is_admin": self.policy.is_admin(sender_id),
                "sender_name": sender.full_name,
                "username": sender.username,
                "message_thread_id": thread,
            },
        )

    def _group_accepts(self, message: Message) -> bool:
        assert self.me is not None
        text = message.text or message.caption or ""
        command = command_target(text)
        if command and command[1] and command[1] != (self.me.username or "").lower():
            return False  # /cmd@otherbot is for the other bot, even with groupPolicy "open"
        return self.cfg.group_policy == "open" or addressed_to_bot(message, self.me)

    async def _pairing_reply(self, message: Message, sender: User) -> None:
        """A stranger's private message: a pairing code, at most once an hour; the message
        itself is not processed. Sent here, outside the bus: the sender is no user yet."""
        assert self.bot is not None
        name = f"@{sender.username}" if sender.username else sender.full_name
        text = await self.policy.pairing_reply(str(sender.id), name, str(message.chat.id))
        if text is None:
            return
        try:
            await self.bot.send_message(message.chat.id, text)
        except TelegramError as exc:
            log.warning("telegram: pairing code to %s not sent: %s", sender.id, _describe(exc))

    async def _whoami(self, message: Message, sender_id: str) -> None:
        """Answered here, outside the bus: it must work for senders allowFrom refuses."""
        assert self.bot is not None
        text = whoami_text(CHANNEL, sender_id, self.policy.allowed(sender_id))
        try:
            await self.bot.send_message(
                message.chat.id,
                text,
                message_thread_id=message.message_thread_id if message.is_topic_message else None,
            )
        except TelegramError as exc:
            log.warning("telegram: /whoami answer to %s failed: %s", sender_id, _describe(exc))

    async def _download_media(self, message: Message, chat: str) -> tuple[list[str], list[str]]:
        """Save attached files under <workspace>/media/telegram/<chat>/; paths and notes."""
        paths: list[str] = []
        notes: list[str] = []
        for att in attachments(message):
            label = att.kind.replace("_", " ")
            if att.file_size and att.file_size > MEDIA_MAX_BYTES:
                notes.append(_too_large(label, att.file_size))
                continue
            try:
                path = await self._download(att, chat)
            except (TelegramError, OSError) as exc:
                log.warning("telegram: %s in chat %s not downloaded: %s", label, chat, exc)
                notes.append(f"[a {label} was attached but could not be downloaded]")
                continue
            if path is None:
                notes.append(_too_large(label, att.file_size or 0))
                continue
            paths.append(str(path))
            if att.kind == "voice":
                # The core transcribes it when llm.transcriptionModel is set.
                notes.append("[a voice message is attached]")
        return paths, notes

    async def _download(self, att: _Attachment, chat: str) -> Path | None:
        assert self.bot is not None
        folder = self.workspace / chat_media_dir(CHANNEL, chat)
        stem = _UNSAFE.sub("_", att.file_unique_id)
        tg_file = await self.bot.get_file(att.file_id)
        if tg_file.file_size and tg_file.file_size > MEDIA_MAX_BYTES:
            return None
        path = folder / f"{stem}{_file_ext(att, tg_file.file_path)}"
        # A redelivered update: the file is already here under its stable unique id (one
        # look by name, not a listing of the chat's folder). The folder is in the workspace,
        # which the model writes: no link is ever followed.
        if workspace_files.is_file(self.workspace, path):
            return path
        # Never a half file under the final name, never written through a planted link.
        with workspace_files.atomic_writer(self.workspace, path, make_parents=True) as fh:
            await tg_file.download_to_memory(out=fh)
        return path

    # -- outbound --

    def render(self, text: str) -> list[str]:
        # Telegram counts the visible text (after parsing the HTML) in UTF-16 code units.
        return render_chunks(
            text, TELEGRAM_LIMIT, markdown_to_telegram_html, measure=telegram_length
        )

    def render_question(self, view: QuestionView) -> tuple[str, bool]:
        return telegram_question(view)

    def plain(self, chunk: str) -> str:
        return strip_telegram_html(chunk)

    def resplit(self, chunk: str) -> list[str]:
        """Halves (by visible length): Telegram counted more than we did."""
        return split_telegram_html(chunk, max(1, (telegram_length(chunk) + 1) // 2))

    def pace_limits(self, chat_id: str) -> list[Limit]:
        """Per chat (forum topics share their group's), per group, and per bot."""
        chat, _ = split_chat_key(chat_id)
        limits = self.cfg.rate_limits
        out = [Limit.of(f"chat:{chat}", limits.chat)]
        if chat < 0:  # groups, supergroups and channels have negative ids
            out.append(Limit.of(f"group:{chat}", limits.group))
        out.append(Limit.of("bot", limits.bot, shared=True))
        return out

    async def send_chunk(
        self, msg: OutboundMessage, chunk: str, plain: bool = False, *, first: bool = False
    ) -> None:
        if self.bot is None:
            raise TransientError("the Telegram client is not running")
        chat, thread = split_chat_key(msg.chat_id)
        reply = self._reply_parameters(msg, chat) if first else None
        cut = False
        if (view := question_view(msg)) is not None:
            fitted, cut = telegram_question(view, plain)
            if plain:  # without markup too, the model's text stays apart (a gutter)
                chunk = fitted
        with self.calling("sendMessage"):
            await self.bot.send_message(
                chat,
                chunk,
                parse_mode=None if plain else ParseMode.HTML,
                message_thread_id=thread,
                reply_parameters=reply,
                reply_markup=approval_keyboard(msg, cut),
            )

    async def send_file(self, msg: OutboundMessage, path: str) -> None:
        if self.bot is None:
            raise TransientError("the Telegram client is not running")
        chat, thread = split_chat_key(msg.chat_id)
        data = await self.file_to_send(path)
        with self.calling("sendDocument"):
            await self.bot.send_document(
                chat, InputFile(data, filename=Path(path).name), message_thread_id=thread
            )

    @contextlib.contextmanager
    def calling(self, method: str) -> Iterator[None]:
        token = _ANSWERED.set([])
        try:
            with super().calling(method):
                yield
        finally:
            _ANSWERED.reset(token)

    def classify(self, exc: Exception, method: str) -> SendError | FatalChannelError | None:
        if not isinstance(exc, TelegramError):
            # Not an answer of Telegram's: a bug, or an answer PTB could not read
            # (AttributeError on an odd result). After a 200, a new message is in the chat.
            answered = _ANSWERED.get() or []
            if method in _NOT_REPEATABLE and answered and _took(*answered[-1]):
                return AcceptedUnreadable(
                    f"{method}: Telegram answered 200, but its answer could not be read "
                    f"({type(exc).__name__}: {exc})"
                )
            return None
        answered = _ANSWERED.get() or []
        if type(exc) is TelegramError and answered and not _took(*answered[-1]):
            # PTB's bare "Invalid server response": a 200 that is not JSON, which Telegram
            # never sends (a captive portal, a proxy's page). Nothing was taken: try again.
            return TransientError(f"{method}: {exc.message} (not Telegram's answer)")
        if isinstance(exc, ChatMigrated):
            log.warning(
                "telegram: %s: the chat moved to supergroup %s; answers to the old id fail",
                method,
                exc.new_chat_id,
            )
        return send_error(exc, method)

    # -- streaming: drafts in private chats, an edited message in groups and topics --

    def preview_mode(self, chat_id: str) -> PreviewMode:
        chat, _ = split_chat_key(chat_id)
        # sendMessageDraft (Bot API 9.3) is for private chats only; it stores nothing.
        return "draft" if chat > 0 and self.feature_on("drafts") else "message"

    def preview_pieces(self, text: str) -> list[str]:
        # Shown plain while written (half a Markdown construct does not parse); the final
        # answer's edit renders it. Telegram counts UTF-16 units.
        return render_chunks(text, TELEGRAM_LIMIT, _as_is, measure=utf16_len)

    async def send_draft(self, chat_id: str, draft_id: int, text: str) -> None:
        if self.bot is None:
            raise TransientError("the Telegram client is not running")
        chat, thread = split_chat_key(chat_id)
        with self.calling("sendMessageDraft"):
            await self.bot.send_message_draft(chat, draft_id, text, message_thread_id=thread)

    async def send_preview(self, msg: OutboundMessage, text: str, *, first: bool = False) -> str:
        if self.bot is None:
            raise TransientError("the Telegram client is not running")
        chat, thread = split_chat_key(msg.chat_id)
        with self.calling("sendMessage"):
            sent = await self.bot.send_message(
                chat,
                text,
                message_thread_id=thread,
                reply_parameters=self._reply_parameters(msg, chat) if first else None,
            )
        return str(sent.message_id)

    def preview_shows(self, message_id: str, preview: str, chunk: str) -> bool:
        # Telegram compares the visible text and its entities: HTML without a tag makes
        # none, as plain text does (and an edit to the same answers "message is not modified").
        return "<" not in chunk and strip_telegram_html(chunk) == preview

    async def edit_chunk(
        self, chat_id: str, message_id: str, chunk: str, plain: bool = False
    ) -> None:
        if self.bot is None:
            raise TransientError("the Telegram client is not running")
        chat, _ = split_chat_key(chat_id)
        with self.calling("editMessageText"):
            try:
                await self.bot.edit_message_text(
                    chunk,
                    chat_id=chat,
                    message_id=int(message_id),
                    parse_mode=None if plain else ParseMode.HTML,
                )
            except BadRequest as exc:
                if "not modified" in exc.message.lower():
                    return  # it already says this: the edit's purpose is met
                raise

    async def delete_message(self, chat_id: str, message_id: str) -> None:
        if self.bot is None:
            raise TransientError("the Telegram client is not running")
        chat, _ = split_chat_key(chat_id)
        with self.calling("deleteMessage"):
            await self.bot.delete_message(chat, int(message_id))

    # -- approval buttons (callback queries) --

    async def _handle_press(self, query: CallbackQuery) -> Intake | None:
        """A button press: an approval answer on the bus (durable before it is confirmed),
        then the query is answered so the client stops its spinner."""
        sender = query.from_user
        message = query.message
        press = parse_press(query.data or "")
        if press is None or message is None or sender.is_bot:
            await self._answer_query(query, "This button is not for me.")
            return None
        sender_id = str(sender.id)
        if not self.policy.allowed(sender_id):
            name = f"@{sender.username}" if sender.username else ""
            self.policy.deny(sender_id, name, chat="button")
            await self._answer_query(query, "You are not allowed to use this bot.")
            return None
        is_group = message.chat.type in GROUP_TYPES
        thread = message.message_thread_id if isinstance(message, Message) else None
        inbound = InboundMessage(
            channel=CHANNEL,
            chat_id=chat_key(message.chat.id, thread if thread else None),
            sender_id=sender_id,
            text="",
            message_id=f"{message.chat.id}:cb:{query.id}",
            metadata={
                "approval": press,
                "is_group": is_group,
                "is_admin": self.policy.is_admin(sender_id),
                "sender_name": sender.full_name,
            },
        )
        try:
            verdict = await self.bus.publish_inbound(inbound)
        except Exception as exc:
            log.exception("telegram: intake failed for callback query %s", query.id)
            raise _Refused(f"intake failed ({type(exc).__name__})") from exc
        if verdict != "refused":
            await self._answer_query(query, "")
        return verdict

    async def _answer_query(self, query: CallbackQuery, text: str) -> None:
        try:
            await query.answer(text or None)
        except Exception as exc:  # the spinner stops by itself after a while
            # Any exception: one the SDK raises on an answer it cannot read (KeyError on a
            # result missing) would otherwise end the poll loop, after the press was stored.
            log.info("telegram: answerCallbackQuery failed: %s", _describe(exc))

    def _reply_parameters(self, msg: OutboundMessage, chat: int) -> ReplyParameters | None:
        """In groups an answer's first message quotes the message it answers."""
        target = telegram_message_id(msg.reply_to)
        if chat > 0 or target is None:
            return None
        return ReplyParameters(target, allow_sending_without_reply=True)

    async def admin_chats(self) -> list[str]:
        # A person's private chat with the bot has their user id (admins are user ids here).
        return sorted(a for a in self.policy.admins if a.isdigit())

    async def send_typing(self, chat_id: str) -> None:
        if self.bot is None:
            return
        chat, thread = split_chat_key(chat_id)
        await self.bot.send_chat_action(chat, ChatAction.TYPING, message_thread_id=thread)


def _as_is(text: str) -> str:
    return text


@functools.lru_cache(maxsize=16)
def telegram_question(view: QuestionView, plain: bool = False) -> tuple[str, bool]:
    """An approval question as one message's HTML (the text Telegram counts within its
    limit; the keyboard does not count), or its plain form for the retry without markup
    (the text behind a gutter), and whether its text was cut."""
    if plain:
        return fit_question(view, None, utf16_len, TELEGRAM_LIMIT)
    return fit_question(view, markdown_to_telegram_html, telegram_length, TELEGRAM_LIMIT)


def approval_keyboard(msg: OutboundMessage, cut: bool = False) -> InlineKeyboardMarkup | None:
    """The buttons of an approval request: one row per choice ("Show all" first when its
    text was cut to fit)."""
    buttons = approval_buttons(msg, cut)
    if not buttons:
        return None
    return InlineKeyboardMarkup(
        [[InlineKeyboardButton(label, callback_data=data)] for data, label in buttons]
    )


def _describe(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def _too_large(label: str, size: int) -> str:
    mb = size / (1024 * 1024)
    limit = MEDIA_MAX_BYTES // (1024 * 1024)
    return f"[a {label} of {mb:.1f} MB was attached; files over {limit} MB are not downloaded]"
