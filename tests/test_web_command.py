"""``memobot web``: the link handed from the command's process to the server's through the
state folder, --open, --set-password into the file's own JSON; and a panel that costs
nothing while nobody has it open."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import aiohttp

from bot.config import load_config
from bot.gateway import STATUS_FILE
from bot.web import command
from bot.web.passwords import verify_password
from bot.web.server import Panel
from tests.helpers import config_dict, run_memobot, write_config
from tests.helpers.web import browsing, panel_section

NO_LLM = "http://127.0.0.1:9/v1"


async def test_a_link_printed_by_the_command_logs_in_to_the_gateways_panel(tmp_path):
    config = write_config(tmp_path, NO_LLM, web=panel_section())
    cfg, _ = load_config(config)
    async with browsing(cfg, config, in_gateway=True) as b:
        # A gateway's status file, as Gateway.status() writes it (this process is alive).
        live = {"pid": os.getpid(), "updated_at": time.time(), "channels": {}, "web": b.base}
        (tmp_path / "state").mkdir(exist_ok=True)
        (tmp_path / "state" / STATUS_FILE).write_text(json.dumps(live))
        done = await asyncio.to_thread(run_memobot, "web", config=config)
        assert done.returncode == 0, done.stderr
        url = done.stdout.strip()
        assert url.startswith(f"{b.base}/login?token=") and "\n" not in url
        async with b.http.get(url) as r:
            assert r.status == 200
        assert (await b.get("/"))[2].url.path == "/"


def test_open_hands_the_link_to_a_browser(monkeypatch, capsys):
    opened = []
    monkeypatch.setattr(command.webbrowser, "open", lambda url: opened.append(url) or True)
    command._show("http://127.0.0.1:8765/login?token=abc", True, serving=False)
    assert opened == ["http://127.0.0.1:8765/login?token=abc"]
    assert capsys.readouterr().out == "http://127.0.0.1:8765/login?token=abc\n"


def test_set_password_writes_only_its_hash_into_the_files_own_json(tmp_path, monkeypatch):
    data = config_dict(tmp_path, NO_LLM)
    data["llm"]["apiKey"] = "${MY_KEY}"
    data["web"] = {"listen": "0.0.0.0:8765"}  # refused until a password is set
    config = tmp_path / "config.json"
    config.write_text(json.dumps(data))
    monkeypatch.setenv("MY_KEY", "sk-from-the-environment")
    answers = iter(["a long enough password", "a long enough password"])
    monkeypatch.setattr(command.getpass, "getpass", lambda prompt: next(answers))
    monkeypatch.setattr(command.sys.stdin, "isatty", lambda: True)
    assert command.set_password(config) == 0
    written = json.loads(config.read_text())
    assert written["llm"]["apiKey"] == "${MY_KEY}"  # not expanded
    assert "a long enough password" not in config.read_text()
    assert verify_password("a long enough password", written["web"]["passwordHash"])
    assert config.stat().st_mode & 0o777 == 0o600
    cfg, _ = load_config(config)
    assert cfg.web.listen == "0.0.0.0:8765"


def test_set_password_refuses_two_different_answers_and_a_pipe(tmp_path, monkeypatch):
    config = tmp_path / "config.json"
    config.write_text("{}")
    answers = iter(["a long enough password", "another long password"])
    monkeypatch.setattr(command.getpass, "getpass", lambda prompt: next(answers))
    monkeypatch.setattr(command.sys.stdin, "isatty", lambda: True)
    assert command.set_password(config) == command.EX_USAGE
    monkeypatch.setattr(command.sys.stdin, "isatty", lambda: False)
    assert command.set_password(config) == command.EX_USAGE
    assert config.read_text() == "{}"


async def test_a_panel_nobody_opens_runs_nothing(tmp_path: Path):
    config = write_config(tmp_path, NO_LLM, web=panel_section())
    cfg, _ = load_config(config)
    before = asyncio.all_tasks()
    panel = Panel(cfg, config, in_gateway=True)
    assert await panel.start() is None
    try:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(0.2)
        assert asyncio.all_tasks() == before  # no task of its own
        timers = [h for h in loop._scheduled if not h.cancelled()]  # type: ignore[attr-defined]
        assert timers == [], timers
        # After a visit ends, nothing of it is left running either.
        async with aiohttp.ClientSession() as http, http.get(panel.base_url + "/login") as r:
            assert r.status == 200
        await asyncio.sleep(0.2)
        assert asyncio.all_tasks() == before
    finally:
        await panel.stop()
