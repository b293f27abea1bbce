"""Full-text search over memory, and the by-day view of the history archive.

What is searchable: every entry of ``memory/history.jsonl`` and of the dated archive files
``memory/history-*.jsonl`` (cited ``FILE#<cursor>``), and the long-term memory files USER.md,
SOUL.md, memory/MEMORY.md and skills/*/SKILL.md cut into paragraphs and bullets (cited
``FILE#<line>``).

The index is derived data: an SQLite FTS5 database at ``<state>/index/memory.sqlite``, outside
the workspace. The files are the source of truth; the index may be deleted at any time and is
rebuilt from them when missing, corrupt or of an older schema. Every search first brings it up
to date: history files are append-only, so only the bytes after the last indexed offset are
read, unless the file shrank or its indexed bytes changed (a compaction rewrote it), in which case
that file is indexed again from the start; memory files are re-chunked when their size or mtime
changed.
"""

from __future__ import annotations

import argparse
import asyncio
import fnmatch
import hashlib
import heapq
import logging
import os
import re
import sqlite3
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import closing
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, timedelta
from functools import cache
from pathlib import Path
from typing import IO, TYPE_CHECKING, TypeVar

from bot import workspace_files
from bot.config import Config
from bot.memory import vector_store
from bot.memory.history import HistoryEntry, parse_entry, read_lines
from bot.private import create_private_file

if TYPE_CHECKING:
    import numpy as np

    from bot.memory.hybrid import SearchResult as SearchResultT

log = logging.getLogger(__name__)

# 2: lines without "session" (nanobot's) are indexed; older indexes skipped them.
# 3: the pieces of each text and their vectors (memory.embeddings, bot.memory.vector_store).
SCHEMA_VERSION = 3
INDEX_FILE = Path("index") / "memory.sqlite"
HISTORY_FILE = "memory/history.jsonl"
ARCHIVE_GLOB = "history-*.jsonl"  # inside memory/
MEMORY_FILES = ("USER.md", "SOUL.md", "memory/MEMORY.md")
SKILL_GLOB = "skills/*/SKILL.md"
SNIPPET_TOKENS = 24
MAX_LIMIT = 100
# Each ranking of a hybrid search offers this many candidates (at least 3 x the hits asked).
HYBRID_CANDIDATES = 50
# In the fusion, a words ranking of entries holding only some of the words (no entry holds them
# all: "where is Dmitri travelling" matches every entry naming Dmitri) counts half.
PARTIAL_WORDS_WEIGHT = 0.5
INSERT_BATCH = 2000
# A query matching more rows than this ranks only the newest this many, which keeps a search
# under ~20 ms however large the archive grows; such a word carries almost no weight in BM25.
RANK_WINDOW = 10_000
# Memory-file chunks get ids above every history entry's, so the newest-rows window always
# includes them.
MEMORY_ID_BASE = 1 << 62
MAX_ID = (1 << 63) - 1
PROBE_BYTES = 4096  # bytes hashed at each end of a history file's indexed region
BUSY_TIMEOUT_S = 30.0

# Of a memory file or SKILL.md (text in every prompt, a budget of a few KB): what is indexed.
MAX_MARKDOWN_BYTES = 1024 * 1024
HISTORY_PREVIEW_LINES = 3
HISTORY_PREVIEW_CHARS = 300

_T = TypeVar("_T")

_SCHEMA = (
    """CREATE TABLE files(
        path TEXT PRIMARY KEY,  -- relative to the workspace
        size INTEGER NOT NULL,  -- stat at the last sync: same size and mtime, nothing to do
        mtime_ns INTEGER NOT NULL,
        indexed INTEGER NOT NULL DEFAULT 0,  -- history files: bytes indexed (whole lines)
        head TEXT NOT NULL DEFAULT '',  -- history files: hash of the first indexed bytes
        tail TEXT NOT NULL DEFAULT ''  -- history files: hash of the last indexed bytes
    )""",
    """CREATE TABLE doc(
        id INTEGER PRIMARY KEY,
        file TEXT NOT NULL,
        anchor INTEGER NOT NULL,  -- cursor of a history entry, first line of a memory chunk
        ts TEXT,  -- UTC "YYYY-MM-DDTHH:MM:SS.fffZ"; NULL for memory chunks
        session TEXT,
        body TEXT NOT NULL
    )""",
    "CREATE INDEX doc_file ON doc(file)",
    "CREATE INDEX doc_ts ON doc(ts) WHERE ts IS NOT NULL",
    """CREATE VIRTUAL TABLE doc_fts USING fts5(
        body, content='doc', content_rowid='id', tokenize='unicode61 remove_diacritics 2'
    )""",
    """CREATE TRIGGER doc_ai AFTER INSERT ON doc BEGIN
        INSERT INTO doc_fts(rowid, body) VALUES (new.id, new.body);
    END""",
    """CREATE TRIGGER doc_ad AFTER DELETE ON doc BEGIN
        INSERT INTO doc_fts(doc_fts, rowid, body) VALUES ('delete', old.id, old.body);
    END""",
    *vector_store.SCHEMA,
    f"PRAGMA user_version = {SCHEMA_VERSION}",
)


