"""Routes outbound messages to their channel: per-chat order, one retry policy, typing.

Each chat has its own queue and worker, so a flood-wait in one chat never delays another.
Every send waits out the platform's rate limits first (``channels.pacing``: token buckets per
chat, per group, per bot, as the channel names them); waiting in a chat's own worker keeps the
pieces and answers of a chat in order. A 429 pauses that chat for the time asked, and what
waited behind it then goes at the steady rate, without a burst.
Final answers go through the delivery ledger (bot/delivery.py) piece by piece: each piece is
marked before it is sent, so a crash or an error at piece k resumes at piece k.

Streaming (DESIGN.md section 11): ``StreamEvent`` values from the bus are ephemeral. Each chat
keeps only the latest text per answer being written (``_Live``), and its worker shows it
between queued messages, at most once per ``Channel.stream_interval`` and only when the
pacer has a token to spare (``Pacer.take_if_ready``): previews are skipped, never queued, so
under load they thin out while answers keep their place. A preview *message* ("message"
mode) is recorded in the ledger as soon as the platform gave its id, and the final answer
edits it into the answer (see bot/delivery.py), so the chat never holds two copies; a preview
that already shows its piece of the answer is left as it is (an edit would only spend a send).
Only an answer's first message, preview or piece, quotes the message it answers.

Every exception a send raises takes the same path (``channels.retry``): flood waits are
honoured, markup refusals retried as plain text, over-long pieces split smaller, permanent
refusals end the answer (the user is told, the ledger keeps it), network trouble is retried
with backoff for at most a minute of the chat's time (then the answer, or an approval
question, comes again from that piece behind the chat's other messages; an answer waits in
the ledger meanwhile), and an exception outside our vocabulary is tried a few times, then
ends the answer like a permanent refusal. Previews that keep failing are switched off in
their chat for a while (``Breaker``). A channel that fails for good (``FatalChannelError``)
is reported through ``on_all_failed`` once every channel has.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import zlib
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Protocol

from bot import failpoints
from bot.bus import TO_ADMINS, TYPING, MessageBus, OutboundMessage, StreamEvent
from bot.long_answers import LONG_ANSWER_CHARS, kept_where
from channels.access import question_view
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
from channels.retry import Breaker, Clock, MonotonicClock, Retries, RetryPolicy

log = logging.getLogger(__name__)

TYPING_REFRESH_SECONDS = 4.0
TYPING_MAX_SECONDS = 600.0
# An answer the platform keeps failing (each attempt holding its chat at most a minute,
# channels.retry) is tried again this long after each attempt, behind the chat's other
# messages; failing GIVE_UP_AFTER_SECONDS in all, it waits in the ledger for the next start.
SEND_AGAIN_AFTER_SECONDS = 30.0
GIVE_UP_AFTER_SECONDS = 900.0
NOTICE_GIVE_UP_SECONDS = 60.0
NOTICE = "I could not deliver my answer: {reason}"
FILE_NOTE = (
    "(This chat cannot receive files: the file stays with memobot, as {where} in its state folder.)"
)
REASON_MAX_CHARS = 200
# Telegram shows a draft for about 30 s: one that has not changed (a long tool run) is sent
# again before then, for as long as a typing indicator would be (TYPING_MAX_SECONDS).
DRAFT_REFRESH_SECONDS = 20.0
PREVIEW_MIN_CHARS = 16  # a preview message waits for this much text (or one interval)
# Answers (all chats together) whose late stream events are ignored. A chat's state leaves
# memory when it falls idle, so this is kept by the manager, not per chat.
FINISHED_REMEMBERED = 1024


class Ledger(Protocol):
    def progress(self, msg: OutboundMessage) -> tuple[list[str] | None, int] | None: ...
    async def sending(
        self, msg: OutboundMessage, pieces: list[str] | None = None, index: int = 0
    ) -> bool: ...
    async def sent(self, msg: OutboundMessage) -> None: ...
    async def postponed(self, msg: OutboundMessage, index: int = 0) -> None: ...
    async def failed(self, msg: OutboundMessage, reason: str = "", index: int = 0) -> None: ...
    def preview_ids(self, key: str, reply_to: str | None) -> list[str]: ...
    async def previewing(self, key: str, reply_to: str | None, ids: list[str]) -> None: ...


class _Live:
    """The preview of one answer being written in one chat."""

    __slots__ = (
        "broken",
        "dirty",
        "done",
        "draft_id",
        "drafted_at",
        "first_at",
        "ids",
        "next_at",
        "shown",
        "started",
        "text",
    )

    def __init__(self, reply_to: str | None, ids: list[str]) -> None:
        self.text: str | None = None  # the latest text (coalesced: older ones never shown)
        self.dirty = False  # text changed since it was last shown
        self.ids = ids  # "message" mode: platform ids of the preview messages, in order
        self.shown: list[str] = []  # what each of them shows
        self.first_at: float | None = None
        self.next_at = 0.0  # no preview update before this (monotonic)
        self.broken = False  # a preview send failed: only the final answer from now on
        self.done = False  # the model finished: the final answer replaces the preview
        # "draft" mode: one draft per answer; Telegram wants a non-zero id.
        self.draft_id = (zlib.crc32((reply_to or "").encode()) & 0x7FFFFFFF) or 1
        self.drafted_at: float | None = None  # when its draft was last sent (monotonic)
        self.started = time.monotonic()


class _Chat:
    """A chat with something to send, show or type. It leaves ``ChannelManager._chats`` when
    all of that is done, so memory follows the chats active now, not every chat ever seen."""

    __slots__ = ("lives", "queue", "typing", "typing_for", "wake", "worker")

    def __init__(self) -> None:
        self.queue: deque[OutboundMessage] = deque()  # one consumer: the chat's worker
        self.worker: asyncio.Task[None] | None = None
        self.typing: asyncio.Task[None] | None = None
        self.typing_for: str | None = None  # the message whose turn the typing is for
        self.lives: dict[str | None, _Live] = {}  # by the message the answer replies to
        self.wake = asyncio.Event()  # a message was queued or a preview changed

    async def sleep(self, seconds: float) -> None:
        """Until something is queued or a preview changes, or ``seconds`` have passed."""
        self.wake.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self.wake.wait()

    def typing_shown(self) -> bool:
        typing = self.typing
        return typing is not None and not typing.done() and typing.cancelling() == 0

    def idle(self) -> bool:
        return (
            not self.queue
            and not self.lives
            and (self.worker is None or self.worker.done())
            and not self.typing_shown()
        )


class ChannelManager:
    def __init__(self, bus: MessageBus, ledger: Ledger, channels: list[Channel]) -> None:
        self.bus = bus
        self.ledger = ledger
        self.channels = {c.name: c for c in channels}
        self._chats: dict[tuple[str, str], _Chat] = {}
        # (channel, chat, replied-to message) of answers already delivered, oldest first.
        self._finished: OrderedDict[tuple[str, str, str | None], None] = OrderedDict()
        self._pump: asyncio.Task[None] | None = None
        self.retry_policy = RetryPolicy()
        self.clock: Clock = MonotonicClock()  # of the retries and the preview breaker
        self._preview_breaker = Breaker()  # by (channel, chat)
        # An answer sent again (by id) -> when it first failed, its pieces, the piece it reached.
        self._again: dict[int, tuple[float, list[str], int]] = {}
        self._pacers: dict[str, Pacer] = {}  # per channel name: its rate-limit buckets
        # Called once when every channel has failed for good (the gateway exits then).
        self.on_all_failed: Callable[[list[Channel]], None] | None = None
        for channel in channels:
            channel.on_fatal = self._channel_failed
            if channel.streaming:
                bus.streaming.add(channel.name)
            bus.command_syntax[channel.name] = channel.command_syntax
        bus.on_stream(self._on_stream)
        bus.on_owner_chats(self.owner_chats)
        self._background: set[asyncio.Task[None]] = set()

    @property
    def chats_in_memory(self) -> int:
        """Chats with something under way (to send, show or type); idle ones are not kept."""
        return len(self._chats)

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
        tasks = [t for t in (self._pump,) if t] + list(self._background)
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
            async with asyncio.timeout(wait_seconds):
                await self.bus.outbound.join()
        except TimeoutError:
            log.warning("outbound messages still unsent after %.0f s", wait_seconds)

    async def _run(self) -> None:
        while True:
            msg = await self.bus.consume_outbound()
            if TYPING in msg.metadata:
                if msg.metadata[TYPING]:
                    self._start_typing(msg)
                else:
                    self._stop_typing(msg)
                self.bus.outbound.task_done()
                continue
            if msg.metadata.get(TO_ADMINS):
                self._background.add(task := asyncio.create_task(self._to_admins(msg)))
                task.add_done_callback(self._background.discard)
                self.bus.outbound.task_done()
                continue
            chat = self._chats.setdefault((msg.channel, msg.chat_id), _Chat())
            chat.queue.append(msg)
            self._wake(chat, msg.channel, msg.chat_id)

    def _wake(self, chat: _Chat, channel: str, chat_id: str) -> None:
        chat.wake.set()
        if chat.worker is None or chat.worker.done():
            chat.worker = asyncio.create_task(
                self._drain(chat, channel, chat_id), name=f"send:{channel}"
            )
            chat.worker.add_done_callback(lambda _: self._forget_if_idle(channel, chat_id, chat))

    def _forget_if_idle(self, channel: str, chat_id: str, chat: _Chat) -> None:
        if chat.idle() and self._chats.get((channel, chat_id)) is chat:
            del self._chats[(channel, chat_id)]

    async def _drain(self, chat: _Chat, channel_name: str, chat_id: str) -> None:
        """The chat's one worker: queued messages first, in order; between them, previews."""
        while True:
            if chat.queue:
                msg = chat.queue.popleft()
                live = chat.lives.pop(msg.reply_to, None) if msg.final else None
                if msg.final and chat.typing and msg.reply_to == chat.typing_for:
                    # The answer is on its way: a chat action sent now would land after its
                    # first piece and show "typing..." under the answer (Telegram: 5 s). A
                    # command's answer (/status during a turn) leaves it be.
                    chat.typing.cancel()
                if msg.final:
                    self._finished[(channel_name, chat_id, msg.reply_to)] = None
                    if len(self._finished) > FINISHED_REMEMBERED:
                        self._finished.popitem(last=False)
                try:
                    await self.deliver(msg, live)
                except Exception:
                    log.exception("delivery crashed session=%s", msg.session_key)
                finally:
                    self.bus.outbound.task_done()
                continue
            channel = self.channels.get(channel_name)
            if channel is None or channel.fatal is not None:
                return
            live = next((v for v in chat.lives.values() if v.dirty and not v.broken), None)
            if live is None:
                live, wait = self._draft_to_refresh(channel, chat_id, chat)
                if live is None:
                    return
                if wait > 0:
                    if not chat.queue:
                        await chat.sleep(wait)
                    continue
                live.dirty = True
            wait = self._preview_wait(channel, chat_id, live)
            if wait <= 0:
                wait = await self._show_preview(channel, chat_id, live)
            if wait > 0 and not chat.queue:  # (checked, then cleared with no await between)
                await chat.sleep(wait)

    # -- streaming --

    def _on_stream(self, event: StreamEvent) -> None:
        """A stream event from a turn: keep it as its chat's latest; never blocks."""
        channel = self.channels.get(event.channel)
        if channel is None or not channel.streaming or channel.fatal is not None:
            return
        mode = channel.preview_mode(event.chat_id)
        if mode == "off":
            return
        if mode == "direct":
            channel.show_stream(event)
            return
        if (event.channel, event.chat_id, event.reply_to) in self._finished:
            return  # its answer is already delivered: a late event must not reopen it
        chat = self._chats.setdefault((event.channel, event.chat_id), _Chat())
        live = chat.lives.get(event.reply_to)
        if live is None:
            ids = self.ledger.preview_ids(event.session_key, event.reply_to)
            live = chat.lives[event.reply_to] = _Live(event.reply_to, ids)
            if ids:
                log.info(
                    "stream session=%s continues in %d preview message(s) from before a restart",
                    event.session_key,
                    len(ids),
                )
        if live.done:
            return
        if event.kind == "done":
            live.done = True  # the answer follows at once: no preview spends its send
            live.dirty = False
            return
        if event.kind == "tool":
            if mode != "draft":
                return  # a preview message keeps its text while tools run
            text = ""  # an empty draft: the app shows "Thinking..."
        else:
            text = event.text
        if text == live.text:
            return
        live.text = text
        live.dirty = True
        if live.first_at is None and text.strip():
            live.first_at = time.monotonic()
        self._wake(chat, event.channel, event.chat_id)

    @staticmethod
    def _draft_to_refresh(
        channel: Channel, chat_id: str, chat: _Chat
    ) -> tuple[_Live | None, float]:
        """The draft of an answer still being worked on that is due to be sent again, and the
        seconds until it is (None: no draft to keep up)."""
        if channel.preview_mode(chat_id) != "draft" or not chat.typing_shown():
            # A draft is kept up while the bot works on it, not while its turn waits for an
            # approval or for the model to come back (typing stopped).
            return None, 0.0
        now = time.monotonic()
        due = [
            (v.drafted_at + DRAFT_REFRESH_SECONDS - now, i, v)
            for i, v in enumerate(chat.lives.values())
            if v.drafted_at is not None
            and not (v.done or v.broken)
            and now - v.started < TYPING_MAX_SECONDS
        ]
        if not due:
            return None, 0.0
        wait, _, live = min(due)
        return live, wait

    def _preview_wait(self, channel: Channel, chat_id: str, live: _Live) -> float:
        """Seconds before ``live`` may be shown (0: now)."""
        now = time.monotonic()
        wait = live.next_at - now
        if not live.ids and channel.preview_mode(chat_id) == "message":
            text = whole_words(live.text or "").strip()
            if not text:
                live.dirty = False  # nothing worth a message yet
                return 0.0
            if len(text) < PREVIEW_MIN_CHARS and live.first_at is not None:
                wait = max(wait, live.first_at + channel.stream_interval - now)
        return wait

    async def _show_preview(self, channel: Channel, chat_id: str, live: _Live) -> float:
        """Show ``live``'s latest text, one platform call at a time, each within the pacer's
        spare tokens; returns the seconds to wait before trying again (0: done for now)."""
        if not live.dirty:
            return 0.0
        breaker = (channel.name, chat_id)
        if not self._preview_breaker.allows(breaker, self.clock.now()):
            live.broken = True  # this chat's previews are off for a while: the answer comes whole
            return 0.0
        mode = channel.preview_mode(chat_id)
        limits = channel.pace_limits(chat_id)
        pacer = self._pacer(channel)
        session = f"{channel.name}:{chat_id}"
        text = live.text or ""
        # A long answer ends cut (bot.long_answers): its preview does not grow past that.
        shown = whole_words(text[:LONG_ANSWER_CHARS])
        pieces = channel.preview_pieces(shown) if shown.strip() else [""]
        if mode == "message":
            pieces = [p for p in pieces if p.strip()]
        if mode == "draft":
            pieces = pieces[-1:]  # a draft shows the part being written
        for i, piece in enumerate(pieces):
            if mode == "message" and i < len(live.shown) and live.shown[i] == piece:
                continue
            wait = pacer.take_if_ready(limits, time.monotonic())
            if wait > 0:
                return wait
            del live.shown[i:]  # unknown until the platform answers (a failed edit may land)
            try:
                if mode == "draft":
                    await channel.send_draft(chat_id, live.draft_id, piece)
                    live.drafted_at = time.monotonic()
                elif i < len(live.ids):
                    await channel.edit_chunk(chat_id, live.ids[i], piece, plain=True)
                else:
                    await self._new_preview_message(channel, chat_id, live, piece)
            except RetryAfter as exc:
                now = time.monotonic()
                pacer.hold(limits, now + exc.seconds + 0.1, now)
                log.warning(
                    "preview rate limited session=%s: waiting %.1f s as the platform asked",
                    session,
                    exc.seconds,
                )
                return exc.seconds + 0.1
            except Exception as exc:
                # Ephemeral: never retried. A failed *send* may still have landed without us
                # learning its id, so this answer gets no more previews, only its final.
                live.broken = mode == "message" and i >= len(live.ids)
                if self._preview_breaker.failed(breaker, self.clock.now()):
                    live.broken = True
                    log.warning(
                        "previews off session=%s for %.0f s after %d failures in a row (%s); "
                        "answers come whole",
                        session,
                        self._preview_breaker.cool_down,
                        self._preview_breaker.threshold,
                        _reason(exc),
                    )
                else:
                    log.info(
                        "preview failed session=%s (%s)%s",
                        session,
                        _reason(exc),
                        "; the answer will come whole" if live.broken else "",
                    )
                live.next_at = time.monotonic() + channel.stream_interval
                return channel.stream_interval
            self._preview_breaker.succeeded(breaker)
            if mode == "message":
                live.shown[i:] = [piece]
        if live.text == text:
            live.dirty = False
        live.next_at = time.monotonic() + channel.stream_interval
        return 0.0 if not live.dirty else channel.stream_interval

    async def _new_preview_message(
        self, channel: Channel, chat_id: str, live: _Live, text: str
    ) -> None:
        """Send one more preview message and record its id in the ledger before going on."""
        reply_to = next((r for r, v in self._live_items(channel.name, chat_id) if v is live), None)
        msg = OutboundMessage(channel.name, chat_id, text, reply_to=reply_to)
        message_id = await channel.send_preview(msg, text, first=not live.ids)
        live.ids.append(message_id)
        await self.ledger.previewing(msg.session_key, reply_to, live.ids)

    def _live_items(self, channel: str, chat_id: str) -> list[tuple[str | None, _Live]]:
        chat = self._chats.get((channel, chat_id))
        return list(chat.lives.items()) if chat else []

    async def _to_admins(self, notice: OutboundMessage) -> None:
        """Queue ``notice`` into every admin's private chat on every running channel."""
        for channel in self.channels.values():
            chats = await self._admin_chats(channel)
            if chats is None:
                continue
            if not chats:
                log.info("no admin chat to tell channel=%s", channel.name)
            for chat_id in chats:
                await self.bus.publish_outbound(
                    replace(notice, channel=channel.name, chat_id=chat_id, metadata={})
                )

    @staticmethod
    async def _admin_chats(channel: Channel) -> list[str] | None:
        """The admins' private chats of a running channel; None when it is down or cannot
        say (logged: a platform error must not stop a notice to the other channels)."""
        if channel.fatal is not None:
            return None
        try:
            return await channel.admin_chats()
        except Exception as exc:
            log.warning("cannot find the admins' chats channel=%s: %s", channel.name, exc)
            return None

    async def owner_chats(self, channel_name: str, chat_id: str) -> list[tuple[str, str]]:
        """Where an unattended turn's approval question goes: the chat ``chat_id`` itself
        when it is an admin's private chat on ``channel_name``; else every admin's private
        chat on that channel; else on the first running channel that has any. [] when no
        running channel knows an admin's chat."""
        preferred = self.channels.get(channel_name)
        order = [preferred] if preferred is not None else []
        order += [c for c in self.channels.values() if c is not preferred]
        for channel in order:
            chats = await self._admin_chats(channel)
            if chats is None:
                continue
            if channel is preferred and chat_id in chats:
                return [(channel.name, chat_id)]
            if chats:
                return [(channel.name, chat) for chat in chats]
        return []

    def _start_typing(self, msg: OutboundMessage) -> None:
        channel = self.channels.get(msg.channel)
        if channel is None:
            return
        chat = self._chats.setdefault((msg.channel, msg.chat_id), _Chat())
        chat.typing_for = msg.reply_to
        if chat.typing_shown():  # one just stopped is replaced: it is on its way out
            return
        chat.typing = asyncio.create_task(self._typing(channel, msg.chat_id))
        chat.typing.add_done_callback(
            lambda _: self._forget_if_idle(msg.channel, msg.chat_id, chat)
        )

    def _stop_typing(self, msg: OutboundMessage) -> None:
        chat = self._chats.get((msg.channel, msg.chat_id))
        if chat is not None and chat.typing is not None:
            chat.typing.cancel()

    async def _typing(self, channel: Channel, chat_id: str) -> None:
        # An answer delivered within the delay cancels this first: no indicator, no call.
        await asyncio.sleep(channel.typing_delay)
        started = time.monotonic()
        while time.monotonic() - started < TYPING_MAX_SECONDS:
            try:
                await channel.send_typing(chat_id)
            except Exception as exc:  # typing is cosmetic; never let it matter
                log.debug("typing indicator failed channel=%s: %s", channel.name, exc)
            await asyncio.sleep(TYPING_REFRESH_SECONDS)

    async def deliver(self, msg: OutboundMessage, live: _Live | None = None) -> None:
        """Send ``msg`` piece by piece from the first piece the ledger has not seen go out.

        A final answer whose preview messages exist (``live``, or the ledger's record after a
        restart) edits them piece by piece instead; previews it does not need are deleted."""
        again = self._again.pop(id(msg), None)
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
        if again is not None and progress == (None, 0):
            # Not in the ledger (a command's answer): only this process knows how far it got.
            _, pieces, index = again
        edits: list[str] = []
        if msg.final:
            edits = (
                list(live.ids) if live else self.ledger.preview_ids(msg.session_key, msg.reply_to)
            )
        unused: list[str] = []  # previews that could not be edited
        try:
            if pieces is None:
                pieces = channel.render_message(msg)
            while index < len(pieces):
                if index:
                    failpoints.hit("between_pieces")
                if not await self.ledger.sending(msg, pieces, index):
                    return
                edit = edits[index] if index < len(edits) else None
                if edit is not None and _shows(channel, live, index, edit, pieces[index]):
                    index += 1  # the preview already shows this piece: no send spent on it
                    continue
                try:
                    await self._send_chunk(channel, msg, pieces[index], edit=edit, first=index == 0)
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
                except PermanentError as exc:
                    if edit is None:
                        raise
                    # The preview is gone (deleted in the chat) or may no longer be edited
                    # (too old): the piece is sent anew and the preview deleted (a best-effort
                    # delete of a message already gone only logs).
                    log.warning(
                        "preview message could not be edited session=%s (%s); sending piece "
                        "%d as a new message",
                        msg.session_key,
                        exc,
                        index + 1,
                    )
                    unused += edits[index:]
                    edits = edits[:index]
                    continue
                index += 1
            # The files come after the text, each one more step of the ledger.
            for step, path in enumerate(msg.media, start=len(pieces)):
                if index > step:
                    continue
                if not await self.ledger.sending(msg, pieces, step):
                    return
                await self._send_file(channel, msg, path)
                index = step + 1
        except FatalChannelError as exc:
            channel.fail(exc)
            await self.ledger.postponed(msg, index)
            return
        except TimeoutError as exc:  # transient failures for a whole hold: later, behind the rest
            await self.ledger.postponed(msg, index)
            self._send_again_later(msg, pieces or [], index, exc, again)
            return
        except Exception as exc:  # PermanentError, or a render bug: the same end
            reason = _reason(exc)
            log.error(
                "answer undeliverable session=%s piece %d: %s", msg.session_key, index + 1, reason
            )
            await self.ledger.failed(msg, reason, index)
            await self._notify_undeliverable(channel, msg, reason)
            return
        for extra in [*edits[len(pieces) :], *unused]:
            await self._delete_preview(channel, msg, extra)
        failpoints.hit("after_send")
        await self.ledger.sent(msg)

    def _send_again_later(
        self,
        msg: OutboundMessage,
        pieces: list[str],
        index: int,
        exc: TimeoutError,
        before: tuple[float, list[str], int] | None,
    ) -> None:
        """Piece ``index`` of ``pieces`` (``msg``) failed for a whole hold: the chat moves on,
        and a final answer or an approval question (a turn waits on it) is queued again
        (behind what the chat has waiting by then) after a pause, from that piece, until it
        has been failing for ``GIVE_UP_AFTER_SECONDS`` (``before``: its earlier attempt);
        then (and for anything else) what the ledger holds waits for the next start."""
        now = self.clock.now()
        since = now if before is None else before[0]
        wanted = msg.final or question_view(msg) is not None  # not a note that would be stale
        again = wanted and now - since + SEND_AGAIN_AFTER_SECONDS < GIVE_UP_AFTER_SECONDS
        then = (
            f"trying again in {SEND_AGAIN_AFTER_SECONDS:.0f} s"
            if again
            else "kept for the next start"
        )
        log.error("send failed session=%s piece %d: %s; %s", msg.session_key, index + 1, exc, then)
        if not again:
            return

        async def later() -> None:
            await self.clock.sleep(SEND_AGAIN_AFTER_SECONDS)
            self._again[id(msg)] = (since, pieces, index)
            await self.bus.publish_outbound(msg)

        self._background.add(task := asyncio.create_task(later()))
        task.add_done_callback(self._background.discard)

    async def _send_file(self, channel: Channel, msg: OutboundMessage, path: str) -> None:
        """Upload ``path`` to the chat, or, where the channel cannot (or the file is larger
        than it takes), say where it is kept."""
        if channel.sends_files and _fits(path, channel.max_file_bytes):
            try:
                await self._with_retries(channel, msg, lambda _plain: channel.send_file(msg, path))
                return
            except PermanentError as exc:
                # E.g. a Slack app installed without files:write: the text already went out,
                # so the chat is told where the rest is rather than that nothing arrived.
                log.warning(
                    "file not sent session=%s: %s; the chat is told where it is",
                    msg.session_key,
                    _reason(exc),
                )
        note = FILE_NOTE.format(where=kept_where(path))
        for piece in channel.render(note):
            await self._send_chunk(channel, msg, piece)

    async def _delete_preview(
        self, channel: Channel, msg: OutboundMessage, message_id: str
    ) -> None:
        """Best effort, one try: a preview the answer did not need (it came out shorter)."""
        await self._pace(channel, channel.pace_limits(msg.chat_id))
        try:
            await channel.delete_message(msg.chat_id, message_id)
        except Exception as exc:
            log.warning(
                "could not delete a preview message session=%s: %s", msg.session_key, _reason(exc)
            )

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
        edit: str | None = None,
        first: bool = False,
    ) -> None:
        """Send one piece (``edit``: put it into that existing message instead; ``first``:
        the answer's first piece, which quotes the message it answers), honouring flood
        waits and backing off on transient errors (``channels.retry``).

        Raises ``PermanentError`` (including ``TooLong``, and ``UnexpectedError`` once an
        exception outside ``channels.errors`` failed a few tries), ``FatalChannelError``, or
        ``TimeoutError`` once retrying would hold the chat past ``give_up_after`` (default:
        the policy's hold; the platform's own retry_after waits do not count).
        """

        async def send(plain: bool) -> None:
            text = channel.plain(chunk) if plain else chunk
            if edit is not None:
                await channel.edit_chunk(msg.chat_id, edit, text, plain)
            else:
                await channel.send_chunk(msg, text, plain, first=first)

        await self._with_retries(channel, msg, send, give_up_after)

    async def _with_retries(
        self,
        channel: Channel,
        msg: OutboundMessage,
        send: Callable[[bool], Awaitable[None]],
        give_up_after: float | None = None,
    ) -> None:
        """The one retry policy of every send: ``send(plain)`` (plain: markup was refused,
        send it as plain text) until it succeeds; raises as ``_send_chunk``."""
        policy = self.retry_policy
        if give_up_after is not None:
            policy = replace(policy, hold_seconds=give_up_after)
        retries = Retries(policy, self.clock.now())
        plain = False
        limits = channel.pace_limits(msg.chat_id)
        while True:
            await self._pace(channel, limits)
            try:
                await send(plain)
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
                wait = retries.wait_after(exc, self.clock.now())
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
                wait = retries.wait_after(exc, self.clock.now())
                log.warning(
                    "send failed session=%s (%s), retry in %.1f s",
                    msg.session_key,
                    exc if isinstance(exc, TransientError) else _reason(exc),
                    wait,
                )
            await self.clock.sleep(wait)


