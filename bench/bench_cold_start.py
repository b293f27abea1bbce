"""Cold ``memobot agent -m hi``: process start to exit, against a fake LLM in another process.

Reports wall time and peak RSS (max over runs) of the memobot process itself. Targets: under
1.2 s wall and under 90 MiB peak RSS.

    .venv/bin/python bench/bench_cold_start.py [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.fakes.llm_server import FakeLLMProcess  # noqa: E402


def memobot_cmd() -> list[str]:
    exe = Path(sys.executable).with_name("memobot")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "bot"]


def run_once(config: Path) -> tuple[float, float]:
    """Wall seconds and peak RSS (MiB) of one run, measured with wait4's rusage."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [*memobot_cmd(), "--config", str(config), "agent", "-m", "hi", "-s", "cli:cold"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    out = proc.stdout.read().decode() if proc.stdout else ""
    if os.waitstatus_to_exitcode(status) != 0 or "echo: hi" not in out:
        err = proc.stderr.read().decode() if proc.stderr else ""
        raise SystemExit(f"memobot failed: {out!r} {err}")
    return wall, usage.ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d, FakeLLMProcess.spawn(Path(d)) as llm:
        tmp = Path(d)
        config = tmp / "config.json"
        config.write_text(
            json.dumps(
                {
                    "llm": {"baseUrl": llm.base_url, "apiKey": "x", "model": "fake"},
                    "agent": {"workspace": str(tmp / "ws"), "stateDir": str(tmp / "state")},
                }
            )
        )
        run_once(config)  # first run creates the workspace; not a fair cold start
        results = [run_once(config) for _ in range(args.runs)]
    walls = [w for w, _ in results]
    rss = [r for _, r in results]
    print(
        f"cold `memobot agent -m hi`: runs={len(results)}  "
        f"wall median={statistics.median(walls):.3f} s"
        f"  max={max(walls):.3f} s  peak RSS max={max(rss):.1f} MiB"
    )


if __name__ == "__main__":
    main()
