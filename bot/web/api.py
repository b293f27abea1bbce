"""The OpenAI-compatible API (docs/api.md): ``POST /v1/chat/completions``, ``GET /v1/models``,
``GET /v1/sessions/<id>/last`` and ``GET /health``, on the panel's web server (or a listener of
its own there when the panel is off: :class:`ApiServer`).

A request is a program's, not a browser's: it carries a bearer key (``api.keys``), never a
cookie, so the panel's session, Origin and CSRF checks do not apply to these paths; the Host
check does (DNS rebinding), and the body has a limit of its own (``api.maxRequestBytes``).
Each request carries one new user message, the last of ``messages``; the conversation is
memobot's own session ``api:<key name>:<session id>``, so a client that resends the whole
history adds one message per request. The turn runs through the bus like a platform's
(``channels.api_channel``); an ``Idempotency-Key`` makes a retry the same message, answered
once. Every error is OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import ipaddress
import json
import logging
import math
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, NoReturn

from aiohttp import web

from bot.config import ApiKeyConfig, Config
from bot.web import limits
from bot.web.addresses import Served, parse_listen, served
from channels.api_channel.channel import Answer, ApiChannel, Caller, Waiter, message_id
from channels.api_channel.spec import NAME, speaks_as_admin

if TYPE_CHECKING:
    from bot.gateway import Gateway

log = logging.getLogger(__name__)

HEALTH = "/health"
MODEL = "memobot"  # the model id that means "memobot, as configured"
# Matched whole (fullmatch: "$" would take a last "\n"): no ":", "/" or "..": one chat of one key.
SESSION_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
DEFAULT_SESSION = "default"
# The request's model is named in every chunk of its stream: 4 MB of it took 40 ms of the
# event loop per chunk.
MAX_MODEL_CHARS = 256
MAX_IDEMPOTENCY_KEY = 255
OUTAGE_RETRY_SECONDS = 30
KEEPALIVE_SECONDS = 15.0  # a stream's longest silence (an SSE comment then)
MAX_UNDERWAY = 16  # completion requests of one key at once (more: 429)
BODY_SECONDS = 60.0  # to send a request's body (4 MB at 70 kB/s); a slower sender gets 408
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def is_api_path(path: str) -> bool:
    return path == HEALTH or path == "/v1" or path.startswith("/v1/")


def api_error(
    status: int,
    message: str,
    kind: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    """OpenAI's error shape, which its SDKs turn into their typed errors."""
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return web.json_response(body, status=status, headers=headers)


async def in_openai_shape(request: web.Request, handler: Handler) -> web.StreamResponse:
    """``handler``'s answer to an API path, the router's own refusals (404 for a path the API
    does not have, 405 for a method) in OpenAI's shape too, which the SDKs read."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        kept = {k: v for k, v in exc.headers.items() if k in ("Allow", "Retry-After")}
        code = "not_found" if exc.status == 404 else None
        text = f"{exc.reason}: {request.method} {request.path}"
        return api_error(exc.status, text, param=None, code=code, headers=kept)


class Refused(Exception):
    """A request answered with an error (``response``) instead of a completion."""

    def __init__(self, response: web.Response) -> None:
        super().__init__(response.status)
        self.response = response


def bad_request(param: str | None, message: str, code: str | None = None) -> Refused:
    return Refused(api_error(400, message, param=param, code=code))


@dataclass(frozen=True, slots=True)
class Completion:
    """What a chat completion request asks for, checked."""

    model: str
    text: str  # the new user message
    session_id: str
    stream: bool
    include_usage: bool
    idempotency_key: str | None

    def fingerprint(self) -> str:
        """What a retry with the same Idempotency-Key must ask again (not how: a retry may
        stream where the first did not)."""
        return hashlib.sha256(json.dumps([self.session_id, self.text]).encode()).hexdigest()


def _message_text(content: Any, at: str) -> str:
    """A message's text: a string, or a list of text parts (as the SDKs send them)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"{at}.content", "content must be a string or a list of text parts")
    parts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") != "text":
            raise bad_request(
                f"{at}.content[{j}]", "only text parts are taken (no images or files here)"
            )
        if not isinstance(part.get("text"), str):
            raise bad_request(f"{at}.content[{j}].text", "a text part needs its text")
        parts.append(part["text"])
    return "\n".join(parts)


