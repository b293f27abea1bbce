"""Streaming on Telegram, end to end: ``memobot gateway`` (a real subprocess) against the fake
Bot API (Telegram's flood rules on) and a fake LLM that streams its answer in pieces with pauses
between them, both served from this process's event loop (one monotonic clock).

1. first token -> first visible preview: the fake LLM writes its first content chunk, the fake
   Bot API receives the first draft (private chat) or preview message (group); target < 100 ms;
2. the whole answer with and without streaming (message injected -> final answer received:
   the private chat's sendMessage, the group's last edit or its sendMessage); target: streaming
   no more than 5 % slower;
3. 50 chats streaming at once (25 private, 25 groups), with Telegram's default pacing: drafts,
   edits and sends per second in total and per chat, 429s received (target 0), gateway CPU per
   answer.

    .venv/bin/python bench/bench_stream.py [--samples 10] [--keep DIR]
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

from bench.bench_telegram import Gateway, polls
from tests.fakes.llm_server import FakeLLM, reply
from tests.fakes.telegram_api import BOT_USERNAME, FakeBotAPI, FloodControl
from tests.helpers import config_dict

ANSWER = " ".join(f"Sentence {i} of a streamed answer, long enough to read." for i in range(24))
PIECES, PAUSE = 24, 0.1  # about 2.4 s of writing, like a fast model
LOAD_PIECES, LOAD_PAUSE = 40, 0.25  # about 10 s of writing per answer under load
LOAD_CHATS = 50
_ids = itertools.count(1)


def _first_content(llm: FakeLLM, text: str) -> float:
    [entry] = [r for r in llm.requests if (r.get("last_user") or "").startswith(text)]
    return entry["first_content_at"]


def _chat_calls(api: FakeBotAPI, method: str, chat: int) -> list[Any]:
    return [
        c
        for c in api.calls(method)
        if c.status == 200 and str(c.params.get("chat_id")) == str(chat)
    ]


async def _ask(api: FakeBotAPI, group: bool, text: str) -> tuple[int, float]:
    n = next(_ids)
    chat = -1_000_000 - n if group else 700_000 + n
    t0 = time.monotonic()
    if group:
        api.group_text(f"@{BOT_USERNAME} {text}", chat_id=chat, user_id=600_000 + n)
    else:
        api.private_text(text, user_id=chat)
    return chat, t0


def _final_at(api: FakeBotAPI, chat: int, group: bool) -> float | None:
    """When the final answer arrived: its sendMessage, or in a group its HTML edit."""
    # An answer the preview already showed word for word is "not modified": done as well.
    edits = [
        c
        for c in api.calls("editMessageText")
        if str(c.params.get("chat_id")) == str(chat)
        and c.params.get("parse_mode")
        and (c.status == 200 or "not modified" in str(c.result))
    ]
    sends = [c for c in _chat_calls(api, "sendMessage", chat) if c.params.get("parse_mode")]
    done = edits or sends
    return done[-1].at if done else None


async def latency(api: FakeBotAPI, llm: FakeLLM, group: bool, samples: int, stream: bool):
    """(first token -> preview, message -> final answer) per sample."""
    previews, wholes = [], []
    for i in range(samples):
        text = f"probe {'group' if group else 'private'} {stream} {i}"
        if stream:
            llm.script(reply(ANSWER, pieces=PIECES, chunk_delay=PAUSE))
        else:  # the same model, answering when it has written everything
            llm.script(reply(ANSWER, delay=(PIECES + 3) * PAUSE))
        chat, t0 = await _ask(api, group, text)
        await api.wait_for_async(lambda c=chat: _final_at(api, c, group) is not None, 30)
        final = _final_at(api, chat, group)
        assert final is not None
        wholes.append(final - t0)
        if stream:
            first = _chat_calls(api, "sendMessage" if group else "sendMessageDraft", chat)[0]
            previews.append(first.at - _first_content(llm, text))
        await asyncio.sleep(0.3)
    return previews, wholes


async def load(api: FakeBotAPI, llm: FakeLLM, gw: Gateway) -> dict[str, Any]:
    llm.script(
        *[reply(ANSWER, pieces=LOAD_PIECES, chunk_delay=LOAD_PAUSE) for _ in range(LOAD_CHATS)]
    )
    flooded0 = api.flooded
    calls0 = len(api.calls())
    cpu0 = gw.cpu_seconds()
    chats = []
    t0 = time.monotonic()
    for i in range(LOAD_CHATS):
        group = i % 2 == 1
        chat, _ = await _ask(api, group, f"load {i}")
        chats.append((chat, group))
    await api.wait_for_async(lambda: all(_final_at(api, c, g) is not None for c, g in chats), 120)
    t1 = time.monotonic()
    cpu = gw.cpu_seconds() - cpu0
    shown = [
        c
        for c in api.calls()[calls0:]
        if c.method in ("sendmessagedraft", "editmessagetext", "sendmessage") and c.status == 200
    ]
    refused = [c for c in api.calls()[calls0:] if c.status == 429]
    per_second: dict[int, int] = {}
    per_chat_second: dict[tuple[str, int], int] = {}
    for c in shown:
        sec = int(c.at - t0)
        per_second[sec] = per_second.get(sec, 0) + 1
        key = (str(c.params.get("chat_id")), sec)
        per_chat_second[key] = per_chat_second.get(key, 0) + 1
    permanent = sum(len(api.shown(c)) for c, _ in chats)
    return {
        "seconds": t1 - t0,
        "calls": len(shown),
        "drafts": sum(c.method == "sendmessagedraft" for c in shown),
        "edits": sum(c.method == "editmessagetext" for c in shown),
        "mean_per_s": len(shown) / (t1 - t0),
        "max_per_s": max(per_second.values()),
        "max_chat_per_s": max(per_chat_second.values()),
        "mean_chat_per_s": len(shown) / (t1 - t0) / LOAD_CHATS,
        "flooded": api.flooded - flooded0,
        "429_calls": len(refused),
        "cpu_ms": cpu / LOAD_CHATS * 1000,
        "permanent": permanent,
    }


async def run_gateway(tmp: Path, api: FakeBotAPI, llm: FakeLLM, streaming: bool) -> Gateway:
    telegram = {
        "enabled": True,
        "token": api.token,
        "baseUrl": api.base_url,
        "allowFrom": ["*"],
        "admins": ["*"],  # every sender an admin, as allowFrom "*" alone made them before
        "groupPolicy": "open",
        "pollTimeoutSeconds": 30,
        "streaming": streaming,
    }
    data = config_dict(
        tmp, llm.base_url, agent={"maxConcurrentTurns": 64}, channels={"telegram": telegram}
    )
    config = tmp / f"config-{streaming}.json"
    config.write_text(json.dumps(data))
    gw = Gateway(config)
    await gw.start()
    await polls(api, len(api.calls("getUpdates")))
    return gw


def _ms(values: list[float]) -> str:
    return (
        f"median {statistics.median(values) * 1000:.1f} ms, max {max(values) * 1000:.1f} ms "
        f"(n={len(values)})"
    )


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(args.keep) if args.keep else Path(d)
        tmp.mkdir(parents=True, exist_ok=True)
        async with (
            FakeLLM(log_bodies=False, validate=False) as llm,
            FakeBotAPI(flood=FloodControl()) as api,
        ):
            results: dict[tuple[bool, bool], tuple[list[float], list[float]]] = {}
            for streaming in (True, False):
                gw = await run_gateway(tmp, api, llm, streaming)
                try:
                    for group in (False, True):
                        results[(streaming, group)] = await latency(
                            api, llm, group, args.samples, streaming
                        )
                    if streaming:
                        figures = await load(api, llm, gw)
                finally:
                    await gw.stop()
            for group in (False, True):
                where = "group" if group else "private"
                previews, on = results[(True, group)]
                _, off = results[(False, group)]
                print(f"{where}: first token -> first preview {_ms(previews)} (target < 100 ms)")
                ratio = statistics.median(on) / statistics.median(off)
                print(
                    f"{where}: whole answer streaming {_ms(on)}; without {_ms(off)}; "
                    f"streaming/without {ratio:.3f} (target <= 1.05)"
                )
            f = figures
            print(
                f"{LOAD_CHATS} chats streaming at once (25 private, 25 groups, Telegram's "
                f"default pacing): {f['calls']} drafts/edits/sends ({f['drafts']} drafts, "
                f"{f['edits']} edits) in {f['seconds']:.1f} s = {f['mean_per_s']:.1f}/s on "
                f"average, at most {f['max_per_s']} in one second (Telegram: about 30); per "
                f"chat {f['mean_chat_per_s']:.2f}/s on average, at most {f['max_chat_per_s']} "
                f"in one second; 429s received {f['429_calls']} (target 0); gateway CPU "
                f"{f['cpu_ms']:.1f} ms per answer; permanent messages {f['permanent']} for "
                f"{LOAD_CHATS} answers"
            )


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=10)
    ap.add_argument("--keep", help="work in this folder and keep it (logs, sessions)")
    asyncio.run(main(ap.parse_args()))
