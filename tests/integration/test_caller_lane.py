"""A flood of callers' submits cannot take the threads agents need (`reach.hub.api.lanes`),
nor a background flood the threads online submits need.

The flood is made to wait where a real one does: every submit to an agent takes that
agent's queue lock (`reach.hub.flow.admission`), and here the test holds the lock, so the
submits pile up inside their transactions. A real `reach api` on PostgreSQL; another
agent's heartbeat (or, behind a background flood, an online submit to another agent) must
still be answered, and every submit lands once the lock is free.
"""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest
import requests

from reach.core.flow.priority import lane_tokens
from reach.hub.api.lanes import CallerLane, caller_tokens
from reach.hub.flow import admission
from tests.support.stores import PG_ADMIN_DSN
from tests.support.waiting import wait_until

FLOOD = 60  # more than the 40 threads every request shares


@pytest.mark.parametrize(("pool_size", "tokens"), [(20, 10), (5, 2), (2, 1), (1, 1), (500, 250)])
def test_the_lane_is_half_the_pool(pool_size: int, tokens: int) -> None:
    assert caller_tokens(pool_size) == tokens


def test_a_lane_needs_a_token() -> None:
    with pytest.raises(ValueError, match="at least one token"):
        CallerLane(0)


def _register(hub: str, agent_id: str, port: int) -> str:
    answer = requests.post(
        f"{hub}/v1/agents/register",
        json={"agent_id": agent_id, "addr": f"127.0.0.1:{port}", "allow_loopback": True},
        timeout=10,
    )
    assert answer.status_code == 201, answer.text
    return str(answer.json()["instance_id"])


def _waiting_on_locks(database: str) -> int:
    with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s "
            "AND wait_event_type = 'Lock' AND wait_event = 'advisory'",
            (database,),
        ).fetchone()
    return int(row[0]) if row else 0


@pytest.mark.parametrize(
    "store_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
def test_heartbeats_are_answered_while_submits_pile_up(hub_api: str, store_url: str) -> None:
    _register(hub_api, "flooded", 9)
    other = _register(hub_api, "bystander", 7)  # nobody listens on either
    database = store_url.rsplit("/", 1)[1]
    prefix = f"flood-{uuid.uuid4().hex[:6]}-"

    def submit(n: int) -> requests.Response:
        return requests.post(
            f"{hub_api}/v1/tasks",
            json={"agent_id": "flooded", "method": "m", "task_id": f"{prefix}{n}"},
            timeout=60,
        )

    lock = psycopg.connect(store_url.replace("postgresql+psycopg", "postgresql"), autocommit=True)
    try:
        lock.execute(
            "SELECT pg_advisory_lock(%s, %s)",
            (admission._LOCK_SPACE, admission._lock_key("flooded")),
        )
        with ThreadPoolExecutor(max_workers=FLOOD) as pool:
            answers = [pool.submit(submit, n) for n in range(FLOOD)]
            # the lane's submits are inside their transactions, waiting on the lock
            wait_until(lambda: _waiting_on_locks(database), timeout=20, what="submits at the lock")
            time.sleep(1.0)  # the rest of the flood arrives and queues
            assert not any(a.done() for a in answers)

            started = time.monotonic()
            beat = requests.post(
                f"{hub_api}/v1/agents/heartbeat",
                json={"agent_id": "bystander", "instance_id": other},
                timeout=10,
            )
            assert beat.status_code == 200, beat.text
            assert time.monotonic() - started < 5
            assert not any(a.done() for a in answers)  # still held: the beat did not wait
            online_tokens, _ = lane_tokens(caller_tokens(20))
            assert _waiting_on_locks(database) == online_tokens  # the lane's tokens, no more

            lock.execute("SELECT pg_advisory_unlock_all()")
            codes: list[Any] = [a.result(timeout=60).status_code for a in answers]
        stored = lock.execute(
            "SELECT count(DISTINCT task_id) FROM tasks WHERE task_id LIKE %s", (prefix + "%",)
        ).fetchone()
    finally:
        lock.close()
    assert codes == [201] * FLOOD
    assert stored == (FLOOD,)


@pytest.mark.parametrize(
    "store_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
def test_an_online_submit_passes_a_background_flood_held_at_its_agent(
    hub_api: str, store_url: str
) -> None:
    _register(hub_api, "batch", 9)
    _register(hub_api, "chat", 7)  # nobody listens on either: the tasks just wait
    database = store_url.rsplit("/", 1)[1]
    prefix = f"bg-{uuid.uuid4().hex[:6]}-"
    flood = 3 * caller_tokens(20)  # more than every caller token there is

    def submit(n: int) -> requests.Response:
        return requests.post(
            f"{hub_api}/v1/tasks",
            json={
                "agent_id": "batch",
                "method": "m",
                "task_id": f"{prefix}{n}",
                "priority": "background",
            },
            timeout=60,
        )

    lock = psycopg.connect(store_url.replace("postgresql+psycopg", "postgresql"), autocommit=True)
    try:
        lock.execute(
            "SELECT pg_advisory_lock(%s, %s)",
            (admission._LOCK_SPACE, admission._lock_key("batch")),
        )
        with ThreadPoolExecutor(max_workers=flood) as pool:
            answers = [pool.submit(submit, n) for n in range(flood)]
            _, background_tokens = lane_tokens(caller_tokens(20))
            wait_until(
                lambda: _waiting_on_locks(database) == background_tokens,
                timeout=20,
                what="the background lane's submits at the lock",
            )
            # an online submit to another agent is accepted while the flood still waits
            online = requests.post(
                f"{hub_api}/v1/tasks",
                json={"agent_id": "chat", "method": "m", "priority": "online"},
                timeout=30,
            )
            assert online.status_code == 201, online.text
            assert not any(a.done() for a in answers)  # the flood was still held
            assert _waiting_on_locks(database) == background_tokens  # its lane's tokens only

            lock.execute("SELECT pg_advisory_unlock_all()")
            codes: list[Any] = [a.result(timeout=60).status_code for a in answers]
    finally:
        lock.close()
    assert codes == [201] * flood
