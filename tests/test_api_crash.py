"""SIGKILL of the gateway while an API answer streams, then a restart: the client's retry with
the same Idempotency-Key gets the answer, and the session holds one question and one answer.
A real process, because a real crash is the point (the suite's zygote forks it)."""

from __future__ import annotations

import signal

import httpx
import openai

from bot.session import SessionStore
from tests.fakes.llm_server import FakeLLM, reply
from tests.helpers import write_config
from tests.helpers.crash import wait_until
from tests.helpers.gateway import Gateway, wait_log
from tests.helpers.web import panel_section

KEY = "k-crash-test-0123456789abcdef"
ANSWER = "The whole answer, after the restart."


def test_a_sigkill_mid_stream_then_a_retry_gets_the_one_answer(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMOBOT_TEST_API_KEY", KEY)  # the key as a ${VAR}, as documented
    with FakeLLM.start_in_thread() as llm:
        llm.script(reply("first try, never finished " * 20, hold="crash"), reply(ANSWER))
        web = panel_section()
        api = {"enabled": True, "keys": [{"name": "editor", "key": "${MEMOBOT_TEST_API_KEY}"}]}
        config = write_config(tmp_path, llm.base_url, web=web, api=api)
        base = f"http://{web['listen']}/v1"
        client = openai.OpenAI(base_url=base, api_key=KEY, max_retries=0, timeout=30)
        question = [{"role": "user", "content": "what is the answer?"}]
        retry = {"Idempotency-Key": "crash-1"}
        records = tmp_path / "state" / "api" / "editor.json"

        gateway = Gateway(config)
        try:
            gateway.wait_running()
            stream = client.chat.completions.create(
                model="memobot", messages=question, stream=True, extra_headers=retry
            )
            try:
                for chunk in stream:
                    if chunk.choices and chunk.choices[0].delta.content:
                        gateway.kill()  # mid-stream: the model is still writing
                        break
            except (openai.APIError, httpx.HTTPError):
                pass
            assert gateway.proc.returncode == -signal.SIGKILL
        finally:
            gateway.kill()

        gateway = Gateway(config)
        try:
            wait_log(gateway.log, "gateway running", 20, gateway.proc, count=2)
            # The resumed turn answers with nobody waiting: the answer is kept for the retry.
            wait_until(lambda: ANSWER in records.read_text() if records.exists() else False)
            again = client.chat.completions.create(
                model="memobot", messages=question, extra_headers=retry
            )
            assert again.choices[0].message.content == ANSWER
        finally:
            gateway.stop()
        assert gateway.proc.returncode == 0, gateway.log.read_text()
        assert len(llm.requests) == 2  # the killed call, and the resumed turn's
        session = SessionStore(tmp_path / "state").get("api:editor:default")
        said = [m for m in session.messages if m.get("role") in ("user", "assistant")]
        assert [m["role"] for m in said] == ["user", "assistant"]
        assert said[1]["content"] == ANSWER
        assert KEY not in gateway.log.read_text()
        llm.llm.release("crash")  # the killed call's stream, still held: let it end
