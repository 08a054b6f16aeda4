"""Issue 37, item 10: an A2A API-key credential does not follow its agent to another host.

An admin registers an A2A agent by its card with the API key its card asks for. The key is
bound to the host the card named then: a card that later sends its JSON-RPC elsewhere (a
refresh, or a redirect) does not take the key with it. Real processes: the hub (api,
worker, beat), an A2A agent built only with a2a-sdk (``tests.support.a2a_echo``) behind a
card served here, and a recording listener on another loopback host (127.0.0.2).
"""

from __future__ import annotations

import copy
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.support.a2a_echo import A2aEchoProcess
from tests.support.ports import free_port
from tests.support.stacks import Stack, start_stack, stop_stack, wait_http_ok
from tests.support.waiting import wait_until

KEY = "a2a-api-key-9d1f0c"
HEADER = "X-Agent-Key"


class Recorder:
    """Another host (127.0.0.2): records every request's headers; answers a GET with
    ``card`` (if set) and anything else with 200 ``{}``."""

    def __init__(self) -> None:
        self.headers: list[dict[str, str]] = []
        self.card: dict[str, Any] | None = None
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _any(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.headers.append(dict(self.headers))
                card = outer.card if self.command == "GET" else None
                data = json.dumps(card if card is not None else {}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _any

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.2", 0), Handler)
        self.url = f"http://127.0.0.2:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def saw_the_key(self) -> bool:
        return any(KEY in json.dumps(h) for h in self.headers)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class CardServer:
    """Serves an A2A card (the echo agent's, asking for an API key in ``HEADER``) whose
    JSON-RPC URL the test moves; on ``/rpc-redirect`` answers 307 to the recorder."""

    def __init__(self, base_card: dict[str, Any], rpc_url: str, recorder: Recorder) -> None:
        self.base = base_card
        self.rpc_url = rpc_url
        self.card_moved_to = ""
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if outer.card_moved_to:  # the card itself answers with a redirect
                    self.send_response(302)
                    self.send_header("Location", outer.card_moved_to)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                data = json.dumps(outer.card()).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:  # the JSON-RPC of a card that redirects its calls
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(307)
                self.send_header("Location", recorder.url)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def card(self) -> dict[str, Any]:
        card = copy.deepcopy(self.base)
        for interface in card.get("supportedInterfaces") or ():
            interface["url"] = self.rpc_url
        card["securitySchemes"] = {"key": {"apiKeySecurityScheme": {"location": "header",
                                                                     "name": HEADER}}}  # fmt: skip
        card["securityRequirements"] = [{"schemes": {"key": {"list": []}}}]
        return card

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def a2a_hub(
    tmp_path_factory: pytest.TempPathFactory, sqlite_template: Path
) -> Iterator[tuple[Stack, A2aEchoProcess]]:
    home = tmp_path_factory.mktemp("a2a-key")
    store = home / "reach.db"
    store.write_bytes(sqlite_template.read_bytes())
    extra = {"REACH_A2A__CARD_REFRESH_S": "0.5", "REACH_ROUTER__MAX_RETRY": "0"}
    echo = A2aEchoProcess(free_port(), home / "echo.jsonl", streaming=False)
    stack = start_stack(f"sqlite:///{store}", home, extra)
    try:
        wait_http_ok(echo.url + "/.well-known/agent-card.json")
        yield stack, echo
    finally:
        stop_stack(stack)
        echo.stop()


def _send(stack: Stack, agent_id: str) -> dict[str, Any]:
    body = {"agent_id": agent_id, "method": "echo", "payload": {"text": "hi"}, "timeout_ms": 5000}
    sent = requests.post(f"{stack.url}/v1/tasks", json=body, timeout=30)
    assert sent.status_code == 201, sent.text
    task_id = sent.json()["task_id"]
    return dict(
        wait_until(
            lambda: (t := stack.task(task_id))["status"] in ("success", "failed", "dead") and t,
            timeout=60,
            what=f"task {task_id}",
        )
    )


def test_the_key_does_not_follow_a_card_that_redirects_to_another_host(
    a2a_hub: tuple[Stack, A2aEchoProcess],
) -> None:
    """The admin names host A's card and gives its key; A's card answers 302 to a card on
    host B naming B's JSON-RPC. Followed, the key went to B with the first task."""
    stack, echo = a2a_hub
    recorder = Recorder()
    base = requests.get(echo.url + "/.well-known/agent-card.json", timeout=10).json()
    cards = CardServer(base, echo.url + "/", recorder)
    evil = CardServer(base, recorder.url, recorder)
    recorder.card = evil.card()  # B serves a card naming itself
    cards.card_moved_to = recorder.url + ".well-known/agent-card.json"
    try:
        added = requests.post(
            f"{stack.url}/api/v1/agents/a2a",
            json={
                "card_url": cards.url,
                "agent_id": "moved-card",
                "credential": KEY,
                "allow_loopback": True,
            },
            timeout=30,
        )
        if added.status_code == 201:  # followed: what the key does next is the harm
            _send(stack, "moved-card")
        assert not recorder.saw_the_key(), "the API key went to the host a redirect named"
        assert added.status_code == 502, added.text
        assert "HTTP 302" in added.json()["detail"]
    finally:
        evil.close()
        cards.close()
        recorder.close()


def test_the_key_does_not_follow_a_card_that_moves_its_rpc_to_another_host(
    a2a_hub: tuple[Stack, A2aEchoProcess],
) -> None:
    stack, echo = a2a_hub
    recorder = Recorder()
    base = requests.get(echo.url + "/.well-known/agent-card.json", timeout=10).json()
    cards = CardServer(base, echo.url + "/", recorder)
    try:
        added = requests.post(
            f"{stack.url}/api/v1/agents/a2a",
            json={
                "card_url": cards.url,
                "agent_id": "keyed-a2a",
                "credential": KEY,
                "allow_loopback": True,
            },
            timeout=30,
        )
        assert added.status_code == 201, added.text
        assert _send(stack, "keyed-a2a")["status"] == "success"
        cards.rpc_url = recorder.url  # the card now names another host
        time.sleep(3)  # several refreshes (every 0.5 s)
        task = _send(stack, "keyed-a2a")
        assert not recorder.saw_the_key(), "the API key went to a host the admin never named"
        assert task["status"] == "success", task  # still the host the key was given for
        agent = requests.get(f"{stack.url}/api/v1/agents/keyed-a2a", timeout=10).json()
        assert "credential" in json.dumps(agent), agent  # the refusal is visible to the admin
    finally:
        cards.close()
        recorder.close()


def test_the_key_does_not_follow_a_redirect(a2a_hub: tuple[Stack, A2aEchoProcess]) -> None:
    """The agent's JSON-RPC answers 307 to another host: the hub does not go there."""
    stack, echo = a2a_hub
    recorder = Recorder()
    base = requests.get(echo.url + "/.well-known/agent-card.json", timeout=10).json()
    cards = CardServer(base, "", recorder)
    cards.rpc_url = cards.url + "/rpc-redirect"
    try:
        added = requests.post(
            f"{stack.url}/api/v1/agents/a2a",
            json={
                "card_url": cards.url,
                "agent_id": "redirected-a2a",
                "credential": KEY,
                "allow_loopback": True,
            },
            timeout=30,
        )
        assert added.status_code == 201, added.text
        task = _send(stack, "redirected-a2a")
        assert task["status"] != "success"
        assert not recorder.headers, "a redirect was followed"
    finally:
        cards.close()
        recorder.close()
