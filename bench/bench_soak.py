"""Soak: many users writing for minutes through ``memobot gateway`` and the fake Telegram.

Each user sends a message every 1-3 s (random) for ``--seconds``. 100 users offer about 50 a
second, more than Telegram's 30 a second per bot, so the backlog then grows by design. The
fake LLM answers after ``--model-delay``, and ``--tool-ratio`` of the answers first run a tool
(``exec true``). The fake Telegram enforces Telegram's flood rules (1/s per chat with a short
burst, 30/s per bot) and answers 429 beyond them. Every 10 s the script prints the latency
percentiles of that window and the gateway's RSS and open fds; at the end: answered, not yet
answered, duplicated, RSS at the start and the end and its growth per 1,000 answered messages
(slope after the first minute), the gateway's CPU per answered message, the state folder's
size, the share of session bytes that is metadata (hot files, and with the archives), the
largest session file, sends per second overall and into one chat at most, and 429s.

``--unpaced`` sets pacing and the fake's flood rules out of the way (the load the issue-17
soak offered: memory and CPU, not Telegram's limits). ``--restart`` then restarts the gateway
on the soak's state folder: idle RSS, then one message to every chat twice (the gateway's
CPU per chat of each round), then the CPU of loading one session, measured directly on the
state folder.

    .venv/bin/python bench/bench_soak.py [--users 50] [--seconds 60] [--model-delay 0.3]
        [--tool-ratio 0.1] [--unpaced] [--restart] [--keep DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_telegram import Gateway
from bot.session import SessionStore
from tests.fakes.llm_server import FakeLLM, call, tool_step
from tests.fakes.telegram_api import Call, FakeBotAPI, FloodControl
from tests.helpers import config_dict

FIRST_USER = 50_000
WINDOW = 10.0


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p))] if ordered else float("nan")


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def state_figures(state: Path) -> tuple[float, float, float, float]:
    """(state folder MiB, share of hot session-file bytes in metadata lines, the same share
    with the archives of consolidated lines counted, largest session file in MiB)."""
    total = sum(p.stat().st_size for p in state.rglob("*") if p.is_file())
    meta = body = 0
    for path in (state / "sessions").glob("*.jsonl"):
        for line in path.read_bytes().splitlines():
            if b'"_type": "metadata"' in line[:40] or b'"_type":"metadata"' in line[:40]:
                meta += len(line) + 1
            else:
                body += len(line) + 1
    archived = sum(p.stat().st_size for p in (state / "sessions").glob("*.jsonl.archive"))
    largest = max((p.stat().st_size for p in (state / "sessions").glob("*.jsonl")), default=0)
    return (
        total / 2**20,
        meta / max(1, meta + body),
        meta / max(1, meta + body + archived),
        largest / 2**20,
    )


def slope_per_1000(samples: list[tuple[int, float]]) -> float:
    """Least-squares MiB per 1,000 answered messages over ``(answered, RSS)`` samples."""
    if len(samples) < 2:
        return float("nan")
    xs = [x for x, _ in samples]
    ys = [y for _, y in samples]
    mx, my = statistics.mean(xs), statistics.mean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return 1000 * sum((x - mx) * (y - my) for x, y in samples) / den if den else float("nan")


def write_soak_config(tmp: Path, llm: FakeLLM, api: FakeBotAPI, unpaced: bool = False) -> Path:
    """The gateway's config for a soak: the fake Telegram open to everyone, the fake LLM;
    ``unpaced``: pacing set out of the way."""
    telegram: dict[str, Any] = {
        "enabled": True,
        "token": api.token,
        "baseUrl": api.base_url,
        "allowFrom": ["*"],
        # Every soak user is an admin, as before allowFrom "*" stopped making everyone one: the
        # soak measures the owner's turns (the exec step included), not a guest's smaller set.
        "admins": ["*"],
        "pollTimeoutSeconds": 30,
    }
    if unpaced:
        fast = {"messages": 100000, "perSeconds": 1, "burst": 1000}
        telegram["rateLimits"] = {"bot": fast, "chat": fast, "group": fast}
    data = config_dict(tmp, llm.base_url, channels={"telegram": telegram})
    data["llm"]["timeoutSeconds"] = 30
    config = tmp / "config.json"
    config.write_text(json.dumps(data))
    return config


async def user(
    api: FakeBotAPI,
    uid: int,
    until: float,
    sent: dict[str, float],
    llm: FakeLLM | None = None,
    tool_ratio: float = 0.0,
    pause: tuple[float, float] = (1.0, 3.0),
) -> None:
    n = 0
    while time.monotonic() < until:
        text = f"u{uid} m{n}"
        if llm is not None and random.random() < tool_ratio:
            # This message's first model call runs a tool; the call after it answers. (Matched
            # on the text and the newline before the runtime block: "m1" is not "m10".)
            llm.script(tool_step(call("exec", {"command": "true"}), when_user_contains=text + "\n"))
        sent[text] = time.monotonic()
        api.private_text(text, user_id=uid, username=None)
        n += 1
        await asyncio.sleep(random.uniform(*pause))


async def soak(args: argparse.Namespace, tmp: Path) -> None:
    flood = None if args.unpaced else FloodControl(chat=3, chat_window=1.0, bot=30, bot_window=1.0)
    async with (
        FakeLLM(log_bodies=False, validate=False, delay=args.model_delay) as llm,
        FakeBotAPI(flood=flood) as api,
    ):
        config = write_soak_config(tmp, llm, api, unpaced=args.unpaced)
        gw = Gateway(config)
        await gw.start()
        assert gw.proc is not None
        await first_poll(api)
        rss_start = await settled_rss(gw)
        cpu_start = gw.cpu_seconds()
        samples: list[tuple[int, float]] = []
        sent: dict[str, float] = {}
        started = time.monotonic()
        until = started + args.seconds
        users = [
            asyncio.create_task(
                user(api, FIRST_USER + i, until, sent, llm, args.tool_ratio, args.pause)
            )
            for i in range(args.users)
        ]
        answers = Answers(api)
        next_report = started + WINDOW
        try:
            while time.monotonic() < until + 30:
                await asyncio.sleep(0.5)
                answers.read()
                if time.monotonic() >= next_report:
                    window = [at - sent[text] for text, at in answers.take_window() if text in sent]
                    if next_report - started > 60:
                        samples.append((answers.count, gw.rss_mib()))
                    print(
                        f"t={next_report - started:5.0f}s answers {len(window):5d} "
                        f"latency p50 {percentile(window, 0.5) * 1000:7.0f} ms "
                        f"p95 {percentile(window, 0.95) * 1000:7.0f} ms "
                        f"p99 {percentile(window, 0.99) * 1000:7.0f} ms  "
                        f"RSS {gw.rss_mib():6.1f} MiB  fds {fds(gw.proc.pid)}"
                    )
                    next_report += WINDOW
                if time.monotonic() > until and set(sent) <= answers.texts:
                    break
            rss_end, cpu_used = gw.rss_mib(), gw.cpu_seconds() - cpu_start
        finally:
            await asyncio.gather(*users, return_exceptions=True)
            await gw.stop()
        answered = report(api, sent, tmp / "state", started)
        # After the first minute every chat has spoken and everything is imported: growth
        # from there on is what the history costs.
        later = (
            f"{samples[0][1]:.1f} MiB after the first minute, {rss_end:.1f} MiB at the end: "
            f"+{rss_end - rss_start:.1f} MiB from idle, +{rss_end - samples[0][1]:.1f} MiB from "
            f"the first minute; growth {slope_per_1000(samples):.2f} MiB per 1,000 answered "
            "(slope after the first minute)"
            if len(samples) >= 2
            else f"{rss_end:.1f} MiB at the end: +{rss_end - rss_start:.1f} MiB from idle "
            "(a soak past the first minute shows the growth)"
        )
        print(
            f"RSS {rss_start:.1f} MiB at the start (idle), {later}; gateway CPU "
            f"{cpu_used / max(1, answered) * 1000:.1f} ms per answered message"
        )
        if args.restart:
            await restart(api, config, args.users, set(sent))


class Answers:
    """The echo answers the fake has delivered, read as its log grows: the soak's watch loop
    must not cost more the longer it runs, or it slows the fakes it measures through."""

    def __init__(self, api: FakeBotAPI) -> None:
        self.api = api
        self.pos = 0
        self.unsettled: list[Call] = []  # sendMessage calls not answered yet when last read
        self.texts: set[str] = set()
        self.count = 0
        self.window: list[tuple[str, float]] = []

    def read(self) -> None:
        new = self.api.calls_since(self.pos)
        self.pos += len(new)
        calls = [*self.unsettled, *(c for c in new if c.method == "sendmessage")]
        self.unsettled = []
        for c in calls:
            if c.status == 0:
                self.unsettled.append(c)
            elif c.status == 200 and not c.garbled:
                self.count += 1
                text = c.params.get("text", "")
                if text.startswith("echo: "):
                    self.texts.add(text[6:])
                    self.window.append((text[6:], c.at))

    def take_window(self) -> list[tuple[str, float]]:
        window, self.window = self.window, []
        return window


async def settled_rss(gw: Gateway, within: float = 20.0) -> float:
    """The idle figure: RSS once the gateway is ready *and* done warming up. It imports the
    model SDK in the background after its first poll (about 7 MiB, up to seconds on a busy
    machine), so a sample taken a fixed second later was sometimes before it, sometimes after."""
    deadline = time.monotonic() + within
    last = gw.rss_mib()
    while time.monotonic() < deadline:
        await asyncio.sleep(1.0)
        now = gw.rss_mib()
        if abs(now - last) < 0.1:
            return now
        last = now
    return last


async def first_poll(api: FakeBotAPI) -> None:
    """Wait for the gateway's first getUpdates (on a busy machine a start with recovery to do
    may take longer than bench_telegram's 15 s)."""
    after = len(api.calls("getUpdates"))
    await api.wait_for_async(lambda: len(api.calls("getUpdates")) > after, 180)


