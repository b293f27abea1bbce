"""Splitting an answer to a platform's length limit and rendering Markdown to its dialect.

Pure functions over strings: no I/O, no SDK imports, so every channel can use them and the
tests need neither sockets nor asyncio. The model writes ordinary (GitHub-flavoured) Markdown;
each platform gets its own dialect:

* Telegram: the Bot API's HTML parse mode (``markdown_to_telegram_html``);
* the panel's chat in a browser: the same HTML subset, links http(s) only (``markdown_to_html``);
* Slack: mrkdwn (``markdown_to_slack_mrkdwn``);
* Discord: Markdown, lightly adjusted and made unable to mass-ping (``markdown_to_discord``);
* a terminal: SGR escape sequences, a line at a time while an answer streams (``AnsiMarkdown``,
  ``markdown_to_ansi``);
* any platform's plain-text fallback: ``strip_markdown`` / ``strip_telegram_html``.

A channel renders an answer with ``render_chunks(text, LIMIT, renderer, measure=...)``. Every
platform limit is here, with the unit it counts: Discord and Slack count characters (code
points); Telegram counts UTF-16 code units of the text left after entity parsing (the visible
text, not the HTML markup), ``telegram_length``.
"""

from __future__ import annotations

import html
import re
import unicodedata
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass

# Telegram: UTF-16 code units of the text after entity parsing (``telegram_length``).
TELEGRAM_LIMIT = 4096  # sendMessage and editMessageText text
TELEGRAM_CAPTION_LIMIT = 1024  # captions of photos, documents, audio, video, voice, animations
DISCORD_LIMIT = 2000  # message content
SLACK_LIMIT = 3900  # Slack advises at most 4000 characters of message text; keep a margin
SLACK_SECTION_LIMIT = 3000  # the text of one Block Kit section block

__all__ = [
    "DISCORD_LIMIT",
    "SGR_RESET",
    "SLACK_LIMIT",
    "SLACK_SECTION_LIMIT",
    "TELEGRAM_CAPTION_LIMIT",
    "TELEGRAM_LIMIT",
    "AnsiMarkdown",
    "markdown_to_ansi",
    "markdown_to_discord",
    "markdown_to_html",
    "markdown_to_slack_mrkdwn",
    "markdown_to_telegram_html",
    "render_chunks",
    "split_markdown",
    "split_telegram_html",
    "strip_controls",
    "strip_markdown",
    "strip_telegram_html",
    "telegram_length",
    "utf16_len",
]

# ---------------------------------------------------------------------------------------------
# Fenced code blocks (shared by the splitter and every renderer, so they agree on what is code)

_FENCE_OPEN_RE = re.compile(r"^([ \t]*)(`{3,}|~{3,})(.*)$")


@dataclass(frozen=True, slots=True)
class _FenceOpen:
    indent: str
    fence: str  # the backtick or tilde run, e.g. "```"
    lang: str  # first word of the info string, "" when none


def _fence_open(line: str) -> _FenceOpen | None:
    m = _FENCE_OPEN_RE.match(line)
    if m is None:
        return None
    indent, fence, info = m.groups()
    if fence[0] == "`" and "`" in info:  # CommonMark: a backtick fence's info has no backticks
        return None
    words = info.split()
    return _FenceOpen(indent, fence, words[0] if words else "")


def _fence_closes(line: str, fence: str) -> bool:
    s = line.strip()
    return len(s) >= len(fence) and s == fence[0] * len(s)


# ---------------------------------------------------------------------------------------------
# Splitting

_PARAGRAPH, _LINE, _WORD = 3, 2, 1


@dataclass(frozen=True, slots=True)
class _Code:
    """One fenced block of the text being split, as offsets into it."""

    open_start: int  # start of the opening fence line
    content_start: int  # just after the opening fence line's newline
    content_end: int  # start of the closing fence line (len(text) when unclosed)
    end: int  # end of the closing fence line, before its newline
    reopen: str  # fence line that reopens the block at the start of the next piece
    close: str  # fence line that closes it at the end of a piece
    closed: bool  # False when the text ends inside the block


@dataclass(frozen=True, slots=True)
class _Break:
    start: int  # the piece before the break ends here
    end: int  # the next piece starts here; text[start:end] is dropped
    rank: int
    code: _Code | None  # the block the break lies inside, None outside code


@dataclass(frozen=True, slots=True)
class _Line:
    start: int
    stop: int  # end of the line's text, before its newline
    kind: str  # "text" | "blank" | "open" | "code" | "close"
    code: _Code | None


def _scan_lines(text: str) -> tuple[list[_Line], list[_Code]]:
    raw: list[tuple[int, int, str]] = []
    pos = 0
    for chunk in text.split("\n"):
        raw.append((pos, pos + len(chunk), chunk))
        pos += len(chunk) + 1
    lines: list[_Line] = []
    codes: list[_Code] = []
    i = 0
    while i < len(raw):
        start, stop, chunk = raw[i]
        opened = _fence_open(chunk)
        if opened is None:
            lines.append(_Line(start, stop, "blank" if not chunk.strip() else "text", None))
            i += 1
            continue
        j = i + 1
        while j < len(raw) and not _fence_closes(raw[j][2], opened.fence):
            j += 1
        closed = j < len(raw)
        content_start = min(stop + 1, len(text))
        content_end = raw[j][0] if closed else len(text)
        code = _Code(
            open_start=start,
            content_start=content_start,
            content_end=content_end,
            end=raw[j][1] if closed else len(text),
            reopen=f"{opened.indent}{opened.fence}{opened.lang}\n",
            close=f"{opened.indent}{opened.fence}",
            closed=closed,
        )
        codes.append(code)
        lines.append(_Line(start, stop, "open", code))
        lines.extend(_Line(s, e, "code", code) for s, e, _ in raw[i + 1 : j])
        if closed:
            lines.append(_Line(raw[j][0], raw[j][1], "close", code))
        i = j + 1
    return lines, codes


_SPACES_RE = re.compile(r"[ \t]+")
# A cut inside a line makes the rest start a line of its own in the next piece; it must not
# start with a fence (that would open or close code) nor, outside code, read as a heading,
# quote or bullet.
_FENCE_LIKE_RE = re.compile(r"```|~~~")
_LINE_START_RE = re.compile(r"```|~~~|#{1,6}(?:[ \t]|$)|>|[-*+][ \t]")


