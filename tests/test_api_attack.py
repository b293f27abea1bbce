"""Attacks on the OpenAI-compatible API (docs/api.md), with requests sent byte for byte (no
client tidies them): odd keys, paths and methods a program may send, a body that never
ends, and session ids that must not name a session."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from types import SimpleNamespace
from unittest import mock
from urllib.parse import urlsplit

import aiohttp
import openai
import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from bot.config import ApiKeyConfig
from bot.web import limits
from bot.web.api import ApiFace, Refused, parse_completion
from bot.web.limits import AttemptLimiter
from channels.api_channel import channel as api_channel
from channels.api_channel.channel import Records
from tests.fakes.llm_server import reply
from tests.helpers.api import GUEST_KEY, KEY, client, running
from tests.helpers.discord import until


async def raw(base: str, request: bytes) -> tuple[int, dict[str, object] | None]:
    """``request`` sent as it is, and the answer's status and JSON body (None: not JSON)."""
    url = urlsplit(base)
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    try:
        writer.write(request)
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ")[1])
    try:
        return status, json.loads(body)
    except ValueError:
        return status, None


def get(base: str, path: bytes, authorization: bytes = b"Bearer " + KEY.encode()) -> bytes:
    host = urlsplit(base).netloc.encode()
    return (
        b"GET " + path + b" HTTP/1.1\r\nHost: " + host + b"\r\nAuthorization: "
        + authorization + b"\r\nConnection: close\r\n\r\n"
    )  # fmt: skip


def openai_error(body: object) -> dict[str, object]:
    assert isinstance(body, dict) and set(body) == {"error"}, body
    error = body["error"]
    assert isinstance(error, dict) and {"message", "type", "param", "code"} <= set(error)
    return error


async def test_odd_requests_get_openais_errors_and_no_traceback(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    async with running(tmp_path) as (llm, _gateway, browser):
        base = browser.base
        # A key that is not UTF-8 is a wrong key (not a bug of memobot's: 500, a traceback).
        status, body = await raw(base, get(base, b"/v1/models", b"Bearer \xff\xfe-not-utf8"))
        assert status == 401 and openai_error(body)["code"] == "invalid_api_key"
        # A path or a method the API does not have: OpenAI's shape, which the SDKs read.
        status, body = await raw(base, get(base, b"/v1/nothing"))
        assert status == 404 and openai_error(body)
        status, body = await raw(base, get(base, b"/v1/chat/completions"))
        assert status == 405 and openai_error(body)
        # "$" lets a newline end a session id: "default\n" is not "default" (nor allowed).
        status, body = await raw(base, get(base, b"/v1/sessions/default%0A/last"))
        assert status == 400 and openai_error(body)["param"] == "session_id"
        host = urlsplit(base).netloc.encode()
        payload = json.dumps(
            {"model": "memobot", "messages": [{"role": "user", "content": "hi"}],
             "session_id": "notes\n"}
        ).encode()  # fmt: skip
        status, body = await raw(
            base,
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: " + host + b"\r\nAuthorization: "
            b"Bearer " + KEY.encode() + b"\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(payload)).encode() + b"\r\nConnection: close\r\n\r\n"
            + payload,
        )  # fmt: skip
        assert status == 400 and openai_error(body)["param"] == "session_id"
        # A host name it does not answer to (DNS rebinding): refused, in OpenAI's shape too.
        wrong_host = get(base, b"/v1/models").replace(host, b"rebound.example:80")
        status, body = await raw(base, wrong_host)
        assert status == 421 and openai_error(body)
        assert llm.requests == []
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_key_name_is_one_line():
    with pytest.raises(ValueError):
        ApiKeyConfig.model_validate({"name": "editor\n", "key": KEY})
    assert ApiKeyConfig.model_validate({"name": "editor", "key": KEY}).name == "editor"


def stalled_post(base: str) -> bytes:
    """A completion request whose body says 1000 bytes and sends 4 (a slowloris)."""
    host = urlsplit(base).netloc.encode()
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: " + host + b"\r\nAuthorization: Bearer "
        + KEY.encode() + b"\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
        b'{"mo'
    )  # fmt: skip


