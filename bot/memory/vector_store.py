"""The vectors of hybrid memory search, in the search index's own SQLite file.

Each indexed text (an archive entry, a memory-file chunk) is cut into pieces, its lines (a
short line joined to the next), and each piece is embedded apart: a consolidation summary
holds several facts, and one vector for all of them would be near none of them. A piece's
vector is kept by the digest of its text, not by row: a history file rewritten by a
compaction is indexed again under new row ids, and its texts keep their vectors. A vector is a
float32 blob; NULL marks a text the endpoint refused (not asked again while the model stays).
Pieces are cut when the embedder looks for work (:func:`cut_pieces`), not when a text is
indexed: embeddings are off by default, and then indexing costs what it did before them.

Searches without a filter scan a copy of the vectors held in memory (:class:`VectorCache`,
int8 with a scale per vector: a quarter of the file's size), since reading every blob from
SQLite costs ~10 us a row; searches within a chat or a range of days join just those rows to
their vectors.
"""

from __future__ import annotations

import hashlib
import logging
import sqlite3
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger(__name__)

MAX_PIECES = 16  # per text; the last piece takes the rest (a raw transcript has hundreds)
PIECE_MIN_CHARS = 24  # a shorter line ("Facts:", a heading) joins the next one

SCHEMA = (
    """CREATE TABLE piece(
        doc INTEGER NOT NULL,  -- doc.id
        digest BLOB NOT NULL,  -- of the piece's text: the key of its vector
        start INTEGER NOT NULL,  -- the piece is doc.body[start:stop]
        stop INTEGER NOT NULL
    )""",
    "CREATE INDEX piece_doc ON piece(doc)",
    "CREATE INDEX piece_digest ON piece(digest)",
    """CREATE TRIGGER doc_pieces_ad AFTER DELETE ON doc BEGIN
        DELETE FROM piece WHERE doc = old.id;
    END""",
    "CREATE TABLE vec(digest BLOB PRIMARY KEY, vec BLOB)",  # rowid: a 1 KB+ blob fits a page
    # embed_model: what the vectors are of; embed_dim: their dimension; vec_epoch: bumped
    # when vectors are removed (a cache reloads); index_id: tells a rebuilt index apart.
    "CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "INSERT INTO meta VALUES ('index_id', hex(randomblob(8))), ('vec_epoch', '0')",
)


def text_digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def text_pieces(body: str) -> list[tuple[int, int]]:
    """(start, stop) of the pieces of ``body`` embedded apart: its non-blank lines, a line
    shorter than ``PIECE_MIN_CHARS`` joined with the next, at most ``MAX_PIECES`` (the last
    one running to the end). A one-line text is one piece."""
    spans: list[tuple[int, int]] = []
    start = stop = -1
    offset = 0
    for line in body.splitlines(keepends=True):
        begin, end = offset, offset + len(line.rstrip())
        offset += len(line)
        if not line.strip():
            continue
        if start < 0:
            start, stop = begin, end
        elif stop - start < PIECE_MIN_CHARS or len(spans) >= MAX_PIECES - 1:
            stop = end
        else:
            spans.append((start, stop))
            start, stop = begin, end
    if start >= 0:
        spans.append((start, stop))
    return spans


def insert_pieces(conn: sqlite3.Connection, docs: Sequence[tuple[int, str]]) -> None:
    """The piece rows of new docs, (id, body) each."""
    conn.executemany(
        "INSERT INTO piece(doc, digest, start, stop) VALUES (?, ?, ?, ?)",
        [
            (doc, text_digest(body[start:stop]), start, stop)
            for doc, body in docs
            for start, stop in text_pieces(body)
        ],
    )


CUT_BATCH = 5000  # docs cut into pieces per write transaction (a search waits at most this)