async def restart(api: FakeBotAPI, config: Path, users: int, sent: set[str]) -> None:
    """The gateway again on the soak's state: it first finishes what the soak left pending
    (recovery) and stops; started once more with nothing pending: idle RSS, then two rounds of
    one message per chat (the first loads every session, the second finds them loaded)."""
    gw = Gateway(config)
    await gw.start()
    try:
        await first_poll(api)
        await drain(api, sent)
    finally:
        await gw.stop()
    gw = Gateway(config)
    await gw.start()
    await first_poll(api)
    print(f"restart: idle RSS {await settled_rss(gw):.1f} MiB (nothing pending)")
    try:
        await rounds(api, gw, users, config.parent / "state")
    finally:
        await gw.stop()


async def drain(api: FakeBotAPI, sent: set[str]) -> None:
    t0 = time.monotonic()
    answers = Answers(api)
    while time.monotonic() - t0 < 900:
        answers.read()
        if sent <= answers.texts:
            break
        await asyncio.sleep(1.0)
    left = len(sent - answers.texts)
    print(
        f"restart: the soak's backlog answered after {time.monotonic() - t0:.0f} s"
        + (f" ({left} still unanswered)" if left else "")
    )


async def rounds(api: FakeBotAPI, gw: Gateway, users: int, state: Path) -> None:
    """One message to every chat, twice, with the gateway's CPU per chat of each round; then
    what loading one session costs, measured directly. (With 200 chats the cache's byte
    bound keeps only some tails, so the second round reloads most sessions too: the
    difference of the rounds no longer isolates a load.) A chat outside the soak answers
    first: the process's one-time costs (the model client and its imports, the first tool
    schemas) are not any chat's."""
    answers = Answers(api)

    async def answered(texts: set[str], within: float) -> None:
        def done() -> bool:
            answers.read()
            return texts <= answers.texts

        await api.wait_for_async(done, within)

    api.private_text("warm up", user_id=FIRST_USER - 1, username=None)
    await answered({"warm up"}, 120)
    print(f"restart: after one answer in a new chat, RSS {gw.rss_mib():.1f} MiB")
    for name in ("first message to each chat (loads its session)", "second message"):
        cpu0 = gw.cpu_seconds()
        t0 = time.monotonic()
        texts = [f"u{FIRST_USER + i} {name[:5]}" for i in range(users)]
        for i, text in enumerate(texts):
            api.private_text(text, user_id=FIRST_USER + i, username=None)
        await answered(set(texts), 300)
        cpu = (gw.cpu_seconds() - cpu0) / users
        print(
            f"restart: {name}: {users} chats answered in {time.monotonic() - t0:.1f} s, "
            f"gateway CPU {cpu * 1000:.2f} ms per chat, RSS {gw.rss_mib():.1f} MiB"
        )
    await gw.stop()
    load_ms, held = load_cost(state)
    print(
        f"restart: a session load costs {load_ms:.2f} ms of CPU (median of 5 passes over the "
        f"{len(held)} sessions, {statistics.mean(held):.0f} messages held each on average)"
    )