class SearchUnavailable(RuntimeError):
    """Full-text search cannot run here (this Python's SQLite lacks FTS5)."""


@dataclass(frozen=True, slots=True)
class SearchHit:
    """One match. ``score`` is higher for better matches (negated BM25)."""

    source: str  # "memory/history.jsonl#42" or "USER.md#7"
    snippet: str  # matched terms in [brackets]
    score: float
    timestamp: str | None  # history entries only
    session: str | None
    # How it matched in a hybrid search: "words", "meaning" or "both"; "" in a words-only one.
    kind: str = ""


@dataclass(frozen=True, slots=True)
class Chunk:
    line: int  # 1-based line of the chunk's first line
    text: str


@dataclass(frozen=True, slots=True)
class _FileState:
    size: int
    mtime_ns: int
    indexed: int
    head: str
    tail: str


# ---------------------------------------------------------------- pure helpers


_BULLET = re.compile(r"\s*(?:[-*+]|\d+[.)])\s+\S")
_FENCE = re.compile(r"\s*(```|~~~)")
_COMMENT_LINE = re.compile(r"\s*<!--.*-->\s*$")
_HEADING = re.compile(r" {0,3}#{1,6}(?:\s|$)")


def chunk_markdown(text: str) -> list[Chunk]:
    """Cut a Markdown file into searchable chunks: one per paragraph, bullet, heading or fenced
    block. Lines that are only an HTML comment (template hints) are left out."""
    chunks: list[Chunk] = []
    start, lines = 0, []  # current chunk
    fence: str | None = None

    def flush() -> None:
        nonlocal lines
        if lines and any(line.strip() for line in lines):
            chunks.append(Chunk(start, "\n".join(lines).strip("\n")))
        lines = []

    for number, line in enumerate(text.splitlines(), start=1):
        if fence is not None:
            lines.append(line)
            if line.strip().startswith(fence):
                fence = None
                flush()
            continue
        opening = _FENCE.match(line)
        if not line.strip() or _COMMENT_LINE.match(line):
            flush()
            continue
        heading = _HEADING.match(line)
        if opening or heading or _BULLET.match(line):
            flush()
        if not lines:
            start = number
        lines.append(line)
        if opening:
            fence = opening.group(1)
        elif heading:
            flush()
    flush()
    return chunks


def build_queries(text: str) -> list[str]:
    """FTS5 MATCH expressions to try in order until one finds something.

    Every whitespace-separated word becomes a quoted phrase (double quotes doubled), so no user
    text can be an FTS5 syntax error and operators (AND, NEAR, -, parentheses) are plain words.
    A word ending in ``*`` is a prefix. The order: all words, then all words with the last one as
    a prefix (as typed so far), then any word. Empty when the text has no word at all.
    """
    words: list[tuple[str, bool]] = []
    for raw in text.split():
        word = raw.rstrip("*")
        if any(ch.isalnum() for ch in word):
            words.append((word, word != raw))
    if not words:
        return []

    def phrase(word: str, prefix: bool) -> str:
        return '"' + word.replace('"', '""') + '"' + ("*" if prefix else "")

    exact = [phrase(w, p) for w, p in words]
    last_word, last_prefix = words[-1]
    prefixed = [*exact[:-1], phrase(last_word, True)]
    candidates = [" AND ".join(exact)]
    if not last_prefix and len(last_word) >= 3:
        candidates.append(" AND ".join(prefixed))
    candidates.append(" OR ".join(prefixed if len(last_word) >= 3 else exact))
    return list(dict.fromkeys(candidates))


def normalize_timestamp(text: str) -> str | None:
    """An ISO-8601 timestamp as UTC ``YYYY-MM-DDTHH:MM:SS.fffZ``, or None.

    memobot always writes UTC with a zone; a naive stamp (``2026-03-02 09:15``) comes from
    nanobot, which writes this machine's local time.
    """
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    return _utc_iso(moment)  # astimezone() reads a naive moment as local time


def _utc_iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def day_bounds(since: date | None, until: date | None) -> tuple[str | None, str | None]:
    """UTC timestamp bounds ``[lo, hi)`` for the local-time days ``since`` to ``until``
    inclusive, comparable with normalized timestamps as strings."""
    lo = _utc_iso(datetime.combine(since, datetime.min.time()).astimezone()) if since else None
    hi = None
    if until:
        hi = _utc_iso(datetime.combine(until + timedelta(days=1), datetime.min.time()).astimezone())
    return lo, hi


