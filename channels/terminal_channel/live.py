"""One reply of the model on an interactive terminal, rendered as Markdown while it is written.

Why this shape: text must show the moment it arrives (time to first visible text is what
streaming is for), but Markdown can only be rendered line by line: ``**bold`` may close
later in its line, and a line with a ``|`` may turn out to be a table's header, whose
columns depend on every row. So the lines that are final are written rendered, and below
them the rest (held table lines and the unfinished last line) is written raw: the live
region. Text that only extends the live region is written as it comes, with no escape
sequence at all. When lines become final, the live region is erased (carriage return,
cursor up over the rows it covers, erase to the end of the screen) and written again as
rendered lines plus the new, shorter live region. At the end of the reply the live region is
rendered too, so what the terminal is left showing is the rendered answer.

The rows the live region covers are computed from the terminal's width, read at each redraw,
and each character's cell width (wcwidth, as prompt_toolkit uses; wide CJK and emoji take
two columns and wrap early at the right margin). Known limits: a terminal resized while a
line is live can make that count wrong (raw text left behind, or a rendered line above
erased from the screen), and the rows of a live line taller than the screen that have
scrolled away cannot be erased (its raw start stays in the scrollback above its rendering).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import TextIO

from wcwidth import wcwidth

from channels.formatting import TAB_SIZE, AnsiMarkdown

DEFAULT_COLUMNS = 80  # when the terminal does not say (0 columns: a pty nobody sized)
ERASE_DOWN = "\x1b[J"  # erase from the cursor to the end of the screen
_SGR_RE = re.compile(r"\x1b\[[0-9;]*m")  # the only escape sequences rendered lines hold


def erase_rows(rows: int) -> str:
    """Back to the start of the row ``rows`` above the cursor, and the screen erased from
    there down."""
    return "\r" + (f"\x1b[{rows}A" if rows else "") + ERASE_DOWN


def terminal_columns(out: TextIO) -> int:
    """The width of the terminal ``out`` writes to, in columns."""
    try:
        columns = os.get_terminal_size(out.fileno()).columns
    except (OSError, ValueError, AttributeError):
        return DEFAULT_COLUMNS
    return columns if columns > 0 else DEFAULT_COLUMNS


def cursor_rows(shown: str, columns: int) -> int:
    """How many rows the cursor is below the row where ``shown`` started (at column 0), on a
    terminal ``columns`` wide that wraps long lines (with xterm's deferred wrap: a line that
    fills the last column exactly does not move the cursor to the next row)."""
    columns = max(1, columns)
    rows = 0
    lines = shown.split("\n")
    for k, line in enumerate(lines):
        used, column = 1, 0
        for ch in line:
            width = wcwidth(ch)
            if width <= 0:
                continue  # combining marks, joiners: drawn in the previous cell
            if column + width > columns:
                used, column = used + 1, 0
            column += width
        rows += used if k < len(lines) - 1 else used - 1
    return rows


class LiveMarkdown:
    """The reply's text so far goes to ``write`` (each time the whole text, which only grows);
    ``finish`` when it is complete leaves the cursor at the start of the line after it. The
    text must already be safe for a terminal (``strip_controls``) and the cursor at column 0
    when the first text comes."""

    def __init__(self, out: TextIO, columns: Callable[[], int]) -> None:
        self.out = out
        self.columns = columns
        self.renderer = AnsiMarkdown()
        self.text = ""  # the reply so far, tabs expanded
        self._raw_len = 0  # its length as given, tabs not expanded
        self._next_line = 0  # where the first line not yet fed to the renderer starts
        self._live_start = 0  # where the raw text on screen (the live region) starts
        self._rows_done = 0  # rows the rendered lines above the live region take

    @property
    def mid_line(self) -> bool:
        """Whether the cursor is not at the start of a line."""
        return self._next_line < len(self.text)

    def write(self, text: str) -> None:
        """Show the reply so far: ``text`` extends the text of the previous call."""
        new_raw = text[self._raw_len :]
        self._raw_len = len(text)
        if "\t" in new_raw:
            # Tabs as spaces: their width depends on the column, which the row count must
            # know; the column counts from the start of the line the new text continues.
            line = self.text[self.text.rfind("\n") + 1 :]
            new = (line + new_raw).expandtabs(TAB_SIZE)[len(line) :]
        else:
            new = new_raw
        live_start, shown_end = self._live_start, len(self.text)
        self.text += new
        rendered: list[str] = []
        while (end := self.text.find("\n", self._next_line)) != -1:
            rendered.extend(self._feed(self._next_line, end))
        if rendered:
            self._redraw(self.text[live_start:shown_end], rendered)
        elif new:
            self.out.write(new)
        self.out.flush()

    def finish(self) -> None:
        """Render what is still raw on screen; the cursor ends at the start of a line."""
        shown = self.text[self._live_start :]
        rendered: list[str] = []
        if self._next_line < len(self.text):
            rendered.extend(self._feed(self._next_line, len(self.text)))
        rendered.extend(self.renderer.finish())
        self._live_start = self._next_line = len(self.text)
        if rendered or shown:
            self._redraw(shown, rendered)
        self.out.flush()

    def erase(self) -> None:
        """Take the reply off the screen (a retry of the request starts it again): the
        cursor ends where the reply began. Rows that scrolled off the screen stay above."""
        up = self._rows_done + cursor_rows(self.text[self._live_start :], self.columns())
        self.out.write(erase_rows(up))
        self.out.flush()

    def _feed(self, start: int, end: int) -> list[str]:
        out = self.renderer.feed(self.text[start:end])
        self._next_line = end + 1
        if self.renderer.held == 0:
            self._live_start = min(self._next_line, len(self.text))
        elif self.renderer.held == 1:
            self._live_start = start  # this line waits: a table may start here
        return out

    def _redraw(self, shown: str, rendered: list[str]) -> None:
        columns = self.columns()
        self.out.write(erase_rows(cursor_rows(shown, columns)))
        self.out.write("".join(line + "\n" for line in rendered))
        self._rows_done += sum(
            cursor_rows(_SGR_RE.sub("", line) + "\n", columns) for line in rendered
        )
        self.out.write(self.text[self._live_start :])
