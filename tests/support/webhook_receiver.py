"""A webhook receiver on loopback, in the test's own process: records each POST (headers,
body) and answers 204; it may be stopped and started again on its port, or made to hang."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class WebhookReceiver:
    def __init__(self, port: int) -> None:
        self.port = port
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.hang_s = 0.0
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    def start(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with receiver._lock:
                    receiver.requests.append((dict(self.headers.items()), body))
                if receiver.hang_s:
                    time.sleep(receiver.hang_s)
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        server.daemon_threads = True
        server.allow_reuse_address = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self._server = server

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def received(self) -> list[tuple[dict[str, str], bytes]]:
        with self._lock:
            return list(self.requests)
