"""The embeddings endpoint of ``memory.embeddings``: texts in, unit vectors out.

Any OpenAI-compatible ``POST {baseUrl}/embeddings`` (OpenAI, Ollama, vLLM, llama.cpp, LM
Studio). Spoken with aiohttp rather than the openai SDK because the answer is untrusted input
whose size must be bounded before it is read: the body is read up to ``MAX_RESPONSE_BYTES`` and
every vector is checked (count, index, dimension, finite numbers) before anything is stored. One
retry policy as the LLM's: tenacity on a lost connection, a timeout, 429 and 5xx, exponential
back-off with jitter, the server's Retry-After honoured up to a cap. The key is sent in a header
and never logged; what is shown and logged is the URL without credentials.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import aiohttp
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential,
    wait_random,
)

from bot.memory.numeric import np
from bot.proxy import environment_proxy
from bot.urls import endpoint_access

if TYPE_CHECKING:
    from bot.config import Config

log = logging.getLogger(__name__)

DEFAULT_ENDPOINT = "https://api.openai.com/v1"
# An input is cut to this many characters: an archive entry is a few hundred; OpenAI's models
# take 8,191 tokens per input, and a longer one would fail its whole batch every time.
MAX_INPUT_CHARS = 8000
MAX_DIMENSIONS = 8192  # the largest models have 4,096; more is a broken or hostile answer
# 256 texts (the largest batch) of 4,096 dimensions written as JSON floats is about 30 MB.
MAX_RESPONSE_BYTES = 48 * 1024 * 1024
ATTEMPTS = 3
FIRST_RETRY_SECONDS = 1.0
MAX_RETRY_SECONDS = 20.0
RETRY_AFTER_CAP_SECONDS = 60.0


class EmbeddingError(Exception):
    """The endpoint gave no usable vectors. ``str()`` names the endpoint, never the key."""


class EmbeddingUnavailable(EmbeddingError):
    """A lost connection, a timeout, 429 or 5xx that outlasted the retries."""


class EmbeddingRejected(EmbeddingError):
    """A 4xx answer: this request will fail again as it is (a bad key, model, or input)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class BadEmbeddingAnswer(EmbeddingError):
    """An answer that is not what was asked: too large, not JSON, wrong count or dimension."""


class BadVector(BadEmbeddingAnswer):
    """An answer of the right shape with a vector that is not one (NaN, infinite, zero, not
    numbers): about one text, perhaps (some servers give odd input a NaN vector)."""


class _Transient(Exception):
    def __init__(self, what: str, retry_after: float | None = None) -> None:
        super().__init__(what)
        self.retry_after = retry_after


@dataclass(frozen=True, slots=True)
class EmbeddingEndpoint:
    """Where to ask: ``url`` without credentials (fit to show), and what carries them."""

    url: str
    model: str
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    query: dict[str, str] = field(default_factory=dict, repr=False)

    @property
    def identity(self) -> str:
        """What the stored vectors are of: a change re-embeds everything."""
        return f"{self.model} @ {self.url}"


def endpoint_from_config(cfg: Config) -> EmbeddingEndpoint | None:
    """The endpoint ``memory.embeddings`` names, or None when it is off. With ``baseUrl`` ""
    it is the LLM's own server and key (``llm.baseUrl`` or OPENAI_BASE_URL); a server of its
    own gets only ``memory.embeddings.apiKey``, never llm's key. Raises ValueError for a base
    URL that cannot carry the key (user:password@ and a key)."""
    emb = cfg.memory.embeddings
    if not emb.enabled:
        return None
    if emb.base_url:
        base, key = emb.base_url, emb.api_key
    else:
        base = cfg.llm.resolved_base_url() or DEFAULT_ENDPOINT
        key = emb.api_key or cfg.llm.resolved_api_key()
    access = endpoint_access(base, "memory.embeddings.baseUrl", bearer=bool(key))
    headers = dict(access.headers)
    if key:
        headers["Authorization"] = f"Bearer {key}"
    return EmbeddingEndpoint(access.url.rstrip("/"), emb.model, headers, dict(access.query))


