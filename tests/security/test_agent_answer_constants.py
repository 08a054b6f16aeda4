"""Issue 37, item 17, the agent's side: an answer holding ``NaN`` or ``Infinity`` is not
taken as JSON. The hub's parser used to accept it; writing the result then failed on the
store (PostgreSQL refuses the token), a failure counted as a database outage and retried,
so an agent key holder could keep a task (and the hub) spinning. Now such an answer is a
non-JSON body: the task ends with a business error. A real local HTTP server answers.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from reach.core.delivery.retry import Outcome, classify
from reach.hub.delivery.transports import AgentHttp


@pytest.fixture
def answering() -> Iterator[dict[str, Any]]:
    said: dict[str, Any] = {"body": b"{}"}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = said["body"]
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    said["url"] = f"http://127.0.0.1:{server.server_address[1]}/tasks/m"
    try:
        yield said
    finally:
        server.shutdown()
        server.server_close()


def post(url: str) -> Any:
    http = AgentHttp()

    async def once() -> Any:
        try:
            return await http.post(url, b"{}", 2.0, 5.0)
        finally:
            await http.close_all()

    return asyncio.run(once())


@pytest.mark.parametrize("constant", [b"NaN", b"Infinity", b"-Infinity"])
def test_an_answer_with_a_non_json_number_is_not_a_success(
    answering: dict[str, Any], constant: bytes
) -> None:
    answering["body"] = b'{"code": 0, "data": {"x": ' + constant + b"}}"
    answer = post(answering["url"])
    assert answer.status == 200
    assert not isinstance(answer.body, dict)  # not taken as JSON
    assert classify(answer.status, answer.body) is Outcome.BUSINESS_ERROR


def test_an_ordinary_answer_is_still_a_success(answering: dict[str, Any]) -> None:
    answering["body"] = b'{"code": 0, "data": {"x": 1.5, "note": "NaN"}}'
    answer = post(answering["url"])
    assert answer.body == {"code": 0, "data": {"x": 1.5, "note": "NaN"}}
    assert classify(answer.status, answer.body) is Outcome.SUCCESS
