"""Whole-turn latency in one process, fake LLM answering at once, no tools.

Measures the median and p90 of a full turn (inbound on the bus -> final outbound) on an empty
session and on a session that already holds N messages. Targets: < 10 ms empty, < 40 ms at
3,000 messages.

    .venv/bin/python bench/bench_turn.py [--turns 50] [--history 3000]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bot.session import SessionStore
from tests.fakes.llm_server import FakeLLM
from tests.helpers import Harness, make_config


def seed_history(state: Path, key: str, n: int) -> None:
    store = SessionStore(state)
    s = store.get(key)
    batch = []
    for i in range(n // 2):
        batch.append({"role": "user", "content": f"question {i}: " + "lorem ipsum " * 8})
        batch.append({"role": "assistant", "content": f"answer {i}: " + "dolor sit amet " * 8})
    store.append(s, batch)


async def measure(tmp: Path, turns: int, history: int) -> list[float]:
    async with FakeLLM(log_bodies=False, validate=False) as llm:
        # A context window big enough that the whole history is sent every turn.
        cfg = make_config(tmp, llm.base_url, llm={"contextWindowTokens": 10_000_000})
        if history:
            seed_history(cfg.agent.state_path, "cli:bench", history)
        async with Harness(cfg, tmp / "config.json") as h:
            await h.ask("warm up", chat="bench")
            times = []
            for i in range(turns):
                t0 = time.perf_counter()
                await h.ask(f"turn {i}", chat="bench")
                times.append((time.perf_counter() - t0) * 1000)
    return times


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=50)
    ap.add_argument("--history", type=int, default=3000)
    args = ap.parse_args()
    for history in (0, args.history):
        with tempfile.TemporaryDirectory() as d:
            times = asyncio.run(measure(Path(d), args.turns, history))
        times.sort()
        p90 = times[int(len(times) * 0.9) - 1]
        print(
            f"history={history:>5} messages  turns={len(times)}  "
            f"median={statistics.median(times):6.2f} ms  p90={p90:6.2f} ms  "
            f"max={times[-1]:6.2f} ms"
        )


if __name__ == "__main__":
    main()
