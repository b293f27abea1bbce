"""Markdown for a terminal: the ANSI back end of channels.formatting, and the live region of
channels.terminal_channel.live that shows an answer rendered while it is written (checked on a VT100
screen in memory, pyte)."""

from __future__ import annotations

import io
import random
import re

import pyte
import pytest

from channels.formatting import AnsiMarkdown, markdown_to_ansi, strip_controls
from channels.terminal_channel.live import LiveMarkdown, cursor_rows
from tests.helpers.terminal import SGR_RE, XtermScreen, plain, screen_after

BOLD, ITALIC, UNDERLINE, STRIKE, DIM, CODE = "1", "3", "4", "9", "2", "36"


def styled_runs(rendered: str) -> list[tuple[str, set[str]]]:
    """(text, SGR codes in force) for each run of text between escape sequences."""
    runs: list[tuple[str, set[str]]] = []
    codes: set[str] = set()
    pos = 0
    for m in SGR_RE.finditer(rendered + "\x1b[0m"):
        if m.start() > pos:
            runs.append((rendered[pos : m.start()], set(codes)))
        params = [p for p in m[0][2:-1].split(";") if p]
        codes = set() if not params or params[0] == "0" else codes
        codes |= {p for p in params if p != "0"}
        pos = m.end()
    return runs


def style_of(rendered: str, text: str) -> set[str]:
    """The SGR codes in force over ``text`` (one run must contain it)."""
    for run, codes in styled_runs(rendered):
        if text in run:
            return codes
    raise AssertionError(f"{text!r} is not one styled run of {rendered!r}")


def words(text: str) -> list[str]:
    return re.findall(r"[^\W_]+", text)  # letters and digits: "_" may be a marker


def assert_only_sgr(rendered: str) -> None:
    """The only escape sequences are SGR, and no other control character is left."""
    rest = SGR_RE.sub("", rendered)
    assert re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", rest) is None, repr(rest)


# --- each construct --------------------------------------------------------------------------


def test_emphasis_code_and_strike_get_their_styles():
    out = markdown_to_ansi("a **bold** b *it* c `x = 1` d ~~gone~~ e")
    assert style_of(out, "bold") == {BOLD}
    assert style_of(out, "it") == {ITALIC}
    assert style_of(out, "x = 1") == {CODE}
    assert style_of(out, "gone") == {STRIKE}
    assert plain(out) == "a bold b it c x = 1 d gone e"


def test_nested_emphasis_keeps_the_outer_style_after_the_inner_ends():
    out = markdown_to_ansi("**a *b* c** d")
    assert style_of(out, "a ") == {BOLD}
    assert style_of(out, "b") == {BOLD, ITALIC}
    assert style_of(out, " c") == {BOLD}
    assert style_of(out, " d") == set()


def test_headings_are_bold_and_the_first_level_underlined():
    out = markdown_to_ansi("# Top\n## Second *it*\nbody")
    lines = out.split("\n")
    assert plain(lines[0]) == "Top" and style_of(lines[0], "Top") == {BOLD, UNDERLINE}
    assert plain(lines[1]) == "Second it"
    assert style_of(lines[1], "Second ") == {BOLD}
    assert style_of(lines[1], "it") == {BOLD, ITALIC}
    assert lines[2] == "body"


def test_fenced_code_is_indented_coloured_and_labelled_with_its_language():
    md = "before\n```python\ndef f():\n    return '**not bold**'\n```\nafter"
    lines = markdown_to_ansi(md).split("\n")
    assert plain(lines[1]).strip() == "── python" and style_of(lines[1], "python") == {DIM}
    assert plain(lines[2]) == "    def f():" and style_of(lines[2], "def f():") == {CODE}
    assert plain(lines[3]) == "        return '**not bold**'"  # code is never Markdown
    assert style_of(lines[3], "return '**not bold**'") == {CODE}
    assert plain(lines[4]).strip() == "──"
    assert lines[0] == "before" and lines[5] == "after"


def test_lists_get_bullets_and_keep_their_nesting():
    lines = markdown_to_ansi("- one\n  * two **b**\n+ three\n1. first").split("\n")
    assert [plain(line) for line in lines] == ["• one", "  • two b", "• three", "1. first"]
    assert style_of(lines[1], "b") == {BOLD}