def parse_completion(body: Any, headers: dict[str, str] | Any, max_chars: int) -> Completion:
    """The request, or ``Refused`` with 400 naming the field that is wrong."""
    if not isinstance(body, dict):
        raise bad_request(None, "the body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("model", f'model is required (any configured model, or "{MODEL}")')
    if len(model) > MAX_MODEL_CHARS:
        raise bad_request("model", f"model: at most {MAX_MODEL_CHARS} characters")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages", "messages must be a non-empty list")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise bad_request(f"messages[{i}].role", "each message needs a role")
    at = f"messages[{len(messages) - 1}]"
    last = messages[-1]
    if last["role"] != "user":
        raise bad_request(
            f"{at}.role",
            "the last message must be the new user message (the conversation itself is "
            "memobot's session; earlier messages are accepted and not used)",
        )
    text = _message_text(last.get("content"), at)
    if not text.strip():
        raise bad_request(f"{at}.content", "the new user message is empty")
    if len(text) > max_chars:
        raise bad_request(
            f"{at}.content",
            f"the new user message has {len(text)} characters; at most {max_chars} are taken "
            "(api.maxMessageChars)",
            "message_too_long",
        )
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise bad_request("stream", "stream must be true or false")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool):
        raise bad_request("stream_options.include_usage", "include_usage must be true or false")
    session_id = body.get("session_id", headers.get("X-Session-Id", DEFAULT_SESSION))
    if not isinstance(session_id, str) or not SESSION_ID.fullmatch(session_id):
        raise bad_request(
            "session_id", "session_id: 1 to 64 letters, digits, _ and - (no : / or .)"
        )
    idem = headers.get("Idempotency-Key")
    if idem is not None and not (
        0 < len(idem) <= MAX_IDEMPOTENCY_KEY and all(" " <= c <= "~" for c in idem)
    ):
        raise bad_request(
            "Idempotency-Key", f"Idempotency-Key: 1 to {MAX_IDEMPOTENCY_KEY} ASCII characters"
        )
    return Completion(model, text, session_id, stream, bool(options.get("include_usage")), idem)


def find_key(keys: list[ApiKeyConfig], given: str) -> ApiKeyConfig | None:
    """The live key ``given`` is, compared with every key in constant time (no early exit:
    how long it takes does not tell which key a guess came close to)."""
    # The header's bytes as sent: one that is not UTF-8 (aiohttp keeps its bytes as
    # surrogates) is a wrong key, not a failure to encode it.
    sent = given.encode("utf-8", "surrogateescape")
    found = None
    for key in keys:
        if hmac.compare_digest(sent, key.key.encode()):
            found = key
    return found if found is not None and not found.revoked else None


def _local(remote: str) -> bool:
    """A client on this machine (an IPv4 one through a dual-stack socket included)."""
    try:
        address = ipaddress.ip_address(remote)
    except ValueError:
        return remote == "?"  # a Unix socket: this machine
    mapped = getattr(address, "ipv4_mapped", None)
    return bool((mapped or address).is_loopback)


def caller_of(cfg: Config, key: ApiKeyConfig) -> Caller:
    """Whom ``key`` speaks for: the owner, or a person of a channel's allowFrom (an admin
    there is one here too)."""
    return Caller(key.name, key.as_, speaks_as_admin(cfg, key))