def local_time(timestamp: str) -> datetime | None:
    """A stored timestamp in the machine's local time zone, or None when it does not parse."""
    try:
        moment = datetime.fromisoformat(timestamp)
    except ValueError:
        return None
    return moment.astimezone()  # naive (nanobot's stamps) is local time already


def format_hit(number: int, hit: SearchHit) -> str:
    """``1. [memory/history.jsonl#42, 2026-11-28, telegram:123] …snippet…`` (local date)."""
    tags = [hit.source]
    moment = local_time(hit.timestamp) if hit.timestamp else None
    if moment:
        tags.append(moment.date().isoformat())
    if hit.session:
        tags.append(hit.session)
    if hit.kind:
        tags.append(f"match: {hit.kind}")
    return f"{number}. [{', '.join(tags)}] {hit.snippet}"


def format_hits(hits: Iterable[SearchHit]) -> str:
    return "\n".join(format_hit(n, hit) for n, hit in enumerate(hits, start=1))


# ---------------------------------------------------------------- history files


def history_files(workspace: Path) -> list[tuple[str, Path]]:
    """(relative name, path) of the dated archive files, oldest first, then history.jsonl."""
    out = [
        (f"memory/{name}", workspace / "memory" / name)
        for name, st in workspace_files.list_dir(workspace, "memory")
        if fnmatch.fnmatchcase(name, ARCHIVE_GLOB) and stat.S_ISREG(st.st_mode)
    ]
    if workspace_files.is_file(workspace, HISTORY_FILE):
        out.append((HISTORY_FILE, workspace / HISTORY_FILE))
    return out


def _stream_entries(workspace: Path, rel: str) -> Iterator[tuple[str, HistoryEntry]]:
    try:
        fd = workspace_files.open_fd(workspace, rel)
    except FileNotFoundError:
        return
    try:
        for line, _ in read_lines(fd, rel):
            entry = parse_entry(line) if line is not None else None
            if entry:
                yield rel, entry
    finally:
        os.close(fd)


def iter_history(workspace: Path) -> Iterator[tuple[str, HistoryEntry]]:
    """Every history entry in cursor order as (file, entry), streamed line by line.

    Each file is in cursor order already; the files are merged. A cursor present in two files
    (a compaction interrupted between writing the archive and rewriting history.jsonl) is
    yielded once.
    """
    streams = [_stream_entries(workspace, rel) for rel, _ in history_files(workspace)]
    last: int | None = None
    for rel, entry in heapq.merge(*streams, key=lambda item: item[1].cursor):
        if entry.cursor != last:
            last = entry.cursor
            yield rel, entry


# ---------------------------------------------------------------- the index


@cache
def _check_fts5() -> None:
    with closing(sqlite3.connect(":memory:")) as conn:
        try:
            conn.execute("CREATE VIRTUAL TABLE probe USING fts5(body)")
        except sqlite3.OperationalError:
            raise SearchUnavailable(
                f"memory search needs SQLite with the FTS5 extension; this Python's sqlite3 "
                f"(SQLite {sqlite3.sqlite_version}) was built without it"
            ) from None


def _is_corruption(exc: sqlite3.DatabaseError) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)
    return type(exc) is sqlite3.DatabaseError


def _enter_wal(conn: sqlite3.Connection) -> None:
    """Switch a new database to WAL (a lasting property of the file).

    The switch needs the database to itself and SQLite does not wait for that (no busy
    handler), so a race with another process opening it at the same moment is retried here.
    """
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            busy = getattr(exc, "sqlite_errorcode", 0) & 0xFF == sqlite3.SQLITE_BUSY
            if not busy or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _next_id(conn: sqlite3.Connection, low: int, high: int) -> int:
    """The next free doc id in ``[low, high]`` (above every id used there)."""
    row = conn.execute("SELECT max(id) FROM doc WHERE id BETWEEN ? AND ?", (low, high))
    last = row.fetchone()[0]
    return low if last is None else last + 1


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def _read_at(fh: IO[bytes], offset: int, size: int) -> bytes:
    fh.seek(offset)
    return fh.read(size)


