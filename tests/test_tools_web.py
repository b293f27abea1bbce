"""web_fetch: the address policy, SSRF refusals and real fetches from local aiohttp servers.

Nothing here leaves 127.0.0.0/8: a socket audit hook records every connect() made during these
tests and blocks any to another address, and the autouse guard fails a test that tried. The
same log proves that a refused address was never connected to: the policy runs before the
socket is opened.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from aiohttp import web

from bot.config import WebConfig
from bot.tools.base import ToolContext, ToolRegistry
from bot.tools.web import IPAddress, WebFetchTool, html_to_text, is_forbidden_address

# ---------------------------------------------------------------------------------------------
# Network guard

_connects: list[Any] = []
_recording = False


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _recording and event == "socket.connect":
        _connects.append(args[1])
        if isinstance(args[1], tuple) and not _is_loopback(args[1]):
            # Abort the connect itself: a regression must not reach a real host.
            raise PermissionError(f"test network guard: connect to {args[1]!r} blocked")


sys.addaudithook(_audit)  # hooks cannot be removed; it records only while a test here runs


def _is_loopback(address: Any) -> bool:
    return isinstance(address, tuple) and ipaddress.ip_address(address[0]).is_loopback


@pytest.fixture(autouse=True)
def network_guard() -> Iterator[list[Any]]:
    global _recording
    _connects.clear()
    _recording = True
    try:
        yield _connects
    finally:
        _recording = False
    left = [a for a in _connects if isinstance(a, tuple) and not _is_loopback(a)]
    assert not left, f"test tried to connect outside 127.0.0.0/8: {left}"


def connected_hosts() -> set[str]:
    return {a[0] for a in _connects if isinstance(a, tuple)}


# ---------------------------------------------------------------------------------------------
# Local servers

PAGE = """<!doctype html>
<html><head><title>Test  Page</title>
<style>body { color: red }</style>
<script>var secretScript = "do not show";</script></head>
<body>
<nav><a href="/">Home</a> | <a href="/about">About</a> NAVTEXT</nav>
<h1>Main   heading</h1>
<p>First paragraph with a <a href="/docs/intro">link to docs</a>.</p>
<ul><li>apple</li><li>banana</li></ul>
<script>alert("inline")</script>
</body></html>
"""


@dataclass
class Server:
    base: str
    hits: dict[str, int] = field(default_factory=dict)


def _app(hits: dict[str, int]) -> web.Application:
    async def count(request: web.Request, handler: Any) -> web.StreamResponse:
        hits[request.path] = hits.get(request.path, 0) + 1
        return await handler(request)

    def redirect(target: str) -> Any:
        async def handler(request: web.Request) -> web.Response:
            raise web.HTTPFound(target)

        return handler

    async def go(request: web.Request) -> web.Response:
        raise web.HTTPFound(request.query["to"])

    async def page(request: web.Request) -> web.Response:
        return web.Response(text=PAGE, content_type="text/html")

    async def big(request: web.Request) -> web.Response:
        return web.Response(text="y" * 50_000, content_type="text/plain")

    async def long(request: web.Request) -> web.Response:
        return web.Response(text="z" * 3000, content_type="text/plain")

    async def data(request: web.Request) -> web.Response:
        return web.json_response({"name": "memobot", "items": [1, 2]})

    async def image(request: web.Request) -> web.Response:
        return web.Response(body=b"\x89PNG\r\n\x1a\nBINARYDATA", content_type="image/png")

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(10)
        return web.Response(text="too late")

    async def missing(request: web.Request) -> web.Response:
        return web.Response(status=404, text="no such page", content_type="text/plain")

    app = web.Application(middlewares=[web.middleware(count)])
    app.router.add_get("/page", page)
    app.router.add_get("/big", big)
    app.router.add_get("/long", long)
    app.router.add_get("/data.json", data)
    app.router.add_get("/image.png", image)
    app.router.add_get("/slow", slow)
    app.router.add_get("/missing", missing)
    app.router.add_get("/to-page", redirect("/page"))
    app.router.add_get("/go", go)
    app.router.add_get("/loop", redirect("/loop"))
    return app


async def _start(host: str) -> tuple[web.AppRunner, Server]:
    hits: dict[str, int] = {}
    # handler_cancellation: the slow handler ends when web_fetch gives up, not at teardown.
    runner = web.AppRunner(_app(hits), handler_cancellation=True, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, host, 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, Server(f"http://{host}:{port}", hits)


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    runner, srv = await _start("127.0.0.1")
    yield srv
    await runner.cleanup()


@pytest.fixture
async def other_server() -> AsyncIterator[Server]:
    """A second server on 127.0.0.2: stands for an internal host the policy forbids."""
    runner, srv = await _start("127.0.0.2")
    yield srv
    await runner.cleanup()


# ---------------------------------------------------------------------------------------------
# Helpers


CTX = ToolContext(workspace=Path("/nonexistent-workspace"))
LOCAL = ipaddress.ip_address("127.0.0.1")


class RecordingPolicy:
    """Allows exactly 127.0.0.1 (the test server) and is otherwise the strict default."""

    def __init__(self) -> None:
        self.seen: list[IPAddress] = []

    def __call__(self, ip: IPAddress) -> str | None:
        self.seen.append(ip)
        return None if ip == LOCAL else is_forbidden_address(ip)


async def fetch(
    url: str, policy: Any = None, *, arg_max_chars: int | None = None, **cfg: Any
) -> str:
    """Call web_fetch through the registry; ``cfg`` are WebConfig fields."""
    if policy is None:
        tool = WebFetchTool(WebConfig(**cfg))
    else:
        tool = WebFetchTool(WebConfig(**cfg), address_policy=policy)
    registry = ToolRegistry()
    registry.register(tool)
    args: dict[str, Any] = {"url": url}
    if arg_max_chars is not None:
        args["max_chars"] = arg_max_chars
    return await registry.execute("web_fetch", json.dumps(args), CTX)


def go(server: Server, target: str) -> str:
    """A URL on ``server`` that redirects to ``target``."""
    return f"{server.base}/go?to={quote(target, safe='')}"


def fake_dns(
    monkeypatch: pytest.MonkeyPatch, answers: dict[str, list[list[str]]]
) -> dict[str, int]:
    """Make ``loop.getaddrinfo`` answer ``answers[host][n]`` on the n-th lookup of ``host``."""
    loop = asyncio.get_running_loop()
    real = loop.getaddrinfo
    calls: dict[str, int] = {}

    async def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host not in answers:
            return await real(host, port, *args, **kwargs)
        n = calls.get(host, 0)
        calls[host] = n + 1
        ips = answers[host][min(n, len(answers[host]) - 1)]
        return [
            (socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_STREAM, 6, "",
             (ip, int(port)))
            for ip in ips
        ]  # fmt: skip

    monkeypatch.setattr(loop, "getaddrinfo", getaddrinfo)
    return calls


# ---------------------------------------------------------------------------------------------
# The address policy


@pytest.mark.parametrize(
    ("ip", "word"),
    [
        ("127.0.0.1", "loopback"),
        ("127.8.9.10", "loopback"),
        ("::1", "loopback"),
        ("::ffff:127.0.0.1", "loopback"),
        ("169.254.169.254", "metadata"),
        ("169.254.1.1", "link-local"),
        ("fe80::1", "link-local"),
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("172.31.255.255", "private"),
        ("192.168.1.1", "private"),
        ("::ffff:192.168.1.1", "private"),
        ("fc00::1", "private"),
        ("fd12:3456::1", "private"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("100.64.0.1", "CGNAT"),
        ("100.127.255.254", "CGNAT"),
        ("224.0.0.1", "multicast"),
        ("ff02::1", "multicast"),
        ("240.0.0.1", "reserved"),
        ("255.255.255.255", ""),
        ("192.0.2.1", ""),  # documentation range
        ("2002:7f00:1::", "loopback"),  # 6to4 wrapping 127.0.0.1
        ("64:ff9b::a9fe:a9fe", "metadata"),  # NAT64 wrapping 169.254.169.254
    ],
)
def test_policy_forbids(ip: str, word: str) -> None:
    reason = is_forbidden_address(ip)
    assert reason is not None
    assert word in reason
    assert is_forbidden_address(ipaddress.ip_address(ip)) == reason


@pytest.mark.parametrize(
    "ip", ["8.8.8.8", "1.1.1.1", "93.184.216.34", "2606:4700:4700::1111", "::ffff:8.8.8.8",
           "172.32.0.1", "100.128.0.1"],
)  # fmt: skip
def test_policy_allows_public_addresses(ip: str) -> None:
    assert is_forbidden_address(ip) is None


# ---------------------------------------------------------------------------------------------
# (a) The default tool refuses before connecting


async def test_default_refuses_loopback_server(server: Server) -> None:
    out = await fetch(f"{server.base}/page")
    assert out.startswith("Error: refused to fetch") and "loopback" in out
    assert server.hits == {}
    assert not _connects


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data",
        "http://[::1]/",
        "http://[::ffff:127.0.0.1]/",
        "http://10.1.2.3/",
        "http://0.0.0.0/",
        "http://100.64.0.1/",
        "http://127.1/",  # legacy short form
        "http://2130706433/",  # 127.0.0.1 as one number
        "http://0x7f.1/",  # hex form, resolved by getaddrinfo
        "https://localhost/",
    ],
)
async def test_default_refuses_internal_addresses(url: str) -> None:
    out = await fetch(url)
    assert out.startswith("Error:") and ("refused" in out or "not a valid IP" in out), out
    assert not _connects


async def test_default_refuses_localhost_with_port(server: Server) -> None:
    port = server.base.rsplit(":", 1)[1]
    out = await fetch(f"http://localhost:{port}/page")
    assert "refused" in out and "loopback" in out
    assert server.hits == {}


async def test_default_refuses_names_that_resolve_inside(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake_dns(
        monkeypatch,
        {"intranet.example": [["127.0.0.1"]], "mixed.example": [["93.184.216.34", "10.0.0.7"]]},
    )
    out = await fetch("http://intranet.example/")
    assert "refused" in out and "intranet.example is 127.0.0.1" in out
    # One bad address among good ones is enough to refuse the host.
    assert "10.0.0.7" in await fetch("http://mixed.example/")
    assert not _connects


@pytest.mark.parametrize(
    "url", ["file:///etc/passwd", "ftp://example.com/file", "gopher://x/", "example.com/page",
            "javascript:alert(1)"],
)  # fmt: skip
async def test_refuses_other_schemes(url: str) -> None:
    out = await fetch(url)
    assert out.startswith("Error: only http and https URLs can be fetched"), out
    assert not _connects


# ---------------------------------------------------------------------------------------------
# (b) With 127.0.0.1 allowed: real fetches


async def test_html_becomes_readable_text(server: Server) -> None:
    out = await fetch(f"{server.base}/page", RecordingPolicy())
    assert out.startswith(f"URL: {server.base}/page\nStatus: 200\n\n")
    assert "Title: Test Page" in out
    assert "# Main heading" in out
    assert f"[link to docs]({server.base}/docs/intro)" in out
    assert "- apple\n- banana" in out
    for hidden in ("secretScript", "alert", "color: red", "NAVTEXT", "<p>"):
        assert hidden not in out


async def test_json_and_plain_text_are_returned_as_is(server: Server) -> None:
    out = await fetch(f"{server.base}/data.json", RecordingPolicy())
    assert out.endswith('\n\n{"name": "memobot", "items": [1, 2]}')
    out = await fetch(f"{server.base}/missing", RecordingPolicy())
    assert "Status: 404" in out and out.endswith("no such page")


async def test_other_content_is_only_described(server: Server) -> None:
    out = await fetch(f"{server.base}/image.png", RecordingPolicy())
    assert "image/png" in out and "not text" in out
    assert "BINARYDATA" not in out


async def test_big_body_stops_at_max_bytes(server: Server) -> None:
    out = await fetch(f"{server.base}/big", RecordingPolicy(), max_bytes=5000)
    assert out.split("\n\n")[1] == "y" * 5000
    assert "download stopped at 5000 bytes" in out


async def test_text_is_cut_to_max_chars(server: Server) -> None:
    out = await fetch(f"{server.base}/long", RecordingPolicy(), arg_max_chars=500)
    assert out.count("z") == 500 and "text cut to 500 of 3000 characters" in out
    # The argument cannot raise the configured ceiling.
    out = await fetch(f"{server.base}/long", RecordingPolicy(), arg_max_chars=10**6, max_chars=1000)
    assert out.count("z") == 1000 and "text cut to 1000 of 3000 characters" in out
    assert "Error: max_chars" in await fetch(f"{server.base}/long", arg_max_chars=0)


async def test_slow_server_times_out(server: Server) -> None:
    started = asyncio.get_running_loop().time()
    out = await fetch(f"{server.base}/slow", RecordingPolicy(), timeout_seconds=0.5)
    assert out.startswith("Error: timed out after 0.5 s")
    assert asyncio.get_running_loop().time() - started < 3


async def test_redirects_are_followed(server: Server) -> None:
    out = await fetch(f"{server.base}/to-page", RecordingPolicy())
    assert out.startswith(f"URL: {server.base}/page\nStatus: 200")
    assert f"Redirected from: {server.base}/to-page" in out
    assert "Title: Test Page" in out


async def test_redirect_to_metadata_is_refused_before_connecting(server: Server) -> None:
    policy = RecordingPolicy()
    out = await fetch(go(server, "http://169.254.169.254/latest/meta-data"), policy)
    assert out.startswith("Error: refused to fetch http://169.254.169.254/latest/meta-data")
    assert "metadata" in out
    assert ipaddress.ip_address("169.254.169.254") in policy.seen
    assert connected_hosts() == {"127.0.0.1"}


async def test_redirect_to_another_scheme_is_refused(server: Server) -> None:
    out = await fetch(go(server, "file:///etc/passwd"), RecordingPolicy())
    assert out.startswith("Error: only http and https URLs can be fetched")


async def test_redirect_loops_stop(server: Server) -> None:
    out = await fetch(f"{server.base}/loop", RecordingPolicy())
    assert out.startswith("Error: too many redirects")
    assert server.hits["/loop"] == 6  # the first request and five redirects


# ---------------------------------------------------------------------------------------------
# (c) Redirect hops and DNS answers are checked, and only checked addresses are used


async def test_redirect_to_forbidden_internal_host_never_connects(
    server: Server, other_server: Server
) -> None:
    # The first hop (127.0.0.1) is allowed; the redirect points at 127.0.0.2, which is not,
    # and a live server there would notice any request or connection.
    target = f"{other_server.base}/page"
    out = await fetch(go(server, target), RecordingPolicy())
    assert out.startswith(f"Error: refused to fetch {target}") and "loopback" in out
    assert server.hits == {"/go": 1}
    assert other_server.hits == {}
    assert connected_hosts() == {"127.0.0.1"}


async def test_dns_rebinding_cannot_switch_the_address(
    server: Server, other_server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    # First answer: the allowed 127.0.0.1. Any later lookup would say 127.0.0.2.
    calls = fake_dns(monkeypatch, {"rebind.test": [["127.0.0.1"], ["127.0.0.2"]]})
    port = server.base.rsplit(":", 1)[1]
    out = await fetch(f"http://rebind.test:{port}/page", RecordingPolicy())
    assert "Status: 200" in out and "Title: Test Page" in out
    assert calls == {"rebind.test": 1}
    assert other_server.hits == {} and "127.0.0.2" not in connected_hosts()


# ---------------------------------------------------------------------------------------------
# HTML conversion and cold start


def test_html_to_text_structure() -> None:
    html = (
        "<title>T</title><h2>Sub</h2><p>a  b\n c</p><pre>  x = 1\n    y</pre>"
        "<p>one<br>two</p><table><tr><td>c1</td><td>c2</td></tr></table>"
        '<a href="https://e.com/">https://e.com/</a><a href="#top">Top</a>'
        "<noscript>NS</noscript><p>&amp; &lt;ok&gt;</p>"
    )
    assert html_to_text(html, "https://e.com/") == (
        "Title: T\n\n## Sub\n\na b c\n\n  x = 1\n    y\n\none\ntwo\n\nc1 c2\n\n"
        "https://e.com/Top\n\n& <ok>"
    )


def test_importing_the_tools_does_not_load_aiohttp() -> None:
    code = (
        "import sys\n"
        "from bot.config import ToolsConfig\n"
        "from bot.tools import build_default_tools\n"
        "build_default_tools(ToolsConfig())\n"
        "print('aiohttp' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
