"""One HTTP server process for all the apps, on loopback inside the episode's sandbox; standard library only.

Run: ``python -m recipes.gui.apps.server --seed .gui/seed.json --state .gui/state.json [--port 0]``. It loads the
state file if it exists (a restarted server continues), else the seed, serves ``/`` (an index of the apps),
``/shop``, ``/booking`` and ``/docs``, and after every request that changed something writes the whole state to
``--state`` atomically (the grader reads that file once the harness has exited). The first line on stdout is
``{"port": N, "url": "http://127.0.0.1:N"}`` once it listens.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from recipes.gui.apps import booking, docs, shop
from recipes.gui.apps.core import AppRouter, Request, Response, State, page

MAX_BODY = 64 * 1024


def build_router() -> AppRouter:
    """Every app's routes and the index."""
    router = AppRouter()
    router.add("GET", r"/", _index)
    shop.register(router)
    booking.register(router)
    docs.register(router)
    return router


def _index(state: State, request: Request, _: Any) -> Response:
    body = (
        '<h1>Apps</h1><ul><li><a href="/shop">Shop</a></li><li><a href="/booking">Booking</a></li>'
        '<li><a href="/docs">Docs</a></li></ul>'
    )
    return Response(200, page("Apps", body, state))


class AppHost:
    """The state, its file, a lock (requests are served on threads) and the router."""

    def __init__(self, state: State, state_path: Path | None) -> None:
        self.state, self.state_path = state, state_path
        self.router = build_router()
        self.lock = threading.Lock()

    @classmethod
    def open(cls, seed: Path, state_path: Path) -> AppHost:
        """Continue from ``state_path`` if it exists, else start from ``seed``."""
        source = state_path if state_path.exists() else seed
        host = cls(json.loads(source.read_text(encoding="utf-8")), state_path)
        host.persist()
        return host

    def handle(self, request: Request) -> Response:
        """Serve one request; persist when it changed the state."""
        with self.lock:
            response = self.router.handle(self.state, request)
            if response.changed:
                self.persist()
        return response

    def persist(self) -> None:
        """Write the state atomically (a grader never reads half a file)."""
        if self.state_path is None:
            return
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.state_path.with_suffix(".tmp")
        partial.write_text(json.dumps(self.state, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(partial, self.state_path)


def handler_class(host: AppHost) -> type[BaseHTTPRequestHandler]:
    """A request handler class bound to ``host``."""

    class Handler(BaseHTTPRequestHandler):
        server_version = "OrchardApps/1"

        def do_GET(self) -> None:  # noqa: N802 - the http.server API
            self._serve(b"")

        def do_POST(self) -> None:  # noqa: N802
            length = min(int(self.headers.get("content-length") or 0), MAX_BODY)
            self._serve(self.rfile.read(length))

        def _serve(self, body: bytes) -> None:
            response = host.handle(Request.parse(self.command, self.path, body))
            data = response.body.encode()
            self.send_response(response.status)
            if response.location:
                self.send_header("Location", response.location)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the http.server API
            sys.stderr.write(f"apps: {self.command} {self.path} {args[1] if len(args) > 1 else ''}\n")

    return Handler


def serve(host: AppHost, bind: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    """A started server (on its own thread) for ``host``; ``server.server_address`` has the port."""
    server = ThreadingHTTPServer((bind, port), handler_class(host))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="orchard-gui-apps", daemon=True).start()
    return server


def main(argv: Sequence[str] | None = None) -> int:
    """Serve until killed."""
    parser = argparse.ArgumentParser(prog="python -m recipes.gui.apps.server", description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=Path, required=True, help="Initial state (JSON).")
    parser.add_argument("--state", type=Path, required=True, help="Where the current state is kept (JSON).")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    server = serve(AppHost.open(args.seed, args.state), args.host, args.port)
    port = server.server_address[1]
    sys.stdout.write(json.dumps({"port": port, "url": f"http://{args.host}:{port}"}) + "\n")
    sys.stdout.flush()
    threading.Event().wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
