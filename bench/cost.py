"""CPU per message, per process: the load-insensitive measure of the hot path.

Wall-clock throughput and latency move with whatever else the machine runs; the CPU a
process spends per message barely does. ``per_message`` offers a fixed open-loop rate of
single hops and reads, before and after, the CPU times (user + system) of every process
that takes part: the API, the worker (its main process and its pool), beat, the agent,
the load generator itself, the PostgreSQL backends serving the bench database and the
Redis server. ``python -m bench --only cost`` prints it; with ``--profile`` it also
records py-spy flame graphs of the API and the worker while the load runs.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import redis
from sqlalchemy import create_engine, text

from bench import clients
from bench.loadgen import run_open_loop
from bench.processes import REDIS_URL
from bench.scenarios import WARM_UP, Bench
from bench.stats import summarise


def _tree_cpu(pid: int) -> float:
    """User + system CPU seconds of a process and its (living) children."""
    total = 0.0
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(pid)
        for proc in (root, *root.children(recursive=True)):
            with contextlib.suppress(psutil.Error):
                t = proc.cpu_times()
                total += t.user + t.system
    return total


def _pg_backends(database_url: str) -> list[int]:
    """The PostgreSQL backends connected to the bench's database (the hub's pools)."""
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT pid FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            ).all()
    finally:
        engine.dispose()
    return [int(r[0]) for r in rows]


_DB_STATS = (
    "SELECT xact_commit, tup_inserted, tup_updated, tup_deleted, blks_hit + blks_read "
    "FROM pg_stat_database WHERE datname = current_database()"
)
_DB_KEYS = ("commits", "rows_inserted", "rows_updated", "rows_deleted", "blocks_touched")


def _db_stats(database_url: str) -> dict[str, int]:
    """PostgreSQL's own counters for the bench database (commits, rows written)."""
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT pg_stat_clear_snapshot()"))
            row = conn.execute(text(_DB_STATS)).one()
    finally:
        engine.dispose()
    return {k: int(v or 0) for k, v in zip(_DB_KEYS, row, strict=True)}


def _redis_pid() -> int | None:
    client = redis.Redis.from_url(REDIS_URL)
    try:
        return int(client.info("server")["process_id"])
    except (redis.RedisError, KeyError, ValueError):
        return None
    finally:
        client.close()


def roles(bench: Bench) -> dict[str, list[int]]:
    """The processes to account for, by role (each pid counted with its children)."""
    out: dict[str, list[int]] = {}
    for proc in bench.hub.procs:
        role = proc.name.split("-")[0]  # api, worker-0 -> worker, beat
        if proc.popen.poll() is None:
            out.setdefault(role, []).append(proc.popen.pid)
    out["agent"] = [
        a.proc.popen.pid for agents in bench.agents.values() for a in agents if a.proc is not None
    ]
    out["loadgen"] = [os.getpid()]
    out["postgres"] = _pg_backends(bench.hub.env["REACH_DATABASE_URL"])
    pid = _redis_pid()
    out["redis"] = [pid] if pid else []
    return out


def _snapshot(by_role: dict[str, list[int]]) -> dict[str, float]:
    out = {role: sum(_tree_cpu(p) for p in pids) for role, pids in by_role.items()}
    own = psutil.Process().cpu_times()  # the load generator alone, not its py-spy children
    out["loadgen"] = own.user + own.system
    return out


@contextlib.contextmanager
def _profiles(bench: Bench, out: Path | None, seconds: float) -> Iterator[list[Path]]:
    """py-spy records of the API and the worker (pool included) while the load runs."""
    paths: list[Path] = []
    spy = shutil.which(
        "py-spy", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    )
    if out is None or spy is None:
        yield paths
        return
    out.mkdir(parents=True, exist_ok=True)
    running = []
    for proc in bench.hub.procs:
        if not proc.name.startswith(("api", "worker")):
            continue
        path = out / f"{proc.name}.txt"  # collapsed stacks: bench.cost.top reads them
        argv = [spy, "record", "--pid", str(proc.popen.pid), "--duration", str(int(seconds))]
        argv += [
            "--rate",
            "100",
            "--nonblocking",
            "--gil",
            "--format",
            "raw",
            "--output",
            str(path),
        ]
        if proc.name.startswith("worker"):
            argv.append("--subprocesses")
        running.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        paths.append(path)
    try:
        yield paths
    finally:
        for p in running:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=seconds + 30)


