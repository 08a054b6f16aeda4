"""A minimal real agent endpoint: answers the delivery contract and counts calls per task."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class EnvelopeServer:
    def __init__(self, delay: float = 0.0, status: int = 200, code: int = 0) -> None:
        self.delay, self.status, self.code = delay, status, code
        self.calls: Counter[str] = Counter()
        self.bodies: list[dict[str, Any]] = []
        lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with lock:
                    outer.calls[body["task_id"]] += 1
                    outer.bodies.append(body)
                time.sleep(outer.delay)
                data = json.dumps(
                    {
                        "code": outer.code,
                        "data": {"ok": body["task_id"]},
                        "message": "no" if outer.code else "",
                    }
                ).encode()
                self.send_response(outer.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
