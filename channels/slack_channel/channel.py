"""Slack through slack-bolt: an ``AsyncApp`` fed by the Socket Mode handler, replies through the
Web API (``AsyncWebClient``).

Acknowledging an envelope is a promise to Slack that we have it: Slack redelivers an envelope
that is not acknowledged within 3 seconds (up to three retries, ``retry_attempt`` 1..3, same
``event_id``). The app runs with ``process_before_response=True``, so bolt sends the ack only
after our listener returned, and not at all when it raised. The listener returns once the
message is durable: a pending turn on disk (``bus.publish_inbound`` said "accepted" or
"duplicate"). Downloads take up to two minutes, far past the deadline, so a message with files
is accepted naming them (``bot.media.FileRef``: id, name, size, type, URL; never the token) and
the files are fetched after the ack, when its turn is about to run (``fetch_media``, called by
the core); a crash in between leaves the pending turn, whose files are fetched at the next
start. "refused" (memobot is stopping) and unexpected errors raise, so nothing is acknowledged
and Slack's redelivery brings the message back. Earlier versions kept such messages in an
inbox of their own in ``state/channels/slack.json``; ``start`` moves what is left there into
the core's intake, once.

Sessions: a DM is one session (``slack:D0123``), a thread in a DM its own
(``slack:D0123:1700000000.000100``); in channels every thread is its own session
(``slack:C0123:1700000000.000100``) and the answer goes into that thread. Once memobot is in a
thread (mentioned there), follow-ups in it are answered without a new mention.

Commands: Slack clients take a leading ``/`` as a slash command, so memobot's chat commands are
``/memobot new|stop|status|dream|whoami|help`` (a slash command the app registers) or ``!new``,
``!stop``... as plain text.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import re
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import aiohttp
from pydantic import (
    BaseModel,
    ConfigDict,
    StrictBool,
    StrictStr,
    ValidationError,
    model_validator,
)
from slack_bolt.adapter.socket_mode.aiohttp import AsyncSocketModeHandler
from slack_bolt.app.async_app import AsyncApp
from slack_bolt.context.ack.async_ack import AsyncAck
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.socket_mode.aiohttp import SocketModeClient
from slack_sdk.web.async_client import AsyncWebClient

from bot import workspace_files
from bot.bus import InboundMessage, Intake, MessageBus, OutboundMessage
from bot.commands import CHANNEL_COMMANDS, COMMANDS, CommandSyntax
from bot.gate.question import QuestionView, fit_question
from bot.media import Fetched, FileRef, not_fetched
from bot.proxy import http_proxy, socks_connector
from bot.workspace import chat_media_dir
from channels.access import (
    PRESS_PREFIX,
    AccessPolicy,
    approval_buttons,
    parse_press,
    question_view,
    whoami_text,
)
from channels.base import Channel, PreviewMode, safe_file_name
from channels.errors import (
    FatalChannelError,
    FeatureUnavailable,
    PermanentError,
    RetryAfter,
    SendError,
    TransientError,
)
from channels.formatting import (
    SLACK_LIMIT,
    SLACK_SECTION_LIMIT,
    markdown_to_slack_mrkdwn,
    render_chunks,
    split_markdown,
    strip_markdown,
)
from channels.pacing import Limit
from channels.retry import Reconnect
from channels.slack_channel.config import SlackConfig
from channels.slack_channel.errors import (
    LOGIN,
    NATIVE_STREAMS,
    OPTIONAL_METHODS,
)
from channels.slack_channel.errors import api_error as _api_error
from channels.slack_channel.errors import error_code as _error_code
from channels.state import ChannelState

log = logging.getLogger(__name__)

NAME = "slack"
MEDIA_MAX_BYTES = 20 * 1024 * 1024
UPLOAD_MAX_BYTES = 1024 * 1024 * 1024  # Slack takes files up to 1 GB
RECENT_EVENTS_KEPT = 1000
NAMES_KEPT = 1000
HTTP_TIMEOUT_SECONDS = 30.0
DOWNLOAD_TIMEOUT_SECONDS = 120.0
DOWNLOAD_RETRY_WAITS = (2.0, 10.0)  # before the second and the third try of a download
USER_LOOKUP_SECONDS = 3.0
NAME_WAIT_BEFORE_ACK = 0.5  # of Slack's 3 s ack deadline, at most this for a sender's name
DOWNLOADS_AT_ONCE = 4  # file downloads in flight, all chats together
# Files fetched of one message (Slack's clients attach at most 10): a message naming hundreds
# (the Web API, a forged payload) would hold its chat for hours and fill the disk.
FILES_PER_MESSAGE = 20
START_WAIT_SECONDS = 5.0  # start() returns by then even if Slack is not reachable yet
CONNECT_TIMEOUT_SECONDS = 30.0
CONNECT_BACKOFF_START, CONNECT_BACKOFF_MAX = 1.0, 30.0
WATCH_SECONDS = 2.0
STOP_WAIT_SECONDS = 3.0
ACK_DEADLINE_SECONDS = 3.0  # Slack redelivers an envelope not acknowledged by then
THREADS_KEPT = 5000  # threads memobot is in, remembered for follow-ups without a mention
SLASH_COMMAND = "/memobot"
COMMAND_PREFIX = "!"  # "!stop": Slack clients take a leading "/" as a slash command
COMMAND_SYNTAX = CommandSyntax(
    COMMAND_PREFIX,
    CHANNEL_COMMANDS,
    f"Or the slash command {SLASH_COMMAND} with a command's name: {SLASH_COMMAND} stop",
)
CHAT_COMMANDS = frozenset(c.removeprefix("/") for c in COMMANDS | COMMAND_SYNTAX.answers)

ASKERS_KEPT = 1000  # (chat, message) -> sender and team, for a stream's recipient
PREVIEWS_KEPT = 1000  # preview messages (streams or posts) this process knows
STREAM_TEXT_MAX = 12000  # characters of markdown_text per chat.*Stream call (Slack's limit)
# chat.startStream refusals meaning the app or the workspace offers no streaming (not
# enabled, no chat:write, not a bot token): remembered for the process lifetime.
STREAMING_UNAVAILABLE = frozenset(
    {"unknown_method", "not_allowed_token_type", "missing_scope", "no_permission", "access_denied"}
)
# Refusals for a conversation (its type, or recipients Slack does not take): per channel.
STREAMING_NOT_HERE = frozenset(
    {
        "channel_type_not_supported",
        "invalid_arguments",
        "missing_recipient_team_id",
        "missing_recipient_user_id",
        "team_not_found",
        "user_not_found",
    }
)
# A stream Slack ended on its side (its lifetime passed, or the reader stopped it): the
# message stays and chat.update edits it.
STREAM_ENDED = frozenset({"message_not_in_streaming_state", "stopped_by_user"})

# Message subtypes that are still a person writing to us; the rest (edits, deletions, joins,
# bot_message...) are ignored.
USER_SUBTYPES = frozenset({"file_share", "thread_broadcast"})
GROUP_CHANNEL_TYPES = frozenset({"channel", "group", "mpim"})
UNHOSTED_FILE_MODES = frozenset({"external", "tombstone", "hidden_by_limit"})

_ANGLE = re.compile(r"<([^<>]*)>")


# --- platform payloads (validated at the boundary, unknown fields kept) ---------------------


class SlackFile(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)

    id: str = ""
    name: str = ""
    mimetype: str = ""
    size: int = 0
    mode: str = ""
    url_private: str = ""
    url_private_download: str = ""

    @model_validator(mode="before")
    @classmethod
    def _nulls_left_out(cls, data: Any) -> Any:
        """A null field is one left out: one file described oddly (``"name": null``) made
        the whole event malformed, and the person's message was dropped unanswered."""
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v is not None}
        return data


