"""Consolidation must not stall the chat.

A session is pushed over its consolidation budget while the fake LLM takes 2 s to answer the
summarisation call. The reply latency of the user's next messages is compared with the same
run where consolidation never triggers. Target: within 50 ms.

    .venv/bin/python bench/bench_consolidation.py [--turns 20]
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

from tests.fakes.llm_server import FakeLLM, tool_step
from tests.helpers import Harness, make_config

SUMMARY = tool_step(
    ("save_summary", {"summary": "bench summary"}),
    when_user_contains="Conversation excerpt",
    delay=2.0,
)


async def measure(tmp: Path, turns: int, consolidate: bool) -> tuple[list[float], int]:
    async with FakeLLM(log_bodies=False, validate=False) as llm:
        llm.script(*[SUMMARY] * 10)
        memory = {"consolidateAtMessages": 8 if consolidate else 10_000, "keepRecentMessages": 4}
        cfg = make_config(tmp, llm.base_url, memory=memory)
        async with Harness(cfg, tmp / "config.json") as h:
            times = []
            for i in range(turns):
                t0 = time.perf_counter()
                await h.ask(f"message {i}")
                times.append((time.perf_counter() - t0) * 1000)
            summaries = 10 - llm.pending
            await h.stack.loop.consolidator.cancel()
    return times, summaries


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=20)
    args = ap.parse_args()
    results = {}
    for consolidate in (False, True):
        with tempfile.TemporaryDirectory() as d:
            results[consolidate] = asyncio.run(measure(Path(d), args.turns, consolidate))
    base = statistics.median(results[False][0])
    with_c = statistics.median(results[True][0])
    print(f"no consolidation:   median reply {base:6.2f} ms  max {max(results[False][0]):6.2f} ms")
    print(
        f"with consolidation: median reply {with_c:6.2f} ms  max {max(results[True][0]):6.2f} ms"
        f"  ({results[True][1]} summary calls of 2 s started during the run)"
    )
    print(f"difference of medians: {with_c - base:+.2f} ms (target: within 50 ms)")


if __name__ == "__main__":
    main()
