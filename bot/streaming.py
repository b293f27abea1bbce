"""One turn's stream to its chat: the model's text as it is written, and tool calls starting.

The runner tells a ``TurnStream`` what happens; it publishes ``StreamEvent`` values on the bus
(ephemeral: channels show them as drafts, edited previews or terminal output) and remembers
the text so far, which ``/stop`` turns into the final answer.
"""

from __future__ import annotations

from bot.bus import MessageBus, StreamEvent

STOPPED_MARK = "(stopped)"
TOOL_ARGS_SHOWN = 80  # characters of a tool call's arguments in its one-line description


def describe_call(name: str, arguments: str) -> str:
    """``name(arguments)`` on one line, the arguments cut to a glance."""
    args = " ".join(arguments.split())
    if len(args) > TOOL_ARGS_SHOWN:
        args = args[: TOOL_ARGS_SHOWN - 1] + "…"
    return f"{name}({args})"


def stopped_answer(streamed: str) -> str | None:
    """The final answer of a turn stopped after ``streamed`` was shown: that text, marked as
    stopped, so the chat keeps what was read (and a preview never shows more than the answer).
    None when nothing was streamed."""
    text = streamed.rstrip()
    if not text.strip():
        return None
    return f"{text}\n\n{STOPPED_MARK}"


class TurnStream:
    """The stream of one turn (``reply_to``) into one chat."""

    __slots__ = ("bus", "channel", "chat_id", "reply_to", "text")

    def __init__(self, bus: MessageBus, channel: str, chat_id: str, reply_to: str | None) -> None:
        self.bus = bus
        self.channel = channel
        self.chat_id = chat_id
        self.reply_to = reply_to
        self.text = ""  # the model's reply so far (of its latest request in this turn)

    def on_text(self, text: str) -> None:
        self.text = text
        self.bus.publish_stream(
            StreamEvent(self.channel, self.chat_id, self.reply_to, "text", text)
        )

    def on_done(self) -> None:
        event = StreamEvent(self.channel, self.chat_id, self.reply_to, "done", self.text)
        self.bus.publish_stream(event)

    def on_tool(self, name: str, arguments: str) -> None:
        event = StreamEvent(
            self.channel, self.chat_id, self.reply_to, "tool", describe_call(name, arguments)
        )
        self.bus.publish_stream(event)
