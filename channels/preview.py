"""The preview of an answer being written, pure: a frozen state, the stream's news and the
clock's time in, a new state and a decision out (show now / wait so long / nothing to do).

The channel manager keeps one ``Preview`` per answer being written in a chat and asks
``decide`` what to do next; it alone makes the platform calls (``channels.manager``). The
rules, in one place:

* the latest text wins: text that was never shown is simply replaced (coalesced);
* a chat's preview is updated at most once per ``interval`` (the channel's stream interval);
* a preview *message* ("message" mode) waits for ``PREVIEW_MIN_CHARS`` of text or one
  interval, and never shows half a word (``whole_words``);
* a *draft* ("draft" mode, Telegram) shows only the piece being written, shows "Thinking..."
  (an empty draft) while a tool runs, and is sent again every ``DRAFT_REFRESH_SECONDS`` while
  the turn works (the platform drops a draft after about 30 s), for at most
  ``DRAFT_KEPT_SECONDS``;
* once the model is done, or a preview failed for good (``broken``), only the final answer
  is sent.
"""

from __future__ import annotations

import enum
import zlib
from dataclasses import dataclass, replace
from typing import Literal

# Telegram shows a draft for about 30 s: one that has not changed (a long tool run) is sent
# again before then, for as long as a typing indicator would be shown.
DRAFT_REFRESH_SECONDS = 20.0
DRAFT_KEPT_SECONDS = 600.0
PREVIEW_MIN_CHARS = 16  # a preview message waits for this much text (or one interval)


class Mode(enum.StrEnum):
    """How a chat shows an answer being written (``Channel.preview_mode``)."""

    OFF = "off"  # not at all: the answer comes whole
    DIRECT = "direct"  # the channel shows each stream event itself (the terminal)
    MESSAGE = "message"  # a message sent once there is text, then edited
    DRAFT = "draft"  # a draft the platform shows above the input (Telegram's private chats)


@dataclass(frozen=True, slots=True)
class Preview:
    """The preview of one answer in one chat. Times are the manager's clock's seconds."""

    started: float  # when the first stream event came
    draft_id: int  # "draft" mode: one draft per answer; Telegram wants a non-zero id
    text: str | None = None  # the latest text (coalesced: older ones never shown)
    dirty: bool = False  # the text changed since it was last shown
    ids: tuple[str, ...] = ()  # "message" mode: platform ids of the preview messages
    shown: tuple[str, ...] = ()  # what each of them shows (known only in this process)
    first_at: float | None = None  # when the first text worth showing came
    next_at: float = 0.0  # no update before this
    drafted_at: float | None = None  # when its draft was last sent
    broken: bool = False  # a preview send failed: only the final answer from now on
    done: bool = False  # the model finished: the final answer replaces the preview

    @classmethod
    def start(cls, reply_to: str | None, ids: tuple[str, ...], now: float) -> Preview:
        """A new preview of the answer to ``reply_to``; ``ids``: its preview messages from
        before a restart (the delivery ledger's record)."""
        draft_id = (zlib.crc32((reply_to or "").encode()) & 0x7FFFFFFF) or 1
        return cls(started=now, draft_id=draft_id, ids=ids)


@dataclass(frozen=True, slots=True)
class Show:
    """Show the preview's latest text now."""