def test_block_quotes_get_a_bar_per_level():
    lines = markdown_to_ansi("> quoted *it*\n>> deeper\n>\n> - a bullet").split("\n")
    assert [plain(line) for line in lines] == ["│ quoted it", "│ │ deeper", "│", "│ • a bullet"]
    assert style_of(lines[0], "│ ") == {DIM}


def test_links_are_underlined_text_then_the_url_dimmed():
    out = markdown_to_ansi("see [the docs](https://ex.org/a_(b)) and <https://ex.org/x>")
    assert plain(out) == "see the docs (https://ex.org/a_(b)) and https://ex.org/x"
    assert style_of(out, "the docs") == {UNDERLINE}
    assert style_of(out, " (https://ex.org/a_(b))") == {DIM}
    assert style_of(out, "https://ex.org/x") == {UNDERLINE}  # text and URL alike: once


def test_tables_are_aligned_by_display_width_with_a_bold_header():
    md = "| name | note |\n|---|:-:|\n| 中文 | **x** |\n| emoji 😀 | y |\nafter"
    lines = markdown_to_ansi(md).split("\n")
    assert [plain(line) for line in lines] == [
        "name     | note",
        "---------+-----",
        "中文     | x",
        "emoji 😀 | y",
        "after",
    ]
    assert style_of(lines[0], "name     | note") == {BOLD}


def test_a_rule_is_a_dim_line():
    out = markdown_to_ansi("a\n\n---\nb")
    assert plain(out.split("\n")[2]) == "─" * 24


# --- control characters ----------------------------------------------------------------------


HOSTILE = [
    "\x1b[2J\x1b[H cleared",  # erase the screen, cursor home
    "\x1b]0;owned\x07 title",  # OSC: window title
    "\x1b]8;;https://evil.example\x1b\\link\x1b]8;;\x1b\\",  # an OSC 8 hyperlink
    "\x9b31m C1 CSI",  # the one-byte CSI
    "safe\rEVIL overwrite",  # carriage return rewrites the line
    "bell\x07 del\x7f nul\x00",
    "**bold \x1b[5mblink** and `code \x1b[8m`",
    "```\ncode \x1b[?1049h alt screen\n```",
    "| a \x1b[31m | b |\n|---|---|\n| \x1bc | d |",
]


@pytest.mark.parametrize("text", HOSTILE)
def test_no_control_character_from_the_model_reaches_the_terminal(text):
    out = markdown_to_ansi(text)
    assert_only_sgr(out)
    # Every SGR in the output is one of ours: none carries a code the renderer never uses.
    for m in SGR_RE.finditer(out):
        assert set(m[0][2:-1].split(";")) <= {"0", BOLD, ITALIC, UNDERLINE, STRIKE, DIM, CODE}
    for word in words(strip_controls(text)):
        assert word in plain(out)


def test_strip_controls_keeps_printable_text_tabs_and_line_ends():
    assert strip_controls("a\tb\nc\x1b[1md\re\x9bf") == "a\tb\nc[1mdef"
    assert strip_controls("中文 😀 é\u200d") == "中文 😀 é\u200d"
    # Bidi overrides and isolates could show a command in another order than it runs.
    assert strip_controls("rm -rf \u202e/ tsil\u202c \u2067x\u2069") == "rm -rf / tsil x"


# --- no text lost ----------------------------------------------------------------------------


ODD = [
    "```python\nnever closed\n**still code**",
    "~~~\ntilde fence\n```\nnot a close\n~~~",
    "**bold *italic** wrong order*",
    "***both*** and ___under___ and **__mixed__**",
    "unclosed **bold and *it and `tick",
    "a * b * c and 2*3*4 and snake_case_name",
    "\\*escaped\\* \\`tick\\` \\[not link\\](x)",
    "[label](not closed and [x]() and ![img](http://i.png)",
    "| only | a | pipe line",
    "| head |\n| no separator |",
    "|a|b|\n|-|-|\n|1|2|3|\n\n|x|",
    "> > > deep **quote**\n>",
    "# \n#\n####### seven",
    "- \n-\n* * *\n- [ ] task\n- [x] done",
    "x" * 100_000,
    "word " * 20_000 + "**end**",
    "中文字符 **加粗** 和 `代码` 😀👩‍👩‍👧 🇫🇷 e\u0301",
    "<b>html</b> &amp; &lt;tags&gt; @everyone",
    "\U000f0001 placeholder range \U000f0002 **b**",
    "\n\n\nleading and trailing\n\n\n",
    "tab\tseparated\tvalues\n\tindented",
    "`` code with ` inside `` and ``` triple ``` inline",
    "**" * 500 + "x" + "__" * 500,
    "http://example.com/path_(with)_parens_and_*stars* done",
]


