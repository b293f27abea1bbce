"""The ``web_fetch`` tool: fetch an http(s) page as readable text, without reaching inside.

SSRF defence, in the order a fetch meets it:

1. Only ``http`` and ``https`` URLs, on the first request and on every redirect hop (redirects
   are followed here, at most :data:`MAX_REDIRECTS`, never by aiohttp).
2. Before each hop connects, its host is resolved (``loop.getaddrinfo``, off the event loop)
   and *every* address must pass the address policy (default :func:`is_forbidden_address`:
   only globally routable unicast addresses).
3. aiohttp connects only to those checked addresses: its resolver is replaced by one that
   answers from the checked list, so a second DNS answer (rebinding) is never asked for.

aiohttp is imported inside the tool so a cold start that never fetches does not load it.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
from collections.abc import Callable
from functools import cache
from html.parser import HTMLParser
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import urljoin

from bot.config import WebConfig
from bot.tools.base import Effects, Tool, ToolContext, ToolError

if TYPE_CHECKING:
    import aiohttp
    from aiohttp.abc import ResolveResult
    from yarl import URL

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
# Returns why an address must not be fetched from, or None when it may be.
AddressPolicy = Callable[[IPAddress], str | None]

MAX_REDIRECTS = 5
USER_AGENT = "memobot/0.1 (+web_fetch)"
_REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
_READ_CHUNK = 65536

_CGNAT = ipaddress.ip_network("100.64.0.0/10")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_METADATA = ipaddress.ip_address("169.254.169.254")


def _embedded_ipv4(addr: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one stands for (mapped, 6to4, NAT64), if any."""
    if addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    if addr.sixtofour is not None:
        return addr.sixtofour
    if addr in _NAT64:
        return ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
    return None


def is_forbidden_address(ip: str | IPAddress) -> str | None:
    """Why ``ip`` must not be fetched from (e.g. ``"loopback address"``), or None if public.

    Refuses loopback, unspecified, link-local (including the 169.254.169.254 metadata service),
    multicast, private (10/8, 172.16/12, 192.168/16, fc00::/7), CGNAT 100.64/10, reserved and
    every other non-global range, also when written as IPv4-mapped/6to4/NAT64 IPv6.
    """
    addr = ipaddress.ip_address(ip) if isinstance(ip, str) else ip
    if isinstance(addr, ipaddress.IPv6Address):
        inner = _embedded_ipv4(addr)
        if inner is not None:
            reason = is_forbidden_address(inner)
            return f"{reason} (as IPv6 {addr})" if reason else None
    checks: list[tuple[bool, str]] = [
        (addr.is_loopback, "loopback address"),
        (addr.is_unspecified, "unspecified address"),
        (addr == _METADATA, "link-local address (cloud metadata service)"),
        (addr.is_link_local, "link-local address"),
        (addr.is_multicast, "multicast address"),
        (addr in _CGNAT, "shared (CGNAT) address"),
        (addr.is_reserved, "reserved address"),
        (addr.is_private, "private address"),
        (not addr.is_global, "non-public address"),
    ]
    return next((reason for hit, reason in checks if hit), None)


# ---------------------------------------------------------------------------------------------
# HTML to text

_SKIP_TAGS = frozenset(
    {"script", "style", "nav", "noscript", "template", "svg", "iframe", "canvas"}
)
_BLOCK_TAGS = frozenset(
    {
        "p", "div", "section", "article", "main", "header", "footer", "aside", "ul", "ol",
        "table", "tr", "form", "blockquote", "figure", "figcaption", "dl", "dt", "dd", "hr",
        "pre", "address", "details", "summary", "body",
    }
)  # fmt: skip
_VOID_TAGS = frozenset(
    {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "wbr"}
)
_SPACES = re.compile(r"\s+")


_LINE, _PARAGRAPH = "\ue000", "\ue001"  # break markers; runs of them merge into the largest
_BREAKS = re.compile(f" *[{_LINE}{_PARAGRAPH}]+")
_PARAGRAPH_TAGS = frozenset({"p", "pre", "blockquote", "table", "ul", "ol", "dl"})
_HEADINGS = frozenset({"h1", "h2", "h3", "h4", "h5", "h6"})


def _merge_breaks(match: re.Match[str]) -> str:
    return "\n\n" if _PARAGRAPH in match.group() else "\n"


