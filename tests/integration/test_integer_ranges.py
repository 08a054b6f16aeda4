"""Integers the database cannot hold are refused as 4xx problems, never a 500 (found by
fuzzing the OpenAPI: PostgreSQL's ``integer out of range``), and nothing is written."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from reach.hub.api import create_app
from reach.hub.clock import ManualClock
from reach.hub.settings import load_settings
from reach.worker.context import HubContext
from tests.integration.test_registry_api import PROBLEM, TYPE, reg
from tests.support.stores import snapshot

TOO_BIG = 2**31  # one past PostgreSQL's integer
HUGE = 26_082_172_949


@pytest.fixture
def client(store_url: str, engine: Engine, tmp_path: Any) -> Iterator[TestClient]:
    settings = load_settings(environ={"REACH_DATABASE_URL": store_url, "REACH_HOME": str(tmp_path)})
    ctx = HubContext(settings=settings, engine=engine, clock=ManualClock(start=1_800_000_000.0))
    with TestClient(create_app(ctx), raise_server_exceptions=False) as c:
        yield c


def _registered(client: TestClient) -> dict[str, Any]:
    answer = client.post("/v1/agents/register", json=reg(allow_loopback=True))
    assert answer.status_code == 201, answer.text
    return dict(answer.json())


CASES = [
    ("GET", f"/api/v1/dead-letters/{HUGE}", None),
    ("POST", f"/api/v1/dead-letters/{HUGE}/replay", None),
    ("GET", "/api/v1/dead-letters/-1", None),
    ("POST", "/v1/tasks/t-1/result", {"code": 0, "attempt_seq": TOO_BIG}),
    ("POST", "/v1/tasks/t-1/progress", {"progress": 0.5, "attempt_seq": TOO_BIG}),
    ("POST", "/v1/tasks/t-1/result", {"code": 2**70}),
]


@pytest.mark.parametrize(("method", "path", "body"), CASES)
def test_out_of_range_ids_and_fields_are_422(
    client: TestClient, engine: Engine, method: str, path: str, body: dict[str, Any] | None
) -> None:
    before = snapshot(engine)
    answer = client.request(method, path, json=body)
    assert answer.status_code == 422, answer.text
    assert answer.headers["content-type"].startswith(PROBLEM)
    assert answer.json()["type"].startswith(TYPE)
    assert snapshot(engine) == before


@pytest.mark.parametrize("field", ["in_flight", "consecutive_failure_count"])
def test_heartbeat_counts_beyond_the_column_are_refused(
    client: TestClient, engine: Engine, field: str
) -> None:
    ids = _registered(client)
    before = snapshot(engine)
    answer = client.post(
        "/v1/agents/heartbeat",
        json={"agent_id": ids["agent_id"], "instance_id": ids["instance_id"], field: TOO_BIG},
    )
    assert answer.status_code == 422, answer.text
    assert answer.headers["content-type"].startswith(PROBLEM)
    assert snapshot(engine) == before