class SlackEvent(BaseModel):
    """The ``event`` of an Events API callback (``app_mention`` or ``message``)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    type: str
    subtype: str | None = None
    user: str | None = None
    bot_id: str | None = None
    text: str | None = None
    ts: str = ""
    thread_ts: str | None = None
    channel: str = ""
    channel_type: str | None = None
    hidden: bool = False
    files: tuple[SlackFile, ...] = ()
    user_profile: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Identity:
    """Who the bot is, from ``auth.test``."""

    user_id: str
    bot_id: str | None = None


@dataclass(frozen=True, slots=True)
class Incoming:
    """An event that is a person writing to memobot, before allowFrom."""

    chat_id: str
    channel: str
    thread_ts: str | None  # where the answer goes; None: the DM itself
    user: str
    text: str
    message_id: str
    is_dm: bool
    files: tuple[SlackFile, ...]
    sender_name: str
    team: str = ""  # the sender's workspace (Slack Connect: not always ours)


@dataclass(frozen=True, slots=True)
class Ignored:
    reason: str


# --- pure helpers ---------------------------------------------------------------------------


def route(
    event: SlackEvent, me: Identity, group_policy: str, threads: Collection[str] = ()
) -> Incoming | Ignored:
    """Decide whether ``event`` is for memobot, and which session it belongs to.

    DMs (``message`` with channel_type "im") always count; a DM thread is its own session.
    In channels ``app_mention`` counts, and so does a plain message in a thread listed in
    ``threads`` (``"C0123:1700.1"``, threads memobot is in), or any channel message when
    ``group_policy`` is "open". The message id is the message's ``ts``: the same in every retry
    and in both the ``app_mention`` and the ``message`` event Slack sends for one mention.
    """
    if event.type not in ("app_mention", "message"):
        return Ignored(f"event type {event.type}")
    if event.subtype is not None and event.subtype not in USER_SUBTYPES:
        return Ignored(f"message subtype {event.subtype}")
    if event.bot_id or event.hidden or not event.user:
        return Ignored("written by a bot")
    if event.user == me.user_id:
        return Ignored("our own message")
    if not event.channel or not event.ts:
        return Ignored("no channel or ts")
    is_dm = event.channel_type == "im" or event.channel.startswith("D")
    if event.type == "message" and not is_dm:
        if event.channel_type not in GROUP_CHANNEL_TYPES:
            return Ignored(f"channel type {event.channel_type}")
        in_thread = event.thread_ts is not None and f"{event.channel}:{event.thread_ts}" in threads
        if group_policy != "open" and not in_thread:
            return Ignored("channel message without a mention")
    thread_ts = event.thread_ts if is_dm else (event.thread_ts or event.ts)
    return Incoming(
        chat_id=f"{event.channel}:{thread_ts}" if thread_ts else event.channel,
        channel=event.channel,
        thread_ts=thread_ts,
        user=event.user,
        text=chat_command(slack_to_text(strip_mention(event.text or "", me.user_id))),
        message_id=event.ts,
        is_dm=is_dm,
        files=event.files,
        sender_name=profile_name(event.user_profile),
    )


def strip_mention(text: str, bot_user_id: str) -> str:
    """``text`` without ``<@BOT>`` / ``<@BOT|name>`` mentions of the bot, whitespace tidied."""
    stripped = re.sub(rf"<@{re.escape(bot_user_id)}(?:\|[^>]*)?>", " ", text)
    return re.sub(r"[ \t]{2,}", " ", stripped).strip()


def slack_to_text(text: str) -> str:
    """Slack's wire text as a person reads it: links, channels and @here spelled out, and
    ``&lt;`` ``&gt;`` ``&amp;`` unescaped. A user mention without a name stays ``<@U…>``: the
    member id is all Slack gives, and it tells the model who was meant."""

    def readable(match: re.Match[str]) -> str:
        inner = match.group(1)
        target, _, label = inner.partition("|")
        if target.startswith("@"):
            return match.group(0) if not label else f"@{label}"
        if target.startswith("#"):
            return f"#{label or target[1:]}"
        if target.startswith("!"):
            if target.startswith("!subteam^"):
                return label or "@group"
            return label or f"@{target[1:].split('^', 1)[0]}"
        if label and label != target.split("://", 1)[-1].removeprefix("mailto:"):
            return f"{label} ({target})"
        return target.removeprefix("mailto:")

    converted = _ANGLE.sub(readable, text)
    return converted.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def profile_name(profile: dict[str, Any] | None) -> str:
    if not profile:
        return ""
    for key in ("display_name", "real_name", "name"):
        value = profile.get(key)
        if isinstance(value, str) and value:
            return value
    return ""


def file_refs(files: tuple[SlackFile, ...]) -> tuple[FileRef, ...]:
    """A message's files as the pending turn names them: what fetching needs (the download
    URL, the size, whether Slack hosts it), and never the token."""
    return tuple(
        FileRef(
            id=f.id,
            name=f.name,
            size=f.size or None,
            mimetype=f.mimetype,
            url=f.url_private_download or f.url_private,
            extra=_file_extra(f),
        )
        for f in files
    )


def _file_extra(f: SlackFile) -> dict[str, str]:
    """What fetching needs beyond the URL: the file's ``mode`` (hosted by Slack or not), and
    ``file_access`` "check_file_info" for a file Slack names without its details (a Slack
    Connect channel's: ``files.info`` gives them)."""
    extra = {"mode": f.mode} if f.mode else {}
    access = (f.model_extra or {}).get("file_access")
    if isinstance(access, str) and access:
        extra["file_access"] = access
    return extra


def sender_team(event: SlackEvent, payload: dict[str, Any]) -> str:
    """The workspace of the person who wrote ``event``: ``user_team`` (a Slack Connect channel
    holds people of other workspaces), else the event's or the envelope's team."""
    extra = event.model_extra or {}
    for value in (extra.get("user_team"), extra.get("team"), payload.get("team_id")):
        if isinstance(value, str) and value:
            return value
    return ""


def chat_command(text: str) -> str:
    """``!stop`` -> ``/stop`` (for the known commands only); any other text as is."""
    stripped = text.strip()
    if not stripped.startswith(COMMAND_PREFIX):
        return text
    head, sep, rest = stripped[len(COMMAND_PREFIX) :].partition(" ")
    if head.lower() not in CHAT_COMMANDS:
        return text
    return f"/{head.lower()}{sep}{rest}"


def is_whoami(text: str) -> bool:
    head = text.strip().split(maxsplit=1)
    return bool(head) and head[0].split("@", 1)[0].lower() == "/whoami"


@functools.lru_cache(maxsize=16)
def slack_question(view: QuestionView) -> tuple[str, bool]:
    """An approval question as the mrkdwn of one section block, and whether its text was
    cut (a section holds at most 3,000 characters)."""
    return fit_question(view, markdown_to_slack_mrkdwn, len, SLACK_SECTION_LIMIT)


def approval_blocks(msg: OutboundMessage, chunk: str, plain: bool) -> dict[str, Any]:
    """``blocks`` for an approval request: its text (``slack_question``, fitted to one
    section), then a row of buttons (Block Kit); {} for any other message. ``text`` stays as
    the notification fallback."""
    view = question_view(msg)
    buttons = approval_buttons(msg, cut=view is not None and slack_question(view)[1])
    if not buttons:
        return {}
    elements = [
        {
            "type": "button",
            "action_id": data,
            "value": data,
            "text": {"type": "plain_text", "text": label},
            **({"style": "danger"} if data.endswith(":deny") else {}),
            **({"style": "primary"} if data.endswith(":once") else {}),
        }
        for data, label in buttons
    ]
    return {
        "blocks": [
            {
                "type": "section",
                "text": {"type": "plain_text" if plain else "mrkdwn", "text": chunk},
            },
            {"type": "actions", "block_id": "approval", "elements": elements},
        ]
    }


def split_chat_id(chat_id: str) -> tuple[str, str | None]:
    """``"C1:1700.1"`` -> ("C1", "1700.1"); a DM ``"D1"`` -> ("D1", None)."""
    channel, _, thread_ts = chat_id.partition(":")
    return channel, thread_ts or None


@contextlib.contextmanager
def _network_errors() -> Iterator[None]:
    """A streaming call's network failures as ``TransientError``; Slack's refusals
    (``SlackApiError``) pass through, for the caller to tell "not here" from "try again"."""
    try:
        yield
    except SlackApiError:
        raise
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise TransientError(f"slack unreachable: {exc!r}") from exc
    except SlackClientError as exc:
        raise PermanentError(f"slack client refused the call: {exc}") from exc


def _same(text: str) -> str:
    return text


def _mrkdwn_length(text: str) -> int:
    return len(markdown_to_slack_mrkdwn(text))


@dataclass(slots=True)
class _Preview:
    """A preview message of this process: a native stream (``streaming`` while it is open,
    ``text`` the Markdown it shows) or a posted message (``posted``: never a stream)."""

    chat_id: str
    text: str = ""
    streaming: bool = False
    posted: bool = False


def proxy_settings(proxy: str) -> tuple[str | None, Callable[[], aiohttp.BaseConnector] | None]:
    """(http proxy URL for aiohttp's ``proxy=``, connector factory for socks5) for
    ``channels.slack.proxy``. ``socks5h``: the proxy resolves host names."""
    if not proxy:
        return None, None
    if http_proxy(proxy):
        return proxy, None
    return None, lambda: socks_connector(proxy)


class _DownloadError(Exception):
    pass


class _TooLarge(_DownloadError):
    pass


class _TryAgain(_DownloadError):
    """Slack's passing trouble (HTTP 429, 5xx): the download is worth another try."""


def _download_problem(exc: BaseException) -> str:
    """Why a download failed, in words the person and the model read (the note in the
    message): never the exception's own text, which names the URL a redirect led to, query
    and all (a signed link is a credential), or a temporary file's name."""
    if isinstance(exc, _DownloadError):
        return str(exc)  # our own words
    if isinstance(exc, aiohttp.TooManyRedirects):
        return "too many redirects"
    if isinstance(exc, aiohttp.ClientResponseError):
        return f"HTTP {exc.status}"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"cannot connect to {exc.host}"
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, OSError) and not isinstance(exc, aiohttp.ClientError) and exc.strerror:
        return exc.strerror  # the disk's trouble: "No space left on device"
    return type(exc).__name__


