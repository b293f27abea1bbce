"""Recall of memory: are planted facts found again by questions worded differently, and does
Dream file each person's facts in that person's own memory file?

A long conversation is generated (a fixed seed): five people and the owner, over several
weeks, thousands of turns, mostly small talk, with a hundred facts planted about the five
people ("my automobile is a teal Volvo"). Each person talks in their own private chat and in
the groups they are in (two: everyone, and three of them); the owner (an admin) makes small
talk in her private chat and the groups and plants no fact. Every message is stored as a turn
stores it: classified (``bot.kinds``), its privacy scope decided (``bot.privacy``), its writer
named in the runtime block when the chat is not the owner's (``bot.turn.turn_speaker``,
``ContextBuilder.user_message``), so consolidation records who wrote each archive entry. The
sessions are folded into the history archive by the real Consolidator, then:

* **Search.** One question per fact, worded differently from it ("which car does Alice
  own?"), is asked of ``memory_search``: BM25 alone (``MemoryIndex.search``, as with
  ``memory.embeddings`` off) and hybrid (``Embeddings.search``, the real client against an
  embeddings endpoint this bench starts). A question counts as recalled when one of the first
  five hits is an archive entry holding the fact's answer.
* **People's files.** The real Dream (``bot.memory.dream``) runs over the archive until it has
  digested all of it, with the owner's chats told apart as the gateway does
  (``bot.cron.heartbeat.owner_chat``). Counted after: facts in the right person's file
  (``memory/people/telegram-<id>.md``), in a wrong person's file, in USER.md (the owner's:
  none of these facts belongs there), elsewhere (a chat's file, MEMORY.md).

Every model here is a DETERMINISTIC STAND-IN, a script in this file or tests/fakes, not a model:

* ``StandInSummariser`` (consolidation's model): keeps what a person said about themselves as
  a lasting fact in the third person, named as the message's ``from:`` line names them
  ("Alice (telegram 1001) is intolerant to peanuts"), and reduces small talk to its topics.
* the embeddings endpoint (tests/fakes/embeddings_server.py with ``SYNONYMS`` below): it
  knows exactly those synonyms, so the hybrid figure shows what the pipeline does with an
  endpoint that relates the paraphrases, not how well any real model relates them.
* ``StandInDreamModel`` (Dream's model): for each fact of each entry Dream shows it, it calls
  ``add_entry`` on the file that Dream's request labels as that person's ("## memory/people/...
  (the file of Alice (telegram 1001); ...)"), taking the file from the request alone, never
  from what this bench knows; with no such file in the request, on USER.md in the owner's pass
  (a fact said in the owner's chats is the user's), else on the chat's file. It never errs
  about who said what, so the file figures measure memobot's routing (speakers recorded on
  entries, the right files offered to the right pass and labelled with their person), not a
  model's judgement: a real model can only do worse.

    .venv/bin/python bench/bench_recall.py [--weeks 6] [--turns 3000] [--seed 11] [-v]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import random
import re
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bot.app import initial_memory_commit
from bot.bus import InboundMessage
from bot.config import Config
from bot.context import RUNTIME_HEAD, ContextBuilder, said_by_person
from bot.cron.heartbeat import owner_chat
from bot.kinds import with_kind
from bot.llm import LLMResponse, ToolCall
from bot.memory.consolidate import SUMMARY_TOOL, Consolidator
from bot.memory.dream import Dream
from bot.memory.history import HistoryArchive
from bot.memory.hybrid import Embeddings
from bot.memory.people import PEOPLE_DIR, person_file, speaker_in_block
from bot.memory.search import MemoryIndex, iter_history
from bot.privacy import scope_for_person
from bot.session import SessionStore
from bot.turn import turn_speaker
from bot.workspace import init_workspace
from tests.fakes.embeddings_server import FakeEmbeddings

RECALL_AT = 5
CHANNEL = "telegram"
PEOPLE = {  # name -> Telegram user id (their private chat with the bot has the same id)
    "Alice": "1001",
    "Bruno": "1002",
    "Chiara": "1003",
    "Dmitri": "1004",
    "Elena": "1005",
}
OWNER = ("Olivia", "1000")  # the admin: her private chat is the owner's; she plants no fact
IDS = {**PEOPLE, OWNER[0]: OWNER[1]}
GROUPS = {  # Telegram group chat id -> who is in it
    "-100777": (*PEOPLE, OWNER[0]),
    "-100888": ("Alice", "Bruno", "Chiara"),
}
GROUP_SHARE = 0.2  # of a person's turns, in one of their groups
OWNER_SHARE = 1 / 6  # of the small-talk turns, the owner's


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


@dataclass(frozen=True, slots=True)
class Said:
    chat_id: str  # the Telegram chat: a group's (negative) or the person's own id
    person: str
    text: str
    when: datetime

    @property
    def session_key(self) -> str:
        return f"{CHANNEL}:{self.chat_id}"


def conversation(rng: random.Random, facts: list[Fact], turns: int, weeks: int) -> list[Said]:
    """Every user turn, in time order: the facts scattered among small talk, a fifth of each
    person's turns in one of their groups, the rest in their private chat."""
    start = datetime(2026, 9, 1, 8, tzinfo=UTC)
    step = timedelta(weeks=weeks) / turns
    fact_turns = dict(zip(rng.sample(range(turns), len(facts)), facts, strict=True))
    out = []
    for i in range(turns):
        fact = fact_turns.get(i)
        if fact is not None:
            person = fact.person
        elif rng.random() < OWNER_SHARE:
            person = OWNER[0]
        else:
            person = rng.choice(list(PEOPLE))
        groups = [chat for chat, members in GROUPS.items() if person in members]
        chat = rng.choice(groups) if rng.random() < GROUP_SHARE else IDS[person]
        text = f"By the way, {fact.said}" if fact else small_talk(rng)
        out.append(Said(chat, person, text[0].upper() + text[1:], start + step * i))
    return out


