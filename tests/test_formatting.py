"""channels.formatting: splitting to platform limits and rendering Markdown dialects."""

from __future__ import annotations

import html
import random
import re
from html.parser import HTMLParser

import pytest

from channels.formatting import (
    DISCORD_LIMIT,
    SLACK_LIMIT,
    TELEGRAM_LIMIT,
    markdown_to_discord,
    markdown_to_slack_mrkdwn,
    markdown_to_telegram_html,
    render_chunks,
    split_markdown,
    split_telegram_html,
    strip_markdown,
    strip_telegram_html,
    telegram_length,
    utf16_len,
)
from tests.fakes.telegram_api import html_problem

LIMITS = [TELEGRAM_LIMIT, DISCORD_LIMIT, SLACK_LIMIT]
FENCE_LINE = re.compile(r"^\s*(`{3,}|~{3,})")


def test_limits_are_the_platforms():
    assert (TELEGRAM_LIMIT, DISCORD_LIMIT, SLACK_LIMIT) == (4096, 2000, 3900)


# --- helpers ---------------------------------------------------------------------------------


def fences_balanced(piece: str) -> bool:
    """True when every fence opened in the piece is closed in it."""
    open_fence: str | None = None
    for line in piece.split("\n"):
        m = FENCE_LINE.match(line)
        if not m:
            continue
        run = m[1]
        if open_fence is None:
            if run[0] == "`" and "`" in line.strip()[len(run) :]:
                continue
            open_fence = run
        elif line.strip() == open_fence[0] * len(line.strip()) and len(run) >= len(open_fence):
            open_fence = None
    return open_fence is None


def code_contents(text: str) -> list[str]:
    """The content of each fenced block (text between the fence lines, newline included)."""
    blocks: list[str] = []
    current: list[str] | None = None
    for line in text.split("\n"):
        if FENCE_LINE.match(line):
            if current is None:
                current = []
            else:
                blocks.append("".join(f"{ln}\n" for ln in current))
                current = None
        elif current is not None:
            current.append(line)
    if current is not None:
        blocks.append("".join(f"{ln}\n" for ln in current))
    return blocks


def squeeze(text: str) -> str:
    """Text without fence lines and without whitespace: what a split must keep, in order."""
    kept = [ln for ln in text.split("\n") if not FENCE_LINE.match(ln)]
    return re.sub(r"\s+", "", "\n".join(kept))


def check_pieces(text: str, pieces: list[str], limit: int) -> None:
    assert pieces, "non-blank text gives at least one piece"
    for piece in pieces:
        assert 0 < len(piece) <= limit, (len(piece), limit)
        assert piece.strip(), "no blank pieces"
        assert fences_balanced(piece), piece[-200:]
    assert squeeze("".join(f"{p}\n" for p in pieces)) == squeeze(text)


def long_markdown(seed: int) -> str:
    rnd = random.Random(seed)
    words = ["alpha", "beta", "gamma", "δέλτα", "日本語", "emoji👍🏽", "snake_case", "x" * 12]
    parts: list[str] = []
    for _ in range(60):
        kind = rnd.random()
        if kind < 0.45:
            parts.append(" ".join(rnd.choice(words) for _ in range(rnd.randint(5, 120))))
        elif kind < 0.6:  # a paragraph of many short lines
            parts.append("\n".join(f"- item {k} {rnd.choice(words)}" for k in range(30)))
        elif kind < 0.7:  # one very long line
            parts.append(" ".join(rnd.choice(words) for _ in range(900)))
        elif kind < 0.75:  # a token longer than any limit
            parts.append("z" * rnd.randint(4500, 10_000))
        else:
            lang = rnd.choice(["python", "", "js"])
            body = "\n".join(
                f"    line_{k} = {k} * 2  # {rnd.choice(words)}" for k in range(rnd.randint(5, 200))
            )
            parts.append(f"```{lang}\n{body}\n```")
    return "\n\n".join(parts)


# --- split_markdown ------------------------------------------------------------------------


