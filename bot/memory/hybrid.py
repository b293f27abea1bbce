"""Hybrid memory search: words (BM25) and meaning (``memory.embeddings``), and the background
work that keeps the meaning index up to date.

The archive and memory files are embedded by :meth:`Embeddings.run`, a task of the gateway,
in batches of ``memory.embeddings.batchSize``; a turn never waits for it. A search asks the
endpoint only for its own query's vector, within ``queryTimeoutSeconds``. When embeddings are
off, the search is today's BM25 search; when the endpoint fails (or is known to be failing),
the search is by words and the result says so in one note; the log says so once per outage.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from typing import TYPE_CHECKING

from bot.backoff import Backoff
from bot.config import Config, EmbeddingsConfig
from bot.memory.search import MemoryIndex, SearchHit

if TYPE_CHECKING:
    from bot.memory.embeddings import EmbeddingClient

log = logging.getLogger(__name__)

IDLE_SECONDS = 60.0  # between looks for new entries once everything is embedded
# A failing endpoint is retried in the background after 30 s, doubling to 30 min at most.
FIRST_WAIT_SECONDS = 30.0
MAX_WAIT_SECONDS = 1800.0
REFUSALS_SKIPPED = (400, 413, 422)  # about one input (too long, unsupported): that one is skipped
PROBE_TEXT = "memory"  # asked alone to tell a broken endpoint from a text it cannot embed


@dataclass(frozen=True, slots=True)
class SearchResult:
    """A search's hits and, when meaning-based search could not take part, one line why."""

    hits: tuple[SearchHit, ...]
    note: str = ""


