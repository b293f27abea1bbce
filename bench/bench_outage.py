"""Outage soak: users keep writing through ``memobot gateway`` while the model goes away.

The soak of ``bench_soak`` (each user writes every 1-3 s, fake Telegram with its flood rules)
with a model outage in the middle: after ``--before`` seconds the fake LLM answers 500 for
``--errors`` seconds, then 429 with ``Retry-After: 5`` for ``--throttled`` seconds, then
recovers. Users go on writing for ``--after`` seconds; the script then waits (up to
``--settle``) for every question to be answered. Reported: questions answered for real,
answered with the error text, unanswered; outage notices per chat (target: at most one per
chat per outage); duplicates (target 0); when the last waiting question was answered.

    .venv/bin/python bench/bench_outage.py [--users 100] [--before 15] [--errors 30]
        [--throttled 30] [--after 15] [--model-delay 0.3]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_soak import FIRST_USER, fds, percentile, user, write_soak_config
from bench.bench_telegram import Gateway, polls
from bot.llm import LLMUnavailable
from bot.outage import NOTICE_TEXT
from tests.fakes.llm_server import FakeLLM, error
from tests.fakes.telegram_api import FakeBotAPI, FloodControl


async def run(args: argparse.Namespace, tmp: Path) -> None:
    flood = FloodControl(chat=3, chat_window=1.0, bot=30, bot_window=1.0)
    async with (
        FakeLLM(log_bodies=False, validate=False, delay=args.model_delay) as llm,
        FakeBotAPI(flood=flood) as api,
    ):
        config = write_soak_config(tmp, llm, api)
        gw = Gateway(config)
        await gw.start()
        assert gw.proc is not None
        await polls(api, 0)
        sent: dict[str, float] = {}
        started = time.monotonic()
        writing = args.before + args.errors + args.throttled + args.after
        users = [
            asyncio.create_task(user(api, FIRST_USER + i, started + writing, sent))
            for i in range(args.users)
        ]
        await asyncio.sleep(args.before)
        llm.outage((args.errors, error(500)), (args.throttled, error(429, retry_after=5)))
        back = time.monotonic() + args.errors + args.throttled
        print(f"t={time.monotonic() - started:4.0f}s outage begins ({args.users} users writing)")
        try:
            while time.monotonic() < started + writing + args.settle:
                await asyncio.sleep(1.0)
                answered = {c.params["text"][6:] for c in api.sent() if "text" in c.params}
                if time.monotonic() > started + writing and set(sent) <= answered:
                    break
            print(f"RSS {gw.rss_mib():.1f} MiB  fds {fds(gw.proc.pid)}")
        finally:
            await asyncio.gather(*users, return_exceptions=True)
            await gw.stop()
        report(api, sent, started, back)


def report(api: FakeBotAPI, sent: dict[str, float], started: float, back: float) -> None:
    texts = [(c.params.get("chat_id"), c.params.get("text", ""), c.at) for c in api.sent()]
    answers = Counter(t[6:] for _, t, _ in texts if t.startswith("echo: "))
    real = [t for t in sent if answers[t]]
    duplicated = [t for t, n in answers.items() if n > 1]
    errors = sum(1 for _, t, _ in texts if t == LLMUnavailable.user_message)
    notices = Counter(chat for chat, t, _ in texts if t == NOTICE_TEXT)
    unanswered = len(sent) - len(real)
    # Answers to questions asked during the outage: how long after the model came back.
    late = [
        at - back
        for _, t, at in texts
        if t.startswith("echo: ") and t[6:] in sent and sent[t[6:]] < back and at > back
    ]
    print(
        f"questions {len(sent)}  answered for real {len(real)}  answered with the error "
        f"{errors}  unanswered {unanswered}  duplicated {len(duplicated)}"
    )
    print(
        f"notices: {sum(notices.values())} in {len(notices)} chats, at most "
        f"{max(notices.values(), default=0)} in one chat"
    )
    if late:
        print(
            f"questions from the outage answered after the model came back: {len(late)}, "
            f"p50 {percentile(late, 0.5):.1f} s, last {max(late):.1f} s after"
        )
    print(f"took {time.monotonic() - started:.0f} s in all")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, default=100)
    ap.add_argument("--before", type=float, default=15, help="seconds before the outage")
    ap.add_argument("--errors", type=float, default=30, help="seconds of HTTP 500")
    ap.add_argument("--throttled", type=float, default=30, help="seconds of 429 Retry-After 5")
    ap.add_argument("--after", type=float, default=15, help="seconds of writing after it")
    ap.add_argument("--settle", type=float, default=180, help="wait at most this for answers")
    ap.add_argument("--model-delay", type=float, default=0.3)
    ap.add_argument("--keep", help="work in this folder and keep it (logs, sessions)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(args.keep) if args.keep else Path(d)
        tmp.mkdir(parents=True, exist_ok=True)
        asyncio.run(run(args, tmp))


if __name__ == "__main__":
    main()