def _find_breaks(text: str, lines: list[_Line]) -> list[_Break]:
    breaks: list[_Break] = []
    last_text: _Line | None = None  # last non-blank line outside code, for paragraph breaks
    saw_blank = False
    for k, line in enumerate(lines):
        body = text[line.start : line.stop]
        if line.kind == "code":
            # Inside code nothing is dropped: a cut keeps the newline or the spaces in the
            # piece before it, so the code survives byte for byte.
            nxt = lines[k + 1] if k + 1 < len(lines) else None
            for m in _SPACES_RE.finditer(body):
                if (
                    m.start() > 0
                    and m.end() < len(body)
                    and not _FENCE_LIKE_RE.match(body, m.end())
                ):
                    pos = line.start + m.end()
                    breaks.append(_Break(pos, pos, _WORD, line.code))
            if nxt is not None and nxt.kind == "code":
                # A blank line in code (between functions) is its paragraph break.
                rank = _PARAGRAPH if not body.strip() else _LINE
                breaks.append(_Break(line.stop + 1, line.stop + 1, rank, line.code))
            continue
        if line.kind == "blank":
            saw_blank = True
            continue
        # "text", "open" or "close": a line outside code (fence lines themselves stay whole).
        if last_text is not None and last_text.kind != "open" and line.kind != "close":
            end_of_prev = last_text.start + len(text[last_text.start : last_text.stop].rstrip())
            rank = _PARAGRAPH if saw_blank else _LINE
            breaks.append(_Break(end_of_prev, line.start, rank, None))
        if line.kind == "text":
            indent = len(body) - len(body.lstrip())
            trimmed = len(body.rstrip())
            for m in _SPACES_RE.finditer(body, indent):
                if m.end() < trimmed and not _LINE_START_RE.match(body, m.end()):
                    breaks.append(_Break(line.start + m.start(), line.start + m.end(), _WORD, None))
        last_text = line
        saw_blank = False
    return breaks


_ZWJ = "\u200d"


def _splits_cluster(text: str, c: int) -> bool:
    """Would cutting before ``text[c]`` split a user-perceived character (emoji, accent)?"""
    if c <= 0 or c >= len(text):
        return False
    ch, prev = text[c], text[c - 1]
    if prev == _ZWJ or ch == _ZWJ or unicodedata.combining(ch):
        return True
    cp = ord(ch)
    if cp in (0xFE0E, 0xFE0F) or 0x1F3FB <= cp <= 0x1F3FF or 0xE0020 <= cp <= 0xE007F:
        return True  # variation selector, skin tone, tag sequence
    if 0x1F1E6 <= cp <= 0x1F1FF and 0x1F1E6 <= ord(prev) <= 0x1F1FF:  # flag: pairs of indicators
        run = 0
        while c - 1 - run >= 0 and 0x1F1E6 <= ord(text[c - 1 - run]) <= 0x1F1FF:
            run += 1
        return run % 2 == 1
    return False


class _Splitter:
    def __init__(self, text: str) -> None:
        self.text = text
        lines, self.codes = _scan_lines(text)
        self.breaks = _find_breaks(text, lines)
        self.starts = [b.start for b in self.breaks]
        # A trailing unclosed block is closed in the last piece, like any block cut in two.
        last = self.codes[-1] if self.codes else None
        self.tail_code = last if last is not None and not last.closed else None
        self.end = len(text) if self.tail_code else len(text.rstrip())

    def split(self, limit: int, fits: Callable[[str], bool] | None = None) -> list[str]:
        """Pieces of at most ``limit`` characters; with ``fits``, each also satisfies it."""
        text = self.text
        pieces: list[str] = []
        a = len(text) - len(text.lstrip())
        a = text.rfind("\n", 0, a) + 1  # keep the first line's indentation
        while a < self.end:
            piece, after = self.next_piece(a, limit)
            if fits is not None and not fits(piece):
                piece, after = self.largest_fitting(a, len(piece), fits)
            if piece.strip():
                pieces.append(piece)
            a = after
        return pieces

    def largest_fitting(self, a: int, size: int, fits: Callable[[str], bool]) -> tuple[str, int]:
        """Binary search for the largest budget whose piece from ``a`` satisfies ``fits``."""
        lo, hi = 0, size  # a budget of `size` is known not to fit
        found: tuple[str, int] | None = None
        while hi - lo > 1:
            mid = (lo + hi) // 2
            candidate = self.next_piece(a, mid)
            if fits(candidate[0]):
                lo, found = mid, candidate
            else:
                hi = mid
        if found is None:
            raise ValueError(f"cannot fit even one character of {self.text[a : a + 20]!r}")
        return found

    def next_piece(self, a: int, limit: int) -> tuple[str, int]:
        """The longest piece from ``a`` within ``limit`` at the best break, and where the
        next piece starts."""
        opened = self.code_at_start(a)
        reopen = len(opened.reopen) if opened else 0
        if opened and reopen + len(opened.close) + 2 > limit:
            opened, reopen = None, 0  # too small to carry fences: plain cuts
        if reopen + (self.end - a) <= limit:
            tail = self.piece(a, self.end, opened, self.tail_code)
            if len(tail) <= limit:
                return tail, len(self.text)
        best = self.best_break(a, reopen, limit)
        if best is not None:
            return self.piece(a, best.start, opened, best.code), best.end
        c, closing = self.hard_cut(a, reopen, limit)
        return self.piece(a, c, opened, closing), c

    def code_at_start(self, a: int) -> _Code | None:
        for code in self.codes:
            if code.content_start <= a < code.content_end:
                return code
        return None

    def code_at_cut(self, c: int) -> _Code | bool | None:
        """The block a piece ending before ``c`` ends inside; False where no cut may be made."""
        for code in self.codes:
            if code.open_start < c <= code.content_start:
                return False  # inside the opening fence line, or right after it: empty block
            if code.content_start < c < code.content_end:
                return code
            if c == code.content_end:  # before the closing line (empty block) or text end
                return False if code.closed else code
            if code.content_end < c < code.end:
                return False  # inside the closing fence line
        return None

    def close_len(self, code: _Code | None, c: int) -> int:
        if code is None:
            return 0
        return len(code.close) + (0 if self.text[c - 1] == "\n" else 1)

    def piece(self, a: int, c: int, opened: _Code | None, closing: _Code | None) -> str:
        body = self.text[a:c]
        if closing is None:
            body = body.rstrip()
        else:
            body = body + ("" if body.endswith("\n") else "\n") + closing.close
        return (opened.reopen if opened else "") + body

    def best_break(self, a: int, reopen: int, limit: int) -> _Break | None:
        window = self.text[a : a + limit]
        first = a + len(window) - len(window.lstrip())  # a piece needs some non-space text
        best: _Break | None = None
        hi = bisect_right(self.starts, a + limit - reopen)
        for k in range(bisect_right(self.starts, first), hi):
            b = self.breaks[k]
            if reopen + (b.start - a) + self.close_len(b.code, b.start) > limit:
                continue
            if best is None or (b.rank, b.start) >= (best.rank, best.start):
                best = b
        return best

    def hard_cut(self, a: int, reopen: int, limit: int) -> tuple[int, _Code | None]:
        """Cut a token too long for any break: as late as fits, never inside a fence line."""
        c = min(a + limit - reopen, len(self.text))
        while c > a:
            code = self.code_at_cut(c)
            # Outside code the rest must not start with a quote, heading or bullet marker
            # either: the next piece would lose it to the markup.
            starts = _FENCE_LIKE_RE if isinstance(code, _Code) else _LINE_START_RE
            if (
                code is not False
                and not _splits_cluster(self.text, c)
                and not starts.match(self.text, c)
            ):
                closing = code if isinstance(code, _Code) else None
                if reopen + (c - a) + self.close_len(closing, c) <= limit:
                    return c, closing
            c -= 1
        # Only reachable when the limit is smaller than a fence line: cut anyway, as text.
        return a + max(1, limit - reopen), None


