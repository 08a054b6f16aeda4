"""Routing by expected wait, through a real hub (api, worker, beat) on both stores, with SDK
agents in this process counting what reached each replica:

* every near-equal replica shares the work: three replicas of one agent each take about a
  third (the top two alone took all of it before);
* load counts: a replica holding 7 of its 8 slots gets a small share beside an idle one
  of the same agent (a coin flip before: the scores were within 5 points).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from typing import Any

import pytest

import reach
from tests.support.ports import free_port
from tests.support.stacks import Stack
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(240)


class Replicas:
    """SDK instances of one agent in this process: ``quick`` answers at once (counted per
    instance), ``hold`` keeps its slot until ``release`` is set."""

    def __init__(self, stack: Stack, agent_id: str) -> None:
        self.stack = stack
        self.agent_id = agent_id
        self.quick: Counter[str] = Counter()
        self.release = threading.Event()
        self._lock = threading.Lock()
        self.agents: list[reach.Agent] = []

    def start_one(self) -> reach.Agent:
        agent = reach.Agent(
            self.agent_id,
            addr=f"127.0.0.1:{free_port()}",
            allow_loopback=True,
            capabilities=[{"type": "quick"}, {"type": "hold"}],
            max_concurrency=8,
            heartbeat_interval=0.5,
            hub=self.stack.url,
        )
        me = agent.instance_id

        @agent.route("quick")
        def quick(task_id: str, payload: dict[str, Any]) -> str:
            with self._lock:
                self.quick[me] += 1
            return me

        @agent.route("hold")
        def hold(task_id: str, payload: dict[str, Any]) -> str:
            self.release.wait(120)
            return me

        agent.start()
        self.agents.append(agent)
        wait_until(
            lambda: any(
                i["instance_id"] == me and i["status"] == "online"
                for i in self.stack.instances(self.agent_id)
            ),
            timeout=30,
            what=f"{me} online",
        )
        return agent

    def send(self, method: str, count: int) -> list[str]:
        def one(_: int) -> str:
            return reach.send(
                agent_id=self.agent_id, method=method, payload={}, hub=self.stack.url
            ).task_id

        with ThreadPoolExecutor(8) as pool:
            return list(pool.map(one, range(count)))

    def wait_all(self, task_ids: list[str]) -> None:
        for task_id in task_ids:
            result = reach.wait_for_result(task_id, timeout=60, hub=self.stack.url)
            assert result.data in {a.instance_id for a in self.agents}


@contextmanager
def replicas(stack: Stack, agent_id: str) -> Iterator[Replicas]:
    group = Replicas(stack, agent_id)
    with ExitStack() as cleanup:
        cleanup.callback(lambda: [a.close() for a in group.agents])
        cleanup.callback(group.release.set)
        yield group


def test_every_near_equal_replica_shares_the_work(shared_stack: Stack) -> None:
    with replicas(shared_stack, "three-replicas") as group:
        for _ in range(3):
            group.start_one()
        group.wait_all(group.send("quick", 300))
        shares = {a.instance_id: group.quick[a.instance_id] / 300 for a in group.agents}
    assert sum(group.quick.values()) == 300
    # a third each, give or take: the draw weighs each replica by the load its last heartbeat
    # reported, and on a loaded box those run a beat behind (once 0.20 / 0.51 / 0.28); the
    # old top-two spread gave the third nothing
    for share in shares.values():
        assert 0.15 <= share <= 0.55, shares


def test_a_busy_replica_gets_little_beside_an_idle_one(shared_stack: Stack) -> None:
    with replicas(shared_stack, "busy-and-idle") as group:
        busy = group.start_one()
        held = group.send("hold", 7)  # the only replica: it takes all seven
        wait_until(
            lambda: (i := shared_stack.instance("busy-and-idle")) and i["in_flight"] == 7,
            timeout=30,
            what="the busy replica's heartbeat saying 7 in flight",
        )
        idle = group.start_one()

        def both_in_the_gate() -> bool:
            # a new instance earns its probe credit over a few probes; until its score is
            # within the gate of the busy one's, it is not yet a candidate at all
            views = {i["instance_id"]: i for i in shared_stack.instances("busy-and-idle")}
            if busy.instance_id not in views or idle.instance_id not in views:
                return False
            b, i = views[busy.instance_id], views[idle.instance_id]
            return bool(i["routable"]) and i["reach_score"] >= b["reach_score"] - 10

        wait_until(both_in_the_gate, timeout=60, what="the idle replica scored near the busy")
        group.wait_all(group.send("quick", 100))
        group.release.set()
        group.wait_all(held)
    assert group.quick[busy.instance_id] + group.quick[idle.instance_id] == 100
    # 1/cost: the idle one weighs 8, the busy one 1 (about 89 of 100); a coin flip before.
    # Loads come from heartbeats: on a loaded box a stale one costs a few points
    assert group.quick[idle.instance_id] >= 60, group.quick
