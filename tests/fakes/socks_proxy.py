"""A SOCKS5 proxy on 127.0.0.1 (RFC 1928: no authentication, CONNECT only), for tests.

It records each CONNECT as the proxy saw it: the address type (an IPv4 address, or a host name
when the client leaves name resolution to the proxy, as ``socks5h`` does) and the port. Like a
real proxy it answers "connection refused" (reply 5) when the target cannot be reached, and
refuses a client that offers no method it accepts.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from dataclasses import dataclass
from typing import Self

IPV4, DOMAIN, IPV6 = 1, 3, 4


@dataclass(frozen=True)
class Connect:
    host: str
    port: int
    by_name: bool  # the client sent a host name, not an address


class FakeSocks5:
    def __init__(self, port: int = 0) -> None:
        self.connects: list[Connect] = []
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()
        self.port = port

    @property
    def url(self) -> str:
        return f"socks5://127.0.0.1:{self.port}"

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._pipes):
            task.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._pipes.add(task)
        try:
            await self._handle(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # a client gone, or the proxy closing: a cancel raised here would be logged
        finally:
            self._pipes.discard(task)
            writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        version, count = await reader.readexactly(2)
        methods = await reader.readexactly(count)
        if version != 5 or 0 not in methods:
            writer.write(b"\x05\xff")  # no acceptable method
            return
        writer.write(b"\x05\x00")
        _, command, _, kind = await reader.readexactly(4)
        if kind == IPV4:
            host = socket.inet_ntop(socket.AF_INET, await reader.readexactly(4))
        elif kind == IPV6:
            host = socket.inet_ntop(socket.AF_INET6, await reader.readexactly(16))
        else:
            size = (await reader.readexactly(1))[0]
            host = (await reader.readexactly(size)).decode()
        port = int.from_bytes(await reader.readexactly(2), "big")
        self.connects.append(Connect(host, port, kind == DOMAIN))
        failed = b"\x05%c\x00\x01" + bytes(6)
        if command != 1:
            writer.write(failed % 7)  # command not supported
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(host, port)
        except OSError:
            writer.write(failed % 5)  # connection refused
            return
        writer.write(b"\x05\x00\x00\x01" + bytes(4) + bytes(2))
        try:
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        finally:
            up_writer.close()


async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    """Copy ``src`` to ``dst`` until it ends, then end ``dst`` too."""
    with contextlib.suppress(ConnectionError):
        while data := await src.read(65536):
            dst.write(data)
            await dst.drain()
    with contextlib.suppress(OSError):
        dst.write_eof()
