"""The panel's Usage screen: today's and this month's totals and a chosen range grouped, the
same figures as ``memobot usage`` (``bot.spend.report``), read from the ledger on disk."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

from bot.config import load_config
from bot.spend.ledger import month_file
from bot.spend.record import CallRecord, now_utc
from tests.helpers import config_dict
from tests.helpers.web import browsing, panel_section

NO_LLM = "http://127.0.0.1:9/v1"


def write(state: Path, *records: CallRecord) -> None:
    for rec in records:
        path = month_file(state, rec.month)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("ab") as fh:
            fh.write(rec.line())


def cells(page: str) -> list[list[str]]:
    """The rows of the page's table, as text."""
    rows = re.findall(r"<tr>(.*?)</tr>", page, re.S)
    found = [[html.unescape(c) for c in re.findall(r"<td>(.*?)</td>", r, re.S)] for r in rows]
    return [row for row in found if row]  # the head's row has no cells


async def test_usage_shows_today_this_month_and_a_chosen_range_grouped(tmp_path: Path) -> None:
    data = config_dict(tmp_path, NO_LLM, web=panel_section(), agent={"timezone": "UTC"})
    config = tmp_path / "config.json"
    config.write_text(json.dumps(data))
    cfg, _ = load_config(config)
    now = now_utc()
    write(
        cfg.agent.state_path,
        CallRecord("a", now, "telegram:1", "turn", "gpt-4o", "e", 1000, 200, 0, False, 0.5, "USD"),
        CallRecord(
            "b", now, "cli:t", "tool_iteration", "<b>x</b>", "e", 10, 5, 0, True, None, None
        ),
        CallRecord(
            "c", "2020-03-05T10:00:00Z", "cli:t", "dream", "old", "e", 7, 3, 0, False, None, None
        ),
    )
    async with browsing(cfg, config) as b:
        await b.login()
        status, page, _ = await b.get("/usage")
        assert status == 200
        assert "Today</dt><dd>2 calls, 1,215 tokens" in page
        assert "This month</dt><dd>2 calls" in page and "0.5000 USD" in page
        assert cells(page) == [
            ["turn", "1", "1,000", "0", "200", "0.5000 USD"],
            ["tool_iteration", "1", "10", "0", "5", "-"],
            ["total", "2", "1,010", "0", "205", "0.5000 USD"],
        ]
        assert "1 call without usage from the provider" in page

        _, page, _ = await b.get("/usage?by=model")
        assert "&lt;b&gt;x&lt;/b&gt;" in page and "<b>x</b>" not in page  # text, never markup

        _, page, _ = await b.get("/usage?since=2020-03-01&until=2020-03-31&by=model")
        assert "2020-03-01 to 2020-03-31" in page
        assert cells(page) == [["old", "1", "7", "0", "3", "-"], ["total", "1", "7", "0", "3", "-"]]
        assert 'value="model" selected' in page

        status, page, _ = await b.get("/usage?since=soon&by=nonsense")
        assert status == 200 and "expected YYYY-MM-DD, today" in page
        assert "<th>Purpose</th>" in page  # an unknown grouping is the default one
