"""Memory search at scale: index build time and search latency over 100,000 history entries.

Builds a temporary workspace whose memory/history.jsonl holds N generated consolidation
summaries (names, projects, places, dates, decisions; a fixed seed, so every run sees the same
text), times the first full index build, an incremental sync after 100 appended entries, and then
S searches of several kinds (a rare word from the middle of an entry, common words, two words,
prefixes, with and without a date range). Target: under 50 ms per search once the index is built.

``--hybrid``: then every entry is also given a vector (``--dim`` dimensions) by the stand-in
embedding of tests/fakes/embeddings_server.py (a hashed bag of concepts: not a real model, but
vectors of the real size, stored as the gateway stores them), and the same searches are timed
as hybrid searches (BM25 and the brute-force nearest neighbours, fused), with the index's size
before and after the vectors. The query's own vector is computed in-process here; one round
trip to a local endpoint is timed apart.

    .venv/bin/python bench/bench_search.py [--entries 100000] [--searches 200] [--seed 7]
        [--hybrid [--dim 256]]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bot.memory.search import MemoryIndex

NAMES = (
    "Alice Bruno Chiara Dmitri Elena Farid Greta Hiroshi Ines Jonas Keiko Lars Maya Nadia Omar "
    "Priya Quentin Rosa Stefan Tamsin Uma Viktor Wanda Xavier Yusuf Zoe Amara Bastian Carmen "
    "Dario Emil Fatima Gustav Hana Ivo Jana Kofi Lena Mateo Noor"
).split()
PROJECTS = (
    "Falcon Orchard Lighthouse Tundra Mosaic Harbor Quill Ember Atlas Juniper Beacon Cobalt"
).split()
PLACES = "Berlin Lisbon Osaka Nairobi Montreal Krakow Oslo Lyon Porto Seoul Tallinn Austin".split()
TOPICS = (
    "budget roadmap launch invoice migration hiring onboarding backup deployment release "
    "dentist appointment birthday vacation flight rent contract review interview workshop "
    "newsletter database outage refactor garden marathon recipe concert mortgage insurance"
).split()
DECISIONS = (
    "decided to postpone {topic} until {day}",
    "agreed that {name} owns the {topic} for {project}",
    "chose {place} for the {topic} offsite",
    "will revisit the {topic} after the {project} review",
    "cancelled the {topic} because {name} is travelling to {place}",
    "moved the {project} {topic} to {day}",
)
SENTENCES = (
    "The user talked with {name} about the {topic} of project {project}.",
    "{name} asked whether the {topic} could be finished before {day}.",
    "They {decision}.",
    "The user prefers short written updates on the {topic} over calls.",
    "{name} mentioned a problem with the {topic}: the {codename} step failed twice.",
    "Reminder set: {topic} with {name} in {place} on {day}.",
    "The user shared notes from the {project} meeting in {place}.",
    "Open question for {name}: who approves the {topic} budget for {project}?",
)
SESSIONS = ("telegram:5551234", "telegram:5559876", "discord:8812", "slack:C042", "cli:direct")
SYLLABLES = "ka lo mi ne ru sa ti vo ze ba de fi go hu ja ke".split()


def codename(rng: random.Random) -> str:
    """A made-up word; with 16**3 of them, each appears in only a handful of entries."""
    return "".join(rng.choice(SYLLABLES) for _ in range(3))


def make_entry(rng: random.Random, when: datetime) -> str:
    day = (when + timedelta(days=rng.randint(1, 30))).strftime("%A %d %B")
    fields = {
        "name": rng.choice(NAMES),
        "project": rng.choice(PROJECTS),
        "place": rng.choice(PLACES),
        "topic": rng.choice(TOPICS),
        "codename": codename(rng),
        "day": day,
    }
    fields["decision"] = rng.choice(DECISIONS).format(**fields)
    sentences = [rng.choice(SENTENCES) for _ in range(rng.randint(3, 6))]
    text = " ".join(s.format(**{**fields, "name": rng.choice(NAMES)}) for s in sentences)
    return f"[{when:%Y-%m-%d %H:%M}] {text}"


def write_history(workspace: Path, n: int, seed: int) -> list[tuple[datetime, str]]:
    rng = random.Random(seed)
    memory = workspace / "memory"
    memory.mkdir(parents=True)
    start = datetime(2025, 1, 1, tzinfo=UTC)
    step = timedelta(days=700) / n
    out = []
    with open(memory / "history.jsonl", "w", encoding="utf-8") as fh:
        for cursor in range(1, n + 1):
            when = start + step * cursor
            content = make_entry(rng, when)
            stamp = when.isoformat(timespec="milliseconds").replace("+00:00", "Z")
            line = {"cursor": cursor, "timestamp": stamp, "session": rng.choice(SESSIONS)}
            fh.write(json.dumps({**line, "content": content}, ensure_ascii=False) + "\n")
            out.append((when, content))
    (memory / ".cursor").write_text(f"{n}\n")
    (workspace / "USER.md").write_text("# User\n\n- Name: Sam\n- Timezone: Europe/Lisbon\n")
    return out


def queries(entries: list[tuple[datetime, str]], count: int, seed: int) -> list[tuple[str, dict]]:
    """(kind, keyword arguments for search) in a fixed mix of kinds."""
    rng = random.Random(seed + 1)
    with_codename = [(w, c) for w, c in entries if " step failed" in c]
    kinds = (
        "rare word",  # a made-up codename from the middle of one entry: a handful of matches
        "middle word",  # whatever word sits in the middle of an entry, often a very common one
        "topic word",  # 3-50 % of the entries
        "very common",  # "the", "user": nearly every entry
        "two words",
        "prefix",  # last word cut to 4 letters
        "rare + range",  # a 31-day window around the entry
        "common + range",
        "one word misses",  # a topic word and a word in no entry: AND, prefix, then OR
    )
    out: list[tuple[str, dict]] = []
    for i in range(count):
        kind = kinds[i % len(kinds)]
        when, content = rng.choice(with_codename if "rare" in kind else entries)
        words = content.split()
        middle = words[len(words) // 2].strip(".,:?!")
        rare = words[words.index("step") - 1] if "step" in words else middle
        span = {"since": when.date() - timedelta(days=15), "until": when.date() + timedelta(15)}
        query = {
            "rare word": {"query": rare},
            "middle word": {"query": middle},
            "topic word": {"query": rng.choice(TOPICS)},
            "very common": {"query": rng.choice(("the", "user", "the user"))},
            "two words": {"query": f"{rng.choice(NAMES)} {rng.choice(TOPICS)}"},
            "prefix": {"query": f"{rng.choice(NAMES)} {rng.choice(TOPICS)[:4]}"},
            "rare + range": {"query": rare, **span},
            "common + range": {"query": rng.choice(TOPICS), **span},
            "one word misses": {"query": f"{rng.choice(TOPICS)} {codename(rng)}x{i}"},
        }[kind]
        out.append((kind, query))
    return out


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    t0 = time.perf_counter()
    result = fn()
    return (time.perf_counter() - t0) * 1000, result


def report(label: str, times: list[float]) -> None:
    times = sorted(times)
    p95 = times[max(0, round(0.95 * len(times)) - 1)]
    print(
        f"  {label:<16} n={len(times):<4} median {statistics.median(times):7.2f} ms   "
        f"p95 {p95:7.2f} ms   max {times[-1]:7.2f} ms"
    )


def append_entries(workspace: Path, after: int, count: int) -> None:
    rng = random.Random(after)
    when = datetime(2027, 1, 1, tzinfo=UTC)
    with open(workspace / "memory" / "history.jsonl", "a", encoding="utf-8") as fh:
        for cursor in range(after + 1, after + count + 1):
            stamp = when.isoformat(timespec="milliseconds").replace("+00:00", "Z")
            line = {"cursor": cursor, "timestamp": stamp, "session": "cli:direct"}
            fh.write(json.dumps({**line, "content": make_entry(rng, when)}) + "\n")


def embed_everything(index: MemoryIndex, model: str, dim: int) -> int:
    """Vectors for every text of the index, in batches as the gateway's indexer stores them."""
    from bot.memory.numeric import np
    from tests.fakes.embeddings_server import SYNONYMS, concept_table, embed_text

    table = concept_table(SYNONYMS)
    done = 0
    while batch := index.pending_texts(model, 5000):
        matrix = np.asarray([embed_text(text, table, dim) for _, text in batch], np.float32)
        index.store_vectors(model, [digest for digest, _ in batch], matrix)
        done += len(batch)
    return done


