"""RabbitMQ as the broker: the whole delivery contract over AMQP, a worker SIGKILL and a
broker restart.

Real processes (api, worker, beat) on PostgreSQL with a RabbitMQ node of this module's own
(tests/support/private_rabbitmq: free ports, temporary directory, stopped and started
again by the restart test; the shared node on 5672 is never touched). The result backend
is left to its default, as the README's "or RabbitMQ" line does. Deliveries are counted at
raw HTTP agents (tests/support/counting_agent), below any dedup guard.
"""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests

import reach
from reach.hub.ledger.tasks import Publish
from reach.hub.settings import load_settings
from reach.worker.factory import create_celery
from reach.worker.publisher import Publisher
from tests.support import private_rabbitmq
from tests.support.counting_agent import CountingAgentProcess, Counts
from tests.support.ports import free_port
from tests.support.private_rabbitmq import PrivateRabbitMQ
from tests.support.stacks import Stack, start_stack, stop_stack
from tests.support.waiting import wait_until

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.skipif(not private_rabbitmq.available(), reason="rabbitmq-server not installed"),
]
on_postgres = pytest.mark.parametrize("shared_store_url", ["postgres"], indirect=True)

SETTINGS = {
    "REACH_ROUTER__CONNECT_TIMEOUT": "0.5",
    "REACH_ROUTER__READ_TIMEOUT": "2",
    "REACH_ROUTER__REPUBLISH_GRACE": "2",
    "REACH_ROUTER__BACKOFF_BASE": "0.2",
    "REACH_ROUTER__BACKOFF_CAP": "2",
    "REACH_ROUTER__MAX_RETRY": "2",
    "REACH_PROBE__INTERVAL": "1",
    "REACH_HEARTBEAT__SWEEP_INTERVAL": "1",
}
TERMINAL = ("success", "failed", "dead", "cancelled")
FIGURES: dict[str, Any] = {}  # measured outcomes, printed at the end of the module


@pytest.fixture(scope="module")
def rabbit() -> Iterator[PrivateRabbitMQ]:
    node = private_rabbitmq.started_node()
    try:
        yield node
    finally:
        node.destroy()


