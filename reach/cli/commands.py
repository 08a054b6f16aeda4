"""The ``reach`` command line: the root app, assembled from one module per noun.

Commands fetch and print; the tables they print are built in `reach.cli.rendering`.
"""

from __future__ import annotations

import sys

import typer

from reach.cli import processes, tasks
from reach.cli.agents import agents_app
from reach.cli.alerts import alerts_app
from reach.cli.approvals import approvals_app
from reach.cli.blobs import blobs_app
from reach.cli.certs import certs_app
from reach.cli.common import err_console
from reach.cli.dags import dag_app
from reach.cli.db import db_app
from reach.cli.dlq import dlq_app
from reach.cli.keys import keys_app
from reach.cli.sessions import sessions_app
from reach.cli.tasks import tasks_app
from reach.errors import ConfigError

app = typer.Typer(help="Agent-Reach: the reach layer between AI agents.", no_args_is_help=True)
processes.register(app)  # up, api, worker, bench, beat, flower
tasks.register(app)  # send, match
app.add_typer(db_app, name="db")
app.add_typer(keys_app, name="keys")
app.add_typer(certs_app, name="certs")
app.add_typer(approvals_app, name="approvals")
app.add_typer(sessions_app, name="sessions")
app.add_typer(agents_app, name="agents")
app.add_typer(alerts_app, name="alerts")
app.add_typer(tasks_app, name="tasks")
app.add_typer(dlq_app, name="dlq")
app.add_typer(dag_app, name="dag")
app.add_typer(blobs_app, name="blobs")


def main() -> None:
    try:
        app()
    except ConfigError as exc:
        err_console.print(f"[red]configuration error:[/red] {exc}")
        sys.exit(2)


__all__ = ["app", "main"]
