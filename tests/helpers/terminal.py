"""What a terminal shows: the text of an answer without its SGR codes, and a VT100 screen in
memory (pyte) that wraps wide characters as real terminals do."""

from __future__ import annotations

import re

import pyte
from wcwidth import wcwidth

SGR_RE = re.compile(r"\x1b\[[0-9;]*m")


def plain(rendered: str) -> str:
    return SGR_RE.sub("", rendered)


class XtermScreen(pyte.Screen):
    """pyte's screen, wrapping as xterm, VTE and kitty do: a wide character that does not fit
    in the last column goes to the next row, leaving that column empty (pyte would cut it)."""

    def draw(self, data: str) -> None:
        for ch in data:
            if wcwidth(ch) == 2 and self.cursor.x == self.columns - 1:
                super().draw(" ")
            super().draw(ch)


def screen_after(data: str, columns: int, rows: int = 120) -> list[str]:
    """What a VT100 ``columns`` wide shows after ``data`` (the tty turns "\\n" into CR LF)."""
    screen = XtermScreen(columns, rows)
    pyte.Stream(screen).feed(data.replace("\n", "\r\n"))
    return [line.rstrip() for line in screen.display]
