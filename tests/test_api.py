"""The OpenAI-compatible API (docs/api.md) through the real gateway pieces in this process (the
agent loop, the channel manager, the API channel and the panel's web server) with the real
``openai`` client against the fake model: completions streamed and not, the models, a
conversation whose client resends the whole history, keys (wrong, revoked, another key's
sessions, a person's rights), bodies refused with the field named, a client that leaves
mid-stream and retries with its Idempotency-Key, and what a browser page cannot do."""

from __future__ import annotations

import asyncio
import json
import logging

import aiohttp
import openai
import pytest

from bot.config import load_config
from bot.gateway import Gateway
from bot.service.logs import redact
from bot.web.api import Written
from channels import registry
from channels.api_channel.channel import Records
from tests.fakes.llm_server import FakeLLM, error, reply, tool_step
from tests.helpers import stop_agent, write_config
from tests.helpers.api import (
    CLIENTS,
    GUEST_KEY,
    KEY,
    OLD_KEY,
    RUN_KEY,
    api_section,
    assistant_texts,
    client,
    running,
    user_texts,
)
from tests.helpers.discord import until
from tests.helpers.web import panel_section


async def test_completions_streamed_and_not_and_the_models(tmp_path):
    steps = [reply("Hello from memobot."), reply("Streamed answer.", hold="s")]
    async with running(tmp_path, *steps) as (
        llm,
        gateway,
        browser,
    ):
        api = client(browser)
        done = await api.chat.completions.create(
            model="memobot", messages=[{"role": "user", "content": "hi"}]
        )
        assert done.choices[0].message.content == "Hello from memobot."
        assert done.usage is not None and done.usage.completion_tokens > 0
        assert done.usage.total_tokens == done.usage.prompt_tokens + done.usage.completion_tokens
        stream = await api.chat.completions.create(
            model="memobot",
            messages=[{"role": "user", "content": "again"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        pieces, usage = [], None
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                pieces.append(chunk.choices[0].delta.content)
                # The first piece came while the model still writes (held): it streams.
                llm.release("s")
            usage = chunk.usage or usage
        assert "".join(pieces) == "Streamed answer."
        assert len(pieces) > 1
        assert usage is not None and usage.completion_tokens > 0
        models = [m.id async for m in api.models.list()]
        assert models[0] == "memobot" and gateway.cfg.llm.model in models
        assert user_texts(gateway, "api:editor:default") == ["hi", "again"]
        assert len(llm.requests) == 2


async def test_a_client_that_resends_the_whole_history_adds_one_message_each_time(tmp_path):
    async with running(tmp_path) as (llm, gateway, browser):  # the fake echoes
        api = client(browser)
        history: list[dict[str, str]] = []
        for text in ("one", "two", "three"):
            history.append({"role": "user", "content": text})
            done = await api.chat.completions.create(
                model="memobot", messages=history, extra_body={"session_id": "chat-1"}
            )
            history.append({"role": "assistant", "content": done.choices[0].message.content})
        assert user_texts(gateway, "api:editor:chat-1") == ["one", "two", "three"]
        assert len(assistant_texts(gateway, "api:editor:chat-1")) == 3
        # The session's history went to the model, not the client's copy of it.
        last = llm.requests[-1]["body"]["messages"]
        assert [m["role"] for m in last if m["role"] != "system"] == [
            "user", "assistant", "user", "assistant", "user",
        ]  # fmt: skip


async def test_keys_wrong_missing_revoked_are_refused_with_openais_401(tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    async with running(tmp_path) as (llm, gateway, browser):
        for key in ("k-wrong-0123456789abcdef", OLD_KEY):
            with pytest.raises(openai.AuthenticationError):
                await client(browser, key).chat.completions.create(
                    model="memobot", messages=[{"role": "user", "content": "hi"}]
                )
            with pytest.raises(openai.AuthenticationError):
                await client(browser, key).models.list()
        async with aiohttp.ClientSession() as http:
            async with http.post(
                f"{browser.base}/v1/chat/completions",
                json={"model": "memobot", "messages": [{"role": "user", "content": "hi"}]},
            ) as r:
                assert r.status == 401
                assert (await r.json())["error"]["code"] == "invalid_api_key"
        assert llm.requests == []
        await client(browser).models.list()
        # Revoked in the file, then a reload (SIGHUP, or a save in the panel): refused at once.
        path = tmp_path / "config.json"
        data = json.loads(path.read_text())
        data["api"]["keys"][0]["revoked"] = True
        path.write_text(json.dumps(data))
        gateway.service.reload()
        with pytest.raises(openai.AuthenticationError):
            await client(browser).models.list()
    assert "api: refused a POST /v1/chat/completions" in caplog.text
    for key in (KEY, OLD_KEY):
        assert key not in caplog.text  # never logged, even at DEBUG
        assert key not in redact(f"a line that quotes {key}")  # the log filter knows it


async def test_bodies_refused_with_400_naming_the_field(tmp_path):
    async with running(tmp_path) as (llm, _gateway, browser):
        api = client(browser)
        with pytest.raises(openai.BadRequestError) as huge:
            await api.chat.completions.create(
                model="memobot", messages=[{"role": "user", "content": "x" * 1_000_000}]
            )
        assert huge.value.status_code == 400
        assert huge.value.body["param"] == "messages[0].content"
        assert "100000" in huge.value.body["message"]
        cases = [
            ({"model": "memobot", "messages": []}, "messages"),
            ({"messages": [{"role": "user", "content": "x"}]}, "model"),
            ({"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": "yes"},
             "stream"),
            ({"model": "m", "messages": [{"role": "assistant", "content": "x"}]},
             "messages[0].role"),
            ({"model": "m", "messages": [{"role": "user", "content": "x"}],
              "session_id": "../editor:other"}, "session_id"),
        ]  # fmt: skip
        headers = {"Authorization": f"Bearer {KEY}"}
        async with aiohttp.ClientSession() as http:
            for body, param in cases:
                async with http.post(
                    f"{browser.base}/v1/chat/completions", json=body, headers=headers
                ) as r:
                    assert r.status == 400, body
                    assert (await r.json())["error"]["param"] == param
            for odd in (b"[" * 200_000, b"\xff\xfe", b'{"model": "m", "messages": [1, 2]}'):
                async with http.post(
                    f"{browser.base}/v1/chat/completions",
                    data=odd,
                    headers={**headers, "Content-Type": "application/json"},
                ) as r:
                    assert r.status == 400, odd[:20]
            # Past api.maxRequestBytes: 413, without reading it all.
            async with http.post(
                f"{browser.base}/v1/chat/completions",
                data=b"{" + b" " * (5 * 1024 * 1024) + b"}",
                headers={**headers, "Content-Type": "application/json"},
            ) as r:
                assert r.status == 413
                assert (await r.json())["error"]["code"] == "request_too_large"
        assert llm.requests == []


async def test_a_client_that_leaves_mid_stream_gets_the_whole_answer_on_retry(tmp_path):
    answer = "The whole answer, written slowly."
    async with running(tmp_path, reply(answer, hold="slow")) as (llm, gateway, browser):
        headers = {"Authorization": f"Bearer {KEY}", "Idempotency-Key": "req-1"}
        body = {
            "model": "memobot",
            "messages": [{"role": "user", "content": "tell me"}],
            "stream": True,
        }
        async with aiohttp.ClientSession() as http:
            async with http.post(
                f"{browser.base}/v1/chat/completions", json=body, headers=headers
            ) as r:
                assert r.status == 200
                async for line in r.content:
                    if b'"content": "' in line and b'"content": ""' not in line:
                        break  # the first piece of the answer: leave
        llm.release("slow")
        api = client(browser)
        again = await api.chat.completions.create(
            model="memobot",
            messages=[{"role": "user", "content": "tell me"}],
            extra_headers={"Idempotency-Key": "req-1"},
        )
        assert again.choices[0].message.content == answer
        # Once more, streamed: from the records, no model call.
        stream = await api.chat.completions.create(
            model="memobot",
            messages=[{"role": "user", "content": "tell me"}],
            stream=True,
            extra_headers={"Idempotency-Key": "req-1"},
        )
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        assert text == answer
        assert len(llm.requests) == 1
        assert user_texts(gateway, "api:editor:default") == ["tell me"]
        # The same key for another request: refused, naming it.
        with pytest.raises(openai.BadRequestError) as reused:
            await api.chat.completions.create(
                model="memobot",
                messages=[{"role": "user", "content": "something else"}],
                extra_headers={"Idempotency-Key": "req-1"},
            )
        assert reused.value.body["code"] == "idempotency_key_reused"
        # Another key's Idempotency-Key is not this one's.
        other = await client(browser, GUEST_KEY).chat.completions.create(
            model="memobot",
            messages=[{"role": "user", "content": "tell me"}],
            extra_headers={"Idempotency-Key": "req-1"},
        )
        assert other.choices[0].message.content == "echo: tell me"
        async with aiohttp.ClientSession() as http:
            async with http.get(
                f"{browser.base}/v1/sessions/default/last",
                headers={"Authorization": f"Bearer {KEY}"},
            ) as r:
                assert (await r.json())["content"] == answer


async def test_a_persons_key_has_the_tools_their_channel_gives_them(tmp_path):
    """A key "as" telegram:42 is that person: telegram's dmTools decide their tools, as in
    their private chat there (without it, the default guest tools)."""
    chosen = {"dmTools": ["read_file", "list_dir"]}
    async with running(tmp_path, reply("ok"), telegram=chosen) as (llm, _gateway, browser):
        await client(browser, GUEST_KEY).chat.completions.create(
            model="memobot", messages=[{"role": "user", "content": "hi"}]
        )
        offered = {t["function"]["name"] for t in llm.requests[0]["body"].get("tools", [])}
    assert offered == {"read_file", "list_dir"}


async def test_a_persons_key_has_that_persons_tools_and_no_approvals(tmp_path):
    """A key "as" a non-admin person gets a guest's tools (no exec); an approval an API
    client cannot give is refused with a tool result, not asked, unless its key allows such
    calls unasked."""
    steps = [
        tool_step(("exec", {"command": "echo hi"})),
        reply("done"),
        tool_step(("exec", {"command": "echo hi"})),
        reply("done too"),
        tool_step(("exec", {"command": "echo ran-unasked"})),
        reply("ran"),
    ]
    async with running(tmp_path, *steps, approval="always") as (llm, _gateway, browser):
        guest = await client(browser, GUEST_KEY).chat.completions.create(
            model="memobot", messages=[{"role": "user", "content": "run it"}]
        )
        assert guest.choices[0].message.content == "done"
        offered = {t["function"]["name"] for t in llm.requests[0]["body"].get("tools", [])}
        assert "exec" not in offered
        tool_result = llm.requests[1]["body"]["messages"][-1]["content"]
        assert "'exec' is not available in this chat" in tool_result
        owner = await client(browser).chat.completions.create(
            model="memobot", messages=[{"role": "user", "content": "run it"}]
        )
        assert owner.choices[0].message.content == "done too"
        offered = {t["function"]["name"] for t in llm.requests[2]["body"].get("tools", [])}
        assert "exec" in offered
        refused = llm.requests[3]["body"]["messages"][-1]["content"]
        assert "program's on the API" in refused  # refused unasked: nobody can press a button
        # A key allowed to run such calls runs them without a question.
        ran = await client(browser, RUN_KEY).chat.completions.create(
            model="memobot", messages=[{"role": "user", "content": "run it"}]
        )
        assert ran.choices[0].message.content == "ran"
        assert "ran-unasked" in llm.requests[5]["body"]["messages"][-1]["content"]


async def test_a_browser_page_cannot_use_the_api(tmp_path):
    """No cookie opens it (a logged-in panel session is no key); a foreign Host is refused
    (DNS rebinding); a form's body is not JSON."""
    async with running(tmp_path) as (llm, _gateway, browser):
        await browser.login()  # the browser holds a panel session cookie
        status, _, _ = await browser.post(
            "/v1/chat/completions", {"model": "memobot"}, origin="http://evil.example"
        )
        assert status == 401
        async with aiohttp.ClientSession() as http:
            async with http.get(
                f"{browser.base}/v1/models",
                headers={"Authorization": f"Bearer {KEY}", "Host": "evil.example:80"},
            ) as r:
                assert r.status == 421
            async with http.post(
                f"{browser.base}/v1/chat/completions",
                data="model=memobot",
                headers={"Authorization": f"Bearer {KEY}", "Content-Type": "text/plain"},
            ) as r:
                assert r.status == 400
            async with http.get(f"{browser.base}/health") as r:
                assert (await r.json())["status"] == "ok"
        assert llm.requests == []


async def test_a_spent_budget_is_429_with_retry_after(tmp_path):
    budget = {"perChat": {"daily": {"tokens": 1}}}
    async with running(tmp_path, budget=budget) as (llm, gateway, browser):
        api = client(browser)
        first = await api.chat.completions.create(
            model="memobot", messages=[{"role": "user", "content": "hi"}]
        )
        assert first.choices[0].message.content == "echo: hi"
        with pytest.raises(openai.RateLimitError) as limited:
            await api.chat.completions.create(
                model="memobot", messages=[{"role": "user", "content": "more"}]
            )
        assert limited.value.body["code"] == "budget_exceeded"
        assert int(limited.value.response.headers["Retry-After"]) > 0
        # A new session of the same key is no fresh budget (the key is the chat)...
        with pytest.raises(openai.RateLimitError):
            await api.chat.completions.create(
                model="memobot",
                messages=[{"role": "user", "content": "elsewhere"}],
                extra_headers={"X-Session-Id": "other"},
            )
        # ...another key's is its own.
        other = await client(browser, GUEST_KEY).chat.completions.create(
            model="memobot", messages=[{"role": "user", "content": "elsewhere"}]
        )
        assert other.choices[0].message.content == "echo: elsewhere"
        assert len(llm.requests) == 2
        assert user_texts(gateway, "api:editor:default") == ["hi"]  # the refused one not kept


async def test_with_the_panel_off_the_api_listens_alone(tmp_path):
    """``web.enabled`` false: the API alone on the panel's address, its Host check kept, no
    panel page there; a key reaches only its own sessions."""
    async with FakeLLM() as llm:
        web = {**panel_section(), "enabled": False}
        telegram = {"enabled": False, "token": "1:x", "allowFrom": ["42"]}
        channels = {"telegram": telegram}
        path = write_config(tmp_path, llm.base_url, web=web, api=api_section(), channels=channels)
        cfg, _ = load_config(path)
        gateway = Gateway(cfg, config_path=path)
        gateway.stack.loop.recover(channels={c.name for c in gateway.channels})
        loop_task = asyncio.create_task(gateway.stack.loop.run())
        await gateway.manager.start()
        await gateway._start_panel()
        try:
            assert gateway.panel is None and gateway.api_server is not None
            base = gateway.api_server.base_url
            api = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key=KEY, max_retries=0)
            CLIENTS.append(api)
            done = await api.chat.completions.create(
                model="memobot", messages=[{"role": "user", "content": "alone"}]
            )
            assert done.choices[0].message.content == "echo: alone"
            async with aiohttp.ClientSession() as http:
                async with http.get(f"{base}/", allow_redirects=False) as r:
                    assert r.status == 404  # no panel here
                async with http.get(
                    f"{base}/v1/models",
                    headers={"Authorization": f"Bearer {KEY}", "Host": "attacker.example"},
                ) as r:
                    assert r.status == 421
                guest = {"Authorization": f"Bearer {GUEST_KEY}"}
                async with http.get(f"{base}/v1/sessions/default/last", headers=guest) as r:
                    assert r.status == 404  # the guest key's own default session: empty
                mine = {"Authorization": f"Bearer {KEY}"}
                async with http.get(f"{base}/v1/sessions/default/last", headers=mine) as r:
                    assert (await r.json())["content"] == "echo: alone"
        finally:
            while CLIENTS:
                await CLIENTS.pop().close()
            await gateway.api_server.stop() if gateway.api_server else None
            await stop_agent(gateway.stack, loop_task, gateway.manager)


async def test_while_the_model_is_down_new_requests_get_503_and_the_waiting_one_its_answer(
    tmp_path,
):
    down = [error(503), error(503), error(503)]  # every retry of the first turn's call
    async with running(tmp_path, *down) as (_llm, gateway, browser):
        api = client(browser)
        retry = {"Idempotency-Key": "during-outage"}
        first = asyncio.create_task(
            api.chat.completions.create(
                model="memobot",
                messages=[{"role": "user", "content": "are you there?"}],
                extra_headers=retry,
            )
        )
        outage = gateway.stack.loop.outage
        assert outage is not None
        await until(lambda: outage.active)
        with pytest.raises(openai.InternalServerError) as unavailable:
            await api.chat.completions.create(
                model="memobot", messages=[{"role": "user", "content": "and now?"}]
            )
        assert unavailable.value.status_code == 503
        assert unavailable.value.body["code"] == "model_unavailable"
        assert unavailable.value.response.headers["Retry-After"] == "30"
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{browser.base}/health") as r:
                assert (await r.json())["model"] == "unavailable"
        assert not first.done()  # the first waits the outage out, as a platform's turn does
        outage.end("the test")
        done = await first
        assert done.choices[0].message.content == "echo: are you there?"
        assert user_texts(gateway, "api:editor:default") == ["are you there?"]


async def test_while_the_models_rate_limit_holds_new_requests_get_429_with_its_retry_after(
    tmp_path,
):
    limited = [error(429, retry_after=0.2)] * 3  # every retry of the first turn's call
    async with running(tmp_path, *limited) as (_llm, gateway, browser):
        api = client(browser)
        first = asyncio.create_task(
            api.chat.completions.create(
                model="memobot", messages=[{"role": "user", "content": "are you there?"}]
            )
        )
        outage = gateway.stack.loop.outage
        assert outage is not None
        await until(lambda: outage.active)
        with pytest.raises(openai.RateLimitError) as limit:
            await api.chat.completions.create(
                model="memobot", messages=[{"role": "user", "content": "and now?"}]
            )
        assert limit.value.body["code"] == "rate_limit_exceeded"
        assert limit.value.response.headers["Retry-After"] == "1"  # the model's 0.2 s, rounded up
        outage.end("the test")
        assert (await first).choices[0].message.content == "echo: are you there?"


def test_a_stream_sends_each_reply_once_and_the_answer_at_its_end():
    written = Written()
    deltas = [
        written.on_event("text", "Let me"),
        written.on_event("text", "Let me look."),
        written.on_event("tool", "exec: ls"),
        written.on_event("text", "The answer"),
        written.on_event("text", "The answer"),  # nothing new
        written.on_event("text", "A retried reply"),  # replaces: not shown piecemeal
        written.on_answer("The answer is 4."),
    ]
    assert deltas == ["Let me", " look.", "", "\n\nThe answer", "", "", " is 4."]
    fresh = Written()
    assert fresh.on_answer("All at once.") == "All at once."  # a replayed answer


async def test_one_idempotency_key_is_claimed_once(tmp_path):
    records = Records(tmp_path / "api")
    first, second = await asyncio.gather(
        records.claim("editor", "api-i-1", {"hash": "a", "at": 1e12}),
        records.claim("editor", "api-i-1", {"hash": "b", "at": 1e12}),
    )
    assert first["hash"] == second["hash"] == "a"
    again = Records(tmp_path / "api")  # after a restart: read from the file
    await again.load("editor")
    assert again.get("editor", "api-i-1") == {"hash": "a", "at": 1e12}
    assert (tmp_path / "api" / "editor.json").stat().st_mode & 0o777 == 0o600


async def test_a_silent_stream_is_kept_alive_and_then_answered(tmp_path):
    slow = reply("After a long think.", hold="think", hold_after_chunks=0)
    async with running(tmp_path, slow) as (llm, _gateway, browser):
        assert browser.panel.api is not None
        browser.panel.api.keepalive_seconds = 0.01
        body = {"model": "memobot", "messages": [{"role": "user", "content": "q"}], "stream": True}
        lines = []
        async with aiohttp.ClientSession() as http:
            async with http.post(
                f"{browser.base}/v1/chat/completions",
                json=body,
                headers={"Authorization": f"Bearer {KEY}"},
            ) as r:
                async for raw in r.content:
                    lines.append(raw.decode().strip())
                    if lines[-1] == ": working":
                        llm.release("think")
        assert [line for line in lines if line][-1] == "data: [DONE]"
        text = "".join(
            json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
            for line in lines
            if line.startswith("data: {")
        )
        assert text == "After a long think."


def test_a_key_for_an_admin_talks_in_the_owners_own_chat(tmp_path):
    """Its conversations are the owner's private chats (Dream digests them into the owner's
    memory); a guest's key's are the guest's; a revoked or unknown key's, nobody's."""
    telegram = {"enabled": False, "token": "1:x", "allowFrom": ["7", "42"], "admins": ["7"]}
    keys = [*api_section()["keys"], {"name": "admin7", "key": "k-admin7-0123456789abcdef"}]
    keys[-1]["as"] = "telegram:7"
    path = write_config(
        tmp_path, "http://127.0.0.1:9/v1", api={"enabled": True, "keys": keys},
        channels={"telegram": telegram},
    )  # fmt: skip
    cfg, _ = load_config(path)
    assert registry.owner_chat(cfg, "api:editor:default")
    assert registry.owner_chat(cfg, "api:admin7:notes")
    assert not registry.owner_chat(cfg, "api:guest:default")
    assert not registry.owner_chat(cfg, "api:old:default")  # revoked
    assert not registry.owner_chat(cfg, "api:nobody:default")
    assert registry.private_chat("api:guest:default")