def stored_message(cfg: Config, context: ContextBuilder, said: Said) -> dict[str, Any]:
    """``said`` as a turn stores the person's message: classified as the Telegram channel's
    metadata says (admin or not, group or not, the name), its writer named in the runtime
    block when the turn's scope is not the owner's."""
    sender = IDS[said.person]
    metadata = {
        "is_admin": sender in cfg.channels.telegram.admin_ids,
        "is_group": said.chat_id.startswith("-"),
        "sender_name": said.person,
    }
    msg = with_kind(InboundMessage(CHANNEL, said.chat_id, sender, said.text, metadata=metadata))
    speaker = turn_speaker(msg, scope_for_person(msg, cfg.memory))
    message = context.user_message(said.text, CHANNEL, said.chat_id, now=said.when, speaker=speaker)
    stamp = said.when.isoformat(timespec="seconds").replace("+00:00", "Z")
    return {**message, "timestamp": stamp}


class StandInSummariser:
    """Consolidation's summarising model, deterministic: a statement about oneself ("I ...",
    "my ...", "our ...") becomes a lasting fact in the third person, the writer named as the
    message's ``from:`` line names them (the ``facts`` of save_summary; "the user" where no
    line names anyone: the owner's own chat); the summary line keeps the first few small-talk
    requests. Duck-types ``LLMProvider.chat`` for the Consolidator."""

    _MESSAGE = re.compile(r"^(?P<role>[A-Z]+)(?: \[[^\]\n]*\])?: ", re.MULTILINE)

    def __init__(self) -> None:
        self.calls = 0

    async def chat(self, messages: list[dict[str, Any]], tools: Any, **kw: Any) -> LLMResponse:
        self.calls += 1
        excerpt = messages[-1]["content"]
        heads = list(self._MESSAGE.finditer(excerpt))
        lines, chatter = [], []
        for m, after in zip(heads, [*heads[1:], None], strict=True):
            if m["role"] != "USER":
                continue
            block = excerpt[m.end() : after.start() if after else None].strip()
            cut = block.rfind(RUNTIME_HEAD)
            who = speaker_in_block(block[cut:]) if cut != -1 else None
            name = who.shown if who else "the user"
            text = said_by_person(block).strip()
            said = re.sub(r"^By the way, ", "", text)
            if said != text:
                said = re.sub(r"\bI am\b", f"{name} is", said)
                said = re.sub(r"\bI was\b", f"{name} was", said)
                said = re.sub(r"\bI\b", name, said)
                said = re.sub(r"\b(my|our)\b", f"{name}'s", said, flags=re.IGNORECASE)
                lines.append(f"{said}.")
            else:
                chatter.append(f"{who.name if who else 'the user'}: {text}")
        # As the instructions ask: a few lines of what happened, the lasting facts apart.
        summary = "Small talk (" + "; ".join(chatter[:4]) + ")." if chatter else "A chat."
        arguments = {"summary": summary, "facts": lines}
        call = ToolCall("call_1", SUMMARY_TOOL, json.dumps(arguments))
        return LLMResponse(None, (call,), "tool_calls")


