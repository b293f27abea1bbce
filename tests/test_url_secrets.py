"""A base URL's credentials (``https://user:pass@host/v1``, ``?key=``, ``?api_key=``) never
show in what memobot prints or logs, and such a URL works (issue 27, finding 9)."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from bot.config import WebConfig
from bot.service.logs import redact
from bot.session import SessionStore
from bot.tools.base import ToolContext, ToolRegistry
from bot.tools.search import WebSearchTool
from bot.workspace import init_workspace
from tests.fakes.llm_server import FakeLLM, FakeLLMThread
from tests.helpers import closed_port, config_dict, run_memobot, zygote

PASSWORD = "S3cretPassw0rd"
QUERY_KEY = "QueryKey4242"
API_KEY_PARAM = "ParamKey9999"
SECRETS = (PASSWORD, QUERY_KEY, API_KEY_PARAM)


@pytest.fixture
def llm() -> Iterator[FakeLLMThread]:
    with FakeLLM.start_in_thread() as server:
        yield server


def secret_url(base_url: str) -> str:
    """``base_url`` (http://127.0.0.1:PORT/v1) with a user, a password and two query keys."""
    with_user = base_url.replace("http://", f"http://alice:{PASSWORD}@")
    return f"{with_user}?key={QUERY_KEY}&api_key={API_KEY_PARAM}"


def setup(tmp_path: Path, base_url: str, api_key: str = "") -> Path:
    data = config_dict(tmp_path, base_url, llm={"apiKey": api_key})
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(data))
    os.chmod(cfg, 0o600)
    init_workspace(tmp_path / "ws")
    (tmp_path / "state").mkdir(mode=0o700)
    return cfg


def assert_hidden(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text, text


def test_status_hides_the_credentials(tmp_path: Path) -> None:
    cfg = setup(tmp_path, secret_url(f"http://127.0.0.1:{closed_port()}/v1"))
    result = run_memobot("status", config=cfg)
    assert result.returncode == 0, result.stderr
    assert_hidden(result.stdout + result.stderr)
    [model] = [line for line in result.stdout.splitlines() if line.startswith("model")]
    assert "@ http://***@127.0.0.1:" in model and "?key=***&api_key=***" in model


def test_doctor_hides_the_credentials_and_reaches_the_model(
    tmp_path: Path, llm: FakeLLMThread
) -> None:
    cfg = setup(tmp_path, secret_url(llm.base_url))
    env = {"MEMOBOT_UNIT_DIR": str(tmp_path / "units")}
    result = run_memobot("doctor", config=cfg, env=env)
    assert_hidden(result.stdout + result.stderr)
    assert "✓ LLM http://***@127.0.0.1:" in result.stdout, result.stdout
    assert "model fake-model answered" in result.stdout
    assert "✓ clock: within" in result.stdout  # the Date probe reached the server too


def test_agent_sends_the_credentials_as_basic_auth_and_query(
    tmp_path: Path, llm: FakeLLMThread
) -> None:
    cfg = setup(tmp_path, secret_url(llm.base_url))
    result = run_memobot("agent", "-m", "hi", config=cfg)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "echo: hi"
    assert_hidden(result.stdout + result.stderr)
    [request] = llm.requests
    basic = base64.b64encode(f"alice:{PASSWORD}".encode()).decode()
    assert request["headers"]["authorization"] == f"Basic {basic}"
    assert request["path"] == "/v1/chat/completions"
    assert request["query"] == {"key": QUERY_KEY, "api_key": API_KEY_PARAM}
    # The model's label kept with the answer ("model @ endpoint") carries no credential.
    stored = json.dumps(SessionStore(tmp_path / "state").history("cli:direct"))
    assert "answered_by" in stored
    assert_hidden(stored)


def test_unreachable_endpoint_error_and_log_hide_the_credentials(tmp_path: Path) -> None:
    cfg = setup(tmp_path, secret_url(f"http://127.0.0.1:{closed_port()}/v1"))
    result = run_memobot("-v", "agent", "-m", "hi", config=cfg)
    assert "cannot reach the LLM endpoint http://127.0.0.1:" in result.stderr, result.stderr
    assert_hidden(result.stdout + result.stderr)


def test_credentials_and_an_api_key_are_refused_at_load(tmp_path: Path) -> None:
    cfg = setup(tmp_path, secret_url(f"http://127.0.0.1:{closed_port()}/v1"), "sk-test-0000")
    for command in (("status",), ("agent", "-m", "hi")):
        result = run_memobot(*command, config=cfg)
        assert result.returncode == 78, result.stdout + result.stderr
        assert "llm.baseUrl carries a user name and password" in result.stderr
        assert_hidden(result.stdout + result.stderr)


def test_credentials_from_the_environment_and_a_key_are_refused(tmp_path: Path) -> None:
    cfg = setup(tmp_path, "")
    env = {
        **os.environ,
        "OPENAI_BASE_URL": secret_url(f"http://127.0.0.1:{closed_port()}/v1"),
        "OPENAI_API_KEY": "sk-test-0000",
    }
    result = zygote.run(["--config", str(cfg), "agent", "-m", "hi"], timeout=60, env=env)
    assert result.returncode == 78, result.stdout + result.stderr
    assert "OPENAI_BASE_URL" in result.stderr and "Authorization header" in result.stderr
    assert_hidden(result.stdout + result.stderr)


def test_log_lines_hide_key_like_query_values_and_url_passwords() -> None:
    line = redact(
        "POST https://h/v1/x?api-version=2024-02-01&key=abc123456&access_token=zz9 "
        "via http://bob:hunter2@proxy:3128 failed"
    )
    assert "abc123456" not in line and "zz9" not in line and "hunter2" not in line
    assert "api-version=2024-02-01" in line and "key=***" in line and "http://***@proxy" in line


async def test_web_search_errors_to_the_model_hide_the_credentials() -> None:
    base = f"http://alice:{PASSWORD}@127.0.0.1:{closed_port()}?key={QUERY_KEY}"
    cfg = WebConfig.model_validate({"search": {"provider": "searxng", "baseUrl": base}})
    registry = ToolRegistry()
    registry.register(WebSearchTool(cfg))
    out = await registry.execute("web_search", '{"query": "q"}', ToolContext(workspace=Path(".")))
    assert out.startswith("Error: web_search (searxng) could not reach http://***@127.0.0.1:")
    assert_hidden(out)
