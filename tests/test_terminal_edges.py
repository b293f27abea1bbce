"""The terminal's streamed answer against what is stored: cleaning cost per delta, and text
the runner strips or the stop mark ends (found by a red-team pass)."""

from __future__ import annotations

import io

import pytest

from bot.bus import MessageBus, OutboundMessage, StreamEvent
from bot.streaming import stopped_answer
from channels.terminal_channel import channel as terminal
from channels.terminal_channel.channel import TerminalChannel


def _channel(out: io.StringIO, markdown: bool) -> TerminalChannel:
    return TerminalChannel(
        MessageBus(),
        "c",
        out=out,
        err=out,
        markdown=markdown,
        ansi=True,
        clean=True,
        columns=lambda: 80,
    )


@pytest.mark.parametrize("markdown", [False, True])
def test_cleaning_costs_each_delta_its_own_size(monkeypatch, markdown):
    """A 1-char delta must not re-clean the whole answer: 200 KB in 1-char deltas took
    ~60 s of CPU (quadratic) on a terminal."""
    cleaned = [0]
    real = terminal.strip_controls

    def counting(text: str) -> str:
        cleaned[0] += len(text)
        return real(text)

    monkeypatch.setattr(terminal, "strip_controls", counting)
    ch = _channel(io.StringIO(), markdown)
    answer = ("word " * 15 + "**bold**\n") * 50  # 4,400 characters
    for end in range(1, len(answer) + 1):
        ch.show_stream(StreamEvent("cli", "c", "r", "text", answer[:end]))
    assert cleaned[0] <= 4 * len(answer), cleaned[0]


@pytest.mark.parametrize("markdown", [False, True])
@pytest.mark.parametrize("streamed", ["Hello world  ", "def f():\n    ", "Hello\n\n\n"])
async def test_stop_after_trailing_whitespace_does_not_print_the_text_twice(markdown, streamed):
    out = io.StringIO()
    ch = _channel(out, markdown)
    ch.show_stream(StreamEvent("cli", "c", "r", "text", streamed))
    final = stopped_answer(streamed)
    assert final is not None
    msg = OutboundMessage(
        "cli", "c", final, reply_to="r", final=True, metadata={"outcome": "stopped"}
    )
    await ch.send_chunk(msg, final)
    from tests.helpers.terminal import screen_after

    # What stays on screen (rendered lines are redrawn in place): the text once, then the mark.
    screen = "\n".join(screen_after(out.getvalue(), 80))
    assert screen.count(streamed.split()[0]) == 1, screen
    assert screen.count("(stopped)") == 1, screen


@pytest.mark.parametrize("markdown", [False, True])
@pytest.mark.parametrize("streamed", ["Hello world.\n", "\n\nHello world.", " Hello world."])
async def test_an_answer_the_runner_strips_is_shown_once(markdown, streamed):
    """bot/runner.py strips the model's text for the final answer; what was streamed keeps
    its leading/trailing whitespace. The terminal must not print the answer a second time."""
    out = io.StringIO()
    ch = _channel(out, markdown)
    for end in range(1, len(streamed) + 1):
        ch.show_stream(StreamEvent("cli", "c", "r", "text", streamed[:end]))
    final = streamed.strip()
    await ch.send_chunk(OutboundMessage("cli", "c", final, reply_to="r", final=True), final)
    # What stays on screen: rendered output is redrawn in place, so count after the last
    # erase of each line (pyte would be exact; plain mode has no erase at all).
    from tests.helpers.terminal import screen_after

    shown = [line for line in screen_after(out.getvalue(), 80) if line]
    assert shown == ["Hello world."], shown