def split_markdown(text: str, limit: int) -> list[str]:
    """Split Markdown into pieces of at most ``limit`` characters each.

    Cuts at the last blank line that fits, else the last line end, else the last space, else
    anywhere (never inside an emoji or accented character). A fenced code block cut in two is
    closed at the end of the first piece (``\\n`` + fence, or just the fence after a newline)
    and reopened with the same fence and language at the start of the next; those characters
    count toward the limit. Inside code nothing is dropped at a cut, so the code's text
    survives; outside code the whitespace at a cut is dropped. A trailing unclosed block is
    closed in the last piece. Text within the limit comes back as ``[text]`` unchanged;
    whitespace-only text gives ``[]``; no piece is empty or whitespace-only.

    Raises ValueError when ``limit`` < 1. With a limit smaller than a fence line (absurd for a
    real platform) pieces still fit, but code blocks are cut as plain text.
    """
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    if not text.strip():
        return []
    if len(text) <= limit:
        return [text]
    return _Splitter(text).split(limit)


def render_chunks(
    text: str,
    limit: int,
    render: Callable[[str], str],
    *,
    measure: Callable[[str], int] = len,
) -> list[str]:
    """Split ``text`` as ``split_markdown`` does and render each piece, so that every rendered
    piece measures at most ``limit`` (``len`` by default).

    A piece whose rendering grew past the limit (escaping: ``&`` becomes ``&amp;``) is cut
    shorter, to the longest piece whose rendering fits, so growth costs no more messages than
    it must. ``measure`` suits a platform that counts something else than the rendered length:
    Telegram's limit counts text after entity parsing, ``lambda h: len(strip_telegram_html(h))``.
    Returns the rendered pieces, none blank. Raises ValueError if even one character renders
    too long.
    """
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    if not text.strip():
        return []
    rendered: dict[str, str] = {}

    def fits(piece: str) -> bool:
        if piece not in rendered:
            rendered[piece] = render(piece)
        return measure(rendered[piece]) <= limit

    # The whole text first even when longer than the limit: markup that disappears after
    # parsing (a link's URL) can leave it within the limit as measured.
    if fits(text):
        pieces = [text]
    else:
        pieces = _Splitter(text).split(limit, fits)
    return [rendered[p] for p in pieces if rendered[p].strip()]


# ---------------------------------------------------------------------------------------------
# Blocks: fenced code, tables, and single lines (headings, bullets, quotes, paragraphs)


@dataclass(frozen=True, slots=True)
class _Fenced:
    lang: str
    lines: tuple[str, ...]  # content, with the fence's indentation removed
    raw: tuple[str, ...]  # the original lines, fences included


@dataclass(frozen=True, slots=True)
class _Table:
    rows: tuple[tuple[str, ...], ...]  # header first; the --- row is dropped
    raw: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class _Text:
    line: str


_Block = _Fenced | _Table | _Text

_TABLE_SEP_RE = re.compile(r"^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$")
_CELL_SPLIT_RE = re.compile(r"(?<!\\)\|")


def _cells(line: str) -> tuple[str, ...]:
    s = line.strip()
    if s.startswith("|"):
        s = s[1:]
    if s.endswith("|") and not s.endswith("\\|"):
        s = s[:-1]
    return tuple(c.strip().replace("\\|", "|") for c in _CELL_SPLIT_RE.split(s))


def _code_line(line: str, opened: _FenceOpen) -> str:
    """A line of a fenced block without the fence's indentation."""
    width = len(opened.indent)
    return line[width:] if line[:width].strip() == "" else line.lstrip()


def _starts_table(header: str, separator: str) -> bool:
    """Whether ``header`` followed by ``separator`` opens a table (GitHub's pipe tables)."""
    return (
        "|" in header
        and "-" in separator
        and _TABLE_SEP_RE.match(separator) is not None
        and ("|" in separator or header.strip().startswith("|"))
    )


def _blocks(md: str) -> list[_Block]:
    lines = md.replace("\r\n", "\n").split("\n")
    blocks: list[_Block] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        opened = _fence_open(line)
        if opened is not None:
            j = i + 1
            while j < len(lines) and not _fence_closes(lines[j], opened.fence):
                j += 1
            content = tuple(_code_line(ln, opened) for ln in lines[i + 1 : j])
            stop = j + 1 if j < len(lines) else j
            blocks.append(_Fenced(opened.lang, content, tuple(lines[i:stop])))
            i = stop
            continue
        if i + 1 < len(lines) and _starts_table(line, lines[i + 1]):
            j = i + 2
            while j < len(lines) and "|" in lines[j] and lines[j].strip():
                j += 1
            rows = (_cells(line), *(_cells(r) for r in lines[i + 2 : j]))
            blocks.append(_Table(rows, tuple(lines[i:j])))
            i = j
            continue
        blocks.append(_Text(line))
        i += 1
    return blocks