def whole_words(text: str) -> str:
    """``text`` up to its last whitespace: a preview never shows half a word. Besides looking
    calmer, a secret the answer quotes (a token, a key) then shows whole or not at all, so the
    log's secret filter, which knows whole secrets, also catches it in a preview's payload."""
    if not text or text[-1].isspace():
        return text
    cut = max(text.rfind(" "), text.rfind("\n"), text.rfind("\t"))
    return text[: cut + 1] if cut >= 0 else ""


def _shows(channel: Channel, live: _Live | None, index: int, message_id: str, piece: str) -> bool:
    """Whether preview message ``message_id``, the ``index``th of ``live``, already shows
    ``piece`` of the final answer (what it was last given is known only in this process)."""
    return (
        live is not None
        and index < len(live.shown)
        and channel.preview_shows(message_id, live.shown[index], piece)
    )


def _reason(exc: BaseException) -> str:
    """A short description of ``exc`` for the user and the log."""
    text = str(exc) if isinstance(exc, PermanentError) else f"{type(exc).__name__}: {exc}"
    text = text.strip() or type(exc).__name__
    return text if len(text) <= REASON_MAX_CHARS else text[: REASON_MAX_CHARS - 3] + "..."


def _fits(path: str, limit: int | None) -> bool:
    """Whether the file at ``path`` is within an upload ``limit`` (unreadable: let the upload
    say so)."""
    if limit is None:
        return True
    try:
        return os.path.getsize(path) <= limit
    except OSError:
        return True
