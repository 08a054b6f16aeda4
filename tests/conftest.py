"""Shared fixtures: real stores (SQLite file, PostgreSQL), real Redis, hub processes.

Every store-touching test runs against both SQLite and PostgreSQL. PostgreSQL databases
are cloned per test from a migrated template (cheap and isolated).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
import requests
from sqlalchemy import Engine, MetaData, select

from reach.hub.storage import create_engine_for, upgrade_database
from tests.support import processes
from tests.support.ports import free_port

REPO = Path(__file__).resolve().parent.parent
PG_ADMIN_DSN = os.environ.get(
    "REACH_TEST_PG_DSN", "host=127.0.0.1 port=5432 user=postgres dbname=test"
)
PG_URL_TEMPLATE = os.environ.get(
    "REACH_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/{db}"
)
REDIS_URL = os.environ.get("REACH_TEST_REDIS_URL", "redis://127.0.0.1:6379")


def _pg(sql: str) -> None:
    with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
        conn.execute(sql)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def pg_template() -> Iterator[str]:
    name = f"reach_tmpl_{uuid.uuid4().hex[:8]}"
    _pg(f'CREATE DATABASE "{name}"')
    upgrade_database(PG_URL_TEMPLATE.format(db=name))
    yield name
    _pg(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tmpl") / "reach.db"
    upgrade_database(f"sqlite:///{path}")
    return path


STORES = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@contextmanager
def _fresh_store(kind: str, directory: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    if kind == "sqlite":
        template: Path = request.getfixturevalue("sqlite_template")
        path = directory / "reach.db"
        path.write_bytes(template.read_bytes())
        yield f"sqlite:///{path}"
        return
    tmpl: str = request.getfixturevalue("pg_template")
    name = f"reach_t_{uuid.uuid4().hex[:10]}"
    _pg(f'CREATE DATABASE "{name}" TEMPLATE "{tmpl}"')
    try:
        yield PG_URL_TEMPLATE.format(db=name)
    finally:
        _pg(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=STORES)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A migrated, empty database of each kind."""
    with _fresh_store(request.param, tmp_path, request) as url:
        yield url


@pytest.fixture(scope="module", params=STORES)
def shared_store_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """One database of each kind for a whole test module (see ``shared_stack``)."""
    with _fresh_store(request.param, tmp_path_factory.mktemp("store"), request) as url:
        yield url


@pytest.fixture
def engine(store_url: str) -> Iterator[Engine]:
    eng = create_engine_for(store_url)
    yield eng
    eng.dispose()


def snapshot(engine: Engine) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table, to prove a refused request changed nothing. Left out:
    ``flow_counts``, the hub-wide per-second windows, which each process's flusher writes
    and prunes on its own clock whatever the request did."""
    meta = MetaData()
    meta.reflect(engine)
    out: dict[str, list[tuple[Any, ...]]] = {}
    with engine.connect() as conn:
        for name, table in sorted(meta.tables.items()):
            if name in ("alembic_version", "flow_counts"):
                continue
            out[name] = sorted((tuple(r) for r in conn.execute(select(table))), key=repr)
    return out


# One Redis database number per pytest-xdist worker (gw0 -> 14, gw1 -> 13, gw2 -> 9, ...).
# Left out: 15 (tests/install), 12 and 11 (the bench's hub and its plain Celery baseline,
# which tests/bench and tests/semantic run) and 10 (bench.micro). A worker that took one of
# them would share a broker with a bench hub: each hub's worker would take the other's tasks.
WORKER_REDIS_DBS = (14, 13, 9, 8, 7, 6, 5, 4, 3, 2, 1)


def _own_redis_url() -> str:
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    if worker >= len(WORKER_REDIS_DBS):
        raise RuntimeError(
            f"pytest-xdist worker gw{worker} has no Redis database of its own: "
            f"run with at most -n {len(WORKER_REDIS_DBS)}"
        )
    return f"{REDIS_URL}/{WORKER_REDIS_DBS[worker]}"


@contextmanager
def _flushed_redis() -> Iterator[str]:
    """Flushed at start only: pytest may tear a module's hub down after the next module's
    hub started on the same database, and a flush then would drop that hub's messages."""
    import redis

    url = _own_redis_url()
    client = redis.Redis.from_url(url)
    client.flushdb()
    client.close()
    yield url


@pytest.fixture
def redis_db() -> Iterator[str]:
    """A Redis database number of our own, flushed before use."""
    with _flushed_redis() as url:
        yield url


