"""Issue 37, items 3 and 4: a capability's ``params_schema`` is hostile input.

Through a real ``reach api`` process on SQLite and PostgreSQL:

* ReDoS: a ``pattern`` such as ``^(a+)+$`` stalled the API 3.9 s for 27 ``a``s and a
  ``!`` (doubling with each character). A backtracking pattern is refused at
  registration; patterns are matched by a linear-time engine, so even a schema stored
  before this rule answers at once, and ``/healthz`` stays fast meanwhile.
* Remote ``$ref``: the API fetched ``{"$ref": "http://..."}`` with no timeout, and slow
  refs blocked other callers. A reference to another document is refused at
  registration, and a stored one is never fetched (the payload is refused with why).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from sqlalchemy import update

from reach.hub.storage import create_engine_for
from reach.hub.storage.models import AgentRow
from tests.support.listeners import SlowHttpListener

PROBLEM = "urn:agent-reach:problem:"
EVIL = "^(a+)+$"
PAYLOAD = {"name": "a" * 40 + "!"}  # 2^40 steps for a backtracking engine


def _register(hub: str, agent_id: str, schema: dict[str, Any]) -> requests.Response:
    body = {
        "agent_id": agent_id,
        "addr": "127.0.0.1:9",
        "allow_loopback": True,
        "capabilities": [{"type": "greet", "params_schema": schema}],
    }
    return requests.post(hub + "/v1/agents/register", json=body, timeout=10)


def _store(store_url: str, agent_id: str, schema: dict[str, Any]) -> None:
    """Put ``schema`` in the stored declaration, as a hub before this rule kept it."""
    engine = create_engine_for(store_url)
    try:
        with engine.begin() as conn:
            caps = [{"type": "greet", "params_schema": schema}]
            conn.execute(
                update(AgentRow).where(AgentRow.agent_id == agent_id).values(capabilities=caps)
            )
    finally:
        engine.dispose()


def _submit(hub: str, agent_id: str, payload: dict[str, Any]) -> requests.Response:
    body = {"agent_id": agent_id, "method": "greet", "payload": payload}
    return requests.post(hub + "/v1/tasks", json=body, timeout=30)


@pytest.fixture
def slow_ref() -> Iterator[SlowHttpListener]:
    listener = SlowHttpListener(delay=5.0)
    try:
        yield listener
    finally:
        listener.close()


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"name": {"type": "string", "pattern": EVIL}}},
        {"type": "object", "patternProperties": {EVIL: {"type": "string"}}},
        {"type": "object", "properties": {"name": {"pattern": "(?=a)a+"}}},  # lookaround
        {"type": "object", "properties": {"name": {"pattern": "(a)\\1"}}},  # backreference
    ],
    ids=["nested-quantifier", "pattern-properties", "lookaround", "backreference"],
)
def test_a_backtracking_pattern_is_refused_at_registration(
    hub_api: str, schema: dict[str, Any]
) -> None:
    # a nested quantifier is linear for the hub's engine: accepted, and harmless
    r = _register(hub_api, "doc-redos", schema)
    if "(?=" in str(schema) or "\\1" in str(schema):
        assert r.status_code == 422, r.text
        assert r.headers["content-type"].startswith("application/problem+json")
        assert r.json()["type"] == PROBLEM + "invalid-request"
        assert "linear-time" in r.text
        return
    assert r.status_code == 201, r.text
    started = time.monotonic()
    answer = _submit(hub_api, "doc-redos", {"name": "a" * 40 + "!", "a" * 40 + "!": 1})
    # a backtracking engine needs ~2^40 steps here (hours); a loaded box takes seconds
    assert time.monotonic() - started < 15.0
    assert answer.status_code in (201, 422), answer.text


def test_a_stored_evil_pattern_cannot_stall_the_api(hub_api: str, store_url: str) -> None:
    r = _register(hub_api, "doc-redos", {"type": "object"})
    assert r.status_code == 201, r.text
    _store(
        store_url,
        "doc-redos",
        {"type": "object", "properties": {"name": {"type": "string", "pattern": EVIL}}},
    )
    health: list[float] = []

    def watch() -> None:
        for _ in range(10):
            started = time.monotonic()
            requests.get(hub_api + "/healthz", timeout=30)
            health.append(time.monotonic() - started)
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    started = time.monotonic()
    answers = [_submit(hub_api, "doc-redos", PAYLOAD) for _ in range(4)]
    took = time.monotonic() - started
    watcher.join()
    for answer in answers:
        assert answer.status_code == 422, answer.text
        assert answer.json()["type"] == PROBLEM + "invalid-payload"
        assert "does not match" in answer.json()["detail"]
    # 2^40 backtracking steps would take hours; bounds a loaded 2-core box still meets
    assert took < 10.0
    assert max(health) < 3.0, health


def test_a_remote_ref_is_refused_at_registration(hub_api: str, slow_ref: SlowHttpListener) -> None:
    url = f"http://127.0.0.1:{slow_ref.port}/schema.json"
    for schema in (
        {"$ref": url},
        {"type": "object", "properties": {"name": {"$ref": url}}},
        {"$id": url, "$ref": "other.json"},
        {"$dynamicRef": url},
    ):
        r = _register(hub_api, "doc-ref", schema)
        assert r.status_code == 422, r.text
        assert r.json()["type"] == PROBLEM + "invalid-request"
        assert "refer inside itself" in r.text or "retriev" in r.text
    # a reference inside the schema is fine
    inside = {"$defs": {"n": {"type": "string"}}, "properties": {"name": {"$ref": "#/$defs/n"}}}
    assert _register(hub_api, "doc-ref", inside).status_code == 201
    assert slow_ref.gauge.total == 0  # nothing was fetched


def test_a_stored_remote_ref_is_never_fetched(
    hub_api: str, store_url: str, slow_ref: SlowHttpListener
) -> None:
    r = _register(hub_api, "doc-ref", {"type": "object"})
    assert r.status_code == 201, r.text
    _store(store_url, "doc-ref", {"$ref": f"http://127.0.0.1:{slow_ref.port}/schema.json"})
    started = time.monotonic()
    answers = [_submit(hub_api, "doc-ref", {"name": "x"}) for _ in range(3)]
    assert time.monotonic() - started < 10.0  # a fetch would wait 5 s each: 15 s
    assert slow_ref.gauge.total == 0
    for answer in answers:
        assert answer.status_code == 422, answer.text
        assert answer.json()["type"] == PROBLEM + "invalid-payload"
        assert "cannot be used" in answer.json()["detail"]
    assert slow_ref.gauge.total == 0
