"""The hot path in one process: CPU per submit and per delivery, steady on a busy box.

``python -m bench.micro`` runs, in this process and one after another, the API's submit
transaction (`reach.hub.intake.submission.submit` through `HubContext.write`, commit hooks
included), the publish of its attempt to Redis, and the worker's `deliver_attempt`
(claim, route, sign, POST to a real mock agent process, record the success), against the
real PostgreSQL (a fresh database) and Redis. It reports the median CPU time of this
thread per operation (``time.thread_time``: what the operation itself computes, not the
time it waits on the database, the broker or the agent) and the CPU the database backend
spent for it. Other processes on the machine change wall-clock figures a lot and these
little, which is what an optimisation log needs; Celery's own receive and acknowledge
and uvicorn's HTTP handling are not in it (``python -m bench --only cost`` has them).

``heartbeat`` is what the API spends on an idle instance's beat: buffered by
`reach.hub.api.heartbeats.HeartbeatIntake` plus its share of the batch that writes it
(a batch of 20; at 2,000 instances beating every 10 s, a 1 s flush writes 200).
``heartbeat_direct`` is a beat written at once in its own transaction, the answer's session
query included: what a busy or returning instance's beat still costs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
from sqlalchemy import text

from bench.processes import MockAgent, free_port, fresh_database

ROUNDS = 300
FLEET, BATCH = 100, 20  # idle instances beating in turn; beats per flush
# the rounds of the figures every run writes into its meta (``measure``), by bench level
META_ROUNDS = {"full": 150, "quick": 60, "smoke": 10}


def _settings(database: str, broker: str) -> Any:
    from reach.hub.settings import load_settings

    env = {
        "REACH_DATABASE_URL": database,
        "REACH_BROKER_URL": broker,
        "REACH_RESULT_BACKEND": broker,
        "REACH_HOME": tempfile.mkdtemp(prefix="reach-micro-"),
    }
    return load_settings(environ=env)


@contextlib.contextmanager
def _backend_cpu(ctx: Any) -> Iterator[Callable[[], float]]:
    """CPU seconds the database backends of this process's pool have spent so far."""
    procs: dict[int, psutil.Process] = {}

    def spent() -> float:
        total = 0.0
        with ctx.engine.connect() as conn:
            if ctx.engine.dialect.name != "postgresql":
                return 0.0
            pids = conn.execute(
                text("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")
            ).scalars()
            for pid in pids:
                with contextlib.suppress(psutil.Error):
                    proc = procs.setdefault(int(pid), psutil.Process(int(pid)))
                    times = proc.cpu_times()
                    total += times.user + times.system
        return total

    yield spent