def test_short_text_unchanged_and_blank_text_empty():
    text = "  Hello **world**\n\n```py\nx = 1\n```\n"
    assert split_markdown(text, 4096) == [text]
    assert split_markdown("", 10) == []
    assert split_markdown(" \n\t\n ", 1) == []
    assert split_markdown("x" * 10, 10) == ["x" * 10]


def test_limit_must_be_positive():
    with pytest.raises(ValueError):
        split_markdown("text", 0)


@pytest.mark.parametrize("limit", LIMITS)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_long_text_fits_every_limit(limit, seed):
    text = long_markdown(seed)
    assert len(text) > 5 * limit
    check_pieces(text, split_markdown(text, limit), limit)


@pytest.mark.parametrize("limit", LIMITS)
def test_code_spanning_splits_is_closed_reopened_and_preserved(limit):
    body = "".join(f"    value_{k} = compute({k}, 'ąę')  # step {k}\n" for k in range(400))
    text = f"Intro paragraph.\n\n```python\n{body}```\n\nAfter the code."
    pieces = split_markdown(text, limit)
    check_pieces(text, pieces, limit)
    code_pieces = [p for p in pieces if "value_" in p]
    assert len(code_pieces) > 1
    for piece in code_pieces:  # each piece reopens with the same fence and language
        assert piece.split("\n")[0] in ("```python", "Intro paragraph.")
        assert ("```python\n" in piece and piece.rstrip().endswith("```")) or "After" in piece
    # Lines fit, so the cut is at line ends and the code comes back byte for byte.
    assert "".join(c for p in pieces for c in code_contents(p)) == body


def test_code_line_longer_than_limit_is_cut_and_kept():
    body = "data = '" + "ab cd" * 900 + "'\nnext_line()\n"
    text = f"```js\n{body}```"
    pieces = split_markdown(text, 1000)
    check_pieces(text, pieces, 1000)
    assert all(p.startswith("```js\n") and p.endswith("```") for p in pieces)
    joined = "".join(c for p in pieces for c in code_contents(p))
    assert joined.replace("\n", "") == body.replace("\n", "")  # spaces kept, only \n added


def test_added_fences_count_toward_the_limit():
    text = "```python\n" + "a\n" * 100 + "```"
    for limit in (20, 21, 30, 57):
        pieces = split_markdown(text, limit)
        check_pieces(text, pieces, limit)
        assert all(p.startswith("```python\n") and p.endswith("\n```") for p in pieces)


def test_unclosed_fence_is_closed_in_every_piece():
    text = "Answer:\n\n```sh\n" + "echo hi\n" * 300
    pieces = split_markdown(text, 500)
    check_pieces(text, pieces, 500)
    assert pieces[-1].endswith("```")


def test_tilde_fence_and_longer_backtick_fence():
    text = "~~~\n" + "x ```\n" * 200 + "~~~\n\n````md\n```\ninner\n```\n" + "y\n" * 300 + "````"
    pieces = split_markdown(text, 300)
    check_pieces(text, pieces, 300)
    assert any(p.startswith("~~~\n") for p in pieces[1:])
    assert any(p.startswith("````md\n") for p in pieces[1:])


def test_paragraph_boundary_preferred_over_line_and_word():
    text = "A" * 50 + "\n\n" + "B" * 20 + "\n" + "C" * 20 + " " + "D" * 30
    assert split_markdown(text, 100)[0] == "A" * 50


def test_line_boundary_preferred_over_word():
    text = "A" * 30 + " " + "B" * 20 + "\n" + "C" * 20 + " " + "D" * 40
    pieces = split_markdown(text, 90)
    assert pieces == ["A" * 30 + " " + "B" * 20, "C" * 20 + " " + "D" * 40]


def test_packs_paragraphs_up_to_the_limit():
    paras = [f"para {k} " + "w " * 40 for k in range(50)]
    text = "\n\n".join(p.strip() for p in paras)
    pieces = split_markdown(text, 1000)
    check_pieces(text, pieces, 1000)
    assert all(len(p) > 1000 - 100 for p in pieces[:-1])  # full, not one paragraph each
    assert all(re.match(r"para \d+ w", p) for p in pieces)  # cut only between paragraphs


