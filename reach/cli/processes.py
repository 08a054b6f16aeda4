"""The hub's processes: ``reach up`` (all of them, with the demo), ``api``, ``worker``,
``beat``, ``flower`` and the benchmark harness."""

from __future__ import annotations

import logging
import sys
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from reach.cli.common import (
    ConfigOption,
    announce_semantic,
    err_console,
    json_logs,
    load_settings_or_exit,
    notice,
    start_logging,
    use_config,
    warn_upkeep,
)
from reach.core.flow.priority import WORKER_QUEUES

if TYPE_CHECKING:
    from reach.hub.settings import Settings


def up(
    port: Annotated[int | None, typer.Option(help="API port (default: server.port)")] = None,
    no_demo: Annotated[
        bool, typer.Option("--no-demo", help="Do not start the demo agents")
    ] = False,
    concurrency: Annotated[int, typer.Option(help="Worker concurrency")] = 2,
    demo_port: Annotated[int, typer.Option(help="First port of the demo agents")] = 7101,
    verbose: Annotated[
        bool,
        typer.Option(
            "--verbose", "-v", help="Stream every process's log here instead of <home>/logs/"
        ),
    ] = False,
    config: ConfigOption = None,
) -> None:
    """Run API, worker, beat (and demo agents) in one command: a short banner here, their
    logs in <home>/logs/ (.reach/logs/ unless REACH_HOME says otherwise)."""
    from reach.cli.supervisor import run_up

    use_config(config)
    settings = load_settings_or_exit()
    start_logging(settings, "up")
    raise typer.Exit(
        run_up(
            settings,
            port=port or settings.server.port,
            demo=not no_demo,
            concurrency=concurrency,
            demo_port=demo_port,
            verbose=verbose,
        )
    )


def api(
    port: Annotated[int | None, typer.Option(help="Port (default: server.port)")] = None,
    host: Annotated[str | None, typer.Option(help="Bind address (default: server.host)")] = None,
    reuse_port: Annotated[
        bool,
        typer.Option(
            "--reuse-port",
            help="Bind with SO_REUSEPORT: several `reach api` on one port share its "
            "connections (Linux; not with server.admin_port)",
        ),
    ] = False,
    config: ConfigOption = None,
) -> None:
    """Run the HTTP API."""
    use_config(config)
    settings = load_settings_or_exit()  # first: it points prometheus_client at the shared directory
    start_logging(settings, "api")
    import uvicorn

    from reach.hub.api import create_app
    from reach.hub.storage.engine import autovacuum_problem, database_revision_problem
    from reach.worker.context import HubContext

    url = settings.storage.resolved_database_url
    problem = database_revision_problem(url)
    if problem:
        notice(f"[red]database not ready:[/red] {escape(problem)}", level=logging.ERROR)
        raise typer.Exit(2)
    warn_upkeep(autovacuum_problem(url))
    ctx = HubContext.from_settings(settings)
    announce_semantic(ctx)
    from reach.hub import tracing

    if tracing.setup("reach-api"):
        err_console.print("tracing on: spans exported as the OTEL_* variables say")
    bind = host or settings.server.host
    from reach.core.security.auth import auth_required
    from reach.hub.api.edge import EdgeLimits
    from reach.hub.api.serve import serve_together, uvicorn_options

    limits = EdgeLimits.of(settings.server)  # header size, count and time; connections
    log = settings.logging  # JSON: uvicorn's lines go through the root logger's handler

    # resolved against the address actually bound: `--host 0.0.0.0` turns auth on
    require_auth = auth_required(settings.security.require_auth, bind)
    if not require_auth:
        notice(f"auth is off: the API on {bind} takes requests without API keys")
    if reuse_port:
        if settings.server.admin_port is not None:
            notice("[red]--reuse-port serves one port: server.admin_port is set[/red]")
            raise typer.Exit(2)
        from reach.hub.api.serve import reuse_port_socket, serve_on

        sock = reuse_port_socket(bind, port or settings.server.port)
        serve_on(create_app(ctx, require_auth=require_auth, bind_host=bind), sock, limits, log)
        return
    if settings.server.admin_port is None:
        uvicorn.run(
            create_app(ctx, require_auth=require_auth, bind_host=bind),
            host=bind,
            port=port or settings.server.port,
            **uvicorn_options(limits, log),
        )
        return
    from reach.hub.api.app import Surface

    serve_together(
        [
            (
                create_app(ctx, Surface.PUBLIC, require_auth=require_auth, bind_host=bind),
                bind,
                port or settings.server.port,
            ),
            (
                create_app(ctx, Surface.ADMIN, require_auth=require_auth, bind_host=bind),
                bind,
                settings.server.admin_port,
            ),
        ],
        limits,
        log,
    )


class WorkerPool(StrEnum):
    PREFORK = "prefork"
    THREADS = "threads"
    SOLO = "solo"


