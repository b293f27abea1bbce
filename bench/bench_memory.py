"""Where the memory goes: many chats answered in-process, RSS against what the sessions hold.

Runs the real agent loop and channel manager in this process (tests.helpers.Harness) with the
fake LLM in its own process, every chat writing its next message as soon as the last one is
answered. Every ``--every`` messages it prints RSS; at the end the bytes the cached sessions
hold (messages, their API form, token and offset lists, metadata; each object counted once).
RSS above that is the allocator's high-water mark, not live data.

    .venv/bin/python bench/bench_memory.py [--messages 15000] [--chats 200]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bot.service import heap
from tests.fakes.llm_server import FakeLLMProcess
from tests.helpers import Harness, make_config


def rss_mib() -> float:
    rss = heap.rss_bytes()
    if rss is None:
        raise RuntimeError("no VmRSS")
    return rss / 2**20


def deep_size(obj: Any, seen: set[int]) -> int:
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    size = sys.getsizeof(obj)
    if isinstance(obj, dict):
        size += sum(deep_size(k, seen) + deep_size(v, seen) for k, v in obj.items())
    elif isinstance(obj, list | tuple):
        size += sum(deep_size(x, seen) for x in obj)
    return size


async def run(tmp: Path, total: int, chats: int, every: int) -> None:
    llm = FakeLLMProcess.spawn(tmp / "llm", extra_args=["--no-validate", "--no-log-bodies"])
    try:
        cfg = make_config(tmp, llm.base_url)
        async with Harness(cfg, tmp / "config.json") as h:
            await asyncio.gather(*(h.ask(f"hi {c}", chat=f"c{c}", wait=120) for c in range(chats)))
            gc.collect()
            idle = rss_mib()
            print(f"every chat answered once: RSS {idle:.1f} MiB", flush=True)
            done, started = 0, time.monotonic()

            async def chat(c: int) -> None:
                nonlocal done
                i = 0
                while done < total:
                    await h.ask(f"u{c} m{i} " + "lorem ipsum dolor " * 3, chat=f"c{c}", wait=120)
                    i, done = i + 1, done + 1
                    h.outbox.clear()  # the harness's record of what was sent, not memobot's
                    h.waiters = {k: f for k, f in h.waiters.items() if not f.done()}
                    if done % every == 0:
                        print(
                            f"{done:7d} messages {time.monotonic() - started:6.1f} s  "
                            f"RSS {rss_mib():6.1f} MiB (+{rss_mib() - idle:.1f})",
                            flush=True,
                        )

            await asyncio.gather(*(chat(c) for c in range(chats)))
            gc.collect()
            store = h.stack.loop.store
            seen: set[int] = set()
            held = sum(
                deep_size(s.messages, seen)
                + deep_size(s.wire, seen)
                + deep_size(s.tokens, seen)
                + deep_size(s.offsets, seen)
                + deep_size(s.metadata, seen)
                + (deep_size(s.api_prefix.out, seen) if s.api_prefix is not None else 0)
                for s in list(store._cache.values())
            )
            messages = sum(len(s.messages) for s in store._cache.values())
            print(
                f"end: RSS {rss_mib():.1f} MiB (+{rss_mib() - idle:.1f}); {len(store._cache)} "
                f"sessions cached holding {messages} messages, {held / 2**20:.1f} MiB "
                f"({held / max(1, messages):.0f} B a message)"
            )
    finally:
        llm.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=15000)
    ap.add_argument("--chats", type=int, default=200)
    ap.add_argument("--every", type=int, default=3000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        asyncio.run(run(Path(d), args.messages, args.chats, args.every))


if __name__ == "__main__":
    main()
