"""50 chats send one message each at once; the fake LLM answers each after 200 ms.

With ``agent.maxConcurrentTurns`` 50 every answer should be back within 0.6 s wall: the turns
overlap on the LLM wait and each burns little CPU on the one event loop.

    .venv/bin/python bench/bench_concurrency.py [--sessions 50] [--delay 0.2] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.fakes.llm_server import FakeLLM
from tests.helpers import Harness, make_config


async def measure(tmp: Path, sessions: int, delay: float, rounds: int) -> list[float]:
    async with FakeLLM(log_bodies=False, validate=False, delay=delay) as llm:
        cfg = make_config(tmp, llm.base_url, agent={"maxConcurrentTurns": sessions})
        async with Harness(cfg, tmp / "config.json") as h:
            await h.stack.provider.warm_up()  # as the gateway does right after start
            walls = []
            for r in range(rounds):
                t0 = time.perf_counter()
                futs = [await h.send(f"hello {r}", chat=f"c{i}") for i in range(sessions)]
                answers = await asyncio.gather(*futs)
                walls.append(time.perf_counter() - t0)
                assert all(a.text == f"echo: hello {r}" for a in answers)
    return walls


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=50)
    ap.add_argument("--delay", type=float, default=0.2)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        walls = asyncio.run(measure(Path(d), args.sessions, args.delay, args.rounds))
    shown = ", ".join(f"{w:.3f}" for w in walls)
    print(
        f"{args.sessions} sessions at once, LLM delay {args.delay:.2f} s: "
        f"all answered in {shown} s (round 1 also creates the 50 session files)"
    )


if __name__ == "__main__":
    main()