class ApiFace:
    """The API of one running gateway: its live config (a SIGHUP revokes a key), its agent
    stack and its API channel."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.closing = False
        self._closed = asyncio.Event()  # set with closing: a body being read stops
        self.keepalive_seconds = KEEPALIVE_SECONDS
        self.body_seconds = BODY_SECONDS
        self.reading = 0  # requests whose body is being read
        self.underway: dict[str, int] = {}  # completion requests being answered, per key
        self.max_underway = MAX_UNDERWAY
        # Wrong keys per client address (not this machine's): a guesser gets a few a minute.
        self.wrong_keys = limits.AttemptLimiter(limits.WRONG_KEYS, limits.WRONG_KEYS_WINDOW_SECONDS)

    @property
    def cfg(self) -> Config:
        return self.gateway.cfg

    @property
    def channel(self) -> ApiChannel:
        found = next((c for c in self.gateway.channels if isinstance(c, ApiChannel)), None)
        if found is None:  # api.enabled makes the gateway build it
            raise Refused(api_error(503, "the API channel is not running", "server_error"))
        return found

    def close(self) -> None:
        """The server stops: requests that wait for an answer end now (retry later)."""
        self.closing = True
        self._closed.set()
        for channel in self.gateway.channels:
            if isinstance(channel, ApiChannel):
                channel.wake_all()

    # -- checks --

    def authorize(self, request: web.Request) -> Caller:
        """The caller whose key the request carries; else 401, and 429 for an address that
        sent too many wrong keys (then not even the right one is checked: its answer would
        tell a guesser which guess was right)."""
        remote = request.remote or "?"
        # Not for the machine's own address: a reverse proxy (web.publicUrl) makes every
        # client 127.0.0.1, and a stranger's 20 wrong keys would lock out every program
        # behind it (and any local process, the model's commands, every local program).
        limited = not _local(remote)
        wait = self.wrong_keys.waiting(remote) if limited else None
        if wait is not None:
            raise Refused(
                api_error(
                    429,
                    f"Too many wrong API keys from this address; try again in {wait} seconds.",
                    "rate_limit_error",
                    code="too_many_wrong_keys",
                    headers={"Retry-After": str(wait)},
                )
            )
        header = request.headers.get("Authorization", "")
        scheme, _, given = header.partition(" ")
        key = find_key(self.cfg.api.keys, given.strip()) if scheme.lower() == "bearer" else None
        if key is None:
            blocked = None
            if limited:
                self.wrong_keys.attempt(remote)
                blocked = self.wrong_keys.waiting(remote)
            log.warning(
                "api: refused a %s %s from %s: %s%s",
                request.method,
                request.path,
                remote,
                "a wrong or revoked key" if given else "no key",
                f"; too many: refused for {blocked} s" if blocked is not None else "",
            )
            raise Refused(
                api_error(
                    401,
                    "Incorrect or missing API key: send Authorization: Bearer <key> with a key "
                    "of api.keys.",
                    code="invalid_api_key",
                )
            )
        return caller_of(self.cfg, key)

    def check_capacity(self, session: str) -> None:
        """A new turn now would fail: the model is down (503), or the budget is spent (429)."""
        stack = self.gateway.stack
        outage = stack.loop.outage
        if outage is not None and outage.active and outage.rate_limited:
            # The model's own rate limit, not an outage: what a client backs off from.
            wait = outage.retry_after or OUTAGE_RETRY_SECONDS
            raise Refused(
                api_error(
                    429,
                    "The model's rate limit was reached; try again later.",
                    "rate_limit_error",
                    code="rate_limit_exceeded",
                    headers={"Retry-After": str(max(1, math.ceil(wait)))},
                )
            )
        if outage is not None and outage.active:
            raise Refused(
                api_error(
                    503,
                    "The model is unavailable right now; try again later.",
                    "server_error",
                    code="model_unavailable",
                    headers={"Retry-After": str(OUTAGE_RETRY_SECONDS)},
                )
            )
        spent = stack.budget.spent(session, "turn")
        if spent is not None:
            wait = max(1, int(spent.resets.timestamp() - time.time()))
            raise Refused(
                api_error(
                    429,
                    spent.text(self.cfg.agent.timezone or "UTC"),
                    "rate_limit_error",
                    code="budget_exceeded",
                    headers={"Retry-After": str(wait)},
                )
            )

    async def read_json(self, request: web.Request) -> Any:
        """The body as JSON, at most ``api.maxRequestBytes`` of it (413 past that), sent
        within ``body_seconds`` (408 past that: a slow sender holds no handler for long),
        and read no longer once the server stops (its stop waits for no body)."""
        if request.content_type != "application/json":
            raise bad_request(None, "send the body as JSON (Content-Type: application/json)")
        limit = self.cfg.api.max_request_bytes
        data: bytearray | None = None
        if request.content_length is None or request.content_length <= limit:
            reading = asyncio.ensure_future(_read_body(request, limit))
            stopping = asyncio.ensure_future(self._closed.wait())
            self.reading += 1
            try:
                await asyncio.wait(
                    (reading, stopping),
                    timeout=self.body_seconds,
                    return_when=asyncio.FIRST_COMPLETED,
                )
            finally:
                self.reading -= 1
                stopping.cancel()
                reading.cancel()
            if not reading.done() or reading.cancelled():
                if self.closing:
                    await _unread(request, _stopping())
                await _unread(
                    request,
                    api_error(
                        408,
                        f"The request body did not come within {self.body_seconds:g} seconds.",
                        code="request_timeout",
                    ),
                )
            data = reading.result()  # ConnectionError: the client left (see _answered)
        if data is None:
            await _unread(
                request,
                api_error(
                    413,
                    f"The request body is larger than {limit} bytes (api.maxRequestBytes).",
                    code="request_too_large",
                ),
            )
        try:
            return json.loads(data)
        except ValueError as exc:
            raise bad_request(None, f"the body is not JSON: {exc}") from None
        except RecursionError:  # "[[[[..." a million deep
            raise bad_request(None, "the body is nested too deeply") from None

    # -- routes --

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get(HEALTH, _answered(self.health)),
            web.get("/v1/models", _answered(self.models)),
            web.post("/v1/chat/completions", _answered(self.completions)),
            web.get("/v1/sessions/{id}/last", _answered(self.last)),
        ]

    async def health(self, request: web.Request) -> web.Response:
        outage = self.gateway.stack.loop.outage
        down = outage is not None and outage.active
        return web.json_response({"status": "ok", "model": "unavailable" if down else "ok"})

    async def models(self, request: web.Request) -> web.Response:
        self.authorize(request)
        llm = self.cfg.llm
        names = dict.fromkeys([MODEL, llm.model, *llm.models])
        data = [{"id": n, "object": "model", "created": 0, "owned_by": "memobot"} for n in names]
        return web.json_response({"object": "list", "data": data})

    async def last(self, request: web.Request) -> web.Response:
        caller = self.authorize(request)
        session_id = request.match_info["id"]
        if not SESSION_ID.fullmatch(session_id):
            raise bad_request("session_id", "session_id: 1 to 64 letters, digits, _ and -")
        key = f"{NAME}:{caller.key}:{session_id}"
        store = self.gateway.stack.store
        # A session nobody made is not loaded: each would take a place in the store's cache
        # and a lock kept for good, for as many ids as a client cares to ask for.
        if await asyncio.to_thread(store.peek_metadata, key) is None:
            return api_error(404, f"session {session_id} has no answer yet", code="not_found")
        session = await asyncio.to_thread(store.get, key)
        answer = next(
            (
                m["content"]
                for m in reversed(session.messages)
                if m.get("role") == "assistant"
                and isinstance(m.get("content"), str)
                and m["content"]
            ),
            None,
        )
        if answer is None:
            return api_error(404, f"session {session_id} has no answer yet", code="not_found")
        underway = bool(session.state.pending or session.state.checkpoint)
        return web.json_response(
            {
                "object": "memobot.session.last",
                "session_id": session_id,
                "content": answer,
                "underway": underway,
            }
        )

    async def completions(self, request: web.Request) -> web.StreamResponse:
        caller = self.authorize(request)
        # Each request is a turn (queued behind its session's others) and a connection that
        # waits for it: a client in a loop, or a guest's key, must not queue without end.
        if self.underway.get(caller.key, 0) >= self.max_underway:
            raise Refused(
                api_error(
                    429,
                    f"This key has {self.max_underway} requests under way; wait for their "
                    "answers (or retry one with its Idempotency-Key).",
                    "rate_limit_error",
                    code="too_many_requests_underway",
                    headers={"Retry-After": "5"},
                )
            )
        self.underway[caller.key] = self.underway.get(caller.key, 0) + 1
        try:
            ask = parse_completion(
                await self.read_json(request), request.headers, self.cfg.api.max_message_chars
            )
            return await self._complete(request, caller, ask)
        finally:
            self.underway[caller.key] -= 1
            if not self.underway[caller.key]:
                del self.underway[caller.key]

    async def _complete(
        self, request: web.Request, caller: Caller, ask: Completion
    ) -> web.StreamResponse:
        channel = self.channel
        mid = message_id(caller.key, ask.idempotency_key)
        session = f"{NAME}:{caller.key}:{ask.session_id}"
        record = None
        if ask.idempotency_key is not None:
            await channel.records.load(caller.key)
            record = channel.records.get(caller.key, mid)
            _same_request(record, ask)
        # The waiter first: an answer that comes while the request is published is not missed.
        with channel.waiting(mid) as waiter:
            answer = channel.answered(caller.key, mid)
            if answer is None:
                if record is None:
                    self.check_capacity(session)
                    if ask.idempotency_key is not None:
                        entry = {"hash": ask.fingerprint(), "at": time.time(), "session": session}
                        _same_request(await channel.records.claim(caller.key, mid, entry), ask)
                intake = await channel.ask(caller, ask.session_id, ask.text, mid)
                if intake == "refused":
                    raise Refused(
                        api_error(
                            503,
                            "memobot is stopping; retry in a moment (with the same "
                            "Idempotency-Key)",
                            "server_error",
                            headers={"Retry-After": "5"},
                        )
                    )
                log.info(
                    "api: %s request session=%s id=%s",
                    "retried" if intake == "duplicate" else "new",
                    session,
                    mid,
                )
                if intake == "duplicate" and not await self._underway(session, mid, waiter):
                    raise Refused(
                        api_error(
                            409,
                            "this Idempotency-Key was answered, and the answer is no longer kept "
                            f"(GET /v1/sessions/{ask.session_id}/last has the session's last)",
                            code="idempotency_key_expired",
                        )
                    )
            if ask.stream:
                return await self._stream(request, ask, mid, waiter, answer)
            answer = answer or await self._answer(request, waiter)
            return _completion_response(ask, mid, answer)

    async def _underway(self, session: str, mid: str, waiter: Waiter) -> bool:
        """A duplicate's turn is still to answer (or its answer is on its way here)."""
        state = (await asyncio.to_thread(self.gateway.stack.store.get, session)).state
        # The waiter after the state, not before: an answer that goes out while the state is
        # read (told to the waiters, then let go by the ledger) is in one or the other.
        return bool(
            waiter.answer is not None
            or state.is_pending(mid)
            or state.checkpoint_of(mid)
            or any(e.get("reply_to") == mid for e in state.outbox)
        )

    async def _answer(self, request: web.Request, waiter: Waiter) -> Answer:
        while waiter.answer is None:
            if self.closing:
                raise Refused(_stopping())
            if request.transport is None:
                # The client left (a timeout, then a retry with its Idempotency-Key, say): the
                # turn goes on and keeps its answer; this request no longer counts as under
                # way for its key.
                raise ConnectionResetError("the client left")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.keepalive_seconds):
                    await waiter.next()
        return waiter.answer

    async def _stream(
        self,
        request: web.Request,
        ask: Completion,
        mid: str,
        waiter: Waiter,
        answer: Answer | None,
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store"}
        )
        await response.prepare(request)
        chunks = Chunks(ask.model, mid)
        try:
            await response.write(chunks.event({"role": "assistant", "content": ""}))
            written = Written()
            while answer is None:
                if self.closing:
                    await response.write(_sse(_stopping_body()))
                    return response
                try:
                    async with asyncio.timeout(self.keepalive_seconds):
                        events = await waiter.next()
                except TimeoutError:
                    # A long tool run: a comment keeps proxies from closing a silent stream
                    # (and finds a client that left).
                    await response.write(b": working\n\n")
                    continue
                for kind, text in events:
                    if delta := written.on_event(kind, text):
                        await response.write(chunks.event({"content": delta}))
                answer = waiter.answer
            if answer.outcome == "failed":
                body = {"error": {"message": answer.text, "type": "server_error"}}
                await response.write(_sse(body))
            else:
                if delta := written.on_answer(answer.text):
                    await response.write(chunks.event({"content": delta}))
                await response.write(chunks.event({}, "stop"))
                if ask.include_usage:
                    await response.write(chunks.usage(answer))
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        except (ConnectionResetError, ConnectionError):
            # The answer is not lost: it is in the session, and (with an Idempotency-Key)
            # in the channel's records for the retry.
            log.info("api: the client left during the stream id=%s; the turn goes on", mid)
        return response


