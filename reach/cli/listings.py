"""``reach tasks list``, ``reach dag list``, ``reach alerts`` and ``reach agents``' output.

Each asks the hub for one page (``GET /api/v1/tasks``, ``/dag-runs``, ``/alerts``,
``/agents``) and prints it as `reach.cli.columns` lays it out: on a terminal, the columns
that fit its width (IDs never cut); into a pipe, tab-separated rows with every value
whole; ``-o wide`` every column; ``-o json`` the hub's JSON as it came. When there is a
next page, its ``--cursor`` is printed on stderr (a pipe gets only rows).

Exit codes: 0 listed (an empty list too), 1 refused by the hub (a bad filter, a key
without the scope).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any

import typer
from rich.console import Console

from reach.cli.columns import (
    AGENT_COLUMNS,
    ALERT_COLUMNS,
    DAG_RUN_COLUMNS,
    TASK_COLUMNS,
    Column,
    Output,
    agent_rows,
    alert_rows,
    dag_run_rows,
    fit,
    shown_columns,
    table_lines,
    task_rows,
    tsv_lines,
)
from reach.cli.options import ApiKeyOption, HubOption, fail
from reach.cli.rendering import NODE_STYLE, STATUS_STYLE
from reach.errors import ReachError

__all__ = [
    "AlertKindOption",
    "IncludeMutedOption",
    "OutputOption",
    "alerts_list",
    "dag_list",
    "print_agents",
    "show",
    "tasks_list",
]

OutputOption = Annotated[
    Output,
    typer.Option(
        "--output", "-o", help="table (fitted to the terminal), wide (every column) or json"
    ),
]
SinceOption = Annotated[
    str | None,
    typer.Option(help="Only since this time: epoch seconds, ISO 8601, or ago (15m, 2h, 7d)"),
]
UntilOption = Annotated[str | None, typer.Option(help="Only before this time (as --since)")]
LimitOption = Annotated[int, typer.Option(help="Rows per page (1-500)")]
CursorOption = Annotated[
    str | None, typer.Option(help="The next page: the cursor a previous page printed")
]

TASK_STYLE = {
    "success": "green",
    "failed": "red",
    "dead": "red",
    "cancelled": "bright_black",
    "pending": "white",
    "dispatching": "yellow",
    "executing": "yellow",
    "awaiting_approval": "magenta",
}
ALERT_STYLE = {
    "offline": "red",
    "unreachable": "red",
    "heartbeat_lost": "yellow",
    "business_unreachable": "yellow",
    "failing": "red",
    "breaker_opened": "red",
    "breaker_closed": "green",
    "dependency_loop_suspected": "yellow",
    "dependency_loop_calmed": "green",
    "backpressure": "yellow",
}


def _console() -> Console:
    return Console(soft_wrap=True, highlight=False)


def show(
    body: Mapping[str, Any],
    output: Output,
    columns: Sequence[Column],
    rows_of: Callable[[bool], list[dict[str, str]]],
    styles: Mapping[str, Mapping[str, str]] | None = None,
    console: Console | None = None,
) -> None:
    """Print one page: JSON, tab-separated rows (not a terminal) or a fitted table.
    ``rows_of(plain)``: the rows, for a pipe or wide output when ``plain`` (IDs whole,
    exact times)."""
    console = console or _console()
    if output is Output.JSON:
        print(json.dumps(body, indent=2))
        return
    shown = shown_columns(columns, output)
    if not console.is_terminal:
        for line in tsv_lines(shown, rows_of(True)):
            print(line)
        return
    rows = rows_of(output is Output.WIDE)
    width = 10**6 if output is Output.WIDE else console.width
    for text in table_lines(fit(shown, rows, width), rows, styles):
        console.print(text, no_wrap=True, overflow="ignore", crop=False)
    if not rows:
        console.print("(none)", style="bright_black")


def _page(path: str, params: dict[str, Any], hub: str | None, api_key: str | None) -> Any:
    from reach.sdk.hub_client import HubClient

    client = HubClient(hub, api_key=api_key)
    try:
        return client.get(path, params={k: v for k, v in params.items() if v not in (None, [])})
    except ReachError as exc:
        fail(exc)
    finally:
        client.close()


def _more(body: Mapping[str, Any]) -> None:
    if body.get("next_cursor"):
        print(f"next page: --cursor {body['next_cursor']}", file=sys.stderr)


def tasks_list(
    status: Annotated[
        list[str] | None, typer.Option("--status", help="Only in this status (repeatable)")
    ] = None,
    agent: Annotated[str | None, typer.Option("--agent", help="Only routed to this agent")] = None,
    capability: Annotated[str | None, typer.Option(help="Only this capability (method)")] = None,
    caller: Annotated[
        str | None, typer.Option(help="Only submitted by this identity (key:<id>, agent:<id>)")
    ] = None,
    session: Annotated[str | None, typer.Option("--session", help="Only in this session")] = None,
    since: SinceOption = None,
    until: UntilOption = None,
    limit: LimitOption = 50,
    cursor: CursorOption = None,
    output: OutputOption = Output.TABLE,
    hub: HubOption = None,
    api_key: ApiKeyOption = None,
) -> None:
    """List tasks, newest first (a caller's key sees only its own)."""
    params = {
        "status": status or [],
        "agent_id": agent,
        "capability": capability,
        "caller": caller,
        "session_id": session,
        "since": since,
        "until": until,
        "limit": limit,
        "cursor": cursor,
    }
    body = _page("/api/v1/tasks", params, hub, api_key)
    now = time.time()
    show(
        body,
        output,
        TASK_COLUMNS,
        lambda plain: task_rows(body["items"], now, exact=plain, whole_ids=plain),
        {"status": TASK_STYLE},
    )
    _more(body)


def dag_list(
    status: Annotated[
        list[str] | None, typer.Option("--status", help="running, success or failed (repeatable)")
    ] = None,
    name: Annotated[str | None, typer.Option("--name", help="Only runs of this DAG")] = None,
    since: SinceOption = None,
    until: UntilOption = None,
    limit: LimitOption = 50,
    cursor: CursorOption = None,
    output: OutputOption = Output.TABLE,
    hub: HubOption = None,
    api_key: ApiKeyOption = None,
) -> None:
    """List DAG runs, newest first."""
    params = {
        "status": status or [],
        "name": name,
        "since": since,
        "until": until,
        "limit": limit,
        "cursor": cursor,
    }
    body = _page("/api/v1/dag-runs", params, hub, api_key)
    now = time.time()
    show(
        body,
        output,
        DAG_RUN_COLUMNS,
        lambda plain: dag_run_rows(body["items"], now, exact=plain),
        {"status": NODE_STYLE},
    )
    _more(body)


# `reach alerts` (a group whose bare form lists, in reach.cli.alerts) takes these too
AlertKindOption = Annotated[
    list[str] | None,
    typer.Option(
        "--kind",
        help="offline, unreachable, heartbeat_lost, business_unreachable, failing, "
        "breaker_opened, breaker_closed, dependency_loop_suspected, "
        "dependency_loop_calmed, backpressure, dead_letter (repeatable)",
    ),
]
IncludeMutedOption = Annotated[
    bool, typer.Option("--include-muted", help="Also the kinds an admin muted")
]


def alerts_list(
    kind: AlertKindOption = None,
    since: SinceOption = None,
    until: UntilOption = None,
    limit: LimitOption = 50,
    cursor: CursorOption = None,
    output: OutputOption = Output.TABLE,
    hub: HubOption = None,
    api_key: ApiKeyOption = None,
    include_muted: IncludeMutedOption = False,
) -> None:
    """List what is failing: alerts, newest first (muted kinds left out)."""
    params: dict[str, Any] = {
        "kind": kind or [],
        "since": since,
        "until": until,
        "limit": limit,
        "cursor": cursor,
    }
    if include_muted:
        params["include_muted"] = "true"
    body = _page("/api/v1/alerts", params, hub, api_key)
    now = time.time()
    show(
        body,
        output,
        ALERT_COLUMNS,
        lambda plain: alert_rows(body["items"], now, exact=plain, whole_ids=plain),
        {"kind": ALERT_STYLE},
    )
    _more(body)


def print_agents(body: Mapping[str, Any], output: Output) -> None:
    """``reach agents``: one row per instance, full agent IDs, 12-character instance IDs."""
    show(
        body,
        output,
        AGENT_COLUMNS,
        lambda plain: agent_rows(body["agents"], whole_ids=plain),
        {"status": STATUS_STYLE},
    )