def cut_pieces(conn: sqlite3.Connection, below: int | None = None) -> int | None:
    """Insert the piece rows of up to ``CUT_BATCH`` docs that have none, with ids under
    ``below`` (None: any), newest first. Returns the lowest id looked at when there may be
    more (call again with it), None when there are none. A doc without a line of text has
    no piece, and is looked at again each time."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        ids = _cut_pieces(conn, CUT_BATCH, below)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return ids[-1] if len(ids) >= CUT_BATCH else None


def _cut_pieces(conn: sqlite3.Connection, limit: int = -1, below: int | None = None) -> list[int]:
    ids = [
        row[0]
        for row in conn.execute(
            "SELECT id FROM doc WHERE (:below IS NULL OR id < :below)"
            " AND NOT EXISTS (SELECT 1 FROM piece WHERE piece.doc = doc.id)"
            " ORDER BY id DESC LIMIT :limit",
            {"below": below, "limit": limit},
        )
    ]
    for start in range(0, len(ids), 500):
        part = ids[start : start + 500]
        marks = ",".join("?" * len(part))
        docs = conn.execute(f"SELECT id, body FROM doc WHERE id IN ({marks})", part)
        insert_pieces(conn, docs.fetchall())
    return ids


def meta(conn: sqlite3.Connection) -> dict[str, str]:
    return dict(conn.execute("SELECT key, value FROM meta").fetchall())


def _bump_epoch(conn: sqlite3.Connection) -> None:
    conn.execute("UPDATE meta SET value = value + 1 WHERE key = 'vec_epoch'")


def use_model(conn: sqlite3.Connection, model: str) -> None:
    """Make ``model`` the one the vectors are of: those of another are dropped (a changed
    model embeds everything again)."""
    if meta(conn).get("embed_model") == model:
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        before = meta(conn).get("embed_model")  # again, under the write lock
        if before != model:
            if before is not None:
                log.info(
                    "memory index: vectors were of %s, now %s: embedding everything again",
                    before,
                    model,
                )
            conn.execute("DELETE FROM vec")
            conn.execute("DELETE FROM meta WHERE key = 'embed_dim'")
            conn.execute("INSERT OR REPLACE INTO meta VALUES ('embed_model', ?)", (model,))
            _bump_epoch(conn)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def pending(conn: sqlite3.Connection, limit: int) -> list[tuple[bytes, str]]:
    """Up to ``limit`` (digest, text) of pieces without a vector, memory files and the newest
    history first."""
    out: dict[bytes, str] = {}
    rows = conn.execute(
        "SELECT piece.digest, doc.body, piece.start, piece.stop FROM piece"
        " JOIN doc ON doc.id = piece.doc"
        " WHERE NOT EXISTS (SELECT 1 FROM vec WHERE vec.digest = piece.digest)"
        " ORDER BY piece.doc DESC"
    )
    for digest, body, start, stop in rows:
        out.setdefault(digest, body[start:stop])
        if len(out) >= limit:
            break
    return list(out.items())


def store(
    conn: sqlite3.Connection, model: str, digests: Sequence[bytes], matrix: np.ndarray | None
) -> None:
    """Keep the unit vectors (rows of ``matrix``) of the pieces ``digests`` as ``model``'s, or
    mark them refused (``matrix`` None). Raises ValueError (nothing stored) when their
    dimension is not the one stored before for the model."""
    from bot.memory.vectors import to_blob

    if matrix is not None and matrix.shape[0] != len(digests):
        raise ValueError(f"{matrix.shape[0]} vectors for {len(digests)} texts")
    use_model(conn, model)
    conn.execute("BEGIN IMMEDIATE")
    try:
        if matrix is not None:
            known = meta(conn).get("embed_dim")
            dim = matrix.shape[1]
            if known is None:
                conn.execute("INSERT INTO meta VALUES ('embed_dim', ?)", (str(dim),))
            elif int(known) != dim:
                raise ValueError(
                    f"{model} gave vectors of {dim} dimensions, earlier ones of {known}"
                )
        blobs = [None] * len(digests) if matrix is None else map(to_blob, matrix)
        # OR IGNORE: a vector once stored keeps its rowid, so a cache need only read new rows.
        rows = zip(digests, blobs, strict=True)
        conn.executemany("INSERT OR IGNORE INTO vec(digest, vec) VALUES (?, ?)", rows)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def counts(conn: sqlite3.Connection, model: str) -> tuple[int, int]:
    """(pieces with a vector of ``model`` or refused, distinct pieces in the index)."""
    total = conn.execute("SELECT count(DISTINCT digest) FROM piece").fetchone()[0]
    if meta(conn).get("embed_model") != model:
        return 0, total
    done = conn.execute(
        "SELECT count(*) FROM vec WHERE digest IN (SELECT digest FROM piece)"
    ).fetchone()[0]
    return done, total


def drop_unused(conn: sqlite3.Connection) -> int:
    """Forget the vectors of pieces no longer in the index; how many."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        _cut_pieces(conn)  # a text another process indexed again (no pieces yet) is not unused
        removed = conn.execute(
            "DELETE FROM vec WHERE digest NOT IN (SELECT digest FROM piece)"
        ).rowcount
        if removed:
            _bump_epoch(conn)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return removed


