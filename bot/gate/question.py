"""How an approval question shows what would run: whole, quoted, every character visible.

The model writes the command or the arguments, so it writes most of the question. Nothing it
writes may read as memobot's own words, push what runs out of view, or hide behind a cut:

* **Visible.** Characters that show as nothing or as something else (controls, zero-width and
  bidi marks, odd spaces, lone surrogates, variation selectors, a pile of more than
  ``COMBINING_RUN`` combining marks that would draw over the lines around) are shown by their
  code point, ``⟨U+202E⟩``; a run of more than ``SPACE_RUN`` spaces or tabs is shown as its count
  (``⟨5,000 spaces⟩``), and so is a run of more than ``BLANK_LINES`` blank lines. The marker
  brackets themselves are shown by code point when the text has them, so a marker is always
  memobot's.
* **Quoted.** The text sits in a fenced block whose fence is longer than any backtick run in
  it (CommonMark), so no line of it can close the block; the channels' renderers keep that
  promise in their dialects (Telegram: escaped ``<pre>``; Discord and Slack, whose code blocks
  end at any three backticks: a zero-width space inside every such run, see
  ``channels.formatting``).
* **Whole, or visibly cut.** A question fits one message of its platform, buttons included
  (:func:`fit_question`): the text is cut only as much as it must, the cut says how many
  characters are not shown, and a "Show all" button sends the whole text (:func:`full_text`).

Pure functions over strings; the channels import them (they render), the core builds the
question's parts (:mod:`bot.gate.approval`).
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass

SPACE_RUN = 16  # a longer run of spaces/tabs is shown as its count (indentation stays)
BLANK_LINES = 2  # more blank lines in a row are shown as their count
COMBINING_RUN = 3  # more combining marks on one character are shown by code point
OPEN, CLOSE = "\u27e8", "\u27e9"  # ⟨ ⟩
SHOW_ALL = "Show all"
GUTTER = "  \u2502 "  # "  │ ": starts every line of the text in plain renderings
_RUNS = re.compile(rf"\n(?:[ \t]*\n){{{BLANK_LINES + 1},}}|[ \t]{{{SPACE_RUN + 1},}}")
_BACKTICKS = re.compile(r"`+")
# Printable to Python but shown as nothing, or as a blank, by most fonts and clients.
_LOOK_INVISIBLE = frozenset("\u115f\u1160\u3164\uffa0\u2800" + OPEN + CLOSE)


def _marked(ch: str) -> bool:
    """Whether ``ch`` is shown by its code point (see the module's docstring)."""
    if ch in "\n\t ":
        return False
    code = ord(ch)
    return (
        not ch.isprintable()  # C* categories, Zl, Zp and every Zs but the plain space
        or ch in _LOOK_INVISIBLE
        or 0xFE00 <= code <= 0xFE0F
        or 0xE0100 <= code <= 0xE01EF
    )


def _code_point(ch: str) -> str:
    return f"{OPEN}U+{ord(ch):04X}{CLOSE}"


# Where a character that is shown by its code point may be: anything not printable ASCII.
_MAYBE_MARKED = re.compile(r"[^\x20-\x7e\n\t]+")
# The printable characters _marked marks (_LOOK_INVISIBLE and the variation selectors).
_PRINTABLE_MARKED = re.compile(
    "[" + "".join(sorted(_LOOK_INVISIBLE)) + "\ufe00-\ufe0f\U000e0100-\U000e01ef]"
)


def marked_invisible(text: str) -> str:
    """``text`` with each character :func:`visible` shows by its code point so shown (bidi
    and zero-width marks, controls), and nothing else changed: for text shown whole and
    as it is otherwise (a transcript, a log line). Cheap on text that needs nothing."""

    def mark(m: re.Match[str]) -> str:
        run = m.group()
        if run.isprintable() and not _PRINTABLE_MARKED.search(run):
            return run
        return "".join(_code_point(ch) if _marked(ch) else ch for ch in run)

    return _MAYBE_MARKED.sub(mark, text)


def _run(match: str) -> str:
    if "\n" in match:
        return f"\n{OPEN}{match.count(chr(10)) - 1:,} blank lines{CLOSE}\n"
    what = "spaces" if "\t" not in match else "tabs" if " " not in match else "spaces and tabs"
    return f"{OPEN}{len(match):,} {what}{CLOSE}"


@dataclass(frozen=True, slots=True)
class Visible:
    """``text`` as shown: ``shown`` and, per shown piece, where it ends in ``shown`` and in
    the original (a cut falls only between pieces, never inside a marker)."""

    text: str
    shown: str
    ends: tuple[tuple[int, int], ...]

    def head(self, pieces: int) -> tuple[str, int]:
        """The first ``pieces`` pieces as shown, and how many characters of the original
        they leave out."""
        if pieces >= len(self.ends):
            return self.shown, 0
        if pieces <= 0:
            return "", len(self.text)
        shown_end, text_end = self.ends[pieces - 1]
        return self.shown[:shown_end], len(self.text) - text_end


@functools.lru_cache(maxsize=32)
def visible(text: str) -> Visible:
    """``text`` with every character visible and padding counted (see the module)."""
    shown: list[str] = []
    ends: list[tuple[int, int]] = []
    size = 0

    def add(piece: str, text_end: int) -> None:
        nonlocal size
        shown.append(piece)
        size += len(piece)
        ends.append((size, text_end))

    def plain(start: int, stop: int) -> None:
        marks = 0  # combining marks in a row: a pile of them draws over the lines around
        for i in range(start, stop):
            ch = text[i]
            marks = marks + 1 if unicodedata.combining(ch) else 0
            add(_code_point(ch) if marks > COMBINING_RUN or _marked(ch) else ch, i + 1)

    at = 0
    for m in _RUNS.finditer(text):
        plain(at, m.start())
        add(_run(m.group()), m.end())
        at = m.end()
    plain(at, len(text))
    return Visible(text, "".join(shown), tuple(ends))


def fence_for(text: str) -> str:
    """A backtick fence longer than any backtick run in ``text`` (three at least)."""
    longest = max((len(m) for m in _BACKTICKS.findall(text)), default=0)
    return "`" * max(3, longest + 1)


def quoted(text: str) -> str:
    """``text`` (already made visible) as a fenced block nothing in it can close."""
    fence = fence_for(text)
    return f"{fence}\n{text}\n{fence}"


def one_line(text: str, limit: int = 120) -> str:
    """A short visible form on one line (``memobot status``, logs)."""
    head, hidden = visible(text.replace("\n", " ")).head(limit)
    return head + (f"… (+{hidden:,})" if hidden else "")


@dataclass(frozen=True, slots=True)
class QuestionView:
    """What a channel needs to show one question: memobot's words around the model's text."""

    id: str
    intro: str  # "Approval needed: ..." (memobot's words)
    subject: str  # the whole command, or the tool and its arguments (the model's)
    outro: str  # the timeout and the typed answers (memobot's words)


def cut_note(hidden: int) -> str:
    return (
        f"… {hidden:,} more characters not shown. Press “{SHOW_ALL}” to read the whole "
        "text before you answer."
    )


def question_markdown(view: QuestionView, pieces: int | None = None) -> tuple[str, bool]:
    """The question as Markdown with the first ``pieces`` pieces of the visible subject (all
    when None), and whether that cut anything."""
    seen = visible(view.subject)
    head, hidden = (seen.shown, 0) if pieces is None else seen.head(pieces)
    parts = [view.intro, quoted(head)]
    if hidden:
        parts.append(cut_note(hidden))
    parts.append(view.outro)
    return "\n".join(parts), hidden > 0


def question_plain(view: QuestionView, pieces: int | None = None) -> tuple[str, bool]:
    """The question as plain text (the terminal; a platform's retry without markup): every
    line of the subject behind a gutter, so that no line of it can pass for memobot's own.
    ``pieces`` as in :func:`question_markdown`."""
    seen = visible(view.subject)
    head, hidden = (seen.shown, 0) if pieces is None else seen.head(pieces)
    parts = [view.intro, *(GUTTER + line for line in head.split("\n"))]
    if hidden:
        parts.append(cut_note(hidden))
    parts.append(view.outro)
    return "\n".join(parts), hidden > 0


def fit_question(
    view: QuestionView,
    render: Callable[[str], str] | None,
    measure: Callable[[str], int],
    limit: int,
) -> tuple[str, bool]:
    """The question rendered as one message within ``limit`` (``measure`` of the rendered
    text), and whether its subject had to be cut to fit. ``render``: the platform's renderer
    of the Markdown form; None for the plain form (:func:`question_plain`).

    The subject is kept whole when it fits; otherwise as much of its start as fits, with the
    cut note. Every shown piece renders to at least one measured unit, so at most ``limit``
    pieces ever fit: the search renders texts of about the limit's size, whatever the
    subject's length.
    """

    def build(pieces: int | None) -> str:
        if render is None:
            return question_plain(view, pieces)[0]
        return render(question_markdown(view, pieces)[0])

    whole = build(None)
    if measure(whole) <= limit:
        return whole, False
    lo, hi = 0, min(len(visible(view.subject).ends), limit)
    best = build(0)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        text = build(mid)
        if measure(text) <= limit:
            lo, best = mid, text
        else:
            hi = mid - 1
    return best, True


def full_text(approval_id: str, subject: str) -> str:
    """The "Show all" answer: the whole subject, made visible and quoted, as Markdown (the
    channel splits it into as many messages as it needs; each piece stays quoted)."""
    return f"The whole text of approval {approval_id} ({len(subject):,} characters):\n" + quoted(
        visible(subject).shown
    )