class Embeddings:
    """The meaning half of memory search for one index and one endpoint.

    ``now``: the clock of the back-off, a parameter so tests run on a fake one."""

    def __init__(
        self,
        index: MemoryIndex,
        client: EmbeddingClient,
        cfg: EmbeddingsConfig,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.index = index
        self.client = client
        self.cfg = cfg
        self.model = client.endpoint.identity
        self.backoff = Backoff(after=1, first=FIRST_WAIT_SECONDS, cap=MAX_WAIT_SECONDS, now=now)
        self.problem = ""  # why the endpoint is failing now; "" while it answers
        self.store_problem = ""  # why vectors cannot be stored now
        self._wake = asyncio.Event()

    @classmethod
    def from_config(cls, cfg: Config, index: MemoryIndex) -> Embeddings | None:
        """None when ``memory.embeddings`` is off, or names a URL that cannot be used (said
        in the log: search then works by words)."""
        if not cfg.memory.embeddings.enabled:
            return None
        # Imported here: numpy (and the client) are loaded only where embeddings are on.
        from bot.memory.embeddings import EmbeddingClient, endpoint_from_config

        try:
            endpoint = endpoint_from_config(cfg)
        except ValueError as exc:
            log.error("memory embeddings are off: %s", exc)
            return None
        if endpoint is None:
            return None
        emb = cfg.memory.embeddings
        return cls(index, EmbeddingClient(endpoint, emb.timeout_seconds), emb)

    # -- searching

    async def search(
        self,
        query: str,
        limit: int = 10,
        since: date | None = None,
        until: date | None = None,
        session: str | None = None,
    ) -> SearchResult:
        """The hybrid search (see :meth:`MemoryIndex.hybrid_search`); by words alone, with a
        note, when the query cannot be embedded now. Raises what MemoryIndex.search raises."""
        from bot.memory.embeddings import EmbeddingError

        vector = None
        if self.backoff.ready():  # a known outage is not waited for at every search
            try:
                matrix = await self.client.embed(
                    [query], attempts=1, seconds=self.cfg.query_timeout_seconds
                )
                vector = matrix[0]
                self._recovered()
            except EmbeddingError as exc:
                self._failed(exc)
        if vector is None:
            hits = await asyncio.to_thread(self.index.search, query, limit, since, until, session)
            return SearchResult(tuple(hits), self._note(self.problem))
        hits, problem = await asyncio.to_thread(
            self.index.hybrid_search,
            query,
            vector,
            self.model,
            limit,
            since,
            until,
            session,
            self.cfg.min_similarity,
        )
        return SearchResult(tuple(hits), self._note(problem))

    @staticmethod
    def _note(problem: str) -> str:
        return f"Matched by words only: {problem}." if problem else ""

    # -- the background indexer

    async def run(self) -> None:
        """Embed what is not embedded yet, a batch at a time, forever (a gateway task);
        wait ``IDLE_SECONDS`` (or :meth:`wake`) once nothing is left, and back off while the
        endpoint fails. Cancel to stop."""
        from bot.memory.embeddings import EmbeddingError

        while True:
            self._wake.clear()  # here, not before the wait: a wake() during the step counts
            embedded = 0
            if self.backoff.ready():
                try:
                    embedded = await self.step()
                except EmbeddingError as exc:
                    self._failed(exc)
                except (OSError, ValueError, sqlite3.Error) as exc:
                    # The index (a full disk, which SQLite reports as its own error, a lock
                    # held past the busy timeout, vectors changing dimension under one model
                    # name): said once; tried again after IDLE_SECONDS. Searches go on.
                    if str(exc) != self.store_problem:
                        log.warning("memory embeddings: cannot store vectors: %s", exc)
                    self.store_problem = str(exc)
                except Exception as exc:
                    # A bug, not the endpoint or the index: with its traceback, once; the
                    # task goes on (an ended task would stop embedding until a restart, and
                    # nothing would say so: the gateway reads its result only at the stop).
                    if repr(exc) != self.store_problem:
                        log.exception("memory embeddings: the background indexer failed")
                    self.store_problem = repr(exc)
            if embedded:
                continue
            wait = self.backoff.wait_left() or IDLE_SECONDS
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._wake.wait()

    def wake(self) -> None:
        """Look for new texts now (an entry was just archived)."""
        self._wake.set()

    async def step(self) -> int:
        """Embed one batch of the texts without a vector; how many (0: none left). Raises
        EmbeddingError when the endpoint fails (a text it refuses, or answers badly, alone
        while it answers others is marked and skipped), ValueError when its vectors change
        dimension, OSError or sqlite3.Error for the index."""
        from bot.memory.embeddings import BadVector, EmbeddingRejected

        batch = await asyncio.to_thread(self.index.pending_texts, self.model, self.cfg.batch_size)
        if not batch:
            removed = await asyncio.to_thread(self.index.drop_unused_vectors)
            if removed:
                log.debug("memory embeddings: %d unused vector(s) dropped", removed)
            await asyncio.to_thread(self.index.warm_vectors)
            return 0
        digests = [digest for digest, _ in batch]
        try:
            matrix = await self.client.embed([text for _, text in batch])
        except EmbeddingRejected as exc:
            if exc.status not in REFUSALS_SKIPPED:
                raise
            return await self._one_at_a_time(batch)
        except BadVector:
            # A NaN or zero vector for one odd text fails its whole batch, at every try: the
            # newest texts come first, so nothing new would ever be embedded again.
            return await self._one_at_a_time(batch)
        await asyncio.to_thread(self.index.store_vectors, self.model, digests, matrix)
        self._recovered()
        self.store_problem = ""
        return len(batch)

    async def _one_at_a_time(self, batch: list[tuple[bytes, str]]) -> int:
        """Each text of a batch the endpoint refused (400, 413, 422) or answered badly, alone.
        A text refused alone is marked and skipped; so is one answered badly alone, once the
        endpoint is seen answering another text well (else the endpoint is what fails, and
        that is raised). How many texts are settled."""
        from bot.memory.embeddings import BadVector, EmbeddingRejected

        answered = False
        bad: list[tuple[bytes, BadVector]] = []
        for digest, text in batch:
            try:
                matrix = await self.client.embed([text])
            except EmbeddingRejected as exc:
                if exc.status not in REFUSALS_SKIPPED:
                    raise
                log.warning(
                    "memory embeddings: one text refused, not searchable by meaning: %s", exc
                )
                matrix = None
            except BadVector as exc:
                if not answered:
                    # Is it the endpoint or this text? A plain word tells (raises if it is the
                    # endpoint: a broken one costs three requests, not one per text).
                    await self.client.embed([PROBE_TEXT])
                    answered = True
                bad.append((digest, exc))
                continue
            await asyncio.to_thread(self.index.store_vectors, self.model, [digest], matrix)
            answered = answered or matrix is not None
        for digest, exc in bad:
            log.warning(
                "memory embeddings: one text answered badly, not searchable by meaning: %s", exc
            )
            await asyncio.to_thread(self.index.store_vectors, self.model, [digest], None)
        if answered or bad:
            self._recovered()
        return len(batch)

    def _failed(self, exc: Exception) -> None:
        self.backoff.failed()
        if not self.problem:  # once per outage
            log.warning(
                "memory embeddings: %s; memory search is by words only until it answers", exc
            )
        self.problem = _short(exc)  # "the embeddings endpoint URL failed (HTTP 503) ..."

    def _recovered(self) -> None:
        if self.problem:
            log.info("memory embeddings: %s answers again", self.client.endpoint.url)
        self.problem = ""
        self.backoff.succeeded()

    async def close(self) -> None:
        await self.client.close()


def _short(exc: BaseException) -> str:
    text = str(exc)
    return text if len(text) <= 200 else text[:199] + "…"


async def memory_search(
    index: MemoryIndex,
    embeddings: Embeddings | None,
    query: str,
    limit: int = 10,
    since: date | None = None,
    until: date | None = None,
    session: str | None = None,
) -> SearchResult:
    """What ``memory_search`` and ``memobot memory search`` find: hybrid when embeddings are
    on, else by words as before (no note: that is the configured search)."""
    if embeddings is None:
        hits = await asyncio.to_thread(index.search, query, limit, since, until, session)
        return SearchResult(tuple(hits))
    return await embeddings.search(query, limit, since, until, session)
