"""The Settings and Access screens attacked: a secret echoed by an error, a save over a file
the panel could not read, a hand edit lost to a stale form, a ``${VAR}`` written out
expanded, nesting deeper than the parser goes, a stranger's name and a flood of strangers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bot.config import load_config
from bot.web.config_form import MASK
from tests.helpers import config_dict
from tests.helpers.web import browsing, panel_section

NO_LLM = "http://127.0.0.1:9/v1"
PAT = "ghp_PLAINsecretOF40chars"  # a name no secret-name rule knows: only its map says so


def _write(tmp_path: Path, **extra: Any) -> tuple[Path, dict[str, Any]]:
    data = config_dict(tmp_path, NO_LLM, web=panel_section())
    data["channels"] = {"telegram": {"token": "${TG_TOKEN}", "allowFrom": ["1001"]}}
    data["tools"]["mcpServers"] = {"gh": {"command": "gh-mcp", "env": {"GH_PAT": PAT}}}
    data.update(extra)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path, data


async def test_a_refused_mcp_server_is_not_echoed_with_its_environment(tmp_path, monkeypatch):
    """The env value is shown masked; a save that drops the command sent it back unmasked
    to the validator, whose error quoted the server (env and all) to the page."""
    monkeypatch.setenv("TG_TOKEN", "123:SECRETfromENV")
    config, _ = _write(tmp_path)
    before = config.read_bytes()
    cfg, _ = load_config(config)
    async with browsing(cfg, config) as b:
        await b.login()
        _, page, _ = await b.get("/settings/tools")
        assert PAT not in page
        csrf = await b.csrf("/settings/tools")
        servers = json.dumps({"gh": {"env": {"GH_PAT": MASK}}})  # the command deleted
        form = {"csrf": csrf, "tools.mcpServers": servers}
        status, page, _ = await b.post("/settings/tools", form)
        assert status == 422 and "set either command" in page
        assert PAT not in page and "PLAINsecret" not in page
    assert config.read_bytes() == before