def _header(request: AsyncBoltRequest, name: str) -> str | None:
    values = request.headers.get(name) or []
    return values[0] if values else None


class _OldInboxEntry(BaseModel):
    """An entry of the inbox earlier versions kept in ``state/channels/slack.json``, checked
    field by field: one of the wrong type (a hand edit, a disk error) is dropped with a log
    line, where it raised at start and stopped the gateway at every start."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    event_id: StrictStr
    chat_id: StrictStr
    channel: StrictStr
    thread_ts: StrictStr | None = None
    user: StrictStr
    text: StrictStr
    message_id: StrictStr
    is_dm: StrictBool
    files: tuple[SlackFile, ...] = ()
    sender_name: StrictStr = ""
    team: StrictStr = ""

    def incoming(self) -> Incoming:
        return Incoming(**{k: getattr(self, k) for k in Incoming.__dataclass_fields__})


def _valid(entry: Any) -> bool:
    return isinstance(entry, dict) and all(
        isinstance(entry.get(k), str) for k in ("chat_id", "message_id", "event_id", "user")
    )


def _listed(value: Any) -> list[Any]:
    """A list kept in a state file, or [] for anything else there (a hand edit)."""
    return value if isinstance(value, list) else []


# --- the channel ----------------------------------------------------------------------------


class _NotTaken(Exception):
    """Raised by a listener so that bolt does not acknowledge the envelope."""


def _app_token_refused(exc: SlackApiError) -> FatalChannelError:
    return FatalChannelError(
        f"Slack refused channels.slack.appToken (apps.connections.open: "
        f"{_error_code(exc)}); it must be an app-level token (xapp-...) "
        "with the connections:write scope, and Socket Mode must be enabled"
    )


class _SocketClient(SocketModeClient):
    """slack_sdk's client, with Slack's ``disconnect`` envelopes seen before it reconnects.

    slack_sdk answers every ``disconnect`` by opening a new connection. ``warning`` and
    ``refresh_requested`` want exactly that; ``link_disabled`` means the app's Socket Mode was
    turned off, and no reconnection can help, so it goes to ``on_link_disabled`` instead."""

    on_disconnect: Callable[[str], Awaitable[bool]] | None = None
    # Told when Slack refuses the app token while slack_sdk reconnects on its own (revoked or
    # regenerated meanwhile): no later try can succeed, so the channel fails for good.
    on_refused: Callable[[SlackApiError], None] | None = None

    async def issue_new_wss_url(self) -> str:
        # Not super(): it logs every refusal at ERROR, once per reconnect try, for ever.
        try:
            opened = await self.web_client.apps_connections_open(app_token=self.app_token)
        except SlackApiError as exc:
            mapped = _api_error(exc)
            if isinstance(mapped, RetryAfter):
                await asyncio.sleep(mapped.seconds)
                return await self.issue_new_wss_url()
            # Only a refused token (invalid_auth, token_revoked..., and as at a login the wrong
            # kind of token): a proxy's 403, or a code for a passing state
            # (team_added_to_org), is tried again as slack_sdk does.
            refused = isinstance(_api_error(exc, LOGIN), FatalChannelError)
            if refused and self.on_refused is not None:
                self.on_refused(exc)
            raise
        return str(opened["url"])

    async def run_message_listeners(self, message: dict[str, Any], raw_message: str) -> None:
        if message.get("type") == "disconnect" and self.on_disconnect is not None:
            if not await self.on_disconnect(str(message.get("reason") or "")):
                return
        await super().run_message_listeners(message, raw_message)


class _SocketModeHandler(AsyncSocketModeHandler):
    """bolt's aiohttp Socket Mode handler around a client built by us (proxy, disconnects)."""

    def __init__(self, app: AsyncApp, client: SocketModeClient) -> None:
        # Not super().__init__: that builds a second client with its own aiohttp session.
        self.app = app
        self.app_token = client.app_token
        self.client = client
        client.socket_mode_request_listeners.append(self.handle)  # type: ignore[arg-type]


