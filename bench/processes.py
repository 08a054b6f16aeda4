"""The processes of a benchmark: a hub on real PostgreSQL and Redis, mock agents, and a
plain Celery worker for the baseline; plus the peak-memory sampler for hub processes."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import requests
from sqlalchemy import create_engine, text

REPO = Path(__file__).resolve().parent.parent
PG_ADMIN_URL = os.environ.get(
    "BENCH_PG_ADMIN_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
PG_DATABASE = os.environ.get("BENCH_PG_DATABASE", "reach_bench")


# The bench's Redis: REACH_BENCH_REDIS_URL (a private one, so a shared Redis that other
# runs flush is never used), else BENCH_REDIS_URL, else the local default. The hub uses its
# database; the plain Celery baseline the database below it (BENCH_CELERY_URL overrides).
def redis_db(url: str, db: int | None = None) -> str:
    """``url`` with its database number replaced by ``db`` (None: kept, 12 if it has none)."""
    base, _, last = url.rstrip("/").rpartition("/")
    has_db = last.isdigit() and base.count("/") >= 2
    root = base if has_db else url.rstrip("/")
    return f"{root}/{(int(last) if has_db else 12) if db is None else db}"


REDIS_URL = redis_db(
    os.environ.get("REACH_BENCH_REDIS_URL")
    or os.environ.get("BENCH_REDIS_URL")
    or "redis://127.0.0.1:6379/12"
)

CELERY_URL = os.environ.get("BENCH_CELERY_URL") or redis_db(REDIS_URL, 11)
# bench.micro's broker: its hub-less hot path, flushed before each run
MICRO_REDIS_URL = redis_db(REDIS_URL, 10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fresh_database() -> str:
    """An empty PostgreSQL database for this run (dropped and created again)."""
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{PG_DATABASE}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{PG_DATABASE}"'))
    admin.dispose()
    return PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{PG_DATABASE}"


def postgres_settings() -> dict[str, str]:
    """The server settings that move PostgreSQL's cost per message in a run: with
    ``autovacuum`` off, every dead task version a hub leaves stays for the whole run and
    every submit's queue count walks it (docs/benchmarks.md, "PostgreSQL's doubled share")."""
    admin = create_engine(PG_ADMIN_URL)
    try:
        with admin.connect() as conn:
            row = conn.execute(
                text(
                    "SELECT current_setting('server_version'), current_setting('autovacuum'), "
                    "current_setting('track_counts'), current_setting('shared_buffers')"
                )
            ).one()
    finally:
        admin.dispose()
    keys = ("server_version", "autovacuum", "track_counts", "shared_buffers")
    return {k: str(v) for k, v in zip(keys, row, strict=True)}