@dataclass(frozen=True, slots=True)
class Wait:
    """Nothing before ``seconds`` from now (news may come sooner)."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Nothing:
    """Nothing to show until the stream brings news."""


SHOW, NOTHING = Show(), Nothing()
Decision = Show | Wait | Nothing


def on_stream(
    p: Preview, kind: Literal["text", "tool", "done"], text: str, mode: Mode, now: float
) -> Preview:
    """``p`` after a stream event (``bot.bus.StreamEvent``); ``p`` itself when nothing
    changed (the caller wakes the chat's worker only when something did)."""
    if p.done:
        return p
    if kind == "done":  # the answer follows at once: no preview spends its send
        return replace(p, done=True, dirty=False)
    if kind == "tool":
        if mode is not Mode.DRAFT:
            return p  # a preview message keeps its text while tools run
        text = ""  # an empty draft: the app shows "Thinking..."
    if text == p.text:
        return p
    first_at = now if p.first_at is None and text.strip() else p.first_at
    return replace(p, text=text, dirty=True, first_at=first_at)


def decide(
    p: Preview, mode: Mode, now: float, interval: float, keep_draft: bool = False
) -> Decision:
    """What to do with ``p`` at ``now``. ``interval``: the chat's least time between two
    updates; ``keep_draft``: the turn is working (its draft is kept up, not while it waits
    for a person or the model)."""
    if p.broken or p.done:
        return NOTHING
    if not p.dirty:
        if (
            keep_draft
            and mode is Mode.DRAFT
            and p.drafted_at is not None
            and now - p.started < DRAFT_KEPT_SECONDS
        ):
            due = p.drafted_at + DRAFT_REFRESH_SECONDS - now
            return SHOW if due <= 0 else Wait(due)
        return NOTHING
    wait = p.next_at - now
    if mode is Mode.MESSAGE and not p.ids:
        text = whole_words(p.text or "").strip()
        if not text:
            return NOTHING  # nothing worth a message yet
        if len(text) < PREVIEW_MIN_CHARS and p.first_at is not None:
            wait = max(wait, p.first_at + interval - now)
    return SHOW if wait <= 0 else Wait(wait)


def to_send(p: Preview, mode: Mode, pieces: list[str]) -> list[tuple[int, str]]:
    """Which of ``pieces`` (the preview's text cut as the channel cuts it) to send, by
    index: a draft shows the last piece; preview messages skip the ones already showing
    their piece, up to the first that differs."""
    if mode is Mode.DRAFT:
        return [(0, pieces[-1])] if pieces else []
    pieces = [piece for piece in pieces if piece.strip()]
    same = 0
    while same < min(len(pieces), len(p.shown)) and p.shown[same] == pieces[same]:
        same += 1
    return list(enumerate(pieces))[same:]


def sending(p: Preview, index: int) -> Preview:
    """Piece ``index`` and the ones after it are unknown until the platform answers (a
    failed edit may still land)."""
    return replace(p, shown=p.shown[:index])


def sent(p: Preview, mode: Mode, index: int, piece: str, now: float) -> Preview:
    """Piece ``index`` shows ``piece`` now."""
    if mode is Mode.DRAFT:
        return replace(p, drafted_at=now)
    return replace(p, shown=(*p.shown[:index], piece))


def with_message(p: Preview, message_id: str) -> Preview:
    """One more preview message, sent."""
    return replace(p, ids=(*p.ids, message_id))


def shown(p: Preview, text: str, now: float, interval: float) -> Preview:
    """Everything of ``text`` is shown: clean unless newer text came meanwhile."""
    return replace(p, dirty=p.dirty and p.text != text, next_at=now + interval)


def failed(p: Preview, broken: bool, now: float, interval: float) -> Preview:
    """A preview call failed (it is never retried); ``broken``: no more previews of this
    answer (a failed *send* may have landed without us learning its id)."""
    return replace(p, broken=broken, next_at=now + interval)


def switched_off(p: Preview) -> Preview:
    """Previews are off in this chat for a while: the answer comes whole."""
    return replace(p, broken=True)


def whole_words(text: str) -> str:
    """``text`` up to its last whitespace: a preview never shows half a word. Besides looking
    calmer, a secret the answer quotes (a token, a key) then shows whole or not at all, so the
    log's secret filter, which knows whole secrets, also catches it in a preview's payload."""
    if not text or text[-1].isspace():
        return text
    cut = max(text.rfind(" "), text.rfind("\n"), text.rfind("\t"))
    return text[: cut + 1] if cut >= 0 else ""
