"""Proxies for everything memobot reaches over HTTP (the channels' SDKs and the model): http(s)
natively, socks5 through aiohttp-socks, one rule for which proxy applies."""

from __future__ import annotations

import functools
import urllib.request
from typing import Any
from urllib.parse import urlsplit

from bot.urls import checked_url, redact_url

SCHEMES = ("http://", "https://", "socks5://", "socks5h://")
SOCKS_SCHEMES = ("socks5://", "socks5h://")


def check_proxy_url(url: str) -> str:
    """A config validator: "" (no proxy) or a URL of a scheme memobot can use, with a host."""
    return checked_url(url, tuple(s.removesuffix("://") for s in SCHEMES))


def http_proxy(proxy: str) -> str | None:
    """The URL for aiohttp's ``proxy=`` argument, or None (no proxy, or a socks proxy)."""
    return proxy if proxy and not proxy.startswith(SOCKS_SCHEMES) else None


def socks_connector(proxy: str, **connector_args: Any) -> Any | None:
    """An aiohttp connector that tunnels through a socks5 proxy, or None for other proxies.

    ``socks5h`` means the proxy resolves host names. Call inside the running event loop.
    """
    if not proxy.startswith(SOCKS_SCHEMES):
        return None
    url = "socks5://" + proxy.split("://", 1)[1]  # python-socks knows no "socks5h" scheme
    return _socks_connector_class().from_url(
        url, rdns=proxy.startswith("socks5h://"), **connector_args
    )


@functools.cache
def _socks_connector_class() -> Any:
    """aiohttp-socks' connector, its failures raised as aiohttp's own.

    aiohttp-socks raises errors of its own (a proxy that is down, refuses the connection or
    does not answer), outside aiohttp's ``ClientError`` family: every caller that treats
    ``ClientError`` as a network error (retried, failed over, a channel reconnecting) would
    see an unknown error instead, as the model calls, Telegram, Discord and Slack once did.
    """
    import aiohttp
    from aiohttp_socks import ProxyConnectionError, ProxyConnector, ProxyError, ProxyTimeoutError

    class SocksConnector(ProxyConnector):  # type: ignore[misc]
        async def connect(self, *args: Any, **kwargs: Any) -> Any:
            try:
                return await super().connect(*args, **kwargs)
            except (ProxyConnectionError, ProxyError, ProxyTimeoutError) as exc:
                raise aiohttp.ClientConnectionError(f"socks proxy: {exc}") from exc

    return SocksConnector


def environment_proxy(url: str) -> str:
    """The proxy the environment gives for ``url`` (``HTTPS_PROXY``, ``HTTP_PROXY``,
    ``ALL_PROXY``, lower case too, and ``NO_PROXY``, whose entries may carry a port), as curl
    reads them; "" for none. A value without a scheme is an http proxy, as for curl.

    Raises ValueError, naming what was found, for a proxy of a kind memobot cannot use."""
    parts = urlsplit(url)
    proxies = urllib.request.getproxies_environment()
    if not proxies or urllib.request.proxy_bypass_environment(parts.netloc, proxies):
        return ""
    found = proxies.get(parts.scheme) or proxies.get("all") or ""
    if not found:
        return ""
    scheme, sep, rest = found.partition("://")
    proxy = f"{scheme.lower()}://{rest}" if sep else f"http://{found}"
    if not proxy.startswith(SCHEMES):
        raise ValueError(
            f"the environment's proxy for {parts.netloc} ({redact_url(found)}) is not "
            f"one memobot can use: it takes {', '.join(SCHEMES)}"
        )
    return proxy
