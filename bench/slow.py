"""Agents that think: tasks whose agents take seconds, on ``reach worker`` as shipped.

A worker slot no longer waits while an agent works: it hands the exchange to its
process's event loop (``reach.hub.delivery.exchanger``). These parts measure that on the
worker a user gets by default (prefork, two slots), on a hub of their own:

- ``slow_agents``: ``Plan.slow_tasks`` tasks submitted at once to an agent whose handler
  takes ``Plan.slow_handler_s``, for three agents: an SDK ``def`` handler in
  ``time.sleep``, an SDK ``async def`` handler in ``asyncio.sleep``, and a plain HTTP
  service without the SDK (``bench.mock_agent --mode plain``). Each batch runs
  ``Plan.repeats`` times; reported: its wall time (first submit to last result) and the
  tasks' latency (submit to result), and each task's status in the store.
- ``broadcast50``: broadcasts to ``Plan.fan_instances`` instances of such an agent (one
  process serves them all: ``--instances``), ``Plan.fan_broadcasts`` one after another;
  reported: each broadcast's duration and how many of its targets succeeded.

The targets are judged in ``bench.cli.slow_targets``, never asserted.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text

from bench import clients
from bench.loadgen import run_open_loop
from bench.processes import Hub, PeakRss, wait_instances
from bench.scenarios import Bench, Plan
from bench.stats import Sample, median_row, percentile, summarise

SLOW = ("slow_agents", "broadcast50")
WORKER = ("prefork", 2)  # `reach worker` as shipped (reach.cli: --pool prefork, --concurrency 2)
AT_ONCE_S = 0.1  # a batch's submits leave within this (one caller thread each)
WALL_LIMIT_S = 6.0  # a batch of slow tasks ends this long after its first submit (the issue)
BROADCAST_LIMIT_S = 4.0  # a broadcast to 50 instances of a 2 s agent ends within this
VARIANTS = {  # variant: (bench.mock_agent mode, what it is)
    "sync": ("sync", "SDK `def` handler, time.sleep"),
    "async": ("async", "SDK `async def` handler, asyncio.sleep"),
    "plain": ("plain", "plain HTTP service, no SDK (http.server)"),
}
FAN_TAG = "fan"  # the broadcast's instances alone carry it


def measure(
    parts: list[str],
    plan: Plan,
    home: Path,
    log: Callable[[str, dict[str, Any]], None],
    guard: Callable[[str], contextlib.AbstractContextManager[None]],
) -> dict[str, Any]:
    """The wanted parts of ``SLOW`` on one hub of their own (``WORKER``); each part's
    failure is its own (``guard``), the hub's start fails them all."""
    where = home / "slow"
    where.mkdir(parents=True, exist_ok=True)
    pool, concurrency = WORKER
    hub = Hub(where, worker_concurrency=concurrency, pool=pool, extra_env=plan.hub_settings)
    bench = Bench(hub, where, plan)
    out: dict[str, Any] = {}
    try:
        hub.start()
        if "slow_agents" in parts:
            with guard("slow_agents"):
                out["slow_agents"] = slow_agents(bench, log)
        if "broadcast50" in parts:
            with guard("broadcast50"):
                out["broadcast50"] = broadcast50(bench)
                log("broadcast50", out["broadcast50"])
    finally:
        bench.stop_agents()  # a failed run must not leave agent processes behind
        hub.stop()
    return out


def at_once(job: Callable[[int], None], count: int) -> tuple[list[Sample], float]:
    """``count`` calls of ``job`` leaving within ``AT_ONCE_S``, each on a thread of its own;
    (samples, wall from the first submit to the last answer)."""
    rate = count / AT_ONCE_S
    return run_open_loop(job, rate, (count + 0.5) / rate, max_threads=count)


def store_view(bench: Bench, prefix: str) -> tuple[dict[str, int], float | None]:
    """The store's count of this prefix's tasks by status, and the seconds between the
    first and the last one's acceptance (how long the API took to take the batch in)."""
    engine = create_engine(bench.hub.env["REACH_DATABASE_URL"])
    try:
        with engine.connect() as conn:
            params = {"p": prefix + "%"}
            rows = conn.execute(
                text("SELECT status, count(*) FROM tasks WHERE task_id LIKE :p GROUP BY status"),
                params,
            ).all()
            span = conn.execute(
                text("SELECT max(created_at) - min(created_at) FROM tasks WHERE task_id LIKE :p"),
                params,
            ).scalar_one()
    finally:
        engine.dispose()
    return {str(status): int(n) for status, n in rows}, None if span is None else float(span)