def test_word_boundary_before_hard_cut():
    words = [f"word{k}" for k in range(2000)]
    text = " ".join(words)
    pieces = split_markdown(text, 500)
    check_pieces(text, pieces, 500)
    assert " ".join(pieces).split(" ") == words


def test_hard_cut_for_a_token_longer_than_the_limit():
    text = "x" * 10_000
    pieces = split_markdown(text, DISCORD_LIMIT)
    assert [len(p) for p in pieces] == [2000] * 5
    assert "".join(pieces) == text


def test_unicode_and_emoji_are_never_split_inside_a_character():
    family, thumbs, flag = "👨\u200d👩\u200d👧\u200d👦", "👍🏽", "🇺🇦"
    accent = "e\u0301"
    text = (family + thumbs + flag + accent + "日本") * 500
    for limit in (7, 50, 101, DISCORD_LIMIT):
        pieces = split_markdown(text, limit)
        assert "".join(pieces) == text
        for piece in pieces:
            assert len(piece) <= limit
            assert piece[0] not in "\u200d\u0301\U0001f3fd" and piece[-1] != "\u200d"
            assert piece.count("🇺") == piece.count("🇦")  # flags stay whole


def test_unicode_words_split_at_spaces():
    text = " ".join(["привет", "мир", "日本語のテキスト", "😀"] * 800)
    pieces = split_markdown(text, DISCORD_LIMIT)
    check_pieces(text, pieces, DISCORD_LIMIT)
    assert " ".join(pieces) == text


def test_list_indentation_kept_after_a_cut():
    text = "\n".join(f"  - nested item {k}" for k in range(200))
    pieces = split_markdown(text, 300)
    check_pieces(text, pieces, 300)
    assert all(p.startswith("  - nested item") for p in pieces)


def test_cut_inside_a_line_never_starts_a_piece_with_a_fence_or_marker():
    # A word cut before "```" would open a code block in the next piece; before "- " or
    # "# " it would turn the rest of a sentence into a bullet or a heading.
    text = " ".join(["use", "```", "to", "fence,", "-", "dash,", "#", "hash", ">", "gt"] * 60)
    for limit in range(20, 60):
        pieces = split_markdown(text, limit)
        check_pieces(text, pieces, limit)
        for piece in pieces[1:]:
            assert not re.match(r"```|~~~|[-*+>#] ", piece), piece
    code = "```sh\n" + "echo '" + "a ```b " * 100 + "'\n```"
    pieces = split_markdown(code, 60)
    check_pieces(code, pieces, 60)
    assert all(not p.split("\n")[1].startswith("```") for p in pieces)


def test_code_is_cut_at_blank_lines_before_other_lines():
    code = "```py\ndef a():\n    pass\n\ndef b():\n    return 2\n```"
    assert split_markdown(code, 40) == [
        "```py\ndef a():\n    pass\n\n```",
        "```py\ndef b():\n    return 2\n```",
    ]


def test_crlf_text_splits_and_renders():
    text = "\r\n\r\n".join(["para **bold** " * 20] * 20) + "\r\n```py\r\nx = 1\r\n```\r\n"
    check_pieces(text, split_markdown(text, 500), 500)
    out = markdown_to_telegram_html("a **b**\r\n```py\r\nx\r\n```")
    assert out == 'a <b>b</b>\n<pre><code class="language-py">x</code></pre>'


def test_random_split_invariants():
    rnd = random.Random(20240601)
    alphabet = ["word", " ", "\n", "\n\n", "```py\n", "```\n", "~~~\n", "`", "**", "_", "👍🏽"]
    alphabet += ["x" * 60, "é", "\t", "> ", "- ", "|a|b|\n|-|-|\n", "  "]
    for _ in range(200):
        text = "".join(rnd.choice(alphabet) for _ in range(rnd.randint(1, 150)))
        limit = rnd.randint(30, 200)
        pieces = split_markdown(text, limit)
        if not text.strip():
            assert pieces == []
        elif len(text) <= limit:
            assert pieces == [text]  # unchanged, even with an unclosed fence
        else:
            check_pieces(text, pieces, limit)