class _TextExtractor(HTMLParser):
    """Turns HTML into plain text with Markdown-ish headings, list items and links."""

    def __init__(self, base_url: str) -> None:
        super().__init__(convert_charrefs=True)
        self.base_url = base_url
        self.out: list[str] = []
        self.title: list[str] = []
        self._skip = 0
        self._pre = 0
        self._in_title = False
        self._links: list[tuple[int, str | None]] = []  # (index in out, href) per open <a>

    def _after_gap(self) -> bool:
        """True at the start, after a space or after a line break: no space is needed."""
        return not self.out or self.out[-1][-1] in f" {_LINE}{_PARAGRAPH}"

    def _break(self, tag: str) -> None:
        self.out.append(_PARAGRAPH if tag in _PARAGRAPH_TAGS or tag in _HEADINGS else _LINE)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "title":
            self._in_title = True
        elif tag in _SKIP_TAGS:
            self._skip += tag not in _VOID_TAGS
        elif self._skip:
            return
        elif tag in _HEADINGS:
            self._break(tag)
            self.out.append("#" * int(tag[1]) + " ")
        elif tag == "li":
            self.out.extend((_LINE, "- "))
        elif tag == "br":
            self.out.append(_LINE)
        elif tag in ("td", "th"):
            if not self._after_gap():
                self.out.append(" ")
        elif tag == "a":
            self._links.append((len(self.out), dict(attrs).get("href")))
        elif tag in _BLOCK_TAGS:
            self._break(tag)
            self._pre += tag == "pre"

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self._in_title = False
        elif tag in _SKIP_TAGS:
            self._skip = max(self._skip - 1, 0)
        elif self._skip:
            return
        elif tag == "a" and self._links:
            self._close_link(*self._links.pop())
        elif tag in _BLOCK_TAGS or tag in _HEADINGS or tag == "li":
            self._break(tag)
            if tag == "pre":
                self._pre = max(self._pre - 1, 0)

    def _close_link(self, start: int, href: str | None) -> None:
        text = _BREAKS.sub(" ", "".join(self.out[start:])).strip()
        if not text or not href or href.startswith(("#", "javascript:")):
            return
        target = urljoin(self.base_url, href)
        if target.rstrip("/") != text.rstrip("/"):  # a bare URL as its own text stays as is
            self.out[start:] = [f"[{text}]({target})"]

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title.append(data)
        elif self._skip:
            return
        elif self._pre:
            self.out.append(data)
        else:
            text = _SPACES.sub(" ", data)
            if text.startswith(" ") and self._after_gap():
                text = text[1:]
            if text:
                self.out.append(text)

    def text(self) -> str:
        body = _BREAKS.sub(_merge_breaks, "".join(self.out))
        body = re.sub(r"\n{3,}", "\n\n", body).strip()
        title = _SPACES.sub(" ", "".join(self.title)).strip()
        return f"Title: {title}\n\n{body}" if title else body


def html_to_text(html: str, base_url: str = "") -> str:
    """Readable text of an HTML page: title, headings, paragraphs, list items, links.

    Scripts, styles and navigation are dropped; whitespace is collapsed except in ``<pre>``.
    """
    parser = _TextExtractor(base_url)
    parser.feed(html)
    parser.close()
    return parser.text()


# ---------------------------------------------------------------------------------------------
# Fetching


def _host_key(host: str) -> str:
    return host.rstrip(".").lower()


def _looks_like_ip(host: str) -> bool:
    # aiohttp's own test: such hosts skip the resolver, so they must be checked as literals.
    return ":" in host or host.replace(".", "").isdigit()


@cache
def _pinned_resolver_class() -> type[Any]:
    from aiohttp.abc import AbstractResolver

    class PinnedResolver(AbstractResolver):
        """Answers only with addresses the policy already accepted for that host."""

        def __init__(self, pins: dict[str, list[ResolveResult]]) -> None:
            self._pins = pins

        async def resolve(
            self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
        ) -> list[ResolveResult]:
            pinned = self._pins.get(_host_key(host))
            if not pinned:
                raise OSError(f"{host} was not checked before connecting")
            return [{**r, "port": port} for r in pinned]

        async def close(self) -> None:
            return None

    return PinnedResolver


def _kind(content_type: str) -> str | None:
    """'html', 'text' or None (not shown) for a MIME type."""
    if content_type in ("text/html", "application/xhtml+xml"):
        return "html"
    if content_type.startswith("text/") or content_type.endswith(("+json", "+xml")):
        return "text"
    if content_type in ("application/json", "application/xml", "application/javascript"):
        return "text"
    return None


