"""``reach dag``: run a DAG from a file, list and show runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from reach.cli.common import console, err_console
from reach.cli.listings import dag_list
from reach.cli.options import ApiKeyOption, HubOption
from reach.cli.options import fail as _fail
from reach.cli.rendering import dag_table
from reach.errors import ReachError

dag_app = typer.Typer(help="DAG runs.", no_args_is_help=True)
dag_app.command("list")(dag_list)


@dag_app.command("run")
def dag_run(
    path: Annotated[Path, typer.Argument(help="DAG file (JSON or YAML)", exists=True)],
    input_json: Annotated[str, typer.Option("--input", help="Run input, a JSON object")] = "{}",
    wait: Annotated[float, typer.Option(help="Seconds to follow the run (0: don't)")] = 120.0,
    hub: HubOption = None,
    api_key: ApiKeyOption = None,
) -> None:
    """Start a DAG run and follow its progress live."""
    import time

    from rich.live import Live

    from reach.core.orchestration.dags import dag_format, load_dag
    from reach.sdk.hub_client import HubClient

    try:
        run_input = json.loads(input_json)
        spec = load_dag(path.read_text(), dag_format(path.name))
    except ValueError as exc:
        err_console.print(f"[red]bad input:[/red] {exc}")
        raise typer.Exit(2) from None
    except ReachError as exc:
        _fail(exc)
    client = HubClient(hub, api_key=api_key)
    try:
        run = client.post(
            "/api/v1/dag-runs", {"dag": spec.model_dump(mode="json"), "input": run_input}
        )
        deadline = time.monotonic() + wait
        with Live(dag_table(run), console=console, refresh_per_second=4) as live:
            while run["status"] == "running" and time.monotonic() < deadline:
                time.sleep(0.25)
                run = client.get(f"/api/v1/dag-runs/{run['run_id']}")
                live.update(dag_table(run))
    except ReachError as exc:
        _fail(exc)
    finally:
        client.close()
    if run["status"] == "failed":
        raise typer.Exit(1)


@dag_app.command("show")
def dag_show(
    run_id: str,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    hub: HubOption = None,
    api_key: ApiKeyOption = None,
) -> None:
    """Show a DAG run and its nodes."""
    from reach.sdk.hub_client import HubClient

    try:
        run = HubClient(hub, api_key=api_key).get(f"/api/v1/dag-runs/{run_id}")
    except ReachError as exc:
        _fail(exc)
    if as_json:
        print(json.dumps(run, indent=2))
    else:
        console.print(dag_table(run))
