"""Recall of memory search: are planted facts found again by questions worded differently?

A long conversation is generated (a fixed seed): several people, each in a private chat and all
in one group, thousands of turns over several weeks, mostly small talk, with a hundred facts
planted about the people ("my automobile is a teal Volvo"). It is stored in real sessions and
folded into the history archive by the real Consolidator, whose summarising model is a
deterministic stand-in in this file (``StandInSummariser``: it keeps what a person said about
themselves, in the third person, and reduces small talk to its topics). Then one question per
fact, worded differently from it ("which car does Alice own?"), is asked of ``memory_search``:

* BM25 alone (``MemoryIndex.search``, as with ``memory.embeddings`` off);
* hybrid (``Embeddings.search``, the real client against an embeddings endpoint this bench
  starts: tests/fakes/embeddings_server.py with this bench's synonym table. It is a STAND-IN,
  not a model: it knows exactly the synonyms listed in ``SYNONYMS`` below, so its figure shows
  what the hybrid pipeline does with an endpoint that relates the paraphrases, not how well
  any real model relates them).

A question counts as recalled when one of the first five hits is an archive entry holding the
fact's answer. ``facts_in_person_files`` is the hook for the per-person memory files (issue 33,
part 2): how many facts reached the right person's file; it reports "not measured" until wired.

    .venv/bin/python bench/bench_recall.py [--weeks 6] [--turns 3000] [--seed 11]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bot.config import Config
from bot.llm import LLMResponse, ToolCall
from bot.memory.consolidate import SUMMARY_TOOL, Consolidator
from bot.memory.history import HistoryArchive
from bot.memory.hybrid import Embeddings
from bot.memory.search import MemoryIndex, iter_history
from bot.session import SessionStore
from tests.fakes.embeddings_server import FakeEmbeddings

RECALL_AT = 5
PEOPLE = {  # name -> private chat's session key
    "Alice": "telegram:1001",
    "Bruno": "telegram:1002",
    "Chiara": "telegram:1003",
    "Dmitri": "telegram:1004",
    "Elena": "telegram:1005",
}
GROUP = "telegram:-100777"


@dataclass(frozen=True, slots=True)
class Topic:
    fact: str  # as the person says it, {value} the answer
    question: str  # as it is asked later, {name} the person
    values: tuple[str, ...]


TOPICS = (
    Topic(
        "my automobile is a {value}",
        "which car does {name} own",
        ("teal Volvo", "red Fiat", "grey Skoda", "white Tesla", "black Saab", "blue Lancia"),
    ),
    Topic(
        "my physician is Dr {value}",
        "who is the doctor of {name}",
        ("Okafor", "Lindqvist", "Moreau", "Tanaka", "Ferreira", "Novak"),
    ),
    Topic(
        "I am intolerant to {value}",
        "what is {name} allergic to",
        ("peanuts", "shellfish", "lactose", "gluten", "sesame", "penicillin"),
    ),
    Topic(
        "I really enjoy eating {value}",
        "which food does {name} like",
        ("ramen", "paella", "pierogi", "falafel", "risotto", "bibimbap"),
    ),
    Topic(
        "I was born on {value}",
        "when is the birthday of {name}",
        ("March 3rd", "July 14th", "October 9th", "January 22nd", "May 30th", "August 5th"),
    ),
    Topic(
        "I reside in {value} these days",
        "where does {name} live",
        ("Ghent", "Bergen", "Utrecht", "Aarhus", "Graz", "Turku"),
    ),
    Topic(
        "I am employed as a {value}",
        "what is the occupation of {name}",
        ("radiographer", "cartographer", "sommelier", "luthier", "actuary", "glazier"),
    ),
    Topic(
        "our dog is called {value}",
        "what is the name of the pet of {name}",
        ("Biscuit", "Pepper", "Noodle", "Waffle", "Mochi", "Ziggy"),
    ),
    Topic(
        "I play {value} every weekend",
        "which sport does {name} practise",
        ("squash", "handball", "curling", "fencing", "lacrosse", "badminton"),
    ),
    Topic(
        "I listen to a lot of {value}",
        "what music does {name} prefer",
        ("bossa nova", "krautrock", "zydeco", "fado", "bluegrass", "afrobeat"),
    ),
    Topic(
        "my brother is named {value}",
        "what is the sibling of {name} called",
        ("Tobias", "Matteo", "Oskar", "Rafael", "Anton", "Kasimir"),
    ),
    Topic(
        "I am studying {value}",
        "which language is {name} learning",
        ("Icelandic", "Swahili", "Korean", "Welsh", "Tagalog", "Basque"),
    ),
    Topic(
        "next month I fly to {value}",
        "where is {name} travelling",
        ("Reykjavik", "Zanzibar", "Hanoi", "Cusco", "Tbilisi", "Valparaiso"),
    ),
    Topic(
        "I take my coffee with {value}",
        "how does {name} drink coffee",
        ("oat milk", "cardamom", "condensed milk", "cinnamon", "honey", "nothing at all"),
    ),
    Topic(
        "I am reading {value}",
        "what novel is {name} into",
        ("Middlemarch", "Solaris", "Beloved", "Dune", "Rebecca", "Ulysses"),
    ),
    Topic(
        "my mobile is a {value}",
        "what phone does {name} use",
        ("Pixel", "Fairphone", "iPhone", "Nokia", "Xperia", "Galaxy"),
    ),
    Topic(
        "my wife is {value}",
        "who is the spouse of {name}",
        ("Ingrid", "Leonor", "Yasmin", "Beatrix", "Sunniva", "Marisol"),
    ),
    Topic(
        "my office is at {value}",
        "where is the workplace of {name}",
        ("Harbour Street", "Mill Lane", "Castle Square", "Station Road", "Elm Park", "Dock 9"),
    ),
    Topic(
        "I am scared of {value}",
        "what is {name} afraid of",
        ("spiders", "heights", "thunder", "elevators", "clowns", "deep water"),
    ),
    Topic(
        "in my free time I {value}",
        "what hobby does {name} have",
        ("restore clocks", "brew cider", "knit socks", "build kites", "carve spoons", "bind books"),
    ),
)

# The stand-in endpoint's idea of meaning: words in one group are one concept to it.
SYNONYMS = (
    ("car", "automobile", "vehicle"),
    ("own", "owns", "have", "has", "is"),
    ("doctor", "physician", "gp"),
    ("allergic", "intolerant", "allergy"),
    ("food", "eating", "eat", "dish"),
    ("birthday", "born"),
    ("live", "reside", "lives", "home"),
    ("occupation", "employed", "job", "profession"),
    ("pet", "dog", "cat"),
    ("sport", "play", "practise"),
    ("music", "listen", "songs"),
    ("sibling", "brother", "sister"),
    ("language", "studying", "learning"),
    ("travelling", "fly", "trip", "travel"),
    ("drink", "take", "coffee"),
    ("novel", "reading", "book"),
    ("phone", "mobile", "smartphone"),
    ("spouse", "wife", "husband", "partner"),
    ("workplace", "office"),
    ("afraid", "scared", "fear"),
    ("hobby", "free", "pastime"),
    ("like", "enjoy", "prefer", "love"),
)

SMALL_TALK = (
    "what's the weather like in {city} tomorrow",
    "remind me to buy {thing} later",
    "thanks, that helps",
    "can you summarise this article about {subject}",
    "what time is it in {city}",
    "translate 'good morning' into {language_}",
    "how long should I boil {thing}",
    "any idea for a quick {meal} tonight",
    "what's a good podcast about {subject}",
    "convert 40 miles to kilometres",
    "lol ok",
    "tell me a fun fact about {subject}",
)
FILL = {
    "city": "Lisbon Osaka Nairobi Montreal Krakow Oslo Lyon Porto Seoul Austin".split(),
    "thing": "eggs rice pasta lentils batteries stamps bread".split(),
    "subject": "volcanoes octopuses Roman roads jazz history bees glaciers chess".split(),
    "language_": "French German Italian Dutch".split(),
    "meal": "lunch dinner snack".split(),
}
REPLIES = ("Sure.", "Here you go.", "Done.", "Good question: here is what I found.")


@dataclass(frozen=True, slots=True)
class Fact:
    person: str
    topic: Topic
    value: str

    @property
    def said(self) -> str:
        return self.topic.fact.format(value=self.value)

    @property
    def question(self) -> str:
        return self.topic.question.format(name=self.person)


def plant_facts(rng: random.Random, count: int) -> list[Fact]:
    """``count`` facts: each person gets each topic at most once, values not repeated."""
    pairs = [(p, t) for p in PEOPLE for t in TOPICS]
    rng.shuffle(pairs)
    used: set[str] = set()
    facts = []
    for person, topic in pairs[:count]:
        value = rng.choice([v for v in topic.values if v not in used] or list(topic.values))
        used.add(value)
        facts.append(Fact(person, topic, value))
    return facts


def small_talk(rng: random.Random) -> str:
    line = rng.choice(SMALL_TALK)
    return line.format(**{k: rng.choice(v) for k, v in FILL.items()})


def conversation(
    rng: random.Random, facts: list[Fact], turns: int, weeks: int
) -> list[tuple[str, str, str, datetime]]:
    """(session key, speaker, text, time) of every user turn, in time order: the facts
    scattered among small talk, a fifth of the turns in the group."""
    start = datetime(2026, 9, 1, 8, tzinfo=UTC)
    step = timedelta(weeks=weeks) / turns
    fact_turns = dict(zip(rng.sample(range(turns), len(facts)), facts, strict=True))
    out = []
    for i in range(turns):
        fact = fact_turns.get(i)
        person = fact.person if fact else rng.choice(list(PEOPLE))
        key = GROUP if rng.random() < 0.2 else PEOPLE[person]
        text = f"By the way, {fact.said}" if fact else small_talk(rng)
        text = text[0].upper() + text[1:]
        out.append((key, person, text, start + step * i))
    return out


class StandInSummariser:
    """The summarising model, deterministic: a statement about oneself ("I ...", "my ...",
    "our ...") becomes a lasting fact in the third person under the speaker's name (the
    ``facts`` of save_summary); the summary line keeps the first few small-talk requests.
    Duck-types ``LLMProvider.chat`` for the Consolidator."""

    _LINE = re.compile(r"^USER(?: \[[^\]]*\])?: (?:\[(?P<who>\w+)\] )?(?P<text>.*)$", re.MULTILINE)

    def __init__(self, speaker_of: dict[str, str]) -> None:
        self.speaker_of = speaker_of  # session key -> the person of a private chat
        self.calls = 0

    async def chat(self, messages: list[dict[str, Any]], tools: Any, **kw: Any) -> LLMResponse:
        self.calls += 1
        excerpt = messages[-1]["content"]
        default = self.speaker_of.get(kw.get("session_key", ""), "someone")
        lines, chatter = [], []
        for m in self._LINE.finditer(excerpt):
            who, text = m.group("who") or default, m.group("text").strip()
            said = re.sub(r"^By the way, ", "", text)
            if said != text:
                said = re.sub(r"\bI am\b", f"{who} is", said)
                said = re.sub(r"\bI was\b", f"{who} was", said)
                said = re.sub(r"\bI\b", who, said)
                said = re.sub(r"\b(my|our)\b", f"{who}'s", said, flags=re.IGNORECASE)
                lines.append(f"{said}.")
            else:
                chatter.append(f"{who}: {text}")
        # As the instructions ask: a few lines of what happened, the lasting facts apart.
        summary = "Small talk (" + "; ".join(chatter[:4]) + ")." if chatter else "A chat."
        arguments = {"summary": summary, "facts": lines}
        call = ToolCall("call_1", SUMMARY_TOOL, _json(arguments))
        return LLMResponse(None, (call,), "tool_calls")


def _json(value: Any) -> str:
    import json

    return json.dumps(value)


async def archive_conversation(
    cfg: Config, turns: list[tuple[str, str, str, datetime]], every: int
) -> tuple[int, int]:
    """Store the turns in sessions, consolidating each session every ``every`` messages;
    (summaries asked, archive entries)."""
    store = SessionStore(cfg.agent.state_path)
    archive = HistoryArchive(cfg.agent.workspace_path)
    summariser = StandInSummariser({key: name for name, key in PEOPLE.items()})
    consolidator = Consolidator(cfg.memory, store, summariser, archive)  # type: ignore[arg-type]
    pending: dict[str, int] = {}
    for key, person, text, when in turns:
        session = store.get(key)
        content = f"[{person}] {text}" if key == GROUP else text
        stamp = when.isoformat(timespec="seconds").replace("+00:00", "Z")
        messages = [
            {"role": "user", "content": content, "timestamp": stamp},
            {"role": "assistant", "content": REPLIES[len(text) % len(REPLIES)]},
        ]
        store.append(session, messages, fsync=False)
        pending[key] = pending.get(key, 0) + 2
        if pending[key] >= every:
            await consolidator.consolidate(key, keep=0)
            pending[key] = 0
    for key in pending:
        await consolidator.compact_all(key)
    entries = sum(1 for _ in iter_history(cfg.agent.workspace_path))
    return summariser.calls, entries


def facts_in_person_files(workspace: Path, facts: list[Fact]) -> tuple[int, int] | None:
    """HOOK for issue 33 part 2 (a memory file per person): after Dream has run over the
    archive, how many of ``facts`` are in the right person's file (``people/<channel>-<id>.md``),
    as (found, total). None: per-person files are not wired into this bench yet."""
    return None


def recalled(hits: Any, fact: Fact, contents: dict[str, str]) -> bool:
    return any(fact.value in contents.get(hit.source, "") for hit in hits[:RECALL_AT])


async def measure(tmp: Path, opts: argparse.Namespace) -> None:
    rng = random.Random(opts.seed)
    facts = plant_facts(rng, opts.facts)
    turns = conversation(rng, facts, opts.turns, opts.weeks)
    async with FakeEmbeddings(dim=opts.dim, synonyms=SYNONYMS) as fake:
        raw = {
            "agent": {"workspace": str(tmp / "ws"), "stateDir": str(tmp / "state")},
            "memory": {
                "embeddings": {
                    "enabled": True,
                    "baseUrl": fake.base_url,
                    "model": "stand-in",
                    **({"minSimilarity": opts.floor} if opts.floor is not None else {}),
                }
            },
        }
        cfg = Config.model_validate(raw)
        (tmp / "ws" / "memory").mkdir(parents=True)
        t0 = time.perf_counter()
        calls, entries = await archive_conversation(cfg, turns, opts.every)
        took = time.perf_counter() - t0
        print(
            f"{len(turns)} user turns ({len(turns) * 2} messages) over {opts.weeks} weeks, "
            f"{len(PEOPLE)} people, {len(facts)} planted facts: {calls} summaries, "
            f"{entries} archive entries in {took:.1f} s"
        )
        index = MemoryIndex(cfg.agent.workspace_path, cfg.agent.state_path)
        embeddings = Embeddings.from_config(cfg, index)
        assert embeddings is not None
        contents = {
            f"{rel}#{entry.cursor}": entry.content
            for rel, entry in iter_history(cfg.agent.workspace_path)
        }
        try:
            t0 = time.perf_counter()
            while await embeddings.step():
                pass
            print(f"embedded {len(fake.inputs)} texts in {time.perf_counter() - t0:.1f} s")
            bm25 = hybrid = 0
            for fact in facts:
                words = await asyncio.to_thread(index.search, fact.question, RECALL_AT)
                found = await embeddings.search(fact.question, RECALL_AT)
                assert not found.note, found.note
                bm25 += recalled(words, fact, contents)
                hybrid += recalled(found.hits, fact, contents)
        finally:
            await embeddings.close()
    print(f"recall@{RECALL_AT}, BM25 alone: {bm25}/{len(facts)} ({100 * bm25 / len(facts):.0f} %)")
    print(
        f"recall@{RECALL_AT}, hybrid (stand-in embeddings, minSimilarity "
        f"{cfg.memory.embeddings.min_similarity}): {hybrid}/{len(facts)} "
        f"({100 * hybrid / len(facts):.0f} %)"
    )
    in_files = facts_in_person_files(cfg.agent.workspace_path, facts)
    if in_files is None:
        print("facts in the right person's file: not measured (hook facts_in_person_files)")
    else:
        print(f"facts in the right person's file: {in_files[0]}/{in_files[1]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=3000, help="user turns in all")
    parser.add_argument("--weeks", type=int, default=6)
    parser.add_argument("--facts", type=int, default=100)
    parser.add_argument("--every", type=int, default=40, help="messages per consolidation")
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument(
        "--floor", type=float, default=None, help="memory.embeddings.minSimilarity to use"
    )
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="memobot-recall-") as tmp:
        asyncio.run(measure(Path(tmp), opts))


if __name__ == "__main__":
    main()
