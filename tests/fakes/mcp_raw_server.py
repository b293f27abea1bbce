"""A stdio MCP server on the standard library alone, for runs under Landlock.

A confined server may read only the system folders and the workspace, so it cannot import the
SDK from a virtualenv elsewhere; this one runs on the system's ``python3`` from a copy in the
workspace. It speaks the protocol's handshake (initialize, tools/list, tools/call) and has one
tool, ``read``: a file's text, or why it could not be read.
"""

import json
import sys

TOOLS = [
    {
        "name": "read",
        "description": "A file's text, or why it could not be read.",
        "inputSchema": {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
        },
    }
]


def answer(request: dict) -> dict | None:
    method = request.get("method")
    params = request.get("params") or {}
    if method == "initialize":
        return {
            "protocolVersion": params.get("protocolVersion", "2025-06-18"),
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "raw", "version": "1"},
        }
    if method == "tools/list":
        return {"tools": TOOLS}
    if method == "tools/call":
        path = (params.get("arguments") or {}).get("path", "")
        try:
            with open(path) as fh:
                text = fh.read()
        except OSError as exc:
            text = f"cannot read: {exc.strerror}"
        return {"content": [{"type": "text", "text": text}], "isError": False}
    if method == "ping":
        return {}
    return None


def main() -> None:
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        if "id" not in request:
            continue  # a notification
        result = answer(request)
        if result is None:
            reply = {"error": {"code": -32601, "message": "Method not found"}}
        else:
            reply = {"result": result}
        reply.update(jsonrpc="2.0", id=request["id"])
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
