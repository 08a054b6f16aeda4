"""The ``reach`` command line: run the hub's processes and look at the fleet."""

from __future__ import annotations

import json
import os
import sys
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from reach.errors import ConfigError, ReachError
from reach.settings import Settings, load_settings

app = typer.Typer(help="Agent-Reach: the reach layer between AI agents.", no_args_is_help=True)
db_app = typer.Typer(help="Database schema.", no_args_is_help=True)
app.add_typer(db_app, name="db")
console = Console()
err_console = Console(stderr=True, soft_wrap=True)

HubOption = Annotated[
    str | None, typer.Option("--hub", help="Hub URL (default: $REACH_HUB_URL or 127.0.0.1:8800)")
]

STATUS_STYLE = {
    "online": "green",
    "degraded": "yellow",
    "unreachable": "red",
    "offline": "bright_black",
    "deregistered": "bright_black",
}


def _settings() -> Settings:
    try:
        settings = load_settings()
    except ConfigError as exc:
        err_console.print(f"[red]configuration error:[/red] {exc}")
        raise typer.Exit(2) from None
    # Before prometheus_client is imported anywhere: every hub process writes its
    # counters into one directory, and /metrics merges them.
    metrics_dir = settings.storage.home_path / "metrics"
    metrics_dir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", str(metrics_dir))
    return settings


@app.command()
def up(
    port: Annotated[int | None, typer.Option(help="API port (default: server.port)")] = None,
    no_demo: Annotated[
        bool, typer.Option("--no-demo", help="Do not start the demo agents")
    ] = False,
    concurrency: Annotated[int, typer.Option(help="Worker concurrency")] = 2,
    demo_port: Annotated[int, typer.Option(help="First port of the demo agents")] = 7101,
) -> None:
    """Run API, worker, beat (and demo agents) in one command."""
    from reach.supervisor import run_up

    settings = _settings()
    raise typer.Exit(
        run_up(
            settings,
            port=port or settings.server.port,
            demo=not no_demo,
            concurrency=concurrency,
            demo_port=demo_port,
        )
    )


@app.command()
def api(
    port: Annotated[int | None, typer.Option(help="Port (default: server.port)")] = None,
    host: Annotated[str | None, typer.Option(help="Bind address (default: server.host)")] = None,
) -> None:
    """Run the HTTP API."""
    import uvicorn

    from reach.api import HubContext, create_app
    from reach.storage.engine import database_revision_problem

    settings = _settings()
    url = settings.storage.resolved_database_url
    problem = database_revision_problem(url)
    if problem:
        err_console.print(f"[red]database not ready:[/red] {problem}")
        raise typer.Exit(2)
    ctx = HubContext.from_settings(settings)
    uvicorn.run(
        create_app(ctx),
        host=host or settings.server.host,
        port=port or settings.server.port,
        log_level="info",
        access_log=False,
    )


@app.command()
def worker(
    concurrency: Annotated[int, typer.Option(help="Worker processes")] = 2,
    queues: Annotated[str, typer.Option(help="Queues to consume")] = "reach,reach.probe",
    loglevel: Annotated[str, typer.Option(help="Log level")] = "INFO",
) -> None:
    """Run a Celery worker (delivery, probing, sweeps)."""
    _settings()
    from reach.worker_app import app as celery_app

    celery_app.worker_main(
        ["worker", f"--concurrency={concurrency}", "-Q", queues, f"--loglevel={loglevel}"]
    )


@app.command()
def beat(loglevel: Annotated[str, typer.Option(help="Log level")] = "INFO") -> None:
    """Run Celery beat with the schedule in beat_schedule.py (run exactly one)."""
    settings = _settings()
    from reach.worker_app import app as celery_app

    home = settings.storage.home_path
    home.mkdir(parents=True, exist_ok=True)
    celery_app.start(
        ["beat", f"--loglevel={loglevel}", f"--schedule={home / 'celerybeat-schedule'}"]
    )


@app.command()
def flower(port: Annotated[int, typer.Option(help="Flower port")] = 5555) -> None:
    """Run Flower against the configured broker."""
    _settings()
    from reach.worker_app import app as celery_app

    celery_app.start(["flower", f"--port={port}", "--address=127.0.0.1"])


@app.command()
def agents(
    tag: Annotated[list[str] | None, typer.Option(help="Only agents with this tag")] = None,
    capability: Annotated[str | None, typer.Option(help="Only agents with this capability")] = None,
    status: Annotated[str | None, typer.Option(help="Only instances in this status")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
    hub: HubOption = None,
) -> None:
    """List agents and their instances."""
    from reach.hub_client import HubClient

    params: dict[str, Any] = {"tag": tag or [], "capability": capability, "status": status}
    try:
        body = HubClient(hub).get("/api/v1/agents", params={k: v for k, v in params.items() if v})
    except ReachError as exc:
        err_console.print(f"[red]{type(exc).__name__}:[/red] {exc}")
        raise typer.Exit(1) from None
    if as_json:
        print(json.dumps(body, indent=2))
        return
    console.print(agents_table(body["agents"]))


def agents_table(agents: list[dict[str, Any]]) -> Table:
    table = Table(title="Agents", show_lines=False)
    for column in (
        "agent",
        "instance",
        "status",
        "score",
        "endpoint",
        "last heartbeat",
        "load",
        "in flight",
        "tags",
        "capabilities",
    ):
        table.add_column(column)
    for agent in agents:
        caps = ", ".join(c["type"] for c in agent["capabilities"])
        tags = ", ".join(agent["tags"])
        if not agent["instances"]:
            table.add_row(agent["agent_id"], "-", "offline", "-", "-", "-", "-", "-", tags, caps)
        for inst in agent["instances"]:
            style = STATUS_STYLE.get(inst["status"], "white")
            table.add_row(
                agent["agent_id"],
                inst["instance_id"][:12],
                f"[{style}]{inst['status']}[/{style}]",
                _score_cell(inst.get("reach_score")),
                inst.get("public_endpoint") or inst["endpoint"],
                f"{inst['heartbeat_age_s']:.1f}s ago",
                f"{inst['current_load']:.0%}",
                f"{inst['in_flight']}/{inst['max_concurrency']}",
                tags,
                caps,
            )
    return table


def _score_cell(score: float | None) -> str:
    if score is None:
        return "-"
    colour = "green" if score >= 80 else "yellow" if score >= 60 else "red"
    return f"[{colour}]{score:.1f}[/{colour}]"


@db_app.command("upgrade")
def db_upgrade(revision: Annotated[str, typer.Argument(help="Target revision")] = "head") -> None:
    """Apply schema migrations (SQLite or PostgreSQL)."""
    from reach.storage import upgrade_database

    settings = _settings()
    url = settings.storage.resolved_database_url
    upgrade_database(url, revision)
    console.print(f"database at {_redact(url)} upgraded to {revision}")


def _redact(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def main() -> None:
    try:
        app()
    except ConfigError as exc:
        err_console.print(f"[red]configuration error:[/red] {exc}")
        sys.exit(2)


__all__ = ["app", "main"]
