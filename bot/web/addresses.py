"""Where the panel listens and which names it answers to (DNS rebinding: a page of another
site that points its own name at 127.0.0.1 sends that name as Host, and is refused)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

LOCAL_NAMES = ("127.0.0.1", "localhost", "[::1]")


def parse_listen(value: str) -> tuple[str, int]:
    """``host:port`` (an IPv6 host in brackets) -> (host without brackets, port); ValueError
    saying what is wrong."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"{value!r} is not host:port, e.g. 127.0.0.1:8765")
    number = int(port)
    if not 1 <= number <= 65535:
        raise ValueError(f"{value!r}: the port must be 1 to 65535")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        ipaddress.IPv6Address(host)  # ValueError for a bad one
    elif ":" in host:
        raise ValueError(f"{value!r}: write an IPv6 address in brackets, e.g. [::1]:8765")
    return host, number


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name other than localhost may resolve anywhere


def check_public_url(value: str) -> str:
    """``web.publicUrl``: "" or an http(s) URL of a host (and port), without a path; returned
    without a trailing slash."""
    if not value:
        return value
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{value!r} is not an http:// or https:// address")
    if parts.username or parts.password or parts.query or parts.fragment:
        raise ValueError(f"{value!r}: give the address only (no user, ?query or #fragment)")
    if parts.path not in ("", "/"):
        # The panel's pages, forms and cookie live at the root of its own host name.
        raise ValueError(f"{value!r}: give the host only, e.g. https://bot.example.org (no path)")
    return value.rstrip("/")


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host


@dataclass(frozen=True, slots=True)
class Served:
    """The Host values and origins of the panel, and the address of its links."""

    hosts: frozenset[str]
    origins: frozenset[str]
    base_url: str  # the links' start: publicUrl, or http://<listen>

    def host_ok(self, host: str | None) -> bool:
        return host is not None and host.lower() in self.hosts

    def origin_ok(self, origin: str | None) -> bool:
        return origin is not None and origin.rstrip("/").lower() in self.origins


def served(listen: str, public_url: str, port: int | None = None) -> Served:
    """What the panel listening on ``listen`` (bound to ``port``, when the socket says so)
    answers to: the listen address, the loopback names with its port, publicUrl's host."""
    host, configured = parse_listen(listen)
    port = port or configured
    hosts = {f"{_bracketed(host)}:{port}".lower()}
    if is_loopback(host) or host in ("0.0.0.0", "::"):
        hosts |= {f"{name}:{port}" for name in LOCAL_NAMES}
    origins = {f"http://{h}" for h in hosts}
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else _bracketed(host)
    base = f"http://{shown}:{port}"
    if public_url:
        parts = urlsplit(public_url)
        hosts.add(parts.netloc.lower())
        origins.add(f"{parts.scheme}://{parts.netloc}".lower())
        base = public_url
    return Served(frozenset(hosts), frozenset(origins), base)