class StandInDreamModel:
    """Dream's model, deterministic (see the module's docstring): one answer per pass, an
    ``add_entry`` call for each fact of each new entry (the ``- `` lines under ``Facts:``), on
    the file Dream's request labels as the person the fact names, then ``finish``. Everything
    it decides comes from the request: the files' labels from the brief, the files it may write
    from the add_entry tool's enum. Duck-types ``LLMProvider.chat`` for Dream."""

    _PERSON_FILE = re.compile(r"^## (?P<rel>\S+) \(the file of (?P<who>.+); [\d,]+/", re.M)
    _ENTRY = re.compile(r"^\[#(?P<cursor>\d+) [^\n]*\]\n", re.M)

    def __init__(self) -> None:
        self.calls = 0
        self.filed: Counter[str] = Counter()  # how each fact's file was chosen

    async def chat(self, messages: list[dict[str, Any]], tools: Any, **kw: Any) -> LLMResponse:
        self.calls += 1
        if messages[-1]["role"] == "tool":  # the tools' results: nothing more to do
            return LLMResponse(None, (ToolCall("end", "finish", '{"summary": "done"}'),))
        writable = self._writable(tools)
        files, _, news = messages[1]["content"].partition("\n# New history entries\n")
        labelled = {m["who"]: m["rel"] for m in self._PERSON_FILE.finditer(files)}
        calls = []
        heads = list(self._ENTRY.finditer(news))
        for m, after in zip(heads, [*heads[1:], None], strict=True):
            content = news[m.end() : after.start() if after else None]
            _, found, facts = content.partition("\nFacts:\n")
            for line in facts.splitlines() if found else ():
                if not line.startswith("- "):
                    break
                rel, how = self._file_for(line, labelled, writable)
                self.filed[how] += 1
                args = {"file": rel, "entry": line[2:], "sources": [int(m["cursor"])]}
                calls.append(ToolCall(f"c{len(calls)}", "add_entry", json.dumps(args)))
        calls.append(ToolCall("end", "finish", '{"summary": "facts filed"}'))
        return LLMResponse(None, tuple(calls), "tool_calls")

    @staticmethod
    def _writable(tools: list[dict[str, Any]]) -> list[str]:
        for tool in tools:
            if tool["function"]["name"] == "add_entry":
                return list(tool["function"]["parameters"]["properties"]["file"]["enum"])
        return []

    @staticmethod
    def _file_for(fact: str, labelled: dict[str, str], writable: list[str]) -> tuple[str, str]:
        """The file of the labelled person the fact names first ("Alice (telegram 1001)"),
        else USER.md where the pass offers it, else the chat's file; and which it was."""
        named = sorted((fact.index(who), who) for who in labelled if who in fact)
        if named:
            return labelled[named[0][1]], "the file labelled as theirs"
        if "USER.md" in writable:
            return "USER.md", "USER.md (the owner's pass)"
        chat = next((rel for rel in writable if rel.startswith("memory/chats/")), writable[0])
        return chat, "the chat's file (no file labelled as theirs)"