def parse_embeddings(payload: Any, count: int) -> np.ndarray:
    """The ``count`` vectors of an ``/embeddings`` answer as a float32 matrix of unit rows,
    in input order. Raises BadEmbeddingAnswer for anything else: a missing or extra vector,
    an index out of place, vectors of different or absurd dimension, a non-number, an
    infinity, a zero vector."""
    data = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(data, list) or len(data) != count:
        got = len(data) if isinstance(data, list) else "no"
        raise BadEmbeddingAnswer(f"asked for {count} vectors, got {got}")
    rows: list[Any] = [None] * count
    for position, item in enumerate(data):
        if not isinstance(item, dict) or not isinstance(item.get("embedding"), list):
            raise BadEmbeddingAnswer(f"item {position} has no embedding list")
        index = item.get("index", position)
        if type(index) is not int or not 0 <= index < count or rows[index] is not None:
            raise BadEmbeddingAnswer(f"item {position} has a wrong index {index!r}")
        rows[index] = item["embedding"]
    dims = {len(row) for row in rows}
    if len(dims) != 1:
        raise BadEmbeddingAnswer(f"vectors of different dimensions {sorted(dims)[:4]}")
    dim = dims.pop()
    if not 1 <= dim <= MAX_DIMENSIONS:
        raise BadEmbeddingAnswer(f"a vector of {dim} dimensions (at most {MAX_DIMENSIONS})")
    if any(type(x) not in (int, float) for row in rows for x in row):  # bool, str, None, lists
        raise BadVector("a vector holds something that is not a number")
    with np.errstate(over="ignore"):
        try:
            matrix = np.asarray(rows, dtype=np.float64)
        except OverflowError:  # JSON's integers have no bound: 1 followed by 400 zeros
            raise BadVector("a vector holds a number too large for a float") from None
        norms = np.linalg.norm(matrix, axis=1)
    if not np.isfinite(matrix).all() or not np.isfinite(norms).all() or (norms == 0).any():
        raise BadVector("a vector is zero or not finite")
    return (matrix / norms[:, None]).astype(np.float32)


def _decode(raw: bytes, count: int) -> np.ndarray:
    try:
        payload = json.loads(raw)
    except (ValueError, RecursionError):
        raise BadEmbeddingAnswer("the answer is not JSON") from None
    return parse_embeddings(payload, count)


def _wait(state: RetryCallState) -> float:
    exc = state.outcome.exception() if state.outcome else None
    asked = getattr(exc, "retry_after", None)
    if asked is not None:
        return float(min(asked, RETRY_AFTER_CAP_SECONDS))
    backoff = wait_exponential(multiplier=FIRST_RETRY_SECONDS, max=MAX_RETRY_SECONDS)
    return float((backoff + wait_random(0, FIRST_RETRY_SECONDS))(state))


def _retry_after(headers: Any) -> float | None:
    value = headers.get("retry-after")
    try:
        seconds = float(value) if value else None
    except ValueError:
        return None
    return seconds if seconds is not None and math.isfinite(seconds) and seconds >= 0 else None