class HubProcess:
    """``reach <command>`` running as its own process, with its output kept for failures."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.log_path = log
        self._log = log.open("wb")
        self._terminated = False
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "reach", *args],
            # faulthandler: `dump_stacks` can show where a process that never came up hangs
            env={**env, "PYTHONFAULTHANDLER": "1"},
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            start_new_session=True,  # its own process group: kill_group() reaches the children
        )

    def kill_group(self) -> None:
        """SIGKILL the process and all its children (a prefork worker dies mid-flight)."""
        import signal

        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def output(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def dump_stacks(self) -> str:
        """SIGABRT a process that is still running (faulthandler writes every thread's stack
        to its log, then it dies) and return its output: why it never answered."""
        import signal

        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGABRT)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        return self.output()

    def terminate(self) -> None:
        """SIGTERM, once, without waiting (`stop` reaps it)."""
        if self.proc.poll() is None and not self._terminated:
            self.proc.terminate()
            self._terminated = True

    def stop(self, timeout: float = 10) -> int:
        if self.proc.poll() is None:
            self.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


def hub_env(store_url: str, home: Path, **extra: str) -> dict[str, str]:
    """A hub process's environment. Test agents listen on 127.0.0.1, and a hub that
    requires API keys calls loopback agents only when the operator says so: the test
    stacks say so (pass ``REACH_SECURITY__ALLOW_LOOPBACK_AGENTS="false"`` to test the
    refusal)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("REACH_")}
    env["REACH_SECURITY__ALLOW_LOOPBACK_AGENTS"] = "true"
    env.update({"REACH_DATABASE_URL": store_url, "REACH_HOME": str(home), **extra})
    env["PYTHONUNBUFFERED"] = "1"
    return env