async def archive_conversation(cfg: Config, turns: list[Said], every: int) -> tuple[int, int]:
    """Store the turns in sessions, consolidating each session every ``every`` messages;
    (summaries asked, archive entries)."""
    store = SessionStore(cfg.agent.state_path)
    archive = HistoryArchive(cfg.agent.workspace_path)
    context = ContextBuilder(cfg.agent.workspace_path, timezone=UTC)
    summariser = StandInSummariser()
    consolidator = Consolidator(cfg.memory, store, summariser, archive)  # type: ignore[arg-type]
    pending: dict[str, int] = {}
    for said in turns:
        key = said.session_key
        session = store.get(key)
        question = stored_message(cfg, context, said)
        reply = REPLIES[len(said.text) % len(REPLIES)]
        # Answered at once: stamped with the question's time (not the bench's clock).
        answer = {"role": "assistant", "content": reply, "timestamp": question["timestamp"]}
        messages = [question, answer]
        store.append(session, messages, fsync=False)
        pending[key] = pending.get(key, 0) + 2
        if pending[key] >= every:
            await consolidator.consolidate(key, keep=0)
            pending[key] = 0
    for key in pending:
        await consolidator.compact_all(key)
    entries = sum(1 for _ in iter_history(cfg.agent.workspace_path))
    return summariser.calls, entries


async def dream_over_archive(cfg: Config) -> tuple[int, StandInDreamModel]:
    """The real Dream, run until the whole archive is digested; (runs, its stand-in model)."""
    workspace = cfg.agent.workspace_path
    model = StandInDreamModel()
    owner = functools.partial(owner_chat, cfg)
    dream = Dream(
        cfg.memory,
        workspace,
        model,  # type: ignore[arg-type]
        HistoryArchive(workspace),
        owner,
        state_dir=cfg.agent.state_path,
    )
    runs = 0
    while (result := await dream.run()).status != "nothing":
        if result.status != "done":
            raise SystemExit(f"bench_recall: {result.describe()}")
        runs += 1
    return runs, model


@dataclass(frozen=True, slots=True)
class Placement:
    """Where Dream put the planted facts (a fact may be in more than one file)."""

    right: int  # in the right person's file
    wrong: int  # in another person's file
    user_md: int  # in USER.md, the owner's
    elsewhere: int  # in a chat's file, MEMORY.md or SOUL.md
    total: int


def facts_in_person_files(workspace: Path, facts: list[Fact]) -> Placement:
    """After Dream has run over the archive: where each of ``facts`` is, by its answer."""

    def read(rel: str) -> str:
        path = workspace / rel
        return path.read_text(encoding="utf-8") if path.is_file() else ""

    people = {
        f"{PEOPLE_DIR}/{p.name}": read(f"{PEOPLE_DIR}/{p.name}")
        for p in sorted((workspace / PEOPLE_DIR).glob("*.md"))
    }
    chats = [
        read(f"memory/chats/{p.name}") for p in sorted((workspace / "memory/chats").glob("*.md"))
    ]
    others = [*chats, read("memory/MEMORY.md"), read("SOUL.md")]
    user = read("USER.md")
    right = wrong = user_md = elsewhere = 0
    for fact in facts:
        holds = re.compile(rf"\b{re.escape(fact.value)}\b").search
        own = person_file(CHANNEL, PEOPLE[fact.person])
        right += bool(holds(people.get(own, "")))
        wrong += any(holds(text) for rel, text in people.items() if rel != own)
        user_md += bool(holds(user))
        elsewhere += any(holds(text) for text in others)
    return Placement(right, wrong, user_md, elsewhere, len(facts))


