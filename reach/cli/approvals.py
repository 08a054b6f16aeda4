"""``reach approvals``: the human side of the approval gate, through the hub's API.

A task whose capability is dangerous waits in ``awaiting_approval`` until someone with an
``approver`` (or ``admin``) key decides: ``approve`` sends it on, exactly as submitted;
``reject --reason`` fails it and tells the caller who and why. Every decision goes through
the hub's one approval service, so the CLI, the API and the dashboard cannot disagree.

Exit codes: 0 done, 2 bad input (a reject without a reason, an unknown ``--status``),
1 refused by the hub (unknown or already decided approval, a key without the scope).
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.console import Console

from reach.cli.options import ApiKeyOption, HubOption, err_console, fail
from reach.cli.rendering import approval_lines, approvals_table
from reach.core.ledger.statuses import ApprovalStatus
from reach.errors import ReachError

__all__ = ["approvals_app"]

approvals_app = typer.Typer(
    help="Tasks parked for a human decision: list, show, approve, reject.", no_args_is_help=True
)
console = Console()

BAD_INPUT = 2

IdArgument = Annotated[str, typer.Argument(help="The approval's id (see `reach approvals list`)")]
NameOption = Annotated[
    str | None,
    typer.Option("--name", help="Ignored (old scripts): the hub records your key's own name"),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON")]


def _call(hub: str | None, api_key: str | None, method: str, path: str, **kw: Any) -> Any:
    """One request to the hub; a refusal ends the command with one line (`fail`)."""
    from reach.sdk.hub_client import HubClient

    client = HubClient(hub, api_key=api_key)
    try:
        if method == "GET":
            return client.get(path, **kw)
        return client.post(path, **kw)
    except ReachError as exc:
        fail(exc)
    finally:
        client.close()


@approvals_app.command("list")
def list_(
    status: Annotated[
        ApprovalStatus,
        typer.Option("--status", case_sensitive=False, help="Only approvals in this status"),
    ] = ApprovalStatus.PENDING,
    all_: Annotated[bool, typer.Option("--all", help="Every status (overrides --status)")] = False,
    as_json: JsonOption = False,
    hub: HubOption = None,
    api_key: ApiKeyOption = None,
) -> None:
    """List approvals (pending ones by default), newest first."""
    params = {"all": "true"} if all_ else {"status": status.value}
    body = _call(hub, api_key, "GET", "/api/v1/approvals", params=params)
    if as_json:
        print(json.dumps(body, indent=2))
        return
    console.print(approvals_table(body["approvals"]))


@approvals_app.command("show")
def show(
    approval_id: IdArgument,
    as_json: JsonOption = False,
    hub: HubOption = None,
    api_key: ApiKeyOption = None,
) -> None:
    """Show one approval: what was asked, bound to which payload, and the decision."""
    body = _call(hub, api_key, "GET", f"/api/v1/approvals/{approval_id}")
    if as_json:
        print(json.dumps(body, indent=2))
        return
    for line in approval_lines(body):
        console.print(line)


@approvals_app.command("approve")
def approve(
    approval_id: IdArgument,
    name: NameOption = None,
    as_json: JsonOption = False,
    hub: HubOption = None,
    api_key: ApiKeyOption = None,
) -> None:
    """Approve: the parked task is delivered, with the payload that was put up."""
    payload = {"name": name} if name else {}
    body = _call(hub, api_key, "POST", f"/api/v1/approvals/{approval_id}/approve", body=payload)
    if as_json:
        print(json.dumps(body, indent=2))
        return
    console.print(f"approved {body['approval_id']}: task {body['task_id']} is on its way")


@approvals_app.command("reject")
def reject(
    approval_id: IdArgument,
    reason: Annotated[
        str | None, typer.Option("--reason", help="Why (required): the caller is told")
    ] = None,
    name: NameOption = None,
    as_json: JsonOption = False,
    hub: HubOption = None,
    api_key: ApiKeyOption = None,
) -> None:
    """Reject with a reason: the task fails and its caller gets ApprovalRejected."""
    if not (reason or "").strip():
        err_console.print(
            "reject needs --reason TEXT: the caller is told who rejected the task and why",
            markup=False,
            highlight=False,
        )
        raise typer.Exit(BAD_INPUT)
    payload: dict[str, Any] = {"reason": reason}
    if name:
        payload["name"] = name
    body = _call(hub, api_key, "POST", f"/api/v1/approvals/{approval_id}/reject", body=payload)
    if as_json:
        print(json.dumps(body, indent=2))
        return
    console.print(
        f"rejected {body['approval_id']}: task {body['task_id']} failed, its caller is told why"
    )