async def test_a_body_that_never_ends_is_refused_in_time_and_holds_no_stop(tmp_path, caplog):
    """A key's holder that sends a body slowly (or stops) holds a request for
    ``body_seconds`` at most (408), and the gateway's stop not at all (aiohttp would wait
    60 s for the handler); one that leaves mid-body is no failure of memobot's."""
    caplog.set_level(logging.INFO)
    url = None
    async with running(tmp_path) as (llm, _gateway, browser):
        api = browser.panel.api
        assert api is not None
        api.body_seconds = 0.3
        status, body = await raw(browser.base, stalled_post(browser.base))
        assert status == 408 and openai_error(body)["code"] == "request_timeout"
        # A client that leaves mid-body.
        url = urlsplit(browser.base)
        reader, writer = await asyncio.open_connection(url.hostname, url.port)
        writer.write(stalled_post(browser.base))
        await writer.drain()
        writer.close()
        # One that stalls while memobot stops: the stop does not wait for it.
        api.body_seconds = 600
        reader, writer = await asyncio.open_connection(url.hostname, url.port)
        writer.write(stalled_post(browser.base))
        await writer.drain()
        await until(lambda: api.reading > 0)
        stopping = asyncio.get_running_loop().time()
    stopped = asyncio.get_running_loop().time() - stopping
    answer = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    assert stopped < 5, stopped
    assert b" 503 " in answer.split(b"\r\n")[0]
    assert llm.requests == []
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_asking_for_sessions_that_never_were_loads_none(tmp_path):
    """``GET /v1/sessions/<id>/last`` of ids nobody used: 404, and no empty session loaded
    (each was kept in the store's cache, and a lock of its own kept forever, per id asked)."""
    async with running(tmp_path) as (_llm, gateway, browser):
        store = gateway.stack.store
        before = store.loaded()
        for i in range(5):
            status, body = await raw(
                browser.base, get(browser.base, f"/v1/sessions/no{i}/last".encode())
            )
            assert status == 404 and openai_error(body)["code"] == "not_found"
        assert store.loaded() == before
        assert not any(k.startswith("api:editor:no") for k in store._locks)


