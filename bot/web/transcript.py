"""A conversation of the panel's chat as HTML: what its session holds (the messages, the turn
under way in its checkpoint, the question it waits on), the answer being written and the
channel's recent notices.

The model writes most of what is shown here, so all of it is hostile: a person's words and
tool output are escaped text; the model's answers go through ``markdown_to_html``, which
escapes everything and then writes a small fixed set of tags (bold, italics, code, quotes,
http(s) links). Nothing the model writes reaches the page as HTML of its own.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from bot.approvals import OpenQuestion, choices
from bot.bus import no_surrogates
from bot.context import said_by_person
from bot.gate.question import visible
from bot.runner import CLOSING_NOTES, NO_ANSWER_NOTE
from bot.session.reading import content_text
from bot.streaming import describe_call
from bot.web.render import Html, join, tag
from bot.web.views import post_button
from channels.formatting import markdown_to_html
from channels.web_channel.channel import Note, Writing
from channels.web_channel.spec import NAME as CHANNEL

SHOWN_MESSAGES = 200  # the newest; a longer conversation says how many are left out
SHOWN_TOOL_CHARS = 4000  # of a call's arguments or result, in its folded line
MEMOBOT_NOTES = frozenset({NO_ANSWER_NOTE, *CLOSING_NOTES.values()})

Message = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Conversation:
    """One ``web:<name>`` session as the page shows it."""

    name: str
    messages: Sequence[Message]  # the session's newest, oldest first
    pending: Sequence[Message] = ()  # accepted turns not yet answered (their entries)
    checkpoint: Message | None = None  # the running turn's work so far
    question: OpenQuestion | None = None
    writing: Writing | None = None
    notes: Sequence[Note] = ()
    left_out: int = 0  # older messages not in ``messages``

    @property
    def working(self) -> bool:
        """A turn is queued or running, and not waiting for the owner's answer."""
        return bool(self.pending) and self.question is None


def _cut(text: str) -> str:
    if len(text) <= SHOWN_TOOL_CHARS:
        return text
    return f"{text[:SHOWN_TOOL_CHARS]}\n… {len(text) - SHOWN_TOOL_CHARS:,} more characters"


def _pretty(arguments: str) -> str:
    try:
        shown = json.dumps(json.loads(arguments), ensure_ascii=False, indent=2)
    except (ValueError, RecursionError):
        return arguments
    # A "\udc00" the model wrote is a lone surrogate once decoded, which no page can hold
    # (the conversation's page failed with a 500 for good).
    return no_surrogates(shown)


def you(text: str, note: str = "") -> Html:
    parts = [tag("p", "You", class_="who"), tag("div", text, class_="text plain")]
    if note:
        parts.append(tag("p", note, class_="muted"))
    return tag("article", join(parts), class_="msg you")


def answer(text: str) -> Html:
    if text.strip() in MEMOBOT_NOTES:  # memobot's own words in the history, not the model's
        body = tag("div", text, class_="text plain muted")
    else:
        body = tag("div", Html(markdown_to_html(text)), class_="text md")
    return tag("article", join([tag("p", "memobot", class_="who"), body]), class_="msg bot")


def tool_call(call: Message, result: Message | None) -> Html:
    function = call.get("function") or {}
    name, arguments = str(function.get("name", "")), str(function.get("arguments", ""))
    shown = [
        tag("summary", "↳ " + describe_call(name, arguments)),
        tag("p", "Arguments", class_="muted"),
        tag("pre", _cut(_pretty(arguments))),
    ]
    if result is None:
        shown.append(tag("p", "No result yet.", class_="muted"))
    else:
        content = _cut(content_text(result.get("content")))
        shown += [tag("p", "Result", class_="muted"), tag("pre", content)]
    return tag("details", join(shown), class_="tool")


def messages_html(messages: Sequence[Message]) -> list[Html]:
    """The messages in order; each tool call one folded line holding its result."""
    results = {m.get("tool_call_id"): m for m in messages if m.get("role") == "tool"}
    out: list[Html] = []
    for m in messages:
        role = m.get("role")
        if role == "user":
            out.append(you(said_by_person(content_text(m.get("content")))))
        elif role == "assistant":
            text = content_text(m.get("content"))
            if text.strip():
                out.append(answer(text))
            for call in m.get("tool_calls") or ():
                out.append(tool_call(call, results.get(call.get("id"))))
    return out


