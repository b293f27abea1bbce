"""memobot doctor: a healthy installation passes; a broken one is explained and --fix repairs it."""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bot.config import parse_config
from bot.service.doctor import (
    check_clock,
    check_exec_allow,
    check_sessions,
    install_time,
    scan_session,
)
from bot.service.probes import TokenProbe, check_llm, check_token, token_probes
from bot.session import SessionStore
from bot.workspace import init_workspace
from tests.fakes.llm_server import FakeLLM, FakeLLMThread
from tests.fakes.slack_api import APP_TOKEN, BOT_TOKEN, FakeSlack
from tests.fakes.telegram_api import DEFAULT_TOKEN, FakeBotAPI, FakeBotAPIThread
from tests.helpers import closed_port, config_dict, run_memobot


@pytest.fixture
def llm() -> Iterator[FakeLLMThread]:
    with FakeLLM.start_in_thread() as server:
        yield server


@pytest.fixture
def telegram() -> Iterator[FakeBotAPIThread]:
    with FakeBotAPI.start_in_thread() as server:
        yield server


def setup(tmp_path: Path, base_url: str, **sections: dict) -> Path:
    """A config (mode 0600) and a workspace as ``memobot onboard`` leaves them."""
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(config_dict(tmp_path, base_url, **sections)))
    os.chmod(cfg, 0o600)
    init_workspace(tmp_path / "ws")
    (tmp_path / "state").mkdir(mode=0o700)
    return cfg


def add_session(tmp_path: Path, key: str, n: int = 2) -> Path:
    store = SessionStore(tmp_path / "state")
    session = store.get(key)
    for i in range(n):
        store.append(session, [{"role": "user", "content": f"message {i}"}])
    return session.path


def doctor(tmp_path: Path, cfg: Path, *args: str):
    env = {"MEMOBOT_UNIT_DIR": str(tmp_path / "units")}
    return run_memobot("doctor", *args, config=cfg, env=env)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_healthy_installation(
    tmp_path: Path, llm: FakeLLMThread, telegram: FakeBotAPIThread
) -> None:
    tg = {"enabled": True, "token": DEFAULT_TOKEN, "baseUrl": telegram.base_url, "allowFrom": ["1"]}
    cfg = setup(tmp_path, llm.base_url, channels={"telegram": tg})
    add_session(tmp_path, "telegram:42")
    units = {"MEMOBOT_UNIT_DIR": str(tmp_path / "units")}
    assert run_memobot("service", "install", "--user", config=cfg, env=units).returncode == 0
    result = doctor(tmp_path, cfg)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert f"✓ config valid: {cfg}" in out
    assert "✓ sessions: all 1 file(s) parse" in out
    assert "✓ LLM" in out and "model fake-model answered" in out
    assert "✓ telegram: token accepted by 127.0.0.1 (as memobot_test_bot)" in out
    assert "✓ user unit" in out and "matches this installation" in out
    assert "✓ clock: within" in out
    assert "✗" not in out and out.rstrip().endswith("All checks passed.")
    assert [c.method for c in telegram.calls()] == ["getme"]


def test_broken_installation_is_explained_and_fix_repairs_it(
    tmp_path: Path, telegram: FakeBotAPIThread
) -> None:
    tg = {"enabled": True, "token": "999:WRONG", "baseUrl": telegram.base_url, "allowFrom": ["1"]}
    cfg = setup(tmp_path, f"http://127.0.0.1:{closed_port()}/v1", channels={"telegram": tg})
    os.chmod(cfg, 0o644)
    os.chmod(tmp_path / "ws", 0o755)
    os.chmod(tmp_path / "state", 0o755)
    corrupt = add_session(tmp_path, "telegram:1", n=1)
    with corrupt.open("ab") as fh:  # a damaged line in the middle: good lines follow it
        fh.write(b'{"role": "user", "cont\n{"_type": "metadata", "metadata": {}}\n')
    torn = add_session(tmp_path, "telegram:2", n=1)
    with torn.open("ab") as fh:
        fh.write(b'{"role": "assistant", "content": "half')
    history = tmp_path / "ws" / "memory" / "history.jsonl"
    history.write_text('{"cursor": 1, "timestamp": "t", "session": "s", "content": "c"}\nnope\n')
    units = tmp_path / "units"
    units.mkdir()
    (units / "memobot.service").write_text("[Install]\nWantedBy=default.target\n")

    result = doctor(tmp_path, cfg)
    out = result.stdout
    assert result.returncode == 1, out
    assert f"✗ config file {cfg} has mode 0644" in out and f"fix: chmod 600 {cfg}" in out
    assert f"fix: chmod 700 {tmp_path / 'ws'}" in out
    assert f"! state folder {tmp_path / 'state'} has mode 0755" in out
    assert f"✗ session telegram:1 ({corrupt}): line(s) 3 do not parse" in out
    assert f"! session telegram:2 ({torn}): torn last line" in out
    assert f"✗ {history}: line(s) 2 do not parse" in out
    assert "unreachable" in out and "fix: check that the server runs" in out
    assert "✗ telegram: 127.0.0.1 refused the token (HTTP 401: Unauthorized)" in out
    assert "999:WRONG" not in out
    assert "✗ user unit" in out and "service install --user --force" in out
    assert "can be repaired with memobot doctor --fix" in out

    fixed = doctor(tmp_path, cfg, "--fix")
    assert fixed.returncode == 1, fixed.stdout  # the LLM and the token are still wrong
    assert mode(cfg) == 0o600 and mode(tmp_path / "ws") == 0o700
    assert mode(tmp_path / "state") == 0o700
    assert f"✓ session telegram:1 ({corrupt}): repaired (1 message kept)" in fixed.stdout
    assert f"✓ session telegram:2 ({torn}): repaired (1 message kept)" in fixed.stdout
    assert scan_session(corrupt.read_bytes()).bad_lines == []
    assert not scan_session(torn.read_bytes()).torn_tail
    assert list(corrupt.parent.glob(f"{corrupt.name}.corrupt-*")), "the original is kept aside"
    again = doctor(tmp_path, cfg)
    assert "sessions: all 2 file(s) parse" in again.stdout
    assert "1 quarantined copy(ies)" in again.stdout
    assert "chmod" not in again.stdout


