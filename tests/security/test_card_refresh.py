"""Issue 37, item 7 (A2A): a card's refresh cannot add skills or tags an admin never saw.

Through real processes (api, worker, beat) on SQLite and PostgreSQL, with a real HTTP
server on loopback serving an A2A card. An admin registers the card; the card then names
one more skill and tag. Before, the beat's refresh took them in, and the agent received
reaches for a capability nobody approved. Now the refresh is refused: the registration
stays as the admin made it, and the card's error says why, until an admin registers the
card again.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from reach.core.security.auth import Scope
from tests.support.stacks import Stack
from tests.support.trust_agents import Key, api, make_key
from tests.support.waiting import wait_until

STACK_SETTINGS = {"REACH_SECURITY__REQUIRE_AUTH": "true", "REACH_A2A__CARD_REFRESH_S": "0.5"}


class CardServer:
    """Serves ``card`` (mutable) at every path, on 127.0.0.1."""

    def __init__(self) -> None:
        self.card: dict[str, Any] = {}
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = json.dumps(server.card).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.httpd.server_address[1])
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def set(self, skills: list[dict[str, Any]]) -> None:
        self.card = {
            "name": "ledger",
            "version": "1.0",
            "supportedInterfaces": [
                {
                    "protocolBinding": "JSONRPC",
                    "protocolVersion": "1.0",
                    "url": f"http://127.0.0.1:{self.port}/rpc",
                }
            ],
            "capabilities": {"streaming": False},
            "skills": skills,
        }

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def cards() -> Iterator[CardServer]:
    server = CardServer()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="module")
def admin(shared_stack: Stack, shared_store_url: str) -> Key:
    return make_key(shared_store_url, Scope.ADMIN)


def _agent(stack: Stack, admin: Key) -> dict[str, Any]:
    return dict(api(stack, "GET", "/api/v1/agents/ledger", admin).json())


def test_a_refreshed_card_cannot_widen_its_registration(
    shared_stack: Stack, admin: Key, cards: CardServer
) -> None:
    cards.set([{"id": "ledger.read", "name": "read", "tags": ["books"]}])
    body = {"card_url": f"http://127.0.0.1:{cards.port}", "allow_loopback": True}
    r = api(shared_stack, "POST", "/api/v1/agents/a2a", admin, body)
    assert r.status_code == 201, r.text
    assert [c["type"] for c in _agent(shared_stack, admin)["capabilities"]] == ["ledger.read"]

    cards.set(
        [
            {"id": "ledger.read", "name": "read", "tags": ["books"]},
            {"id": "pay", "name": "pay", "tags": ["fin"]},
        ]
    )

    def refused() -> str:
        (instance,) = _agent(shared_stack, admin)["instances"]
        return str(instance.get("a2a", {}).get("card_error") or "")

    error = wait_until(refused, 30, what="the refresh refused")
    assert "pay" in error and "tag:fin" in error and "admin registers the card again" in error
    agent = _agent(shared_stack, admin)
    assert [c["type"] for c in agent["capabilities"]] == ["ledger.read"]
    assert "fin" not in agent["tags"]

    # the admin registers it again: that is the approval
    again = api(shared_stack, "POST", "/api/v1/agents/a2a", admin, body)
    assert again.status_code == 201, again.text
    types = sorted(c["type"] for c in _agent(shared_stack, admin)["capabilities"])
    assert types == ["ledger.read", "pay"]
