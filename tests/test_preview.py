"""The preview of an answer being written, as a pure function: (state, now, news) -> state and
(state, now) -> show / wait / nothing. No asyncio, no channel, no clock but the numbers here."""

from __future__ import annotations

from dataclasses import replace

import pytest

from channels import preview
from channels.preview import (
    DRAFT_KEPT_SECONDS,
    DRAFT_REFRESH_SECONDS,
    NOTHING,
    PREVIEW_MIN_CHARS,
    SHOW,
    Mode,
    Preview,
    Wait,
)

INTERVAL = 1.0
LONG = "Here is the plan for today, step by step: "  # more than PREVIEW_MIN_CHARS, whole words
assert len(LONG.strip()) > PREVIEW_MIN_CHARS


def _p(**fields: object) -> Preview:
    return replace(Preview.start("m1", (), now=0.0), **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("state", "mode", "now", "keep_draft", "expected"),
    [
        # Nothing new: nothing to do.
        (_p(), Mode.MESSAGE, 5.0, False, NOTHING),
        # New text, the interval passed: show it.
        (_p(text=LONG, dirty=True, first_at=0.0), Mode.MESSAGE, 5.0, False, SHOW),
        # New text within the interval since the last update: wait for the rest of it.
        (_p(text=LONG, dirty=True, next_at=5.5, ids=("7",)), Mode.MESSAGE, 5.0, False, Wait(0.5)),
        # A first preview message waits for PREVIEW_MIN_CHARS or one interval after the first text.
        (_p(text="Hi there ", dirty=True, first_at=4.8), Mode.MESSAGE, 5.0, False, Wait(0.8)),
        (_p(text="Hi there ", dirty=True, first_at=4.0), Mode.MESSAGE, 5.0, False, SHOW),
        # ...and is never sent for half a word or blanks.
        (_p(text="Hel", dirty=True, first_at=0.0), Mode.MESSAGE, 5.0, False, NOTHING),
        (_p(text="  ", dirty=True), Mode.MESSAGE, 5.0, False, NOTHING),
        # Once messages exist, a short text is shown as any other (no minimum).
        (_p(text="Hi ", dirty=True, ids=("7",), first_at=4.9), Mode.MESSAGE, 5.0, False, SHOW),
        # A draft has no minimum: even an empty one ("Thinking...") goes.
        (_p(text="", dirty=True), Mode.DRAFT, 5.0, False, SHOW),
        # Done, or broken: only the final answer from now on.
        (_p(text=LONG, dirty=True, done=True), Mode.MESSAGE, 5.0, False, NOTHING),
        (_p(text=LONG, dirty=True, broken=True), Mode.DRAFT, 5.0, True, NOTHING),
        # A draft unchanged is sent again while the turn works, every DRAFT_REFRESH_SECONDS...
        (_p(text=LONG, drafted_at=5.0), Mode.DRAFT, 5.0 + DRAFT_REFRESH_SECONDS, True, SHOW),
        (_p(text=LONG, drafted_at=5.0), Mode.DRAFT, 10.0, True, Wait(DRAFT_REFRESH_SECONDS - 5)),
        # ...not while it waits (for a person, the model), not in message mode, not forever.
        (_p(text=LONG, drafted_at=5.0), Mode.DRAFT, 100.0, False, NOTHING),
        (_p(text=LONG, drafted_at=5.0), Mode.MESSAGE, 100.0, True, NOTHING),
        (_p(text=LONG, drafted_at=5.0), Mode.DRAFT, DRAFT_KEPT_SECONDS, True, NOTHING),
        # A draft never sent is not "refreshed" (the first send is the stream's news).
        (_p(text=LONG), Mode.DRAFT, 100.0, True, NOTHING),
    ],
)
def test_decide(state, mode, now, keep_draft, expected):
    decision = preview.decide(state, mode, now, INTERVAL, keep_draft)
    if isinstance(expected, Wait):
        assert isinstance(decision, Wait) and decision.seconds == pytest.approx(expected.seconds)
    else:
        assert decision == expected