# --- render_chunks -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("limit", "render"),
    [
        (TELEGRAM_LIMIT, markdown_to_telegram_html),
        (DISCORD_LIMIT, markdown_to_discord),
        (SLACK_LIMIT, markdown_to_slack_mrkdwn),
    ],
)
def test_render_chunks_keeps_escaped_pieces_within_the_limit(limit, render):
    text = ("Tom & Jerry <tag> a<b && c>d " * 40 + "\n\n") * 30
    text += "```html\n" + '<div class="a">&nbsp;</div>\n' * 400 + "```\n"
    pieces = render_chunks(text, limit, render)
    assert all(0 < len(p) <= limit for p in pieces)
    assert len(pieces) > 1


def test_render_chunks_splits_only_as_much_as_escaping_requires():
    text = "&" * 10_000
    pieces = render_chunks(text, TELEGRAM_LIMIT, markdown_to_telegram_html)
    assert all(len(p) <= TELEGRAM_LIMIT for p in pieces)
    assert len(pieces) == 13  # 50_000 rendered characters; re-splitting by halves gives 16
    assert "".join(strip_telegram_html(p) for p in pieces) == text


def test_render_chunks_text_survives_telegram_round_trip():
    text = "\n\n".join(f"Paragraph {k}: x < y & y > z, **bold {k}**." for k in range(400))
    pieces = render_chunks(text, TELEGRAM_LIMIT, markdown_to_telegram_html)
    assert all(len(p) <= TELEGRAM_LIMIT for p in pieces)
    plain = "".join(strip_telegram_html(p) for p in pieces)
    assert squeeze(plain) == squeeze(text.replace("**", ""))
    for piece in pieces:
        check_telegram_html(piece)


def test_render_chunks_short_and_blank():
    assert render_chunks("a & b", 100, markdown_to_telegram_html) == ["a &amp; b"]
    assert render_chunks("  \n", 100, markdown_to_telegram_html) == []


def test_render_chunks_with_a_visible_length_measure():
    text = "[link](https://example.com/" + "p" * 80 + ") " * 1
    text = (text * 200).strip()

    def visible(h: str) -> int:
        return len(strip_telegram_html(h))

    pieces = render_chunks(text, 1000, markdown_to_telegram_html, measure=visible)
    assert all(visible(p) <= 1000 for p in pieces)
    assert len(pieces) < len(render_chunks(text, 1000, markdown_to_telegram_html))


def test_render_chunks_impossible_limit_raises():
    with pytest.raises(ValueError):
        render_chunks("&&&&", 3, markdown_to_telegram_html)


# --- Telegram HTML -------------------------------------------------------------------------

ALLOWED_TAGS = {"b", "i", "u", "s", "code", "pre", "a", "blockquote", "tg-spoiler"}


class _TagChecker(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.errors: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag not in ALLOWED_TAGS:
            self.errors.append(f"tag <{tag}>")
        attrs = dict(attrs)
        if tag == "a":
            if set(attrs) != {"href"}:
                self.errors.append(f"a attrs {attrs}")
        elif tag == "code" and attrs:
            if set(attrs) != {"class"} or not attrs["class"].startswith("language-"):
                self.errors.append(f"code attrs {attrs}")
            if self.stack[-1:] != ["pre"]:
                self.errors.append("code with a language outside pre")
        elif attrs:
            self.errors.append(f"{tag} attrs {attrs}")
        if self.stack and self.stack[-1] in ("code", "pre") and tag != "code":
            self.errors.append(f"<{tag}> inside <{self.stack[-1]}>")
        if tag in ("a", "code", "blockquote", "pre") and tag in self.stack:
            self.errors.append(f"nested <{tag}>")
        if tag == "code" and "a" in self.stack:
            self.errors.append("code inside a link")
        self.stack.append(tag)

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:]}")
        else:
            self.stack.pop()