def _batch(bench: Bench, agent_id: str, count: int, name: str) -> dict[str, Any]:
    """``count`` tasks to ``agent_id`` at once, each caller waiting for its result."""
    prefix = bench.prefix(name)

    def job(i: int) -> None:
        body = {"agent_id": agent_id, "method": "bench.echo", "payload": {"i": i}}
        clients.hub_call(bench.hub.url, {**body, "task_id": f"{prefix}{i}"}, wait=60)

    with PeakRss(bench.hub.pids()) as rss:
        samples, wall = at_once(job, count)
    lost = bench.lost(prefix)
    ended, accepted_within = store_view(bench, prefix)
    row = summarise(samples, wall, lost=lost, peak_rss_mb=rss.peak_mb).as_dict()
    return {
        **row,
        "wall_s": round(wall, 2),
        "accepted_within_s": None if accepted_within is None else round(accepted_within, 2),
        "statuses": ended,
        "not_success": count - ended.get("success", 0),
    }


def slow_agents(bench: Bench, log: Callable[[str, dict[str, Any]], None]) -> dict[str, Any]:
    """Each variant's agent, a batch of ``slow_tasks`` at once, ``repeats`` times (after
    a small batch that warms the hub's connections to it up)."""
    plan = bench.plan
    variants: dict[str, Any] = {}
    for variant, (mode, what) in VARIANTS.items():
        agent_id = f"slow-{variant}"
        bench.agent(
            agent_id,
            mode=mode,
            latency=plan.slow_handler_s,
            max_concurrency=plan.slow_max_concurrency,
        )
        _batch(bench, agent_id, min(10, plan.slow_tasks), f"warm-{variant}")
        runs = [_batch(bench, agent_id, plan.slow_tasks, agent_id) for _ in range(plan.repeats)]
        variants[variant] = variant_row(what, runs)
        log(f"slow_agents {variant}", variants[variant])
    return {
        "worker": f"{WORKER[0]} x{WORKER[1]}",
        "tasks": plan.slow_tasks,
        "handler_s": plan.slow_handler_s,
        "max_concurrency": plan.slow_max_concurrency,
        "submitted_within_s": AT_ONCE_S,
        "variants": variants,
    }


def variant_row(what: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One variant's row from its batches: the median of each figure with its spread
    (``median_row``), the wall's median and worst, and the worst batch's failures."""
    row = median_row(runs)
    walls = [float(r["wall_s"]) for r in runs]
    spans = [float(r["accepted_within_s"]) for r in runs if r.get("accepted_within_s") is not None]
    row.update(
        agent=what,
        wall_s=sorted(walls)[(len(walls) - 1) // 2],
        accepted_within_s=sorted(spans)[(len(spans) - 1) // 2] if spans else None,
        accepted_within_max_s=max(spans, default=None),
        wall_max_s=max(walls),
        walls_s=walls,
        not_success=max(int(r["not_success"]) for r in runs),
        statuses=[r["statuses"] for r in runs],
    )
    return row


def broadcast50(bench: Bench) -> dict[str, Any]:
    """``fan_broadcasts`` broadcasts, one after another, to ``fan_instances`` instances of
    an agent whose ``def`` handler takes ``slow_handler_s``; each caller waits for all."""
    plan = bench.plan
    count = plan.fan_instances
    bench.agent("fan", mode="sync", latency=plan.slow_handler_s, instances=count, tags=(FAN_TAG,))
    wait_instances(bench.hub.url, "fan", count)
    body = {
        "tags": [FAN_TAG],
        "capability": "bench.echo",
        "method": "bench.echo",
        "payload": {},
    }

    def once() -> dict[str, Any]:
        t0 = time.perf_counter()
        view = clients.broadcast_call(bench.hub.url, body, wait=30)
        took = time.perf_counter() - t0
        results = view.get("results") or []
        return {
            "duration_s": round(took, 3),
            "targets": len(results),
            "succeeded": sum(1 for r in results if r["status"] == "success"),
            "reason": view.get("reason"),
        }

    warm = once()
    runs = [once() for _ in range(plan.fan_broadcasts)]
    return {
        "worker": f"{WORKER[0]} x{WORKER[1]}",
        "handler_s": plan.slow_handler_s,
        **broadcast_row(runs, count),
        "warm_up": warm,
        "lost": bench.lost("b-"),
    }


def broadcast_row(runs: list[dict[str, Any]], instances: int) -> dict[str, Any]:
    """The broadcasts' durations (p50, p99, max) and whether every target of every one
    succeeded (a broadcast that found fewer than ``instances`` targets did not)."""
    durations = [float(r["duration_s"]) for r in runs]
    failed = sum(instances - int(r["succeeded"]) for r in runs)
    return {
        "instances": instances,
        "broadcasts": len(runs),
        "durations_s": durations,
        "p50_s": _r(percentile(durations, 50)),
        "p99_s": _r(percentile(durations, 99)),
        "max_s": _r(max(durations, default=float("nan"))),
        "targets_not_succeeded": failed,
        "all_succeeded": failed == 0 and bool(runs),
        "runs": runs,
    }


def _r(value: float) -> float | None:
    return None if value != value else round(value, 2)
