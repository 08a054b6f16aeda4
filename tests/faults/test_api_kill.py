"""The API SIGKILLed mid-submit and mid-long-poll: callers resubmit, each gets one task.

Callers are threads using ``reach.send`` with an explicit task_id and then
``reach.wait_for_result``; whenever the hub is unavailable they resubmit the same
task_id and wait again. The API is killed twice (once while bursts of submits are in
flight, once while every caller is long-polling) and restarted on the same port. Every
task must end exactly once (one terminal event), and the raw agent counts deliveries.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import reach
from tests.support.counting_agent import CountingAgentProcess
from tests.support.ports import free_port
from tests.support.stacks import HubProcess, Stack, start_stack, stop_stack, wait_http_ok
from tests.support.waiting import wait_until

pytestmark = pytest.mark.postgres

SETTINGS = {
    "REACH_ROUTER__CONNECT_TIMEOUT": "0.5",
    "REACH_ROUTER__READ_TIMEOUT": "2",
    "REACH_ROUTER__REPUBLISH_GRACE": "2",
    "REACH_PROBE__INTERVAL": "1",
    "REACH_HEARTBEAT__SWEEP_INTERVAL": "1",
}
CALLERS = 8
PER_CALLER = 30  # enough that callers still wait when the bursts are done (kill 2)
BURSTERS = 2
PER_BURSTER = 30


@pytest.fixture
def kill_stack(private_pg_url: str, redis_db: str, tmp_path: Path) -> Iterator[Stack]:
    extra = {**SETTINGS, "REACH_BROKER_URL": redis_db, "REACH_RESULT_BACKEND": redis_db}
    stack = start_stack(private_pg_url, tmp_path, extra)
    try:
        yield stack
    finally:
        stop_stack(stack)


@dataclass
class Callers:
    """Threads that submit and wait, resubmitting the same task_id after any outage."""

    hub: str
    phase: dict[str, str] = field(default_factory=dict)  # thread -> submit | poll | done
    resubmits: Counter[str] = field(default_factory=Counter)
    results: dict[str, str] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    submitted: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def _submit(self, task_id: str) -> None:
        reach.send(
            agent_id="counter",
            method="work.do",
            payload={"id": task_id},
            task_id=task_id,
            hub=self.hub,
        )

    def _until_done(self, name: str, task_id: str, wait: bool) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                self.phase[name] = "submit"
                self._submit(task_id)
                with self.lock:
                    self.submitted += 1
                if not wait:
                    return
                self.phase[name] = "poll"
                result = reach.wait_for_result(task_id, timeout=30, hub=self.hub)
                with self.lock:
                    self.results[task_id] = str(result.data["task_id"])
                return
            except reach.HubUnavailable:
                with self.lock:
                    self.resubmits[task_id] += 1
                time.sleep(0.2)
            except reach.ReachError as exc:  # a conflict on resubmit would land here
                with self.lock:
                    self.errors.append(f"{task_id}: {exc!r}")
                return
        with self.lock:
            self.errors.append(f"{task_id}: not done in 60 s")

    def caller(self, name: str, ids: list[str]) -> None:
        for task_id in ids:
            self._until_done(name, task_id, wait=True)
        self.phase[name] = "done"

    def burster(self, name: str, ids: list[str]) -> None:
        """Submits only, back to back: at any kill some of them are mid-request."""
        for task_id in ids:
            self._until_done(name, task_id, wait=False)
            time.sleep(0.05)
        self.phase[name] = "done"

    def in_phase(self, phase: str) -> int:
        return sum(1 for p in list(self.phase.values()) if p == phase)


def restart_api(stack: Stack, n: int) -> float:
    """SIGKILL the API (and its children), start it again on the same port; seconds down."""
    port = stack.url.rsplit(":", 1)[1]
    stack.procs[0].kill_group()
    killed = time.monotonic()
    stack.procs[0].stop()  # closes its log
    api = HubProcess(["api", "--port", port], stack.env, stack.home / f"api-{n}.log")
    stack.procs[0] = api
    wait_http_ok(stack.url + "/healthz", api)
    return time.monotonic() - killed


def test_api_killed_mid_submit_and_mid_long_poll(kill_stack: Stack, tmp_path: Path) -> None:
    stack = kill_stack
    agent = CountingAgentProcess(stack.url, tmp_path / "journal.log", free_port(), "--delay", "0.1")
    try:
        wait_until(lambda: stack.instance("counter"), timeout=30, what="agent registered")
        callers = Callers(stack.url)
        waited = {f"c{c}": [f"wait-{c}-{n:02d}" for n in range(PER_CALLER)] for c in range(CALLERS)}
        burst = {
            f"b{b}": [f"burst-{b}-{n:02d}" for n in range(PER_BURSTER)] for b in range(BURSTERS)
        }
        threads = [
            threading.Thread(target=callers.caller, args=item, daemon=True)
            for item in waited.items()
        ] + [
            threading.Thread(target=callers.burster, args=item, daemon=True)
            for item in burst.items()
        ]
        for t in threads:
            t.start()

        # kill 1: while the bursts of submits are flowing
        wait_until(lambda: callers.submitted >= 25, timeout=30, what="submits under way")
        at_kill = [(callers.in_phase("submit"), callers.in_phase("poll"))]
        downtimes = [restart_api(stack, 1)]
        # kill 2: after the bursts, while the callers are long-polling
        wait_until(
            lambda: (
                all(callers.phase.get(b) == "done" for b in burst)
                and callers.in_phase("poll") >= CALLERS // 2
            ),
            timeout=40,
            what="callers long-polling",
        )
        time.sleep(0.05)  # let the polls reach the API
        at_kill.append((callers.in_phase("submit"), callers.in_phase("poll")))
        downtimes.append(restart_api(stack, 2))

        for t in threads:
            t.join(70)
        assert not any(t.is_alive() for t in threads), callers.phase
        assert not callers.errors, callers.errors[:5]
        all_ids = [i for ids in (*waited.values(), *burst.values()) for i in ids]
        assert at_kill[0][0] >= 1 and at_kill[1][1] >= CALLERS // 2, at_kill
        # the kills were felt by submitters and by long-pollers alike
        assert any(t.startswith("burst-") for t in callers.resubmits), callers.resubmits
        assert any(t.startswith("wait-") for t in callers.resubmits), callers.resubmits

        # every waited task answered its caller with its own result; every task ended once
        assert callers.results == {i: i for ids in waited.values() for i in ids}
        wait_until(
            lambda: all(stack.task(i)["status"] == "success" for i in all_ids),
            timeout=40,
            interval=0.5,
            what="every task to succeed",
        )
        ends = Counter()
        for task_id in all_ids:
            kinds = [e["kind"] for e in stack.events(task_id)]
            ends[kinds.count("terminal_success")] += 1
        assert ends == Counter({1: len(all_ids)}), ends

        counts = agent.counts()
        assert set(counts.deliveries) == set(all_ids)
        assert counts.side_effects == Counter(dict.fromkeys(all_ids, 1))
        print(
            f"\nFAULT api-sigkill: {len(all_ids)} tasks ({CALLERS} callers x {PER_CALLER} "
            f"submit+wait, {BURSTERS} x {PER_BURSTER} submit-only), API killed twice "
            f"(submit/poll callers in flight at each kill: {at_kill}), down "
            f"{', '.join(f'{d:.1f}' for d in downtimes)} s; "
            f"{sum(callers.resubmits.values())} resubmits over {len(callers.resubmits)} tasks; "
            f"one task and one terminal event each; deliveries per task "
            f"{dict(sorted(counts.redeliveries().items()))}, side effects once each"
        )
    finally:
        agent.stop()
