"""Discord through discord.py: gateway intake, allowFrom and group gating, replies in Markdown.

discord.py keeps the gateway alive itself (heartbeats, RESUME, reconnects after a drop);
memobot's own loop around it only restarts a client that gave up (network down at login,
an unexpected close) and stops for good when the token or the intents are refused.
Discord has no redelivery to acknowledge: a message seen while memobot is down is not seen
at all, and the bus verdict is only used to drop duplicates.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import io
import logging
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import discord

from bot import workspace_files
from bot.bus import InboundMessage, MessageBus, OutboundMessage
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
from channels.base import Channel, PreviewMode, safe_file_name
from channels.discord_channel.config import DiscordConfig
from channels.discord_channel.errors import map_send_error
from channels.errors import (
    FatalChannelError,
    SendError,
    TransientError,
)
from channels.formatting import DISCORD_LIMIT, markdown_to_discord, render_chunks, strip_markdown
from channels.pacing import Limit
from channels.retry import Reconnect

log = logging.getLogger(__name__)

NAME = "discord"
MEDIA_MAX_BYTES = 20 * 1024 * 1024
# The largest file a bot may send to a server without boosts (Discord lowered it to 10 MiB in
# 2024); a longer answer's file is named in a note instead.
UPLOAD_MAX_BYTES = 10 * 1024 * 1024
RECONNECT_START, RECONNECT_MAX = 1.0, 30.0
# discord.py sleeps through shorter 429s itself (per bucket, i.e. per channel); a longer wait
# surfaces as RateLimited, so the channel manager's one retry policy decides and logs it.
MAX_LIBRARY_RATELIMIT_WAIT = 30.0
# One REST call, its rate-limit waits inside discord.py included: past this it counts as a
# network failure (retried by the one retry policy). discord.py's own session would wait 300 s,
# holding the chat's answers that long.
CALL_TIMEOUT_SECONDS = MAX_LIBRARY_RATELIMIT_WAIT + 30.0
# An upload gets that and the time its file takes at this rate (64 KiB/s, a slow uplink: a
# 10 MB file, 160 s more): cut while Discord still reads it, or before its answer, a file it
# took would be sent again (DESIGN.md 11), one it never got would never get through.
UPLOAD_BYTES_PER_SECOND = 64 * 1024
# Gateway close codes after which reconnecting cannot help (bad token, intents, sharding).
FATAL_CLOSE_CODES = frozenset({4004, 4010, 4011, 4012, 4013, 4014})
_CLOSE_ADVICE = {
    4004: ": the token was refused; put the one from the Developer Portal (Bot -> Reset Token) "
    "in channels.discord.token",
}
_CHAT_MESSAGE_TYPES = (discord.MessageType.default, discord.MessageType.reply)


# --- pure helpers ---------------------------------------------------------------------------


def intents() -> discord.Intents:
    """Guild and DM messages with their content; nothing else (no members, no presences)."""
    wanted = discord.Intents.none()
    wanted.guilds = True
    wanted.guild_messages = True
    wanted.dm_messages = True
    wanted.message_content = True
    return wanted


def strip_bot_mention(text: str, bot_id: int) -> str:
    """``text`` without ``<@ID>`` / ``<@!ID>`` mentions of the bot, whitespace tidied."""
    stripped = re.sub(rf"<@!?{bot_id}>", " ", text)
    return re.sub(r"[ \t]{2,}", " ", stripped).strip()


def is_whoami(text: str) -> bool:
    head = text.strip().split(maxsplit=1)
    return bool(head) and head[0].split("@", 1)[0].lower() == "/whoami"


def proxy_options(proxy: str) -> dict[str, Any]:
    """``discord.Client`` keyword arguments for ``channels.discord.proxy``.

    http(s) proxies go through aiohttp's own ``proxy=``; socks5 needs an aiohttp-socks
    connector (``socks5h``: the proxy resolves host names). Call inside the running loop.
    """
    if not proxy:
        return {}
    connector = socks_connector(proxy)
    return {"connector": connector} if connector else {"proxy": http_proxy(proxy)}


def approval_view(msg: OutboundMessage) -> discord.ui.View | None:
    """The buttons of an approval request as message components. The view is stopped before
    it is sent, so discord.py keeps no callbacks for it: every press, also one made on a
    message sent before a restart, arrives as an ``on_interaction`` event."""
    question = question_view(msg)
    buttons = approval_buttons(msg, cut=question is not None and discord_question(question)[1])
    if not buttons:
        return None
    view = discord.ui.View(timeout=None)
    styles = {"deny": discord.ButtonStyle.danger, "once": discord.ButtonStyle.primary}
    for data, label in buttons:
        style = styles.get(data.rsplit(":", 1)[-1], discord.ButtonStyle.secondary)
        view.add_item(discord.ui.Button(label=label, custom_id=data, style=style))
    view.stop()
    return view


@functools.lru_cache(maxsize=16)
def discord_question(view: QuestionView) -> tuple[str, bool]:
    """An approval question as one message's content, and whether its text was cut."""
    return fit_question(view, markdown_to_discord, len, DISCORD_LIMIT)


