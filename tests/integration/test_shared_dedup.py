"""A dedup guard shared by an agent's replicas (issue 39, seed 003's pitfall 6.3 for
replicated agents): the first replica times out after its side effect, the hub's retry
lands on the second, and the side effect runs once -- with the guard in Redis or in
PostgreSQL. With each replica's own guard (memory), the same run does it twice.

A real hub (api, worker, beat on PostgreSQL and Redis), two SDK replicas in this process.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

import reach
from tests.support.ports import free_port
from tests.support.stacks import Stack
from tests.support.stores import PG_URL_TEMPLATE, pg
from tests.support.waiting import wait_until

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.parametrize("shared_store_url", ["postgres"], indirect=True),
    pytest.mark.timeout(180),
]
STACK_SETTINGS = {"REACH_ROUTER__BACKOFF_BASE": "0.2", "REACH_ROUTER__BACKOFF_CAP": "1"}
THINK_S = 5.0  # past the exchange's 4 s (connect 2 + the task's 2 s timeout): retried elsewhere


@pytest.fixture
def dedup_url(request: pytest.FixtureRequest) -> Iterator[str | None]:
    kind = request.param
    if kind == "memory":
        yield None
    elif kind == "redis":
        yield str(request.getfixturevalue("redis_db"))  # a database of its own, flushed
    else:
        name = f"reach_dedup_{uuid.uuid4().hex[:8]}"
        pg(f'CREATE DATABASE "{name}"')
        try:
            yield PG_URL_TEMPLATE.format(db=name)
        finally:
            pg(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class Replicas:
    def __init__(self, stack: Stack, agent_id: str, dedup_url: str | None) -> None:
        self.side_effects: Counter[str] = Counter()
        self.ran_at: dict[str, str] = {}
        self._lock = threading.Lock()
        self.agents = [self._start(stack, agent_id, dedup_url) for _ in range(2)]

    def _start(self, stack: Stack, agent_id: str, dedup_url: str | None) -> reach.Agent:
        agent = reach.Agent(
            agent_id,
            addr=f"127.0.0.1:{free_port()}",
            allow_loopback=True,
            capabilities=[{"type": "pay"}],
            heartbeat_interval=0.5,
            hub=stack.url,
            dedup_store=dedup_url,
            accept_after=None,  # answer when the handler ends: the hub's timeout decides
        )
        me = agent.instance_id

        @agent.route("pay")
        def pay(task_id: str, payload: dict[str, Any]) -> dict[str, Any]:
            with self._lock:
                self.side_effects[task_id] += 1  # the side effect: a payment made
                self.ran_at[task_id] = me
            time.sleep(THINK_S)
            return {"paid": payload["amount"]}

        agent.start()
        wait_until(
            lambda: any(
                i["instance_id"] == me and i["status"] == "online"
                for i in stack.instances(agent_id)
            ),
            timeout=30,
            what=f"replica {me} online",
        )
        return agent

    def close(self) -> None:
        for agent in self.agents:
            agent.close()


@pytest.mark.parametrize(
    ("dedup_url", "runs"),
    [("redis", 1), ("postgres", 1), ("memory", 2)],
    indirect=["dedup_url"],
)
def test_a_retry_at_another_replica_does_not_run_the_side_effect_again(
    shared_stack: Stack, dedup_url: str | None, runs: int
) -> None:
    agent_id = f"payments-{uuid.uuid4().hex[:6]}"
    group = Replicas(shared_stack, agent_id, dedup_url)
    try:
        sub = reach.send(
            agent_id=agent_id, method="pay", payload={"amount": 42}, timeout_ms=2000,
            hub=shared_stack.url,
        )  # fmt: skip
        result = reach.wait_for_result(sub.task_id, timeout=60, hub=shared_stack.url)
        assert result.data == {"paid": 42}
        # the hub delivered it to both replicas (the first timed out) ...
        dispatched = [
            e.get("instance_id") or e["detail"].get("instance_id")
            for e in shared_stack.events(sub.task_id)
            if e["kind"] == "dispatched"
        ]
        assert len(dispatched) >= 2 and len(set(dispatched)) == 2, dispatched
        # ... and the payment was made once with a shared guard, twice without
        assert group.side_effects[sub.task_id] == runs
    finally:
        group.close()
