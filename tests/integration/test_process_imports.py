"""What each hub process loads: memory that every process pays, so it is worth keeping out.

Beat sends the schedule's tasks by name and needs neither the task modules nor the hub
behind them; no running process needs Alembic (it is for ``reach db upgrade``). The MCP
and A2A SDKs load with the first exchange that speaks them (about half a second and 15 MB
each per process, for hubs that mostly never use them). Each check runs a fresh
interpreter, since this one has loaded everything.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# `reach beat` as the console script runs it, stopped where the scheduler would start:
# what is loaded then is what beat holds for its lifetime.
BEAT = """
import json, os, sys
import celery.beat

def stop(self, *args, **kwargs):
    # beat sends its stdout to the log by now: the list goes to a file
    with open(os.environ["MODULES_FILE"], "w") as out:
        json.dump(sorted(sys.modules), out)
    raise SystemExit(0)

celery.beat.Service.start = stop
sys.argv = ["reach", "beat", "--loglevel", "WARNING"]
from reach.cli import main
main()
"""

# `reach worker` as the console script runs it, stopped where the worker would start its
# pool: what its main process holds then, and every prefork child inherits.
WORKER_CLI = """
import json, os, sys
import celery.apps.worker

def stop(self, *args, **kwargs):
    with open(os.environ["MODULES_FILE"], "w") as out:
        json.dump(sorted(sys.modules), out)
    raise SystemExit(0)

celery.apps.worker.Worker.start = stop
sys.argv = ["reach", "worker", "--loglevel", "WARNING", "--concurrency", "1"]
from reach.cli import main
main()
"""

# Celery's umbrella command loads every installed plugin of `celery` (Flower with tornado,
# the REPL's prompt_toolkit): ~15 MB a process that runs only `worker` or `beat`.
CELERY_PLUGINS = {"flower", "tornado", "prompt_toolkit", "click_repl"}

# A worker's import of the hub: the Celery app with its task modules.
WORKER = """
import json, os, sys
from reach.worker.app import app
app.loader.import_default_modules()
with open(os.environ["MODULES_FILE"], "w") as out:
    json.dump(sorted(sys.modules), out)
"""

# The API's: the FastAPI application with its routes, built.
API = """
import json, os, sys
from reach.hub.api import create_app
from reach.hub.settings import load_settings
from reach.hub.storage import create_engine_for
from reach.worker.context import HubContext
settings = load_settings()
engine = create_engine_for(settings.storage.resolved_database_url)
create_app(HubContext(settings=settings, engine=engine))
with open(os.environ["MODULES_FILE"], "w") as out:
    json.dump(sorted(sys.modules), out)
"""


LAZY_SDKS = {"mcp", "mcp_types", "a2a"}  # loaded by the first exchange that speaks them
# loaded on first use: the MCP client's HTTP stack, the outbound POST's and the card
# reader's client, the declared-schema checker (~8 MB a process, times every prefork child)
LAZY_LIBS = {"httpx2", "httpcore2", "requests", "jsonschema"}


def _modules(script: str, store_url: str, tmp_path: Path) -> set[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REACH_")}
    env.update(REACH_DATABASE_URL=store_url, REACH_HOME=str(tmp_path / "home"))
    report = tmp_path / "modules.json"
    env["MODULES_FILE"] = str(report)
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert report.exists(), f"no module list (rc={done.returncode}):\n{done.stderr[-3000:]}"
    return set(json.loads(report.read_text()))


def test_beat_loads_no_task_module_and_no_alembic(store_url: str, tmp_path: Path) -> None:
    loaded = _modules(BEAT, store_url, tmp_path)
    assert "reach.worker.beat_lock" in loaded  # it got as far as its scheduler
    assert not {m for m in loaded if m == "reach.tasks" or m.startswith("reach.tasks.")}
    assert "reach.hub.context" not in loaded
    assert "reach.worker.app" not in loaded
    assert "alembic" not in loaded
    assert not {m for m in loaded if m.split(".")[0] in CELERY_PLUGINS}


def test_reach_worker_loads_no_celery_plugin(store_url: str, tmp_path: Path) -> None:
    loaded = _modules(WORKER_CLI, store_url, tmp_path)
    assert "celery.apps.worker" in loaded and "reach.tasks.delivery" in loaded  # it got there
    assert not {m for m in loaded if m.split(".")[0] in CELERY_PLUGINS}
    assert not {m for m in loaded if m.split(".")[0] in LAZY_SDKS | LAZY_LIBS}


def test_worker_loads_no_alembic_and_no_mcp_or_a2a_sdk(store_url: str, tmp_path: Path) -> None:
    loaded = _modules(WORKER, store_url, tmp_path)
    assert {"reach.tasks.delivery", "reach.tasks.a2a", "reach.hub.context"} <= loaded
    assert not {m for m in loaded if m.split(".")[0] in {"alembic", "mako", "pygments"}}
    assert not {m for m in loaded if m.split(".")[0] in LAZY_SDKS}
    assert "reach.hub.interop.mcp.client" in loaded  # the MCP transport is there, its SDK not
    assert not {m for m in loaded if m.split(".")[0] in LAZY_LIBS}


def test_api_loads_no_alembic_and_no_mcp_or_a2a_sdk(store_url: str, tmp_path: Path) -> None:
    loaded = _modules(API, store_url, tmp_path)
    assert {"reach.hub.api.app", "reach.hub.context"} <= loaded
    assert not {m for m in loaded if m.split(".")[0] in {"alembic", "mako"}}
    assert not {m for m in loaded if m.split(".")[0] in LAZY_SDKS}
    assert "reach.hub.api.routes.mcp" in loaded  # /mcp and /a2a are mounted, their SDKs not
    assert not {m for m in loaded if m.split(".")[0] in LAZY_LIBS}
    # the API opens no aiohttp connection: the connector's resolver is the worker's
    # (0.13 s of every `reach api` start)
    assert "reach.hub.security.networks" in loaded
    assert not {m for m in loaded if m.split(".")[0] == "aiohttp"}
    # nor redis-py: kombu loads the hub's Redis transport with the first Redis connection
    # (reach.worker.broker_schemes), and a hub on the embedded broker never does
    assert "reach.worker.factory" in loaded
    assert not {m for m in loaded if m.split(".")[0] == "redis"}
    assert "reach.worker.redis_broker" not in loaded
