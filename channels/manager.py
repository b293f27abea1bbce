"""Routes outbound messages to their channel: per-chat order, one retry policy, typing.

Each chat has its own queue and worker, so a flood-wait in one chat never delays another.
Every send waits out the platform's rate limits first (``channels.pacing``: token buckets per
chat, per group, per bot, as the channel names them); waiting in a chat's own worker keeps the
pieces and answers of a chat in order. A 429 pauses that chat for the time asked, and what
waited behind it then goes at the steady rate, without a burst.
Final answers go through the delivery ledger (bot/delivery.py) piece by piece: each piece is
marked before it is sent, so a crash or an error at piece k resumes at piece k.

Every exception a send raises takes the same path: flood waits are honoured, markup refusals
retried as plain text, over-long pieces split smaller, permanent refusals end the answer (the
user is told, the ledger keeps it), anything else is retried with backoff. A channel that
fails for good (``FatalChannelError``) is reported through ``on_all_failed`` once every
channel has.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Protocol

from bot import failpoints
from bot.bus import TO_ADMINS, MessageBus, OutboundMessage
from channels.base import Channel
from channels.errors import (
    FatalChannelError,
    FormattingRejected,
    PermanentError,
    RetryAfter,
    TooLong,
    TransientError,
)
from channels.pacing import Limit, Pacer

log = logging.getLogger(__name__)

TYPING_REFRESH_SECONDS = 4.0
TYPING_MAX_SECONDS = 600.0
GIVE_UP_AFTER_SECONDS = 900.0  # then the answer stays queued in the ledger for the next start
BACKOFF_START, BACKOFF_FACTOR, BACKOFF_MAX = 1.0, 1.5, 30.0
NOTICE_GIVE_UP_SECONDS = 60.0
NOTICE = "I could not deliver my answer: {reason}"
REASON_MAX_CHARS = 200


class Ledger(Protocol):
    def progress(self, msg: OutboundMessage) -> tuple[list[str] | None, int] | None: ...
    async def sending(
        self, msg: OutboundMessage, pieces: list[str] | None = None, index: int = 0
    ) -> bool: ...
    async def sent(self, msg: OutboundMessage) -> None: ...
    async def postponed(self, msg: OutboundMessage, index: int = 0) -> None: ...
    async def failed(self, msg: OutboundMessage, reason: str = "", index: int = 0) -> None: ...


class _Chat:
    __slots__ = ("queue", "typing", "worker")

    def __init__(self) -> None:
        self.queue: asyncio.Queue[OutboundMessage] = asyncio.Queue()
        self.worker: asyncio.Task[None] | None = None
        self.typing: asyncio.Task[None] | None = None


class ChannelManager:
    def __init__(self, bus: MessageBus, ledger: Ledger, channels: list[Channel]) -> None:
        self.bus = bus
        self.ledger = ledger
        self.channels = {c.name: c for c in channels}
        self._chats: dict[tuple[str, str], _Chat] = {}
        self._pump: asyncio.Task[None] | None = None
        self.give_up_after = GIVE_UP_AFTER_SECONDS
        self._pacers: dict[str, Pacer] = {}  # per channel name: its rate-limit buckets
        # Called once when every channel has failed for good (the gateway exits then).
        self.on_all_failed: Callable[[list[Channel]], None] | None = None
        for channel in channels:
            channel.on_fatal = self._channel_failed
        self._background: set[asyncio.Task[None]] = set()

    def _channel_failed(self, channel: Channel) -> None:
        channels = list(self.channels.values())
        if all(c.fatal is not None for c in channels) and self.on_all_failed is not None:
            callback, self.on_all_failed = self.on_all_failed, None
            callback(channels)

    async def start(self) -> None:
        for channel in self.channels.values():
            try:
                await channel.start()
            except FatalChannelError as exc:
                channel.fail(exc)
        self._pump = asyncio.create_task(self._run(), name="outbound")

    async def stop(self) -> None:
        tasks = [t for t in (self._pump,) if t]
        for chat in self._chats.values():
            tasks += [t for t in (chat.worker, chat.typing) if t]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for channel in self.channels.values():
            try:
                await channel.stop()
            except Exception:
                log.exception("channel %s did not stop cleanly", channel.name)

    async def flush(self, wait_seconds: float = 10.0) -> None:
        """Wait until everything queued so far has been handed to its channel."""
        try:
            await asyncio.wait_for(self.bus.outbound.join(), wait_seconds)
        except TimeoutError:
            log.warning("outbound messages still unsent after %.0f s", wait_seconds)

    async def _run(self) -> None:
        while True:
            msg = await self.bus.consume_outbound()
            if msg.metadata.get("typing"):
                self._start_typing(msg)
                self.bus.outbound.task_done()
                continue
            if msg.metadata.get(TO_ADMINS):
                self._background.add(task := asyncio.create_task(self._to_admins(msg)))
                task.add_done_callback(self._background.discard)
                self.bus.outbound.task_done()
                continue
            chat = self._chats.setdefault((msg.channel, msg.chat_id), _Chat())
            chat.queue.put_nowait(msg)
            if chat.worker is None or chat.worker.done():
                chat.worker = asyncio.create_task(self._drain(chat), name=f"send:{msg.channel}")

    async def _drain(self, chat: _Chat) -> None:
        while not chat.queue.empty():
            msg = chat.queue.get_nowait()
            try:
                await self.deliver(msg)
            except Exception:
                log.exception("delivery crashed session=%s", msg.session_key)
            finally:
                if msg.final and chat.typing:
                    chat.typing.cancel()
                self.bus.outbound.task_done()

    async def _to_admins(self, notice: OutboundMessage) -> None:
        """Queue ``notice`` into every admin's private chat on every running channel."""
        for channel in self.channels.values():
            if channel.fatal is not None:
                continue
            try:
                chats = await channel.admin_chats()
            except Exception as exc:
                log.warning("cannot find the admins' chats channel=%s: %s", channel.name, exc)
                continue
            if not chats:
                log.info("no admin chat to tell channel=%s", channel.name)
            for chat_id in chats:
                await self.bus.publish_outbound(
                    replace(notice, channel=channel.name, chat_id=chat_id, metadata={})
                )

    def _start_typing(self, msg: OutboundMessage) -> None:
        channel = self.channels.get(msg.channel)
        if channel is None:
            return
        chat = self._chats.setdefault((msg.channel, msg.chat_id), _Chat())
        if chat.typing and not chat.typing.done():
            return
        chat.typing = asyncio.create_task(self._typing(channel, msg.chat_id))

    async def _typing(self, channel: Channel, chat_id: str) -> None:
        started = time.monotonic()
        while time.monotonic() - started < TYPING_MAX_SECONDS:
            try:
                await channel.send_typing(chat_id)
            except Exception as exc:  # typing is cosmetic; never let it matter
                log.debug("typing indicator failed channel=%s: %s", channel.name, exc)
            await asyncio.sleep(TYPING_REFRESH_SECONDS)

    async def deliver(self, msg: OutboundMessage) -> None:
        """Send ``msg`` piece by piece from the first piece the ledger has not seen go out."""
        channel = self.channels.get(msg.channel)
        if channel is None or channel.fatal is not None:
            why = "no running channel" if channel is None else "failed channel"
            log.warning(
                "%s %r session=%s; a final answer stays queued for the next start",
                why,
                msg.channel,
                msg.session_key,
            )
            return
        progress = self.ledger.progress(msg)
        if progress is None:
            return
        pieces, index = progress
        try:
            if pieces is None:
                pieces = channel.render(msg.text)
            while index < len(pieces):
                if index:
                    failpoints.hit("between_pieces")
                if not await self.ledger.sending(msg, pieces, index):
                    return
                try:
                    await self._send_chunk(channel, msg, pieces[index])
                except TooLong as exc:
                    smaller = channel.resplit(pieces[index])
                    if len(smaller) < 2:
                        raise PermanentError(f"{exc} (and it cannot be split further)") from exc
                    log.warning(
                        "piece %d refused as too long session=%s (%s); sending it in %d pieces",
                        index + 1,
                        msg.session_key,
                        exc,
                        len(smaller),
                    )
                    pieces = [*pieces[:index], *smaller, *pieces[index + 1 :]]
                    continue
                index += 1
        except FatalChannelError as exc:
            channel.fail(exc)
            await self.ledger.postponed(msg, index)
            return
        except TimeoutError as exc:  # transient failures for give_up_after: the next start
            log.error("send failed session=%s piece %d: %s", msg.session_key, index + 1, exc)
            await self.ledger.postponed(msg, index)
            return
        except Exception as exc:  # PermanentError, or a render bug: the same end
            reason = _reason(exc)
            log.error(
                "answer undeliverable session=%s piece %d: %s", msg.session_key, index + 1, reason
            )
            await self.ledger.failed(msg, reason, index)
            await self._notify_undeliverable(channel, msg, reason)
            return
        failpoints.hit("after_send")
        await self.ledger.sent(msg)

    async def _notify_undeliverable(
        self, channel: Channel, msg: OutboundMessage, reason: str
    ) -> None:
        """Best effort: tell the user, in a short plain message, that the answer is missing."""
        notice = OutboundMessage(msg.channel, msg.chat_id, NOTICE.format(reason=reason))
        try:
            for piece in channel.render(notice.text):
                await self._send_chunk(channel, notice, piece, NOTICE_GIVE_UP_SECONDS)
        except Exception as exc:
            log.error("could not tell session=%s either: %s", msg.session_key, _reason(exc))

    def _pacer(self, channel: Channel) -> Pacer:
        pacer = self._pacers.get(channel.name)
        if pacer is None:
            pacer = self._pacers[channel.name] = Pacer()
        return pacer

    async def _pace(self, channel: Channel, limits: Sequence[Limit]) -> None:
        """Wait until a send within every bucket of ``limits`` may go, one bucket after the
        other: the chat's own first, so a chat waiting for itself holds no shared token."""
        pacer = self._pacer(channel)
        for limit in limits:
            wait = pacer.reserve(limit, time.monotonic())
            if wait > 0:
                await asyncio.sleep(wait)

    async def _send_chunk(
        self,
        channel: Channel,
        msg: OutboundMessage,
        chunk: str,
        give_up_after: float | None = None,
    ) -> None:
        """Send one piece, honouring flood waits and backing off on transient errors.

        Raises ``PermanentError`` (including ``TooLong``), ``FatalChannelError``, or
        ``TimeoutError`` once retrying would pass the deadline; any other exception of the
        channel is retried like a transient error.
        """
        deadline = time.monotonic() + (give_up_after or self.give_up_after)
        backoff = BACKOFF_START
        plain = False
        limits = channel.pace_limits(msg.chat_id)
        while True:
            await self._pace(channel, limits)
            try:
                await channel.send_chunk(msg, channel.plain(chunk) if plain else chunk, plain)
                return
            except FormattingRejected as exc:
                if plain:
                    raise
                log.warning(
                    "markup refused session=%s (%s); sending plain text", msg.session_key, exc
                )
                plain = True
                continue
            except RetryAfter as exc:
                wait = exc.seconds + 0.1
                now = time.monotonic()
                self._pacer(channel).hold(limits, now + wait, now)
                log.warning(
                    "rate limited session=%s: waiting %.1f s as the platform asked",
                    msg.session_key,
                    wait,
                )
            except (PermanentError, FatalChannelError):
                raise
            except Exception as exc:  # TransientError, and whatever else an SDK raises
                wait = backoff
                backoff = min(BACKOFF_MAX, backoff * BACKOFF_FACTOR)
                log.warning(
                    "send failed session=%s (%s), retry in %.1f s",
                    msg.session_key,
                    exc if isinstance(exc, TransientError) else _reason(exc),
                    wait,
                )
            if time.monotonic() + wait > deadline:
                raise TimeoutError(
                    f"gave up after {give_up_after or self.give_up_after:.0f} s of retries"
                )
            await asyncio.sleep(wait)


def _reason(exc: BaseException) -> str:
    """A short description of ``exc`` for the user and the log."""
    text = str(exc) if isinstance(exc, PermanentError) else f"{type(exc).__name__}: {exc}"
    text = text.strip() or type(exc).__name__
    return text if len(text) <= REASON_MAX_CHARS else text[: REASON_MAX_CHARS - 3] + "..."