@pytest.mark.parametrize(
    ("state", "kind", "text", "mode", "expected"),
    [
        # The latest text replaces the one before (coalesced); its first words start the clock.
        (_p(), "text", "Hello ", Mode.MESSAGE, _p(text="Hello ", dirty=True, first_at=3.0)),
        (
            _p(text="Hello ", first_at=1.0),
            "text",
            "Hello you",
            Mode.MESSAGE,
            _p(text="Hello you", dirty=True, first_at=1.0),
        ),
        # Blank text does not start the minimum's clock.
        (_p(), "text", " ", Mode.MESSAGE, _p(text=" ", dirty=True)),
        # The same text again is no news.
        (_p(text="Hello "), "text", "Hello ", Mode.MESSAGE, _p(text="Hello ")),
        # A tool starting: a draft shows "Thinking..." (empty); a message keeps its text.
        (_p(text="Hello "), "tool", "exec", Mode.DRAFT, _p(text="", dirty=True)),
        (_p(text="Hello "), "tool", "exec", Mode.MESSAGE, _p(text="Hello ")),
        # Done: the final answer follows; nothing pending is shown, and nothing reopens it.
        (_p(text="Hello ", dirty=True), "done", "", Mode.MESSAGE, _p(text="Hello ", done=True)),
        (_p(done=True), "text", "late", Mode.MESSAGE, _p(done=True)),
    ],
)
def test_on_stream(state, kind, text, mode, expected):
    assert preview.on_stream(state, kind, text, mode, now=3.0) == expected


def test_no_news_is_the_same_state():
    """The manager wakes the chat's worker only on a new state."""
    state = _p(text="Hello ")
    assert preview.on_stream(state, "text", "Hello ", Mode.MESSAGE, 3.0) is state
    assert preview.on_stream(state, "tool", "exec", Mode.MESSAGE, 3.0) is state


@pytest.mark.parametrize(
    ("shown", "mode", "pieces", "expected"),
    [
        ((), Mode.MESSAGE, ["a", "b"], [(0, "a"), (1, "b")]),
        # The pieces already shown are left as they are, up to the first that differs.
        (("a", "b"), Mode.MESSAGE, ["a", "b", "c"], [(2, "c")]),
        (("a", "x"), Mode.MESSAGE, ["a", "b", "c"], [(1, "b"), (2, "c")]),
        (("x", "b"), Mode.MESSAGE, ["a", "b"], [(0, "a"), (1, "b")]),
        # Blank pieces are no message.
        ((), Mode.MESSAGE, [""], []),
        # A draft shows the piece being written, even empty.
        ((), Mode.DRAFT, ["a", "b"], [(0, "b")]),
        (("b",), Mode.DRAFT, [""], [(0, "")]),
    ],
)
def test_to_send(shown, mode, pieces, expected):
    assert preview.to_send(_p(shown=shown), mode, pieces) == expected


def test_a_show_leaves_the_state_clean_unless_newer_text_came_meanwhile():
    state = _p(text="one ", dirty=True)
    assert preview.shown(state, "one ", now=2.0, interval=INTERVAL) == _p(text="one ", next_at=3.0)
    newer = replace(state, text="one two ")
    assert preview.shown(newer, "one ", 2.0, INTERVAL).dirty


def test_sending_forgets_what_the_piece_and_the_ones_after_showed():
    state = _p(shown=("a", "b", "c"))
    assert preview.sending(state, 1).shown == ("a",)
    assert preview.sent(preview.sending(state, 1), Mode.MESSAGE, 1, "B", 4.0).shown == ("a", "B")
    assert preview.sent(state, Mode.DRAFT, 0, "B", 4.0) == replace(state, drafted_at=4.0)


def test_a_failure_waits_an_interval_and_may_end_the_previews():
    state = _p(text="x ", dirty=True)
    after = preview.failed(state, broken=False, now=2.0, interval=INTERVAL)
    assert preview.decide(after, Mode.MESSAGE, 2.5, INTERVAL) == Wait(0.5)
    broken = preview.failed(state, broken=True, now=2.0, interval=INTERVAL)
    assert preview.decide(broken, Mode.MESSAGE, 10.0, INTERVAL) == NOTHING
    assert preview.switched_off(state).broken


def test_each_answer_has_its_own_non_zero_draft_id():
    ids = {Preview.start(reply_to, (), 0.0).draft_id for reply_to in ("m1", "m2", None, "")}
    assert len(ids) == 2 + 1 and 0 not in ids  # None and "" are the same answer-less draft


@pytest.mark.parametrize(
    ("text", "expected"),
    [("", ""), ("one two", "one "), ("one two ", "one two "), ("word", ""), ("a\tb", "a\t")],
)
def test_whole_words(text, expected):
    assert preview.whole_words(text) == expected
