"""Two ``reach beat`` processes at once: exactly one sends; SIGKILL it and the other takes
over within ``lock_lease_s + lock_poll_s``; the restarted one stands by. A paused active
beat (SIGSTOP) is replaced too and, resumed, sends nothing more.

Real processes on both stores: PostgreSQL with Redis (this worker's database number),
SQLite with the embedded broker. Sends are counted in each beat's own log, executions in
the worker's.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from reach.hub.storage import create_engine_for
from reach.hub.storage.leases import LeaseStore
from tests.support.stacks import HubProcess, hub_env
from tests.support.waiting import wait_until

LEASE_S, RENEW_S, POLL_S = 3.0, 1.0, 0.5
BOUND_S = LEASE_S + POLL_S
SLACK_S = 2.0  # process start-up and a busy 2-core machine
BEAT_SETTINGS = {
    "REACH_BEAT__LOCK_LEASE_S": str(LEASE_S),
    "REACH_BEAT__LOCK_RENEW_S": str(RENEW_S),
    "REACH_BEAT__LOCK_POLL_S": str(POLL_S),
    "REACH_HEARTBEAT__SWEEP_INTERVAL": "0.5",
    "REACH_PROBE__INTERVAL": "0.5",
    "REACH_PROBE__FAST_INTERVAL": "0.5",
}
SENT = "Scheduler: Sending due task"
HOLDER = re.compile(r"beat active: (\S+) holds the lock")


class Beat:
    def __init__(self, env: dict[str, str], home: Path, name: str) -> None:
        self.process = HubProcess(["beat"], env, home / f"{name}.log")
        self.name = name

    def sends(self) -> int:
        return self.process.output().count(SENT)

    def holder(self) -> str | None:
        """This beat's holder id, once it became active."""
        found = HOLDER.search(self.process.output())
        return found.group(1) if found else None

    def is_standby(self) -> bool:
        return "beat standby: lock held by" in self.process.output()


@pytest.fixture
def hub(store_url: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, str]]:
    """The environment of a hub on this store, with one worker running."""
    extra = dict(BEAT_SETTINGS)
    if "postgres" in store_url:
        redis_url: str = request.getfixturevalue("redis_db")
        extra.update(REACH_BROKER_URL=redis_url, REACH_RESULT_BACKEND=redis_url)
    env = hub_env(store_url, tmp_path, **extra)
    worker = HubProcess(["worker", "--concurrency", "1"], env, tmp_path / "worker.log")
    try:
        yield env
    finally:
        worker.stop()


def executions(home: Path) -> int:
    return (home / "worker.log").read_text(errors="replace").count("reach.outbox_relay[")


def lease_holder(store_url: str) -> str | None:
    engine = create_engine_for(store_url)
    try:
        current = LeaseStore(engine, "beat", "observer", LEASE_S).current()
        return None if current is None else current.holder
    finally:
        engine.dispose()


def started_pair(env: dict[str, str], home: Path) -> tuple[Beat, Beat]:
    """Two beats started at once; (active, standby) once both have decided."""
    beats = [Beat(env, home, "beat-a"), Beat(env, home, "beat-b")]
    wait_until(
        lambda: (
            sum(b.holder() is not None for b in beats) == 1
            and sum(b.is_standby() for b in beats) == 1
        ),
        timeout=30,
        what="one active and one standby beat",
    )
    active = next(b for b in beats if b.holder() is not None)
    standby = next(b for b in beats if b is not active)
    return active, standby


def test_two_beats_one_sends_and_the_other_takes_over_a_killed_one(
    hub: dict[str, str], store_url: str, tmp_path: Path
) -> None:
    active, standby = started_pair(hub, tmp_path)
    restarted: Beat | None = None
    try:
        assert lease_holder(store_url) == active.holder()
        wait_until(lambda: active.sends() >= 4, timeout=10, what="the active beat sending")
        time.sleep(2 * LEASE_S / 3)
        assert standby.sends() == 0, standby.process.output()
        wait_until(lambda: executions(tmp_path) > 0, timeout=20, what="the worker running sweeps")

        active.process.kill_group()
        killed = time.monotonic()
        wait_until(
            lambda: standby.holder() is not None,
            timeout=BOUND_S + SLACK_S,
            interval=0.05,
            what="the standby taking over",
        )
        took_over = time.monotonic() - killed
        assert f"took over from {active.holder()}" in standby.process.output()
        wait_until(lambda: standby.sends() > 0, timeout=5, what="the new active beat sending")
        before = executions(tmp_path)
        wait_until(lambda: executions(tmp_path) > before, timeout=10, what="sweeps after it")

        restarted = Beat(hub, tmp_path, "beat-a-restarted")
        wait_until(restarted.is_standby, timeout=30, what="the restarted beat standing by")
        assert f"lock held by {standby.holder()}" in restarted.process.output()
        sent = standby.sends()
        time.sleep(LEASE_S)  # longer than a lease: it never takes over from a live holder
        assert restarted.sends() == 0 and restarted.holder() is None
        assert standby.sends() > sent
        assert lease_holder(store_url) == standby.holder()
        print(f"take-over after SIGKILL: {took_over:.1f} s (bound {BOUND_S} s)")
    finally:
        for beat in (active, standby, restarted):
            if beat is not None:
                beat.process.stop()


def test_a_paused_active_beat_is_replaced_and_sends_nothing_when_resumed(
    hub: dict[str, str], store_url: str, tmp_path: Path
) -> None:
    active, standby = started_pair(hub, tmp_path)
    try:
        wait_until(lambda: active.sends() > 0, timeout=10, what="the active beat sending")
        os.kill(active.process.proc.pid, signal.SIGSTOP)  # a frozen VM, a long GC pause
        paused = active.sends()
        wait_until(
            lambda: standby.holder() is not None,
            timeout=BOUND_S + SLACK_S,
            interval=0.05,
            what="the standby taking over from a paused beat",
        )
        os.kill(active.process.proc.pid, signal.SIGCONT)
        wait_until(
            lambda: "this beat lost it" in active.process.output(),
            timeout=10,
            what="the resumed beat noticing it lost the lock",
        )
        time.sleep(LEASE_S)
        assert active.sends() == paused, active.process.output()
        assert standby.sends() > 0
        assert lease_holder(store_url) == standby.holder()
    finally:
        os.kill(active.process.proc.pid, signal.SIGCONT)
        active.process.stop()
        standby.process.stop()
