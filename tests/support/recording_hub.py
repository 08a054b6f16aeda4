"""A stand-in hub on 127.0.0.1 that records what an agent POSTs to it: a real HTTP server in
a thread of the test, answering registrations, heartbeats, progress and result reports as
the hub's API would (``{"decided": true}`` for a result). ``refuse`` queues other answers
for a path (a 503 while "down", a 409 stale-report problem) before the usual one.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

STALE = (
    409,
    {
        "type": "urn:agent-reach:problem:stale-report",
        "title": "Stale or foreign report",
        "status": 409,
        "detail": "the task waits on another attempt",
    },
)
DOWN = (503, {"type": "about:blank", "title": "Service Unavailable", "status": 503})


@dataclass(frozen=True)
class Post:
    path: str
    body: dict[str, Any]
    at: float  # time.monotonic() when it arrived


class RecordingHub:
    def __init__(self) -> None:
        self.posts: list[Post] = []
        self._refusals: dict[str, list[tuple[int, dict[str, Any]]]] = {}
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), daemon=True
        )

    def __enter__(self) -> RecordingHub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def refuse(self, path: str, *answers: tuple[int, dict[str, Any]]) -> None:
        """Answer the next POSTs to ``path`` with ``answers``, in order."""
        with self._lock:
            self._refusals.setdefault(path, []).extend(answers)

    def to(self, path: str) -> list[Post]:
        with self._lock:
            return [p for p in self.posts if p.path == path]

    def results(self, task_id: str) -> list[Post]:
        return self.to(f"/v1/tasks/{task_id}/result")

    def progress(self, task_id: str) -> list[Post]:
        return self.to(f"/v1/tasks/{task_id}/progress")

    def wait_for_result(self, task_id: str, timeout: float, count: int = 1) -> list[Post]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.results(task_id)
            if len(found) >= count:
                return found
            time.sleep(0.02)
        raise AssertionError(f"no result report of {task_id} within {timeout}s: {self.posts}")

    def _answer(self, path: str) -> tuple[int, dict[str, Any]]:
        with self._lock:
            queued = self._refusals.get(path)
            if queued:
                return queued.pop(0)
        if path.endswith("/result"):
            return 200, {"decided": True}
        if path.endswith("/register"):
            return 200, {"endpoint": "registered"}
        return 200, {}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with hub._lock:
                    hub.posts.append(Post(self.path, json.loads(raw or b"{}"), time.monotonic()))
                status, body = hub._answer(self.path)
                data = json.dumps(body).encode()
                self.send_response(status)
                kind = "application/problem+json" if status >= 400 else "application/json"
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        return Handler


@contextmanager
def recording_hub() -> Iterator[RecordingHub]:
    with RecordingHub() as hub:
        yield hub
