"""What tracing costs the hub: the same single hop with OpenTelemetry on and off.

"on": the API, worker and beat export every span over OTLP/HTTP (``agent-reach[otel]``)
to a sink on loopback that answers each export at once (a collector's cost is not the
hub's); "off": no ``OTEL_*`` variable, the default. Each configuration gets a fresh hub;
they alternate (on, off, on, off ...) so drift of the machine spreads evenly. Reported:
each process's CPU per message at a fixed open-loop rate (``cost.per_message``), the
hub's (API, worker, beat, PostgreSQL, Redis) and the difference in per cent
(target: at most 5 % on, ~0 off). ``python -m bench --only tracing``.

A loaded box moves a whole hub's CPU per message by more than tracing costs, so
``python -m bench.tracing`` also measures the spans alone, in process: the task's and the
attempt's spans of ``reach.hub.tracing`` made, ended and exported over OTLP/HTTP (to a
sink in the same process, whose CPU counts too: an upper bound), per message, on and off.
``python -m bench.tracing api [ROUNDS]`` measures the API's submit in process (`api_loop`):
off, on, and on without FastAPI's server span, alternating, each in a fresh process.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from bench import cost, scenarios
from bench.processes import REDIS_URL, Hub


@contextmanager
def _sink() -> Iterator[tuple[str, list[int]]]:
    """An OTLP/HTTP endpoint that takes every export and counts its bytes."""
    received: list[int] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received.append(len(self.rfile.read(int(self.headers.get("Content-Length") or 0))))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", received
    finally:
        server.shutdown()
        server.server_close()


def measure(
    plan: scenarios.Plan, home: Path, concurrency: int, pool: str, log: Any
) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {"on": [], "off": []}
    with _sink() as (endpoint, received):
        for round_no in range(plan.token_rounds):
            for mode in ("on", "off"):
                env = dict(plan.hub_settings)
                if mode == "on":
                    env.update(OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, OTEL_TRACES_EXPORTER="otlp")
                where = home / f"tracing-{mode}-{round_no}"
                where.mkdir(parents=True, exist_ok=True)
                hub = Hub(where, worker_concurrency=concurrency, pool=pool, extra_env=env)
                bench = scenarios.Bench(hub, where, plan)
                exports = len(received)
                try:
                    hub.start()
                    fixed = cost.per_message(bench, plan.token_rate, plan.duration)
                finally:
                    bench.stop_agents()
                    hub.stop()
                row = {
                    "messages": fixed["messages"],
                    "errors": fixed["errors"],
                    "lost": fixed["lost"],
                    "p50_ms": fixed["p50_ms"],
                    "p99_ms": fixed["p99_ms"],
                    "cpu_ms_per_msg": fixed["cpu_ms_per_msg"],
                    "hub_cpu_ms_per_msg": fixed["hub_cpu_ms_per_msg"],
                    "exports": len(received) - exports,
                }
                runs[mode].append(row)
                log(f"tracing {mode} #{round_no + 1}", row)

    def mean(mode: str, key: str) -> float:
        values = [float(r[key]) for r in runs[mode] if r[key] is not None]
        return sum(values) / len(values) if values else float("nan")

    on, off = mean("on", "hub_cpu_ms_per_msg"), mean("off", "hub_cpu_ms_per_msg")
    paired = paired_costs(runs)
    return {
        "rounds": plan.token_rounds,
        "rate": plan.token_rate,
        "runs": runs,
        "hub_cpu_on_ms": round(on, 3),
        "hub_cpu_off_ms": round(off, 3),
        "hub_cpu_cost_pct": round(100 * (on - off) / off, 1) if off else None,
        "paired_cost_pct": paired,
        "paired_median_pct": round(statistics.median(paired), 1) if paired else None,
        "exports_off": sum(r["exports"] for r in runs["off"]),  # must be 0
        "by_role_ms": {
            mode: {
                role: round(
                    sum(float(r["cpu_ms_per_msg"].get(role) or 0) for r in rows) / len(rows), 3
                )
                for role in rows[0]["cpu_ms_per_msg"]
            }
            for mode, rows in runs.items()
            if rows
        },
    }


def paired_costs(runs: dict[str, list[dict[str, Any]]]) -> list[float]:
    """Each round's cost of tracing, in per cent: its "on" hub against the "off" hub that
    ran right after it (a drifting box moves both alike; the spread of these says how far
    one run's figure can be trusted)."""
    out = []
    for on, off in zip(runs["on"], runs["off"], strict=False):
        a, b = on.get("hub_cpu_ms_per_msg"), off.get("hub_cpu_ms_per_msg")
        if a is not None and b:
            out.append(round(100 * (float(a) - float(b)) / float(b), 1))
    return out


def in_process(on: bool, messages: int = 3000) -> float:
    """CPU ms (every thread of this process) per message of the hub's own spans: a task
    span, an attempt span under it, current while its answer is recorded, then ended."""
    from reach.hub import tracing
    from reach.sdk import telemetry

    with _sink() as (endpoint, _):
        if on:
            os.environ.update(OTEL_TRACES_EXPORTER="otlp", OTEL_EXPORTER_OTLP_ENDPOINT=endpoint)
        tracing.setup("bench")
        parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

        def one(i: int) -> None:
            task = {"reach.task_id": f"t{i}", "reach.method": "m", "reach.agent_id": "a"}
            stored = tracing.task_context(parent, task)
            attempt = {**task, "reach.attempt": 1, "reach.instance_id": "i"}
            span, _sent = tracing.begin_attempt(stored, attempt)
            with tracing.within(span):
                tracing.current_trace_id()
            tracing.end_attempt(span, "success", False, **{"http.response.status_code": 200})

        for i in range(300):  # warm
            one(i)
        telemetry.flush()
        started = time.process_time()
        for i in range(messages):
            one(i)
        telemetry.flush()
        return 1000 * (time.process_time() - started) / messages


def api_loop(on: bool, server_span: bool = True, submits: int = 750) -> dict[str, float]:
    """The API's CPU per submit with tracing on or off, in process: its app under
    Starlette's TestClient on SQLite (the bench's Redis as broker), one caller submitting
    one task after another. ``server_span`` False leaves out FastAPI's server span (what
    the hub's own spans cost alone). Every thread of this process counts, user and system
    apart; under a thousand submits, the agent's queue bound."""
    import tempfile

    import psutil
    from fastapi.testclient import TestClient

    from bench.processes import redis_db
    from reach.hub import tracing
    from reach.hub.api import create_app
    from reach.hub.settings import load_settings
    from reach.hub.storage.engine import upgrade_database
    from reach.worker.context import HubContext

    with _sink() as (endpoint, received), tempfile.TemporaryDirectory() as home:
        if on:
            os.environ.update(OTEL_TRACES_EXPORTER="otlp", OTEL_EXPORTER_OTLP_ENDPOINT=endpoint)
        database = f"sqlite:///{home}/reach.db"
        broker = redis_db(REDIS_URL, 9)
        os.environ.update(
            REACH_HOME=home,
            REACH_DATABASE_URL=database,
            REACH_BROKER_URL=broker,
            REACH_RESULT_BACKEND=broker,
        )
        upgrade_database(database)
        tracing.setup("reach-api")
        if not server_span:
            tracing.TRACED_REQUESTS = frozenset()
        with TestClient(create_app(HubContext.from_settings(load_settings()))) as client:
            agent = {"agent_id": "a", "instance_id": "a-1", "addr": "127.0.0.1:9"}
            client.post("/v1/agents/register", json={**agent, "allow_loopback": True})

            def submit(i: int) -> None:
                body = {"agent_id": "a", "method": "m", "payload": {"i": i}}
                answer = client.post("/v1/tasks", json=body)
                assert answer.status_code in (200, 201, 202), answer.text

            for i in range(150):  # warm
                submit(i)
            me = psutil.Process()
            before = me.cpu_times()
            for i in range(submits):
                submit(i)
            after = me.cpu_times()
        exported = len(received)
    return {
        "user_ms": round(1000 * (after.user - before.user) / submits, 3),
        "system_ms": round(1000 * (after.system - before.system) / submits, 3),
        "exports": exported,
    }


if __name__ == "__main__":
    if sys.argv[1:2] in (["on"], ["off"]):
        print(f"{in_process(sys.argv[1] == 'on'):.4f}")
    elif sys.argv[1:2] == ["api-run"]:  # one configuration, in this fresh process
        mode = sys.argv[2]
        print(api_loop(mode != "off", server_span=mode != "on-no-server-span"))
    elif sys.argv[1:2] == ["api"]:  # each configuration in a fresh process, alternating
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
        for round_no in range(rounds):
            for mode in ("off", "on", "on-no-server-span"):
                out = subprocess.run(
                    [sys.executable, "-m", "bench.tracing", "api-run", mode],
                    env=env, capture_output=True, text=True, check=True,
                ).stdout.strip().splitlines()[-1]  # fmt: skip
                print(f"round {round_no + 1} {mode}: {out} CPU per submit")
    else:  # each in a fresh process: a tracer provider is installed once per process
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        for mode in ("off", "on"):
            out = subprocess.run(
                [sys.executable, "-m", "bench.tracing", mode],
                env=env, capture_output=True, text=True, check=True,
            ).stdout.strip()  # fmt: skip
            print(f"tracing {mode}: {out} ms CPU per message (task + attempt spans, exported)")