@pytest.fixture(scope="module")
def hub(
    shared_store_url: str, rabbit: PrivateRabbitMQ, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    home = tmp_path_factory.mktemp("amqp-hub")
    stack = start_stack(shared_store_url, home, {**SETTINGS, "REACH_BROKER_URL": rabbit.url})
    try:
        yield stack
    finally:
        stop_stack(stack)
        if FIGURES:
            print("\nRabbitMQ figures:", FIGURES)


@pytest.fixture(scope="module")
def agents(hub: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Raw counting agents: a healthy one, one failing each task's first two deliveries,
    one failing its first three (more than max_retry allows), three broadcast targets."""
    home = tmp_path_factory.mktemp("agents")
    specs: dict[str, tuple[str, ...]] = {
        "counter": ("--delay", "0.01"),
        "flaky": ("--fail-first", "2"),
        "doomed": ("--fail-first", "3"),
        **{f"fan-{n}": ("--method", "fan.out") for n in range(3)},
    }
    started = {
        name: CountingAgentProcess(
            hub.url, home / f"{name}.journal", free_port(), "--agent-id", name, *extra
        )
        for name, extra in specs.items()
    }
    try:
        wait_until(lambda: all(hub.instances(name) for name in started), timeout=30, what="agents")
        yield started
    finally:
        for agent in started.values():
            agent.stop()


def send_all(hub: Stack, agent_id: str, ids: list[str]) -> None:
    """Submit every task (resubmitting the same task_id while the hub is unavailable)."""

    def one(task_id: str) -> None:
        for _ in range(100):
            try:
                reach.send(
                    agent_id=agent_id,
                    method="work.do",
                    payload={"id": task_id},
                    task_id=task_id,
                    hub=hub.url,
                )
                return
            except reach.HubUnavailable:
                time.sleep(0.2)
        raise AssertionError(f"could not submit {task_id}")

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(one, ids))


def final_statuses(hub: Stack, ids: list[str], timeout: float = 60) -> Counter[str]:
    """Wait until every task is terminal; their statuses."""

    def done() -> Counter[str] | None:
        found = Counter(hub.task(task_id)["status"] for task_id in ids)
        return found if sum(found[s] for s in TERMINAL) == len(ids) else None

    return Counter(wait_until(done, timeout=timeout, interval=0.5, what="every task terminal"))


def delivered(counts: Counts, ids: list[str]) -> Counter[int]:
    """Tasks by deliveries at the agent: ``{1: 198, 2: 2}``."""
    return Counter(counts.deliveries[task_id] for task_id in ids)


def recoveries(hub: Stack, ids: list[str]) -> Counter[str]:
    """How the safety nets stepped in for these tasks: retries by reason, republishes."""
    found: Counter[str] = Counter()
    for task_id in ids:
        for event in hub.events(task_id):
            if event["kind"] in ("retry", "republished"):
                found[event["detail"].get("reason", event["kind"])] += 1
    return found


def assert_once_each(counts: Counts, ids: list[str]) -> None:
    missing = [t for t in ids if counts.side_effects[t] == 0]
    twice = {t: n for t, n in counts.side_effects.items() if t in ids and n > 1}
    assert not missing and not twice, f"side effects missing {missing[:5]}, repeated {twice}"


@on_postgres
def test_delivery_to_a_real_agent(hub: Stack, agents: dict[str, Any]) -> None:
    ids = [f"ok-{n:02d}" for n in range(20)]
    send_all(hub, "counter", ids)
    assert final_statuses(hub, ids) == Counter({"success": len(ids)})
    counts = agents["counter"].counts()
    assert delivered(counts, ids) == Counter({1: len(ids)})
    assert_once_each(counts, ids)
    result = reach.wait_for_result("ok-00", hub=hub.url)
    assert result.data == {"task_id": "ok-00", "first": True}


@on_postgres
def test_transient_failures_retry_with_backoff(hub: Stack, agents: dict[str, Any]) -> None:
    ids = [f"flaky-{n}" for n in range(5)]
    send_all(hub, "flaky", ids)
    assert final_statuses(hub, ids) == Counter({"success": len(ids)})
    counts = agents["flaky"].counts()
    assert delivered(counts, ids) == Counter({3: len(ids)})  # two 500s, then the answer
    assert all(counts.attempts[t] == [1, 2, 3] for t in ids), dict(counts.attempts)
    for task_id in ids:
        retries = [e["detail"] for e in hub.events(task_id) if e["kind"] == "retry"]
        assert [r["retry"] for r in retries] == [1, 2], retries
        # exponential: base 0.2 s then 0.4 s, each with jitter of at most the step
        assert 0 < retries[0]["delay_s"] <= 0.4 and 0 < retries[1]["delay_s"] <= 0.8, retries


@on_postgres
def test_exhausted_task_is_dead_lettered_and_replayed(hub: Stack, agents: dict[str, Any]) -> None:
    send_all(hub, "doomed", ["doomed-1"])
    assert final_statuses(hub, ["doomed-1"]) == Counter({"dead": 1})
    dead = requests.get(f"{hub.url}/api/v1/dead-letters", timeout=5).json()["dead_letters"]
    entry = next(d for d in dead if d["task_id"] == "doomed-1")
    assert entry["attempts"] == 3  # max_retry 2: the first try and two retries
    assert agents["doomed"].counts().deliveries["doomed-1"] == 3

    replay = requests.post(f"{hub.url}/api/v1/dead-letters/{entry['id']}/replay", timeout=5)
    assert replay.status_code == 200, replay.text
    assert final_statuses(hub, ["doomed-1"]) == Counter({"success": 1})
    counts = agents["doomed"].counts()
    assert counts.deliveries["doomed-1"] == 4 and counts.side_effects["doomed-1"] == 1
    assert counts.attempts["doomed-1"][-1] == replay.json()["attempt_seq"]


@on_postgres
def test_dag_run_over_amqp(hub: Stack, agents: dict[str, Any]) -> None:
    def node(node_id: str, deps: list[str]) -> dict[str, Any]:
        return {
            "id": node_id,
            "agent_id": "counter",
            "method": "work.do",
            "dependencies": deps,
            "payload": {"node": node_id},
        }

    spec = {
        "name": "amqp-diamond",
        "nodes": [
            node("split", []),
            node("left", ["split"]),
            node("right", ["split"]),
            node("merge", ["left", "right"]),
        ],
    }
    r = requests.post(f"{hub.url}/api/v1/dag-runs", json={"dag": spec, "input": {}}, timeout=10)
    assert r.status_code == 201, r.text
    run_id = r.json()["run_id"]
    run = wait_until(
        lambda: (
            (v := requests.get(f"{hub.url}/api/v1/dag-runs/{run_id}", timeout=5).json())
            and v["status"] != "running"
            and v
        ),
        timeout=60,
        interval=0.25,
        what=f"run {run_id}",
    )
    assert run["status"] == "success", run
    nodes = {n["node_id"]: n for n in run["nodes"]}
    assert set(nodes) == {"split", "left", "right", "merge"}
    assert nodes["merge"]["started_at"] >= max(
        nodes["left"]["finished_at"], nodes["right"]["finished_at"]
    )


@on_postgres
def test_broadcast_over_amqp(hub: Stack, agents: dict[str, Any]) -> None:
    result = reach.broadcast(method="fan.out", capability="fan.out", timeout=20, hub=hub.url)
    assert result.complete, result
    assert result.succeeded == 3, result.results
    for n in range(3):
        counts = agents[f"fan-{n}"].counts()
        assert sum(counts.deliveries.values()) == 1 and sum(counts.side_effects.values()) == 1


def test_publisher_confirms_and_measures_the_queue(rabbit: PrivateRabbitMQ, tmp_path: Path) -> None:
    """A publish the broker refuses is reported, not counted as sent (publisher confirms),
    and ``backlog`` reads the delivery queue's depth over AMQP. A vhost of its own, with
    no worker, whose queues take two messages and refuse the rest. The hub's home does not
    exist yet (a fresh host): the default result backend's SQLite file is made in it."""
    url = rabbit.add_vhost("publisher", {"max-length": 2, "overflow": "reject-publish"})
    home = tmp_path / "fresh-home"
    app = create_celery(load_settings(environ={"REACH_BROKER_URL": url, "REACH_HOME": str(home)}))
    publisher = Publisher(app)
    try:
        sent = [publisher.publish(Publish(f"confirm-{n}", 1, 0.0)) for n in range(3)]
        assert sent == [True, True, False]  # the third was nacked: the relay keeps it
        assert publisher.backlog() == 2
    finally:
        app.close()


@on_postgres
def test_worker_sigkill_mid_flight_loses_nothing(hub: Stack, agents: dict[str, Any]) -> None:
    agent = agents["counter"]
    ids = [f"kill-{n:03d}" for n in range(200)]
    submitter = threading.Thread(target=send_all, args=(hub, "counter", ids))
    submitter.start()
    wait_until(
        lambda: sum(agent.counts().deliveries[t] for t in ids) >= 40,
        timeout=60,
        what="work under way",
    )
    killed = hub.worker
    killed.kill_group()  # SIGKILL the worker and its pool children mid-flight
    killed.stop()
    started = time.monotonic()
    time.sleep(1.0)
    replacement = hub.start_worker()
    hub.procs.remove(replacement)
    hub.procs[1] = replacement  # hub.worker, for the tests that follow
    submitter.join(60)
    assert final_statuses(hub, ids, timeout=90) == Counter({"success": len(ids)})
    done_after = time.monotonic() - started
    counts = agent.counts()
    assert_once_each(counts, ids)
    FIGURES["worker_sigkill"] = {
        "tasks": len(ids),
        "deliveries_per_task": dict(delivered(counts, ids)),
        "all_done_after_kill_s": round(done_after, 1),
        "recovered_by": dict(recoveries(hub, ids)),
    }


@on_postgres
def test_broker_restart_mid_run_loses_nothing(
    hub: Stack, agents: dict[str, Any], rabbit: PrivateRabbitMQ
) -> None:
    """Half the tasks are queued when the broker stops, the other half are submitted while
    it is down: the API still accepts them (the outbox keeps them), nothing is lost."""
    agent = agents["counter"]
    ids = [f"restart-{n:03d}" for n in range(200)]
    before, during = ids[:100], ids[100:]
    send_all(hub, "counter", before)
    wait_until(
        lambda: sum(agent.counts().deliveries[t] for t in ids) >= 20,
        timeout=60,
        what="work under way",
    )
    rabbit.stop()
    down = time.monotonic()
    send_all(hub, "counter", during)
    submit_s = time.monotonic() - down
    assert submit_s < 30, f"submits while the broker was down took {submit_s:.1f}s"
    seen = sum(agent.counts().deliveries[t] for t in ids)
    rabbit.start()
    back = time.monotonic()
    wait_until(
        lambda: sum(agent.counts().deliveries[t] for t in ids) > seen,
        timeout=60,
        interval=0.1,
        what="deliveries after the restart",
    )
    first_after = time.monotonic() - back
    # The worker (reach.worker.consumer) and beat (reach.worker.beat_lock) retry their
    # broker connection every second. With kombu's growing schedule (2, 4, 6 … 30 s) each
    # sat idle for up to 30 s with the broker back, and the attempts the API could not
    # publish wait for beat's outbox relay: the first delivery came 6-9 s after the restart.
    # The schedule is the behaviour (the first retry at once, then one a second); the bound
    # only catches a reconnect that never came.
    for name, proc in (("worker", hub.worker), ("beat", hub.procs[2])):
        waits = {float(w) for w in re.findall(r"Trying again in ([0-9.]+) second", proc.output())}
        assert 1.0 in waits and waits <= {0.0, 1.0}, (
            f"{name} waited {sorted(waits)} s between broker connection tries"
        )
    assert first_after < 15, f"first delivery {first_after:.1f}s after the broker came back"
    assert final_statuses(hub, ids, timeout=90) == Counter({"success": len(ids)})
    all_done = time.monotonic() - back
    counts = agent.counts()
    assert_once_each(counts, ids)
    FIGURES["broker_restart"] = {
        "tasks": len(ids),
        "submitted_while_down": len(during),
        "submit_while_down_s": round(submit_s, 1),
        "broker_down_s": round(back - down, 1),
        "deliveries_per_task": dict(delivered(counts, ids)),
        "first_delivery_after_restart_s": round(first_after, 1),
        "all_done_after_restart_s": round(all_done, 1),
        "recovered_by": dict(recoveries(hub, ids)),
    }
