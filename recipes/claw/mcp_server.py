"""The Claw services as an MCP server over stdio: minimal JSON-RPC 2.0, written here (no ``mcp`` package needed).

Messages are one JSON object per line on stdin/stdout (MCP's stdio transport); logs go to stderr. Implemented:
``initialize`` (protocol version echoed when it is one this server knows, else its own), ``notifications/initialized``
and other notifications (no answer), ``ping``, ``tools/list`` (every tool of ``recipes.claw.tools``, one page) and
``tools/call`` (the tool run against the services; a refused call is a result with ``isError: true``, as MCP wants for
tool failures, not a JSON-RPC error). Unknown methods answer -32601, bad requests -32600/-32602, bad JSON -32700.

Run: ``python -m recipes.claw.mcp_server --url http://127.0.0.1:PORT`` (services already running, e.g. the agent's)
or ``python -m recipes.claw.mcp_server --workdir DIR`` (serve DIR's services from this process, on a loopback port).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from recipes.claw.tools import TOOLS_BY_NAME, call_tool, mcp_tools

PROTOCOL_VERSIONS = ("2025-06-18", "2025-03-26", "2024-11-05")
"""Versions this server speaks; the first is offered when the client asks for another."""
SERVER_INFO = {"name": "orchard-claw", "version": "0.1.0"}
PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS = -32700, -32600, -32601, -32602

JSON = dict[str, Any]


class McpServer:
    """Answers MCP requests with the Claw tools, run against the services at ``services_url``."""

    def __init__(self, services_url: str) -> None:
        self.services_url = services_url

    def handle(self, message: Any) -> JSON | None:
        """The response to one JSON-RPC message (``None`` for a notification)."""
        if (
            not isinstance(message, dict)
            or message.get("jsonrpc") != "2.0"
            or not isinstance(message.get("method"), str)
        ):
            request_id = message.get("id") if isinstance(message, dict) else None
            return _error(request_id, INVALID_REQUEST, "not a JSON-RPC 2.0 request")
        if "id" not in message:
            return None
        request_id, method, params = message["id"], message["method"], message.get("params") or {}
        if not isinstance(params, dict):
            return _error(request_id, INVALID_PARAMS, "params must be an object")
        if method == "initialize":
            asked = params.get("protocolVersion")
            version = asked if asked in PROTOCOL_VERSIONS else PROTOCOL_VERSIONS[0]
            result: JSON = {
                "protocolVersion": version,
                "capabilities": {"tools": {"listChanged": False}},
                "serverInfo": SERVER_INFO,
                "instructions": "Tools over the user's calendar, mail, contacts, task list and files.",
            }
        elif method == "ping":
            result = {}
        elif method == "tools/list":
            result = {"tools": mcp_tools()}
        elif method == "tools/call":
            name, arguments = params.get("name"), params.get("arguments") or {}
            if name not in TOOLS_BY_NAME or not isinstance(arguments, dict):
                return _error(request_id, INVALID_PARAMS, f"unknown tool {name!r} or arguments not an object")
            ok, answer = call_tool(self.services_url, name, arguments)
            text = json.dumps(answer, ensure_ascii=False)
            result = {"content": [{"type": "text", "text": text}], "isError": not ok}
            if isinstance(answer, dict):
                result["structuredContent"] = answer
        else:
            return _error(request_id, METHOD_NOT_FOUND, f"method {method!r} not found")
        return {"jsonrpc": "2.0", "id": request_id, "result": result}

    def serve(self, stdin: TextIO, stdout: TextIO) -> None:
        """Answer line by line until stdin closes."""
        for line in stdin:
            if not line.strip():
                continue
            try:
                message = json.loads(line)
            except ValueError as exc:
                response: JSON | None = _error(None, PARSE_ERROR, f"parse error: {exc}")
            else:
                response = self.handle(message)
            if response is not None:
                stdout.write(json.dumps(response, ensure_ascii=False) + "\n")
                stdout.flush()


def _error(request_id: Any, code: int, message: str) -> JSON:
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: serve MCP on stdio until stdin closes."""
    parser = argparse.ArgumentParser(prog="python -m recipes.claw.mcp_server", description=__doc__.split("\n")[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="Base URL of running Claw services.")
    where.add_argument("--workdir", type=Path, help="Serve this working copy's services from this process.")
    args = parser.parse_args(argv)
    if args.url:
        McpServer(args.url).serve(sys.stdin, sys.stdout)
        return 0
    from recipes.claw.services import BackgroundServices

    with BackgroundServices(args.workdir) as services:
        sys.stderr.write(json.dumps({"event": "services", "url": services.url}) + "\n")
        McpServer(services.url).serve(sys.stdin, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
