"""Start-up cost: a cold ``memobot agent -m hi``, and an idle gateway with Telegram only.

``agent -m``: process start to exit against a fake LLM in another process; wall time, CPU time
(user + system: less disturbed by other load than wall time) and peak RSS of the memobot
process. Targets (issue 29): under 0.7 s wall.

Gateway: ``memobot gateway`` with only Telegram enabled, against the fake Bot API in this
process; its resident set once connected and idle for a few seconds. Target: under 70 MiB.

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


def run_once(config: Path) -> tuple[float, float, float]:
    """Wall seconds, CPU seconds and peak RSS (MiB) of one run, from wait4's rusage."""
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
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def gateway_idle_rss(tmp: Path, llm_url: str, settle: float) -> float:
    """MiB resident of a Telegram-only gateway, ``settle`` seconds after it connected."""
    from tests.fakes.telegram_api import FakeBotAPI, FakeBotAPIThread

    config = tmp / "gateway.json"
    with FakeBotAPIThread(FakeBotAPI()) as api:
        telegram = {"enabled": True, "token": api.token, "baseUrl": api.base_url}
        config.write_text(
            json.dumps(
                {
                    "llm": {"baseUrl": llm_url, "apiKey": "x", "model": "fake"},
                    "agent": {"workspace": str(tmp / "ws"), "stateDir": str(tmp / "gw-state")},
                    "channels": {"telegram": {**telegram, "allowFrom": ["1"]}},
                }
            )
        )
        proc = subprocess.Popen(
            [*memobot_cmd(), "--config", str(config), "gateway"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 60
            while len(api.calls("getUpdates")) < 2:  # connected: the second long poll is open
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("the gateway did not connect to the fake Telegram")
                time.sleep(0.1)
            time.sleep(settle)
            status = Path(f"/proc/{proc.pid}/status").read_text()
            rss_line = next(ln for ln in status.splitlines() if ln.startswith("VmRSS"))
        finally:
            proc.terminate()
            proc.wait(30)
    return int(rss_line.split()[1]) / 1024


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--settle", type=float, default=5.0, help="gateway idle seconds")
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
        walls = [w for w, _, _ in results]
        cpus = [c for _, c, _ in results]
        rss = [r for _, _, r in results]
        print(
            f"cold `memobot agent -m hi`: runs={len(results)}  "
            f"wall median={statistics.median(walls):.3f} s  max={max(walls):.3f} s  "
            f"CPU median={statistics.median(cpus):.3f} s  peak RSS max={max(rss):.1f} MiB"
        )
        idle = gateway_idle_rss(tmp, llm.base_url, args.settle)
        print(f"gateway, Telegram only, {args.settle:g} s idle after connect: {idle:.1f} MiB RSS")


if __name__ == "__main__":
    main()
