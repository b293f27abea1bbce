"""What the usage ledger costs per model call, and what reading it back costs.

The ledger's share of a model call is the record made from the answer
(``bot.spend.record.make_record``) and its append (``UsageLedger.record``: one write on the
event loop; the fsync, shared, at most once a second, by the ledger's flusher). Reported as
CPU of the whole process (the worker thread's too: ``time.process_time``) per call, for calls
one after another and for ``--chats`` calls at once; then the CPU ``memobot usage`` takes to
read and sum a month of ``--records`` records.

    .venv/bin/python bench/bench_usage.py [--calls 2000] [--chats 50] [--records 100000]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from datetime import date
from pathlib import Path
from zoneinfo import ZoneInfo

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bot.config import PriceConfig
from bot.spend.ledger import UsageLedger, month_file
from bot.spend.record import CallRecord, make_record
from bot.spend.report import report

USAGE = {
    "prompt_tokens": 5120,
    "completion_tokens": 212,
    "total_tokens": 5332,
    "prompt_tokens_details": {"cached_tokens": 4096},
}
PRICES = {"gpt-4o": PriceConfig(input=2.5, cached_input=1.25, output=10)}


def record(i: int) -> CallRecord:
    return make_record(
        session=f"telegram:{1000 + i % 50}",
        purpose="turn",
        model="gpt-4o",
        endpoint="https://api.openai.com/v1",
        usage=USAGE,
        prices=PRICES,
        messages=[],
        tools=None,
        answer=dict,
    )


def make_cost(calls: int) -> float:
    """CPU microseconds per record made from an answer's usage."""
    start = time.process_time()
    for i in range(calls):
        record(i)
    return (time.process_time() - start) / calls * 1e6


async def sequential(folder: Path, calls: int) -> tuple[float, float]:
    """(CPU ms, wall ms) per call, one call after another (the flusher's fsyncs included)."""
    ledger = UsageLedger(folder)
    for i in range(20):
        await ledger.record(record(i))
    cpu, wall = time.process_time(), time.perf_counter()
    for i in range(calls):
        await ledger.record(record(i))
    await ledger.flush()
    return (time.process_time() - cpu) / calls * 1e3, (time.perf_counter() - wall) / calls * 1e3


async def concurrent(folder: Path, calls: int, chats: int) -> tuple[float, float]:
    """(CPU ms, wall ms of a round) per call, ``chats`` calls at once (shared fsyncs)."""
    ledger = UsageLedger(folder)
    rounds = max(1, calls // chats)
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(rounds):
        await asyncio.gather(*(ledger.record(record(i)) for i in range(chats)))
    spent = time.process_time() - cpu
    return spent / (rounds * chats) * 1e3, (time.perf_counter() - wall) / rounds * 1e3


def read_month(folder: Path, records: int) -> float:
    """CPU seconds to read and sum a month of ``records`` records by session."""
    path = month_file(folder, "2026-11")
    path.parent.mkdir(parents=True, exist_ok=True)
    line = record(0)
    with path.open("wb") as fh:
        for i in range(records):
            day = 1 + i * 29 // records
            fh.write(
                line.line()
                .replace(b'"2026-', b'"2026-', 1)
                .replace(line.at.encode(), f"2026-11-{day:02d}T12:00:00Z".encode())
            )
    start = time.process_time()
    made = report(folder, ZoneInfo("UTC"), date(2026, 11, 1), date(2026, 11, 30), "session")
    assert made.total.calls == records, made.total.calls
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--chats", type=int, default=50)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--dir", type=Path, help="where to write (default: a temp folder)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        folder = Path(tmp)
        print(f"record made from usage: {make_cost(args.calls * 10):.1f} us CPU")
        cpu, wall = asyncio.run(sequential(folder / "a", args.calls))
        print(f"one call at a time: {cpu:.3f} ms CPU, {wall:.3f} ms wall per call")
        cpu, wall = asyncio.run(concurrent(folder / "b", args.calls, args.chats))
        print(
            f"{args.chats} calls at once: {cpu:.3f} ms CPU per call, {wall:.2f} ms wall per round"
        )
        seconds = read_month(folder / "c", args.records)
        print(f"reading a month of {args.records:,} records by session: {seconds:.2f} s CPU")


if __name__ == "__main__":
    main()