async def _read_body(request: web.Request, limit: int) -> bytearray | None:
    """The body, or None when it is larger than ``limit`` bytes."""
    data = bytearray()
    async for chunk in request.content.iter_chunked(64 * 1024):
        data += chunk
        if len(data) > limit:
            return None
    return data


async def _unread(request: web.Request, response: web.Response) -> NoReturn:
    """Refuse ``request`` before its body is read: ``response`` sent, then the connection
    closed, so the rest of the body is never read (aiohttp would read it for up to 10 s, and
    hold the server's shutdown meanwhile)."""
    await response.prepare(request)
    await response.write_eof()
    request.protocol.force_close()
    raise Refused(response)


def _answered(handler: Handler) -> Handler:
    """``handler`` with its refusals answered, and a bug answered in OpenAI's shape too
    (logged once here, with the request)."""

    async def answer(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except Refused as refused:
            return refused.response
        except web.HTTPException:
            raise
        except ConnectionError:
            # The client left (mid-body, say): nobody reads an answer, and it is no failure.
            log.info("api: the client left during %s %s", request.method, request.path)
            return web.Response(status=400)
        except Exception:
            log.exception("api: %s %s failed", request.method, request.path)
            return api_error(500, "memobot failed to answer this request.", "server_error")

    return answer


def _same_request(record: dict[str, Any] | None, ask: Completion) -> None:
    """An Idempotency-Key used before is used for this very request (else 400)."""
    if record is not None and record.get("hash") != ask.fingerprint():
        raise bad_request(
            "Idempotency-Key",
            "this Idempotency-Key was used for a different request",
            "idempotency_key_reused",
        )


def _stopping_body() -> dict[str, Any]:
    return {
        "error": {
            "message": "memobot is restarting; retry with the same Idempotency-Key",
            "type": "server_error",
            "param": None,
            "code": "restarting",
        }
    }


def _stopping() -> web.Response:
    return web.json_response(_stopping_body(), status=503, headers={"Retry-After": "5"})


class Written:
    """What a stream has sent of an answer being written: the model's replies, each the
    whole text so far, become deltas; a reply after a tool call starts a new paragraph."""

    def __init__(self) -> None:
        self.current = ""  # the text sent of the current reply
        self.after_tool = False
        self.any = False

    def on_event(self, kind: str, text: str) -> str:
        if kind == "tool":
            self.after_tool = True
            return ""
        if self.after_tool and text:
            self.after_tool = False
            sep = "\n\n" if self.any else ""
            self.current = text
            self.any = True
            return sep + text
        if text.startswith(self.current) and len(text) > len(self.current):
            delta = text[len(self.current) :]
            self.current = text
            self.any = True
            return delta
        return ""  # a retried request's text that replaces the one before: shown at the end

    def on_answer(self, text: str) -> str:
        if text.startswith(self.current) and self.current:
            return text[len(self.current) :]
        if not self.any:
            return text
        return "" if text == self.current else "\n\n" + text


class Chunks:
    """The stream's ``chat.completion.chunk`` events."""

    def __init__(self, model: str, mid: str) -> None:
        self.model = model
        self.id = f"chatcmpl-{mid}"
        self.created = int(time.time())

    def _base(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
        }

    def event(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return _sse({**self._base(), "choices": [choice]})

    def usage(self, answer: Answer) -> bytes:
        return _sse({**self._base(), "choices": [], "usage": _usage(answer)})


def _sse(data: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


def _usage(answer: Answer) -> dict[str, int]:
    return {
        "prompt_tokens": answer.prompt_tokens,
        "completion_tokens": answer.completion_tokens,
        "total_tokens": answer.prompt_tokens + answer.completion_tokens,
    }


def _completion_response(ask: Completion, mid: str, answer: Answer) -> web.Response:
    if answer.outcome == "failed":
        return api_error(500, answer.text, "server_error", code="turn_failed")
    return web.json_response(
        {
            "id": f"chatcmpl-{mid}",
            "object": "chat.completion",
            "created": int(datetime.now(UTC).timestamp()),
            "model": ask.model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": answer.text},
                    "finish_reason": "stop",
                }
            ],
            "usage": _usage(answer),
        }
    )


async def security_headers(request: web.Request, response: web.StreamResponse) -> None:
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Cache-Control"] = "no-store"


class ApiServer:
    """The API alone on ``web.listen``, for a gateway whose panel is off: the same routes,
    the same Host check (DNS rebinding), nothing of the panel."""

    def __init__(self, cfg: Config, gateway: Gateway) -> None:
        self.cfg = cfg
        self.face = ApiFace(gateway)
        self.served: Served = served(cfg.web.listen, cfg.web.public_url)
        self.base_url = self.served.base_url
        self._runner: web.AppRunner | None = None

    @web.middleware
    async def _hosts(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if not self.served.host_ok(request.headers.get("Host")):
            log.info("api: refused a request for host %r", request.headers.get("Host"))
            return api_error(421, "This server does not answer to that host name.")
        return await in_openai_shape(request, handler)

    async def start(self) -> str | None:
        app = web.Application(middlewares=[self._hosts])
        app.on_response_prepare.append(security_headers)
        app.on_shutdown.append(self._closing)
        app.router.add_routes(self.face.routes())
        runner = web.AppRunner(
            app,
            access_log=None,
            handle_signals=False,
            keepalive_timeout=limits.IDLE_SECONDS,
        )
        await runner.setup()
        host, port = parse_listen(self.cfg.web.listen)
        try:
            await web.TCPSite(runner, host, port).start()
        except OSError as exc:
            await runner.cleanup()
            why = f"the API cannot listen on {self.cfg.web.listen}: {exc.strerror or exc}"
            log.error("%s; memobot runs on without it", why)
            return why
        self._runner = runner
        log.info("api on %s/v1", self.base_url)
        return None

    async def _closing(self, app: web.Application) -> None:
        self.face.close()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