def fuzz_inputs(count: int) -> list[str]:
    rng = random.Random(20)
    pieces = [
        "**",
        "*",
        "_",
        "__",
        "~~",
        "`",
        "```",
        "\n",
        "> ",
        "- ",
        "# ",
        "|",
        "---",
        "[",
        "](",
        ")",
        "<",
        ">",
        "\\",
        " ",
        "word",
        "中文",
        "😀",
        "http://x.y/z",
        "\t",
        "1. ",
    ]
    return ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 60))) for _ in range(count)]


def assert_every_word_shown(text: str) -> None:
    out = markdown_to_ansi(text)
    assert_only_sgr(out)
    shown = plain(out)
    missing = [w for w in set(words(text)) if w not in shown]
    assert not missing, (text[:200], missing)


@pytest.mark.parametrize("text", ODD)
def test_every_word_of_an_odd_answer_is_on_screen(text):
    assert_every_word_shown(text)


def test_every_word_of_random_markdown_is_on_screen():
    for text in fuzz_inputs(400):
        assert_every_word_shown(text)


def test_odd_markdown_falls_back_to_the_literal_text():
    assert markdown_to_ansi("unclosed **bold and *it") == "unclosed **bold and *it"
    assert markdown_to_ansi("2 * 3 * 4 = 24") == "2 * 3 * 4 = 24"
    assert plain(markdown_to_ansi("```\nnever closed")) == "  ──\n    never closed"


# --- line at a time --------------------------------------------------------------------------


def test_a_line_with_a_pipe_waits_for_the_next_to_know_whether_a_table_starts():
    r = AnsiMarkdown()
    assert r.feed("a | b") == [] and r.held == 1
    assert r.feed("--|--") == [] and r.held == 2
    assert r.feed("1 | 2") == [] and r.held == 3
    out = r.feed("after")
    assert [plain(x) for x in out] == ["a | b", "--+--", "1 | 2", "after"] and r.held == 0
    assert r.feed("x | y") == [] and [plain(x) for x in r.feed("not a separator")] == [
        "x | y",
        "not a separator",
    ]
    assert r.feed("last | held") == [] and [plain(x) for x in r.finish()] == ["last | held"]


def test_line_at_a_time_renders_as_the_whole_text():
    for text in ODD[:14] + fuzz_inputs(100):
        r = AnsiMarkdown()
        out: list[str] = []
        for line in text.split("\n"):
            out.extend(r.feed(line))
        out.extend(r.finish())
        assert "\n".join(out) == markdown_to_ansi(text), text


# --- the live region on a screen -------------------------------------------------------------


def stream_live(text: str, columns: int, step: int = 1) -> str:
    """Feed ``text`` to a LiveMarkdown ``step`` characters at a time, then finish; returns
    what was written to the terminal."""
    out = io.StringIO()
    live = LiveMarkdown(out, lambda: columns)
    for end in range(step, len(text) + step, step):
        live.write(text[:end])
    live.finish()
    return out.getvalue()


ANSWER = (
    "# Plan\n"
    "Some **bold** words and a *long* line that goes on well past the edge of a narrow "
    "terminal, with `code` and a [link](https://example.org/some/long/path) in it.\n"
    "中文字符很宽，会提前换行。😀😀😀😀😀 **完**\n"
    "\n"
    "| col | other |\n"
    "|-----|-------|\n"
    "| 1 | **two** |\n"
    "| 三 | 4 |\n"
    "\n"
    "```sh\n"
    "echo '**raw**'\tand a tab\n"
    "```\n"
    "> a quote with **bold** that wraps across the terminal's right margin at least once\n"
    "- last *item*"
)


