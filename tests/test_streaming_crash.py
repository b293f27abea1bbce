"""SIGKILL while an answer streams: the real gateway subprocess, python-telegram-bot and the
fake Bot API; after the restart every answer is in the chat exactly once.

A group preview message is in the delivery ledger while it is edited, so the resumed turn's
answer (or the re-sent stored answer) edits that same message; a private chat's draft is
stored nowhere and simply gives way to the one answer.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

from tests.fakes.llm_server import FakeLLM, reply
from tests.fakes.telegram_api import BOT_USERNAME, FakeBotAPI
from tests.helpers import config_dict, start_gateway, stop_gateway

ALICE = 1001
GROUP = -1001234
BOT = f"@{BOT_USERNAME}"


def _config(tmp_path: Path, llm: Any, api: Any) -> Path:
    settings = {
        "enabled": True,
        "token": api.token,
        "baseUrl": api.base_url,
        "allowFrom": [str(ALICE)],
        "pollTimeoutSeconds": 5,
        "streamEditIntervalSeconds": 0.2,
        "rateLimits": {"group": {"messages": 50, "perSeconds": 1}},
    }
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(config_dict(tmp_path, llm.base_url, channels={"telegram": settings}))
    )
    return config


def _texts(api: Any, chat: int) -> list[str]:
    return [m["text"] for m in api.shown(chat)]


def test_sigkill_mid_stream_then_restart_leaves_one_message_per_answer(tmp_path):
    long = " ".join(f"first try, sentence {i}." for i in range(80))
    with FakeLLM.start_in_thread() as llm, FakeBotAPI.start_in_thread() as api:
        llm.script(
            reply(long, when_user_contains="group question", pieces=40, chunk_delay=0.15),
            reply(long, when_user_contains="private question", pieces=40, chunk_delay=0.15),
            reply("The group answer, resumed.", when_user_contains="group question"),
            reply("The private answer, resumed.", when_user_contains="private question"),
        )
        config = _config(tmp_path, llm, api)
        proc = start_gateway(config)
        try:
            api.group_text(f"{BOT} group question")
            api.private_text("private question")

            def mid_stream() -> bool:
                return len(api.calls("editMessageText")) >= 2 and len(api.drafts(ALICE)) >= 2

            api.wait_for(mid_stream, 30)
            proc.kill()
            assert proc.wait(10) == -signal.SIGKILL
        finally:
            stop_gateway(proc)
        [preview] = api.shown(GROUP)
        assert preview["text"].startswith("first try")  # half an answer, being edited
        assert api.shown(ALICE) == []  # drafts are stored nowhere

        proc = start_gateway(config)
        try:
            api.wait_for(
                lambda: (
                    _texts(api, GROUP) == ["The group answer, resumed."]
                    and _texts(api, ALICE) == ["The private answer, resumed."]
                ),
                30,
            )
            time.sleep(1.0)  # a second copy would arrive by now
        finally:
            stop_gateway(proc)
        assert proc.returncode == 0, (tmp_path / "gateway.log").read_text()
        # The resumed turn's answer landed in the preview message itself: one message each.
        assert [m["message_id"] for m in api.shown(GROUP)] == [preview["message_id"]]
        assert _texts(api, GROUP) == ["The group answer, resumed."]
        assert _texts(api, ALICE) == ["The private answer, resumed."]
        assert len(api.sent(ALICE)) == 1


def test_sigkill_after_the_answer_was_stored_finishes_the_preview(tmp_path):
    answer = "Stored, then **finished** after the restart: " + " ".join(
        f"part {i}." for i in range(40)
    )
    with FakeLLM.start_in_thread() as llm, FakeBotAPI.start_in_thread() as api:
        llm.script(reply(answer, pieces=10, chunk_delay=0.1))
        config = _config(tmp_path, llm, api)
        # Killed once the answer is in the ledger, before it was delivered.
        proc = start_gateway(config, {"MEMOBOT_FAILPOINTS": "before_delivery"})
        try:
            api.group_text(f"{BOT} store it")
            assert proc.wait(30) == -signal.SIGKILL
        finally:
            stop_gateway(proc)
        [preview] = api.shown(GROUP)
        assert "**finished**" in preview["text"] or len(preview["text"]) < len(answer)
        proc = start_gateway(config)
        try:
            api.wait_for(lambda: any("finished after" in t for t in _texts(api, GROUP)), 30)
            time.sleep(1.0)
        finally:
            stop_gateway(proc)
        assert proc.returncode == 0, (tmp_path / "gateway.log").read_text()
        shown = api.shown(GROUP)
        assert [m["message_id"] for m in shown] == [preview["message_id"]]
        assert shown[0]["text"].startswith("Stored, then finished after the restart")
        assert len(api.sent(GROUP)) == 1