def per_message(
    bench: Bench, rate: float, duration: float, profile_dir: Path | None = None
) -> dict[str, Any]:
    """CPU milliseconds per completed single hop, per role and in total, at ``rate``."""
    bench.agent("echo")
    prefix = bench.prefix("cost")

    def job(i: int) -> None:
        body = {"agent_id": "echo", "method": "bench.echo", "payload": {"i": i}}
        clients.hub_call(bench.hub.url, {**body, "task_id": f"{prefix}{i}"})

    run_open_loop(lambda i: job(WARM_UP + i), min(rate, 20.0), 2.0)  # pools and caches warm
    by_role = roles(bench)
    database = bench.hub.env["REACH_DATABASE_URL"]
    db_before = _db_stats(database)
    before = _snapshot(by_role)
    with _profiles(bench, profile_dir, duration) as profiles:
        samples, wall = run_open_loop(job, rate, duration)
    after = _snapshot(by_role)
    time.sleep(1.2)  # backends flush their statistics to pg_stat_database within a second
    db_after = _db_stats(database)
    summary = summarise(samples, wall, offered_rate=rate, lost=bench.lost(prefix))
    done = summary.requests - summary.errors
    per_role = {
        role: round(1000 * (after[role] - before[role]) / done, 3) if done else None
        for role in by_role
    }
    hub_roles = ("api", "worker", "beat", "postgres", "redis")
    return {
        "rate": rate,
        "duration_s": duration,
        "messages": done,
        "errors": summary.errors,
        "lost": summary.lost,
        "p50_ms": summary.as_dict()["p50_ms"],
        "p99_ms": summary.as_dict()["p99_ms"],
        "cpu_ms_per_msg": per_role,
        "hub_cpu_ms_per_msg": round(sum(per_role.get(r) or 0.0 for r in hub_roles), 3),
        "total_cpu_ms_per_msg": round(sum(v or 0.0 for v in per_role.values()), 3),
        # what each message asks of PostgreSQL (every process's share, background included)
        "postgres_per_msg": {
            k: round((db_after[k] - db_before[k]) / done, 2) if done else None for k in _DB_KEYS
        },
        "profiles": [str(p) for p in profiles],
    }


def top(path: Path, limit: int = 40, prefix: str = "") -> list[tuple[str, float]]:
    """The functions of a py-spy raw (collapsed) profile by inclusive share of samples,
    largest first; ``prefix`` keeps only frames whose file path contains it."""
    total = 0
    inclusive: dict[str, int] = {}
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        total += n
        seen = set()
        for frame in stack.split(";"):
            if prefix and prefix not in frame:
                continue
            name = frame.split(" (")[0] + " " + frame.rsplit("/", 1)[-1].split(":")[0].rstrip(")")
            if name not in seen:
                seen.add(name)
                inclusive[name] = inclusive.get(name, 0) + n
    ranked = sorted(inclusive.items(), key=lambda kv: -kv[1])[:limit]
    return [(name, round(100 * n / total, 1)) for name, n in ranked] if total else []


def owners(
    path: Path, limit: int = 30, prefix: str = "(reach/", within: str = ""
) -> list[tuple[str, float]]:
    """Each sample charged to the deepest frame of our own code (``prefix``) on its stack:
    the share each of our functions costs with the library calls it makes, without the
    share of our functions it calls. Samples with none of our frames go to ``(other)``."""
    total = 0
    charged: dict[str, int] = {}
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        if within and within not in stack:
            continue
        n = int(count)
        total += n
        owner = "(other)"
        for frame in stack.split(";"):
            if prefix in frame:
                owner = frame.split(" (")[0] + " " + frame.split("/")[-1].split(":")[0]
        charged[owner] = charged.get(owner, 0) + n
    ranked = sorted(charged.items(), key=lambda kv: -kv[1])[:limit]
    return [(name, round(100 * n / total, 1)) for name, n in ranked] if total else []
