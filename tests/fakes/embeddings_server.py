"""A local OpenAI-compatible ``/v1/embeddings`` server for tests and benchmarks.

The vectors are deterministic and carry a toy notion of meaning: every word is mapped to a
concept through a synonym table (``SYNONYMS``: "automobile", "car" and "vehicle" are one
concept), a few stop words are dropped, and the text's vector has a 1 for each concept it holds
(however often), hashed to one of ``dim`` dimensions, then normalised. Texts that say the same
with the table's synonyms are therefore near each other, texts with no concept in common are
(nearly) orthogonal. This is a stand-in for a real model, honest about being one: it knows only the
synonyms it is given.

    async with FakeEmbeddings() as fake:   # fake.base_url ends in /v1
        fake.fail_with = 503               # every request answers 503 from now on
        fake.answer = lambda body: {...}   # any JSON answer (a hostile server)

Every request's inputs are logged (``fake.requests``).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable, Iterable
from typing import Any

from aiohttp import web

STOP_WORDS = frozenset(
    "a an the of to in on at for and or is are was were be been it its this that with as by "
    "from their they them he she his her i you we our my your me us do does did has have had "
    "what which who whom when where how will would should can could about into than then".split()
)

# Groups of words that mean the same to this fake. Tests and the recall bench add their own.
SYNONYMS: tuple[tuple[str, ...], ...] = (
    ("car", "automobile", "vehicle", "auto"),
    ("doctor", "physician", "gp"),
    ("dentist", "orthodontist"),
    ("allergic", "allergy", "intolerant", "intolerance"),
    ("like", "likes", "enjoy", "enjoys", "love", "loves", "fond", "favourite", "favorite"),
    ("birthday", "born"),
    ("live", "lives", "living", "reside", "resides", "home"),
    ("job", "work", "works", "working", "employed", "employer", "occupation"),
    ("pet", "pets", "dog", "cat", "animal"),
    ("moved", "relocated", "moving"),
    ("buy", "bought", "purchase", "purchased"),
)

_WORD = re.compile(r"[a-z0-9]+")


def concept_table(groups: Iterable[Iterable[str]]) -> dict[str, str]:
    """word -> its concept (the group's first word)."""
    table: dict[str, str] = {}
    for group in groups:
        words = list(group)
        for word in words:
            table[word.lower()] = words[0].lower()
    return table


def embed_text(text: str, table: dict[str, str], dim: int) -> list[float]:
    """The deterministic vector of ``text`` (see the module's docstring)."""
    vector = [0.0] * dim
    concepts = {table.get(word, word) for word in _WORD.findall(text.lower())} - STOP_WORDS
    for concept in sorted(concepts):
        slot = int.from_bytes(hashlib.blake2b(concept.encode(), digest_size=8).digest(), "big")
        vector[slot % dim] += 1.0
    norm = math.sqrt(sum(x * x for x in vector))
    if norm == 0:
        vector[0] = 1.0  # a text of stop words only: still a valid vector
        return vector
    return [x / norm for x in vector]


class FakeEmbeddings:
    """The server. ``dim``: the vectors' dimension; ``synonyms``: groups added to SYNONYMS."""

    def __init__(self, dim: int = 256, synonyms: Iterable[Iterable[str]] = ()) -> None:
        self.dim = dim
        self.table = concept_table([*SYNONYMS, *synonyms])
        self.requests: list[dict[str, Any]] = []
        self.fail_with: int | None = None  # an HTTP status every request gets
        self.refuse_containing: str | None = None  # inputs with this text: 400 for the batch
        self.answer: Callable[[dict[str, Any]], Any] | None = None  # a custom (bad) answer
        self.raw_answer: bytes | None = None  # the body as it is
        self.chunked = False  # answers without a Content-Length
        self._runner: web.AppRunner | None = None
        self.base_url = ""

    def vector(self, text: str) -> list[float]:
        return embed_text(text, self.table, self.dim)

    @property
    def inputs(self) -> list[str]:
        return [text for body in self.requests for text in body.get("input", [])]

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        if self.fail_with is not None:
            # As some proxies do: the request's credentials echoed in the error.
            said = f"down (you sent {request.headers.get('Authorization', '')} to {request.url})"
            return web.json_response({"error": {"message": said}}, status=self.fail_with)
        texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
        if self.refuse_containing and any(self.refuse_containing in t for t in texts):
            return web.json_response({"error": {"message": "input too long"}}, status=400)
        if self.raw_answer is not None:
            return web.Response(body=self.raw_answer, content_type="application/json")
        if self.answer is not None:
            if self.chunked:
                resp = web.StreamResponse()
                resp.enable_chunked_encoding()
                await resp.prepare(request)
                await resp.write(json.dumps(self.answer(body)).encode())
                await resp.write_eof()
                return resp
            return web.json_response(self.answer(body))
        data = [
            {"object": "embedding", "index": i, "embedding": self.vector(text)}
            for i, text in enumerate(texts)
        ]
        return web.json_response({"object": "list", "data": data, "model": body.get("model")})

    async def start(self) -> str:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/embeddings", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.base_url = f"http://127.0.0.1:{port}/v1"
        return self.base_url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeEmbeddings:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
