"""Routes outbound messages to their channel: per-chat order, one retry policy, typing.

Each chat has its own queue and worker, so a flood-wait in one chat never delays another.
Final answers go through the delivery ledger (bot/delivery.py) around the send.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Protocol

from bot import failpoints
from bot.bus import MessageBus, OutboundMessage
from channels.base import Channel
from channels.errors import FormattingRejected, PermanentError, RetryAfter, TransientError

log = logging.getLogger(__name__)

TYPING_REFRESH_SECONDS = 4.0
TYPING_MAX_SECONDS = 600.0
GIVE_UP_AFTER_SECONDS = 900.0  # then the answer stays queued in the ledger for the next start
BACKOFF_START, BACKOFF_FACTOR, BACKOFF_MAX = 1.0, 1.5, 30.0


class Ledger(Protocol):
    async def sending(self, msg: OutboundMessage) -> bool: ...
    async def sent(self, msg: OutboundMessage) -> None: ...
    async def failed(self, msg: OutboundMessage) -> None: ...


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

    async def start(self) -> None:
        for channel in self.channels.values():
            await channel.start()
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
        channel = self.channels.get(msg.channel)
        if channel is None:
            log.warning(
                "no running channel %r session=%s; a final answer stays queued for the next start",
                msg.channel,
                msg.session_key,
            )
            return
        if not await self.ledger.sending(msg):
            return
        try:
            for chunk in channel.render(msg.text):
                await self._send_chunk(channel, msg, chunk)
        except (PermanentError, TimeoutError) as exc:
            log.error("send failed session=%s: %s", msg.session_key, exc)
            await self.ledger.failed(msg)
            return
        failpoints.hit("after_send")
        await self.ledger.sent(msg)

    async def _send_chunk(self, channel: Channel, msg: OutboundMessage, chunk: str) -> None:
        """Send one piece, honouring flood waits and backing off on transient errors."""
        deadline = time.monotonic() + self.give_up_after
        backoff = BACKOFF_START
        plain = False
        while True:
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
                log.warning(
                    "rate limited session=%s: waiting %.1f s as the platform asked",
                    msg.session_key,
                    wait,
                )
            except TransientError as exc:
                wait = backoff
                backoff = min(BACKOFF_MAX, backoff * BACKOFF_FACTOR)
                log.warning(
                    "send failed session=%s (%s), retry in %.1f s", msg.session_key, exc, wait
                )
            if time.monotonic() + wait > deadline:
                raise TimeoutError(f"gave up after {self.give_up_after:.0f} s of retries")
            await asyncio.sleep(wait)