def question_html(name: str, open_question: OpenQuestion, csrf: str) -> Html:
    """The question with one button per answer, each a form that answers it as a platform's
    button press would."""
    record, view = open_question.record, open_question.view
    left = max(0.0, float(record.get("deadline", 0)) - time.time())
    buttons = join(
        post_button(
            f"/chat/{name}/answer", label, csrf, choice == "once", id=view.id, choice=choice
        )
        for choice, label in choices(open_question.question).items()
    )
    parts = [
        tag("p", view.intro),
        tag("pre", visible(view.subject).shown),
        tag("p", f"No answer within {left / 60:.0f} min means no.", class_="muted"),
        tag("div", buttons, class_="answers"),
    ]
    return tag("section", join(parts), class_="question", aria_label="Approval needed")


def _live(conversation: Conversation, shown_turn: Sequence[Message]) -> Html:
    """The answer being written: filled by the page's script as it streams, and shown here
    when a page is loaded meanwhile (unless the turn's checkpoint holds that text already)."""
    writing = conversation.writing
    text = writing.text if writing is not None and conversation.pending else ""
    last = next((m for m in reversed(shown_turn) if m.get("role") == "assistant"), None)
    if last is not None and content_text(last.get("content")).strip() == text.strip():
        text = ""
    parts = [
        tag("p", "memobot, writing…", class_="who"),
        tag("div", text, class_="text plain", id="live-text"),
        tag("ul", "", class_="live-tools", id="live-tools"),
    ]
    return tag("article", join(parts), class_="msg bot writing", id="live", hidden=not text)


WORKING, WAITING = "memobot is answering… ", "memobot waits for your answer to the question above."


def state_html(conversation: Conversation) -> Html:
    """The turn's state line, as the session has it: part of the transcript, so every read of
    it sets the line right (a command's reply or a scheduled job's answer ends no streamed
    turn, and a line set by the stream alone stayed at "answering")."""
    state: object = ""
    if conversation.working:
        reload = tag("a", "Reload", href=f"/chat/{conversation.name}")
        state = join([WORKING, reload])
    elif conversation.question is not None:
        state = WAITING
    return tag("p", state, id="state", class_="state", role="status")


def _clock(at: float) -> str:
    return time.strftime("%H:%M", time.localtime(at))


def transcript_html(conversation: Conversation, csrf: str | None) -> Html:
    """The transcript; ``csrf`` None: read only (no gateway runs, nothing can be answered)."""
    items: list[Html] = []
    if conversation.left_out:
        # The whole conversation, paged, is the Chats screen's (its address takes the key).
        whole = f"/chats/view?{urlencode({'key': f'{CHANNEL}:{conversation.name}'})}"
        earlier = [
            f"{conversation.left_out:,} earlier messages are not shown: ",
            tag("a", "the whole conversation", href=whole),
            ".",
        ]
        items.append(tag("p", join(earlier), class_="muted"))
    items += messages_html(conversation.messages)
    checkpoint = conversation.checkpoint or {}
    turn: Sequence[Message] = ()
    for i, entry in enumerate(conversation.pending):
        if entry.get("id") == checkpoint.get("message_id"):
            turn = list(checkpoint.get("messages") or ())
            items += messages_html(turn)
        else:  # the first is being answered (a chat's turns run in order)
            items.append(you(str(entry.get("text", "")), "waiting for its turn" if i else ""))
    items.append(_live(conversation, turn))
    if conversation.question is not None and csrf is not None:
        items.append(question_html(conversation.name, conversation.question, csrf))
    if csrf is not None:
        items.append(state_html(conversation))
    if conversation.notes:
        notes = join(
            tag("li", join([tag("time", _clock(n.at)), " ", n.text])) for n in conversation.notes
        )
        items.append(tag("section", join([tag("h2", "Notices"), tag("ul", notes)]), class_="notes"))
    if not conversation.messages and not conversation.pending:
        items.insert(0, tag("p", "Nothing said yet.", class_="muted"))
    return join(items)