def recalled(hits: Any, fact: Fact, contents: dict[str, str]) -> bool:
    return any(fact.value in contents.get(hit.source, "") for hit in hits[:RECALL_AT])


async def measure(tmp: Path, opts: argparse.Namespace) -> None:
    rng = random.Random(opts.seed)
    facts = plant_facts(rng, opts.facts)
    turns = conversation(rng, facts, opts.turns, opts.weeks)
    took: dict[str, float] = {}
    async with FakeEmbeddings(dim=opts.dim, synonyms=SYNONYMS) as fake:
        raw = {
            "agent": {"workspace": str(tmp / "ws"), "stateDir": str(tmp / "state")},
            "channels": {"telegram": {"allowFrom": list(IDS.values()), "admins": [OWNER[1]]}},
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
        workspace = cfg.agent.workspace_path
        init_workspace(workspace)  # as the daemon's first start: the template, committed
        initial_memory_commit(workspace, cfg.agent.state_path)
        t0 = time.perf_counter()
        calls, entries = await archive_conversation(cfg, turns, opts.every)
        took["consolidation"] = time.perf_counter() - t0
        index = MemoryIndex(workspace, cfg.agent.state_path)
        embeddings = Embeddings.from_config(cfg, index)
        assert embeddings is not None
        contents = {
            f"{rel}#{entry.cursor}": entry.content for rel, entry in iter_history(workspace)
        }
        try:
            t0 = time.perf_counter()
            while await embeddings.step():
                pass
            took["embedding"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            bm25 = hybrid = 0
            for fact in facts:
                words = await asyncio.to_thread(index.search, fact.question, RECALL_AT)
                found = await embeddings.search(fact.question, RECALL_AT)
                assert not found.note, found.note
                bm25 += recalled(words, fact, contents)
                hybrid += recalled(found.hits, fact, contents)
            took["searches"] = time.perf_counter() - t0
        finally:
            await embeddings.close()
    t0 = time.perf_counter()
    runs, dreamer = await dream_over_archive(cfg)
    took["Dream"] = time.perf_counter() - t0
    placed = facts_in_person_files(workspace, facts)
    chats = len({said.session_key for said in turns})
    print(
        f"{len(turns)} user turns over {opts.weeks} weeks (seed {opts.seed}), {len(PEOPLE)} people "
        f"and the owner in {chats} chats ({len(GROUPS)} groups), {len(facts)} planted facts"
    )
    n = len(facts)
    floor = cfg.memory.embeddings.min_similarity
    rows = [
        ("recall@5, words alone (BM25)", bm25),
        (f"recall@5, hybrid (stand-in embeddings, minSimilarity {floor})", hybrid),
        ("facts in the right person's file (real Dream)", placed.right),
        ("facts in a wrong person's file", placed.wrong),
        ("facts in USER.md (the owner's)", placed.user_md),
        ("facts elsewhere (a chat's file, MEMORY.md)", placed.elsewhere),
    ]
    width = max(len(label) for label, _ in rows)
    for label, count in rows:
        print(f"  {label:<{width}}  {count:>3}/{n}")
    print(
        "Every model is a deterministic stand-in (this file's docstring). Dream's model\n"
        "files each fact where Dream's request labels that person's file: the file rows\n"
        "measure memobot's routing, not a model's judgement."
    )
    if opts.verbose:
        print(f"  {calls} summaries, {entries} archive entries, {len(fake.inputs)} texts embedded")
        print(
            f"  Dream: {runs} run(s), {dreamer.calls} model calls; facts filed by: "
            + ", ".join(f"{how} {count}" for how, count in dreamer.filed.items())
        )
        print("  time: " + ", ".join(f"{name} {secs:.1f} s" for name, secs in took.items()))


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
    parser.add_argument("-v", "--verbose", action="store_true", help="counts and timings too")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="memobot-recall-") as tmp:
        asyncio.run(measure(Path(tmp), opts))


if __name__ == "__main__":
    main()