def load_cost(state: Path) -> tuple[float, list[int]]:
    """CPU milliseconds to load one session of ``state`` (median pass), and the messages each
    holds once loaded: what the first message to a chat costs beyond its turn."""
    store = SessionStore(state)
    keys = store.keys()
    held = [len(store._load(k).wire) for k in keys]
    passes = []
    for _ in range(5):
        t0 = time.thread_time()
        for k in keys:
            store._load(k)
        passes.append((time.thread_time() - t0) / len(keys) * 1000)
    return statistics.median(passes), held


def report(api: FakeBotAPI, sent: dict[str, Any], state: Path, started: float) -> int:
    """Print the end figures; returns how many messages were answered."""
    texts = Counter(
        c.params["text"][6:] for c in api.sent() if c.params.get("text", "").startswith("echo: ")
    )
    lost = [t for t in sent if texts[t] == 0]
    duplicated = [t for t, n in texts.items() if n > 1]
    sends = [c for c in api.calls("sendMessage") if c.status == 200]
    per_second = Counter(int(c.at - started) for c in sends)
    per_chat_second = Counter((c.params.get("chat_id"), int(c.at - started)) for c in sends)
    size, meta, meta_all, largest = state_figures(state)
    print(
        f"messages {len(sent)}  answered {len(sent) - len(lost)}  unanswered when the soak "
        f"stopped waiting {len(lost)} (still pending in the state folder, or lost)  "
        f"duplicated {len(duplicated)}"
    )
    print(
        f"sends/s overall: max {max(per_second.values(), default=0)}, mean "
        f"{statistics.mean(per_second.values()) if per_second else 0:.1f}; into one chat: max "
        f"{max(per_chat_second.values(), default=0)} in a second; 429s {api.flooded}"
    )
    print(
        f"state folder {size:.1f} MiB, metadata {meta:.0%} of hot session-file bytes "
        f"({meta_all:.0%} counting the archives of consolidated lines), largest session file "
        f"{largest:.2f} MiB"
    )
    answered = len(sent) - len(lost)
    methods = Counter(c.method for c in api.calls())
    print(
        "Bot API calls per answered message: "
        + ", ".join(f"{m} {n / max(answered, 1):.2f}" for m, n in methods.most_common())
    )
    return answered


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, default=50)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--model-delay", type=float, default=0.3)
    ap.add_argument("--tool-ratio", type=float, default=0.1)
    ap.add_argument(
        "--pause",
        type=lambda v: tuple(float(x) for x in v.split(",")),
        default=(1.0, 3.0),
        help="MIN,MAX seconds between one user's messages (default 1,3)",
    )
    ap.add_argument("--unpaced", action="store_true", help="pacing and flood rules off")
    ap.add_argument("--restart", action="store_true", help="then restart and message every chat")
    ap.add_argument("--keep", help="work in this folder and keep it (logs, sessions)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(args.keep) if args.keep else Path(d)
        tmp.mkdir(parents=True, exist_ok=True)
        asyncio.run(soak(args, tmp))


if __name__ == "__main__":
    main()
