"""The terminal's Markdown rendering while an answer streams: does it cost time to first text?

1. end to end on a pty: `memobot agent` (a real subprocess) answering a fake LLM that streams
   in pieces; from the model's first content chunk to the answer's first bytes on the
   terminal, interactive (rendered) against stdin piped with stdout on the pty (printed raw,
   as before rendering existed); target: rendered no slower;
2. in process: a long Markdown answer fed to ``LiveMarkdown`` in small deltas against writing
   the deltas raw: the cost of each delta (mean, p99, max), of the whole answer, and the bytes
   the redraws add.

    .venv/bin/python bench/bench_terminal.py [--samples 10]
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from channels.terminal_channel.live import LiveMarkdown
from tests.fakes.llm_server import FakeLLM, reply
from tests.helpers import REPO, write_config
from tests.test_terminal_markdown import Pty

OPENING = "Streaming answers arrive a few words at a time"
PARAGRAPH = (
    f"{OPENING}, with **bold words**, `code spans` and [links](https://example.org/docs) "
    "that a terminal shows rendered once each line is complete.\n"
)
TABLE = "| name | value | note |\n|---|---|---|\n" + "| row | 12 | *fine* |\n" * 6
CODE = "```python\n" + "def f(x):\n    return x * 2  # **not bold**\n" * 4 + "```\n"
LONG = "".join(
    f"## Part {i}\n\n{PARAGRAPH * 3}\n- a bullet with *emphasis*\n- another\n\n{TABLE}\n{CODE}\n"
    for i in range(12)
)
PIECES, PAUSE = 24, 0.05


def _first_bytes_at(term: Pty, needle: bytes) -> float:
    """When the read that brought ``needle``'s first byte came."""
    at = term.data.find(needle)
    assert at != -1, term.data[-300:]
    return next(t for t, size in term.stamps if size > at)


def end_to_end(samples: int) -> dict[str, list[float]]:
    results: dict[str, list[float]] = {"rendered": [], "raw": []}
    with tempfile.TemporaryDirectory() as tmp, FakeLLM.start_in_thread() as llm:
        cfg = write_config(Path(tmp), llm.base_url)
        env = {**os.environ, "TERM": "xterm-256color", "PROMPT_TOOLKIT_NO_CPR": "1"}
        for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "NO_COLOR"):
            env.pop(name, None)
        for i in range(samples):
            for mode in ("rendered", "raw"):
                llm.script(reply(PARAGRAPH * 4, pieces=PIECES, chunk_delay=PAUSE))
                term = Pty()
                interactive = mode == "rendered"
                proc = subprocess.Popen(
                    [sys.executable, "-m", "bot", "--config", str(cfg), "agent", "-s", f"cli:b{i}"],
                    stdin=term.slave if interactive else subprocess.PIPE,
                    stdout=term.slave,
                    stderr=subprocess.DEVNULL,
                    cwd=REPO,
                    env=env,
                )
                term.start()
                question = f"bench {mode} {i}"
                if interactive:
                    term.wait_for(b"you>")
                    term.type(question.encode() + b"\r")
                    done = term.wait_for(b"example.org", after=term.data.rfind(b"you>"))
                    term.wait_for(b"you>", after=done)
                    term.type(b"exit\r")
                else:
                    assert proc.stdin is not None
                    proc.stdin.write(question.encode() + b"\n")
                    proc.stdin.close()
                proc.wait(60)
                [entry] = [r for r in llm.requests if question in (r.get("last_user") or "")]
                first = _first_bytes_at(term, OPENING[:12].encode())
                results[mode].append(first - entry["first_content_at"])
                term.close()
    return results


def in_process() -> dict[str, float]:
    step = 6  # characters per delta: a model's token or two
    out: dict[str, float] = {}
    for mode in ("rendered", "raw"):
        sink = io.StringIO()
        live = LiveMarkdown(sink, lambda: 100)
        costs = []
        start = time.perf_counter()
        for end in range(step, len(LONG) + step, step):
            t0 = time.perf_counter()
            if mode == "rendered":
                live.write(LONG[:end])
            else:
                sink.write(LONG[end - step : end])
            costs.append(time.perf_counter() - t0)
        if mode == "rendered":
            live.finish()
        total = time.perf_counter() - start
        costs.sort()
        out[f"{mode}_first_ms"] = _first(mode, step) * 1000
        out[f"{mode}_mean_us"] = statistics.mean(costs) * 1e6
        out[f"{mode}_p99_us"] = costs[int(len(costs) * 0.99)] * 1e6
        out[f"{mode}_max_us"] = costs[-1] * 1e6
        out[f"{mode}_total_ms"] = total * 1000
        out[f"{mode}_bytes"] = len(sink.getvalue())
    out["chars"] = len(LONG)
    out["deltas"] = len(range(step, len(LONG) + step, step))
    return out


def _first(mode: str, step: int) -> float:
    """Seconds from the first delta handed over to its text written (fresh objects)."""
    sink = io.StringIO()
    t0 = time.perf_counter()
    if mode == "rendered":
        LiveMarkdown(sink, lambda: 100).write(LONG[:step])
    else:
        sink.write(LONG[:step])
    assert sink.getvalue()
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=10)
    args = parser.parse_args()
    e2e = end_to_end(args.samples)
    for mode, values in e2e.items():
        ms = sorted(v * 1000 for v in values)
        median = statistics.median(ms)
        print(
            f"first token -> first text on the pty, {mode:8}: median {median:.1f} ms,"
            f" max {ms[-1]:.1f} ms ({len(ms)} samples)"
        )
    r = in_process()
    print(f"in process: {r['chars']} characters of Markdown in {r['deltas']} deltas of 6")
    for mode in ("rendered", "raw"):
        print(
            f"  {mode:8}: first text {r[f'{mode}_first_ms']:.3f} ms, per delta mean"
            f" {r[f'{mode}_mean_us']:.1f} us, p99 {r[f'{mode}_p99_us']:.1f} us, max"
            f" {r[f'{mode}_max_us']:.0f} us; whole answer {r[f'{mode}_total_ms']:.1f} ms,"
            f" {r[f'{mode}_bytes']} bytes written"
        )


if __name__ == "__main__":
    main()
