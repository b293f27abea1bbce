"""Proxies for everything memobot reaches over HTTP (the channels' SDKs and the model): http(s)
natively, socks5 through aiohttp-socks, one rule for which proxy applies."""

from __future__ import annotations

import functools
import urllib.request
from typing import Any
from urllib.parse import urlsplit

SCHEMES = ("http://", "https://", "socks5://", "socks5h://")
SOCKS_SCHEMES = ("socks5://", "socks5h://")


def check_proxy_url(url: str) -> str:
    """A config validator: "" (no proxy) or a URL of a scheme memobot can use."""
    if url and not url.startswith(SCHEMES):
        raise ValueError(f"proxy must start with one of {', '.join(SCHEMES)}")
    return url


def http_proxy(proxy: str) -> str | None:
    """The URL for aiohttp's ``proxy=`` argument, or None (no proxy, or a socks proxy)."""
    return proxy if proxy and not proxy.startswith(SOCKS_SCHEMES) else None


def socks_connector(proxy: str, **connector_args: Any) -> Any | None:
    """An aiohttp connector that tunnels through a socks5 proxy, or None for other proxies.

    ``socks5h`` means the proxy resolves host names. Call inside the running event loop.
    """
    if not proxy.startswith(SOCKS_SCHEMES):
        return None
    from aiohttp_socks import ProxyConnector

    url = "socks5://" + proxy.split("://", 1)[1]  # python-socks knows no "socks5h" scheme
    return ProxyConnector.from_url(url, rdns=proxy.startswith("socks5h://"), **connector_args)


def environment_proxy(url: str) -> str:
    """The proxy the environment gives for ``url`` (``HTTPS_PROXY``, ``HTTP_PROXY``,
    ``ALL_PROXY``, lower case too, and ``NO_PROXY``), as curl and the SDKs read them; "" for
    none."""
    parts = urlsplit(url)
    proxies = urllib.request.getproxies_environment()
    if not proxies or urllib.request.proxy_bypass_environment(parts.hostname or "", proxies):
        return ""
    return proxies.get(parts.scheme) or proxies.get("all") or ""


@functools.cache
def proxy_errors() -> tuple[type[Exception], ...]:
    """What aiohttp-socks raises outside aiohttp's ``ClientError`` family (a socks proxy that
    is down, refuses the connection or does not answer): callers treat these as network
    errors, retried like any other, or one would end a poll loop or a turn as a crash."""
    from aiohttp_socks import ProxyConnectionError, ProxyError, ProxyTimeoutError

    return (ProxyConnectionError, ProxyError, ProxyTimeoutError)
