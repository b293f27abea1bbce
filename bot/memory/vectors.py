"""Vector arithmetic of hybrid memory search: nearest neighbours and rank fusion (pure).

The vectors are float32 unit rows compared by brute force, a chunk of rows at a time (a
matrix product). sqlite-vec, the usual SQLite extension for this, cannot be loaded by a Python
whose sqlite3 module was built without ``enable_load_extension`` (the one memobot is developed
and tested on, like any built from source without --enable-loadable-sqlite-extensions); at the
sizes of one person's memory a full scan is tens of milliseconds (docs/memory.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from bot.memory.numeric import np

CHUNK_ROWS = 8192  # rows read from SQLite at once
# Rows widened to float32 and multiplied at once: small enough to stay in the CPU's cache
# (1,536 dimensions, 100,000 rows: 34 ms a search in chunks of 1,024 rows, 116 ms in 8,192).
PRODUCT_BYTES = 4 * 1024 * 1024
RRF_K = 60  # the usual constant of reciprocal rank fusion (Cormack et al., 2009)


def to_blob(vector: np.ndarray) -> bytes:
    return np.ascontiguousarray(vector, dtype=np.float32).tobytes()


Chunk = tuple[np.ndarray, np.ndarray, np.ndarray | None]  # ids, rows, each row's scale


def from_rows(rows: Iterable[Sequence[tuple[int, bytes | None]]], dim: int) -> Iterator[Chunk]:
    """(ids, float32 matrix, None) of lists of (id, blob) rows; a blob that is not ``dim`` float32
    numbers (a refused text's NULL, another model's) is left out, never read as a vector."""
    width = dim * 4
    for chunk in rows:
        blob = b"".join(row[1] or b"" for row in chunk)
        if len(blob) != width * len(chunk):  # rare: only the rows of the right size
            chunk = [row for row in chunk if row[1] is not None and len(row[1]) == width]
            blob = b"".join(row[1] for row in chunk)  # type: ignore[misc]
        if chunk:
            ids = np.fromiter((row[0] for row in chunk), dtype=np.int64, count=len(chunk))
            yield ids, np.frombuffer(blob, dtype=np.float32).reshape(len(chunk), dim), None


def quantized(ids: np.ndarray, matrix: np.ndarray) -> Chunk:
    """Rows as int8 with a scale each (a quarter of float32's memory; widening int8 to float32
    for the product is as fast as float32 itself, float16's is ten times slower). The
    cosine it gives is off by at most ~1 %, enough to choose the candidates."""
    scale = np.abs(matrix).max(axis=1) / 127.0
    scale[scale == 0] = 1.0
    rows = np.round(matrix / scale[:, None]).astype(np.int8)
    return ids, rows, scale.astype(np.float32)


def nearest(
    chunks: Iterable[Chunk], query: np.ndarray, k: int, floor: float
) -> list[tuple[int, float]]:
    """The ``k`` (id, cosine) pairs of the rows nearest ``query`` (a unit vector), best first,
    leaving out those under ``floor``. ``chunks``: (ids, unit rows, None) or quantized ones
    (:func:`quantized`), widened a chunk at a time."""
    best_ids = np.empty(0, dtype=np.int64)
    best = np.empty(0, dtype=np.float32)
    step = max(64, PRODUCT_BYTES // (4 * max(1, query.shape[0])))
    for ids, matrix, scale in chunks:
        for start in range(0, len(ids), step):
            part = matrix[start : start + step].astype(np.float32, copy=False)
            sims = part @ query
            if scale is not None:
                sims *= scale[start : start + step]
            keep = sims >= floor
            best_ids = np.concatenate([best_ids, ids[start : start + step][keep]])
            best = np.concatenate([best, sims[keep]])
            if best.shape[0] > k:
                top = np.argpartition(-best, k)[:k]
                best_ids, best = best_ids[top], best[top]
    order = np.argsort(-best, kind="stable")[:k]
    return [(int(best_ids[i]), float(best[i])) for i in order]


def fuse(
    words: Sequence[int], meaning: Sequence[int], k: int = RRF_K, words_weight: float = 1.0
) -> list[tuple[int, float, str]]:
    """Reciprocal rank fusion of two rankings of ids, best first: (id, score, kind) where kind
    says which rankings hold the id, "words", "meaning" or "both"; the words ranking's share
    multiplied by ``words_weight``. Ties keep the words ranking's order first."""
    scores: dict[int, float] = {}
    kinds: dict[int, str] = {}
    for name, ranking, weight in (("words", words, words_weight), ("meaning", meaning, 1.0)):
        for rank, doc in enumerate(ranking, start=1):
            scores[doc] = scores.get(doc, 0.0) + weight / (k + rank)
            kinds[doc] = "both" if doc in kinds and kinds[doc] != name else name
    order = sorted(scores, key=lambda doc: -scores[doc])  # sorted() is stable
    return [(doc, scores[doc], kinds[doc]) for doc in order]