class MemoryIndex:
    """The FTS5 index over a workspace's history and memory files.

    Thread-safe and multi-process safe: every call opens its own connection (WAL mode), syncing
    is serialized by a lock within the process and by SQLite's write lock across processes. The
    calls block on disk I/O; from async code run them with ``asyncio.to_thread``.
    """

    def __init__(self, workspace: Path, state_dir: Path) -> None:
        self.workspace = workspace
        self.path = state_dir / INDEX_FILE
        self._sync_lock = threading.Lock()
        self._vectors = vector_store.VectorCache()
        # The indexed files' states (bot.memory.vector_store) when pieces were last cut, when
        # no text was found without a vector, and when unused vectors were last dropped.
        self._pieces_seen: object = None
        self._settled: object = None
        self._dropped: object = None

    # -- public

    def search(
        self,
        query: str,
        limit: int = 10,
        since: date | None = None,
        until: date | None = None,
        session: str | None = None,
    ) -> list[SearchHit]:
        """The best ``limit`` (at most 100) matches for ``query``, best first (BM25), after
        bringing the index up to date. ``session``: only that chat's history entries (no
        memory-file chunks, no other chat's entries), filtered in the query itself.

        Entries containing every word are preferred; only when there are none, entries with any
        word are returned (see :func:`build_queries`). ``since``/``until`` (local days,
        inclusive) restrict the result to history entries in that range. A query matching more
        than ``RANK_WINDOW`` rows ranks only the newest ``RANK_WINDOW`` of them (memory-file
        chunks always among them). Never raises for odd query text; raises SearchUnavailable
        when SQLite lacks FTS5 and OSError/sqlite3.Error for I/O trouble other than a corrupt
        index (which is rebuilt)."""
        expressions = build_queries(query)
        if not expressions or limit < 1:
            return []
        lo, hi = day_bounds(since, until)
        limit = min(limit, MAX_LIMIT)

        def run(conn: sqlite3.Connection) -> list[SearchHit]:
            self._sync(conn)
            for expression in expressions:
                hits = self._query(conn, expression, limit, lo, hi, session)
                if hits:
                    return [hit for _, hit in hits]
            return []

        return self._with_connection(run)

    def hybrid_search(
        self,
        query: str,
        vector: np.ndarray,
        model: str,
        limit: int = 10,
        since: date | None = None,
        until: date | None = None,
        session: str | None = None,
        floor: float = 0.3,
    ) -> tuple[list[SearchHit], str]:
        """Matches by words (BM25, as :meth:`search`) and by meaning (the texts with a piece
        whose stored vector of ``model`` is nearest ``vector``, the query's unit vector, cosine
        at least ``floor``), ranked by reciprocal rank fusion, each hit's ``kind`` saying
        which. Same filters and citations as :meth:`search`; a hit by meaning alone shows the
        piece that matched. Returns (hits, problem): ``problem`` is "" when meaning took part,
        else why not (no vectors of ``model`` yet, another dimension), and the hits are then
        by words alone."""
        from bot.memory import vectors  # numpy: imported only where embeddings are on

        expressions = build_queries(query)
        if limit < 1:
            return [], ""
        lo, hi = day_bounds(since, until)
        limit = min(limit, MAX_LIMIT)
        candidates = max(limit * 3, HYBRID_CANDIDATES)

        def run(conn: sqlite3.Connection) -> tuple[list[SearchHit], str]:
            self._sync(conn)
            # One snapshot: the vectors are found by row id and then joined to their texts;
            # vectors dropped and stored meanwhile (the background task, another process)
            # can take the same row ids, and another text would be named as the match.
            conn.execute("BEGIN")
            try:
                return matches(conn)
            finally:
                conn.execute("COMMIT")  # a read: nothing to undo

        def matches(conn: sqlite3.Connection) -> tuple[list[SearchHit], str]:
            words: list[tuple[int, SearchHit]] = []
            weight = 1.0
            for expression in expressions:
                words = self._query(conn, expression, candidates, lo, hi, session)
                if words:
                    weight = PARTIAL_WORDS_WEIGHT if " OR " in expression else 1.0
                    break
            meta = vector_store.meta(conn)
            problem = ""
            if meta.get("embed_model") != model or "embed_dim" not in meta:
                problem = "the meaning index is not built yet"
            elif int(meta["embed_dim"]) != vector.shape[0]:
                problem = "the query's vector has another dimension than the stored ones"
            if problem:
                return [hit for _, hit in words[:limit]], problem
            if lo or hi or session is not None:
                near = vector_store.nearest_filtered(
                    conn, vector, candidates, floor, lo, hi, session
                )
            else:
                near = self._vectors.nearest(conn, vector, candidates, floor)
            by_id = dict(words)
            meaning = [doc for doc, _ in near]
            fused = vectors.fuse(list(by_id), meaning, words_weight=weight)[:limit]
            pieces = dict(near)
            missing = {doc: pieces[doc] for doc, _, _ in fused if doc not in by_id}
            by_id |= self._piece_hits(conn, missing)
            return [replace(by_id[d], score=score, kind=kind) for d, score, kind in fused], ""

        return self._with_connection(run)

    def refresh(self) -> None:
        """Bring the index up to date with the files (a no-op when nothing changed)."""
        self._with_connection(self._sync)

    # -- vectors (memory.embeddings; bot.memory.vector_store)

    def pending_texts(self, model: str, limit: int) -> list[tuple[bytes, str]]:
        """Up to ``limit`` (digest, text) of pieces without a vector of ``model`` yet, memory
        files and the newest history first, after bringing the index up to date. Vectors of
        another model are dropped first: a changed model embeds everything again."""

        def run(conn: sqlite3.Connection) -> list[tuple[bytes, str]]:
            self._sync(conn)
            seen = (self._files_seen(conn), model)
            if seen == self._settled:  # nothing new since everything was embedded
                return []
            self._cut_pieces(conn, seen[0])
            vector_store.use_model(conn, model)
            found = vector_store.pending(conn, limit)
            if not found:
                self._settled = seen
            return found

        return self._with_connection(run)

    def store_vectors(
        self, model: str, digests: Sequence[bytes], matrix: np.ndarray | None
    ) -> None:
        """Keep the unit vectors (rows of ``matrix``) of the pieces ``digests`` as
        ``model``'s; ``matrix`` None marks them refused by the endpoint (never asked again
        while the model stays). Raises ValueError when their dimension differs from the
        vectors stored before for the same model (nothing stored then)."""
        self._with_connection(lambda conn: vector_store.store(conn, model, digests, matrix))

    def vector_counts(self, model: str) -> tuple[int, int]:
        """(pieces with a vector of ``model`` or refused, distinct pieces in the index)."""
        return self._with_connection(lambda conn: vector_store.counts(conn, model))

    def warm_vectors(self) -> None:
        """Bring the in-memory copy of the vectors up to date now (the gateway's background
        task), so that no search pays for loading it (3.7 s for 100,000 x 1,536)."""
        self._with_connection(self._vectors.warm)

    def drop_unused_vectors(self) -> int:
        """Forget the vectors of pieces no longer in the index; how many. Looked for only
        when the indexed files changed since last time (a scan of every vector)."""

        def run(conn: sqlite3.Connection) -> int:
            seen = self._files_seen(conn)
            if seen == self._dropped:
                return 0
            removed = vector_store.drop_unused(conn)
            self._dropped = seen
            return removed

        return self._with_connection(run)

    @staticmethod
    def _files_seen(conn: sqlite3.Connection) -> object:
        """What changes whenever the indexed texts do: the index's identity and the states
        of the files it indexed."""
        files = conn.execute("SELECT path, size, mtime_ns, indexed FROM files").fetchall()
        return (vector_store.meta(conn).get("index_id"), frozenset(files))

    def _cut_pieces(self, conn: sqlite3.Connection, seen: object) -> None:
        """The piece rows of the texts indexed without them. Indexing never cuts pieces:
        embeddings are off by default, and a process with them off (memobot memory search)
        shares the index. Looked for only when the indexed files changed since last time."""
        if seen != self._pieces_seen:
            # A batch per write transaction, each under the sync lock: a search waiting to
            # index what is new waits for one batch, never long enough for "database is
            # locked" (an archive of a million entries takes a minute to cut).
            below: int | None = None
            while True:
                with self._sync_lock:
                    below = vector_store.cut_pieces(conn, below)
                if below is None:
                    break
            self._pieces_seen = seen

    @staticmethod
    def _piece_hits(conn: sqlite3.Connection, pieces: dict[int, bytes]) -> dict[int, SearchHit]:
        """Hits for docs found by meaning alone: no words to mark; the piece that matched."""
        out = {}
        for doc, digest in pieces.items():
            row = conn.execute(
                "SELECT doc.file, doc.anchor, doc.ts, doc.session, doc.body, piece.start,"
                " piece.stop FROM doc JOIN piece ON piece.doc = doc.id"
                " WHERE doc.id = ? AND piece.digest = ?",
                (doc, digest),
            ).fetchone()
            if row is None:
                continue
            file, anchor, ts, session, body, start, stop = row
            words = body[start:stop].split()
            more = " …" if len(words) > SNIPPET_TOKENS or start > 0 or stop < len(body) else ""
            lead = "… " if start > 0 else ""
            snippet = lead + " ".join(words[:SNIPPET_TOKENS]) + more
            out[doc] = SearchHit(f"{file}#{anchor}", snippet, 0.0, ts, session)
        return out

    # -- connection and recovery

    def _with_connection(self, work: Callable[[sqlite3.Connection], _T]) -> _T:
        _check_fts5()
        try:
            with closing(self._connect()) as conn:
                return work(conn)
        except sqlite3.DatabaseError as exc:
            if not _is_corruption(exc):
                raise
            log.warning("memory index %s is unreadable (%s); rebuilding it", self.path, exc)
            with self._sync_lock:
                self._discard()
        with closing(self._connect()) as conn:
            return work(conn)

    def _connect(self) -> sqlite3.Connection:
        # SQLite creates files 0644 (its journal files copy the database's mode); the index
        # holds the conversations' text, so it is made 0600 first.
        create_private_file(self.path)
        conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        try:
            if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                with self._sync_lock:
                    _enter_wal(conn)
            conn.execute("PRAGMA synchronous=NORMAL")  # derived data: durability is not needed
            if conn.execute("PRAGMA user_version").fetchone()[0] != SCHEMA_VERSION:
                self._create_schema(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    @staticmethod
    def _create_schema(conn: sqlite3.Connection) -> None:
        conn.execute("BEGIN IMMEDIATE")
        try:
            # Re-checked under the write lock: another process may have just created it.
            if conn.execute("PRAGMA user_version").fetchone()[0] != SCHEMA_VERSION:
                for kind, name in conn.execute(
                    "SELECT type, name FROM sqlite_master WHERE type IN ('table', 'trigger')"
                    " AND name NOT LIKE 'sqlite_%' AND name NOT LIKE 'doc_fts_%'"
                ).fetchall():
                    conn.execute(f'DROP {kind.upper()} IF EXISTS "{name}"')
                for statement in _SCHEMA:
                    conn.execute(statement)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def _discard(self) -> None:
        for suffix in ("", "-wal", "-shm", "-journal"):
            Path(f"{self.path}{suffix}").unlink(missing_ok=True)

    # -- searching

    @staticmethod
    def _query(
        conn: sqlite3.Connection,
        expression: str,
        limit: int,
        lo: str | None,
        hi: str | None,
        session: str | None = None,
    ) -> list[tuple[int, SearchHit]]:
        low_id, high_id = 0, MAX_ID
        if lo or hi:
            # Ids follow cursor order closely, so the day range narrows the rows FTS5 visits;
            # the exact timestamp test below keeps the result right when they do not.
            low_id, high_id = conn.execute(
                "SELECT min(id), max(id) FROM doc WHERE ts >= :lo AND ts < :hi",
                {"lo": lo or "", "hi": hi or "~"},
            ).fetchone()
            if low_id is None:
                return []
        params: dict[str, object] = {
            "q": expression,
            "low": low_id,
            "high": high_id,
            "window": RANK_WINDOW - 1,
        }
        if session is None:
            floor = conn.execute(
                "SELECT rowid FROM doc_fts WHERE doc_fts MATCH :q AND rowid BETWEEN :low AND :high"
                " ORDER BY rowid DESC LIMIT 1 OFFSET :window",
                params,
            ).fetchone()
        else:  # the rank window counts this chat's rows only
            floor = conn.execute(
                "SELECT doc_fts.rowid FROM doc_fts JOIN doc ON doc.id = doc_fts.rowid"
                " WHERE doc_fts MATCH :q AND doc_fts.rowid BETWEEN :low AND :high"
                " AND doc.session = :session ORDER BY doc_fts.rowid DESC LIMIT 1 OFFSET :window",
                {**params, "session": session},
            ).fetchone()
        if floor is not None:
            params["low"] = floor[0]
        where = "doc_fts MATCH :q AND doc_fts.rowid BETWEEN :low AND :high" + (
            vector_store.doc_filter(lo, hi, session)
        )
        rows = conn.execute(
            "SELECT doc.id, doc.file, doc.anchor, doc.ts, doc.session,"
            f" snippet(doc_fts, 0, '[', ']', '…', {SNIPPET_TOKENS}), rank"
            f" FROM doc_fts JOIN doc ON doc.id = doc_fts.rowid WHERE {where}"
            " ORDER BY rank LIMIT :limit",
            {**params, "lo": lo, "hi": hi, "limit": limit, "session": session},
        )
        return [
            (doc, SearchHit(f"{file}#{anchor}", " ".join(snippet.split()), -rank, ts, session))
            for doc, file, anchor, ts, session, snippet, rank in rows
        ]

    # -- syncing

    def _current_files(self) -> dict[str, tuple[Path, bool]]:
        """rel -> (path, is_history) for every indexable file that exists now."""
        files = {rel: (path, True) for rel, path in history_files(self.workspace)}
        skills = workspace_files.files_matching(self.workspace, *SKILL_GLOB.split("/*/"))
        for rel in MEMORY_FILES:
            if workspace_files.is_file(self.workspace, rel):
                files[rel] = (self.workspace / rel, False)
        for rel, _ in skills:
            files[rel] = (self.workspace / rel, False)
        return files

    @staticmethod
    def _known(conn: sqlite3.Connection) -> dict[str, _FileState]:
        rows = conn.execute("SELECT path, size, mtime_ns, indexed, head, tail FROM files")
        return {row[0]: _FileState(*row[1:]) for row in rows}

    def _stale(self, conn: sqlite3.Connection, files: dict[str, tuple[Path, bool]]) -> bool:
        known = self._known(conn)
        if known.keys() != files.keys():
            return True
        for rel in files:
            st = workspace_files.file_stat(self.workspace, rel)
            if st is None:
                return True
            if (st.st_size, st.st_mtime_ns) != (known[rel].size, known[rel].mtime_ns):
                return True
        return False

    def _sync(self, conn: sqlite3.Connection) -> None:
        files = self._current_files()
        if not self._stale(conn, files):  # the common case: a few stat calls, no write lock
            return
        with self._sync_lock:
            conn.execute("BEGIN IMMEDIATE")
            try:
                known = self._known(conn)  # re-read under the write lock
                for rel in known.keys() - files.keys():
                    self._forget(conn, rel)
                for rel, (path, is_history) in files.items():
                    if is_history:
                        self._sync_history(conn, rel, path, known.get(rel))
                    else:
                        self._sync_markdown(conn, rel, path, known.get(rel))
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise

    @staticmethod
    def _forget(conn: sqlite3.Connection, rel: str) -> None:
        conn.execute("DELETE FROM doc WHERE file = ?", (rel,))
        conn.execute("DELETE FROM files WHERE path = ?", (rel,))

    @staticmethod
    def _save_state(conn: sqlite3.Connection, rel: str, state: _FileState) -> None:
        conn.execute(
            "INSERT OR REPLACE INTO files(path, size, mtime_ns, indexed, head, tail)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (rel, state.size, state.mtime_ns, state.indexed, state.head, state.tail),
        )

    def _sync_markdown(
        self, conn: sqlite3.Connection, rel: str, path: Path, known: _FileState | None
    ) -> None:
        try:
            fd = workspace_files.open_fd(self.workspace, rel)
        except (FileNotFoundError, NotADirectoryError):
            self._forget(conn, rel)
            return
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fd)
            # Only its head: the model can plant a sparse file of gigabytes here.
            data = fh.read(MAX_MARKDOWN_BYTES + 1)
        if len(data) > MAX_MARKDOWN_BYTES:
            log.warning(
                "memory index: %s is larger than %d bytes; only its start is searchable",
                rel,
                MAX_MARKDOWN_BYTES,
            )
            data = data[:MAX_MARKDOWN_BYTES]
        text = data.decode("utf-8", errors="replace")
        if known and (known.size, known.mtime_ns) == (st.st_size, st.st_mtime_ns):
            return
        conn.execute("DELETE FROM doc WHERE file = ?", (rel,))
        first = _next_id(conn, MEMORY_ID_BASE, MAX_ID)
        chunks = chunk_markdown(text)
        conn.executemany(
            "INSERT INTO doc(id, file, anchor, ts, session, body) VALUES (?, ?, ?, NULL, NULL, ?)",
            [(first + i, rel, c.line, c.text) for i, c in enumerate(chunks)],
        )
        self._save_state(conn, rel, _FileState(st.st_size, st.st_mtime_ns, 0, "", ""))

    def _sync_history(
        self, conn: sqlite3.Connection, rel: str, path: Path, known: _FileState | None
    ) -> None:
        """Index the whole lines appended since the last sync, or the whole file again when the
        already indexed bytes are no longer what they were (the file was rewritten)."""
        try:
            fd = workspace_files.open_fd(self.workspace, rel)
        except (FileNotFoundError, NotADirectoryError):
            self._forget(conn, rel)
            return
        with os.fdopen(fd, "rb") as fh:
            self._sync_open_history(conn, rel, fh, os.fstat(fd), known)

    def _sync_open_history(
        self,
        conn: sqlite3.Connection,
        rel: str,
        fh: IO[bytes],
        st: os.stat_result,
        known: _FileState | None,
    ) -> None:
        start = known.indexed if known and self._prefix_intact(fh, known, st.st_size) else 0
        if start == 0:
            if known and known.indexed:
                log.info("memory index: %s was rewritten; indexing it again", rel)
            conn.execute("DELETE FROM doc WHERE file = ?", (rel,))
        end = self._index_lines(conn, rel, fh, start)
        head = _digest(_read_at(fh, 0, min(end, PROBE_BYTES)))
        tail_start = max(0, end - PROBE_BYTES)
        tail = _digest(_read_at(fh, tail_start, end - tail_start))
        self._save_state(conn, rel, _FileState(st.st_size, st.st_mtime_ns, end, head, tail))

    @staticmethod
    def _prefix_intact(fh: IO[bytes], known: _FileState, size: int) -> bool:
        if size < known.indexed:
            return False
        head = _read_at(fh, 0, min(known.indexed, PROBE_BYTES))
        tail_start = max(0, known.indexed - PROBE_BYTES)
        tail = _read_at(fh, tail_start, known.indexed - tail_start)
        return _digest(head) == known.head and _digest(tail) == known.tail

    @staticmethod
    def _index_lines(conn: sqlite3.Connection, rel: str, fh: IO[bytes], start: int) -> int:
        """Insert the entries of every complete line from ``start``; returns the offset after
        the last complete line (a torn last line waits for its newline)."""
        offset, batch, bad = start, [], 0
        next_id = _next_id(conn, 1, MEMORY_ID_BASE - 1)
        insert = "INSERT INTO doc(id, file, anchor, ts, session, body) VALUES (?, ?, ?, ?, ?, ?)"

        def flush() -> None:
            conn.executemany(insert, batch)
            batch.clear()

        for line, size in read_lines(fh.fileno(), rel, start):
            if line is not None and not line.endswith(b"\n"):
                break
            # A line too long to read (None) is passed for good, torn or not: it is never
            # searchable, and reading it through again at every search would cost as much.
            offset += size
            entry = parse_entry(line) if line is not None else None
            if entry is None:
                bad += line is None or bool(line.strip())
                continue
            ts = normalize_timestamp(entry.timestamp)
            batch.append((next_id, rel, entry.cursor, ts, entry.session, entry.content))
            next_id += 1
            if len(batch) >= INSERT_BATCH:
                flush()
        flush()
        if bad:
            log.warning("memory index: %s has %d unreadable line(s); not searchable", rel, bad)
        return offset


