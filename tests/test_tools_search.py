"""web_search against local fakes of each provider's API, and its error messages."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from bot.config import ConfigError, WebConfig, parse_config
from bot.tools import build_default_tools
from bot.tools.base import ToolContext, ToolRegistry
from bot.tools.search import WebSearchTool, parse_duckduckgo_html

DDG_HTML = """<html><body>
<div class="result results_links result--ad"><a class="result__a"
  href="https://ads.example/buy">Sponsored thing</a>
  <a class="result__snippet">buy now</a></div>
<div class="result results_links results_links_deep web-result">
  <h2 class="result__title"><a rel="nofollow" class="result__a"
    href="//duckduckgo.com/l/?uddg=https%3A%2F%2Fdocs.python.org%2F3%2F&amp;rut=abc">
    Python <b>3</b> documentation</a></h2>
  <a class="result__snippet" href="//duckduckgo.com/l/?uddg=x">The official
    <b>Python</b> docs &amp; tutorials.</a>
</div>
<div class="result results_links web-result">
  <h2 class="result__title"><a class="result__a" href="https://www.python.org/">Welcome to
    Python.org</a></h2>
  <a class="result__snippet">Home of the language.</a>
</div>
</body></html>"""


@dataclass
class Fake:
    """One provider's API on 127.0.0.1; ``requests`` holds what memobot sent."""

    base_url: str = ""
    requests: list[dict[str, Any]] = field(default_factory=list)
    status: int = 200
    delay: float = 0.0
    endless: int = 0  # searxng: stream this many 64 KB results without closing the list


def _hits(n: int, text_key: str) -> list[dict[str, str]]:
    return [
        {"title": f"Hit {i}", "url": f"https://example.org/{i}", text_key: f"about {i}"}
        for i in range(1, n + 1)
    ]


@pytest.fixture
async def fake() -> AsyncIterator[Fake]:
    state = Fake()

    async def record(request: web.Request) -> dict[str, Any]:
        body: Any = None
        if request.method == "POST":
            body = (
                await request.json()
                if request.content_type == "application/json"
                else dict(await request.post())
            )
        entry = {
            "path": request.path,
            "query": dict(request.query),
            "headers": dict(request.headers),
            "body": body,
        }
        state.requests.append(entry)
        if state.delay:
            await asyncio.sleep(state.delay)
        return entry

    def failing() -> web.Response | None:
        if state.status != 200:
            return web.json_response({"error": "nope"}, status=state.status)
        return None

    async def ddg(request: web.Request) -> web.StreamResponse:
        await record(request)
        return failing() or web.Response(text=DDG_HTML, content_type="text/html")

    async def brave(request: web.Request) -> web.StreamResponse:
        entry = await record(request)
        n = int(entry["query"].get("count", 20))
        return failing() or web.json_response({"web": {"results": _hits(n, "description")}})

    async def tavily(request: web.Request) -> web.StreamResponse:
        entry = await record(request)
        n = entry["body"].get("max_results", 5)
        return failing() or web.json_response({"results": _hits(n, "content")})

    async def searxng(request: web.Request) -> web.StreamResponse:
        await record(request)
        if state.endless:  # a broken provider that never stops answering
            resp = web.StreamResponse(headers={"Content-Type": "application/json"})
            await resp.prepare(request)
            await resp.write(b'{"results": [')
            for _ in range(state.endless):
                await resp.write(
                    b'{"title": "x", "url": "https://x", "content": "' + b"y" * 65000 + b'"},'
                )
            return resp
        return failing() or web.json_response({"results": _hits(30, "content")})

    app = web.Application()
    app.router.add_post("/html/", ddg)
    app.router.add_get("/res/v1/web/search", brave)
    app.router.add_post("/search", tavily)
    app.router.add_get("/search", searxng)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    state.base_url = f"http://127.0.0.1:{port}"
    yield state
    await runner.cleanup()


def registry(fake: Fake, timeout: float = 5, **search: Any) -> ToolRegistry:
    cfg = WebConfig.model_validate(
        {"timeoutSeconds": timeout, "search": {"baseUrl": fake.base_url, **search}}
    )
    reg = ToolRegistry()
    reg.register(WebSearchTool(cfg))
    return reg


