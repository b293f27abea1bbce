"""Cost of one ``exec`` call through the gate: confined (Landlock), unconfined, and a bare shell.

Each call runs ``true`` through the real ExecTool; the bare line is ``sh -c true`` started with
asyncio directly, what exec cost before the gate. Also measures how long ending a turn with
N background jobs takes (the scope kills every subtree).

    .venv/bin/python bench/bench_exec.py [--calls 100] [--jobs 20]
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

from bot.config import ExecConfig
from bot.gate import Gate, ProcessScope
from bot.tools.base import ToolContext
from bot.tools.shell import ExecTool


async def exec_calls(ctx: ToolContext, sandbox: str, calls: int) -> list[float]:
    tool = ExecTool(ExecConfig(sandbox=sandbox))
    out = []
    for _ in range(calls):
        started = time.perf_counter()
        result = await tool.run({"command": "true"}, ctx)
        out.append((time.perf_counter() - started) * 1000)
        assert result == "(no output)", result
    return out


async def bare(calls: int) -> list[float]:
    out = []
    for _ in range(calls):
        started = time.perf_counter()
        proc = await asyncio.create_subprocess_shell("true")
        await proc.wait()
        out.append((time.perf_counter() - started) * 1000)
    return out


async def end_of_turn(ctx: ToolContext, jobs: int) -> float:
    tool = ExecTool(ExecConfig())
    for _ in range(jobs):
        await tool.run({"command": "setsid sleep 600 >/dev/null 2>&1 &"}, ctx)
    assert ctx.processes is not None
    started = time.perf_counter()
    await ctx.processes.close()
    return (time.perf_counter() - started) * 1000


def line(name: str, ms: list[float]) -> str:
    ms = sorted(ms)
    p90 = ms[int(len(ms) * 0.9) - 1]
    return f"{name:<22} median {statistics.median(ms):6.1f} ms   p90 {p90:6.1f} ms"


async def main(calls: int, jobs: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        ws = Path(tmp) / "ws"
        ws.mkdir()
        gate = Gate(ws)
        ctx = ToolContext(workspace=ws, gate=gate)
        print(line("exec, Landlock", await exec_calls(ctx, "landlock", calls)))
        print(line("exec, sandbox off", await exec_calls(ctx, "off", calls)))
        print(line("bare sh -c (no gate)", await bare(calls)))
        ctx.processes = ProcessScope()
        took = await end_of_turn(ctx, jobs)
        print(f"end of turn, {jobs} background jobs killed in {took:.0f} ms")
        gate.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--jobs", type=int, default=20)
    args = parser.parse_args()
    asyncio.run(main(args.calls, args.jobs))
