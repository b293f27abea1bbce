"""Routes what the core hands out to the channels: answers and notices to their chat in order,
admin notices to the admins' chats, a turn's activity into typing and drafts, stream events
into previews.

Each chat has its own queue and worker, so a flood-wait in one chat never delays another;
the worker hands each message to ``channels.delivery`` (ledgered, paced, the one retry
policy), and waiting in a chat's own worker keeps the pieces and answers of a chat in order.

Streaming (DESIGN.md section 11): ``StreamEvent`` values from the bus are ephemeral. Each chat
keeps only the latest state of each answer being written (a ``channels.preview.Preview``, by
the message it answers), and its worker shows it between queued messages as
``channels.preview.decide`` says, and only when the pacer has a token to spare
(``Pacer.take_if_ready``): previews are skipped, never queued, so under load they thin out
while answers keep their place. A preview *message* ("message" mode) is recorded in the
ledger as soon as the platform gave its id, and the final answer edits it into the answer;
a preview that already shows its piece of the answer is left as it is. Only an answer's
first message, preview or piece, quotes the message it answers. Previews that keep failing
are switched off in their chat for a while (``Breaker``).

The activity signal (``bot.bus.TurnActivity``) is the only thing that shows typing: working
shows it (refreshed, and a draft kept up), waiting for a person or the model or done stops
it; the turn's own final answer stops it too, before its first piece goes out.

All time is read from, and all waiting done on, one injected ``Clock`` (``channels.retry``).
A channel that fails for good (``FatalChannelError``) is reported through ``on_all_failed``
once every platform channel has (the panel's chat is none).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict, deque
from collections.abc import Callable

from bot.bus import (
    Activity,
    AdminNotice,
    InboundMessage,
    MessageBus,
    Outbound,
    OutboundMessage,
    StreamEvent,
    TurnActivity,
)
from bot.long_answers import LONG_ANSWER_CHARS
from bot.media import Fetched, not_fetched
from channels import preview
from channels.base import Channel
from channels.delivery import Delivery, Ledger, short_reason
from channels.errors import FatalChannelError, RetryAfter
from channels.preview import Mode, Preview, Show, Wait
from channels.retry import Breaker, Clock, MonotonicClock

log = logging.getLogger(__name__)

TYPING_REFRESH_SECONDS = 4.0
TYPING_MAX_SECONDS = preview.DRAFT_KEPT_SECONDS  # a draft is kept up as long as typing
# Answers (all chats together) whose late stream events are ignored. A chat's state leaves
# memory when it falls idle, so this is kept by the manager, not per chat.
FINISHED_REMEMBERED = 1024


class _Chat:
    """A chat with something to send, show or type. It leaves ``ChannelManager._chats`` when
    all of that is done, so memory follows the chats active now, not every chat ever seen."""

    __slots__ = ("lives", "queue", "typing", "typing_for", "wake", "worker")

    def __init__(self) -> None:
        self.queue: deque[OutboundMessage] = deque()  # one consumer: the chat's worker
        self.worker: asyncio.Task[None] | None = None
        self.typing: asyncio.Task[None] | None = None
        self.typing_for: str | None = None  # the message whose turn the typing is for
        self.lives: dict[str | None, Preview] = {}  # by the message the answer replies to
        self.wake = asyncio.Event()  # a message was queued or a preview changed

    async def sleep(self, clock: Clock, seconds: float) -> None:
        """Until something is queued or a preview changes, or ``seconds`` have passed."""
        self.wake.clear()
        woken = asyncio.ensure_future(self.wake.wait())
        timer = asyncio.ensure_future(clock.sleep(seconds))
        try:
            await asyncio.wait((woken, timer), return_when=asyncio.FIRST_COMPLETED)
        finally:
            woken.cancel()
            timer.cancel()

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
    def __init__(
        self,
        bus: MessageBus,
        ledger: Ledger,
        channels: list[Channel],
        clock: Clock | None = None,
    ) -> None:
        self.bus = bus
        self.ledger = ledger
        self.channels = {c.name: c for c in channels}
        # One clock for typing and previews here and for pacing and retries in the delivery
        # (``delivery.clock``, which a test may set apart to run only retries virtually).
        self.clock: Clock = clock or MonotonicClock()
        self.delivery = Delivery(bus, ledger, self.channels, self.clock)
        self._chats: dict[tuple[str, str], _Chat] = {}
        # (channel, chat, replied-to message) of answers already delivered, oldest first.
        self._finished: OrderedDict[tuple[str, str, str | None], None] = OrderedDict()
        self._pump: asyncio.Task[None] | None = None
        self._preview_breaker = Breaker()  # by (channel, chat)
        # Called once when every channel has failed for good (the gateway exits then).
        self.on_all_failed: Callable[[list[Channel]], None] | None = None
        for channel in channels:
            channel.on_fatal = self._channel_failed
            if channel.streaming:
                bus.streaming.add(channel.name)
            bus.command_syntax[channel.name] = channel.command_syntax
        bus.on_stream(self._on_stream)
        bus.on_owner_chats(self.owner_chats)
        bus.on_fetch_media(self.fetch_media)
        self._background: set[asyncio.Task[None]] = set()
        # Set once every channel's start returned: a turn recovered at start runs before.
        self._started = asyncio.Event()

    @property
    def chats_in_memory(self) -> int:
        """Chats with something under way (to send, show or type); idle ones are not kept."""
        return len(self._chats)

    def _channel_failed(self, channel: Channel) -> None:
        channels = [c for c in self.channels.values() if c.platform]
        if all(c.fatal is not None for c in channels) and self.on_all_failed is not None:
            callback, self.on_all_failed = self.on_all_failed, None
            callback(channels)

    async def start(self) -> None:
        try:
            for channel in self.channels.values():
                try:
                    await channel.start()
                except FatalChannelError as exc:
                    channel.fail(exc)
        finally:
            self._started.set()
        self._pump = asyncio.create_task(self._run(), name="outbound")

    async def stop(self) -> None:
        tasks = [t for t in (self._pump,) if t]
        tasks += [*self._background, *self.delivery.background]
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
            self._route(await self.bus.consume_outbound())

    def _route(self, out: Outbound) -> None:
        """Dispatch by type: an activity and an admin notice are done with here (marked done
        on the queue at once); a message is queued in its chat, done once handed over."""
        match out:
            case TurnActivity():
                self._activity(out)
            case AdminNotice():
                self._background.add(task := asyncio.create_task(self._to_admins(out)))
                task.add_done_callback(self._background.discard)
            case OutboundMessage():
                chat = self._chats.setdefault((out.channel, out.chat_id), _Chat())
                chat.queue.append(out)
                self._wake(chat, out.channel, out.chat_id)
                return
        self.bus.outbound.task_done()

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
                    await self.delivery.deliver(msg, live)
                except Exception:
                    log.exception("delivery crashed session=%s", msg.session_key)
                finally:
                    self.bus.outbound.task_done()
                continue
            channel = self.channels.get(channel_name)
            if channel is None or channel.fatal is not None:
                return
            key, wait = self._next_preview(channel, chat_id, chat)
            if wait is None:
                return
            if wait <= 0:
                wait = await self._show_preview(channel, chat_id, chat, key)
            if wait > 0 and not chat.queue:  # (checked, then cleared with no await between)
                await chat.sleep(self.clock, wait)

    # -- streaming --

    def _on_stream(self, event: StreamEvent) -> None:
        """A stream event from a turn: keep it as its chat's latest; never blocks."""
        channel = self.channels.get(event.channel)
        if channel is None or not channel.streaming or channel.fatal is not None:
            return
        mode = Mode(channel.preview_mode(event.chat_id))
        if mode is Mode.OFF:
            return
        if mode is Mode.DIRECT:
            channel.show_stream(event)
            return
        if (event.channel, event.chat_id, event.reply_to) in self._finished:
            return  # its answer is already delivered: a late event must not reopen it
        chat = self._chats.setdefault((event.channel, event.chat_id), _Chat())
        now = self.clock.now()
        live = chat.lives.get(event.reply_to)
        if live is None:
            ids = self.ledger.preview_ids(event.session_key, event.reply_to)
            live = chat.lives[event.reply_to] = Preview.start(event.reply_to, tuple(ids), now)
            if ids:
                log.info(
                    "stream session=%s continues in %d preview message(s) from before a restart",
                    event.session_key,
                    len(ids),
                )
        after = preview.on_stream(live, event.kind, event.text, mode, now)
        if after is live:
            return
        chat.lives[event.reply_to] = after
        if after.dirty:
            self._wake(chat, event.channel, event.chat_id)

    def _next_preview(
        self, channel: Channel, chat_id: str, chat: _Chat
    ) -> tuple[str | None, float | None]:
        """The answer whose preview to show next and the seconds until it may be (<= 0: now;
        None: no preview to show until the stream brings news)."""
        mode = Mode(channel.preview_mode(chat_id))
        now = self.clock.now()
        # A draft is kept up while the bot works on it, not while its turn waits for an
        # approval or for the model to come back (typing stopped).
        working = chat.typing_shown()
        soonest: tuple[str | None, float | None] = (None, None)
        for key, live in chat.lives.items():
            match preview.decide(live, mode, now, channel.stream_interval, working):
                case Show():
                    return key, 0.0
                case Wait(seconds) if soonest[1] is None or seconds < soonest[1]:
                    soonest = (key, seconds)
        return soonest

    async def _show_preview(
        self, channel: Channel, chat_id: str, chat: _Chat, key: str | None
    ) -> float:
        """Show the latest text of the answer to ``key``, one platform call at a time, each
        within the pacer's spare tokens; returns the seconds to wait before trying again (0:
        done for now)."""
        breaker = (channel.name, chat_id)
        if not self._preview_breaker.allows(breaker, self.delivery.clock.now()):
            # This chat's previews are off for a while: the answer comes whole.
            chat.lives[key] = preview.switched_off(chat.lives[key])
            return 0.0
        mode = Mode(channel.preview_mode(chat_id))
        limits = channel.pace_limits(chat_id)
        pacer = self.delivery.pacer(channel)
        session = f"{channel.name}:{chat_id}"
        text = chat.lives[key].text or ""
        # A long answer ends cut (bot.long_answers): its preview does not grow past that.
        shown = preview.whole_words(text[:LONG_ANSWER_CHARS])
        pieces = channel.preview_pieces(shown) if shown.strip() else [""]
        for i, piece in preview.to_send(chat.lives[key], mode, pieces):
            wait = pacer.take_if_ready(limits, self.delivery.clock.now())
            if wait > 0:
                return wait
            chat.lives[key] = preview.sending(chat.lives[key], i)
            try:
                live = chat.lives[key]
                if mode is Mode.DRAFT:
                    await channel.send_draft(chat_id, live.draft_id, piece)
                elif i < len(live.ids):
                    await channel.edit_chunk(chat_id, live.ids[i], piece, plain=True)
                else:
                    await self._new_preview_message(channel, chat_id, chat, key, piece)
            except RetryAfter as exc:
                now = self.delivery.clock.now()
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
                now = self.clock.now()
                broken = mode is Mode.MESSAGE and i >= len(chat.lives[key].ids)
                if self._preview_breaker.failed(breaker, self.delivery.clock.now()):
                    broken = True
                    log.warning(
                        "previews off session=%s for %.0f s after %d failures in a row (%s); "
                        "answers come whole",
                        session,
                        self._preview_breaker.cool_down,
                        self._preview_breaker.threshold,
                        short_reason(exc),
                    )
                else:
                    log.info(
                        "preview failed session=%s (%s)%s",
                        session,
                        short_reason(exc),
                        "; the answer will come whole" if broken else "",
                    )
                chat.lives[key] = preview.failed(
                    chat.lives[key], broken, now, channel.stream_interval
                )
                return channel.stream_interval
            self._preview_breaker.succeeded(breaker)
            chat.lives[key] = preview.sent(chat.lives[key], mode, i, piece, self.clock.now())
        live = chat.lives[key] = preview.shown(
            chat.lives[key], text, self.clock.now(), channel.stream_interval
        )
        return channel.stream_interval if live.dirty else 0.0

    async def _new_preview_message(
        self, channel: Channel, chat_id: str, chat: _Chat, key: str | None, text: str
    ) -> None:
        """Send one more preview message and record its id in the ledger before going on."""
        msg = OutboundMessage(channel.name, chat_id, text, reply_to=key)
        first = not chat.lives[key].ids
        message_id = await channel.send_preview(msg, text, first=first)
        live = chat.lives[key] = preview.with_message(chat.lives[key], message_id)
        await self.ledger.previewing(msg.session_key, key, list(live.ids))

    # -- admins --

    async def _to_admins(self, notice: AdminNotice) -> None:
        """Queue ``notice`` into every admin's private chat on every running channel."""
        for channel in self.channels.values():
            chats = await self._admin_chats(channel)
            if chats is None:
                continue
            if not chats:
                log.info("no admin chat to tell channel=%s", channel.name)
            for chat_id in chats:
                await self.bus.publish_outbound(OutboundMessage(channel.name, chat_id, notice.text))

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

    async def fetch_media(self, msg: InboundMessage) -> list[Fetched]:
        """The files ``msg`` names, fetched by its own channel (``Channel.fetch_media``) once
        the channels have started; a channel that is not here, or that fails with an error
        of no kind it knows, gives a reason per file, so the turn runs and says so."""
        channel = self.channels.get(msg.channel)
        if channel is None:
            return not_fetched(msg.files, f"no {msg.channel} channel is running here")
        await self._started.wait()
        try:
            return list(await channel.fetch_media(msg))
        except Exception as exc:
            log.exception("fetching files failed session=%s id=%s", msg.session_key, msg.message_id)
            why = f"the {channel.name} channel failed ({type(exc).__name__})"
            return not_fetched(msg.files, why)

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

    # -- activity --

    def _activity(self, signal: TurnActivity) -> None:
        """Working shows typing; waiting (for a person, for the model) stops it, whichever
        turn it was for; done stops it only if it is that turn's, and not before its answer
        goes out (an answer waiting for its turn to be sent still shows typing)."""
        if signal.activity is Activity.WORKING:
            self._start_typing(signal)
            return
        chat = self._chats.get((signal.channel, signal.chat_id))
        if chat is None or chat.typing is None:
            return
        if signal.activity is Activity.DONE and (
            chat.typing_for != signal.reply_to
            or any(m.final and m.reply_to == signal.reply_to for m in chat.queue)
        ):
            return  # another turn's typing; or the answer, queued, stops it as it goes out
        chat.typing.cancel()

    def _start_typing(self, signal: TurnActivity) -> None:
        channel = self.channels.get(signal.channel)
        if channel is None:
            return
        chat = self._chats.setdefault((signal.channel, signal.chat_id), _Chat())
        chat.typing_for = signal.reply_to
        if chat.typing_shown():  # one just stopped is replaced: it is on its way out
            return
        chat.typing = asyncio.create_task(self._typing(channel, signal.chat_id))
        chat.typing.add_done_callback(
            lambda _: self._forget_if_idle(signal.channel, signal.chat_id, chat)
        )

    async def _typing(self, channel: Channel, chat_id: str) -> None:
        # An answer delivered within the delay cancels this first: no indicator, no call.
        await self.clock.sleep(channel.typing_delay)
        started = self.clock.now()
        while self.clock.now() - started < TYPING_MAX_SECONDS:
            try:
                await channel.send_typing(chat_id)
            except Exception as exc:  # typing is cosmetic; never let it matter
                log.debug("typing indicator failed channel=%s: %s", channel.name, exc)
            await self.clock.sleep(TYPING_REFRESH_SECONDS)