def wait_http_ok(url: str, proc: HubProcess | None = None, timeout: float = 60) -> None:
    """Until ``url`` answers 2xx. The minute is for a 2-core box under the whole suite (a hub
    that starts in 1.5 s alone once gave no output for 30 s); a process that never answers
    has its stacks dumped into the failure."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.proc.poll() is not None:
            raise AssertionError(f"process exited early:\n{proc.output()}")
        try:
            if requests.get(url, timeout=1).ok:
                return
        except requests.RequestException:
            pass
        time.sleep(0.1)
    raise AssertionError(
        f"{url} not healthy after {timeout}s" + (f"\n{proc.dump_stacks()}" if proc else "")
    )


def wait_until(predicate: Any, timeout: float, interval: float = 0.1, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}: {last!r}")


@pytest.fixture
def hub_api(store_url: str, tmp_path: Path) -> Iterator[str]:
    """``reach api`` as its own process on a fresh store; yields its base URL."""
    port = free_port()
    proc = HubProcess(
        ["api", "--port", str(port)], hub_env(store_url, tmp_path), tmp_path / "api.log"
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http_ok(base + "/healthz", proc)
        yield base
    finally:
        proc.stop()


AMQP_URL = "amqp://guest:guest@127.0.0.1:5672//"


class Stack:
    """A hub of real processes (api, worker, beat) on one store and broker."""

    def __init__(self, url: str, env: dict[str, str], home: Path, procs: list[HubProcess]) -> None:
        self.url = url
        self.env = env
        self.home = home
        self.procs = procs

    @property
    def worker(self) -> HubProcess:
        return self.procs[1]

    def instance(self, agent_id: str) -> dict[str, Any] | None:
        """The agent's first registered instance (the fleet listing is paged: the agent's
        own view is one read, wherever it would sort)."""
        found = self.instances(agent_id)
        return dict(found[0]) if found else None

    def instances(self, agent_id: str) -> list[dict[str, Any]]:
        """Registered instances of the agent (deregistered ones left out)."""
        r = requests.get(f"{self.url}/api/v1/agents/{agent_id}", timeout=5)
        found = r.json().get("instances", []) if r.ok else []
        return [i for i in found if i["status"] != "deregistered"]

    def metrics(self) -> str:
        return str(requests.get(f"{self.url}/metrics", timeout=5).text)

    def task(self, task_id: str) -> dict[str, Any]:
        return dict(requests.get(f"{self.url}/v1/tasks/{task_id}", timeout=5).json())

    def events(self, task_id: str) -> list[dict[str, Any]]:
        r = requests.get(f"{self.url}/v1/tasks/{task_id}/events", timeout=5)
        return list(r.json()["events"])

    def start_worker(self, concurrency: int = 2) -> HubProcess:
        n = len(self.procs)
        proc = HubProcess(
            ["worker", "--concurrency", str(concurrency)], self.env, self.home / f"worker-{n}.log"
        )
        self.procs.append(proc)
        return proc


def start_stack(
    store_url: str, home: Path, extra: dict[str, str], worker_concurrency: int = 2
) -> Stack:
    env = hub_env(store_url, home, **extra)
    port = free_port()
    procs = [
        HubProcess(["api", "--port", str(port)], env, home / "api.log"),
        HubProcess(["worker", "--concurrency", str(worker_concurrency)], env, home / "worker.log"),
        HubProcess(["beat"], env, home / "beat.log"),
    ]
    stack = Stack(f"http://127.0.0.1:{port}", env, home, procs)
    try:
        wait_http_ok(stack.url + "/healthz", procs[0])
    except BaseException:
        stop_stack(stack)
        raise
    return stack


def stop_stack(stack: Stack) -> None:
    """SIGTERM every process first, then reap each: the worker's warm shutdown and the
    API's graceful one overlap instead of adding up (a stack's teardown took 3 to 10 s)."""
    for p in stack.procs:
        p.terminate()
    for p in stack.procs:
        p.stop()


@pytest.fixture
def stack(store_url: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stack]:
    """api + worker + beat; PostgreSQL stores get the real Redis broker.

    Parametrise indirectly with a dict of extra REACH_* settings.
    """
    extra: dict[str, str] = {
        "REACH_PROBE__INTERVAL": "0.5",
        "REACH_PROBE__FAST_INTERVAL": "0.5",
        "REACH_HEARTBEAT__SWEEP_INTERVAL": "0.5",
    }
    if "postgres" in store_url:
        redis_url: str = request.getfixturevalue("redis_db")
        extra.update(REACH_BROKER_URL=redis_url, REACH_RESULT_BACKEND=redis_url)
    extra.update(getattr(request, "param", {}) or {})
    s = start_stack(store_url, tmp_path, extra)
    try:
        yield s
    finally:
        stop_stack(s)


@pytest.fixture(scope="module")
def shared_stack(
    shared_store_url: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """One hub (api, worker, beat) for every test of a module, per store: processes start
    once instead of per test. Settings come from the module's ``STACK_SETTINGS``."""
    extra: dict[str, str] = {
        "REACH_PROBE__INTERVAL": "0.5",
        "REACH_PROBE__FAST_INTERVAL": "0.5",
        "REACH_HEARTBEAT__SWEEP_INTERVAL": "0.5",
    }
    extra.update(getattr(request.module, "STACK_SETTINGS", {}))
    home = tmp_path_factory.mktemp("hub")
    with contextlib.ExitStack() as cleanup:
        if "postgres" in shared_store_url:
            redis_url = cleanup.enter_context(_flushed_redis())
            extra.update(REACH_BROKER_URL=redis_url, REACH_RESULT_BACKEND=redis_url)
        workers = int(getattr(request.module, "STACK_WORKER_CONCURRENCY", 2))
        s = start_stack(shared_store_url, home, extra, worker_concurrency=workers)
        cleanup.callback(stop_stack, s)
        yield s


class AgentProcess:
    """tests/acceptance/agents/recording_agent.py as its own process."""

    SCRIPT = REPO / "tests" / "acceptance" / "agents" / "recording_agent.py"

    def __init__(
        self,
        hub: str,
        log: Path,
        *,
        agent_id: str = "recorder",
        mode: str = "sync",
        delay: float = 0.0,
        port: int | None = None,
        max_concurrency: int = 8,
        extra: tuple[str, ...] = (),
    ) -> None:
        self.port = port or free_port()
        self.log = log
        self.args = [
            sys.executable,
            str(self.SCRIPT),
            "--port",
            str(self.port),
            "--hub",
            hub,
            "--agent-id",
            agent_id,
            "--mode",
            mode,
            "--delay",
            str(delay),
            "--log",
            str(log),
            "--max-concurrency",
            str(max_concurrency),
            *extra,
        ]
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        with self.log.with_suffix(".out").open("ab") as out:  # the agent's own log, for failures
            self.proc = subprocess.Popen(self.args, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)

    def kill(self) -> None:
        processes.kill(self.proc)

    def stop(self) -> None:
        processes.stop(self.proc)

    def executions(self) -> list[str]:
        if not self.log.exists():
            return []
        return [line.split()[0] for line in self.log.read_text().splitlines() if line.strip()]