def check_telegram_html(out: str) -> None:
    checker = _TagChecker()
    checker.feed(out)
    checker.close()
    assert not checker.errors, (checker.errors, out)
    assert not checker.stack, (checker.stack, out)
    # Outside tags there is no raw < or >, and every & starts an entity Telegram knows.
    text = re.sub(r"<(/?)([a-z-]+)( [^<>]*)?>", "", out)
    assert "<" not in text and ">" not in text, out
    for amp in re.finditer(r"&[^;\s]*;?", out):
        assert re.fullmatch(r"&(lt|gt|amp|quot|#x?[0-9a-fA-F]+);", amp[0]), (amp[0], out)


TELEGRAM_CASES = {
    "**bold** and __bold__": "<b>bold</b> and <b>bold</b>",
    "*italic* and _italic_": "<i>italic</i> and <i>italic</i>",
    "~~gone~~": "<s>gone</s>",
    "`a < b & c`": "<code>a &lt; b &amp; c</code>",
    "snake_case_name and my_var_": "snake_case_name and my_var_",
    "2*3*4 = 24": "2*3*4 = 24",
    "a * b * c": "a * b * c",
    "**bold without end": "**bold without end",
    "*a **b** c*": "<i>a <b>b</b> c</i>",
    "**a *b* c**": "<b>a <i>b</i> c</b>",
    "***both***": "<b><i>both</i></b>",
    "**`code` in bold**": "<b><code>code</code> in bold</b>",
    "x <script>alert(1)</script> & y": "x &lt;script&gt;alert(1)&lt;/script&gt; &amp; y",
    "# Title": "<b>Title</b>",
    "### Deep **title** ###": "<b>Deep title</b>",
    "- one\n* two\n  + three": "• one\n• two\n  • three",
    "> quoted *text*\n> more": "<blockquote>quoted <i>text</i>\nmore</blockquote>",
    "1. first\n2. second": "1. first\n2. second",
    r"\*not italic\*": "*not italic*",
    "see https://example.com/a_b_c_ now": "see https://example.com/a_b_c_ now",
    "---": "———",
}


@pytest.mark.parametrize(("md", "expected"), TELEGRAM_CASES.items())
def test_telegram_conversions(md, expected):
    out = markdown_to_telegram_html(md)
    assert out == expected
    check_telegram_html(out)


def test_telegram_links_escape_url():
    out = markdown_to_telegram_html('[a & "b"](https://x.com/?q=1&r="2"\'3)')
    check_telegram_html(out)
    assert out == '<a href="https://x.com/?q=1&amp;r=&quot;2&quot;&#x27;3">a &amp; "b"</a>'
    assert "<a" not in markdown_to_telegram_html("[x](javascript:alert(1))")
    assert markdown_to_telegram_html("[x](javascript:alert(1))") == "x (javascript:alert(1))"
    assert (
        markdown_to_telegram_html("<https://a.b/c>") == '<a href="https://a.b/c">https://a.b/c</a>'
    )
    # No link inside a link, and no code inside a link (Telegram rejects both).
    out = markdown_to_telegram_html("[see [this](http://a) `c`](http://b)")
    check_telegram_html(out)


def test_telegram_fenced_code():
    md = "Code:\n```python\nif a < b and c & d:\n    print('**x**')\n```\nafter"
    out = markdown_to_telegram_html(md)
    check_telegram_html(out)
    assert out == (
        'Code:\n<pre><code class="language-python">if a &lt; b and c &amp; d:\n'
        "    print('**x**')</code></pre>\nafter"
    )
    assert markdown_to_telegram_html("```\nplain\n```") == "<pre>plain</pre>"
    assert markdown_to_telegram_html("```\nunclosed *x*") == "<pre>unclosed *x*</pre>"
    weird = markdown_to_telegram_html('```py"><script>\nx\n```')
    check_telegram_html(weird)


def test_telegram_table_is_monospace():
    md = "| Name | Qty |\n|------|----:|\n| **apple** | 1 |\n| kiwi & co | 100 |"
    out = markdown_to_telegram_html(md)
    check_telegram_html(out)
    assert out == (
        "<pre>Name      | Qty\n----------+----\napple     | 1\nkiwi &amp; co | 100</pre>"
    )


def test_telegram_nested_quotes_are_flattened():
    out = markdown_to_telegram_html("> a\n>> b\n\n> c")
    check_telegram_html(out)
    assert out == "<blockquote>a\nb</blockquote>\n\n<blockquote>c</blockquote>"


