"""Start-up cost: a cold ``memobot agent -m hi``, and an idle gateway with Telegram only.

``agent -m``: process start to exit against a fake LLM in another process; wall time, CPU time
(user + system: less disturbed by other load than wall time) and peak RSS of the memobot
process. Targets (issue 29): under 0.7 s wall.

Gateway: ``memobot gateway`` with only Telegram enabled, against the fake Bot API in this
process; its resident set once connected and idle for a few seconds. Target: under 70 MiB.
Measured with the control panel off and on (issue 30: the panel nobody opens should cost under
2 MiB and no wakeups): RSS, CPU seconds and context switches (wakeups) over the idle window.

    .venv/bin/python bench/bench_cold_start.py [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _proc(pid: int) -> tuple[float, float, int]:
    """RSS MiB, CPU seconds and context switches (voluntary + not) of process ``pid``."""
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    fields = {ln.split(":")[0]: ln.split(":", 1)[1].split() for ln in status}
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")
    switches = int(fields["voluntary_ctxt_switches"][0]) + int(
        fields["nonvoluntary_ctxt_switches"][0]
    )
    return int(fields["VmRSS"][0]) / 1024, cpu, switches


def gateway_idle(tmp: Path, llm_url: str, settle: float, panel: bool) -> tuple[float, float, int]:
    """RSS MiB of a Telegram-only gateway ``settle`` seconds after it connected, and the CPU
    seconds and context switches it used in those seconds."""
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
                    "web": {"enabled": panel, "listen": f"127.0.0.1:{_free_port()}"},
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
            time.sleep(1.0)  # the start's last writes
            _, cpu0, switches0 = _proc(proc.pid)
            time.sleep(settle)
            rss, cpu1, switches1 = _proc(proc.pid)
        finally:
            proc.terminate()
            proc.wait(30)
    return rss, cpu1 - cpu0, switches1 - switches0


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
        for panel in (False, True):
            rss, cpu, switches = gateway_idle(tmp, llm.base_url, args.settle, panel)
            print(
                f"gateway, Telegram only, panel {'on' if panel else 'off'}, {args.settle:g} s "
                f"idle after connect: {rss:.1f} MiB RSS, {cpu * 1000:.0f} ms CPU, "
                f"{switches} context switches"
            )


if __name__ == "__main__":
    main()