class EmbeddingClient:
    """Asks one endpoint for vectors. ``embed`` is safe to call from several tasks at once
    (one aiohttp session, made on first use in the running loop); ``close`` at the end."""

    def __init__(self, endpoint: EmbeddingEndpoint, timeout_seconds: float = 30.0) -> None:
        self.endpoint = endpoint
        self.timeout_seconds = timeout_seconds
        self._session: aiohttp.ClientSession | None = None
        self._proxy = ""

    async def embed(
        self, texts: Sequence[str], attempts: int = ATTEMPTS, seconds: float | None = None
    ) -> np.ndarray:
        """Unit vectors of ``texts`` (each cut to ``MAX_INPUT_CHARS``), one row each, in
        order. Retries transient failures ``attempts`` times in all, each try within
        ``seconds`` (default ``timeout_seconds``). Raises EmbeddingUnavailable,
        EmbeddingRejected or BadEmbeddingAnswer."""
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        body = {
            "model": self.endpoint.model,
            "input": [text[:MAX_INPUT_CHARS] or " " for text in texts],
            "encoding_format": "float",
        }
        retrying = AsyncRetrying(
            stop=stop_after_attempt(max(1, attempts)),
            wait=_wait,
            retry=retry_if_exception_type(_Transient),
            before_sleep=self._log_retry,
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    raw = await self._post(body, seconds or self.timeout_seconds)
        except _Transient as exc:
            raise EmbeddingUnavailable(
                f"the embeddings endpoint {self.endpoint.url} failed ({exc}) after "
                f"{max(1, attempts)} tries"
            ) from None
        try:
            # Megabytes of JSON numbers: decoded and checked off the event loop.
            return await asyncio.to_thread(_decode, raw, len(texts))
        except BadEmbeddingAnswer as exc:
            url = self.endpoint.url
            raise type(exc)(f"the embeddings endpoint {url}: {exc}") from None

    async def _post(self, body: dict[str, Any], seconds: float) -> bytes:
        session = self._client()
        url = f"{self.endpoint.url}/embeddings"
        try:
            async with session.post(
                url,
                json=body,
                headers=self.endpoint.headers,
                params=self.endpoint.query or None,
                proxy=self._proxy or None,
                timeout=aiohttp.ClientTimeout(total=seconds),
                allow_redirects=False,  # a redirect would carry the key to another host
            ) as resp:
                if resp.status == 429 or resp.status >= 500:
                    raise _Transient(f"HTTP {resp.status}", _retry_after(resp.headers))
                if resp.status != 200:
                    said = (await resp.content.read(2000)).decode("utf-8", "replace")
                    said = self._scrub(" ".join(said.split()))[:300]
                    raise EmbeddingRejected(
                        resp.status,
                        f"the embeddings endpoint {self.endpoint.url} refused the request "
                        f"(HTTP {resp.status}: {said}); check memory.embeddings",
                    )
                return await _bounded_body(resp, self.endpoint.url)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _Transient(type(exc).__name__) from None

    def _scrub(self, text: str) -> str:
        """A server's words without the credentials it was sent (a proxy may echo them): the
        headers' values and the query's (a key given as ``?key=`` in the base URL)."""
        secrets = [*self.endpoint.headers.values(), *self.endpoint.query.values()]
        for value in secrets:
            for secret in (value, value.partition(" ")[2], quote(value, safe="")):
                if len(secret) >= 8:
                    text = text.replace(secret, "[redacted]")
        return text

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = None
            try:
                proxy = environment_proxy(self.endpoint.url)
            except ValueError as exc:
                log.warning("memory embeddings: ignoring the proxy setting: %s", exc)
                proxy = ""
            if proxy.startswith(("socks4", "socks5")):
                from aiohttp_socks import ProxyConnector

                connector = ProxyConnector.from_url(proxy)
            else:
                self._proxy = proxy
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session

    def _log_retry(self, state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        log.info(
            "memory embeddings: %s failed (%s), retry %d in %.1fs",
            self.endpoint.url,
            exc,
            state.attempt_number,
            state.upcoming_sleep,
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


async def _bounded_body(resp: aiohttp.ClientResponse, url: str) -> bytes:
    """The body, refused past ``MAX_RESPONSE_BYTES`` before more than that is read."""
    if (resp.content_length or 0) > MAX_RESPONSE_BYTES:
        raise BadEmbeddingAnswer(f"the embeddings endpoint {url} answered {resp.content_length} B")
    chunks: list[bytes] = []
    size = 0
    async for chunk in resp.content.iter_chunked(1 << 16):
        size += len(chunk)
        if size > MAX_RESPONSE_BYTES:
            raise BadEmbeddingAnswer(
                f"the embeddings endpoint {url} answered more than {MAX_RESPONSE_BYTES} B"
            )
        chunks.append(chunk)
    return b"".join(chunks)