def worker(
    concurrency: Annotated[int, typer.Option(help="Worker processes (or threads)")] = 2,
    queues: Annotated[
        str, typer.Option(help="Queues to consume, preferred in this order (online first)")
    ] = ",".join(WORKER_QUEUES),
    loglevel: Annotated[str, typer.Option(help="Log level")] = "INFO",
    pool: Annotated[
        WorkerPool,
        typer.Option(
            help="prefork: a child process per slot; threads: many slots in one; solo: one"
        ),
    ] = WorkerPool.PREFORK,
    hostname: Annotated[
        str | None,
        typer.Option(
            "--hostname",
            "-n",
            help="Celery node name (e.g. w1@%h); each worker on one machine needs its own",
        ),
    ] = None,
    config: ConfigOption = None,
) -> None:
    """Run a Celery worker (delivery, probing, sweeps)."""
    use_config(config)
    settings = load_settings_or_exit()
    start_logging(settings, "worker")
    from reach.worker import launch
    from reach.worker.app import app as celery_app

    argv = [
        f"--concurrency={concurrency}",
        f"--pool={pool.value}",
        "-Q",
        queues,
        f"--loglevel={loglevel}",
        # mingle (revoked-task sync between workers, a 1 s wait on every broker
        # (re)connection) and gossip (worker-to-worker events) serve nothing here: tasks
        # are never revoked, and Flower follows the workers through their events
        "--without-mingle",
        "--without-gossip",
    ]
    if hostname:
        argv.append(f"--hostname={hostname}")
    launch.run(celery_app, "worker", argv, quiet=_quiet(settings))


def bench(ctx: typer.Context) -> None:
    """Run the benchmark table (same options as ``python -m bench``; try ``--quick``)."""
    # bench/ is a tool of the repository, never installed (the wheel holds only reach):
    # it runs from a checkout's top folder, as ``python -m bench`` would find it there
    here = str(Path.cwd())
    if (Path(here) / "bench" / "cli.py").is_file() and here not in sys.path:
        sys.path.insert(0, here)
    try:
        from bench.cli import main as bench_main
    except ImportError as exc:
        err_console.print(
            "[red]benchmarks run in a checkout of the repository, with the bench extra:"
            f"[/red] pip install -e '.[bench]', then reach bench in its top folder ({exc})"
        )
        raise typer.Exit(2) from None
    bench_main(list(ctx.args))


def beat(
    loglevel: Annotated[str, typer.Option(help="Log level")] = "INFO",
    config: ConfigOption = None,
) -> None:
    """Run Celery beat with the schedule in beat_schedule.py.

    Start as many as you like: one holds the beat lock in the hub's database and sends,
    the others stand by and take over when it dies (reach.worker.beat_lock).
    """
    from reach.hub.storage.engine import database_revision_problem

    use_config(config)
    settings = load_settings_or_exit()
    start_logging(settings, "beat")
    problem = database_revision_problem(settings.storage.resolved_database_url)
    if problem:  # the lock lives in the database
        notice(f"[red]database not ready:[/red] {escape(problem)}", level=logging.ERROR)
        raise typer.Exit(2)
    from reach.worker import launch
    from reach.worker.factory import BEAT_SCHEDULER, create_celery
    from reach.worker.logs import install

    beat_app = create_celery(settings, task_modules=())  # it sends by name
    install(beat_app, settings, "beat")
    launch.run(
        beat_app,
        "beat",
        [f"--loglevel={loglevel}", f"--scheduler={BEAT_SCHEDULER}"],
        quiet=_quiet(settings),
    )


def _quiet(settings: Settings) -> bool:
    """Celery's ``--quiet`` with JSON logs: its start-up banner is no log line."""
    return settings.logging.format == "json"


def flower(port: Annotated[int, typer.Option(help="Flower port")] = 5555) -> None:
    """Run Flower against the configured broker (Redis or RabbitMQ; see reach.cli.flower)."""
    from reach.cli.flower import flower_refusal

    settings = load_settings_or_exit()
    start_logging(settings, "flower")  # tornado adds no handler of its own to a set-up root
    refusal = flower_refusal(settings.storage.resolved_broker_url)
    if refusal:  # on the embedded broker Flower would start and show an empty page
        if json_logs():
            logging.getLogger("reach.cli").error(refusal)
        else:
            err_console.print(refusal, markup=False, highlight=False)
        raise typer.Exit(2)
    from reach.worker.app import app as celery_app

    quiet = ["--quiet"] if _quiet(settings) else []
    celery_app.start([*quiet, "flower", f"--port={port}", "--address=127.0.0.1"])


def register(app: typer.Typer) -> None:
    """Add the process commands to the root app."""
    app.command()(up)
    app.command()(api)
    app.command()(worker)
    app.command(
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
        add_help_option=False,  # --help goes to the harness, which knows its options
    )(bench)
    app.command()(beat)
    app.command()(flower)