@pytest.mark.parametrize("columns", [80, 23, 17, 10])
@pytest.mark.parametrize("step", [1, 7])
def test_what_is_left_on_screen_is_the_rendered_answer(columns, step):
    written = stream_live(ANSWER, columns, step)
    expected = screen_after(markdown_to_ansi(ANSWER) + "\n", columns)
    assert screen_after(written, columns) == expected
    assert "**" not in "".join(line for line in expected if "raw" not in line)


@pytest.mark.parametrize("text", ["ends in a table\n| a | b |\n|--|--|\n| 中 | 2 |", "a | b"])
def test_lines_held_at_the_end_are_rendered_when_the_answer_ends(text):
    written = stream_live(text, 30, 4)
    assert screen_after(written, 30) == screen_after(markdown_to_ansi(text) + "\n", 30)


def test_text_shows_as_it_arrives_before_its_line_is_complete():
    out = io.StringIO()
    live = LiveMarkdown(out, lambda: 40)
    live.write("Hello **wor")
    assert out.getvalue() == "Hello **wor"  # raw at once, no escape sequence
    live.write("Hello **world** and")
    assert out.getvalue() == "Hello **world** and" and live.mid_line
    live.write("Hello **world** and more\nNext")
    assert screen_after(out.getvalue(), 40)[:2] == ["Hello world and more", "Next"]
    live.finish()
    assert not live.mid_line


def test_a_streamed_answer_with_unclosed_markdown_ends_as_its_literal_text():
    written = stream_live("one **open\n```\ncode never closed", 30, 3)
    assert screen_after(written, 30)[:4] == ["one **open", "  ──", "    code never closed", ""]


def test_cursor_rows_follow_the_terminals_wrapping():
    assert cursor_rows("", 10) == 0
    assert cursor_rows("x" * 10, 10) == 0  # the last column filled: the wrap is deferred
    assert cursor_rows("x" * 11, 10) == 1
    assert cursor_rows("a\nb\n", 10) == 2
    assert cursor_rows("x" * 10 + "\n", 10) == 1
    assert cursor_rows("x" * 9 + "中", 10) == 1  # a wide character does not split: it wraps
    assert cursor_rows("中" * 5, 10) == 0
    assert cursor_rows("e\u0301" * 10, 10) == 0  # combining accents take no cell


def test_the_screen_above_the_answer_is_untouched():
    before = "you> question\n"
    written = stream_live(ANSWER, 17, 5)
    shown = screen_after(before + written, 17)
    assert shown[0] == "you> question"
    assert shown[1:] == screen_after(markdown_to_ansi(ANSWER) + "\n", 17)[:-1]


def test_redraws_stay_right_while_the_screen_scrolls():
    columns, rows = 23, 12
    written = stream_live(ANSWER, columns, 3)
    screen = XtermScreen(columns, rows)
    pyte.Stream(screen).feed(written.replace("\n", "\r\n"))
    shown = [line.rstrip() for line in screen.display]
    while shown and not shown[-1]:
        shown.pop()
    whole = screen_after(markdown_to_ansi(ANSWER), columns, 200)
    while whole and not whole[-1]:
        whole.pop()
    assert len(shown) > rows // 2 and shown == whole[-len(shown) :]


def test_random_markdown_streamed_in_random_pieces_ends_rendered_on_screen():
    rng = random.Random(12)
    for text in fuzz_inputs(60):
        columns, step = rng.randint(6, 40), rng.randint(1, 9)
        written = stream_live(text, columns, step)
        expected = screen_after(markdown_to_ansi(text) + "\n", columns, 400)
        assert screen_after(written, columns, 400) == expected, (text, columns, step)


@pytest.mark.parametrize("columns", [80, 13])
def test_an_erased_reply_leaves_the_screen_as_before_it(columns):
    """A retried request starts its reply again: rendered lines, wrapped ones and the live
    region all go, the screen above stays."""
    out = io.StringIO()
    out.write("you> question\n")
    live = LiveMarkdown(out, lambda: columns)
    cut = ANSWER[: ANSWER.index("| 1 |")]  # headings, wide text, a table's head held
    for end in range(5, len(cut), 5):
        live.write(cut[:end])
    live.erase()
    again = LiveMarkdown(out, lambda: columns)
    again.write("**Second** try")
    again.finish()
    expected = screen_after("you> question\n" + markdown_to_ansi("**Second** try") + "\n", columns)
    assert screen_after(out.getvalue(), columns) == expected
