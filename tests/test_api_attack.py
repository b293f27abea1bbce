"""Attacks on the OpenAI-compatible API (docs/api.md), with requests sent byte for byte (no
client tidies them): odd keys, paths and methods a program may send, a body that never
ends, and session ids that must not name a session."""

from __future__ import annotations

import asyncio
import json
import logging
from urllib.parse import urlsplit

import pytest

from bot.config import ApiKeyConfig
from tests.test_api import KEY, running


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
        assert llm.requests == []
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_key_name_is_one_line():
    with pytest.raises(ValueError):
        ApiKeyConfig.model_validate({"name": "editor\n", "key": KEY})
    assert ApiKeyConfig.model_validate({"name": "editor", "key": KEY}).name == "editor"