async def test_the_idempotency_records_are_written_off_the_event_loop(tmp_path, monkeypatch):
    """A key's records are rewritten whole at each request: up to 20 MB of JSON to make,
    which must not stop every other chat meanwhile."""
    made_in: list[threading.Thread] = []

    def dumps(value: object, **kw: object) -> str:
        made_in.append(threading.current_thread())
        return json.dumps(value, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(api_channel, "json", SimpleNamespace(dumps=dumps, loads=json.loads))
    records = Records(tmp_path)
    await records.claim("editor", "api-i-1", {"hash": "h", "at": time.time()})
    await records.put("editor", "api-i-1", {"hash": "h", "at": time.time(), "answer": None})
    assert made_in and threading.main_thread() not in made_in
    assert "api-i-1" in json.loads((tmp_path / "editor.json").read_text())


async def test_a_connection_that_never_sends_a_whole_request_is_closed(tmp_path, monkeypatch):
    """A slowloris (a request's head sent a few bytes at a time, or never finished) holds a
    connection for ``IDLE_SECONDS`` at most, not aiohttp's hour."""
    monkeypatch.setattr(limits, "IDLE_SECONDS", 0.3)
    async with running(tmp_path) as (_llm, _gateway, browser):
        url = urlsplit(browser.base)
        reader, writer = await asyncio.open_connection(url.hostname, url.port)
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHo")
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the server
        writer.close()


def test_a_model_name_is_short():
    """The model a request names is in every chunk of its stream: a 4 MB one took 40 ms of
    the event loop per chunk, every chat's."""
    body = {"model": "m" * 257, "messages": [{"role": "user", "content": "hi"}]}
    with pytest.raises(Refused) as refused:
        parse_completion(body, {}, 1000)
    assert refused.value.response.status == 400
    assert json.loads(refused.value.response.text)["error"]["param"] == "model"
    assert parse_completion({**body, "model": "m" * 256}, {}, 1000).model == "m" * 256


def from_address(remote: str, key: str) -> web.Request:
    """A request for the models from ``remote`` with ``key``, as the server would hand it."""
    transport = mock.Mock()
    transport.get_extra_info.side_effect = lambda name, default=None: (
        (remote, 40000) if name == "peername" else default
    )
    headers = {"Authorization": f"Bearer {key}", "Host": "127.0.0.1"}
    return make_mocked_request("GET", "/v1/models", headers=headers, transport=transport)


def status_of(api: ApiFace, request: web.Request) -> int:
    try:
        api.authorize(request)
    except Refused as refused:
        return refused.response.status
    return 200


async def test_an_address_that_sends_wrong_keys_is_slowed_down(tmp_path, caplog):
    """Past ``attempts`` wrong keys in the window, every request from that address gets 429
    (the right key too: a guess that got through would say it was right) until the window
    has passed; each wrong key before that is one log line, the refused ones none. Not for
    this machine's address: behind a reverse proxy every client has it, and a stranger's
    wrong keys would lock them all out."""
    now = [1000.0]
    wrong = "k-wrong-0123456789abcdef"
    async with running(tmp_path) as (llm, _gateway, browser):
        api = browser.panel.api
        assert api is not None
        api.wrong_keys = AttemptLimiter(3, 60, clock=lambda: now[0])
        stranger = "203.0.113.7"
        for _ in range(3):
            assert status_of(api, from_address(stranger, wrong)) == 401
        caplog.clear()
        assert status_of(api, from_address(stranger, wrong)) == 429
        with pytest.raises(Refused) as refused:
            api.authorize(from_address(stranger, KEY))
        assert refused.value.response.status == 429
        assert refused.value.response.headers["Retry-After"] == "60"
        assert (
            openai_error(json.loads(refused.value.response.text))["code"] == "too_many_wrong_keys"
        )
        assert not [r for r in caplog.records if r.name == "bot.web.api"]
        assert status_of(api, from_address("198.51.100.9", KEY)) == 200  # another address
        for local in ("127.0.0.1", "::1", "::ffff:127.0.0.1"):
            for _ in range(5):
                assert status_of(api, from_address(local, wrong)) == 401
            assert status_of(api, from_address(local, KEY)) == 200
        now[0] += 61
        assert status_of(api, from_address(stranger, KEY)) == 200
        assert llm.requests == []


async def test_a_key_has_a_bounded_number_of_requests_under_way(tmp_path):
    """Each request is a turn and a connection waiting for it: past ``max_underway`` of one
    key, 429; another key is not held up by it, and a request answered frees its place."""
    async with running(tmp_path, reply("slow answer", hold="h")) as (llm, _gateway, browser):
        api = browser.panel.api
        assert api is not None
        api.max_underway = 1
        editor = client(browser)
        first = asyncio.create_task(
            editor.chat.completions.create(
                model="memobot", messages=[{"role": "user", "content": "one"}], stream=True
            )
        )
        await until(lambda: len(llm.requests) == 1)
        with pytest.raises(openai.RateLimitError) as refused:
            await editor.chat.completions.create(
                model="memobot", messages=[{"role": "user", "content": "two"}]
            )
        assert refused.value.body["code"] == "too_many_requests_underway"  # type: ignore[index]
        guest = await client(browser, GUEST_KEY).chat.completions.create(
            model="memobot", messages=[{"role": "user", "content": "mine"}]
        )
        assert guest.choices[0].message.content == "echo: mine"
        llm.release("h")
        text = "".join([c.choices[0].delta.content or "" async for c in await first if c.choices])
        assert text == "slow answer"
        await until(lambda: not api.underway)
        again = await editor.chat.completions.create(
            model="memobot", messages=[{"role": "user", "content": "three"}]
        )
        assert again.choices[0].message.content == "echo: three"


async def test_a_client_that_leaves_a_plain_request_no_longer_holds_its_place(tmp_path, caplog):
    """A request answered in one piece whose client left (its timeout, then a retry): the
    turn goes on, but the request stops waiting within ``keepalive_seconds`` (it held one of
    the key's places until the answer came, however long), and that is no failure."""
    caplog.set_level(logging.INFO)
    async with running(tmp_path, reply("late", hold="h")) as (llm, _gateway, browser):
        api = browser.panel.api
        assert api is not None
        api.keepalive_seconds = 0.05
        body = {"model": "memobot", "messages": [{"role": "user", "content": "slow one"}]}
        headers = {"Authorization": f"Bearer {KEY}", "Idempotency-Key": "plain-1"}
        async with aiohttp.ClientSession() as http:
            with pytest.raises(TimeoutError):
                await http.post(
                    f"{browser.base}/v1/chat/completions",
                    json=body,
                    headers=headers,
                    timeout=aiohttp.ClientTimeout(total=0.5),
                )
        await until(lambda: not api.underway)
        llm.release("h")
        again = await client(browser).chat.completions.create(
            **body, extra_headers={"Idempotency-Key": "plain-1"}
        )
        assert again.choices[0].message.content == "late"
        assert len(llm.requests) == 1
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_a_retry_that_looks_as_its_answer_goes_out_gets_it(tmp_path, monkeypatch):
    """A retry whose turn's answer goes out (told to the waiters, then let go by the ledger)
    while it reads the session's state gets that answer: what its waiter was told is looked
    at after the state, not before (else it saw neither and said 409 "no longer kept")."""
    async with running(tmp_path, reply("late", hold="h")) as (llm, gateway, browser):
        api = browser.panel.api
        assert api is not None
        channel, store = api.channel, gateway.stack.store
        ledger = gateway.manager.delivery.ledger
        loop, on_loop = asyncio.get_running_loop(), threading.get_ident()
        armed, delivered = threading.Event(), threading.Event()
        ask, get, sent = channel.ask, store.get, ledger.sent

        async def asking(*args, **kwargs):
            intake = await ask(*args, **kwargs)
            if intake == "duplicate":
                armed.set()  # the retry's next look at its session (off the loop) is the one
            return intake

        def getting(key):
            if key.startswith("api:") and threading.get_ident() != on_loop and armed.is_set():
                armed.clear()
                # The answer goes out and leaves the ledger just as the retry reads the state.
                loop.call_soon_threadsafe(llm.release, "h")
                assert delivered.wait(10)
            return get(key)

        async def sending(msg):
            await sent(msg)
            delivered.set()

        monkeypatch.setattr(channel, "ask", asking)
        monkeypatch.setattr(store, "get", getting)
        monkeypatch.setattr(ledger, "sent", sending)
        body = {"model": "memobot", "messages": [{"role": "user", "content": "slow one"}]}
        headers = {"Idempotency-Key": "race-1"}
        first = asyncio.create_task(
            client(browser).chat.completions.create(**body, extra_headers=headers)
        )
        await until(lambda: len(llm.requests) == 1)
        again = await client(browser).chat.completions.create(**body, extra_headers=headers)
        assert again.choices[0].message.content == "late"
        assert (await first).choices[0].message.content == "late"
        assert len(llm.requests) == 1
