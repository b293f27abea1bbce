"""A message longer than the model's window (issue 29): cut to fit, kept whole in the
workspace, the person told; never sent whole to be refused for length."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bot.long_messages import cut_message, message_char_limit
from bot.tokens import estimate_message_tokens
from tests.fakes.llm_server import FakeLLM, FakeLLMThread, reply
from tests.helpers import Harness, make_config, request_messages, run_memobot, write_config

WINDOW = 65_536


@pytest.fixture
def llm_thread() -> Iterator[FakeLLMThread]:
    with FakeLLM.start_in_thread() as server:
        yield server


def _big(chars: int) -> str:
    words = [f"w{i}" for i in range(chars // 7)]
    return "HEAD-START " + " ".join(words) + " TAIL-END"


def test_a_megabyte_piped_in_is_cut_to_the_window(tmp_path: Path, llm_thread) -> None:
    llm_thread.script(reply("Read it."))
    cfg = write_config(tmp_path, llm_thread.base_url)
    text = _big(1_000_000)
    done = run_memobot("agent", "-s", "cli:big", config=cfg, stdin=text + "\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "Read it.\n"  # the notice is not an answer: stdout stays clean
    assert "saved in the workspace as media/cli/big/message-" in done.stderr
    sent = request_messages(llm_thread.requests[0])
    user = sent[-1]["content"]
    assert sum(estimate_message_tokens(m) for m in sent) < WINDOW - 4096
    assert user.startswith("HEAD-START ") and "TAIL-END" in user
    assert "characters in the middle are left out" in user
    kept = list((tmp_path / "ws" / "media" / "cli" / "big").glob("message-*.txt"))
    assert len(kept) == 1 and kept[0].read_text() == text
    assert f"media/cli/big/{kept[0].name}" in user  # the model is told where the rest is


async def test_a_message_that_fits_is_sent_as_it_is(tmp_path: Path, llm: FakeLLM) -> None:
    llm.script(reply("ok"))
    cfg = make_config(tmp_path, llm.base_url, llm={"contextWindowTokens": 8192})
    text = "x " * (message_char_limit(8192, cfg.llm.max_tokens) // 2 - 40)
    async with Harness(cfg, tmp_path / "config.json") as h:
        assert await h.ask(text) == "ok"
    assert request_messages(llm.requests[0])[-1]["content"].startswith(text)
    assert not (tmp_path / "ws" / "media").exists()
    assert [m for m in h.outbox if not m.final] == []


async def test_a_small_window_cuts_a_platform_message_and_tells_the_chat(
    tmp_path: Path, llm: FakeLLM
) -> None:
    llm.script(reply("ok"))
    cfg = make_config(tmp_path, llm.base_url, llm={"contextWindowTokens": 8192})
    text = _big(60_000)
    async with Harness(cfg, tmp_path / "config.json", ("telegram",)) as h:
        fut = await h.send(text, chat="42", channel="telegram")
        assert (await fut).text == "ok"
    notices = [m.text for m in h.outbox if not m.final]
    assert (
        len(notices) == 1
        and f"{len(text):,} characters" in notices[0]
        and "media/telegram/42/" in notices[0]
    )
    user = request_messages(llm.requests[0])[-1]["content"]
    assert len(user) < message_char_limit(8192, cfg.llm.max_tokens) + 400


def test_cut_keeps_head_and_tail_at_word_ends() -> None:
    text = " ".join(f"word{i}" for i in range(10_000))
    cut = cut_message(text, 5_000, "media/cli/x/message-1.txt")
    head, marker, tail = cut.split("\n\n")
    assert len(cut) <= 5_000 + 50
    assert text.startswith(head) and text.endswith(tail)
    assert head.split()[-1] in text.split() and tail.split()[0] in text.split()
    left_out = len(text) - len(head) - len(tail)
    assert f"{left_out:,} characters" in marker and "media/cli/x/message-1.txt" in marker
    assert cut_message("short", 5_000, "x") == "short"


def test_cjk_is_cut_to_the_window_not_to_its_character_count() -> None:
    """Four characters a token holds for English, not for Chinese, Japanese, Korean or emoji,
    which take a token or more each: a 120,000-character Chinese message was under the
    character limit, sent whole, and refused for length by a 65,536-token model."""
    room = WINDOW - 4096
    limit = message_char_limit(WINDOW, 4096)
    for text in ("漢字" * 60_000, "🙂" * 120_000, "x " * 30_000 + "漢" * 100_000):
        cut = cut_message(text, limit, "media/telegram/42/message-1.txt")
        wide = sum(1 for c in cut if ord(c) > 127)
        assert wide <= room // 2, (text[:3], wide)  # even at one token each: half the room
        assert "characters in the middle are left out" in cut
    ascii_text = "word " * 30_000
    assert len(cut_message(ascii_text, limit, "x")) > limit - 500  # English keeps its share


async def test_a_chinese_message_under_the_character_limit_is_still_cut(
    tmp_path: Path, llm: FakeLLM
) -> None:
    llm.script(reply("ok"))
    cfg = make_config(tmp_path, llm.base_url, llm={"contextWindowTokens": 8192})
    room = 8192 - cfg.llm.max_tokens
    text = "长" * (message_char_limit(8192, cfg.llm.max_tokens) - 10)  # fewer chars than the limit
    async with Harness(cfg, tmp_path / "config.json", ("telegram",)) as h:
        fut = await h.send(text, chat="42", channel="telegram")
        assert (await fut).text == "ok"
    assert len([m for m in h.outbox if not m.final]) == 1  # the person is told
    user = request_messages(llm.requests[0])[-1]["content"]
    assert user.count("长") <= room // 2
    kept = list((tmp_path / "ws" / "media" / "telegram" / "42").glob("message-*.txt"))
    assert len(kept) == 1 and kept[0].read_text() == text
