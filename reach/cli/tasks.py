"""``reach send`` and ``reach match`` (top-level), and ``reach tasks``: list, show, audit,
watch."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from reach.cli.columns import Output
from reach.cli.common import console, err_console
from reach.cli.listings import OutputOption, tasks_list
from reach.cli.options import ApiKeyOption, HubOption
from reach.cli.options import fail as _fail
from reach.cli.rendering import approval_state_line, audit_tables, events_table, task_lines
from reach.errors import NoSuitableAgent, ReachError

tasks_app = typer.Typer(help="Tasks.", no_args_is_help=True)
tasks_app.command("list")(tasks_list)


def send(
    method: Annotated[
        str | None,
        typer.Argument(help="Method (capability type) to call; with --intent, may be left out"),
    ] = None,
    payload: Annotated[str, typer.Option(help="JSON object")] = "{}",
    payload_ref: Annotated[
        str | None, typer.Option(help="A blob id (reach blobs put) carrying a large payload")
    ] = None,
    agent_id: Annotated[str | None, typer.Option("--agent", help="Agent ID")] = None,
    tag: Annotated[list[str] | None, typer.Option(help="Required tag (repeatable)")] = None,
    capability: Annotated[str | None, typer.Option(help="Required capability")] = None,
    intent: Annotated[
        str | None, typer.Option(help="What is needed, in words: matched to a capability")
    ] = None,
    task_id: Annotated[str | None, typer.Option(help="Task ID (idempotency key)")] = None,
    timeout_ms: Annotated[int, typer.Option(help="Task timeout (ms)")] = 30_000,
    wait: Annotated[float, typer.Option(help="Seconds to wait for the result (0: don't)")] = 30.0,
    hub: HubOption = None,
    api_key: ApiKeyOption = None,
) -> None:
    """Send a task and (by default) wait for its result."""
    from reach.sdk.caller import send as send_task
    from reach.sdk.caller import wait_for_result

    if method is None and intent is None:
        err_console.print("[red]name a METHOD, or give --intent[/red]")
        raise typer.Exit(2)
    try:
        body = json.loads(payload)
    except ValueError as exc:
        err_console.print(f"[red]--payload is not JSON:[/red] {exc}")
        raise typer.Exit(2) from None
    if not isinstance(body, dict):
        err_console.print("[red]--payload must be a JSON object[/red]")
        raise typer.Exit(2)
    try:
        sub = send_task(
            method=method,
            payload=body,
            payload_ref=payload_ref,
            agent_id=agent_id,
            tags=tag or (),
            capability=capability,
            intent=intent,
            task_id=task_id,
            timeout_ms=timeout_ms,
            hub=hub,
            api_key=api_key,
        )
        if intent is not None:
            err_console.print(f"intent matched {sub.method} of {sub.agent_id}")
        if wait <= 0:
            print(json.dumps({"task_id": sub.task_id, "status": sub.status}))
            return
        result = wait_for_result(sub.task_id, timeout=wait, hub=hub, api_key=api_key)
    except ReachError as exc:
        _fail(exc)
    print(
        json.dumps(
            {
                "task_id": result.task_id,
                "status": "success",
                "agent_id": result.agent_id,
                "result": result.data,
            },
            indent=2,
        )
    )


def match(
    intent: Annotated[str, typer.Argument(help="What is needed, in words")],
    agent_id: Annotated[str | None, typer.Option("--agent", help="Agent ID")] = None,
    tag: Annotated[list[str] | None, typer.Option(help="Required tag (repeatable)")] = None,
    capability: Annotated[str | None, typer.Option(help="Required capability")] = None,
    limit: Annotated[int, typer.Option(min=1, max=50, help="Candidates shown")] = 5,
    output: OutputOption = Output.TABLE,
    hub: HubOption = None,
    api_key: ApiKeyOption = None,
) -> None:
    """Which agents' capabilities an intent matches, best first (nothing is sent)."""
    from reach.sdk.caller import find

    try:
        found = find(
            intent,
            agent_id=agent_id,
            tags=tag or (),
            capability=capability,
            limit=limit,
            hub=hub,
            api_key=api_key,
        )
    except NoSuitableAgent as exc:  # the closest ones, and why they were not taken
        for c in exc.extra.get("candidates") or []:
            err_console.print(f"  {c['score']:.3f}  {c['capability']}  {c['agent_id']}")
        _fail(exc)
    except ReachError as exc:
        _fail(exc)
    rows = [{"agent_id": m.agent_id, "capability": m.capability, "score": m.score} for m in found]
    if output is Output.JSON:
        print(json.dumps({"intent": intent, "candidates": rows}, indent=2))
        return
    print("score\tcapability\tagent")
    for row in rows:
        print(f"{row['score']:.3f}\t{row['capability']}\t{row['agent_id']}")