def _chunks(cur: sqlite3.Cursor) -> Any:
    from bot.memory.vectors import CHUNK_ROWS

    while rows := cur.fetchmany(CHUNK_ROWS):
        yield rows


def doc_filter(lo: str | None, hi: str | None, session: str | None) -> str:
    """The SQL that keeps the ``doc`` rows of a range of days and a chat (bound as :lo, :hi
    and :session); empty when nothing narrows them."""
    where = ""
    if lo:
        where += " AND doc.ts >= :lo"
    if hi:
        where += " AND doc.ts < :hi"
    if session is not None:
        where += " AND doc.session = :session"
    return where


def nearest_filtered(
    conn: sqlite3.Connection,
    query: np.ndarray,
    k: int,
    floor: float,
    lo: str | None,
    hi: str | None,
    session: str | None,
) -> list[tuple[int, bytes]]:
    """(doc id, piece digest) of the ``k`` docs whose best piece is nearest ``query``, best
    first, among the docs of a chat or a range of days."""
    from bot.memory import vectors

    where = "vec.vec IS NOT NULL" + doc_filter(lo, hi, session)
    cur = conn.execute(
        "SELECT piece.rowid, vec.vec FROM doc JOIN piece ON piece.doc = doc.id"
        f" JOIN vec ON vec.digest = piece.digest WHERE {where}",
        {"lo": lo, "hi": hi, "session": session},
    )
    found = vectors.nearest(vectors.from_rows(_chunks(cur), query.shape[0]), query, k * 4, floor)
    out: dict[int, bytes] = {}
    for piece_row, _ in found:
        doc, digest = conn.execute(
            "SELECT doc, digest FROM piece WHERE rowid = ?", (piece_row,)
        ).fetchone()
        out.setdefault(doc, digest)
    return list(out.items())[:k]


@dataclass
class VectorCache:
    """The index's vectors in memory for searches over everything: reloaded when the index
    is another one or vectors were removed, extended by the rows stored since the last
    search otherwise. Thread-safe."""

    key: tuple[str, str, int] | None = None  # index_id, vec_epoch, dimension
    upto: int = 0  # the highest vec rowid read
    blocks: list[Any] = field(default_factory=list)  # vectors.quantized chunks
    lock: threading.Lock = field(default_factory=threading.Lock)

    def nearest(
        self, conn: sqlite3.Connection, query: np.ndarray, k: int, floor: float
    ) -> list[tuple[int, bytes]]:
        """(doc id, piece digest) of the ``k`` docs whose best piece is nearest ``query``."""
        from bot.memory import vectors

        with self.lock:
            self._update(conn, query.shape[0])
            found = vectors.nearest(list(self.blocks), query, k * 4, floor)
        rank = {rowid: n for n, (rowid, _) in enumerate(found)}
        marks = ",".join("?" * len(rank))
        rows = conn.execute(
            "SELECT vec.rowid, piece.doc, piece.digest FROM vec JOIN piece"
            f" ON piece.digest = vec.digest WHERE vec.rowid IN ({marks})",
            list(rank),
        ).fetchall()
        out: dict[int, bytes] = {}
        # Best piece first; a text found twice (the same words in two files) newest first.
        for _, doc, digest in sorted(rows, key=lambda row: (rank[row[0]], -row[1])):
            out.setdefault(doc, digest)
        return list(out.items())[:k]

    def warm(self, conn: sqlite3.Connection) -> None:
        """Read what is new (all of it the first time) now, not at the next search."""
        dim = meta(conn).get("embed_dim")
        if dim is not None:
            with self.lock:
                self._update(conn, int(dim))

    def _update(self, conn: sqlite3.Connection, dim: int) -> None:
        from bot.memory import vectors
        from bot.memory.numeric import np

        info = meta(conn)
        key = (info.get("index_id", ""), info.get("vec_epoch", ""), dim)
        if key != self.key:
            self.key, self.upto, self.blocks = key, 0, []
        last = conn.execute("SELECT max(rowid) FROM vec").fetchone()[0] or 0
        cur = conn.execute(
            "SELECT rowid, vec FROM vec WHERE rowid > ? AND rowid <= ? AND vec IS NOT NULL",
            (self.upto, last),
        )
        for ids, matrix, _ in vectors.from_rows(_chunks(cur), dim):
            self.blocks.append(vectors.quantized(ids, matrix))
        self.upto = last
        if len(self.blocks) > 32:  # many small appends: one block again
            self.blocks = [tuple(np.concatenate([b[i] for b in self.blocks]) for i in range(3))]