async def search(reg: ToolRegistry, **args: Any) -> str:
    import json

    return await reg.execute("web_search", json.dumps(args), ToolContext(workspace=Path(".")))


async def test_duckduckgo_html_results_without_ads(fake: Fake) -> None:
    out = await search(registry(fake), query="python docs")
    assert fake.requests[0]["body"]["q"] == "python docs"
    assert out.splitlines()[0] == 'Results for "python docs" (duckduckgo):'
    assert "1. Python 3 documentation\n   https://docs.python.org/3/\n" in out
    assert "The official Python docs & tutorials." in out
    assert "2. Welcome to Python.org\n   https://www.python.org/" in out
    assert "Sponsored" not in out and "ads.example" not in out


async def test_brave_sends_the_key_and_count(fake: Fake) -> None:
    out = await search(registry(fake, provider="brave", apiKey="BSA-1"), query="q", count=3)
    sent = fake.requests[0]
    assert sent["path"] == "/res/v1/web/search"
    assert sent["headers"]["X-Subscription-Token"] == "BSA-1"
    assert sent["query"] == {"q": "q", "count": "3"}
    assert "3. Hit 3\n   https://example.org/3\n   about 3" in out
    assert "4. " not in out


async def test_tavily_posts_the_key_and_caps_count_at_ten(fake: Fake) -> None:
    out = await search(registry(fake, provider="tavily", apiKey="tvly-1"), query="q", count=50)
    assert fake.requests[0]["body"] == {"api_key": "tvly-1", "query": "q", "max_results": 10}
    assert "10. Hit 10" in out and "11." not in out


async def test_searxng_json_api_and_max_results_default(fake: Fake) -> None:
    out = await search(registry(fake, provider="searxng", maxResults=2), query="cats")
    assert fake.requests[0]["query"] == {"q": "cats", "format": "json"}
    assert "2. Hit 2" in out and "3. " not in out


@pytest.mark.parametrize("provider", ["brave", "tavily"])
async def test_a_missing_key_is_named_without_a_request(fake: Fake, provider: str) -> None:
    out = await search(registry(fake, provider=provider), query="q")
    assert out.startswith(f"Error: web_search ({provider}) is not set up: no API key")
    assert "tools.web.search.apiKey" in out
    assert not fake.requests


async def test_provider_errors_name_the_provider_and_the_status(fake: Fake) -> None:
    fake.status = 401
    out = await search(registry(fake, provider="brave", apiKey="bad"), query="q")
    assert out == "Error: web_search (brave) failed: HTTP 401 (the API key was refused)"
    fake.status = 503
    out = await search(registry(fake, provider="searxng"), query="q")
    assert out == "Error: web_search (searxng) failed: HTTP 503"


async def test_an_endless_answer_is_not_read_into_memory(fake: Fake) -> None:
    fake.endless = 200  # 13 MB, or more if the read were not capped
    out = await search(registry(fake, provider="searxng"), query="q")
    assert out == "Error: web_search (searxng) answered more than 2 MiB; not read"


async def test_timeout_and_unreachable(fake: Fake) -> None:
    fake.delay = 2
    out = await search(registry(fake, timeout=0.2), query="q")
    assert out == "Error: web_search (duckduckgo) timed out after 0.2 s"
    reg = registry(Fake(base_url="http://127.0.0.1:9"), provider="tavily", apiKey="k")
    out = await search(reg, query="q")
    assert out.startswith("Error: web_search (tavily) could not reach http://127.0.0.1:9")


def test_config_searxng_needs_a_base_url_and_count_limits() -> None:
    with pytest.raises(ConfigError, match="baseUrl is required for searxng"):
        parse_config({"tools": {"web": {"search": {"provider": "searxng"}}}})
    with pytest.raises(ConfigError, match="maxResults"):
        parse_config({"tools": {"web": {"search": {"maxResults": 11}}}})


def test_registered_with_the_web_tools() -> None:
    cfg = parse_config({})
    assert "web_search" in build_default_tools(cfg.tools).names
    cfg = parse_config({"tools": {"web": {"enabled": False}}})
    assert "web_search" not in build_default_tools(cfg.tools).names


def test_ddg_parser_keeps_only_http_links() -> None:
    html = '<div class="result"><a class="result__a" href="javascript:x">x</a></div>'
    assert parse_duckduckgo_html(html) == []
