"""Streaming on Slack, end to end: ``memobot gateway`` (a real subprocess) against the fake Slack
(Slack's one post or update per second per channel) and a fake LLM that streams its answer in
pieces with pauses, both served from this process's event loop (one monotonic clock). Every
question is a mention in a channel, answered in its thread, with Slack's default pacing.

1. first token -> first visible preview: the fake LLM writes its first content chunk, the fake
   Slack receives ``chat.startStream`` (native) or ``chat.postMessage`` (``nativeStreaming``
   false);
2. the whole answer (question pushed -> the final ``chat.update``, or the answer's
   ``chat.postMessage`` without streaming) natively, by post + update, and without streaming;
3. Web API calls per answer, and gateway CPU per answer.

    .venv/bin/python bench/bench_slack_stream.py [--samples 10]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_stream import _ms
from bench.bench_telegram import Gateway
from channels.formatting import SLACK_LIMIT, markdown_to_slack_mrkdwn, render_chunks
from tests.fakes.llm_server import FakeLLM, reply
from tests.fakes.slack_api import APP_TOKEN, BOT_TOKEN, FakeSlack
from tests.helpers import config_dict
from tests.test_slack import ALICE, mention

ANSWER = " ".join(f"Sentence {i} of a streamed answer, long enough to read." for i in range(24))
PIECES, PAUSE = 24, 0.1  # about 2.4 s of writing, like a fast model
MODES = {
    "native": {"streaming": True, "nativeStreaming": True},
    "post+update": {"streaming": True, "nativeStreaming": False},
    "off": {"streaming": False},
}
_ts = itertools.count(1)


def _first_content(llm: FakeLLM, text: str) -> float:
    [entry] = [r for r in llm.requests if text in (r.get("last_user") or "")]
    return entry["first_content_at"]


def _answer(slack: FakeSlack, root: str) -> tuple[float, float] | None:
    """(first visible at, final at) of the answer in thread ``root``, once it is final."""
    final = render_chunks(ANSWER, SLACK_LIMIT, markdown_to_slack_mrkdwn)[0]
    streams = [s for s in slack.streams if s.get("thread_ts") == root]
    posts = [p for p in slack.posts if p.thread_ts == root]
    if streams:
        first, ts = streams[0]["at"], streams[0]["ts"]
    elif posts:
        first, ts = posts[0].at, posts[0].ts
    else:
        return None
    shown = slack.shown_messages.get(ts) or {}
    if shown.get("text") != final or shown.get("streaming"):
        return None
    return first, shown.get("updated_at", first)


async def _calls(slack: FakeSlack) -> int:
    return sum(slack.calls.get(m, 0) for m in slack.calls if m.startswith("chat."))


async def run(tmp: Path, llm: FakeLLM, slack: FakeSlack, mode: str, samples: int):
    settings = {
        "enabled": True,
        "botToken": BOT_TOKEN,
        "appToken": APP_TOKEN,
        "apiUrl": slack.api_url,
        "allowFrom": [ALICE],
        **MODES[mode],
    }
    config = tmp / f"config-{mode.replace('+', '-')}.json"
    config.write_text(json.dumps(config_dict(tmp, llm.base_url, channels={"slack": settings})))
    connected = slack.connections
    gw = Gateway(config)
    await gw.start()
    previews, wholes = [], []
    try:
        await slack.wait_connected(connected + 1, 30)
        calls0, cpu0 = await _calls(slack), gw.cpu_seconds()
        for i in range(samples):
            text = f"probe {mode} {i}"
            if MODES[mode]["streaming"]:
                llm.script(reply(ANSWER, pieces=PIECES, chunk_delay=PAUSE))
            else:  # the same model, answering when it has written everything
                llm.script(reply(ANSWER, delay=(PIECES + 3) * PAUSE))
            root = f"1700009000.{next(_ts):06d}"
            t0 = time.monotonic()
            await slack.push_event(mention(text, root), event_id=f"B{root}")
            deadline = t0 + 30
            while (done := _answer(slack, root)) is None:
                assert time.monotonic() < deadline, f"no answer in mode {mode}"
                await asyncio.sleep(0.005)
            first, final = done
            wholes.append(final - t0)
            if MODES[mode]["streaming"]:
                previews.append(first - _first_content(llm, text))
            await asyncio.sleep(3.0)  # an idle channel: its pacing bucket refills
        calls = (await _calls(slack) - calls0) / samples
        cpu_ms = (gw.cpu_seconds() - cpu0) * 1000 / samples
    finally:
        await gw.stop()
    return previews, wholes, calls, cpu_ms


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(args.keep) if args.keep else Path(d)
        tmp.mkdir(parents=True, exist_ok=True)
        async with FakeLLM(log_bodies=False, validate=False) as llm, FakeSlack() as slack:
            results: dict[str, Any] = {}
            for mode in MODES:
                results[mode] = await run(tmp, llm, slack, mode, args.samples)
        off = statistics.median(results["off"][1])
        for mode, (previews, wholes, calls, cpu_ms) in results.items():
            line = f"{mode}: whole answer {_ms(wholes)}"
            if previews:
                line += f"; first token -> first preview {_ms(previews)}"
                line += f"; whole answer / without streaming {statistics.median(wholes) / off:.3f}"
            line += f"; {calls:.1f} chat.* calls and {cpu_ms:.1f} ms gateway CPU per answer"
            print(line)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=10)
    ap.add_argument("--keep", help="work in this folder and keep it (logs, sessions)")
    asyncio.run(main(ap.parse_args()))
