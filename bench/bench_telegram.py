"""Telegram end to end: ``memobot gateway`` (a real subprocess, Telegram only) against the fake
Bot API and a fake LLM answering after 200 ms, both served from this process's event loop.

1. one chat: update injected -> sendMessage arrives, minus the LLM's 200 ms (target < 50 ms);
2. 50 chats at once (one getUpdates batch): time until all 50 are answered (target 0.6 s);
3. idle RSS of the gateway (target < 85 MiB) and start -> first getUpdates (target < 1.2 s);
4. SIGKILL 50 ms / 200 ms / 1 s after a message reached the gateway, 20 trials with a restart
   each: every message answered exactly once.

    .venv/bin/python bench/bench_telegram.py [--trials 20] [--skip-kill] [--keep DIR]

Pacing (``channels.telegram.rateLimits``: 1 message a second per chat, 28 a second per bot) is
set far above those figures here, so they measure memobot's own cost; ``--paced`` keeps
Telegram's defaults and shows what a user sees (about 1 s between answers in one busy chat, 50
chats in about 1.7 s). ``--keep DIR`` leaves the gateway's log and state there;
``BENCH_PROFILE=FILE`` runs each gateway under cProfile (the last one to stop leaves its
profile in FILE).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bot.service import heap
from tests.fakes.llm_server import FakeLLM
from tests.fakes.telegram_api import FakeBotAPI
from tests.helpers import REPO, config_dict

LLM_DELAY = 0.2
CHATS = 50


class Gateway:
    """One ``memobot gateway`` process; its log goes to ``gateway.log`` in the temp folder."""

    def __init__(self, config: Path) -> None:
        self.config = config
        self.proc: asyncio.subprocess.Process | None = None
        self.spawned_at = 0.0

    async def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "MEMOBOT_"))}
        log = open(self.config.parent / "gateway.log", "ab")  # noqa: ASYNC230 - once per start
        self.spawned_at = time.monotonic()
        profile = os.environ.get("BENCH_PROFILE")  # a cProfile output file, for digging
        prefix = ["-m", "cProfile", "-o", profile] if profile else []
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, *prefix, "-m", "bot", "--config", str(self.config), "gateway",
            cwd=REPO, env=env, stdout=asyncio.subprocess.DEVNULL, stderr=log,
        )  # fmt: skip
        log.close()

    def cpu_seconds(self) -> float:
        """User + system CPU time the process has used so far."""
        assert self.proc is not None
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss_mib(self) -> float:
        assert self.proc is not None
        rss = heap.rss_bytes(self.proc.pid)
        if rss is None:
            raise RuntimeError("no VmRSS")
        return rss / 2**20

    async def kill(self) -> None:
        if self.proc and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)
            await self.proc.wait()

    async def stop(self) -> None:
        if self.proc and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), 30)
            except TimeoutError:
                await self.kill()


async def polls(api: FakeBotAPI, after: int) -> float:
    """Wait for a getUpdates call beyond the first ``after``; returns when it arrived."""
    await api.wait_for_async(lambda: len(api.calls("getUpdates")) > after, 15)
    return api.calls("getUpdates")[after].at


def answers(api: FakeBotAPI, text: str) -> list[float]:
    """Arrival times of the answers to ``text`` (the fake LLM echoes it)."""
    return [c.at for c in api.sent() if c.params["text"] == f"echo: {text}"]


async def one_chat(api: FakeBotAPI, samples: int = 10) -> list[float]:
    overheads = []
    for i in range(samples):
        text = f"latency probe {i}"
        t0 = time.monotonic()
        api.private_text(text)
        await api.wait_for_async(lambda t=text: bool(answers(api, t)), 10)
        overheads.append(answers(api, text)[0] - t0 - LLM_DELAY)
    return overheads


async def fifty_chats(api: FakeBotAPI, rounds: int = 3) -> list[tuple[float, float]]:
    """Per round: (all answered, batch stored) seconds after the 50 updates were queued.

    "Stored" is when the next getUpdates arrives: every message of the batch is durable then.
    """
    walls = []
    for r in range(rounds):
        messages = [
            api.message(
                f"round {r} chat {i}",
                chat=api.private_chat(5000 + i),
                sender=api.user(5000 + i, f"user{i}"),
            )
            for i in range(CHATS)
        ]
        before, polls_before = len(api.sent()), len(api.calls("getUpdates"))
        t0 = time.monotonic()
        api.inject_many(messages)
        await api.wait_for_async(lambda b=before: len(api.sent()) >= b + CHATS, 20)
        stored = api.calls("getUpdates")[polls_before].at - t0
        walls.append((max(c.at for c in api.sent()[before:]) - t0, stored))
    return walls


async def startup(api: FakeBotAPI, config: Path, runs: int = 3) -> tuple[list[float], float]:
    """Start -> first getUpdates, over ``runs`` fresh processes; idle RSS of the last one."""
    firsts = []
    rss = 0.0
    for _ in range(runs):
        gw = Gateway(config)
        seen = len(api.calls("getUpdates"))
        await gw.start()
        firsts.append(await polls(api, seen) - gw.spawned_at)
        await asyncio.sleep(3)  # idle: connected, long-polling, nothing to do
        rss = gw.rss_mib()
        await gw.stop()
    return firsts, rss


async def kill_trials(api: FakeBotAPI, config: Path, trials: int) -> list[tuple[float, int]]:
    """For each trial: a message reaches the gateway, SIGKILL after a delay, restart, count."""
    delays = [0.05, 0.2, 1.0]
    arrived: dict[int, float] = {}
    api.after_get_updates = lambda ids: arrived.update(dict.fromkeys(ids, time.monotonic()))
    gw = Gateway(config)
    await gw.start()
    await polls(api, len(api.calls("getUpdates")))
    texts = []
    for n in range(trials):
        delay = delays[n % len(delays)]
        text = f"kill trial {n}"
        texts.append(text)
        update_id = api.private_text(text)
        await api.wait_for_async(lambda u=update_id: u in arrived, 10)
        await asyncio.sleep(max(0.0, arrived[update_id] + delay - time.monotonic()))
        await gw.kill()
        gw = Gateway(config)
        await gw.start()
        await api.wait_for_async(lambda t=text: bool(answers(api, t)), 20)
    await asyncio.sleep(1.5)  # late duplicates would have arrived by now
    await gw.stop()
    api.after_get_updates = None
    return [(delays[n % len(delays)], len(answers(api, t))) for n, t in enumerate(texts)]


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(args.keep) if args.keep else Path(d)
        tmp.mkdir(parents=True, exist_ok=True)
        async with (
            FakeLLM(log_bodies=False, validate=False, delay=LLM_DELAY) as llm,
            FakeBotAPI() as api,
        ):
            telegram = {
                "enabled": True,
                "token": api.token,
                "baseUrl": api.base_url,
                "allowFrom": ["*"],
                "admins": ["*"],  # every sender an admin, as allowFrom "*" alone made them before
                "pollTimeoutSeconds": 30,
            }
            if not args.paced:
                fast = {"messages": 100000, "perSeconds": 1, "burst": 1000}
                telegram["rateLimits"] = {"bot": fast, "chat": fast, "group": fast}
            data = config_dict(
                tmp,
                llm.base_url,
                agent={"maxConcurrentTurns": 64},
                channels={"telegram": telegram},
            )
            data["llm"]["timeoutSeconds"] = 30
            config = tmp / "config.json"
            config.write_text(json.dumps(data))

            firsts, rss = await startup(api, config)
            print(
                f"start -> first getUpdates: {', '.join(f'{s:.3f}' for s in firsts)} s "
                f"(target < 1.2 s); idle RSS {rss:.1f} MiB (target < 85 MiB)"
            )

            gw = Gateway(config)
            await gw.start()
            await polls(api, len(api.calls("getUpdates")))
            try:
                lat = await one_chat(api)
                print(
                    f"one chat: reply {statistics.median(lat) * 1000:.1f} ms after the LLM's "
                    f"{LLM_DELAY * 1000:.0f} ms (median of {len(lat)}; first "
                    f"{lat[0] * 1000:.1f} ms, max {max(lat) * 1000:.1f} ms; target < 50 ms)"
                )
                cpu0 = gw.cpu_seconds()
                walls = await fifty_chats(api)
                cpu = (gw.cpu_seconds() - cpu0) / (CHATS * len(walls))
                print(
                    f"{CHATS} chats at once: all answered in "
                    f"{', '.join(f'{w:.3f}' for w, _ in walls)} s (target 0.6 s; the first "
                    f"round creates the sessions); batch durable after "
                    f"{', '.join(f'{s:.3f}' for _, s in walls)} s; gateway CPU "
                    f"{cpu * 1000:.1f} ms per message"
                )
            finally:
                await gw.stop()

            if not args.skip_kill:
                counts = await kill_trials(api, config, args.trials)
                for delay in sorted({d for d, _ in counts}):
                    got = [c for d, c in counts if d == delay]
                    print(
                        f"SIGKILL {delay * 1000:.0f} ms after arrival: {len(got)} trials, "
                        f"answers per message {got}"
                    )
                ok = all(c == 1 for _, c in counts)
                print(f"every message answered exactly once: {'yes' if ok else 'NO'}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--skip-kill", action="store_true")
    ap.add_argument("--paced", action="store_true", help="keep Telegram's default pacing")
    ap.add_argument("--keep", help="work in this folder and keep it (logs, sessions)")
    asyncio.run(main(ap.parse_args()))
