"""Fleet and table scale (issue 17): costs that must stay flat as the fleet and the tables grow.

``fleet`` (on a hub of its own): one echo agent, routed to by capability at a fixed rate,
first alone, then beside a fleet of idle registered instances that heartbeat every 10 s
like SDK agents (2,000 in the full run: 200 heartbeats a second). Reported: the single
hop's p50/p99 by fleet size, registrations a second at each size, the time to answer one
page of ``GET /api/v1/agents``, and the CPU one heartbeat costs (API and PostgreSQL,
measured while only heartbeats run). The idle instances are at addresses of their own
(``127.x.y.z``, the loopback block), each with a listening socket that accepts probes,
so the hub's probes succeed as they would for live agents.

``table_scale`` (on a hub of its own): the single hop's saturated rate on an empty
database, then with ``Plan.table_rows`` finished tasks (and their events) inserted by
PostgreSQL itself (``generate_series``), alternating, the store's indexes as migrated.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import statistics
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil
import requests
from sqlalchemy import create_engine, text

from bench import clients, cost, scenarios
from bench.loadgen import run_open_loop
from bench.processes import Hub
from bench.scenarios import WARM_UP, Bench, Plan
from bench.stats import percentile, summarise

IDLE_CAPABILITY = "idle.work"
HEARTBEAT_S = 10.0


@contextlib.contextmanager
def listeners(count: int) -> Iterator[int]:
    """A listening socket on ``127.x.y.z:port`` for each of ``count`` idle instances (the
    loopback block only), one thread accepting on all: a probe's connection is accepted
    and closed. Yields the port they share."""
    port = 0
    socks: list[socket.socket] = []
    selector = selectors.DefaultSelector()
    try:
        for n in range(count):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((_host(n), port))
            port = port or int(sock.getsockname()[1])
            sock.listen(16)
            sock.setblocking(False)
            selector.register(sock, selectors.EVENT_READ)
            socks.append(sock)
    except OSError:
        for sock in socks:
            sock.close()
        raise
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            for key, _ in selector.select(timeout=0.5):
                with contextlib.suppress(OSError):
                    conn, _ = key.fileobj.accept()  # type: ignore[union-attr]
                    conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield port
    finally:
        stop.set()
        thread.join(timeout=2)
        selector.close()
        for sock in socks:
            sock.close()


def _host(n: int) -> str:
    return f"127.{1 + n // 62500}.{(n // 250) % 250 + 1}.{n % 250 + 1}"


def _addr(n: int, port: int) -> str:
    return f"{_host(n)}:{port}"


class Fleet:
    """Idle instances registered over HTTP, each heartbeating every ``HEARTBEAT_S``."""

    def __init__(self, hub_url: str, port: int) -> None:
        self.hub_url = hub_url
        self.port = port
        self.ids: list[tuple[str, str]] = []  # (agent_id, instance_id)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.heartbeats = 0
        self.heartbeat_errors = 0

    def register(self, count: int, threads: int = 8) -> float:
        """Register ``count`` more; their rate (registrations a second)."""
        start = len(self.ids)

        def one(n: int) -> tuple[str, str]:
            agent_id = f"idle-{n:05d}"
            answer = clients.session().post(
                f"{self.hub_url}/v1/agents/register",
                json={
                    "agent_id": agent_id,
                    "instance_id": f"{agent_id}-i",
                    "addr": _addr(n, self.port),
                    "allow_loopback": True,
                    "heartbeat_interval": HEARTBEAT_S,
                    "tags": ["idle", f"team-{n % 7}"],
                    "capabilities": [{"type": IDLE_CAPABILITY}],
                },
                timeout=30,
            )
            if answer.status_code not in (200, 201):
                raise RuntimeError(f"registration refused: {answer.status_code} {answer.text}")
            return agent_id, answer.json()["instance_id"]

        t0 = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            done = list(pool.map(one, range(start, start + count)))
        wall = time.perf_counter() - t0
        self.ids += done
        return count / wall if wall > 0 else float("nan")

    def start_heartbeats(self) -> None:
        """Each instance every ``HEARTBEAT_S``, spread evenly over the interval."""
        self._stop.clear()

        def beat(agent_id: str, instance_id: str) -> None:
            try:
                answer = clients.session().post(
                    f"{self.hub_url}/v1/agents/heartbeat",
                    json={"agent_id": agent_id, "instance_id": instance_id, "in_flight": 0},
                    timeout=10,
                )
                ok = answer.status_code == 200
            except requests.RequestException:
                ok = False
            if ok:
                self.heartbeats += 1
            else:
                self.heartbeat_errors += 1

        def run() -> None:
            with ThreadPoolExecutor(16, thread_name_prefix="heartbeat") as pool:
                n = 0
                due = time.perf_counter()
                while not self._stop.is_set():
                    if not self.ids:
                        self._stop.wait(0.1)
                        due = time.perf_counter()
                        continue
                    # the next beat a fleet's share of the interval after the last (the
                    # fleet may grow meanwhile): N instances, N / HEARTBEAT_S a second
                    due += HEARTBEAT_S / len(self.ids)
                    pause = due - time.perf_counter()
                    if pause > 0:
                        self._stop.wait(pause)
                    pool.submit(beat, *self.ids[n % len(self.ids)])
                    n += 1

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)


def _by_capability(bench: Bench, rate: float, duration: float) -> dict[str, Any]:
    """Single hops routed by capability (``bench.echo``: the echo agent alone declares it)."""
    prefix = bench.prefix("fleetcap")

    def job(i: int) -> None:
        clients.hub_call(
            bench.hub.url,
            {"capability": "bench.echo", "method": "bench.echo", "payload": {"i": i},
             "task_id": f"{prefix}{i}"},
        )  # fmt: skip

    run_open_loop(lambda i: job(WARM_UP + i), min(rate, 20.0), 1.0)
    samples, wall = run_open_loop(job, rate, duration)
    return summarise(samples, wall, offered_rate=rate, lost=bench.lost(prefix)).as_dict()


def _page_ms(hub_url: str, reads: int = 20) -> dict[str, float]:
    """Time to answer one page (50 agents) of ``GET /api/v1/agents``, walking the fleet."""
    times = []
    cursor = None
    for _ in range(reads):
        t0 = time.perf_counter()
        body = (
            clients.session()
            .get(f"{hub_url}/api/v1/agents", params={"limit": 50, "cursor": cursor}, timeout=30)
            .json()
        )
        times.append(1000 * (time.perf_counter() - t0))
        cursor = body.get("next_cursor")
    return {"p50_ms": round(statistics.median(times), 1), "p99_ms": round(percentile(times, 99), 1)}


def _cpu(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
    return total


def fleet(plan: Plan, home: Path, log: Any, rate: float | None = None) -> dict[str, Any]:
    """The fleet-scale figures (see the module's docstring); ``rate`` overrides the plan's
    rate of single hops by capability."""
    rate = rate or plan.fleet_rate
    where = home / "fleet"
    where.mkdir(parents=True, exist_ok=True)
    hub = Hub(where, worker_concurrency=4, extra_env=plan.hub_settings)
    bench = scenarios.Bench(hub, where, plan)
    sizes = plan.fleet_sizes
    out: dict[str, Any] = {"rate": rate, "sizes": {}}
    try:
        hub.start()
        bench.agent("echo")
        total = max(sizes) + plan.fleet_probe_registrations * len(sizes)
        with listeners(total) as port:
            fleet_ = Fleet(hub.url, port)
            fleet_.start_heartbeats()
            try:
                for size in sizes:
                    step: dict[str, Any] = {}
                    grow = size - len(fleet_.ids)
                    if grow > 0:
                        step["registrations_per_s"] = round(fleet_.register(grow), 1)
                        time.sleep(2)  # the newcomers' first probes and heartbeats settle
                    measured = len(fleet_.ids)
                    step["routing"] = _by_capability(bench, rate, plan.duration)
                    step["page"] = _page_ms(hub.url)
                    # registration at this size: a few more, timed on their own
                    step["registrations_per_s_at_size"] = round(
                        fleet_.register(plan.fleet_probe_registrations), 1
                    )
                    out["sizes"][str(measured)] = step
                    log(f"fleet {measured}", {**step["routing"], "page": step["page"]})
                # the fleet's own cost: each process's CPU while only heartbeats (and the
                # hub's probes of every instance) run, and per heartbeat the API's
                by_role = cost.roles(bench)
                beats0, before = fleet_.heartbeats, cost._snapshot(by_role)
                time.sleep(plan.duration)
                after = cost._snapshot(by_role)
                beats = fleet_.heartbeats - beats0
                out["heartbeats_per_s"] = round(beats / plan.duration, 1)
                out["idle_fleet_cpu_per_s"] = {
                    role: round((after[role] - before[role]) / plan.duration, 3)
                    for role in by_role
                    if role != "loadgen"  # the heartbeat senders live there
                }
                out["heartbeat_cpu_ms"] = {
                    "api": round(1000 * (after["api"] - before["api"]) / beats, 3)
                    if beats
                    else None,
                }
                out["heartbeat_errors"] = fleet_.heartbeat_errors
            finally:
                fleet_.stop()
    finally:
        bench.stop_agents()
        hub.stop()
    first = out["sizes"][min(out["sizes"], key=int)]["routing"]
    last = out["sizes"][max(out["sizes"], key=int)]["routing"]
    out["p99_ratio"] = (
        round(last["p99_ms"] / first["p99_ms"], 2) if first.get("p99_ms") and last.get("p99_ms")
        else None
    )  # fmt: skip
    out["min_registrations_per_s"] = min(
        s["registrations_per_s_at_size"] for s in out["sizes"].values()
    )
    out["max_page_ms"] = max(s["page"]["p99_ms"] for s in out["sizes"].values())
    return out


TABLE_ROWS_SQL = """
INSERT INTO tasks (task_id, agent_id, target, method, payload, status, attempt_seq,
    instance_id, idempotency_key, trace, timeout_ms, created_at, updated_at, finished_at,
    retries, redeliveries, deferrals, result, priority)
SELECT 'old-' || g, 'echo', '{"agent_id": "echo"}'::json, 'bench.echo', '{}'::json,
    'success', 1, 'old-instance', 'old-' || g, '{}'::json, 30000,
    :t0 + g * 0.001, :t0 + g * 0.001, :t0 + g * 0.001 + 0.005, 0, 0, 0, '{}'::json, 'online'
FROM generate_series(1, :rows) AS g;
INSERT INTO task_events (task_id, agent_id, instance_id, attempt_seq, kind, detail, at)
SELECT 'old-' || g, 'echo', 'old-instance', 1, k.kind, '{}'::json, :t0 + g * 0.001
FROM generate_series(1, :rows) AS g
CROSS JOIN (VALUES ('accepted'), ('dispatched'), ('terminal_success')) AS k(kind);
ANALYZE tasks; ANALYZE task_events;
"""


def _fill(database_url: str, rows: int) -> float:
    """Insert ``rows`` finished tasks (three events each) with PostgreSQL's own
    ``generate_series``; the seconds it took."""
    engine = create_engine(database_url)
    t0 = time.perf_counter()
    try:
        with engine.begin() as conn:
            for statement in TABLE_ROWS_SQL.split(";"):
                if statement.strip():
                    conn.execute(text(statement), {"rows": rows, "t0": time.time() - 86400})
    finally:
        engine.dispose()
    return time.perf_counter() - t0


def table_scale(plan: Plan, home: Path, log: Any) -> dict[str, Any]:
    """Saturated single-hop rate (closed loop) on an empty store and on one holding
    ``plan.table_rows`` finished tasks, alternating over ``plan.repeats`` rounds."""
    runs: dict[str, list[float]] = {"empty": [], "full": []}
    fill_s = None
    for round_no in range(plan.repeats):
        for kind in ("empty", "full"):
            where = home / f"table-{kind}-{round_no}"
            where.mkdir(parents=True, exist_ok=True)
            hub = Hub(where, worker_concurrency=4, extra_env=plan.hub_settings)
            bench = scenarios.Bench(hub, where, plan)
            try:
                hub.start()
                if kind == "full":
                    fill_s = round(_fill(hub.env["REACH_DATABASE_URL"], plan.table_rows), 1)
                closed = scenarios.closed_loop(bench, plan.token_callers, plan.duration)
            finally:
                bench.stop_agents()
                hub.stop()
            runs[kind].append(closed.rate)
            log(f"table {kind} #{round_no + 1}", {"rate": closed.rate, "lost": closed.lost})
    empty, full = statistics.median(runs["empty"]), statistics.median(runs["full"])
    return {
        "rows": plan.table_rows,
        "fill_s": fill_s,
        "runs": runs,
        "empty_rate": round(empty, 1),
        "full_rate": round(full, 1),
        "loss_pct": round(100 * (1 - full / empty), 1) if empty else None,
    }