# ---------------------------------------------------------------- command line


def cmd_search(cfg: Config, args: argparse.Namespace) -> int:
    """``memobot memory search WORDS [--since D] [--until D] [-n N]``: print the hits."""
    query = " ".join(args.query)
    if args.limit < 1:
        print("memobot: --limit must be at least 1", file=sys.stderr)
        return 2
    if args.since and args.until and args.since > args.until:
        print("memobot: --since is after --until", file=sys.stderr)
        return 2
    from bot.memory.hybrid import Embeddings, memory_search

    index = MemoryIndex(cfg.agent.workspace_path, cfg.agent.state_path)
    embeddings = Embeddings.from_config(cfg, index)

    async def run() -> SearchResultT:
        try:
            return await memory_search(
                index, embeddings, query, args.limit, since=args.since, until=args.until
            )
        finally:
            if embeddings is not None:
                await embeddings.close()

    try:
        found = asyncio.run(run())
    except SearchUnavailable as exc:
        print(f"memobot: {exc}", file=sys.stderr)
        return 1
    print(format_hits(found.hits) if found.hits else f"No matches for {query!r}.")
    if found.note:
        print(f"({found.note})")
    return 0


def dated_history(
    workspace: Path, since: date | None = None, until: date | None = None
) -> Iterator[tuple[date | None, HistoryEntry, datetime | None]]:
    """(local day, entry, local time) of every history entry in cursor order, only those of
    the local days ``since`` to ``until`` (inclusive) when given; streamed. An entry whose
    time does not parse has no day (and is left out when a range is given). What
    ``memobot memory history`` prints and the panel's archive shows."""
    lo, hi = day_bounds(since, until)
    for _, entry in iter_history(workspace):
        if lo or hi:
            ts = normalize_timestamp(entry.timestamp)
            if (lo and (ts is None or ts < lo)) or (hi and (ts is None or ts >= hi)):
                continue
        moment = local_time(entry.timestamp)
        yield (moment.date() if moment else None), entry, moment


