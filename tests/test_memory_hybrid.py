"""Hybrid memory search: words (BM25) and meaning (memory.embeddings), against a real local
embeddings endpoint (tests/fakes/embeddings_server.py) and the real SQLite index."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from bot.config import Config
from bot.memory import embeddings as embeddings_module
from bot.memory.embeddings import BadEmbeddingAnswer, parse_embeddings
from bot.memory.hybrid import Embeddings
from bot.memory.search import MemoryIndex, cmd_search
from bot.memory.vectors import fuse
from bot.tools import ToolContext, build_default_tools
from tests.fakes.embeddings_server import FakeEmbeddings

KEY = "sk-embed-secret-0123456789"


def add_entries(ws: Path, *contents: str, first: int = 1) -> None:
    path = ws / "memory" / "history.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as fh:
        for cursor, content in enumerate(contents, start=first):
            record = {
                "cursor": cursor,
                "timestamp": f"2026-11-{cursor % 28 + 1:02d}T10:00:00.000Z",
                "session": "telegram:1",
                "content": content,
            }
            fh.write(json.dumps(record) + "\n")


def config(tmp_path: Path, base_url: str, model: str = "toy-embed") -> Config:
    agent = {"workspace": str(tmp_path / "ws"), "stateDir": str(tmp_path / "state")}
    emb = {"enabled": True, "baseUrl": base_url, "model": model, "apiKey": KEY, "batchSize": 2}
    return Config.model_validate({"agent": agent, "memory": {"embeddings": emb}})


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
async def fake() -> AsyncIterator[FakeEmbeddings]:
    async with FakeEmbeddings(dim=64) as server:
        yield server


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    add_entries(
        tmp_path / "ws",
        "Sam bought a second-hand automobile from Lena on Tuesday.",
        "The team agreed to ship the billing refactor next sprint.",
        "Priya booked the ferry to Hydra for the holidays.",
    )
    return tmp_path / "ws"


def make(tmp_path: Path, fake: FakeEmbeddings, model: str = "toy-embed") -> Embeddings:
    cfg = config(tmp_path, fake.base_url, model)
    found = Embeddings.from_config(cfg, MemoryIndex(cfg.agent.workspace_path, cfg.agent.state_path))
    assert found is not None
    found.backoff.now = Clock()
    return found


async def embed_all(emb: Embeddings) -> int:
    total = 0
    while embedded := await emb.step():
        total += embedded
    return total


async def tool_search(emb: Embeddings | None, ws: Path, state: Path, query: str) -> str:
    from bot.config import ToolsConfig

    registry = build_default_tools(ToolsConfig(), ws, state, embeddings=emb)
    args = json.dumps({"query": query})
    return await registry.execute("memory_search", args, ToolContext(workspace=ws))


async def test_a_paraphrase_is_found_by_meaning_and_not_by_words(tmp_path, ws, fake):
    emb = make(tmp_path, fake)
    try:
        assert await embed_all(emb) == 3
        # "car" is in no entry; to the endpoint it means what "automobile" means.
        words_only = await tool_search(None, ws, tmp_path / "state", "car purchase")
        assert words_only == "No matches for 'car purchase'."
        hybrid = await tool_search(emb, ws, tmp_path / "state", "car purchase")
        assert hybrid.startswith("1. [memory/history.jsonl#1, ")
        assert "match: meaning" in hybrid and "automobile" in hybrid
        assert "Hydra" not in hybrid  # no concept in common: under the similarity floor
        # A hit found both ways says so; one found only by words too.
        both = await tool_search(emb, ws, tmp_path / "state", "automobile")
        assert both.splitlines()[0].startswith("1. [memory/history.jsonl#1, ")
        assert "match: both" in both.splitlines()[0]
    finally:
        await emb.close()


async def test_the_cli_searches_by_meaning_too(tmp_path, ws, fake, capsys):
    emb = make(tmp_path, fake)
    await embed_all(emb)
    await emb.close()
    cfg = config(tmp_path, fake.base_url)
    args = argparse.Namespace(query=["vehicle"], limit=10, since=None, until=None)
    assert await asyncio.to_thread(cmd_search, cfg, args) == 0
    out = capsys.readouterr().out
    assert "memory/history.jsonl#1" in out and "match: meaning" in out
    fake.fail_with = 503
    assert await asyncio.to_thread(cmd_search, cfg, argparse.Namespace(
        query=["ferry"], limit=10, since=None, until=None)) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "memory/history.jsonl#3" in out
    assert "(Matched by words only: the embeddings endpoint http://127.0.0.1:" in out
    assert "failed (HTTP 503) after 1 tries.)" in out


async def test_with_the_endpoint_down_words_come_back_with_one_note(tmp_path, ws, fake, caplog):
    emb = make(tmp_path, fake)
    try:
        await embed_all(emb)
        asked = len(fake.requests)
        fake.fail_with = 503
        caplog.set_level(logging.INFO, "bot.memory")
        first = await tool_search(emb, ws, tmp_path / "state", "ferry")
        second = await tool_search(emb, ws, tmp_path / "state", "car")
        assert first.splitlines()[0].startswith("1. [memory/history.jsonl#3, ")
        assert "match:" not in first  # by words alone, as without embeddings
        assert first.count("Matched by words only") == 1
        assert "HTTP 503" in first
        assert second.startswith("No matches for 'car'.\n(Matched by words only")
        # The second search did not wait for the endpoint: its outage is known.
        assert len(fake.requests) == asked + 1
        # After the back-off the endpoint is asked again: still down, not logged again.
        emb.backoff.now.t += 3600  # type: ignore[attr-defined]
        third = await tool_search(emb, ws, tmp_path / "state", "ferry")
        assert "Matched by words only" in third and len(fake.requests) == asked + 2
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "by words only" in warnings[0].getMessage()
        assert KEY not in caplog.text
        # Once the back-off has passed and the endpoint answers, meaning is back.
        fake.fail_with = None
        emb.backoff.now.t += 3600  # type: ignore[attr-defined]
        back = await tool_search(emb, ws, tmp_path / "state", "car")
        assert "match: meaning" in back and "Matched by words only" not in back
        assert fake.requests[-1]["model"] == "toy-embed"
    finally:
        await emb.close()


async def test_the_background_task_embeds_everything_then_waits(tmp_path, ws, fake):
    emb = make(tmp_path, fake)
    stored = asyncio.Event()
    store = emb.index.store_vectors

    def store_and_tell(*args: object) -> None:
        store(*args)  # type: ignore[arg-type]
        stored.set()

    emb.index.store_vectors = store_and_tell  # type: ignore[method-assign]
    warmed = asyncio.Event()
    warm = emb.index.warm_vectors

    def warm_and_tell() -> None:
        warm()
        warmed.set()

    emb.index.warm_vectors = warm_and_tell  # type: ignore[method-assign]
    task = asyncio.create_task(emb.run())
    try:
        while emb.index.vector_counts(emb.model) != (3, 3):
            await asyncio.wait_for(stored.wait(), 10)
            stored.clear()
        assert len(fake.requests) == 2  # batches of two
        await asyncio.wait_for(warmed.wait(), 10)  # then loads what searches scan
        assert emb.index._vectors.upto == 3  # off their path
        add_entries(ws, "Lena adopted a dog.", first=4)
        emb.wake()  # as after an archive write: no wait for the next minute
        await asyncio.wait_for(stored.wait(), 10)
        assert fake.inputs[-1] == "Lena adopted a dog."
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await emb.close()


async def test_a_model_change_embeds_everything_again(tmp_path, ws, fake, caplog):
    first = make(tmp_path, fake, "model-a")
    assert await embed_all(first) == 3
    assert await first.step() == 0  # nothing left: nothing asked
    asked = len(fake.inputs)
    await first.close()
    caplog.set_level(logging.INFO, "bot.memory")
    second = make(tmp_path, fake, "model-b")
    try:
        assert second.index.vector_counts(second.model)[0] == 0
        assert await embed_all(second) == 3
        assert len(fake.inputs) == asked + 3
        assert {body["model"] for body in fake.requests[-2:]} == {"model-b"}
        assert "embedding everything again" in caplog.text
        assert second.index.vector_counts(second.model) == (3, 3)
    finally:
        await second.close()


async def test_a_deleted_index_is_rebuilt_and_embedded_again(tmp_path, ws, fake):
    emb = make(tmp_path, fake)
    try:
        await embed_all(emb)
        for path in (tmp_path / "state" / "index").iterdir():
            path.unlink()
        # Until the background embeds again, the search is by words and says why.
        result = await tool_search(emb, ws, tmp_path / "state", "car")
        assert "Matched by words only: the meaning index is not built yet" in result
        assert await embed_all(emb) == 3
        result = await tool_search(emb, ws, tmp_path / "state", "car")
        assert "memory/history.jsonl#1" in result and "match: meaning" in result
    finally:
        await emb.close()


async def test_only_new_entries_are_embedded_and_a_rewrite_keeps_vectors(tmp_path, ws, fake):
    emb = make(tmp_path, fake)
    try:
        await embed_all(emb)
        add_entries(ws, "Lena adopted a dog.", first=4)
        asked = len(fake.inputs)
        assert await embed_all(emb) == 1
        assert fake.inputs[asked:] == ["Lena adopted a dog."]
        # A compaction rewrites history.jsonl: new doc ids, the same texts, no new requests.
        path = ws / "memory" / "history.jsonl"
        path.write_text(path.read_text() + "")
        lines = path.read_text().splitlines(keepends=True)
        (ws / "memory" / "history-2026-11.jsonl").write_text("".join(lines[:2]))
        path.write_text("".join(lines[2:]))
        assert await embed_all(emb) == 0
        assert len(fake.inputs) == asked + 1
    finally:
        await emb.close()


def each(vector: object) -> object:
    """An answer giving every input ``vector`` (a function of the input's index if callable)."""

    def answer(body: dict) -> dict:
        return {
            "data": [
                {"embedding": vector(i) if callable(vector) else vector, "index": i}
                for i in range(len(body["input"]))
            ]
        }

    return answer


@pytest.mark.parametrize(
    "answer",
    [
        lambda body: {"data": []},  # too few
        lambda body: {"data": [{"embedding": [1.0, 0.0], "index": 0}] * len(body["input"])},
        each(lambda i: [1.0] * (i + 2)),
        each(["1", 2]),
        each([float("nan"), 1.0]),
        each([0.0, 0.0]),
        lambda body: ["not", "an", "object"],
    ],
    ids=["count", "duplicate-index", "ragged", "strings", "nan", "zero", "list"],
)
async def test_a_bad_answer_stores_nothing_and_search_goes_on(tmp_path, ws, fake, answer):
    emb = make(tmp_path, fake)
    try:
        fake.answer = answer
        with pytest.raises(BadEmbeddingAnswer):
            await emb.step()
        assert emb.index.vector_counts(emb.model)[0] == 0
        result = await tool_search(emb, ws, tmp_path / "state", "ferry")
        assert "memory/history.jsonl#3" in result and "Matched by words only" in result
    finally:
        await emb.close()


async def test_an_oversized_answer_is_refused_before_it_is_read(tmp_path, ws, fake, monkeypatch):
    monkeypatch.setattr(embeddings_module, "MAX_RESPONSE_BYTES", 10_000)
    fake.raw_answer = b'{"data": [' + b" " * 50_000 + b"]}"
    emb = make(tmp_path, fake)
    try:
        with pytest.raises(BadEmbeddingAnswer, match="answered 50012 B"):
            await emb.step()
        # Without a length announced (chunked): cut off while reading.
        fake.raw_answer = None
        fake.answer = lambda body: {"data": [], "padding": "x" * 50_000}
        fake.chunked = True
        with pytest.raises(BadEmbeddingAnswer, match="more than 10000 B"):
            await emb.step()
        fake.answer, fake.raw_answer = None, b'{"data": [nope'
        with pytest.raises(BadEmbeddingAnswer, match="not JSON"):
            await emb.step()
    finally:
        await emb.close()


async def test_a_change_of_dimension_under_one_model_is_refused(tmp_path, ws, fake):
    emb = make(tmp_path, fake)
    try:
        assert await emb.step() == 2
        fake.dim = 32
        with pytest.raises(ValueError, match="32 dimensions, earlier ones of 64"):
            await emb.step()
        assert emb.index.vector_counts(emb.model) == (2, 3)
    finally:
        await emb.close()


async def test_a_text_the_endpoint_refuses_is_skipped_alone(tmp_path, ws, fake):
    fake.refuse_containing = "billing"
    emb = make(tmp_path, fake)
    try:
        assert await embed_all(emb) == 3
        assert emb.index.vector_counts(emb.model) == (3, 3)
        asked = len(fake.requests)
        assert await emb.step() == 0 and len(fake.requests) == asked  # not asked again
        result = await tool_search(emb, ws, tmp_path / "state", "automobile")
        assert "match: both" in result
    finally:
        await emb.close()


async def test_the_key_is_sent_and_never_shown(tmp_path, ws, fake, caplog):
    emb = make(tmp_path, fake)
    try:
        fake.fail_with = 401
        caplog.set_level(logging.DEBUG)
        result = await tool_search(emb, ws, tmp_path / "state", "ferry")
        assert "HTTP 401" in result and KEY not in result and KEY not in caplog.text
        assert KEY not in repr(emb.client.endpoint)
    finally:
        await emb.close()


async def test_each_line_of_an_entry_is_found_by_its_own_meaning(tmp_path, ws, fake):
    add_entries(
        ws,
        "[2026-11-20 10:00 → 10:40 UTC] Small talk about the weather in Oslo and a recipe.\n"
        "Facts:\n- Lena said her physician is Dr Okafor.\n- Lena plays squash on Sundays.\n"
        "- Lena reads a lot of Russian novels and keeps bees on the roof.",
        first=4,
    )
    emb = make(tmp_path, fake)
    try:
        await embed_all(emb)
        # The whole entry has too many concepts to be near "GP"; its line about the physician
        # is (the word "GP" is in no entry).
        result = await tool_search(emb, ws, tmp_path / "state", "GP")
        first = result.splitlines()[0]
        assert first.startswith("1. [memory/history.jsonl#4, ") and "match: meaning" in first
        assert "… Facts: - Lena said her physician is Dr Okafor. …" in first
        # A new entry is searchable by meaning once embedded: the cache reads the new rows.
        add_entries(ws, "Bruno parked his automobile in the garage.", first=5)
        assert await embed_all(emb) == 1
        result = await tool_search(emb, ws, tmp_path / "state", "vehicle Bruno")
        assert "memory/history.jsonl#5" in result.splitlines()[0]
    finally:
        await emb.close()


async def test_a_chat_searching_its_own_history_gets_no_other_chats_meaning(tmp_path, fake):
    ws = tmp_path / "ws"
    add_entries(ws, "Sam bought a second-hand automobile from Lena on Tuesday.")
    path = ws / "memory" / "history.jsonl"
    record = {"cursor": 2, "timestamp": "2026-11-03T10:00:00.000Z", "session": "telegram:-5"}
    line = json.dumps({**record, "content": "The group rented a vehicle for the trip."})
    path.write_text(path.read_text() + line + "\n")
    emb = make(tmp_path, fake)
    try:
        await embed_all(emb)
        found = await emb.search("car", session="telegram:-5")
        assert [hit.source for hit in found.hits] == ["memory/history.jsonl#2"]
        everything = await emb.search("car")
        assert {hit.source for hit in everything.hits} == {
            "memory/history.jsonl#1",
            "memory/history.jsonl#2",
        }
    finally:
        await emb.close()


async def test_the_panel_search_is_the_same_hybrid_search(tmp_path, fake):
    from bot.config import load_config
    from tests.helpers import write_config
    from tests.helpers.web import browsing, panel_section

    emb = {"enabled": True, "baseUrl": fake.base_url, "model": "toy-embed"}
    path = write_config(
        tmp_path, "http://127.0.0.1:9/v1", web=panel_section(), memory={"embeddings": emb}
    )
    cfg, _ = load_config(path)
    add_entries(cfg.agent.workspace_path, "Sam bought a second-hand automobile from Lena.")
    async with browsing(cfg, path) as b:
        await b.login()
        # memobot web alone: the search embeds its query; nothing is embedded yet.
        _, page, _ = await b.get("/memory/search?q=automobile")
        assert "memory/history.jsonl#1" in page
        assert "Matched by words only: the meaning index is not built yet" in page
        own = Embeddings.from_config(
            cfg, MemoryIndex(cfg.agent.workspace_path, cfg.agent.state_path)
        )
        assert own is not None
        await embed_all(own)
        await own.close()
        _, page, _ = await b.get("/memory/search?q=car")
        assert "memory/history.jsonl#1" in page and "match: meaning" in page
        assert "Matched by words only" not in page


async def test_the_agent_stack_searches_and_embeds_with_one_object(tmp_path, fake):
    from types import SimpleNamespace

    from bot.app import build_agent
    from bot.config import load_config
    from tests.helpers import write_config
    from tests.helpers.web import browsing, panel_section

    emb = {"enabled": True, "baseUrl": fake.base_url, "model": "toy-embed"}
    path = write_config(
        tmp_path, "http://127.0.0.1:9/v1", web=panel_section(), memory={"embeddings": emb}
    )
    cfg, _ = load_config(path)
    stack = build_agent(cfg, path)
    try:
        assert stack.embeddings is not None  # the gateway runs its run() as a task
        tool = stack.loop.turns.tools.get("memory_search")
        assert tool is not None and tool.embeddings is stack.embeddings  # type: ignore[attr-defined]
        assert "same meaning in other words" in tool.schema()["function"]["description"]
        add_entries(cfg.agent.workspace_path, "Sam bought a second-hand automobile from Lena.")
        await embed_all(stack.embeddings)
        async with browsing(cfg, path, gateway=SimpleNamespace(stack=stack)) as b:
            await b.login()
            _, page, _ = await b.get("/memory/search?q=car")
            assert "memory/history.jsonl#1" in page and "match: meaning" in page
        inputs = len(fake.inputs)
        await stack.embeddings.search("car")
        assert len(fake.inputs) == inputs + 1  # the query only: the panel used the same vectors
    finally:
        await stack.close()


async def test_an_entry_consolidation_archives_wakes_the_embedder(tmp_path, fake, monkeypatch):
    """The gateway's wiring: an entry consolidation archives is embedded at once, not at the
    embedder's next look (IDLE_SECONDS, an hour here: only the wake gets it there in time)."""
    from bot.app import build_agent
    from bot.config import load_config
    from bot.llm import LLMResponse, ToolCall
    from bot.memory import hybrid
    from bot.memory.consolidate import SUMMARY_TOOL
    from tests.helpers import write_config

    class Summariser:  # the summarising model: one save_summary call
        async def chat(self, *args: object, **kw: object) -> LLMResponse:
            summary = json.dumps({"summary": "Sam bought a second-hand automobile."})
            return LLMResponse(None, (ToolCall("c1", SUMMARY_TOOL, summary),), "tool_calls")

    monkeypatch.setattr(hybrid, "IDLE_SECONDS", 3600.0)
    emb = {"enabled": True, "baseUrl": fake.base_url, "model": "toy-embed"}
    path = write_config(tmp_path, "http://127.0.0.1:9/v1", memory={"embeddings": emb})
    cfg, _ = load_config(path)
    stack = build_agent(cfg, path)
    embeddings = stack.embeddings
    assert embeddings is not None
    consolidator = stack.loop.consolidator
    consolidator.provider = Summariser()  # type: ignore[assignment]
    idle = asyncio.Event()
    warm = embeddings.index.warm_vectors

    def warm_and_tell() -> None:  # called once a step finds nothing left to embed
        warm()
        idle.set()

    embeddings.index.warm_vectors = warm_and_tell  # type: ignore[method-assign]
    task = asyncio.create_task(embeddings.run())
    try:
        await asyncio.wait_for(idle.wait(), 10)  # it looked, found nothing: waits an hour
        idle.clear()
        session = stack.store.get("telegram:1")
        said = [{"role": "user", "content": "I got a car"}, {"role": "assistant", "content": "Ok"}]
        stack.store.append(session, said, fsync=False)
        result = await consolidator.consolidate("telegram:1", keep=0)
        assert result is not None and result.cursor == 1 and not result.raw
        await asyncio.wait_for(idle.wait(), 10)  # woken: embedded it, idle again
        assert any("Sam bought a second-hand automobile." in text for text in fake.inputs)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await stack.close()


def test_embeddings_off_by_default_and_llm_endpoint_when_asked(tmp_path):
    from bot.memory.embeddings import endpoint_from_config

    off = Config.model_validate({})
    assert endpoint_from_config(off) is None
    on = Config.model_validate(
        {
            "llm": {"baseUrl": "http://127.0.0.1:9/v1", "apiKey": "sk-llm-key-1234"},
            "memory": {"embeddings": {"enabled": True}},
        }
    )
    endpoint = endpoint_from_config(on)
    assert endpoint is not None and endpoint.url == "http://127.0.0.1:9/v1"
    assert endpoint.headers["Authorization"] == "Bearer sk-llm-key-1234"
    # A server of its own never gets llm's key.
    other = on.model_copy(deep=True)
    other.memory.embeddings.base_url = "http://127.0.0.1:8/v1"
    endpoint = endpoint_from_config(other)
    assert endpoint is not None and "Authorization" not in endpoint.headers


def test_fusion_ranks_by_both_and_names_the_kind():
    fused = fuse([1, 2, 3], [3, 4])
    assert [doc for doc, _, _ in fused] == [3, 1, 2, 4]
    assert {doc: kind for doc, _, kind in fused} == {
        1: "words",
        2: "words",
        3: "both",
        4: "meaning",
    }


def test_a_partial_words_ranking_counts_half():
    assert [doc for doc, _, _ in fuse([1, 2], [2, 3])] == [2, 1, 3]
    assert [doc for doc, _, _ in fuse([1, 2], [3, 2], words_weight=0.5)] == [2, 3, 1]


def test_parse_embeddings_orders_by_index_and_normalises():
    rows = parse_embeddings(
        {"data": [{"index": 1, "embedding": [0, 2]}, {"index": 0, "embedding": [3, 4]}]}, 2
    )
    assert np.allclose(rows, [[0.6, 0.8], [0.0, 1.0]])
    with pytest.raises(BadEmbeddingAnswer, match="dimensions"):
        parse_embeddings({"data": [{"embedding": [1.0] * 9000}]}, 1)


def test_an_integer_too_large_for_a_float_is_a_bad_answer():
    # JSON allows integers of any size; float() of 10**400 raises OverflowError, which no
    # caller expects (it stopped the background task for good).
    raw = b'{"data": [{"embedding": [1' + b"0" * 400 + b', 1], "index": 0}]}'
    with pytest.raises(BadEmbeddingAnswer):
        embeddings_module._decode(raw, 1)


async def until_done_or(task: asyncio.Task, event: asyncio.Event) -> None:
    """Wait for ``event``; fail at once if ``task`` ends first."""
    waiter = asyncio.ensure_future(event.wait())
    done, _ = await asyncio.wait({task, waiter}, timeout=10, return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()
    if task in done:
        raise AssertionError(f"the background task ended: {task.exception()!r}")
    assert waiter in done, "timed out"


async def test_the_background_task_outlives_an_index_error(tmp_path, ws, fake, caplog):
    import sqlite3

    emb = make(tmp_path, fake)
    failed, stored = asyncio.Event(), asyncio.Event()
    pending, store = emb.index.pending_texts, emb.index.store_vectors

    def full_once(model: str, limit: int) -> list:
        if not failed.is_set():
            failed.set()  # SQLite's own error for a full disk is not an OSError
            raise sqlite3.OperationalError("database or disk is full")
        return pending(model, limit)

    def store_and_tell(*args: object) -> None:
        store(*args)  # type: ignore[arg-type]
        stored.set()

    emb.index.pending_texts = full_once  # type: ignore[method-assign]
    emb.index.store_vectors = store_and_tell  # type: ignore[method-assign]
    caplog.set_level(logging.INFO, "bot.memory")
    task = asyncio.create_task(emb.run())
    try:
        await until_done_or(task, failed)
        emb.wake()  # instead of the minute's wait
        await until_done_or(task, stored)
        assert "cannot store vectors: database or disk is full" in caplog.text
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await emb.close()


async def test_meaning_keeps_to_the_same_privacy_scope_as_words(tmp_path, fake):
    """A guest sharing the owner's memory finds the memory files, the owner's chats and its
    own by meaning too, never another person's chat; one not sharing it, only its own."""
    from bot.bus import InboundMessage
    from bot.config import ToolsConfig
    from bot.kinds import with_kind
    from bot.privacy import guest_scope

    ws = tmp_path / "ws"
    path = ws / "memory" / "history.jsonl"
    path.parent.mkdir(parents=True)
    chats = {
        "telegram:1001": "Ada washed the automobile on Sunday.",  # the owner's chat
        "telegram:3003": "Bob said his automobile is a teal Volvo.",  # another person's
        "telegram:4004": "Carol sold her automobile to a neighbour.",  # the guest's own
    }
    lines = [
        {"cursor": n, "timestamp": "2026-11-02T10:00:00.000Z", "session": key, "content": text}
        for n, (key, text) in enumerate(chats.items(), start=1)
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    (ws / "USER.md").write_text("Ada owns an automobile she calls Bessie.\n")
    emb = make(tmp_path, fake)
    try:
        await embed_all(emb)
        registry = build_default_tools(
            ToolsConfig(),
            ws,
            tmp_path / "state",
            owner_chat=lambda key: key == "telegram:1001",
            embeddings=emb,
        )
        carol = with_kind(
            InboundMessage(
                "telegram", "4004", "4004", "hi", metadata={"is_group": False, "is_admin": False}
            )
        )
        args = json.dumps({"query": "vehicle"})  # in no entry: every hit is by meaning
        for share, wanted in (
            (True, {"Ada washed", "Bessie", "Carol sold"}),
            (False, {"Carol sold"}),
        ):
            ctx = ToolContext(workspace=ws, scope=guest_scope(carol, share=share))
            out = await registry.execute("memory_search", args, ctx)
            assert "match: meaning" in out, out
            assert "teal Volvo" not in out, out
            found = {text for text in ("Ada washed", "Bessie", "Carol sold") if text in out}
            assert found == wanted, out
    finally:
        await emb.close()


async def test_a_key_in_the_base_urls_query_is_never_shown(tmp_path, ws, fake, caplog):
    """Some servers take their key as a query parameter (baseUrl ".../v1?key=..."); a server
    or proxy that echoes the URL it was asked in its error must not put it in the note the
    model, a guest or the panel reads."""
    secret = "q-embed-secret-9876543210"
    cfg = config(tmp_path, f"{fake.base_url}?key={secret}")
    emb = Embeddings.from_config(cfg, MemoryIndex(cfg.agent.workspace_path, cfg.agent.state_path))
    assert emb is not None
    try:
        fake.fail_with = 401
        caplog.set_level(logging.DEBUG)
        result = await tool_search(emb, ws, tmp_path / "state", "ferry")
        assert "HTTP 401" in result and "[redacted]" in result
        assert secret not in result and secret not in caplog.text
    finally:
        await emb.close()


async def test_a_text_answered_badly_alone_does_not_stop_the_others(tmp_path, ws, fake):
    """An endpoint that gives one text a NaN (or zero) vector, as some local servers do for
    odd input: that text is skipped, the others are embedded. Before, the whole batch failed
    at every try, and as the newest texts come first, nothing new was ever embedded again."""
    emb = make(tmp_path, fake)

    def nan_for_billing(body: dict) -> dict:
        return {
            "data": [
                {"index": i, "embedding": [float("nan")] * fake.dim}
                if "billing" in text
                else {"index": i, "embedding": fake.vector(text)}
                for i, text in enumerate(body["input"])
            ]
        }

    fake.answer = nan_for_billing
    try:
        assert await embed_all(emb) == 3
        assert emb.index.vector_counts(emb.model) == (3, 3)
        asked = len(fake.requests)
        assert await emb.step() == 0 and len(fake.requests) == asked  # not asked again
        assert emb.problem == ""
        result = await tool_search(emb, ws, tmp_path / "state", "car")
        assert "memory/history.jsonl#1" in result and "match: meaning" in result
    finally:
        await emb.close()


async def test_with_embeddings_off_indexing_cuts_no_pieces(tmp_path, ws, fake):
    """Embeddings are off by default: indexing then does what it did before them (cutting and
    hashing pieces cost a third more time and a tenth more disk at 100,000 entries). The
    pieces are cut when the embedder asks, also for what a process with them off indexed,
    and a file that process saw rewritten keeps its vectors."""
    import sqlite3
    from contextlib import closing

    plain = MemoryIndex(ws, tmp_path / "state")
    assert plain.search("ferry")
    (ws / "USER.md").write_text("Ada drives an old automobile.\n")
    plain.refresh()
    with closing(sqlite3.connect(plain.path)) as conn:
        assert conn.execute("SELECT count(*) FROM piece").fetchone()[0] == 0
    emb = make(tmp_path, fake)
    try:
        assert await embed_all(emb) == 4
        asked = len(fake.inputs)
        # memobot memory search (embeddings off) sees history.jsonl rewritten: new doc rows.
        path = ws / "memory" / "history.jsonl"
        lines = path.read_text().splitlines(keepends=True)
        (ws / "memory" / "history-2026-11.jsonl").write_text("".join(lines[:2]))
        path.write_text("".join(lines[2:]))
        plain.refresh()
        assert await embed_all(emb) == 0 and len(fake.inputs) == asked
        result = await tool_search(emb, ws, tmp_path / "state", "car")
        assert "memory/history-2026-11.jsonl#1" in result and "USER.md#1" in result
    finally:
        await emb.close()


async def test_a_guest_is_told_words_only_without_the_endpoints_address(tmp_path, ws, fake):
    """The note names the endpoint and what it said, for the owner; a guest's chat (and a
    group) is told only that the search was by words: the address of a server on the owner's
    network, and its error text, are not theirs to read."""
    from bot.bus import InboundMessage
    from bot.config import ToolsConfig
    from bot.kinds import with_kind
    from bot.privacy import guest_scope

    emb = make(tmp_path, fake)
    try:
        await embed_all(emb)
        fake.fail_with = 503
        registry = build_default_tools(ToolsConfig(), ws, tmp_path / "state", embeddings=emb)
        guest = with_kind(
            InboundMessage(
                "telegram", "1", "4004", "hi", metadata={"is_group": False, "is_admin": False}
            )
        )
        ctx = ToolContext(workspace=ws, scope=guest_scope(guest, share=False))
        out = await registry.execute("memory_search", json.dumps({"query": "ferry"}), ctx)
        assert "memory/history.jsonl#3" in out and "Matched by words only" in out, out
        assert "127.0.0.1" not in out and "503" not in out, out
        owner = await tool_search(emb, ws, tmp_path / "state", "ferry")
        assert fake.base_url in owner
    finally:
        await emb.close()


async def test_a_search_reads_one_snapshot_while_vectors_change(tmp_path, ws, fake, monkeypatch):
    """The in-memory vectors are found by row id, then joined to their texts. Vectors dropped
    (a memory file edited) and new ones stored between the two, by the background task or
    another process, can reuse the row ids (SQLite reuses the highest): the join then named
    another text as the match. The search reads one snapshot of the index."""
    import sqlite3
    from contextlib import closing

    from bot.memory import vectors as vectors_module

    emb = make(tmp_path, fake)
    try:
        await embed_all(emb)
        await asyncio.to_thread(emb.index.warm_vectors)
        before = [(hit.source, hit.kind) for hit in (await emb.search("car")).hits]
        real = vectors_module.nearest

        def nearest_then_vectors_change(*args: object, **kwargs: object) -> object:
            found = real(*args, **kwargs)  # type: ignore[arg-type]
            with closing(sqlite3.connect(emb.index.path, isolation_level=None)) as other:
                best = found[0][0]  # type: ignore[index]  # the best match's vector's row
                rows = other.execute("SELECT rowid, digest, vec FROM vec WHERE rowid != ?", (best,))
                row, digest, blob = rows.fetchone()  # another text's: now stored at that row
                other.execute("BEGIN IMMEDIATE")
                other.execute("DELETE FROM vec WHERE rowid IN (?, ?)", (best, row))
                insert = "INSERT INTO vec(rowid, digest, vec) VALUES (?, ?, ?)"
                other.execute(insert, (best, digest, blob))
                other.execute("UPDATE meta SET value = value + 1 WHERE key = 'vec_epoch'")
                other.execute("COMMIT")
            return found

        monkeypatch.setattr(vectors_module, "nearest", nearest_then_vectors_change)
        found = await emb.search("car")
        assert [(hit.source, hit.kind) for hit in found.hits] == before
    finally:
        await emb.close()


def test_embeddings_off_load_neither_numpy_nor_the_client(tmp_path, monkeypatch):
    """Off (the default), nothing of them is loaded: memobot memory search started 0.3 s
    slower (numpy, aiohttp) and the gateway carried numpy for nothing."""
    import sys

    for name in ("bot.memory.embeddings", "bot.memory.numeric", "bot.memory.vectors"):
        monkeypatch.setitem(sys.modules, name, None)  # importing it raises ImportError
    index = MemoryIndex(tmp_path / "ws", tmp_path / "state")
    assert Embeddings.from_config(Config.model_validate({}), index) is None


async def test_pieces_are_cut_a_batch_at_a_time_past_blank_entries(tmp_path, ws, fake, monkeypatch):
    """Cutting a large archive into pieces holds the index's write lock a batch at a time (a
    search indexing what is new waits that long, not minutes); entries without a line of
    text have no piece and do not keep the cutting going round."""
    from bot.memory import vector_store

    monkeypatch.setattr(vector_store, "CUT_BATCH", 2)
    add_entries(ws, " ", "\n", " ", "\t", first=4)  # a full batch of blanks, and more
    add_entries(ws, "Lena adopted a dog.", first=8)
    emb = make(tmp_path, fake)
    try:
        assert await asyncio.wait_for(embed_all(emb), 10) == 4
        assert emb.index.vector_counts(emb.model) == (4, 4)
    finally:
        await emb.close()


async def test_an_idle_look_for_work_scans_nothing_when_nothing_changed(
    tmp_path, ws, fake, monkeypatch
):
    """Once everything is embedded, the background task looks again every minute: finding
    the texts without a vector and the vectors without a text scanned the whole index each
    time (0.4 s of CPU a minute at 100,000 entries). Unless the indexed files changed, there
    is nothing to find."""
    from bot.memory import vector_store

    emb = make(tmp_path, fake)
    try:
        await embed_all(emb)
        scans: list[str] = []
        for name in ("pending", "drop_unused"):
            real = getattr(vector_store, name)
            monkeypatch.setattr(
                vector_store,
                name,
                lambda *a, _real=real, _name=name: scans.append(_name) or _real(*a),
            )
        assert await emb.step() == 0 and await emb.step() == 0
        assert scans == []
        add_entries(ws, "Lena adopted a dog.", first=4)
        assert await emb.step() == 1
        assert await emb.step() == 0 and "drop_unused" in scans
        scans.clear()
        assert await emb.step() == 0 and scans == []
    finally:
        await emb.close()


async def test_a_redirect_is_not_followed_with_the_key(tmp_path, ws, fake):
    """An endpoint answering 307 to another host: following it would carry the key there."""
    from aiohttp import web

    from bot.memory.embeddings import EmbeddingRejected

    async def elsewhere(request: web.Request) -> web.Response:
        raise web.HTTPTemporaryRedirect(f"{fake.base_url}/embeddings")

    app = web.Application()
    app.router.add_post("/v1/embeddings", elsewhere)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    cfg = config(tmp_path, f"http://127.0.0.1:{runner.addresses[0][1]}/v1")
    emb = Embeddings.from_config(cfg, MemoryIndex(cfg.agent.workspace_path, cfg.agent.state_path))
    assert emb is not None
    try:
        with pytest.raises(EmbeddingRejected, match="HTTP 307"):
            await emb.step()
        assert fake.requests == []  # the other host never heard of it, nor of the key
    finally:
        await emb.close()
        await runner.cleanup()


async def test_the_panel_alone_loads_the_embeddings_client_off_the_event_loop(
    tmp_path, ws, fake, monkeypatch
):
    """memobot web alone makes the search's Embeddings itself: loading numpy (0.1-0.3 s the
    first time) is blocking work, done in a thread, not on the panel's event loop."""
    import threading

    from bot.web.memory_data import Found, run_search

    cfg = config(tmp_path, fake.base_url)
    threads: list[bool] = []
    made = Embeddings.from_config

    def from_config(*args: object) -> object:
        threads.append(threading.current_thread() is threading.main_thread())
        return made(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(Embeddings, "from_config", from_config)
    found = await run_search(cfg, Found("ferry", "", ""))
    assert found.searched and threads == [False]


async def test_an_endpoint_giving_only_nan_costs_three_requests_a_try(tmp_path, ws, fake):
    emb = make(tmp_path, fake)
    try:
        fake.answer = each([float("nan")] * 4)
        with pytest.raises(BadEmbeddingAnswer):
            await emb.step()
        assert len(fake.requests) == 3  # the batch, its first text alone, a plain word
        assert emb.index.vector_counts(emb.model)[0] == 0
    finally:
        await emb.close()