def flush_redis(url: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    client.flushdb()
    client.close()


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def stop(self, timeout: float = 10) -> None:
        if self.popen.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGTERM)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait()

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def spawn(name: str, argv: list[str], env: dict[str, str], home: Path) -> Proc:
    log = home / f"{name}.log"
    with log.open("ab") as out:
        popen = subprocess.Popen(
            argv, env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    return Proc(name, popen, log)


def wait_ok(url: str, proc: Proc | None = None, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.popen.poll() is not None:
            raise RuntimeError(f"{proc.name} exited early:\n{proc.tail()}")
        with contextlib.suppress(requests.RequestException):
            if requests.get(url, timeout=1).ok:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer within {timeout}s")


@dataclass
class Hub:
    """``reach api``, ``reach worker`` and ``reach beat`` as separate processes."""

    home: Path
    worker_concurrency: int = 2
    pool: str = "prefork"
    workers: int = 1  # worker processes (each with its own pool), separate Celery nodes
    api_replicas: int = 1  # more than one: `reach api --reuse-port`, all on one port
    extra_env: dict[str, str] = field(default_factory=dict)
    worker_loglevel: str = field(
        default_factory=lambda: os.environ.get("BENCH_WORKER_LOGLEVEL", "WARNING")
    )
    procs: list[Proc] = field(default_factory=list)
    url: str = ""
    env: dict[str, str] = field(default_factory=dict)

    def start(self) -> Hub:
        database = fresh_database()
        flush_redis(REDIS_URL)
        env = {k: v for k, v in os.environ.items() if not k.startswith("REACH_")}
        env.update(
            REACH_DATABASE_URL=database,
            REACH_BROKER_URL=REDIS_URL,
            REACH_RESULT_BACKEND=REDIS_URL,
            REACH_HOME=str(self.home),
            PYTHONUNBUFFERED="1",
            **self.extra_env,
        )
        self.env = env
        subprocess.run(
            [sys.executable, "-m", "reach", "db", "upgrade"],
            env=env,
            cwd=REPO,
            check=True,
            capture_output=True,
        )
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        reach = [sys.executable, "-m", "reach"]
        reuse = ["--reuse-port"] if self.api_replicas > 1 else []
        self.procs = [
            *(
                spawn(
                    "api" if n == 0 else f"api-{n}",
                    [*reach, "api", "--port", str(port), *reuse],
                    env,
                    self.home,
                )
                for n in range(self.api_replicas)
            ),
            *(
                spawn(
                    f"worker-{n}",
                    [
                        *reach,
                        "worker",
                        "--concurrency",
                        str(self.worker_concurrency),
                        "--pool",
                        self.pool,
                        "--loglevel",
                        self.worker_loglevel,
                        f"--hostname=bench{n}@%h",  # separate nodes
                    ],
                    env,
                    self.home,
                )
                for n in range(self.workers)
            ),
            spawn("beat", [*reach, "beat", "--loglevel", "WARNING"], env, self.home),
        ]
        wait_ok(self.url + "/healthz", self.procs[0])
        return self

    def stop(self, timeout: float = 10) -> None:
        """All told to stop at once, then waited for: a prefork worker takes seconds to
        wind down, and API and beat need not wait for it in line."""
        for proc in self.procs:
            if proc.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.popen.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(max(0.1, deadline - time.monotonic()))
            proc.stop(timeout=0.1)  # SIGKILL what is still there

    def pids(self) -> list[int]:
        return [p.popen.pid for p in self.procs if p.popen.poll() is None]


@dataclass
class MockAgent:
    hub_url: str
    agent_id: str
    home: Path
    mode: str = "sync"
    latency: float = 0.0
    forward_to: str = ""
    port: int = 0
    proc: Proc | None = None
    verify_tokens: bool = False  # the baselines post without a token (see bench.mock_agent)
    max_concurrency: int = 256  # declared per instance
    instances: int = 1  # served by the one process (bench.mock_agent --instances)
    tags: tuple[str, ...] = ("bench",)

    def start(self) -> MockAgent:
        self.port = self.port or free_port()
        argv = [
            sys.executable,
            "-m",
            "bench.mock_agent",
            "--port",
            str(self.port),
            "--hub",
            self.hub_url,
            "--agent-id",
            self.agent_id,
            "--mode",
            self.mode,
            "--latency",
            str(self.latency),
        ]
        if self.forward_to:
            argv += ["--forward-to", self.forward_to]
        if self.verify_tokens:
            argv.append("--verify-tokens")
        argv += ["--max-concurrency", str(self.max_concurrency), "--tags", ",".join(self.tags)]
        if self.instances > 1:
            argv += ["--instances", str(self.instances)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("REACH_")}
        self.proc = spawn(f"agent-{self.agent_id}-{self.port}", argv, env, self.home)
        wait_ok(f"{self.url}/healthz", self.proc)
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()

    def kill(self) -> None:
        """SIGKILL: the agent vanishes without deregistering (a crash)."""
        if self.proc is not None and self.proc.popen.poll() is None:
            os.killpg(self.proc.popen.pid, signal.SIGKILL)
            self.proc.popen.wait()

    def received(self) -> dict[int, int]:
        """Task requests received per wall-clock second (the agent's own count)."""
        answer = requests.post(
            f"{self.url}/tasks/bench.stats",
            json={"task_id": f"stats-{time.time_ns()}", "payload": {}},
            timeout=5,
        ).json()
        return {int(k): int(v) for k, v in answer["data"]["received"].items()}


def wait_instances(hub_url: str, agent_id: str, count: int, timeout: float = 60) -> None:
    """Until ``count`` instances of the agent are online (registered and probed)."""
    deadline = time.monotonic() + timeout
    online = 0
    while time.monotonic() < deadline:
        answer = requests.get(f"{hub_url}/api/v1/agents/{agent_id}", timeout=5)
        found = answer.json().get("instances", []) if answer.ok else []
        online = sum(1 for i in found if i["status"] == "online")
        if online >= count:
            return
        time.sleep(0.2)
    raise RuntimeError(f"{online} of {count} instances of {agent_id} online within {timeout}s")


def wait_routable(hub_url: str, agent_ids: list[str], timeout: float = 30) -> None:
    """Until every agent has an online instance (registered and probed)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        agents = requests.get(f"{hub_url}/api/v1/agents", timeout=5).json()["agents"]
        online = {
            a["agent_id"]
            for a in agents
            if any(i["status"] == "online" for i in a.get("instances", []))
        }
        if set(agent_ids) <= online:
            return
        time.sleep(0.2)
    raise RuntimeError(f"agents {agent_ids} not online within {timeout}s")


class PeakRss:
    """Samples the summed RSS of process trees (hub processes and their children)."""

    def __init__(self, pids: list[int], interval: float = 0.25) -> None:
        self._pids = pids
        self._interval = interval
        self._stop = threading.Event()
        self.peak_mb = 0.0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> float:
        """The summed RSS now, MB."""
        total = 0
        for pid in self._pids:
            try:
                root = psutil.Process(pid)
                for proc in [root, *root.children(recursive=True)]:
                    with contextlib.suppress(psutil.Error):
                        total += proc.memory_info().rss
            except psutil.Error:
                continue
        return total / 1_048_576

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak_mb = max(self.peak_mb, self.sample())
            self._stop.wait(self._interval)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak_mb = max(self.peak_mb, self.sample())


@contextlib.contextmanager
def running(*things: Hub | MockAgent) -> Iterator[None]:
    try:
        yield
    finally:
        for thing in reversed(things):
            thing.stop()
