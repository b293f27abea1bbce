"""The ``web_search`` tool: a query in, titles, URLs and snippets out, from one provider.

Providers (``tools.web.search.provider``): DuckDuckGo's HTML endpoint (no key; the default),
Brave Search, Tavily and a self-hosted SearXNG, each over aiohttp against an overridable
``baseUrl`` so tests and proxies can stand in for the real service. The endpoint is chosen by
the operator, never by the model, so no address policy applies here (``web_fetch`` keeps its
own for the pages the model then reads).

Parsing is pure (:func:`parse_duckduckgo_html`, :func:`parse_brave`, ...); every failure is a
short :class:`~bot.tools.base.ToolError` naming the provider and why.
"""

from __future__ import annotations

import asyncio
import json as jsonlib
import re
from dataclasses import dataclass
from html.parser import HTMLParser
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import parse_qs, urljoin, urlsplit

from bot.config import MAX_SEARCH_RESULTS, WebConfig
from bot.service.logs import redact
from bot.tools.base import Effects, Tool, ToolContext, ToolError
from bot.tools.web import decode, read_capped
from bot.urls import redact_url

if TYPE_CHECKING:
    import aiohttp

USER_AGENT = "Mozilla/5.0 (compatible; memobot/0.1; +web_search)"
DEFAULT_BASE_URLS: dict[str, str] = {
    "duckduckgo": "https://html.duckduckgo.com",
    "brave": "https://api.search.brave.com",
    "tavily": "https://api.tavily.com",
    "searxng": "",  # self-hosted: the config must name it
}
SNIPPET_CHARS = 400
MAX_ANSWER_BYTES = 2 * 2**20  # a search answer is a few KB; more is a broken provider
_SPACES = re.compile(r"\s+")


@dataclass(frozen=True, slots=True)
class SearchResult:
    title: str
    url: str
    snippet: str


def _clean(text: Any, limit: int = SNIPPET_CHARS) -> str:
    out = _SPACES.sub(" ", str(text or "")).strip()
    return out if len(out) <= limit else out[: limit - 1].rstrip() + "…"


def format_results(query: str, provider: str, results: list[SearchResult]) -> str:
    """The tool result: a numbered list the model can cite and pass to ``web_fetch``."""
    if not results:
        return f'No results for "{query}" ({provider}).'
    lines = [f'Results for "{query}" ({provider}):']
    for n, r in enumerate(results, 1):
        lines.append(f"\n{n}. {r.title or '(no title)'}\n   {r.url}")
        if r.snippet:
            lines.append(f"   {r.snippet}")
    return "\n".join(lines)


# -- parsers (pure) ---------------------------------------------------------------------------


def _ddg_target(href: str) -> str:
    """The real URL behind a DuckDuckGo result link (``//duckduckgo.com/l/?uddg=...``)."""
    parts = urlsplit(urljoin("https://duckduckgo.com/", href))
    if parts.path == "/l/" and "uddg" in (query := parse_qs(parts.query)):
        return query["uddg"][0]
    return parts.geturl()