def test_telegram_html_well_formed_for_random_input():
    rnd = random.Random(7)
    tokens = ["*", "**", "***", "_", "__", "~~", "`", "``", "```", "```py\n", "[", "]", "(", ")"]
    tokens += ['](http://a.b/?x=1&y="2")', "<", ">", "&", " ", "\n", "word", "snake_case"]
    tokens += [
        "# ",
        "- ",
        "> ",
        "|",
        "|-|\n",
        "2*3*4",
        "👍🏽",
        "\\",
        "http://x.y/a_b",
        "<http://q>",
    ]
    for _ in range(200):
        md = "".join(rnd.choice(tokens) for _ in range(rnd.randint(1, 60)))
        out = markdown_to_telegram_html(md)
        check_telegram_html(out)
        plain = strip_telegram_html(out)  # nothing but markup (and fence info) is lost
        for word in ("word", "snake", "👍🏽", "3"):
            if "```" not in md:
                assert plain.count(word) == md.count(word), (word, md, out)


def test_telegram_html_handles_pathological_input_quickly():
    for md in ("*a " * 5000, "_*" * 5000 + "x" + "*_" * 5000, "`" * 5000, "[a](" * 3000):
        check_telegram_html(markdown_to_telegram_html(md))


def test_inline_parser_limits_do_not_crash():
    # Private-use characters in the input are kept as they are (the parser uses that range).
    assert (
        markdown_to_telegram_html("\U000f0000 **b** \U000f0001") == "\U000f0000 <b>b</b> \U000f0001"
    )
    huge = "`x` " * 70_000  # more code spans in a line than the parser tracks: plain text
    check_telegram_html(markdown_to_telegram_html(huge))
    deep = "*_" * 200 + "x" + "_*" * 200
    check_telegram_html(markdown_to_telegram_html(deep))


# --- Slack, Discord, plain -----------------------------------------------------------------

SLACK_CASES = {
    "**bold**": "*bold*",
    "*it* and _it_": "_it_ and _it_",
    "~~s~~": "~s~",
    "[text](https://a.com/?x=1&y=2)": "<https://a.com/?x=1&y=2|text>",
    "[a|b](<https://a.com/p q>)": "<https://a.com/p%20q|a|b>",
    "<https://a.com>": "<https://a.com>",
    "# Title **x**": "*Title x*",
    "- item\n* item": "• item\n• item",
    "a < b & c > d": "a &lt; b &amp; c &gt; d",
    "`x<y`": "`x&lt;y`",
    "```python\nif x < 1:\n    pass\n```": "```\nif x &lt; 1:\n    pass\n```",
    "> *quote*": "> _quote_",
    "snake_case_name 2*3*4": "snake_case_name 2*3*4",
    "**unclosed": "**unclosed",
    "[x](relative/path)": "x (relative/path)",
}


@pytest.mark.parametrize(("md", "expected"), SLACK_CASES.items())
def test_slack_conversions(md, expected):
    assert markdown_to_slack_mrkdwn(md) == expected


def test_discord_neutralises_mass_mentions_everywhere():
    out = markdown_to_discord("hey @everyone and @here\n```\n@everyone in code\n```")
    assert "@everyone" not in out and "@here" not in out
    assert out.count("@\u200beveryone") == 2 and "@\u200bhere" in out
    assert markdown_to_discord("mail me@example.com") == "mail me@example.com"


def test_discord_keeps_markdown_but_fixes_deep_headings_and_tables():
    md = "# H1\n### H3\n#### H4 *x*\n###### H6\n**b** _i_ ~~s~~ `c`\n```py\n#### not a heading\n```"
    assert markdown_to_discord(md) == (
        "# H1\n### H3\n**H4 *x***\n**H6**\n**b** _i_ ~~s~~ `c`\n```py\n#### not a heading\n```"
    )
    out = markdown_to_discord("| a | b |\n|---|---|\n| 1 | 22 |")
    assert out == "```\na | b\n--+---\n1 | 22\n```"


