"""A small real MCP server (the SDK's MCPServer) for tests: stdio, Streamable HTTP or SSE.

    python tests/fakes/mcp_server.py                       stdio
    python tests/fakes/mcp_server.py --http PORT_FILE      Streamable HTTP on 127.0.0.1:<free
                                                           port>/mcp, the port written to PORT_FILE
    python tests/fakes/mcp_server.py --sse PORT_FILE       the older SSE transport at /sse

Tools: ``echo``, ``add``, ``picture`` (an image), ``fail`` (an isError result), ``crash`` (the
process exits mid-call), ``hang`` (sleeps), ``spawn`` (starts ``sleep TAG`` and returns its pid),
``read`` (a file's text, or the error). ``--start-file PATH`` appends one line per start, so a
test can count reconnects.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import socket
import subprocess
import sys
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.utilities.types import Image

# A 1x1 transparent PNG.
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mNkYAAAAAYAAjCB0C8AAAAASUVORK5CYII="
)

server = MCPServer("fake")


@server.tool()
def echo(text: str) -> str:
    """Return the text as it is."""
    return f"echo: {text}"


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def picture() -> Image:
    """A tiny PNG."""
    return Image(data=PNG, format="png")


@server.tool()
def fail(why: str) -> str:
    """Always fails."""
    raise ToolError(f"failed on purpose: {why}")


@server.tool()
def crash() -> str:
    """The server process dies in the middle of the call."""
    os._exit(3)


@server.tool()
async def hang(seconds: float) -> str:
    """Sleep, then answer."""
    await asyncio.sleep(seconds)
    return "woke up"


@server.tool()
def spawn(tag: str) -> int:
    """Start ``sleep TAG`` in the background; its pid."""
    child = subprocess.Popen(["sleep", tag], stdin=subprocess.DEVNULL, start_new_session=True)
    return child.pid


@server.tool()
def read(path: str) -> str:
    """A file's text, or why it could not be read."""
    try:
        return Path(path).read_text()
    except OSError as exc:
        return f"cannot read: {exc.strerror}"


def serve_http(port_file: Path, sse: bool = False) -> None:
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    tmp = port_file.with_suffix(".tmp")
    tmp.write_text(str(sock.getsockname()[1]))
    tmp.replace(port_file)
    app = server.sse_app() if sse else server.streamable_http_app()
    config = uvicorn.Config(app, log_level="warning")
    uvicorn.Server(config).run(sockets=[sock])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=Path, help="serve Streamable HTTP; write the port here")
    parser.add_argument("--sse", type=Path, help="serve the older SSE transport at /sse")
    parser.add_argument("--start-file", type=Path)
    args = parser.parse_args()
    if args.start_file:
        with args.start_file.open("a") as fh:
            fh.write(f"{os.getpid()}\n")
    if args.http or args.sse:
        serve_http(args.http or args.sse, sse=bool(args.sse))
    else:
        server.run()


if __name__ == "__main__":
    sys.exit(main())