def cmd_history(cfg: Config, args: argparse.Namespace) -> int:
    """``memobot memory history [--since D] [--until D]``: the archive by local day. A closed
    stdout (``| head``) ends it through the CLI's one quiet exit."""
    printed = False
    current_day: date | None = None
    for day, entry, moment in dated_history(cfg.agent.workspace_path, args.since, args.until):
        if day != current_day or not printed:
            if printed:
                print()
            print(_day_heading(day))
            current_day = day
        print(format_history_entry(entry, moment))
        printed = True
    if not printed:
        ranged = args.since or args.until
        print("No history entries" + (" in that range." if ranged else " yet."))
    return 0


def _day_heading(day: date | None) -> str:
    return f"== {day.isoformat()} ({day.strftime('%A')}) ==" if day else "== (no date) =="


def format_history_entry(entry: HistoryEntry, moment: datetime | None) -> str:
    """``HH:MM  session  content`` with at most a few lines / chars of content, continuation
    lines indented under the content's first character."""
    prefix = f"{moment.strftime('%H:%M') if moment else '--:--'}  {entry.session or '-'}  "
    lines = entry.content.strip().splitlines() or [""]
    shown = "\n".join(lines[:HISTORY_PREVIEW_LINES])
    cut = len(lines) > HISTORY_PREVIEW_LINES
    if len(shown) > HISTORY_PREVIEW_CHARS:
        shown, cut = shown[:HISTORY_PREVIEW_CHARS].rstrip(), True
    if cut:
        shown += " …"
    return prefix + shown.replace("\n", "\n" + " " * len(prefix))
