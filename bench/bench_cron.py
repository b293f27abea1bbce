"""The scheduler's cost: an idle tick with many jobs, and a tick where many jobs come due at once.

An idle tick (nothing changed, nothing due) is one stat of the store plus a walk over the jobs
in memory; it runs every second in the gateway. A busy tick records every due occurrence in
one store write, hands each to the real intake (a pending turn in its session, fsynced) and
moves them all on in a second write. Nothing consumes the turns here: this is the scheduler
and intake only.

    .venv/bin/python bench/bench_cron.py [--jobs 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bot.app import build_agent  # noqa: E402
from bot.cron.schedule import Schedule  # noqa: E402
from bot.cron.scheduler import Scheduler  # noqa: E402
from bot.cron.store import JobStore, new_job  # noqa: E402
from tests.helpers import make_config  # noqa: E402


async def main(n: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        cfg = make_config(root, "http://127.0.0.1:9/v1", heartbeat={"intervalMinutes": 0})
        stack = build_agent(cfg, root / "config.json")
        store = JobStore(cfg.agent.state_path)
        t0 = datetime(2026, 3, 1, 8, tzinfo=UTC)
        schedule = Schedule.make(every_seconds=3600, tz="UTC")

        def add_all(jobs: object) -> None:
            for i in range(n):
                new_job(
                    jobs,  # type: ignore[arg-type]
                    session=f"telegram:{10_000 + i}",
                    message=f"job {i}",
                    schedule=schedule,
                    now=t0,
                    deliver="text",
                )

        store.update(add_all)
        print(f"jobs.json with {n} jobs: {store.path.stat().st_size / 1024:.0f} KiB")
        now = [t0]
        sched = Scheduler(cfg, store, stack.bus, stack.store, {"telegram"}, clock=lambda: now[0])
        await sched.tick()  # the first read
        rounds = 200
        started = time.perf_counter()
        for _ in range(rounds):
            await sched.tick()
        idle = (time.perf_counter() - started) / rounds
        print(f"idle tick: {idle * 1e6:.0f} µs (every second in the gateway)")
        now[0] = t0 + timedelta(hours=1)
        started = time.perf_counter()
        await sched.tick()
        busy = time.perf_counter() - started
        assert stack.bus.inbound.qsize() == n
        print(f"{n} jobs due at once: {busy:.2f} s ({busy / n * 1000:.2f} ms per occurrence)")
        await stack.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    asyncio.run(main(parser.parse_args().jobs))
