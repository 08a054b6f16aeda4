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
"""

from __future__ import annotations

import os
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
from bench.processes import Hub


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
    return {
        "rounds": plan.token_rounds,
        "rate": plan.token_rate,
        "runs": runs,
        "hub_cpu_on_ms": round(on, 3),
        "hub_cpu_off_ms": round(off, 3),
        "hub_cpu_cost_pct": round(100 * (on - off) / off, 1) if off else None,
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


if __name__ == "__main__":
    if sys.argv[1:2] in (["on"], ["off"]):
        print(f"{in_process(sys.argv[1] == 'on'):.4f}")
    else:  # each in a fresh process: a tracer provider is installed once per process
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        for mode in ("off", "on"):
            out = subprocess.run(
                [sys.executable, "-m", "bench.tracing", mode],
                env=env, capture_output=True, text=True, check=True,
            ).stdout.strip()  # fmt: skip
            print(f"tracing {mode}: {out} ms CPU per message (task + attempt spans, exported)")