@tasks_app.command("show")
def tasks_show(task_id: str, hub: HubOption = None, api_key: ApiKeyOption = None) -> None:
    """Show a task and its audit trail."""
    from reach.sdk.hub_client import HubClient

    client = HubClient(hub, api_key=api_key)
    try:
        task = client.get(f"/v1/tasks/{task_id}")
        events = client.get(f"/v1/tasks/{task_id}/events")["events"]
    except ReachError as exc:
        _fail(exc)
    finally:
        client.close()
    for line in task_lines(task):
        console.print(line)
    gate = approval_state_line(events)
    if gate is not None:
        console.print(gate)
    console.print(events_table(events))


@tasks_app.command("audit")
def tasks_audit(
    task_id: str,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
    hub: HubOption = None,
    api_key: ApiKeyOption = None,
) -> None:
    """Who touched a task: every event with its identity, and its audit-log rows."""
    from reach.sdk.hub_client import HubClient

    try:
        trail = HubClient(hub, api_key=api_key).get(f"/api/v1/tasks/{task_id}/audit")
    except ReachError as exc:
        _fail(exc)
    if as_json:
        print(json.dumps(trail, indent=2))
        return
    for table in audit_tables(trail):
        console.print(table)


@tasks_app.command("watch")
def tasks_watch(
    task_id: str,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per event")] = False,
    timeout: Annotated[
        float | None, typer.Option(help="Give up after this many seconds", min=0.1)
    ] = None,
    hub: HubOption = None,
    api_key: ApiKeyOption = None,
) -> None:
    """Follow a task as it runs: its state, status changes, progress and result (a
    dropped connection resumes where it stopped). Exits 0 on success, 1 otherwise."""
    from reach.sdk.stream import stream

    status = None
    try:
        for event in stream(task_id, hub=hub, api_key=api_key, timeout=timeout):
            if as_json:
                print(json.dumps({"id": event.id, "kind": event.kind, "data": event.data}))
            else:
                console.print(watch_line(event.id, event.kind, event.data), highlight=False)
            if event.final and isinstance(event.data, dict):
                status = event.data.get("status")
    except ReachError as exc:
        _fail(exc)
    raise typer.Exit(0 if status == "success" else 1)


def watch_line(event_id: int | None, kind: str, data: Any) -> str:
    """One event of ``reach tasks watch`` as a line of text."""
    data = data if isinstance(data, dict) else {"data": data}
    if kind == "progress":
        share = data.get("progress")
        shown = f"{share:.0%} " if isinstance(share, int | float) else ""
        text = f"{shown}{data.get('message') or ''}".strip() or json.dumps(data.get("data"))
    elif kind == "status":
        text = f"{data.get('status')} ({data.get('event')}, attempt {data.get('attempt_seq')})"
    else:  # state, result
        text = str(data.get("status"))
        if data.get("status") == "success" and kind == "result":
            text += f" {json.dumps(data.get('result'), default=str)[:200]}"
        elif data.get("error"):
            text += f" {json.dumps(data.get('error'), default=str)[:200]}"
    return f"[{event_id if event_id is not None else '-'}] {kind:<8} {text}"


def register(app: typer.Typer) -> None:
    """Add ``send`` and ``match`` to the root app."""
    app.command()(send)
    app.command()(match)
