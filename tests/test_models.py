"""Issue 31 item 5, a model per chat: ``llm.models`` names models, ``/model NAME`` switches one
chat's (kept in its session, so a restart keeps it), fallbacks still work for it, and
consolidation may use ``memory.model``. In-process, against two fake LLM servers whose request
logs say which model, and which key, each request named."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from bot.config import ConfigError, load_config, parse_config
from bot.outage import NOTICE_TEXT, Outage
from bot.session import SessionStore, transitions
from bot.session.records import check_record
from bot.session.state import SessionState
from tests.fakes.llm_server import FakeLLM, reply
from tests.helpers import Harness, closed_port, write_config

ADMIN = {"is_admin": True, "is_group": False}
GUEST = {"is_admin": False, "is_group": False}
LOCAL_KEY = "local-secret-key-0123"


async def say(h: Harness, text: str, chat: str = "t", who: dict[str, Any] = ADMIN) -> str:
    fut = await h.send(text, chat=chat, metadata=who)
    return (await asyncio.wait_for(fut, 15)).text


def asked(server: FakeLLM, text: str) -> list[str]:
    """The models the requests of the user message ``text`` named at ``server``."""
    return [r["model"] for r in server.requests if r["last_user"].startswith(text + "\n")]


def ledger(tmp_path: Path) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for path in sorted((tmp_path / "state" / "usage").glob("*.jsonl"))
        for line in path.read_text().splitlines()
    ]


async def test_model_switches_the_next_request_of_that_chat_only_and_survives_a_restart(
    tmp_path: Path, llm: FakeLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOCAL_KEY", LOCAL_KEY)
    async with FakeLLM() as local:
        config = write_config(
            tmp_path,
            llm.base_url,
            llm={
                "models": {
                    "fast": {"model": "gpt-4o-mini"},
                    "local": {
                        "model": "llama3.1",
                        "baseUrl": local.base_url,
                        "apiKey": "${LOCAL_KEY}",
                    },
                }
            },
            memory={"model": "fast"},
        )
        cfg = load_config(config)[0]
        async with Harness(cfg, config) as h:
            listed = await say(h, "/model")
            assert "* default: fake-model" in listed and "- local: llama3.1" in listed
            assert (await say(h, "/model local")).startswith("This chat now uses local")
            await say(h, "hello from t")
            await say(h, "hello from u", chat="u")
            assert "model: local (llama3.1)" in await say(h, "/status")
            # Consolidation (by /new) asks memory.model's model, on llm's own server.
            assert (await say(h, "/new", chat="u")).startswith("New conversation started.")
        assert asked(local, "hello from t") == ["llama3.1"]
        assert asked(llm, "hello from u") == ["fake-model"]
        assert asked(llm, "hello from t") == []
        assert llm.requests[-1]["model"] == "gpt-4o-mini"  # the consolidation
        # Each server got its own key, never the other's.
        assert {r["headers"]["authorization"] for r in local.requests} == {f"Bearer {LOCAL_KEY}"}
        assert {r["headers"]["authorization"] for r in llm.requests} == {"Bearer test-key"}
        records = ledger(tmp_path)
        assert [(r["session"], r["model"], r["endpoint"]) for r in records[:2]] == [
            ("cli:t", "llama3.1", local.base_url),
            ("cli:u", "fake-model", llm.base_url),
        ]
        assert (records[-1]["purpose"], records[-1]["model"]) == ("consolidation", "gpt-4o-mini")

        # A new stack over the same state folder: the chat's choice is in its session.
        async with Harness(load_config(config)[0], config) as h:
            await say(h, "again from t")
            assert (await say(h, "/model default")).startswith("This chat now uses default")
            await say(h, "back to default")
        assert asked(local, "again from t") == ["llama3.1"]
        assert asked(llm, "back to default") == ["fake-model"]


async def test_a_non_admin_is_refused_and_an_unknown_name_is_said(
    tmp_path: Path, llm: FakeLLM
) -> None:
    models = {"fast": {"model": "gpt-4o-mini"}}
    config = write_config(tmp_path, llm.base_url, llm={"models": models})
    async with Harness(load_config(config)[0], config) as h:
        assert "- fast: gpt-4o-mini" in await say(h, "/model", who=GUEST)  # listing is for all
        refused = await say(h, "/model fast", who=GUEST)
        assert refused == "Only an admin of this bot may switch the model."
        unknown = await say(h, "/model huge")
        assert unknown == "No model named 'huge'. Named: default, fast."
        await say(h, "still default")
    assert SessionStore(tmp_path / "state").get("cli:t").state.chat_model is None
    assert [r["model"] for r in llm.requests] == ["fake-model"]

    # llm.modelSwitch "everyone": anyone let in may switch their chat's.
    config = write_config(tmp_path, llm.base_url, llm={"models": models, "modelSwitch": "everyone"})
    async with Harness(load_config(config)[0], config) as h:
        assert (await say(h, "/model fast", who=GUEST)).startswith("This chat now uses fast")


async def test_a_named_model_whose_endpoint_is_down_falls_back(
    tmp_path: Path, llm: FakeLLM
) -> None:
    llm.script(reply("from the fallback"))
    down = f"http://127.0.0.1:{closed_port()}/v1"
    config = write_config(
        tmp_path,
        llm.base_url,
        llm={
            "models": {"local": {"model": "llama3.1", "baseUrl": down, "retry": {"attempts": 1}}},
            "fallbacks": [{"model": "fb"}],
        },
    )
    async with Harness(load_config(config)[0], config) as h:
        await say(h, "/model local")
        assert await say(h, "hi") == "from the fallback"
    assert [r["model"] for r in llm.requests] == ["fb"]
    assert [(r["model"], r["endpoint"]) for r in ledger(tmp_path)] == [("fb", llm.base_url)]


@pytest.mark.parametrize(
    ("section", "problem"),
    [
        ({"memory": {"model": "cheap"}}, "memory.model: 'cheap' is not a name in llm.models"),
        ({"llm": {"models": {"default": {"model": "x"}}}}, "is llm's own model"),
        ({"llm": {"models": {"a b": {"model": "x"}}}}, "not a model name"),
        ({"llm": {"models": {"fast": {}}}}, "llm.models.fast.model"),
        ({"llm": {"modelSwitch": "all"}}, "llm.modelSwitch"),
    ],
)
def test_a_wrong_models_setting_is_a_config_error(section: dict[str, Any], problem: str) -> None:
    with pytest.raises(ConfigError, match=problem.replace(".", r"\.")):
        parse_config(section)


async def test_a_chosen_name_taken_out_of_the_config_goes_back_to_the_default(
    tmp_path: Path, llm: FakeLLM, caplog: pytest.LogCaptureFixture
) -> None:
    store = SessionStore(tmp_path / "state")
    store.apply(store.get("cli:t"), transitions.choose_model("gone"))
    config = write_config(tmp_path, llm.base_url)
    async with Harness(load_config(config)[0], config) as h:
        assert "* default: fake-model" in await say(h, "/model")
        await say(h, "one")
        await say(h, "two")
    assert [r["model"] for r in llm.requests] == ["fake-model", "fake-model"]
    assert caplog.text.count("llm.models has no 'gone' any more") == 1


async def test_a_chat_on_a_dead_named_model_is_answered_with_the_error_and_no_outage_begins(
    tmp_path: Path, llm: FakeLLM
) -> None:
    """The outage is watched on llm.model: one chat's dead endpoint must not hold every chat."""
    down = f"http://127.0.0.1:{closed_port()}/v1"
    local = {"model": "llama3.1", "baseUrl": down, "retry": {"attempts": 1}}
    config = write_config(tmp_path, llm.base_url, llm={"models": {"local": local}})
    h = Harness(load_config(config)[0], config)
    h.stack.loop.outage = Outage(h.stack.provider.probe, h.cfg.llm.outage)  # the gateway's way
    async with h:
        await say(h, "/model local")
        answer = await say(h, "hi")
        assert "unavailable" in answer and answer != NOTICE_TEXT
        assert not h.stack.loop.outage.active
        assert await say(h, "and here?", chat="u") == "echo: and here?"
    assert NOTICE_TEXT not in [m.text for m in h.outbox]


def test_the_chat_model_is_a_typed_session_field_and_old_files_read_without_it() -> None:
    """An older session (no ``chat_model``) uses llm.model; a hand-edited wrong type is
    dropped with the problem named, never handed to the provider."""
    assert SessionState.of({"key": "cli:t"}).chat_model is None
    chosen = transitions.choose_model("fast")(SessionState())
    assert chosen is not None and chosen.chat_model == "fast"
    assert SessionState().update_to(chosen) == {"chat_model": "fast"}
    assert transitions.choose_model("fast")(chosen) is None  # nothing to write
    back = transitions.choose_model(None)(chosen)
    assert back is not None and chosen.update_to(back) == {"chat_model": None}
    checked = check_record({"_type": "metadata", "metadata": {"chat_model": 5}})
    assert checked.record is not None and "chat_model" not in checked.record["metadata"]
    assert any("chat_model" in p for p in checked.problems)
