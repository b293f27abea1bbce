"""Ledgered delivery: an outbound message sent piece by piece within the platform's rate
limits, under the one retry policy (``channels.retry``).

Final answers go through the delivery ledger (bot/delivery.py) piece by piece: each piece is
marked before it is sent, so a crash or an error at piece k resumes at piece k. Every send
first waits out the platform's rate limits (``channels.pacing``: token buckets per chat, per
group, per bot, as the channel names them); a 429 pauses that chat for the time asked, and
what waited behind it then goes at the steady rate, without a burst.

Every exception a send raises takes the same path: flood waits are honoured, markup refusals
retried as plain text, over-long pieces split smaller, permanent refusals end the answer (the
user is told, the ledger keeps it), network trouble is retried with backoff for at most a
minute of the chat's time (then the answer, or an approval question, comes again from that
piece behind the chat's other messages; an answer waits in the ledger meanwhile), and an
exception outside our vocabulary is tried a few times, then ends the answer like a permanent
refusal. A final answer whose preview messages exist edits them into the answer (see
bot/delivery.py), so the chat never holds two copies.

All time is read from, and all waiting done on, the ``Clock`` given (``channels.retry``).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Protocol

from bot import failpoints
from bot.bus import MessageBus, OutboundMessage
from bot.long_answers import kept_where
from channels.access import question_view
from channels.base import Channel
from channels.errors import (
    AcceptedUnreadable,
    FatalChannelError,
    FormattingRejected,
    PermanentError,
    RetryAfter,
    TooLong,
    TransientError,
)
from channels.pacing import Limit, Pacer
from channels.preview import Preview
from channels.retry import Clock, Retries, RetryPolicy

log = logging.getLogger(__name__)

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


class Delivery:
    """Sends outbound messages for the channel manager, one chat's at a time from that chat's
    worker (so a wait in one chat never holds another's, except through a shared bucket)."""

    def __init__(
        self, bus: MessageBus, ledger: Ledger, channels: dict[str, Channel], clock: Clock
    ) -> None:
        self.bus = bus
        self.ledger = ledger
        self.channels = channels
        self._clock = clock
        self.retry_policy = RetryPolicy()
        # An answer sent again (by id) -> when it first failed, its pieces, the piece it reached.
        self._again: dict[int, tuple[float, list[str], int]] = {}
        self._pacers: dict[str, Pacer] = {}  # per channel name: its rate-limit buckets
        self.background: set[asyncio.Task[None]] = set()

    @property
    def clock(self) -> Clock:
        """The clock of pacing and retries."""
        return self._clock

    @clock.setter
    def clock(self, clock: Clock) -> None:
        # The buckets hold the old clock's times: they start over on the new one.
        self._clock = clock
        self._pacers.clear()

    async def deliver(self, msg: OutboundMessage, live: Preview | None = None) -> None:
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
                    await self.send_chunk(channel, msg, pieces[index], edit=edit, first=index == 0)
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
            reason = short_reason(exc)
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

        self.background.add(task := asyncio.create_task(later()))
        task.add_done_callback(self.background.discard)

    async def _send_file(self, channel: Channel, msg: OutboundMessage, path: str) -> None:
        """Upload ``path`` to the chat, or, where the channel cannot (or the file is larger
        than it takes), say where it is kept."""
        if channel.sends_files and _fits(path, channel.max_file_bytes):
            try:
                await self.with_retries(channel, msg, lambda _plain: channel.send_file(msg, path))
                return
            except PermanentError as exc:
                # E.g. a Slack app installed without files:write: the text already went out,
                # so the chat is told where the rest is rather than that nothing arrived.
                log.warning(
                    "file not sent session=%s: %s; the chat is told where it is",
                    msg.session_key,
                    short_reason(exc),
                )
        note = FILE_NOTE.format(where=kept_where(path))
        for piece in channel.render(note):
            await self.send_chunk(channel, msg, piece)

    async def _delete_preview(
        self, channel: Channel, msg: OutboundMessage, message_id: str
    ) -> None:
        """Best effort, one try: a preview the answer did not need (it came out shorter)."""
        await self.pace(channel, channel.pace_limits(msg.chat_id))
        try:
            await channel.delete_message(msg.chat_id, message_id)
        except Exception as exc:
            log.warning(
                "could not delete a preview message session=%s: %s",
                msg.session_key,
                short_reason(exc),
            )

    async def _notify_undeliverable(
        self, channel: Channel, msg: OutboundMessage, reason: str
    ) -> None:
        """Best effort: tell the user, in a short plain message, that the answer is missing."""
        notice = OutboundMessage(msg.channel, msg.chat_id, NOTICE.format(reason=reason))
        try:
            for piece in channel.render(notice.text):
                await self.send_chunk(channel, notice, piece, NOTICE_GIVE_UP_SECONDS)
        except Exception as exc:
            log.error("could not tell session=%s either: %s", msg.session_key, short_reason(exc))

    def pacer(self, channel: Channel) -> Pacer:
        pacer = self._pacers.get(channel.name)
        if pacer is None:
            pacer = self._pacers[channel.name] = Pacer()
        return pacer

    async def pace(self, channel: Channel, limits: Sequence[Limit]) -> None:
        """Wait until a send within every bucket of ``limits`` may go, one bucket after the
        other: the chat's own first, so a chat waiting for itself holds no shared token."""
        pacer = self.pacer(channel)
        for limit in limits:
            wait = pacer.reserve(limit, self.clock.now())
            if wait > 0:
                await self.clock.sleep(wait)

    async def send_chunk(
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

        await self.with_retries(channel, msg, send, give_up_after)

    async def with_retries(
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
            await self.pace(channel, limits)
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
                now = self.clock.now()
                wait = retries.wait_after(exc, now)
                self.pacer(channel).hold(limits, now + wait, now)
                log.warning(
                    "rate limited session=%s: waiting %.1f s as the platform asked",
                    msg.session_key,
                    wait,
                )
            except AcceptedUnreadable as exc:
                log.warning("counted as sent session=%s: %s", msg.session_key, exc)
                return
            except (PermanentError, FatalChannelError):
                raise
            except Exception as exc:  # TransientError, and whatever else an SDK raises
                wait = retries.wait_after(exc, self.clock.now())
                log.warning(
                    "send failed session=%s (%s), retry in %.1f s",
                    msg.session_key,
                    exc if isinstance(exc, TransientError) else short_reason(exc),
                    wait,
                )
            await self.clock.sleep(wait)


def _shows(channel: Channel, live: Preview | None, index: int, message_id: str, piece: str) -> bool:
    """Whether preview message ``message_id``, the ``index``th of ``live``, already shows
    ``piece`` of the final answer (what it was last given is known only in this process)."""
    return (
        live is not None
        and index < len(live.shown)
        and channel.preview_shows(message_id, live.shown[index], piece)
    )


def short_reason(exc: BaseException) -> str:
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