class WebFetchTool(Tool):
    name: ClassVar[str] = "web_fetch"
    effects: ClassVar[Effects] = Effects(network=True)
    description: ClassVar[str] = (
        "Fetch a public http(s) URL and return its text: HTML is converted to readable text, "
        "JSON and plain text are returned as they are. Private and local network addresses "
        "are refused."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "url": {"type": "string", "description": "http:// or https:// URL"},
            "max_chars": {
                "type": "integer",
                "description": "Maximum characters of text to return (capped by the config)",
            },
        },
        "required": ["url"],
    }

    def __init__(self, cfg: WebConfig, *, address_policy: AddressPolicy = is_forbidden_address):
        self.cfg = cfg
        self.address_policy = address_policy

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        max_chars = args.get("max_chars", self.cfg.max_chars)
        if max_chars < 1:
            raise ToolError("max_chars must be 1 or more")
        max_chars = min(max_chars, self.cfg.max_chars)
        url = _parse_url(args["url"].strip())
        try:
            async with asyncio.timeout(self.cfg.timeout_seconds):
                return await self._fetch(url, max_chars)
        except TimeoutError:
            raise ToolError(
                f"timed out after {self.cfg.timeout_seconds:g} s fetching {url}"
            ) from None

    async def _fetch(self, url: URL, max_chars: int) -> str:
        import aiohttp

        pins: dict[str, list[ResolveResult]] = {}
        connector = aiohttp.TCPConnector(
            resolver=_pinned_resolver_class()(pins), use_dns_cache=False, force_close=True
        )
        headers = {"User-Agent": USER_AGENT, "Accept": "text/html,application/json,text/*;q=0.9"}
        # trust_env=False: an HTTP(S)_PROXY from the environment would connect elsewhere.
        async with aiohttp.ClientSession(
            connector=connector, headers=headers, trust_env=False
        ) as session:
            current = url
            for hop in range(MAX_REDIRECTS + 1):
                await self._pin(current, pins)
                try:
                    async with session.get(current, allow_redirects=False) as resp:
                        location = resp.headers.get("Location")
                        if resp.status not in _REDIRECT_STATUSES or not location:
                            return await self._render(resp, url, max_chars)
                        if hop == MAX_REDIRECTS:
                            raise ToolError(f"too many redirects (more than {MAX_REDIRECTS})")
                        current = _parse_url(location, base=resp.url)
                except aiohttp.ClientError as exc:
                    raise ToolError(f"could not fetch {current}: {exc}") from None
        raise AssertionError("unreachable: the loop returns or raises")

    async def _pin(self, url: URL, pins: dict[str, list[ResolveResult]]) -> None:
        """Check every address of ``url``'s host and record them as the only ones to use."""
        host = url.raw_host or ""
        port = url.port or (443 if url.scheme == "https" else 80)
        try:
            literal: IPAddress | None = ipaddress.ip_address(host)
        except ValueError:
            if _looks_like_ip(host):
                raise ToolError(f"'{host}' is not a valid IP address") from None
            literal = None
        if literal is not None:
            self._check_address(url, literal)
            return  # aiohttp connects to a literal directly, without the resolver
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise ToolError(f"cannot resolve host '{host}': {exc.strerror}") from None
        results: list[ResolveResult] = []
        for family, _, proto, _, sockaddr in infos:
            addr = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
            self._check_address(url, addr)
            entry: ResolveResult = {
                "hostname": host,
                "host": str(addr),
                "port": port,
                "family": family,
                "proto": proto,
                "flags": socket.AI_NUMERICHOST | socket.AI_NUMERICSERV,
            }
            if entry not in results:
                results.append(entry)
        pins[_host_key(host)] = results

    def _check_address(self, url: URL, addr: IPAddress) -> None:
        reason = self.address_policy(addr)
        if reason:
            raise ToolError(
                f"refused to fetch {url}: {url.raw_host} is {addr}, a {reason}. "
                "web_fetch only fetches from public internet addresses."
            )

    async def _render(self, resp: aiohttp.ClientResponse, requested: URL, max_chars: int) -> str:
        head = f"URL: {resp.url}\nStatus: {resp.status}"
        if resp.url != requested:
            head += f"\nRedirected from: {requested}"
        ctype = resp.content_type
        kind = _kind(ctype)
        if kind is None:
            size = f", {resp.content_length} bytes" if resp.content_length is not None else ""
            return f"{head}\nContent-Type: {ctype}\n\n[{ctype} content{size}; not text, not shown]"
        body, cut = await read_capped(resp, self.cfg.max_bytes)
        text = decode(body, resp.charset)
        if kind == "html":
            text = html_to_text(text, str(resp.url))
        notes: list[str] = []
        if cut:
            notes.append(f"download stopped at {self.cfg.max_bytes} bytes")
        if len(text) > max_chars:
            notes.append(f"text cut to {max_chars} of {len(text)} characters")
            text = text[:max_chars]
        tail = f"\n\n[{'; '.join(notes)}]" if notes else ""
        return f"{head}\n\n{text}{tail}"


def _parse_url(text: str, base: URL | None = None) -> URL:
    from yarl import URL

    try:
        url = base.join(URL(text)) if base is not None else URL(text)
    except (ValueError, TypeError):
        raise ToolError(f"not a valid URL: {text}") from None
    if url.scheme not in ("http", "https"):
        raise ToolError(
            f"only http and https URLs can be fetched, not '{url.scheme or 'no scheme'}': {text}"
        )
    if not url.raw_host:
        raise ToolError(f"the URL has no host: {text}")
    return url.with_fragment(None)


async def read_capped(resp: aiohttp.ClientResponse, max_bytes: int) -> tuple[bytes, bool]:
    """At most ``max_bytes`` of the body, and whether there was more (not downloaded)."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in resp.content.iter_chunked(_READ_CHUNK):
        chunks.append(chunk)
        size += len(chunk)
        if size > max_bytes:
            break
    return b"".join(chunks)[:max_bytes], size > max_bytes


def decode(body: bytes, charset: str | None) -> str:
    try:
        return body.decode(charset or "utf-8", errors="replace")
    except LookupError:  # a charset Python does not know
        return body.decode("utf-8", errors="replace")