def hybrid_searches(
    index: MemoryIndex, searches: list[tuple[str, dict]], model: str, dim: int
) -> None:
    from bot.memory.numeric import np
    from tests.fakes.embeddings_server import SYNONYMS, concept_table, embed_text

    table = concept_table(SYNONYMS)
    by_kind: dict[str, list[float]] = {}
    kinds: dict[str, int] = {}
    for kind, kwargs in searches:
        vector = np.asarray(embed_text(kwargs["query"], table, dim), np.float32)
        ms, found = timed(
            lambda kwargs=kwargs, vector=vector: index.hybrid_search(
                kwargs["query"], vector, model, 10, kwargs.get("since"), kwargs.get("until")
            )
        )
        hits, problem = found  # type: ignore[misc]
        assert not problem, problem
        by_kind.setdefault(kind, []).append(ms)
        for hit in hits:
            kinds[hit.kind] = kinds.get(hit.kind, 0) + 1
    print(f"{len(searches)} hybrid searches (limit 10; hits by kind {kinds}):")
    for kind, times in by_kind.items():
        report(kind, times)
    report("all", [t for times in by_kind.values() for t in times])


async def query_round_trip(dim: int, count: int = 50) -> list[float]:
    """Milliseconds for one query's vector from a local endpoint (the fake), via the client."""
    from bot.memory.embeddings import EmbeddingClient, EmbeddingEndpoint
    from tests.fakes.embeddings_server import FakeEmbeddings

    async with FakeEmbeddings(dim=dim) as fake:
        client = EmbeddingClient(EmbeddingEndpoint(fake.base_url, "bench"))
        times = []
        try:
            for i in range(count):
                t0 = time.perf_counter()
                await client.embed([f"what did Alice say about the budget {i}"], attempts=1)
                times.append((time.perf_counter() - t0) * 1000)
        finally:
            await client.close()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--searches", type=int, default=200)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--hybrid", action="store_true", help="also time hybrid search")
    parser.add_argument("--dim", type=int, default=256, help="vector dimensions (--hybrid)")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="memobot-bench-") as tmp:
        workspace, state = Path(tmp) / "ws", Path(tmp) / "state"
        ms, entries = timed(lambda: write_history(workspace, opts.entries, opts.seed))
        size = (workspace / "memory" / "history.jsonl").stat().st_size
        print(f"generated {opts.entries} entries ({size / 1e6:.1f} MB) in {ms / 1000:.1f} s")
        index = MemoryIndex(workspace, state)
        ms, _ = timed(index.refresh)
        print(f"index build: {ms / 1000:.2f} s  ({index.path.stat().st_size / 1e6:.1f} MB)")
        ms, _ = timed(index.refresh)
        print(f"no-op sync: {ms:.2f} ms")
        append_entries(workspace, opts.entries, 100)
        ms, _ = timed(index.refresh)
        print(f"incremental sync of 100 appended entries: {ms:.1f} ms")

        by_kind: dict[str, list[float]] = {}
        hits_total = 0
        searches = queries(entries, opts.searches, opts.seed)
        for kind, kwargs in searches:
            ms, hits = timed(lambda kwargs=kwargs: index.search(**kwargs))
            by_kind.setdefault(kind, []).append(ms)
            hits_total += len(hits)  # type: ignore[arg-type]
        print(f"{opts.searches} searches (limit 10, {hits_total} hits in all):")
        for kind, times in by_kind.items():
            report(kind, times)
        report("all", [t for times in by_kind.values() for t in times])
        if not opts.hybrid:
            return
        model = f"bench-embed-{opts.dim} @ in-process"
        before = index.path.stat().st_size
        ms, count = timed(lambda: embed_everything(index, model, opts.dim))
        with sqlite3.connect(index.path) as conn:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        after = index.path.stat().st_size
        print(
            f"vectors: {count} texts x {opts.dim} dims computed and stored in {ms / 1000:.1f} s;"
            f" index {before / 1e6:.1f} MB -> {after / 1e6:.1f} MB"
        )
        ms, _ = timed(index.warm_vectors)
        print(f"in-memory copy of the vectors loaded in {ms / 1000:.2f} s (the gateway's task)")
        hybrid_searches(index, searches, model, opts.dim)
        trips = sorted(asyncio.run(query_round_trip(opts.dim)))
        print(f"query vector from a local endpoint: median {statistics.median(trips):.2f} ms")


if __name__ == "__main__":
    main()