@pytest.mark.parametrize("render", [markdown_to_discord, markdown_to_slack_mrkdwn])
def test_backticks_inside_a_code_block_cannot_end_it_on_discord_or_slack(render):
    # CommonMark lets a longer fence hold ``` lines; Discord and Slack end a block at the
    # first three backticks whatever opened it, so those runs get a zero-width space.
    inner = "a ``` b\n```\nnot code?\n```x"
    out = render(f"before\n````\n{inner}\n````\nafter")
    before, code, after = out.split("```")
    assert (before, after) == ("before\n", "\nafter")
    assert code.replace("\u200b", "") == f"\n{inner}\n"
    # A plain block without such runs is left as written.
    assert render("```py\nx = 1\n```").endswith("x = 1\n```")


def test_other_dialects_on_random_input():
    rnd = random.Random(11)
    tokens = ["*", "**", "_", "~~", "`", "```\n", "[a](http://b?c=1&d=2)", "<", "&", "@", "here"]
    tokens += ["everyone", " ", "\n", "# ", "#### ", "- ", "> ", "|x|y|\n|-|-|\n", "word"]
    for _ in range(200):
        md = "".join(rnd.choice(tokens) for _ in range(rnd.randint(1, 60)))
        discord = markdown_to_discord(md)
        assert "@everyone" not in discord and "@here" not in discord
        slack = markdown_to_slack_mrkdwn(md)
        assert "&" not in re.sub(r"&(amp|lt|gt);", "", re.sub(r"<http[^>]*>", "", slack))
        assert strip_markdown(md).count("word") == md.count("word")


def test_strip_markdown():
    md = (
        "# Title\n**bold** *it* ~~s~~ `code` [text](https://a.com) <https://b.com>\n"
        "- item\n```py\nx = 1  # **not bold**\n```\n> quote"
    )
    assert strip_markdown(md) == (
        "Title\nbold it s code text (https://a.com) https://b.com\n"
        "• item\nx = 1  # **not bold**\n> quote"
    )
    assert strip_markdown("snake_case_name **unclosed") == "snake_case_name **unclosed"


def test_strip_telegram_html_inverts_rendering():
    md = "**a & b** <x> `c<d>` [l](https://e.com/?a=1&b=2)\n```py\nif a<b:\n```"
    out = markdown_to_telegram_html(md)
    assert strip_telegram_html(out) == "a & b <x> c<d> l\nif a<b:"
    assert strip_telegram_html("&amp;lt; &quot;") == '&lt; "'
    assert html.unescape("&amp;") == "&"


def test_telegram_length_counts_utf16_units_of_the_visible_text():
    assert utf16_len("a\U0001f600é") == 4
    assert telegram_length('<b>&amp;</b><a href="https://x.example/long">\U0001f600</a>') == 3


def test_split_telegram_html_closes_and_reopens_tags_and_keeps_the_text():
    html_text = "<b>bold <i>both " + "x" * 40 + "</i></b>\nline <code>c&lt;d</code>"
    pieces = split_telegram_html(html_text, 16)
    assert all(telegram_length(p) <= 16 for p in pieces)
    assert all(html_problem(p) is None for p in pieces)  # every piece parses on its own
    assert "".join(strip_telegram_html(p) for p in pieces) == strip_telegram_html(html_text)


def test_a_hard_cut_never_leaves_a_quote_marker_at_the_start_of_a_piece():
    pieces = render_chunks(
        "&<>" * 3000, TELEGRAM_LIMIT, markdown_to_telegram_html, measure=telegram_length
    )
    assert "".join(strip_telegram_html(p) for p in pieces) == "&<>" * 3000
    assert len(pieces) == 3


def test_quote_levels_are_counted_and_removed_at_once():
    from channels.formatting import _quote_depth

    assert _quote_depth("> > > deep") == ("deep", 3)
    assert _quote_depth(">>x") == ("x", 2)
    assert _quote_depth("    > four spaces is code") is None
    assert _quote_depth("> " * 50_000 + "end") == ("end", 50_000)
    html = markdown_to_telegram_html("> " * 50_000 + "end")
    assert html.count("end") == 1
