"""bot.startup: cyclic garbage collection is off only while memobot starts."""

from __future__ import annotations

import gc
from pathlib import Path

from bot import cli
from tests.helpers import closed_port, write_config


def test_memobot_dream_runs_with_the_cyclic_gc_on(tmp_path: Path, monkeypatch):
    """bot.startup: GC is off from cli.main until started(); only the gateway and `agent`
    call it. `memobot dream` (every chat's history through the LLM, minutes on a big archive),
    `memobot import nanobot`, `memobot memory search` and `doctor` run to the end with the
    cyclic collector off: every cycle they make (aiohttp/openai responses, exceptions with
    tracebacks, asyncio futures) stays until exit."""
    seen: list[bool] = []

    async def fake_dream(cfg, args) -> int:
        seen.append(gc.isenabled())
        return 0

    monkeypatch.setattr("bot.memory.dream.run_dream_command", fake_dream)
    config = write_config(tmp_path, f"http://127.0.0.1:{closed_port()}/v1")
    try:
        assert cli.main(["dream", "--config", str(config)]) == 0
    finally:
        gc.enable()
    assert seen == [True], "memobot dream ran with gc disabled"