def _display_width(s: str) -> int:
    return sum(
        0 if unicodedata.combining(ch) else 2 if unicodedata.east_asian_width(ch) in "WF" else 1
        for ch in s
    )


def _aligned_table(table: _Table) -> str:
    """The table as aligned monospace text (cells stripped of inline Markdown)."""
    rows = [[_plain_inline(cell) for cell in row] for row in table.rows]
    ncols = max(len(r) for r in rows)
    for r in rows:
        r.extend([""] * (ncols - len(r)))
    widths = [max(_display_width(r[k]) for r in rows) for k in range(ncols)]

    def fmt(row: list[str]) -> str:
        cells = [
            cell + " " * (w - _display_width(cell)) for cell, w in zip(row, widths, strict=True)
        ]
        return " | ".join(cells).rstrip()

    rule = "-+-".join("-" * w for w in widths)
    return "\n".join([fmt(rows[0]), rule, *(fmt(r) for r in rows[1:])])


_HR_RE = re.compile(r"^ {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$")
_HEADING_RE = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
_BULLET_RE = re.compile(r"^([ \t]*)[-*+][ \t]+(.*)$")
# Every level of ">" at once: peeling them one match at a time copied the rest of the line per
# level (a line of 100,000 ">" took seconds).
_QUOTES_RE = re.compile(r"(?: {0,3}>[ \t]?)+")


def _quote_depth(line: str) -> tuple[str, int] | None:
    """(the text of a "> quote" line without its markers, how many levels); None for others."""
    m = _QUOTES_RE.match(line)
    if m is None:
        return None
    return line[m.end() :], m[0].count(">")


_RULE = "———"


def _unquote(line: str) -> str | None:
    """The text of a "> quote" line with every level of ">" removed; None for other lines."""
    quoted = _quote_depth(line)
    return None if quoted is None else quoted[0]


# ---------------------------------------------------------------------------------------------
# Inline Markdown: a small parser into a tree, so every renderer's output nests properly.
#
# Code spans, links, autolinks, bare URLs and backslash escapes are found first and replaced by
# placeholder characters (Unicode plane 15 private use); emphasis is then matched over the rest
# with CommonMark's flanking rules, tightened so that * and _ never emphasise inside a word
# (snake_case_names, 2*3*4). An opener without a closer stays literal text.


@dataclass(frozen=True, slots=True)
class _Str:
    text: str


@dataclass(frozen=True, slots=True)
class _CodeSpan:
    text: str


@dataclass(frozen=True, slots=True)
class _Link:
    children: tuple[_Node, ...]
    url: str


@dataclass(frozen=True, slots=True)
class _Emph:
    kind: str  # "b", "i" or "s"
    children: tuple[_Node, ...]


_Node = _Str | _CodeSpan | _Link | _Emph