# --- the channel ----------------------------------------------------------------------------


class _Client(discord.Client):
    """A discord.py client that hands its events to the owning channel."""

    def __init__(self, owner: DiscordChannel, **options: Any) -> None:
        super().__init__(**options)
        self.owner = owner

    async def on_connect(self) -> None:
        self.owner._gateway_up()

    async def on_resumed(self) -> None:
        self.owner._gateway_up()

    async def on_disconnect(self) -> None:
        self.owner._gateway_down()

    async def on_ready(self) -> None:
        log.info(
            "discord: ready as %s (id %s) in %d guild(s)",
            self.user,
            self.user.id if self.user else "?",
            len(self.guilds),
        )

    async def on_message(self, message: discord.Message) -> None:
        await self.owner._on_message(message)

    async def on_interaction(self, interaction: discord.Interaction) -> None:
        await self.owner._on_interaction(interaction)


class DiscordChannel(Channel):
    """DMs, guild text channels and threads. Session key ``discord:<channel id>``."""

    name = NAME
    sends_files = True
    max_file_bytes = UPLOAD_MAX_BYTES
    command_syntax = CommandSyntax(answers=CHANNEL_COMMANDS)  # /whoami: see _handle

    def __init__(
        self, bus: MessageBus, cfg: DiscordConfig, workspace: Path, state_dir: Path
    ) -> None:
        super().__init__(bus)
        self.cfg = cfg
        self.workspace = Path(workspace)
        self.state_dir = Path(state_dir)
        self.policy = AccessPolicy.for_channel(NAME, cfg, self.state_dir)
        self.allow_channels = frozenset(cfg.allow_channels)
        self.streaming = cfg.streaming
        self.stream_interval = cfg.stream_edit_interval_seconds
        self.typing_delay = cfg.typing_delay_seconds
        self.client: _Client | None = None
        self._logged_in = False
        self._was_connected = False
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._channels: dict[str, Any] = {}  # chat id -> discord.py messageable
        self._admin_dms: dict[str, str] = {}  # admin's user id -> their DM channel's id
        self._intake_locks: dict[str, asyncio.Lock] = {}

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Return at once; the client logs in and connects in a background task."""
        self.policy.log_startup()
        self._stopping = False
        self.set_state("starting")
        self._task = asyncio.create_task(self._run(), name="discord-gateway")

    async def stop(self) -> None:
        self._stopping = True
        if self.client is not None:
            await self.client.close()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        self.set_state("stopped")

    async def _run(self) -> None:
        reconnect = Reconnect(start=RECONNECT_START, maximum=RECONNECT_MAX, timeouts_at_once=False)
        while not self._stopping:
            cause: Exception
            self.client = client = _Client(
                self,
                intents=intents(),
                max_ratelimit_timeout=MAX_LIBRARY_RATELIMIT_WAIT,
                allowed_mentions=discord.AllowedMentions.none(),
                **proxy_options(self.cfg.proxy),
            )
            self._was_connected = False
            self._channels.clear()  # channel objects belong to the client that made them
            try:
                await client.login(self.cfg.token)
                self._logged_in = True
                await client.connect(reconnect=True)
                if self._stopping:
                    return
                problem = "the gateway connection ended"
                cause = ConnectionError(problem)
            except discord.LoginFailure:
                self._fail(
                    "the bot token was rejected (401 Unauthorized). Put the token from "
                    "the Developer Portal (Bot -> Reset Token) in channels.discord.token; "
                    "the Discord channel is stopped until memobot restarts"
                )
                return
            except discord.PrivilegedIntentsRequired:
                self._fail(
                    "the gateway refused the MESSAGE CONTENT intent (close code 4014). Enable "
                    "it in the Developer Portal (Bot -> Privileged Gateway Intents); the "
                    "Discord channel is stopped until memobot restarts"
                )
                return
            except discord.ConnectionClosed as exc:
                if exc.code in FATAL_CLOSE_CODES:
                    self._fail(
                        f"the gateway closed the connection with code {exc.code} "
                        f"({exc.reason or 'no reason'}){_CLOSE_ADVICE.get(exc.code, '')}; "
                        "reconnecting cannot fix this, so the Discord channel is stopped"
                    )
                    return
                problem, cause = f"gateway closed with {exc.code}", exc
            except (OSError, aiohttp.ClientError, discord.HTTPException, TimeoutError) as exc:
                problem, cause = f"{type(exc).__name__}: {exc}", exc
            except Exception as exc:  # a bug must not end the channel for good: log it, retry
                log.exception("discord: the client crashed")
                problem, cause = f"client crashed ({type(exc).__name__}: {exc})", exc
            finally:
                self._logged_in = False
                await client.close()
            if self._was_connected:
                reconnect.succeeded()
            self.set_state("reconnecting", problem)
            delay = reconnect.wait_after(cause) or 0.0  # a refused token returned above
            log.warning("discord: %s; connecting again in %.0f s", problem, delay)
            await reconnect.clock.sleep(delay)

    def _fail(self, message: str) -> None:
        """Failed for good: one error line (``Channel.fail``) and the manager is told."""
        self.fail(FatalChannelError(message))

    def _gateway_up(self) -> None:
        self._was_connected = True
        self.set_state("connected")

    def _gateway_down(self) -> None:
        if not self._stopping and self.state == "connected":
            self.set_state("reconnecting", "gateway connection lost; discord.py is resuming")

    # -- intake ------------------------------------------------------------------------------

    async def _on_message(self, message: discord.Message) -> None:
        self.touch()
        # discord.py runs each event in its own task; the per-chat lock (FIFO) keeps a chat's
        # messages in arrival order even when an earlier one waits for its attachments.
        lock = self._intake_locks.setdefault(str(message.channel.id), asyncio.Lock())
        try:
            async with lock:
                await self._handle(message)
        except Exception:
            log.exception(
                "discord: message %s in channel %s not handled", message.id, message.channel.id
            )

    async def _handle(self, message: discord.Message) -> None:
        me = self.client.user if self.client else None
        if me is None or message.author.bot or message.webhook_id is not None:
            return  # other bots and webhooks, and our own messages
        if message.type not in _CHAT_MESSAGE_TYPES:
            return  # joins, pins, thread notices...
        channel = message.channel
        is_dm = isinstance(channel, discord.DMChannel)
        if not is_dm and message.guild is None:
            return  # group DMs: bots cannot take part
        chat_id = str(channel.id)
        sender_id = str(message.author.id)
        allowed = self.policy.allowed(sender_id)
        if not is_dm:
            if not await self._channel_allowed(channel):
                return
            if self.cfg.group_policy != "open" and not self._addressed(message, me):
                return
        text = strip_bot_mention(message.content, me.id)
        if is_whoami(text) and (is_dm or allowed):
            await self._answer_directly(chat_id, message, whoami_text(NAME, sender_id, allowed))
            return
        if not allowed:
            if is_dm and self.policy.dm_policy == "pairing":
                await self._pairing_reply(channel, sender_id, str(message.author), chat_id)
                return
            self.policy.deny(sender_id, str(message.author), chat="private" if is_dm else "group")
            return
        self._channels[chat_id] = channel
        media, notes = await self._download(message, chat_id)
        text = "\n".join([text, *notes]).strip()
        if not text and not media:
            return
        reference = message.reference
        inbound = InboundMessage(
            NAME,
            chat_id,
            sender_id,
            text,
            media=tuple(media),
            message_id=str(message.id),
            reply_to=str(reference.message_id) if reference and reference.message_id else None,
            metadata={
                "is_group": not is_dm,
                "is_admin": self.policy.is_admin(sender_id),
                "sender_name": message.author.display_name,
                **({"guild_id": str(message.guild.id)} if message.guild else {}),
            },
        )
        verdict = await self.bus.publish_inbound(inbound)
        if verdict == "duplicate":
            log.info("discord: duplicate message %s ignored chat=%s", message.id, chat_id)
        elif verdict == "refused":
            log.warning(
                "discord: message %s in chat %s not taken: memobot is shutting down "
                "(Discord does not redeliver it)",
                message.id,
                chat_id,
            )

    async def _pairing_reply(self, channel: Any, sender_id: str, name: str, chat_id: str) -> None:
        """A stranger's DM: a pairing code, at most once an hour; the DM is not processed.
        Sent here, outside the bus and the ledger: the sender is no user yet."""
        text = await self.policy.pairing_reply(sender_id, name, chat_id)
        if text is None:
            return
        try:
            await channel.send(text, allowed_mentions=discord.AllowedMentions.none())
        except Exception as exc:
            log.warning("discord: pairing code to %s not sent: %s", sender_id, exc)

    # -- approval buttons (component interactions) --

    async def _on_interaction(self, interaction: discord.Interaction) -> None:
        """A button press: an approval answer on the bus, then the interaction is
        acknowledged (a refusal is shown to the presser only)."""
        if interaction.type != discord.InteractionType.component:
            return
        self.touch()
        data = interaction.data or {}
        press = parse_press(str(data.get("custom_id", "")))
        sender_id = str(interaction.user.id)
        try:
            if press is None or interaction.channel_id is None:
                await interaction.response.send_message(
                    "This button is not for me.", ephemeral=True
                )
                return
            if not self.policy.allowed(sender_id):
                self.policy.deny(sender_id, str(interaction.user), chat="button")
                await interaction.response.send_message(
                    "You are not allowed to use this bot.", ephemeral=True
                )
                return
            inbound = InboundMessage(
                NAME,
                str(interaction.channel_id),
                sender_id,
                "",
                message_id=f"interaction:{interaction.id}",
                metadata={
                    "approval": press,
                    "is_group": interaction.guild_id is not None,
                    "is_admin": self.policy.is_admin(sender_id),
                    "sender_name": interaction.user.display_name,
                },
            )
            verdict = await self.bus.publish_inbound(inbound)
            if verdict == "refused":
                await interaction.response.send_message(
                    "memobot is restarting; press again in a moment.", ephemeral=True
                )
                return
            await interaction.response.defer()
        except Exception:
            log.exception("discord: interaction %s not handled", interaction.id)

    async def _channel_allowed(self, channel: Any) -> bool:
        """allowChannels: the channel itself or, for a thread, its parent channel is listed."""
        if not self.allow_channels:
            return True
        ids = {channel.id, getattr(channel, "parent_id", None)}
        if isinstance(channel, discord.PartialMessageable) and self.client is not None:
            # A thread discord.py has not cached: ask Discord which channel it belongs to.
            try:
                full = await self.client.fetch_channel(channel.id)
            except (discord.HTTPException, aiohttp.ClientError) as exc:
                log.warning("discord: cannot look up channel %s (%s); ignored", channel.id, exc)
                return False
            ids.add(getattr(full, "parent_id", None))
        return any(str(i) in self.allow_channels for i in ids if i is not None)

    @staticmethod
    def _addressed(message: discord.Message, me: discord.ClientUser) -> bool:
        """Mentioned by user mention (never @everyone/@here), a reply to us, or a command."""
        if message.content.lstrip().startswith("/"):
            return True
        if any(user.id == me.id for user in message.mentions):
            return True
        ref = message.reference
        target = ref and (ref.resolved or ref.cached_message)
        return isinstance(target, discord.Message) and target.author.id == me.id

    async def _download(
        self, message: discord.Message, chat_id: str
    ) -> tuple[list[str], list[str]]:
        """Save attachments under ``<workspace>/media/discord/<chat>/``; notes for skipped ones."""
        paths: list[str] = []
        notes: list[str] = []
        folder = self.workspace / chat_media_dir(NAME, chat_id)
        for attachment in message.attachments:
            if attachment.size > MEDIA_MAX_BYTES:
                log.warning(
                    "discord: attachment %s (%d bytes) over the %d byte cap, not saved chat=%s",
                    attachment.filename,
                    attachment.size,
                    MEDIA_MAX_BYTES,
                    chat_id,
                )
                notes.append(f"[attachment {attachment.filename} not saved: too large]")
                continue
            path = folder / f"{message.id}-{safe_file_name(attachment.filename)}"
            try:
                # In the workspace, which the model writes: no link is followed on the way.
                with workspace_files.atomic_writer(self.workspace, path, make_parents=True) as fh:
                    await attachment.save(fh)
            except (discord.HTTPException, aiohttp.ClientError, OSError) as exc:
                log.warning(
                    "discord: attachment %s not saved chat=%s: %s",
                    attachment.filename,
                    chat_id,
                    exc,
                )
                notes.append(f"[attachment {attachment.filename} could not be downloaded]")
                continue
            paths.append(str(path))
        return paths, notes

    async def _answer_directly(self, chat_id: str, message: discord.Message, text: str) -> None:
        """Answers the channel gives itself (/whoami) go through the manager like any other."""
        self._channels[chat_id] = message.channel
        await self.bus.publish_outbound(
            OutboundMessage(NAME, chat_id, text, reply_to=str(message.id), final=True)
        )

    # -- sending -----------------------------------------------------------------------------

    def render(self, text: str) -> list[str]:
        return render_chunks(text, DISCORD_LIMIT, markdown_to_discord)

    def render_question(self, view: QuestionView) -> tuple[str, bool]:
        return discord_question(view)

    def plain(self, chunk: str) -> str:
        return strip_markdown(chunk)

    @contextlib.asynccontextmanager
    async def _call(self, method: str, upload: int = 0) -> AsyncIterator[None]:
        """``calling`` with a deadline: a call Discord never answers is a network failure.
        ``upload``: the bytes the call sends, which get time of their own."""
        seconds = CALL_TIMEOUT_SECONDS + upload / UPLOAD_BYTES_PER_SECOND
        with self.calling(method):
            try:
                async with asyncio.timeout(seconds):
                    yield
            except TimeoutError as exc:
                raise TransientError(f"{method}: no answer from Discord in {seconds:g} s") from exc

    def classify(self, exc: Exception, method: str) -> SendError | FatalChannelError | None:
        return map_send_error(exc, method)

    def pace_limits(self, chat_id: str) -> list[Limit]:
        """Per channel (a thread is a channel of its own, with its own id)."""
        return [Limit.of(f"channel:{chat_id}", self.cfg.rate_limits.channel)]

    async def send_chunk(
        self, msg: OutboundMessage, chunk: str, plain: bool = False, *, first: bool = False
    ) -> None:
        await self._send(msg, chunk, first=first)

    async def _send(self, msg: OutboundMessage, chunk: str, first: bool) -> discord.Message:
        channel = await self._messageable(msg.chat_id)
        reference = None
        if self._replies_in(channel) and msg.reply_to and msg.reply_to.isdigit():
            if first:
                # Only the first piece shows as a reply; a deleted original must not fail it.
                reference = discord.MessageReference(
                    message_id=int(msg.reply_to),
                    channel_id=int(msg.chat_id),
                    fail_if_not_exists=False,
                )
        extra: dict[str, Any] = {}
        view = approval_view(msg)
        if view is not None:
            extra["view"] = view
        async with self._call("Create Message"):
            return await channel.send(
                chunk,
                reference=reference,
                mention_author=False,
                allowed_mentions=discord.AllowedMentions.none(),
                **extra,
            )

    async def send_file(self, msg: OutboundMessage, path: str) -> None:
        channel = await self._messageable(msg.chat_id)
        data = await self.file_to_send(path)
        async with self._call("Create Message", upload=len(data)):
            await channel.send(file=discord.File(io.BytesIO(data), filename=Path(path).name))

    # -- streaming: a message sent once there is text, then edited --------------------------

    def preview_mode(self, chat_id: str) -> PreviewMode:
        return "message"

    def preview_pieces(self, text: str) -> list[str]:
        # Rendered as the answer will be (mass mentions neutralised too); an unclosed
        # construct at the end of a preview is harmless.
        return render_chunks(text, DISCORD_LIMIT, markdown_to_discord)

    async def send_preview(self, msg: OutboundMessage, text: str, *, first: bool = False) -> str:
        # The first preview is the answer's first message: a reply, as the answer would be.
        sent = await self._send(msg, text, first=first)
        return str(sent.id)

    def preview_shows(self, message_id: str, preview: str, chunk: str) -> bool:
        return chunk == preview  # a preview piece is rendered as the answer's, sent as is

    async def edit_chunk(
        self, chat_id: str, message_id: str, chunk: str, plain: bool = False
    ) -> None:
        channel = await self._messageable(chat_id)
        async with self._call("Edit Message"):
            await channel.get_partial_message(int(message_id)).edit(
                content=chunk, allowed_mentions=discord.AllowedMentions.none()
            )

    async def delete_message(self, chat_id: str, message_id: str) -> None:
        channel = await self._messageable(chat_id)
        async with self._call("Delete Message"):
            await channel.get_partial_message(int(message_id)).delete()

    async def send_typing(self, chat_id: str) -> None:
        channel = await self._messageable(chat_id)
        async with self._call("Trigger Typing Indicator"):
            await channel.typing()  # one POST /typing; the manager refreshes it

    @staticmethod
    def _replies_in(channel: Any) -> bool:
        """Guild channels and threads get replies; DMs plain messages."""
        return not isinstance(channel, discord.DMChannel) and (
            getattr(channel, "guild", None) is not None
            or getattr(channel, "guild_id", None) is not None
        )

    async def admin_chats(self) -> list[str]:
        """The admins' direct-message channels. Discord names a DM by a channel id of its
        own, which only the API gives (Create DM, the same channel each time): opened once
        per admin, then remembered."""
        client = self.client
        if client is None or not self._logged_in:
            return []
        chats = []
        for admin in sorted(a for a in self.policy.admins if a.isdigit()):
            chat = self._admin_dms.get(admin)
            if chat is None:
                try:
                    dm = await client.create_dm(discord.Object(int(admin)))
                except discord.HTTPException as exc:
                    log.warning("discord: cannot open a DM with admin %s: %s", admin, exc)
                    continue
                chat = self._admin_dms[admin] = str(dm.id)
                self._channels[chat] = dm
            chats.append(chat)
        return chats

    async def _messageable(self, chat_id: str) -> Any:
        """The discord.py channel for ``chat_id``: seen in intake, cached, or fetched once."""
        client = self.client
        if client is None or not self._logged_in:
            raise TransientError("discord is not connected")
        channel = self._channels.get(chat_id) or client.get_channel(int(chat_id))
        if channel is None:
            async with self._call("Get Channel"):
                channel = await client.fetch_channel(int(chat_id))
            self._channels[chat_id] = channel
        return channel
