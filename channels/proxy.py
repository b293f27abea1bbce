"""``channels.<name>.proxy`` for aiohttp-based SDKs: http(s) natively, socks5 via aiohttp-socks."""

from __future__ import annotations

from typing import Any

SOCKS_SCHEMES = ("socks5://", "socks5h://")


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