class _DuckDuckGoParser(HTMLParser):
    """Collects ``a.result__a`` (title, link) and ``.result__snippet`` of each organic result;
    ads (``result--ad``) are skipped."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.results: list[dict[str, str]] = []
        self._field: str | None = None
        self._depth = 0
        self._ad = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        classes = (a.get("class") or "").split()
        if tag == "div" and "result" in classes:
            self._ad = "result--ad" in classes
        if self._ad:
            return
        if self._field is not None:
            self._depth += 1
        elif "result__a" in classes:
            self.results.append({"title": "", "url": _ddg_target(a.get("href") or ""), "s": ""})
            self._field, self._depth = "title", 0
        elif "result__snippet" in classes and self.results:
            self._field, self._depth = "s", 0

    def handle_endtag(self, tag: str) -> None:
        if self._field is None:
            return
        if self._depth:
            self._depth -= 1
        else:
            self._field = None

    def handle_data(self, data: str) -> None:
        if self._field is not None and self.results:
            self.results[-1][self._field] += data


def parse_duckduckgo_html(html: str) -> list[SearchResult]:
    parser = _DuckDuckGoParser()
    parser.feed(html)
    parser.close()
    return [
        SearchResult(_clean(r["title"], 200), r["url"], _clean(r["s"]))
        for r in parser.results
        if r["url"].startswith(("http://", "https://"))
    ]


def _items(data: Any, *path: str) -> list[dict[str, Any]]:
    for key in path:
        data = data.get(key) if isinstance(data, dict) else None
    return [d for d in data if isinstance(d, dict)] if isinstance(data, list) else []


def parse_brave(data: Any) -> list[SearchResult]:
    return [
        SearchResult(
            _clean(r.get("title"), 200), str(r.get("url", "")), _clean(r.get("description"))
        )
        for r in _items(data, "web", "results")
    ]


def parse_results(data: Any) -> list[SearchResult]:
    """Tavily's and SearXNG's answer: ``{"results": [{"title", "url", "content"}]}``."""
    return [
        SearchResult(_clean(r.get("title"), 200), str(r.get("url", "")), _clean(r.get("content")))
        for r in _items(data, "results")
    ]


# -- the tool ---------------------------------------------------------------------------------


class SearchFailed(ToolError):
    """A provider did not answer usefully; the message names the provider and why."""


class WebSearchTool(Tool):
    name: ClassVar[str] = "web_search"
    effects: ClassVar[Effects] = Effects(network=True)
    description: ClassVar[str] = (
        "Search the web. Returns a numbered list of results, each with title, URL and "
        "snippet. Read a result with web_fetch."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "What to search for"},
            "count": {
                "type": "integer",
                "description": f"How many results (1-{MAX_SEARCH_RESULTS}; default 5)",
            },
        },
        "required": ["query"],
    }

    def __init__(self, cfg: WebConfig) -> None:
        self.cfg = cfg
        self.search = cfg.search

    @property
    def base_url(self) -> str:
        return (self.search.base_url or DEFAULT_BASE_URLS[self.search.provider]).rstrip("/")

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        query = args["query"].strip()
        if not query:
            raise ToolError("query must not be empty")
        count = args.get("count", self.search.max_results)
        if count < 1:
            raise ToolError("count must be 1 or more")
        count = min(count, MAX_SEARCH_RESULTS)
        provider = self.search.provider
        if provider in ("brave", "tavily") and not self.search.api_key:
            raise SearchFailed(
                f"web_search ({provider}) is not set up: no API key. Set "
                "tools.web.search.apiKey in the config (or ${VAR} for an environment variable)."
            )
        try:
            async with asyncio.timeout(self.cfg.timeout_seconds):
                results = await self._search(query, count)
        except TimeoutError:
            raise SearchFailed(
                f"web_search ({provider}) timed out after {self.cfg.timeout_seconds:g} s"
            ) from None
        return format_results(query, provider, results[:count])

    async def _search(self, query: str, count: int) -> list[SearchResult]:
        import aiohttp

        s = self.search
        provider = s.provider
        # trust_env=False, as web_fetch: the endpoint is exactly the configured one.
        async with aiohttp.ClientSession(
            headers={"User-Agent": USER_AGENT}, trust_env=False
        ) as session:
            try:
                if provider == "duckduckgo":
                    form = {"q": query, "kl": "wt-wt"}
                    async with session.post(f"{self.base_url}/html/", data=form) as resp:
                        text = await self._body(resp, json=False)
                    return parse_duckduckgo_html(text)
                if provider == "brave":
                    headers = {"X-Subscription-Token": s.api_key, "Accept": "application/json"}
                    params = {"q": query, "count": str(count)}
                    url = f"{self.base_url}/res/v1/web/search"
                    async with session.get(url, params=params, headers=headers) as resp:
                        return parse_brave(await self._body(resp, json=True))
                if provider == "tavily":
                    payload = {"api_key": s.api_key, "query": query, "max_results": count}
                    async with session.post(f"{self.base_url}/search", json=payload) as resp:
                        return parse_results(await self._body(resp, json=True))
                params = {"q": query, "format": "json"}
                async with session.get(f"{self.base_url}/search", params=params) as resp:
                    return parse_results(await self._body(resp, json=True))
            except aiohttp.ClientError as exc:
                raise SearchFailed(
                    # The model reads this: a private instance's user:password@ stays out.
                    f"web_search ({provider}) could not reach {redact_url(self.base_url)}: "
                    f"{type(exc).__name__}: {redact(str(exc))}"
                ) from None

    async def _body(self, resp: aiohttp.ClientResponse, json: bool) -> Any:
        """The answer's text (or parsed JSON), read up to MAX_ANSWER_BYTES: a provider that
        answers without end must not fill memobot's memory."""
        provider = self.search.provider
        if resp.status != 200:
            why = {401: "the API key was refused", 403: "access denied", 429: "rate limited"}
            extra = f" ({why[resp.status]})" if resp.status in why else ""
            raise SearchFailed(f"web_search ({provider}) failed: HTTP {resp.status}{extra}")
        body, more = await read_capped(resp, MAX_ANSWER_BYTES)
        if more:
            raise SearchFailed(
                f"web_search ({provider}) answered more than {MAX_ANSWER_BYTES // 2**20} MiB; "
                "not read"
            )
        text = decode(body, resp.charset)
        if not json:
            return text
        try:
            return jsonlib.loads(text)
        except ValueError as exc:
            raise SearchFailed(
                f"web_search ({provider}) returned an answer that is not valid JSON: {exc}"
            ) from None