def test_invalid_config_is_shown(tmp_path: Path) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text('{"llm": {"temperature": 9}}')
    os.chmod(cfg, 0o600)
    result = doctor(tmp_path, cfg)
    assert result.returncode == 1
    assert "✗ config is invalid" in result.stdout and "llm.temperature" in result.stdout


async def test_no_llm_names_the_keys_to_set(tmp_path: Path) -> None:
    cfg = parse_config({"agent": {"workspace": str(tmp_path / "ws")}})
    probe = await check_llm(cfg, tmp_path / "config.json")
    assert probe.check.status == "fail"
    for key in ('"llm.apiKey"', "OPENAI_API_KEY", '"llm.baseUrl"', '"llm.model"'):
        assert key in probe.check.fix


def test_sessions_are_not_repaired_under_a_running_gateway(tmp_path: Path) -> None:
    cfg = parse_config(config_dict(tmp_path, "http://127.0.0.1:9/v1"))
    path = add_session(tmp_path, "cli:a", n=1)
    with path.open("ab") as fh:
        fh.write(b"garbage\n")
    with path.open("ab") as fh:
        fh.write(b'{"_type": "metadata", "metadata": {}}\n')
    status = {"pid": os.getpid(), "channels": {}}
    (tmp_path / "state" / "gateway.json").write_text(json.dumps(status))
    [check] = [c for c in check_sessions(cfg, fix=True) if "cli:a" in c.text]
    assert check.status == "fail" and "the gateway is running" in check.text
    assert b"garbage" in path.read_bytes()


async def test_slack_tokens_are_checked_against_the_api(tmp_path: Path) -> None:
    async with FakeSlack() as slack:
        good = {"enabled": True, "botToken": BOT_TOKEN, "appToken": APP_TOKEN}
        cfg = parse_config({"channels": {"slack": {**good, "apiUrl": slack.api_url}}})
        checks = [await check_token(p) for p in token_probes(cfg)]
        assert [c.status for c in checks] == ["ok", "ok"], checks
        bad = {**good, "botToken": "xoxb-wrong", "apiUrl": slack.api_url}
        cfg = parse_config({"channels": {"slack": bad}})
        check = await check_token(token_probes(cfg)[0])
        assert check.status == "fail" and "invalid_auth" in check.text
        assert "channels.slack.botToken" in check.fix and "xoxb-wrong" not in check.text


async def test_an_unreachable_platform_is_a_warning_without_the_token() -> None:
    secret = "123:SECRET"
    url = f"http://127.0.0.1:{closed_port()}/bot{secret}/getMe"
    check = await check_token(TokenProbe("telegram", "GET", url, {}, secret))
    assert check.status == "warn"
    assert check.text.startswith("telegram: cannot reach 127.0.0.1 (no network?)")
    assert secret not in check.text


@pytest.mark.parametrize(
    ("allow", "warned"),
    [
        (None, []),
        (["ls", "git status"], ["git status"]),
        (["'git' diff", "g*"], ["'git' diff", "g*"]),
    ],
)
def test_doctor_warns_when_git_runs_unasked(allow: list[str] | None, warned: list[str]) -> None:
    tools: dict = {"approval": "risky"}
    if allow is not None:
        tools["exec"] = {"allow": allow}
    checks = list(check_exec_allow(parse_config({"tools": tools})))
    assert [c.status for c in checks] == ["warn"] * len(warned)
    assert all(
        repr(p) in c.text and "any program" in c.text for p, c in zip(warned, checks, strict=True)
    )
    # Asked anyway ("always") or never asked ("off", a choice of its own): no warning.
    tools["approval"] = "always"
    assert not list(check_exec_allow(parse_config({"tools": tools})))


def test_clock() -> None:
    now = time.time()
    assert check_clock(("llm.example", now - 2), now).status == "ok"
    skewed = check_clock(("llm.example", now - 3600), now)
    assert skewed.status == "fail" and "+3600 s" in skewed.text and "timedatectl" in skewed.fix
    assert check_clock(None, install_time() - 86400).status == "fail"
    assert check_clock(None, now).status == "ok"


async def test_a_platform_quoting_the_token_back_does_not_print_it() -> None:
    """The platform's own words are shown (``description``): a server that quotes the token
    (a self-hosted Bot API, a proxy) must not put it on a page or a terminal."""
    from aiohttp import web

    secret = "123:SECRETquotedBACK"

    async def refuse(request: web.Request) -> web.Response:
        return web.json_response({"ok": False, "description": f"bad token {secret}"}, status=401)

    app = web.Application()
    app.router.add_get("/bot{token}/getMe", refuse)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        url = f"http://127.0.0.1:{port}/bot{secret}/getMe"
        check = await check_token(TokenProbe("telegram", "GET", url, {}, secret))
    finally:
        await runner.cleanup()
    assert check.status == "fail" and "bad token <token>" in check.text
    assert "SECRETquoted" not in check.text
