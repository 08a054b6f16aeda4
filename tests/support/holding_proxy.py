"""A forwarding HTTP proxy in front of a real hub that can hold one path's answers.

It forwards every request to the hub as is; for the held path it gets the hub's answer
(so the hub has committed whatever the request did) and keeps it from the client until
``release()``. That opens, on purpose, the window a busy hub opens by chance: the hub has
acted, the caller does not know yet. ``delays`` opens the other window: a request of
those paths reaches the hub only that many seconds after it arrived (a slow or congested
hub), whether or not the caller is still waiting.
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import requests

_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length"}


class HoldingProxy:
    def __init__(
        self, upstream: str, held_path: str | None = None, delays: dict[str, float] | None = None
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self.held_path = held_path
        self.delays = dict(delays or {})  # path -> seconds before forwarding; may change
        self.arrived = threading.Event()  # the hub has answered a held request
        self._released = threading.Event()
        self.seen: list[tuple[str, str]] = []  # (method, path) in arrival order
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> HoldingProxy:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.release()
        self._server.shutdown()
        self._server.server_close()

    def release(self) -> None:
        self._released.set()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: object) -> None:
                pass

            def _forward(self) -> None:
                proxy.seen.append((self.command, self.path))
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                time.sleep(proxy.delays.get(self.path, 0.0))
                answer = requests.request(
                    self.command, proxy.upstream + self.path, data=body, headers=headers, timeout=30
                )
                if self.path == proxy.held_path:
                    proxy.arrived.set()
                    proxy._released.wait(60)
                self.send_response(answer.status_code)
                for name, value in answer.headers.items():
                    if name.lower() not in _HOP_BY_HOP:
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(answer.content)))
                self.end_headers()
                self.wfile.write(answer.content)

            do_GET = do_POST = do_PUT = do_DELETE = _forward

        return Handler
