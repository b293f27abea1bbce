"""What the SDKs alone cost per message: the CPU floor under the gateway's CPU per message.

A plain message through the Telegram gateway makes these platform and model calls: one
``getUpdates`` that brings it (shared when updates come in batches), ``sendChatAction``
(typing; only when the answer takes longer than ``typingDelaySeconds``), one streamed Chat
Completions request, a ``sendMessageDraft`` or two (streaming in a private chat) and one
``sendMessage``. This script makes each call the way memobot makes it
(the openai SDK through ``bot.llm.LLMProvider``, python-telegram-bot through
``channels.telegram_channel.channel.build_bot`` on aiohttp) against the fake servers, which run in
other threads, and reports the CPU time of the calling thread per call (``time.thread_time``):
what no change inside memobot can save while it uses these SDKs.

    .venv/bin/python bench/bench_sdk_floor.py [--calls 300]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bot.config import LLMConfig
from bot.llm import LLMProvider
from channels.telegram_channel.channel import build_bot
from channels.telegram_channel.config import TelegramConfig
from tests.fakes.llm_server import FakeLLM, FakeLLMThread
from tests.fakes.telegram_api import FakeBotAPI, FakeBotAPIThread

ANSWER_WORDS = 12  # about the length of a short chat answer, streamed word by word


async def cpu_per_call(calls: int, call: Callable[[int], Awaitable[object]]) -> float:
    """Median CPU milliseconds of this thread per call, after a warm-up."""
    for i in range(10):
        await call(i)
    samples = []
    for i in range(calls):
        t0 = time.thread_time()
        await call(i)
        samples.append((time.thread_time() - t0) * 1000)
    return statistics.median(samples)


async def measure(calls: int, llm_url: str, api: FakeBotAPIThread) -> dict[str, float]:
    out: dict[str, float] = {}
    llm = LLMProvider(LLMConfig.model_validate({"baseUrl": llm_url, "apiKey": "k", "model": "m"}))
    messages = [{"role": "system", "content": "You are helpful."}]

    async def streamed(i: int) -> object:
        words: list[str] = []
        return await llm.chat(
            [*messages, {"role": "user", "content": f"q{i}"}], on_text=words.append
        )

    async def plain(i: int) -> object:
        return await llm.chat([*messages, {"role": "user", "content": f"q{i}"}])

    out["model call, streamed (LLMProvider.chat, openai SDK)"] = await cpu_per_call(calls, streamed)
    out["model call, not streamed"] = await cpu_per_call(calls, plain)

    cfg = TelegramConfig.model_validate(
        {"enabled": True, "token": api.token, "baseUrl": api.base_url}
    )
    bot, requests = build_bot(cfg)
    await bot.initialize()
    chat = 4242
    api.private_text("hello", user_id=chat)
    updates = await bot.get_updates(timeout=0)
    offset = updates[-1].update_id + 1

    async def send(i: int) -> object:
        return await bot.send_message(chat, f"answer {i} " + "word " * ANSWER_WORDS)

    async def typing(i: int) -> object:
        return await bot.send_chat_action(chat, "typing")

    async def draft(i: int) -> object:
        return await bot.send_message_draft(chat, 1 + i, f"answer {i} " + "word " * 6)

    async def poll(i: int) -> object:
        nonlocal offset
        api.private_text(f"m{i}", user_id=chat)
        got = await bot.get_updates(offset=offset, timeout=0)
        offset = got[-1].update_id + 1
        return got

    out["sendMessage (python-telegram-bot on aiohttp)"] = await cpu_per_call(calls, send)
    out["sendChatAction"] = await cpu_per_call(calls, typing)
    out["sendMessageDraft"] = await cpu_per_call(calls, draft)
    out["getUpdates bringing one message"] = await cpu_per_call(calls, poll)
    await bot.shutdown()
    for r in requests:
        await r.shutdown()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=300)
    args = ap.parse_args()
    fake = FakeLLM(log_bodies=False, validate=False, mode="echo")
    with FakeLLMThread(fake) as llm, FakeBotAPIThread(FakeBotAPI()) as api:
        figures = asyncio.run(measure(args.calls, llm.base_url, api))
    for name, ms in figures.items():
        print(f"{name:55s} {ms:6.2f} ms CPU (median of {args.calls})")
    quick = (
        figures["getUpdates bringing one message"]
        + figures["model call, streamed (LLMProvider.chat, openai SDK)"]
        + figures["sendMessageDraft"]
        + figures["sendMessage (python-telegram-bot on aiohttp)"]
    )
    slow = quick + figures["sendChatAction"]
    print(f"{'one streamed plain message, answered within the delay':55s} {quick:6.2f} ms CPU")
    print(f"{'the same, with a typing indicator':55s} {slow:6.2f} ms CPU")


if __name__ == "__main__":
    main()