_PH_BASE = 0xF0000
_PLACEHOLDER_RE = re.compile(f"[{chr(_PH_BASE)}-{chr(0x10FFFF)}]")
_PH_MAX = 0xFFFFD
_LINK_RE = re.compile(
    r"!?\[((?:[^\[\]\\]|\\.|\[[^\[\]]*\])*)\]"
    r"\(\s*(<[^<>\n]*>|(?:[^\s()\\]|\\.|\((?:[^\s()\\]|\\.)*\))*)"
    r"""(?:\s+(?:"[^"]*"|'[^']*'))?\s*\)"""
)
_AUTOLINK_RE = re.compile(r"<((?:https?|mailto|tg):[^\s<>]+)>")
_URL_RE = re.compile(r"https?://[^\s<>]+")
_URL_TRAILING = ".,;:!?'\"*_~"
_ESCAPABLE = set("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
_MAX_DEPTH = 16


def _trim_url(url: str) -> str:
    while url:
        if url[-1] in _URL_TRAILING:
            url = url[:-1]
        elif url[-1] == ")" and url.count("(") < url.count(")"):
            url = url[:-1]
        else:
            break
    return url


class _TooComplex(Exception):
    pass


def _parse_inline(s: str, links: bool = True, depth: int = 0) -> list[_Node]:
    try:
        return _parse_inline_unguarded(s, links, depth)
    except _TooComplex:
        return [_Str(s)]  # more code spans and links in one line than placeholders: as text


def _parse_inline_unguarded(s: str, links: bool, depth: int) -> list[_Node]:
    atoms: list[_Node] = []
    out: list[str] = []
    i, n = 0, len(s)

    def protect(node: _Node) -> None:
        if _PH_BASE + len(atoms) > _PH_MAX:
            raise _TooComplex
        out.append(chr(_PH_BASE + len(atoms)))
        atoms.append(node)

    while i < n:
        ch = s[i]
        if ch == "\\" and i + 1 < n and s[i + 1] in _ESCAPABLE:
            protect(_Str(s[i + 1]))
            i += 2
        elif ch == "`":
            run = next(k for k in range(i, n + 1) if k == n or s[k] != "`") - i
            close = re.compile(rf"(?<!`)`{{{run}}}(?!`)").search(s, i + run)
            if close is None:
                protect(_Str("`" * run))
                i += run
            else:
                content = s[i + run : close.start()].replace("\n", " ")
                if len(content) > 2 and content[0] == content[-1] == " " and content.strip():
                    content = content[1:-1]
                protect(_CodeSpan(content))
                i = close.end()
        elif links and ch in "[!" and (m := _LINK_RE.match(s, i)) and m[2].strip("<> "):
            url = m[2][1:-1] if m[2].startswith("<") else re.sub(r"\\(.)", r"\1", m[2])
            label = m[1] if m[1].strip() else url
            protect(_Link(tuple(_parse_inline(label, False, depth + 1)), url))
            i = m.end()
        elif links and ch == "<" and (m := _AUTOLINK_RE.match(s, i)) is not None:
            protect(_Link((_Str(m[1]),), m[1]))
            i = m.end()
        elif ch == "h" and (i == 0 or not s[i - 1].isalnum()) and (m := _URL_RE.match(s, i)):
            url = _trim_url(m[0])
            protect(_Str(url))
            i += len(url)
        elif _PH_BASE <= ord(ch) <= 0x10FFFF:  # input already holding our placeholder range
            protect(_Str(ch))
            i += 1
        else:
            out.append(ch)
            i += 1

    def expand(nodes: list[_Node]) -> list[_Node]:
        result: list[_Node] = []
        for node in nodes:
            if isinstance(node, _Emph):
                result.append(_Emph(node.kind, tuple(expand(list(node.children)))))
                continue
            assert isinstance(node, _Str)
            text, start = node.text, 0
            for m in _PLACEHOLDER_RE.finditer(text):  # (a regex scan, not a loop per character)
                k = ord(m[0]) - _PH_BASE
                if k >= len(atoms):
                    continue  # not one of ours: stays text
                if m.start() > start:
                    result.append(_Str(text[start : m.start()]))
                result.append(atoms[k])
                start = m.end()
            if start < len(text):
                result.append(_Str(text[start:]))
        return result

    return expand(_emphasis("".join(out), depth))


def _run_at(t: str, i: int) -> int:
    j = i
    while j < len(t) and t[j] == t[i]:
        j += 1
    return j - i


def _emphasis(t: str, depth: int) -> list[_Node]:
    nodes: list[_Node] = []
    buf: list[str] = []
    no_closer: dict[tuple[str, int], int] = {}  # (char, size) -> scans from here found none
    i, n = 0, len(t)
    while i < n:
        ch = t[i]
        if ch not in "*_~" or depth >= _MAX_DEPTH:
            buf.append(ch)
            i += 1
            continue
        run = _run_at(t, i)
        found = _match_emphasis(t, i, run, depth, no_closer)
        if found is None:
            buf.append(t[i : i + run])
            i += run
            continue
        if buf:
            nodes.append(_Str("".join(buf)))
            buf.clear()
        node, i = found
        nodes.append(node)
    if buf:
        nodes.append(_Str("".join(buf)))
    return nodes


def _match_emphasis(
    t: str, i: int, run: int, depth: int, no_closer: dict[tuple[str, int], int]
) -> tuple[_Emph, int] | None:
    ch, n = t[i], len(t)
    prev = t[i - 1] if i > 0 else " "
    after = t[i + run] if i + run < n else " "
    if after.isspace():
        return None  # "2 * 3", "* item": not an opener
    if ch == "~":
        sizes: tuple[int, ...] = (2,) if run == 2 else ()
    else:
        sizes = (2, 1) if run >= 3 else (run,)
    for size in sizes:
        strict = size == 1 or ch == "_"  # no emphasis inside words for * and _ / __
        if strict and prev.isalnum():
            continue
        key = (ch, size)
        if no_closer.get(key, n + 1) <= i + run:
            continue
        j = i + run
        while j < n:
            if t[j] != ch:
                j += 1
                continue
            m = _run_at(t, j)
            following = t[j + m] if j + m < n else " "
            if (
                not t[j - 1].isspace()
                and (m == size or (m >= 3 and ch != "~"))
                and not (strict and following.isalnum())
            ):
                content = t[i + size : j + m - size]
                if content.strip():
                    kind = "s" if ch == "~" else "b" if size == 2 else "i"
                    return _Emph(kind, tuple(_emphasis(content, depth + 1))), j + m
            j += m
        no_closer[key] = i + run
    return None


def _plain_nodes(nodes: tuple[_Node, ...] | list[_Node]) -> str:
    out: list[str] = []
    for node in nodes:
        if isinstance(node, _Str | _CodeSpan):
            out.append(node.text)
        elif isinstance(node, _Link):
            label = _plain_nodes(node.children)
            out.append(node.url if label in (node.url, "") else f"{label} ({node.url})")
        else:
            out.append(_plain_nodes(node.children))
    return "".join(out)


def _plain_inline(text: str) -> str:
    return _plain_nodes(_parse_inline(text))


# ---------------------------------------------------------------------------------------------
# HTML: Telegram's parse mode, and the panel's chat (the same subset, links http(s) only)

_TG_TAGS = {"b": "b", "i": "i", "s": "s"}
_LANG_RE = re.compile(r"[^\w+#.-]")


@dataclass(frozen=True, slots=True)
class _HtmlDialect:
    schemes: tuple[str, ...]  # the links that stay links; any other is "text (url)"
    link_attrs: str = ""  # more attributes of every <a>, written as they are


_TELEGRAM_HTML = _HtmlDialect(("http://", "https://", "tg://"))
# A browser follows what it is given: no javascript:, data: or file: link, and none that
# tells the page it came from.
_WEB_HTML = _HtmlDialect(("http://", "https://"), ' rel="noopener noreferrer nofollow"')


def _esc(s: str) -> str:
    return html.escape(s, quote=False)


def _tg_nodes(
    nodes: tuple[_Node, ...] | list[_Node],
    open_kinds: frozenset[str] = frozenset(),
    dialect: _HtmlDialect = _TELEGRAM_HTML,
) -> str:
    out: list[str] = []
    for node in nodes:
        if isinstance(node, _Str):
            out.append(_esc(node.text))
        elif isinstance(node, _CodeSpan):
            # Telegram lets no entity but bold/italic/strike contain code; inside a link: text.
            out.append(_esc(node.text) if "a" in open_kinds else f"<code>{_esc(node.text)}</code>")
        elif isinstance(node, _Link):
            label = _tg_nodes(node.children, open_kinds | {"a"}, dialect)
            url = node.url.strip()
            if url.lower().startswith(dialect.schemes) and "a" not in open_kinds:
                href = html.escape(url, quote=True)
                out.append(f'<a href="{href}"{dialect.link_attrs}>{label}</a>')
            else:
                out.append(
                    label if _plain_nodes(node.children) == url else f"{label} ({_esc(url)})"
                )
        else:
            inner = _tg_nodes(node.children, open_kinds | {node.kind}, dialect)
            tag = _TG_TAGS[node.kind]
            out.append(inner if node.kind in open_kinds else f"<{tag}>{inner}</{tag}>")
    return "".join(out)


def _tg_line(line: str, dialect: _HtmlDialect = _TELEGRAM_HTML) -> str:
    if _HR_RE.match(line):
        return _RULE
    if (m := _HEADING_RE.match(line)) is not None:
        title = m[2] or ""
        bold = _tg_nodes(_parse_inline(title), frozenset("b"), dialect)
        return f"<b>{bold}</b>" if title else ""
    if (m := _BULLET_RE.match(line)) is not None:
        return f"{m[1]}• {_tg_nodes(_parse_inline(m[2]), dialect=dialect)}"
    return _tg_nodes(_parse_inline(line), dialect=dialect)


def markdown_to_telegram_html(md: str) -> str:
    """Markdown to the Bot API's HTML parse mode.

    Output uses only b, i, s, code, pre, ``<pre><code class="language-x">``, ``<a href>`` and
    blockquote; every tag is closed and properly nested whatever the input, and ``&``, ``<``,
    ``>`` are escaped everywhere else. Unmatched markers (``**bold without end``) stay literal.
    Headings become bold lines, bullets "• ", tables an aligned ``<pre>``, "> " lines one
    blockquote (nested quotes flattened: Telegram cannot nest them). Links other than http(s)
    and tg:// become "text (url)".
    """
    return _markdown_html(md, _TELEGRAM_HTML)


def markdown_to_html(md: str) -> str:
    """Markdown to HTML for a browser (the panel's chat): the subset and guarantees of
    ``markdown_to_telegram_html``, for an element that keeps line breaks (``white-space:
    pre-wrap``). Links other than http(s) become "text (url)"; whatever HTML the text holds
    is shown as text."""
    return _markdown_html(md, _WEB_HTML)


def _markdown_html(md: str, dialect: _HtmlDialect) -> str:
    out: list[str] = []
    quote: list[str] = []

    def flush_quote() -> None:
        if quote:
            out.append(f"<blockquote>{chr(10).join(quote)}</blockquote>")
            quote.clear()

    for block in _blocks(md):
        if isinstance(block, _Text) and (inner := _unquote(block.line)) is not None:
            quote.append(_tg_line(inner, dialect))
            continue
        flush_quote()
        if isinstance(block, _Fenced):
            code = _esc("\n".join(block.lines))
            lang = _LANG_RE.sub("", block.lang)
            if lang:
                out.append(f'<pre><code class="language-{lang}">{code}</code></pre>')
            else:
                out.append(f"<pre>{code}</pre>")
        elif isinstance(block, _Table):
            out.append(f"<pre>{_esc(_aligned_table(block))}</pre>")
        else:
            out.append(_tg_line(block.line, dialect))
    flush_quote()
    return "\n".join(out)


_TAG_RE = re.compile(r"<[^>]*>")


def strip_telegram_html(html_text: str) -> str:
    """Undo ``markdown_to_telegram_html``: drop the tags and unescape the entities."""
    return html.unescape(_TAG_RE.sub("", html_text))


def utf16_len(text: str) -> int:
    """Length in UTF-16 code units: 1 per character of the BMP, 2 above it (most emoji)."""
    # The codec counts in C (a generator over the text cost a call per character); a lone
    # surrogate, which Python strings may hold, is one unit as Telegram counts it.
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def telegram_length(html_text: str) -> int:
    """What Telegram measures against ``TELEGRAM_LIMIT``: UTF-16 code units of the text left
    once the HTML parse mode has removed the tags and decoded the entities."""
    return utf16_len(strip_telegram_html(html_text))


_TG_TOKEN_RE = re.compile(r"<(/?)([A-Za-z][A-Za-z0-9-]*)[^<>]*>|&#?[A-Za-z0-9]+;|[^<&]|[<&]")


def split_telegram_html(html_text: str, limit: int) -> list[str]:
    """Cut Telegram HTML into pieces of at most ``limit`` (``telegram_length``) each.

    For a piece Telegram refused as too long although we measured it within its limit: it
    works on the rendered HTML, so no source is needed. Cuts at the last line end (else space)
    in the second half of the budget, else at the budget; tags open at a cut are closed at
    the end of the piece and opened again at the start of the next. Blank pieces are left out.
    Raises ValueError when ``limit`` < 1.
    """
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    # (token, visible text, open tags before it) for every token of the input
    atoms: list[tuple[str, str, tuple[str, ...]]] = []
    stack: list[tuple[str, str]] = []  # (tag name, opening tag text)
    for m in _TG_TOKEN_RE.finditer(html_text):
        token = m.group(0)
        opened = tuple(t for _, t in stack)
        if m.group(2):
            name = m.group(2).lower()
            if m.group(1):
                if stack and stack[-1][0] == name:
                    stack.pop()
            else:
                stack.append((name, token))
            atoms.append((token, "", opened))
        else:
            atoms.append((token, html.unescape(token), opened))

    def close(opened: tuple[str, ...]) -> str:
        names = [_TG_TOKEN_RE.match(t).group(2) for t in opened]  # type: ignore[union-attr]
        return "".join(f"</{n}>" for n in reversed(names))

    pieces: list[str] = []
    start = 0
    while start < len(atoms):
        used, end, soft = 0, start, -1
        while end < len(atoms):
            size = utf16_len(atoms[end][1])
            if used + size > limit:
                break
            used += size
            if atoms[end][1] in ("\n", " ") and used * 2 >= limit:
                soft = end + 1  # cut after this line end or space
            end += 1
        if end < len(atoms):
            if end == start:
                end = start + 1  # one character wider than the limit: it still has to go
            elif soft > start:
                end = soft
        head = "".join(atoms[start][2])
        body = "".join(a[0] for a in atoms[start:end])
        tail_open = atoms[end][2] if end < len(atoms) else ()
        piece = head + body + close(tail_open)
        if strip_telegram_html(piece).strip():
            pieces.append(piece)
        start = end
    return pieces


# ---------------------------------------------------------------------------------------------
# Slack mrkdwn

_BACKTICK_RUN_RE = re.compile(r"`{3,}")


def unclosable(code: str) -> str:
    """``code`` with a zero-width space between the backticks of every run of three or more.
    Slack's and Discord's code blocks end at the first three backticks, whatever opened
    them; the space keeps the text as it reads while no run can end the block (an approval
    question shows a zero-width space of its own text as ``⟨U+200B⟩``, so the two never look
    alike)."""
    return _BACKTICK_RUN_RE.sub(lambda m: "\u200b".join(m.group()), code)


_SLACK_MARKS = {"b": "*", "i": "_", "s": "~"}
_SLACK_SCHEMES = ("http://", "https://", "mailto:")


def _slack_url(url: str) -> str:
    return url.replace(" ", "%20").replace("<", "%3C").replace(">", "%3E").replace("|", "%7C")


def _slack_nodes(
    nodes: tuple[_Node, ...] | list[_Node], open_kinds: frozenset[str] = frozenset()
) -> str:
    out: list[str] = []
    for node in nodes:
        if isinstance(node, _Str):
            out.append(_esc(node.text))
        elif isinstance(node, _CodeSpan):
            out.append(f"`{_esc(node.text)}`")
        elif isinstance(node, _Link):
            label = _plain_nodes(node.children)
            url = node.url.strip()
            if url.lower().startswith(_SLACK_SCHEMES):
                out.append(
                    f"<{_slack_url(url)}|{_esc(label)}>" if label != url else f"<{_slack_url(url)}>"
                )
            else:
                out.append(_esc(label if label == url else f"{label} ({url})"))
        else:
            inner = _slack_nodes(node.children, open_kinds | {node.kind})
            mark = _SLACK_MARKS[node.kind]
            out.append(inner if node.kind in open_kinds else f"{mark}{inner}{mark}")
    return "".join(out)


def _slack_line(line: str) -> str:
    if _HR_RE.match(line):
        return _RULE
    if (m := _HEADING_RE.match(line)) is not None:
        title = m[2] or ""
        return f"*{_slack_nodes(_parse_inline(title), frozenset('b'))}*" if title else ""
    if (m := _BULLET_RE.match(line)) is not None:
        return f"{m[1]}• {_slack_nodes(_parse_inline(m[2]))}"
    if (inner := _unquote(line)) is not None:
        return f"> {_slack_line(inner)}" if inner.strip() else ">"
    return _slack_nodes(_parse_inline(line))


def markdown_to_slack_mrkdwn(md: str) -> str:
    """Markdown to Slack mrkdwn: ``*bold*``, ``_italic_``, ``~strike~``, ``<url|text>``,
    headings as bold lines, bullets "• ", code spans and fences kept (fences without their
    language tag), tables as an aligned code block, ``&``/``<``/``>`` escaped outside the
    ``<url|text>`` brackets (in a URL, ``<``/``>``/``|``/space are percent-encoded).
    """
    out: list[str] = []
    for block in _blocks(md):
        if isinstance(block, _Fenced):
            out.append("```\n" + unclosable(_esc("\n".join(block.lines))) + "\n```")
        elif isinstance(block, _Table):
            out.append("```\n" + _esc(_aligned_table(block)) + "\n```")
        else:
            out.append(_slack_line(block.line))
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# Discord

_MASS_MENTION_RE = re.compile(r"@(everyone|here)")


def _discord_fenced(block: _Fenced) -> list[str]:
    """A fenced block as Discord reads it. Discord knows only three-backtick fences, and its
    blocks end at the first three backticks, whatever opened them: a block holding such a
    run, or opened by a longer fence (CommonMark lets a fence outgrow its content's runs), is
    written again with three and its runs made ``unclosable``; any other stays as written."""
    opened = _fence_open(block.raw[0])
    inner = "\n".join(block.lines)
    longer = opened is not None and opened.fence[0] == "`" and opened.fence != "```"
    if longer or "```" in inner:
        return [f"```{block.lang}", unclosable(inner), "```"]
    return list(block.raw)


def markdown_to_discord(md: str) -> str:
    """Markdown for Discord, which renders most of it itself.

    Headings deeper than ### become bold lines, tables an aligned code block, and every
    ``@everyone``/``@here`` (code included) gets a zero-width space after the ``@`` so the bot
    can never mass-ping. Everything else, fenced code included, is kept as written.
    """
    out: list[str] = []
    for block in _blocks(md):
        if isinstance(block, _Fenced):
            out.extend(_discord_fenced(block))
        elif isinstance(block, _Table):
            out.append("```\n" + _aligned_table(block) + "\n```")
        elif (m := _HEADING_RE.match(block.line)) is not None and len(m[1]) > 3:
            out.append(f"**{m[2]}**" if m[2] else "")
        else:
            out.append(block.line)
    return _MASS_MENTION_RE.sub("@\u200b\\1", "\n".join(out))


# ---------------------------------------------------------------------------------------------
# Plain text


def _plain_line(line: str) -> str:
    if _HR_RE.match(line):
        return _RULE
    if (m := _HEADING_RE.match(line)) is not None:
        return _plain_inline(m[2] or "")
    if (m := _BULLET_RE.match(line)) is not None:
        return f"{m[1]}• {_plain_inline(m[2])}"
    if (inner := _unquote(line)) is not None:
        return f"> {_plain_line(inner)}" if inner.strip() else ">"
    return _plain_inline(line)


def strip_markdown(md: str) -> str:
    """Markdown as plain text, for when a platform rejects our markup: emphasis markers
    removed, code kept without its fences or backticks, links as "text (url)", headings as
    plain lines, bullets "• ", tables aligned, "> " quotes kept.
    """
    out: list[str] = []
    for block in _blocks(md):
        if isinstance(block, _Fenced):
            out.extend(block.lines)
        elif isinstance(block, _Table):
            out.append(_aligned_table(block))
        else:
            out.append(_plain_line(block.line))
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# Terminal: ANSI escape sequences (SGR)

# C0 controls but tab and line feed, DEL and C1 controls. ESC (and C1's CSI) starts every escape
# sequence: text from the model (which a web page may have steered) must not move the cursor,
# retitle the window or rewrite the screen; a carriage return could overwrite what is shown.
# C0 but tab and line feed, DEL, C1; and the bidi embeddings, overrides and isolates, which
# can make a terminal show a command in another order than it runs.
_CONTROL_RE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_SGR_CODES = {"b": "1", "dim": "2", "i": "3", "u": "4", "s": "9", "code": "36"}
SGR_RESET = "\x1b[0m"
TAB_SIZE = 8
_TERM_RULE = "─" * 24


def strip_controls(text: str) -> str:
    """``text`` without the characters a terminal would act on instead of showing: C0
    controls other than tab and line feed (so ESC and carriage return), DEL, C1 controls and
    the bidi overrides. Printable text is kept as it is; one character at a time, so the
    cleaned text of a prefix is a prefix of the cleaned text."""
    return _CONTROL_RE.sub("", text)


def _sgr(styles: frozenset[str]) -> str:
    # Every change resets first and sets the whole style again: nested styles then end
    # correctly whatever closes first (a "bold off" would also end dim).
    return "\x1b[" + ";".join(["0", *(_SGR_CODES[k] for k in sorted(styles))]) + "m"


def _ansi_segments(
    nodes: tuple[_Node, ...] | list[_Node],
    styles: frozenset[str],
    out: list[tuple[str, frozenset[str]]],
) -> None:
    for node in nodes:
        if isinstance(node, _Str):
            out.append((node.text, styles))
        elif isinstance(node, _CodeSpan):
            out.append((node.text, styles | {"code"}))
        elif isinstance(node, _Link):
            url = node.url.strip()
            _ansi_segments(node.children, styles | {"u"}, out)
            if _plain_nodes(node.children) != url:
                out.append((f" ({url})", (styles - {"u"}) | {"dim"}))
        else:
            _ansi_segments(node.children, styles | {node.kind}, out)


def _ansi_inline(text: str, styles: frozenset[str] = frozenset()) -> str:
    segments: list[tuple[str, frozenset[str]]] = []
    _ansi_segments(_parse_inline(text), styles, segments)
    out: list[str] = []
    current: frozenset[str] = frozenset()
    for chunk, style in segments:
        if not chunk:
            continue
        if style != current:
            out.append(_sgr(style) if style else SGR_RESET)
            current = style
        out.append(chunk)
    if current:
        out.append(SGR_RESET)
    return "".join(out)


def _styled(text: str, *styles: str) -> str:
    return f"{_sgr(frozenset(styles))}{text}{SGR_RESET}" if text else ""


def _ansi_line(line: str) -> str:
    if _HR_RE.match(line):
        return _styled(_TERM_RULE, "dim")
    if (m := _HEADING_RE.match(line)) is not None:
        title = m[2] or ""
        return _ansi_inline(title, frozenset({"b", "u"} if len(m[1]) == 1 else {"b"}))
    if (m := _BULLET_RE.match(line)) is not None:
        return f"{m[1]}{_styled('•', 'b')} {_ansi_inline(m[2])}"
    if (quoted := _quote_depth(line)) is not None:
        inner, depth = quoted
        bar = "│ " * depth
        return (
            _styled(bar, "dim") + _ansi_line(inner) if inner.strip() else _styled(bar[:-1], "dim")
        )
    return _ansi_inline(line)


def _ansi_block(block: _Block) -> list[str]:
    if isinstance(block, _Table):
        header, rule, *rows = _aligned_table(block).split("\n")
        return [_styled(header, "b"), _styled(rule, "dim"), *rows]
    if isinstance(block, _Text):
        return [_ansi_line(block.line)]
    # Whole fenced blocks only come from the held lines of a table candidate, never here.
    raise TypeError(f"not a table or text line: {block!r}")


class AnsiMarkdown:
    """Markdown to ANSI for a terminal, one complete line at a time, so that an answer can be
    rendered while it is written.

    ``feed`` takes the next line (without its line end) and returns the rendered lines that
    are now final; a line that may be a table's header is held until the next line says, and a
    table until it ends (its columns are aligned over all its rows). ``finish`` renders what is
    held at the end of the text. ``markdown_to_ansi`` is the same over a whole text, so a
    streamed answer ends up rendered exactly as the whole would be.

    Styles: headings bold (level 1 also underlined), ``**bold**``, ``*italic*``,
    ``~~strike~~``, code spans and fenced code in cyan (the code indented by four, under a dim
    label with the fence's language), bullets "•", quotes behind a dim bar per level, links as
    the underlined text then the URL dimmed, tables aligned with a bold header, rules dimmed.
    Every word of the input is kept; markers that do not pair (``**bold without end``) stay
    literal; control characters are removed (``strip_controls``).
    """

    __slots__ = ("_fence", "_held")

    def __init__(self) -> None:
        self._fence: _FenceOpen | None = None
        self._held: list[str] = []  # a possible table: its first line, then its rows

    @property
    def held(self) -> int:
        """How many lines were fed and are not rendered yet."""
        return len(self._held)

    def feed(self, line: str) -> list[str]:
        # Tabs as spaces: a terminal's tab stops would count from the rendered line's start.
        line = strip_controls(line).expandtabs(TAB_SIZE)
        out: list[str] = []
        if self._fence is not None:
            if _fence_closes(line, self._fence.fence):
                self._fence = None
                out.append(_styled("  ──", "dim"))
            else:
                out.append("    " + _styled(_code_line(line, self._fence), "code"))
            return out
        if self._held:
            # The same decisions as _blocks over the whole text: a header line and its
            # separator open a table, which goes on while lines hold a "|".
            if len(self._held) == 1 and _starts_table(self._held[0], line):
                self._held.append(line)
                return out
            if len(self._held) > 1 and "|" in line and line.strip():
                self._held.append(line)
                return out
            out.extend(self._flush())
        if (opened := _fence_open(line)) is not None:
            self._fence = opened
            info = _FENCE_OPEN_RE.match(line)[3].strip()  # type: ignore[index]
            out.append(_styled(f"  ── {info}" if info else "  ──", "dim"))
        elif "|" in line:
            self._held.append(line)
        else:
            out.append(_ansi_line(line))
        return out

    def finish(self) -> list[str]:
        """The end of the text: render the held lines (an unclosed code block just ends)."""
        self._fence = None
        return self._flush()

    def _flush(self) -> list[str]:
        blocks = _blocks("\n".join(self._held)) if self._held else []
        self._held.clear()
        return [line for block in blocks for line in _ansi_block(block)]


def markdown_to_ansi(md: str) -> str:
    """Markdown as text for a terminal with SGR escape sequences (see ``AnsiMarkdown``), one
    output line per input line except fences (a label line each). Control characters of the
    input never reach the output."""
    renderer = AnsiMarkdown()
    out: list[str] = []
    for line in md.replace("\r\n", "\n").split("\n"):
        out.extend(renderer.feed(line))
    out.extend(renderer.finish())
    return "\n".join(out)