class SlackChannel(Channel):
    name = NAME
    command_syntax = COMMAND_SYNTAX
    sends_files = True
    max_file_bytes = UPLOAD_MAX_BYTES
    optional_methods = OPTIONAL_METHODS

    def __init__(
        self, bus: MessageBus, cfg: SlackConfig, workspace: Path, state_dir: Path | None = None
    ) -> None:
        super().__init__(bus)
        self.cfg = cfg
        self.workspace = workspace
        self.policy = AccessPolicy.for_channel(NAME, cfg, state_dir)
        self.streaming = cfg.streaming
        self.stream_interval = cfg.stream_edit_interval_seconds
        self.typing_delay = cfg.typing_delay_seconds
        self.me: Identity | None = None
        self.web: AsyncWebClient | None = None
        self.app: AsyncApp | None = None
        self.socket: SocketModeClient | None = None
        self._http: aiohttp.ClientSession | None = None
        self._http_proxy, self._connector = proxy_settings(cfg.proxy)
        self._store = ChannelState(state_dir, NAME) if state_dir is not None else None
        saved = self._store.load() if self._store else {}
        # Messages an earlier version acknowledged and kept in an inbox of its own, oldest
        # first: moved into the core's intake at start (``_migrate_inbox``).
        self._legacy_inbox: list[dict[str, Any]] = [
            e for e in _listed(saved.get("inbox")) if _valid(e)
        ]
        self._threads: OrderedDict[str, None] = OrderedDict.fromkeys(
            t for t in _listed(saved.get("threads")) if isinstance(t, str)
        )
        self._last_thread: dict[tuple[str, str], str] = {}  # (channel, user) -> chat id
        self._downloads = asyncio.Semaphore(DOWNLOADS_AT_ONCE)
        self._recent: OrderedDict[str, None] = OrderedDict()  # event ids taken or ignored
        self._names: OrderedDict[str, str] = OrderedDict()
        self._names_enabled = True
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}
        self._handlers: set[asyncio.Task[Any]] = set()
        self._lookups: dict[str, asyncio.Task[str]] = {}
        self._save_lock = asyncio.Lock()
        self._supervisor: asyncio.Task[None] | None = None
        self._watchdog: asyncio.Task[None] | None = None
        self._settled: asyncio.Event | None = None
        self._closing: asyncio.Future[None] | None = None  # a socket whose token was refused
        self._connected_once = False
        # Where else the bot token may go with a file download: the configured apiUrl's
        # scheme and host (a proxy, a local test server).
        api = urlsplit(cfg.api_url)
        self._file_origins = {(api.scheme, api.hostname)} if cfg.api_url else set()
        self._askers: OrderedDict[tuple[str, str], tuple[str, str]] = OrderedDict()
        self._previews: OrderedDict[str, _Preview] = OrderedDict()  # by ts
        self._native_off: dict[str, str] = {}  # a channel id -> Slack's refusal there

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Check the tokens, open Socket Mode; returns once connected, failed, or after
        ``START_WAIT_SECONDS`` (the connection keeps being retried in the background)."""
        self.policy.log_startup()
        for key, token, prefix in (
            ("botToken", self.cfg.bot_token, "xoxb-"),
            ("appToken", self.cfg.app_token, "xapp-"),
        ):
            if not token.startswith(prefix):
                log.warning("slack: channels.slack.%s does not start with %r", key, prefix)
        self.set_state("starting")
        self._settled = asyncio.Event()
        self._http = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=HTTP_TIMEOUT_SECONDS),
            connector=self._connector() if self._connector else None,
        )
        self.web = AsyncWebClient(
            token=self.cfg.bot_token,
            base_url=self.cfg.api_url or AsyncWebClient.BASE_URL,
            proxy=self._http_proxy,
            session=self._http,
            timeout=int(HTTP_TIMEOUT_SECONDS),
            logger=logging.getLogger(f"{__name__}.web"),
        )
        if self._connector:
            self.web.proxy = None  # the socks connector carries it; no env proxy on top
        self.app = self._build_app(self.web)
        await self._migrate_inbox()
        self._supervisor = asyncio.create_task(self._connect_forever(), name="slack-connect")
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(START_WAIT_SECONDS):
                await self._settled.wait()
        if self.state == "starting":
            log.warning(
                "slack: not connected after %.0f s; still trying in the background",
                START_WAIT_SECONDS,
            )

    async def stop(self) -> None:
        tasks = [
            t
            for t in (
                self._supervisor,
                self._watchdog,
                *self._lookups.values(),
            )
            if t
        ]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._handlers:  # events half-way through intake: let them finish or not ack
            await asyncio.wait(set(self._handlers), timeout=STOP_WAIT_SECONDS)
        await self._close_socket()
        if self._http is not None:
            await self._http.close()
            self._http = None
        self.set_state("stopped")

    def _build_app(self, web: AsyncWebClient) -> AsyncApp:
        """The bolt app: events and the ``/memobot`` command, acknowledged after the listener.

        A listener that raises leaves its envelope unacknowledged (bolt answers 500 and the
        Socket Mode adapter sends nothing), so Slack delivers it again."""
        app = AsyncApp(
            # Named, or bolt names it after its caller's file through inspect.stack(): about
            # 0.1 s of CPU (source lines read for every frame) at each (re)connect.
            name="memobot",
            client=web,
            process_before_response=True,
            logger=logging.getLogger(f"{__name__}.bolt"),
        )
        app.event("app_mention")(self._on_event)
        app.event("message")(self._on_event)
        app.event(re.compile(".*"))(self._on_other_event)  # acknowledged, nothing to do
        app.command(SLASH_COMMAND)(self._on_command)
        app.action(re.compile(f"^{PRESS_PREFIX}:"))(self._on_action)
        app.error(self._on_error)
        return app

    async def _connect_forever(self) -> None:
        """auth.test + apps.connections.open + WebSocket, with capped exponential backoff.

        Once connected, slack_sdk's client reconnects by itself (new URL, new socket) and the
        watchdog reports the state. A rejected token stops the channel ("failed")."""
        reconnect = Reconnect(
            start=CONNECT_BACKOFF_START, maximum=CONNECT_BACKOFF_MAX, timeouts_at_once=False
        )
        while True:
            cause: Exception
            try:
                async with asyncio.timeout(CONNECT_TIMEOUT_SECONDS):
                    await self._connect()
                break
            except FatalChannelError as exc:
                self._fail(str(exc))
                return
            except TimeoutError as exc:
                cause, detail = exc, "cannot connect: timed out"
            except (SlackApiError, SlackClientError, aiohttp.ClientError, OSError) as exc:
                cause = exc
                if isinstance(exc, SlackApiError):
                    mapped = _api_error(exc)
                    if isinstance(mapped, RetryAfter):
                        cause = mapped
                detail = f"cannot connect: {exc}"
            await self._close_socket()
            self.set_state("reconnecting", detail)
            wait = reconnect.wait_after(cause) or 0.0  # a refused token raised above
            log.warning("slack: %s; retrying in %.0f s", detail, wait)
            await reconnect.clock.sleep(wait)
        self._watchdog = asyncio.create_task(self._watch(), name="slack-watch")

    async def _connect(self) -> None:
        assert self.web is not None and self.app is not None
        try:
            auth = await self.web.auth_test()
        except SlackApiError as exc:
            if isinstance(_api_error(exc, LOGIN), FatalChannelError):
                raise FatalChannelError(
                    f"Slack refused channels.slack.botToken (auth.test: "
                    f"{_error_code(exc)}); it must be the app's bot token, xoxb-..."
                ) from exc
            raise
        self.me = Identity(str(auth["user_id"]), auth.get("bot_id"))
        try:
            opened = await self.web.apps_connections_open(app_token=self.cfg.app_token)
        except SlackApiError as exc:
            mapped = _api_error(exc)
            if not isinstance(mapped, RetryAfter | TransientError):
                raise _app_token_refused(exc) from exc
            raise
        client = _SocketClient(
            app_token=self.cfg.app_token,
            logger=logging.getLogger(f"{__name__}.socket"),
            web_client=self.web,
            proxy=self._http_proxy,
        )
        if self._connector:
            await client.aiohttp_client_session.close()
            client.aiohttp_client_session = aiohttp.ClientSession(connector=self._connector())
            client.proxy = None
        client.on_disconnect = self._on_disconnect
        client.on_refused = self._on_app_token_refused
        _SocketModeHandler(self.app, client)
        client.message_listeners.append(self._on_message)
        client.on_close_listeners.append(self._on_close)
        client.wss_uri = opened["url"]
        self.socket = client
        await client.connect()

    async def _close_socket(self) -> None:
        if self.socket is not None:
            socket, self.socket = self.socket, None
            try:
                await socket.close()
            except (aiohttp.ClientError, OSError) as exc:
                log.debug("slack: closing a failed socket: %s", exc)

    def _on_app_token_refused(self, exc: SlackApiError) -> None:
        if self.state == "failed":
            return
        self._fail(str(_app_token_refused(exc)))
        self._closing = asyncio.ensure_future(self._close_socket())

    def _fail(self, message: str) -> None:
        """Failed for good (``Channel.fail``: one error line, the manager is told)."""
        self.fail(FatalChannelError(message))
        if self._settled:
            self._settled.set()

    async def _watch(self) -> None:
        """Reports what slack_sdk's own reconnection does, in ``state`` (memobot status)."""
        while True:
            await asyncio.sleep(WATCH_SECONDS)
            socket = self.socket
            if socket is None or self.state == "failed":
                continue
            up = await socket.is_connected()
            if self.state == "connected" and not up:
                self.set_state("reconnecting", "Socket Mode connection lost")
                log.warning("slack: Socket Mode connection lost; reconnecting")
            elif self.state == "reconnecting" and up:
                self.set_state("connected")
                log.info("slack: Socket Mode reconnected")

    async def _on_message(self, client: Any, message: dict[str, Any], raw: str | None) -> None:
        if message.get("type") != "hello":
            return
        if self.state != "connected":
            if self._connected_once:
                log.info("slack: Socket Mode reconnected")
            else:
                log.info(
                    "slack: connected over Socket Mode as <@%s>",
                    self.me.user_id if self.me else "?",
                )
        self._connected_once = True
        self.set_state("connected")
        if self._settled:
            self._settled.set()

    async def _on_close(self, message: Any) -> None:
        # slack_sdk runs this after it has already opened the next connection, if it could.
        if self.socket is not None and await self.socket.is_connected():
            return
        if self.state == "connected":
            self.set_state("reconnecting", "Slack closed the Socket Mode connection")
            log.info("slack: Socket Mode connection closed by Slack; reconnecting")

    async def _on_disconnect(self, reason: str) -> bool:
        """A ``disconnect`` envelope; True lets slack_sdk reconnect (``warning``,
        ``refresh_requested``: Slack is about to close this connection)."""
        if reason != "link_disabled":
            log.info("slack: Slack asked to reconnect (%s); opening a new connection", reason)
            return True
        self._fail(
            "Slack disabled this app's Socket Mode connection (disconnect: link_disabled); "
            "turn Socket Mode back on in the app's settings"
        )
        await self._close_socket()
        return False

    # -- receiving ---------------------------------------------------------------------------

    async def _on_event(self, body: dict[str, Any], request: AsyncBoltRequest) -> None:
        """One Events API envelope. Returns (and bolt acknowledges) once its message is durable,
        ignored or a duplicate; raises otherwise, so that Slack delivers it again."""
        event_id = str(body.get("event_id") or (body.get("event") or {}).get("ts") or "")
        retry = _header(request, "x-slack-retry-num")
        if retry and retry != "0":
            log.info(
                "slack: redelivery %s of event_id=%s (%s)",
                retry,
                event_id,
                _header(request, "x-slack-retry-reason") or "no reason given",
            )
        if event_id in self._recent:
            return
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
        try:
            started = time.monotonic()
            verdict = await self._take(event_id, body)
        finally:
            if task is not None:
                self._handlers.discard(task)
        if verdict == "refused":
            raise _NotTaken(f"event_id={event_id} not taken: memobot is stopping")
        spent = time.monotonic() - started
        if spent > ACK_DEADLINE_SECONDS / 2:
            log.warning(
                "slack: intake of event_id=%s took %.1f s (Slack waits 3 s)", event_id, spent
            )

    async def _on_other_event(self, body: dict[str, Any]) -> None:
        log.debug("slack: %s event ignored", (body.get("event") or {}).get("type"))

    async def _on_error(self, error: Exception, body: dict[str, Any]) -> None:
        what = body.get("event_id") or body.get("command") or body.get("type") or "envelope"
        if isinstance(error, _NotTaken):
            log.warning("slack: %s; not acknowledged, so Slack delivers it again", error)
            return
        log.error(
            "slack: %s not taken; not acknowledged, so Slack delivers it again",
            what,
            exc_info=error,
        )

    async def _on_command(self, ack: AsyncAck, command: dict[str, Any]) -> Any:
        """``/memobot <command> [args]``: the chat commands, which Slack clients would take as
        slash commands of their own if typed as ``/stop``. In a channel it acts on the thread
        the sender last wrote to memobot in."""
        user = str(command.get("user_id") or "")
        channel = str(command.get("channel_id") or "")
        words = str(command.get("text") or "").split(maxsplit=1)
        sub = words[0].lower().lstrip("/!") if words else "help"
        args = words[1] if len(words) > 1 else ""
        self.touch()
        allowed = self.policy.allowed(user)
        if sub == "whoami" or not allowed:
            if not allowed:
                self.policy.deny(user, str(command.get("user_name") or ""), chat="command")
            return await ack(text=whoami_text(NAME, user, allowed))
        if sub not in CHAT_COMMANDS:
            usage = "|".join(sorted(CHAT_COMMANDS))
            return await ack(text=f"Unknown command {sub!r}. Usage: {SLASH_COMMAND} {usage}")
        chat_id = self._last_thread.get((channel, user))
        if chat_id is None and channel.startswith("D"):
            chat_id = channel
        if chat_id is None:
            return await ack(
                text=f"Which conversation? Write {COMMAND_PREFIX}{sub} in the thread you mean."
            )
        trigger = str(command.get("trigger_id") or "")
        msg = InboundMessage(
            NAME,
            chat_id,
            user,
            f"/{sub} {args}".strip(),
            message_id=f"cmd-{trigger}" if trigger else None,
            metadata={
                "is_group": not channel.startswith("D"),
                "is_admin": self.policy.is_admin(user),
                "sender_name": str(command.get("user_name") or ""),
                "event_id": f"command {trigger}",
            },
        )
        if await self.bus.publish_inbound(msg) == "refused":
            raise _NotTaken(f"{SLASH_COMMAND} {sub} not taken: memobot is stopping")
        return await ack()

    async def _on_action(self, ack: AsyncAck, body: dict[str, Any]) -> None:
        """An approval button (Block Kit): the press goes on the bus and is durable before
        bolt acknowledges it; "refused" raises, so it is not acknowledged."""
        self.touch()
        user = str((body.get("user") or {}).get("id") or "")
        channel = str((body.get("channel") or {}).get("id") or "")
        message = body.get("message") or {}
        actions = body.get("actions") or [{}]
        press = parse_press(str(actions[0].get("action_id") or ""))
        if press is None or not channel:
            await ack()
            return
        if not self.policy.allowed(user):
            name = str((body.get("user") or {}).get("username") or "")
            self.policy.deny(user, name, chat="button")
            await ack()
            return
        thread = message.get("thread_ts")
        msg = InboundMessage(
            NAME,
            f"{channel}:{thread}" if thread else channel,
            user,
            "",
            message_id=f"action-{body.get('trigger_id') or actions[0].get('action_ts')}",
            metadata={
                "approval": press,
                "is_group": not channel.startswith("D"),
                "is_admin": self.policy.is_admin(user),
            },
        )
        if await self.bus.publish_inbound(msg) == "refused":
            raise _NotTaken("approval button not taken: memobot is stopping")
        await ack()

    async def _take(self, event_id: str, payload: dict[str, Any]) -> Intake | Literal["ignored"]:
        self.touch()
        try:
            event = SlackEvent.model_validate(payload.get("event") or {})
        except ValidationError as exc:
            log.warning("slack: malformed event event_id=%s ignored: %s", event_id, exc)
            return "ignored"
        if self.me is None:
            return "refused"  # cannot tell our own messages apart yet
        routed = route(event, self.me, self.cfg.group_policy, self._threads)
        if isinstance(routed, Incoming):
            routed = replace(routed, team=sender_team(event, payload))
        if isinstance(routed, Ignored):
            log.debug("slack: event_id=%s ignored: %s", event_id, routed.reason)
            self._remember(event_id)
            return "ignored"
        # One chat at a time keeps its messages in order and lets a retry that waited here
        # see that the first delivery was taken.
        async with self._chat_lock(routed.chat_id):
            if event_id in self._recent:
                return "duplicate"
            verdict = await self._intake(routed, event_id)
            if verdict != "refused":
                self._remember(event_id)
            return verdict

    async def _intake(self, inc: Incoming, event_id: str) -> Intake | Literal["ignored"]:
        allowed = self.policy.allowed(inc.user)
        if is_whoami(inc.text) and (inc.is_dm or allowed):
            await self.bus.publish_outbound(
                OutboundMessage(NAME, inc.chat_id, whoami_text(NAME, inc.user, allowed), final=True)
            )
            return "ignored"
        if not allowed:
            if inc.is_dm and self.policy.dm_policy == "pairing":
                # A stranger's DM: a pairing code at most once an hour; not processed.
                text = await self.policy.pairing_reply(inc.user, inc.sender_name, inc.chat_id)
                if text:
                    await self.bus.publish_outbound(
                        OutboundMessage(NAME, inc.chat_id, text, final=True)
                    )
                return "ignored"
            self.policy.deny(inc.user, inc.sender_name, chat="private" if inc.is_dm else "group")
            return "ignored"
        self._last_thread[(inc.channel, inc.user)] = inc.chat_id
        if not inc.is_dm and inc.chat_id not in self._threads:
            self._threads[inc.chat_id] = None  # memobot is in this thread from now on
            while len(self._threads) > THREADS_KEPT:
                self._threads.popitem(last=False)
            await self._save()
        return await self._publish(inc, event_id)

    async def _migrate_inbox(self) -> None:
        """Move the messages an earlier version left in its inbox (acknowledged to Slack,
        files not yet fetched) into the core's intake, in order, then drop the inbox from
        ``slack.json``. Once: a message already taken (a crash between the two) is a
        duplicate. A refusal (memobot stopping) keeps the rest for the next start."""
        if not self._legacy_inbox:
            return
        log.info("slack: moving %d message(s) of the old inbox", len(self._legacy_inbox))
        while self._legacy_inbox:
            entry = self._legacy_inbox[0]
            try:
                inc = _OldInboxEntry.model_validate(entry).incoming()
            except ValidationError as exc:
                # The fields named, never their values (a message's text).
                wrong = ", ".join(
                    ".".join(map(str, e["loc"])) for e in exc.errors(include_input=False)
                )
                log.error(
                    "slack: old inbox entry of message %s unreadable (%s), dropped",
                    entry.get("message_id"),
                    wrong,
                )
            else:
                verdict = await self._publish(inc, str(entry["event_id"]), 0.0)
                if verdict == "refused":
                    log.warning("slack: old inbox kept for the next start: memobot is stopping")
                    return
            self._legacy_inbox.pop(0)
        try:
            await self._save()
        except OSError as exc:
            # Raised out of start(), it stopped the gateway at every start. The messages are
            # in the intake now: found again at the next start, each is a duplicate.
            log.error("slack: the old inbox is moved, but slack.json was not rewritten: %s", exc)

    async def _publish(
        self, inc: Incoming, event_id: str, name_wait: float = NAME_WAIT_BEFORE_ACK
    ) -> Intake | Literal["ignored"]:
        """``inc`` on the bus; its files named (``file_refs``), fetched when its turn runs."""
        text = inc.text.strip()
        if not text and not inc.files:
            return "ignored"
        msg = InboundMessage(
            NAME,
            inc.chat_id,
            inc.user,
            text,
            files=file_refs(inc.files),
            message_id=inc.message_id,
            metadata={
                "is_group": not inc.is_dm,
                "is_admin": self.policy.is_admin(inc.user),
                "sender_name": inc.sender_name or await self._user_name(inc.user, name_wait),
                "event_id": event_id,
            },
        )
        self._remember_asker(inc)
        verdict = await self.bus.publish_inbound(msg)
        if verdict == "duplicate":
            log.info(
                "slack: message %s already taken session=%s event_id=%s",
                inc.message_id,
                msg.session_key,
                event_id,
            )
        return verdict

    async def _save(self) -> None:
        """The threads memobot is in to ``state/channels/slack.json`` (and an old inbox not
        yet moved into the core's intake)."""
        if self._store is None:
            return
        async with self._save_lock:
            data: dict[str, Any] = {"threads": list(self._threads)}
            if self._legacy_inbox:
                data["inbox"] = list(self._legacy_inbox)
            await asyncio.to_thread(self._store.save, data)

    def _remember(self, event_id: str) -> None:
        self._recent[event_id] = None
        self._recent.move_to_end(event_id)
        while len(self._recent) > RECENT_EVENTS_KEPT:
            self._recent.popitem(last=False)

    @contextlib.asynccontextmanager
    async def _chat_lock(self, chat_id: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(chat_id, (asyncio.Lock(), 0))
        self._locks[chat_id] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[chat_id]
            if users <= 1:
                del self._locks[chat_id]
            else:
                self._locks[chat_id] = (lock, users - 1)

    async def _user_name(self, user: str, wait: float) -> str:
        """Display name from ``users.info`` (cached); "" when it cannot be had within ``wait``
        seconds (the lookup goes on and fills the cache for the next message)."""
        if user in self._names:
            return self._names[user]
        if not self._names_enabled or self.web is None:
            return ""
        task = self._lookups.get(user)
        if task is None:
            task = asyncio.create_task(self._lookup_name(user), name=f"slack-user-{user}")
            self._lookups[user] = task
            task.add_done_callback(lambda _: self._lookups.pop(user, None))
        done, _ = await asyncio.wait({task}, timeout=wait)
        return task.result() if done else ""

    async def _lookup_name(self, user: str) -> str:
        assert self.web is not None
        try:
            async with asyncio.timeout(USER_LOOKUP_SECONDS):
                answer = await self.web.users_info(user=user)
        except SlackApiError as exc:
            if _error_code(exc) == "missing_scope":
                self._names_enabled = False
                log.info("slack: no users:read scope; sender names are not looked up")
            return ""
        except (SlackClientError, aiohttp.ClientError, OSError, TimeoutError) as exc:
            log.debug("slack: users.info %s failed: %s", user, exc)
            return ""
        data = answer.get("user") or {}
        name = profile_name(data.get("profile")) or str(data.get("real_name") or "")
        name = name or str(data.get("name") or "")
        self._names[user] = name
        while len(self._names) > NAMES_KEPT:
            self._names.popitem(last=False)
        return name

    # -- files -------------------------------------------------------------------------------

    async def fetch_media(self, msg: InboundMessage) -> list[Fetched]:
        """Save the files ``msg`` names under ``<workspace>/media/slack/<chat>/``, with the
        bot token (only to Slack's own hosts); called by the core just before the turn runs,
        long after the ack. A file already saved there (a restart after the download), at
        the size Slack gave, is not fetched again."""
        folder = self.workspace / chat_media_dir(NAME, msg.chat_id)
        kept, over = msg.files[:FILES_PER_MESSAGE], msg.files[FILES_PER_MESSAGE:]
        fetched = [await self._fetch_file(msg, ref, folder) for ref in kept]
        if over:
            log.warning(
                "slack: %d file(s) past the first %d not fetched session=%s id=%s",
                len(over),
                FILES_PER_MESSAGE,
                msg.session_key,
                msg.message_id,
            )
            fetched += not_fetched(over, f"more than {FILES_PER_MESSAGE} files in one message")
        return fetched

    async def _fetch_file(self, msg: InboundMessage, ref: FileRef, folder: Path) -> Fetched:
        """One file: saved under ``<id>-<name>``, or the reason it was not. ``ref`` is what
        the pending turn names; a Slack Connect file's details come from ``files.info``."""
        asked = ref
        described: FileRef | str = ref
        if not ref.url and ref.extra.get("file_access") == "check_file_info":
            described = await self._file_info(ref)
        if isinstance(described, str):
            problem: str | None = described
        else:
            ref = described
            problem = self._not_fetchable(ref)
        url = ref.url
        if problem is None:
            path = folder / f"{safe_file_name(ref.id)}-{safe_file_name(ref.label)}"
            try:
                # Saved before a restart: kept. The folder is in the workspace, which the model
                # writes: never via a link, and only at the size Slack gave (a file put there
                # under the coming name is replaced, not taken for the person's).
                saved = await asyncio.to_thread(workspace_files.file_stat, self.workspace, path)
                if saved is not None and ref.size in (None, saved.st_size):
                    return Fetched(asked, str(path))
                await self._fetch_with_retries(url, path)
                return Fetched(asked, str(path))
            except _TooLarge:
                problem = f"larger than {MEDIA_MAX_BYTES // (1024 * 1024)} MB"
            except (aiohttp.ClientError, TimeoutError, OSError, _DownloadError) as exc:
                problem = f"download failed: {_download_problem(exc)}"
        log.warning(
            # By Slack's id: the name is the sender's, any text at all (a line break would
            # forge a log line of its own).
            "slack: file %s not fetched session=%s id=%s: %s",
            asked.id,
            msg.session_key,
            msg.message_id,
            problem,
        )
        return Fetched(asked, None, problem)

    async def _fetch_with_retries(self, url: str, path: Path) -> None:
        """``_fetch``, tried again after Slack's passing trouble (a refused connection, a
        dropped one, HTTP 429 or 5xx): the turn runs once, and a file it lacks is lost to
        it, so a blip (a restart before the network is up) must not cost the file. Not
        after a timeout: that try already took the whole deadline. The waits hold no
        download slot; ``/stop`` ends them."""
        for wait in (*DOWNLOAD_RETRY_WAITS, None):
            try:
                async with self._downloads:
                    await self._fetch(url, path)
                return
            except (_TryAgain, aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
                if wait is None or isinstance(exc, TimeoutError):
                    raise
                log.info(
                    "slack: download failed (%s); trying again in %.0f s",
                    _download_problem(exc),
                    wait,
                )
            await asyncio.sleep(wait)

    def _not_fetchable(self, ref: FileRef) -> str | None:
        """Why ``ref`` is not to be downloaded at all; None if it is."""
        if ref.extra.get("mode") in UNHOSTED_FILE_MODES or not ref.url:
            return "not stored on Slack"
        if (ref.size or 0) > MEDIA_MAX_BYTES:
            return f"larger than {MEDIA_MAX_BYTES // (1024 * 1024)} MB"
        if not self._may_send_token(ref.url):
            return f"unexpected file host {urlsplit(ref.url).hostname}"
        if self._http is None:
            return "the Slack channel is not started"
        return None

    async def _file_info(self, ref: FileRef) -> FileRef | str:
        """``ref`` with the URL, name, size and mode ``files.info`` gives (Slack sends a file
        of a Slack Connect channel as ``file_access: check_file_info``, without them); or why
        not, in words for the note."""
        if self.web is None:
            return "the Slack channel is not started"
        try:
            with _network_errors():
                answer = await self.web.files_info(file=ref.id)
            (found,) = file_refs((SlackFile.model_validate(answer.get("file") or {}),))
        except SlackApiError as exc:
            return f"Slack did not describe it (files.info: {_error_code(exc) or 'refused'})"
        except (SendError, ValidationError) as exc:
            log.info("slack: files.info %s failed: %s", ref.id, exc)
            return "Slack did not describe it (files.info failed)"
        return replace(found, id=ref.id, name=found.name or ref.name)

    def _may_send_token(self, url: str) -> bool:
        """The bot token goes only to Slack's own hosts over https (or to the configured
        apiUrl's scheme and host): never in clear text, never to another host. A redirect to
        another origin is followed without it (aiohttp drops Authorization there)."""
        parts = urlsplit(url)
        host = parts.hostname or ""
        if (parts.scheme, host) in self._file_origins:
            return True
        return parts.scheme == "https" and (host == "slack.com" or host.endswith(".slack.com"))

    async def _fetch(self, url: str, path: Path) -> None:
        assert self._http is not None
        headers = {"Authorization": f"Bearer {self.cfg.bot_token}"}
        async with self._http.get(
            url,
            headers=headers,
            proxy=self._http_proxy,
            timeout=aiohttp.ClientTimeout(total=DOWNLOAD_TIMEOUT_SECONDS),
        ) as resp:
            if resp.status == 429 or resp.status >= 500:
                raise _TryAgain(f"HTTP {resp.status}")
            if resp.status != 200:
                raise _DownloadError(f"HTTP {resp.status}")
            if resp.content_type == "text/html" and not path.suffix.lower().startswith(".htm"):
                # Slack's answer to a request it did not authorise is its sign-in page.
                raise _DownloadError("Slack sent a sign-in page (does the app have files:read?)")
            if (resp.content_length or 0) > MEDIA_MAX_BYTES:
                raise _TooLarge

            async def blocks() -> AsyncIterator[bytes]:
                size = 0  # what came, whatever size Slack declared
                async for block in resp.content.iter_chunked(64 * 1024):
                    size += len(block)
                    if size > MEDIA_MAX_BYTES:
                        raise _TooLarge
                    yield block

            # In the workspace, which the model writes: no link is followed on the way, a
            # failed download leaves no half file under the final name, and the disk's work
            # (the fsync of up to 20 MB) is done off the event loop.
            await workspace_files.write_stream(self.workspace, path, blocks(), make_parents=True)

    # -- sending -----------------------------------------------------------------------------

    def render(self, text: str) -> list[str]:
        return render_chunks(text, SLACK_LIMIT, markdown_to_slack_mrkdwn)

    def render_question(self, view: QuestionView) -> tuple[str, bool]:
        return slack_question(view)

    def plain(self, chunk: str) -> str:
        return strip_markdown(chunk)

    def resplit(self, chunk: str) -> list[str]:
        """Halves, on paragraphs, lines or words (code fences kept whole per piece): Slack
        refused the piece with ``msg_too_long``."""
        return split_markdown(chunk, max(1, (len(chunk) + 1) // 2))

    def classify(self, exc: Exception, method: str) -> SendError | FatalChannelError | None:
        """A Web API call's failure: Slack's refusal by its code (``map_api_error``), a
        network failure transient, the SDK's own refusal of the call permanent."""
        if isinstance(exc, SlackApiError):
            return _api_error(exc, method)
        if isinstance(exc, aiohttp.ClientError | TimeoutError | OSError):
            return TransientError(f"slack unreachable: {exc!r}")
        if isinstance(exc, SlackClientError):
            return PermanentError(f"slack client refused the call: {exc}")
        return None

    def pace_limits(self, chat_id: str) -> list[Limit]:
        """Per Slack channel (its threads share it)."""
        channel, _ = split_chat_id(chat_id)
        return [Limit.of(f"channel:{channel}", self.cfg.rate_limits.channel)]

    async def send_chunk(
        self, msg: OutboundMessage, chunk: str, plain: bool = False, *, first: bool = False
    ) -> None:
        # No quoting here: an answer in a thread is in it piece by piece (the chat id says so).
        await self._post(msg.chat_id, chunk, plain, approval_blocks(msg, chunk, plain))

    async def _post(
        self, chat_id: str, text: str, plain: bool, blocks: dict[str, Any] | None = None
    ) -> str:
        """chat.postMessage (``blocks``: Block Kit extras, an approval's buttons); the new
        message's ``ts``."""
        if self.web is None:
            raise TransientError("slack channel is not started")
        channel, thread_ts = split_chat_id(chat_id)
        with self.calling("chat.postMessage"):
            answer = await self.web.chat_postMessage(
                channel=channel,
                text=text,
                thread_ts=thread_ts,
                mrkdwn=not plain,
                **(blocks or {}),
            )
        return str(answer.get("ts") or "")

    async def send_file(self, msg: OutboundMessage, path: str) -> None:
        """files.getUploadURLExternal, the upload, files.completeUploadExternal (the SDK's
        files_upload_v2), into the chat's channel or thread."""
        if self.web is None:
            raise TransientError("slack channel is not started")
        channel, thread_ts = split_chat_id(msg.chat_id)
        name = Path(path).name
        data = await self.file_to_send(path)
        with self.calling("files.uploadV2"):
            await self.web.files_upload_v2(
                channel=channel, thread_ts=thread_ts, file=data, filename=name, title=name
            )

    # -- streaming ---------------------------------------------------------------------------
    # In a thread (a channel's, a DM's, an assistant thread) an answer streams natively:
    # chat.startStream once there is text, chat.appendStream with what was added, and the
    # final answer edits it (chat.stopStream, then chat.update into the rendered answer).
    # Elsewhere (a DM's top level: Slack streams only thread replies), after a refusal, or
    # for a turn resumed after a restart in a channel (the recipient's ids are not kept on
    # disk): chat.postMessage, then throttled chat.update. Either way the message's ts is the
    # preview id the channel manager records in the delivery ledger, so a restart finishes
    # that same message.

    def preview_mode(self, chat_id: str) -> PreviewMode:
        return "message"

    def preview_pieces(self, text: str) -> list[str]:
        """The streamed Markdown in pieces cut where the rendered answer's pieces are cut
        (what a stream appends is Markdown; a posted preview is rendered when sent)."""
        return render_chunks(text, SLACK_LIMIT, _same, measure=_mrkdwn_length)

    async def send_preview(self, msg: OutboundMessage, text: str, *, first: bool = False) -> str:
        # A new piece: the stream of the piece before it (or of an earlier answer) is done.
        for ts, preview in list(self._previews.items()):
            if preview.chat_id == msg.chat_id and preview.streaming:
                try:
                    await self._stop_stream(ts, preview)
                except PermanentError as exc:  # gone (deleted in the chat): nothing to stop
                    log.info("slack: could not stop stream %s: %s", ts, exc)
                    preview.streaming = False
        ts = await self._start_stream(msg, text)
        if ts is None:
            ts = await self._post(msg.chat_id, markdown_to_slack_mrkdwn(text), plain=False)
            if not ts:
                raise PermanentError("slack did not say which message it posted")
            self._keep_preview(ts, _Preview(msg.chat_id, posted=True))
        return ts

    def preview_shows(self, message_id: str, preview: str, chunk: str) -> bool:
        # A posted preview shows its Markdown rendered as the answer's pieces are; a stream
        # (open or not) shows blocks, which only the final chat.update replaces.
        shown = self._previews.get(message_id)
        return shown is not None and shown.posted and markdown_to_slack_mrkdwn(preview) == chunk

    async def edit_chunk(
        self, chat_id: str, message_id: str, chunk: str, plain: bool = False
    ) -> None:
        """``plain``: a preview piece (Markdown); else a piece of the rendered answer. A live
        stream grows by appends while the new text extends what it shows; otherwise it is
        stopped and, like every other message, edited with chat.update."""
        web = self._web()
        channel, _ = split_chat_id(chat_id)
        preview = self._previews.get(message_id) or await self._adopt(chat_id, message_id)
        if preview.streaming:
            if plain and chunk.startswith(preview.text):
                if await self._append(message_id, preview, chunk):
                    return
            else:
                await self._stop_stream(message_id, preview)
        text = markdown_to_slack_mrkdwn(chunk) if plain else chunk
        with self.calling("chat.update"):
            # blocks=[]: a streamed message shows its blocks, which Slack keeps unless told.
            await web.chat_update(channel=channel, ts=message_id, text=text, blocks=[])

    async def delete_message(self, chat_id: str, message_id: str) -> None:
        web = self._web()
        channel, _ = split_chat_id(chat_id)
        preview = self._previews.pop(message_id, None)
        if preview is not None and preview.streaming:
            with contextlib.suppress(SendError):
                await self._stop_stream(message_id, preview)
        with self.calling("chat.delete"):
            await web.chat_delete(channel=channel, ts=message_id)

    def _web(self) -> AsyncWebClient:
        if self.web is None:
            raise TransientError("slack channel is not started")
        return self.web

    def _remember_asker(self, inc: Incoming) -> None:
        """Who a message came from: outside a DM, a stream names its recipient."""
        key = (inc.chat_id, inc.message_id)
        self._askers[key] = (inc.user, inc.team)
        self._askers.move_to_end(key)
        while len(self._askers) > ASKERS_KEPT:
            self._askers.popitem(last=False)

    def _keep_preview(self, ts: str, preview: _Preview) -> None:
        self._previews[ts] = preview
        while len(self._previews) > PREVIEWS_KEPT:
            self._previews.popitem(last=False)

    async def _start_stream(self, msg: OutboundMessage, text: str) -> str | None:
        """chat.startStream with ``text``; the stream's ts, or None where Slack does not
        stream (or refused: then remembered, and logged once, for the workspace or channel)."""
        channel, thread_ts = split_chat_id(msg.chat_id)
        if (
            not self.cfg.native_streaming
            or thread_ts is None
            or len(text) > STREAM_TEXT_MAX
            or not self.feature_on(NATIVE_STREAMS)
            or channel in self._native_off
        ):
            return None
        is_dm = channel.startswith("D")
        user, team = self._askers.get((msg.chat_id, msg.reply_to or ""), ("", ""))
        if not is_dm and not (user and team):
            log.info(
                "slack: no recipient known for a stream session=%s (a turn resumed after a "
                "restart); chat.postMessage and chat.update for this answer",
                msg.session_key,
            )
            return None
        try:
            with _network_errors():
                answer = await self._web().chat_startStream(
                    channel=channel,
                    thread_ts=thread_ts,
                    markdown_text=text,
                    recipient_user_id=user or None,
                    recipient_team_id=team or None,
                )
        except SlackApiError as exc:
            code = _error_code(exc) or "no error code"
            if code in STREAMING_UNAVAILABLE:  # for the workspace: said once, in status too
                self.switch_off(FeatureUnavailable(NATIVE_STREAMS, "chat.startStream", code))
                return None
            if code in STREAMING_NOT_HERE:
                self._native_off[channel] = code
                scope = f"in channel {channel} from now on"
            elif isinstance(_api_error(exc), TransientError):
                raise _api_error(exc) from exc
            else:  # rate limited (Tier 2: about 20 a minute per workspace), or this thread
                scope = "for this answer"
            log.warning(
                "slack: chat.startStream refused (%s) session=%s; answers stream by "
                "chat.postMessage and chat.update %s",
                code,
                msg.session_key,
                scope,
            )
            return None
        ts = str(answer.get("ts") or "")
        if not ts:
            raise PermanentError("slack did not say which stream it started")
        self._keep_preview(ts, _Preview(msg.chat_id, text, streaming=True))
        return ts

    async def _append(self, ts: str, preview: _Preview, text: str) -> bool:
        """chat.appendStream with what ``text`` adds to the stream; False when Slack ended the
        stream on its side (about 5 minutes after it started, or the reader stopped it)."""
        delta = text[len(preview.text) :]
        if not delta:
            return True
        channel, _ = split_chat_id(preview.chat_id)
        try:
            with _network_errors():
                await self._web().chat_appendStream(channel=channel, ts=ts, markdown_text=delta)
        except SlackApiError as exc:
            if _error_code(exc) not in STREAM_ENDED:
                raise _api_error(exc) from exc
            preview.streaming = False
            log.info(
                "slack: stream %s ended by Slack (%s); chat.update from now on",
                ts,
                _error_code(exc),
            )
            return False
        preview.text = text
        return True

    async def _stop_stream(self, ts: str, preview: _Preview) -> None:
        channel, _ = split_chat_id(preview.chat_id)
        try:
            with _network_errors():
                await self._web().chat_stopStream(channel=channel, ts=ts)
        except SlackApiError as exc:
            if _error_code(exc) not in STREAM_ENDED:
                raise _api_error(exc) from exc
        preview.streaming = False

    async def _adopt(self, chat_id: str, ts: str) -> _Preview:
        """A preview message from before a restart, which may be a stream still open: stopped
        first (a posted message, or a stream Slack already ended, refuses; that is fine)."""
        preview = _Preview(chat_id)
        if self.cfg.native_streaming and self.feature_on(NATIVE_STREAMS):
            channel, _ = split_chat_id(chat_id)
            try:
                with _network_errors():
                    await self._web().chat_stopStream(channel=channel, ts=ts)
            except SlackApiError as exc:
                if isinstance(_api_error(exc), RetryAfter | TransientError):
                    raise _api_error(exc) from exc
        self._keep_preview(ts, preview)
        return preview

    async def admin_chats(self) -> list[str]:
        # chat.postMessage to a user id posts in that person's direct messages with the app.
        return sorted(a for a in self.policy.admins if a[:1] in ("U", "W"))

    async def send_typing(self, chat_id: str) -> None:
        """Slack offers bots no typing indicator over the Web API; nothing to do."""
