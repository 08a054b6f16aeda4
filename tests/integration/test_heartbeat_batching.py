"""Quiet heartbeats written in batches (`reach.hub.api.heartbeats`), on SQLite and
PostgreSQL, in-process with a controlled clock: the batch still brings an instance back
online with its transition recorded, and an instance whose beats stop still goes offline
after ``missed_intervals`` x its interval."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import anyio.to_thread
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, select

from reach.hub.api import create_app
from reach.hub.clock import ManualClock
from reach.hub.fleet import reachability as monitoring
from reach.hub.fleet import registry
from reach.hub.fleet.reachability import Policy
from reach.hub.settings import load_settings
from reach.hub.storage import session_factory
from reach.hub.storage.models import InstanceEventRow, InstanceRow
from reach.wire.schemas import HeartbeatRequest
from reach.worker.context import HubContext
from tests.support.waiting import wait_until

AGENT = "beater"


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(start=1_800_000_000.0)


@pytest.fixture
def ctx(store_url: str, engine: Engine, clock: ManualClock, tmp_path: Any) -> HubContext:
    env = {
        "REACH_DATABASE_URL": store_url,
        "REACH_HOME": str(tmp_path),
        "REACH_HEARTBEAT__FLUSH_S": "0.05",
    }
    return HubContext(settings=load_settings(environ=env), engine=engine, clock=clock)


@pytest.fixture
def client(ctx: HubContext) -> Iterator[TestClient]:
    with TestClient(create_app(ctx)) as c:
        yield c


def register(client: TestClient, instance_id: str, interval: float, host: int = 5) -> None:
    body = {
        "agent_id": AGENT,
        "instance_id": instance_id,
        "addr": f"10.0.0.{host}:7001",  # one instance per address
        "heartbeat_interval": interval,
    }
    assert client.post("/v1/agents/register", json=body).status_code == 201


def beat(client: TestClient, instance_id: str, **facts: Any) -> dict[str, Any]:
    body = {"agent_id": AGENT, "instance_id": instance_id, **facts}
    r = client.post("/v1/agents/heartbeat", json=body)
    assert r.status_code == 200, r.text
    answer: dict[str, Any] = r.json()
    return answer


def row(engine: Engine, instance_id: str) -> InstanceRow:
    with session_factory(engine).begin() as s:
        found = s.get(InstanceRow, instance_id)
        assert found is not None
        s.expunge(found)
        return found


def transitions(engine: Engine, instance_id: str) -> list[tuple[str, str]]:
    with session_factory(engine).begin() as s:
        events = s.scalars(
            select(InstanceEventRow)
            .where(InstanceEventRow.instance_id == instance_id, InstanceEventRow.kind == "status")
            .order_by(InstanceEventRow.id)
        ).all()
        return [(e.detail["from"], e.detail["to"]) for e in events]


def sweep(engine: Engine, ctx: HubContext, clock: ManualClock) -> list[str]:
    with session_factory(engine).begin() as s:
        return monitoring.sweep(s, clock.now(), Policy.from_settings(ctx.settings))


def test_quiet_beats_land_and_silence_still_goes_offline(
    client: TestClient, engine: Engine, ctx: HubContext, clock: ManualClock
) -> None:
    register(client, "i-1", interval=2)
    for _ in range(4):  # every 1.5 s: online throughout, each beat recorded
        clock.advance(1.5)
        assert beat(client, "i-1", current_load=0.25) == {
            "status": "online",
            "next_heartbeat_in": 2.0,
        }
        last = clock.now()
        wait_until(lambda at=last: row(engine, "i-1").last_heartbeat == at, 10, what="beat written")
    assert row(engine, "i-1").current_load == 0.25
    clock.advance(5.9)  # under 3 x 2 s since the last beat
    assert sweep(engine, ctx, clock) == []
    clock.advance(0.1)  # the beats stopped: offline at 3 x the interval, as before
    assert sweep(engine, ctx, clock) == ["i-1"]
    assert row(engine, "i-1").status == "offline"
    # the next beat brings it back, the transition recorded
    clock.advance(1)
    assert beat(client, "i-1")["status"] == "online"
    assert row(engine, "i-1").status == "online"
    assert transitions(engine, "i-1") == [("online", "offline"), ("offline", "online")]


def test_a_batch_records_the_transitions_it_makes(
    client: TestClient, engine: Engine, ctx: HubContext, clock: ManualClock
) -> None:
    """Beats buffered on a stale view (another process saw the instance go offline, or
    become busy) are re-assessed on the locked row: the transition is recorded."""
    for host, iid in enumerate(("back", "busy", "same", "gone"), start=5):
        register(client, iid, interval=2, host=host)
    clock.advance(6)
    assert sorted(sweep(engine, ctx, clock)) == ["back", "busy", "gone", "same"]
    client.post("/v1/agents/deregister", json={"agent_id": AGENT, "instance_id": "gone"})
    clock.advance(1)
    beat(client, "same")  # online again at once
    at = clock.now()
    beats = [
        (HeartbeatRequest(agent_id=AGENT, instance_id="back"), at),
        (HeartbeatRequest(agent_id=AGENT, instance_id="busy", in_flight=8, max_concurrency=8), at),
        (HeartbeatRequest(agent_id=AGENT, instance_id="same"), at + 0.5),
        (HeartbeatRequest(agent_id=AGENT, instance_id="gone"), at),
        (HeartbeatRequest(agent_id="someone-else", instance_id="same"), at),
    ]
    written = ctx.write(lambda s: registry.heartbeats(s, beats, ctx.policy))
    assert {iid: b and b.status for iid, b in written.items()} == {
        "back": "online",
        "busy": "degraded",
        "same": "online",
        "gone": None,  # deregistered: its beat dropped
    }
    assert transitions(engine, "back") == [("online", "offline"), ("offline", "online")]
    assert transitions(engine, "busy") == [("online", "offline"), ("offline", "degraded")]
    assert row(engine, "same").last_heartbeat == at + 0.5
    assert row(engine, "gone").status == "deregistered"


def test_a_quiet_beat_is_answered_while_every_worker_thread_is_busy(
    client: TestClient, engine: Engine, clock: ManualClock
) -> None:
    """A fleet's quiet beats are only buffered, so the API answers them on its event loop:
    requests that hold every worker thread (slow database work) do not delay them. A beat
    that must be written still waits for a thread."""
    register(client, "quiet", interval=2)
    register(client, "busy", interval=2, host=6)
    clock.advance(1)
    assert beat(client, "busy")["status"] == "online"
    hold = threading.Event()
    portal = client.portal
    assert portal is not None

    async def occupy() -> None:  # every thread of the app's pool taken, until released
        anyio.to_thread.current_default_thread_limiter().total_tokens = 1
        await anyio.to_thread.run_sync(hold.wait)

    async def borrowed() -> int:
        return int(anyio.to_thread.current_default_thread_limiter().borrowed_tokens)

    held = portal.start_task_soon(occupy)
    pool = ThreadPoolExecutor(2)
    try:
        wait_until(lambda: portal.call(borrowed) == 1, 10, what="the pool held")
        quiet = pool.submit(beat, client, "quiet")
        written = pool.submit(beat, client, "busy", in_flight=1)  # must be written
        try:
            assert quiet.result(timeout=10)["status"] == "online"
        except FutureTimeout:
            pytest.fail("a quiet beat waited for a worker thread")
        with pytest.raises(FutureTimeout):
            written.result(timeout=0.5)
        hold.set()
        assert written.result(timeout=10)["status"] == "online"
        last = clock.now()
        wait_until(lambda: row(engine, "quiet").last_heartbeat == last, 10, what="beat written")
    finally:
        hold.set()  # before the pool's shutdown: its requests may be waiting for the thread
        pool.shutdown(wait=True)
        held.result(timeout=10)