def run(rounds: int = ROUNDS) -> dict[str, Any]:
    from reach.core.fleet.routing import RouteFilter  # noqa: F401  (imported before timing)
    from reach.hub.delivery.pipeline import deliver_attempt
    from reach.hub.delivery.transports import AgentTransport
    from reach.hub.fleet.reachability import Policy
    from reach.hub.fleet.registry import CandidateCache, register
    from reach.hub.flow import admission
    from reach.hub.flow.breakers import Breakers
    from reach.hub.intake import submission
    from reach.hub.ledger.tasks import Publish
    from reach.hub.security.signing import Signer
    from reach.hub.storage import upgrade_database
    from reach.wire.schemas import RegisterRequest, SubmitRequest
    from reach.worker.context import HubContext

    database = fresh_database()
    upgrade_database(database)
    from bench.processes import MICRO_REDIS_URL, flush_redis

    broker = MICRO_REDIS_URL
    flush_redis(broker)
    ctx = HubContext.from_settings(_settings(database, broker))
    home = Path(tempfile.mkdtemp(prefix="reach-micro-agent-"))
    agent = MockAgent("http://127.0.0.1:1", "echo", home, port=free_port()).start()
    try:
        with ctx.transaction() as s:
            register(
                s,
                RegisterRequest(
                    agent_id="echo",
                    addr=f"127.0.0.1:{agent.port}",
                    allow_loopback=True,
                    capabilities=[{"type": "bench.echo"}],
                ),
                ctx.clock.now(),
                Policy.from_settings(ctx.settings),
            )
        limits = admission.Limits.of(ctx.settings)
        transport = AgentTransport()
        breakers = Breakers()
        cache = CandidateCache(ctx.settings.router.candidate_ttl)
        signer = Signer(ctx.db, issuer="agent-reach", ttl_s=300, seal=ctx.seal)
        rng = random.Random(7)
        ops: dict[str, list[float]] = {
            "submit": [], "publish": [], "deliver": [], "heartbeat": [], "heartbeat_direct": [],
            "register": [],
        }  # fmt: skip
        from reach.hub.api.heartbeats import HeartbeatIntake
        from reach.hub.fleet import registry
        from reach.hub.gates import sessions as user_sessions
        from reach.wire.schemas import HeartbeatRequest

        policy = Policy.from_settings(ctx.settings)
        echo_instance = [""]
        with ctx.reading() as s:
            echo_instance[0] = s.execute(text("SELECT instance_id FROM instances")).scalar_one()

        def beat(session: Any) -> Any:
            now = ctx.clock.now()
            hb = HeartbeatRequest(agent_id="echo", instance_id=echo_instance[0], in_flight=0)
            row = registry.heartbeat(session, hb, now, policy)
            user_sessions.closed_header(session, "echo", echo_instance[0], now)
            return row.status

        def enrol(n: int, net: int = 9) -> Any:
            req = RegisterRequest(
                agent_id=f"idle-{n}",
                addr=f"127.{net}.{n // 250 % 250}.{n % 250 + 1}:7000",
                allow_loopback=True,
                tags=["idle"],
                capabilities=[{"type": "idle.work"}],
            )
            return ctx.write(lambda s: register(s, req, ctx.clock.now(), policy))

        # the API's intake of an idle fleet's beats (`reach.hub.api.heartbeats`): each
        # round beats another of FLEET idle instances, known online (one beat each first);
        # a flush every BATCH rounds writes them, its CPU shared among its beats. The
        # flusher thread never runs (flush_s of an hour): this thread flushes.
        intake = HeartbeatIntake(ctx, 3600.0)
        fleet = [enrol(10_000 + n, net=8).instance_id for n in range(FLEET)]
        for n, iid in enumerate(fleet):
            intake.take(HeartbeatRequest(agent_id=f"idle-{10_000 + n}", instance_id=iid))
        taken: list[tuple[int, float]] = []

        def flush_beats() -> None:
            """Write the buffered beats; each measured one (past the warm-up) gets its share."""
            t1 = time.thread_time()
            intake.flush()
            share = (time.thread_time() - t1) / len(taken)
            ops["heartbeat"].extend(t + share for j, t in taken if j >= 20)
            taken.clear()

        def idle_beat(i: int) -> None:
            n = i % FLEET
            hb = HeartbeatRequest(agent_id=f"idle-{10_000 + n}", instance_id=fleet[n])
            t0 = time.thread_time()
            intake.take(hb)
            taken.append((i, time.thread_time() - t0))
            if len(taken) == BATCH:
                flush_beats()

        db: dict[str, list[float]] = {"submit": [], "deliver": []}
        with _backend_cpu(ctx) as backend:
            for i in range(rounds + 20):  # the first 20 warm pools and caches
                task_id = f"micro-{i}"
                req = SubmitRequest(
                    agent_id="echo", method="bench.echo", payload={"i": i}, task_id=task_id
                )

                def work(session: Any, req: SubmitRequest = req) -> Any:
                    now = ctx.clock.now()
                    return submission.submit(
                        session, req, now, published_at=now, look_first=False, limits=limits
                    )

                b0, t0 = backend(), time.thread_time()
                ctx.write(work)
                t1 = time.thread_time()
                b1 = backend()
                ctx.dispatcher.publish(Publish(task_id, 1, 0.0))
                t2 = time.thread_time()
                b2 = backend()
                deliver_attempt(
                    ctx.db,
                    task_id,
                    1,
                    now=ctx.clock.now,
                    policy=ctx.policy,
                    dpolicy=ctx.delivery_policy,
                    transport=transport,
                    rng=rng,
                    breakers=breakers,
                    candidates=cache,
                    signer=signer,
                    shared=ctx.shared_counts,
                )
                t3 = time.thread_time()
                b3 = backend()
                ctx.write(beat)
                t4 = time.thread_time()
                enrol(i)
                t5 = time.thread_time()
                idle_beat(i)
                if i >= 20:
                    ops["heartbeat_direct"].append(t4 - t3)
                    ops["register"].append(t5 - t4)
                    ops["submit"].append(t1 - t0)
                    ops["publish"].append(t2 - t1)
                    ops["deliver"].append(t3 - t2)
                    # the backend's own CPU, less what the read of it costs (b1 - b0 ...)
                    db["submit"].append(b1 - b0)
                    db["deliver"].append(b3 - b2)
            if taken:  # a last, smaller batch (a short run may not fill one past the warm-up)
                flush_beats()
        with ctx.reading() as s:
            statuses: dict[str, int] = dict(
                s.execute(text("SELECT status, count(*) FROM tasks GROUP BY status")).all()
            )
    finally:
        agent.stop()
        ctx.engine.dispose()
    return {
        "rounds": rounds,
        "cpu_us": {k: round(1e6 * statistics.median(v), 1) for k, v in ops.items()},
        "cpu_us_mean": {k: round(1e6 * statistics.fmean(v), 1) for k, v in ops.items()},
        "postgres_cpu_us_mean": {k: round(1e6 * statistics.fmean(v), 1) for k, v in db.items()},
        "statuses": statuses,
        "load": os.getloadavg()[0],
    }


def measure(rounds: int) -> dict[str, Any]:
    """``run`` in a process of its own (the bench's driver never imports the hub), in ms:
    the figures each run's meta carries beside the calibration. The calibration's pure
    Python missed a state of the box where the hub's path cost 1.3 to 2.3 times as much
    (docs/benchmarks.md); these are that path."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.micro", "--rounds", str(rounds)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        raise RuntimeError(f"bench.micro exited {done.returncode}: {done.stderr[-2000:]}")
    got = json.loads(done.stdout.strip().splitlines()[-1])
    return {
        "command": f"python -m bench.micro --rounds {rounds}",
        "rounds": got["rounds"],
        "cpu_ms": {k: round(v / 1000, 2) for k, v in got["cpu_us"].items()},
        "postgres_cpu_ms": {k: round(v / 1000, 2) for k, v in got["postgres_cpu_us_mean"].items()},
        "loadavg": round(got["load"], 2),
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.micro", description=__doc__)
    p.add_argument("--rounds", type=int, default=ROUNDS)
    p.add_argument("--profile", type=Path, help="write cProfile stats of the run here")
    args = p.parse_args(argv)
    if args.profile:
        import cProfile

        with cProfile.Profile() as prof:
            result = run(args.rounds)
        prof.dump_stats(args.profile)
    else:
        result = run(args.rounds)
    json.dump(result, sys.stdout)
    print()


if __name__ == "__main__":
    main()
