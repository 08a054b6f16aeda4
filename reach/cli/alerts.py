"""``reach alerts``: list alerts (bare ``reach alerts``), mute and unmute an alert kind."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from reach.cli.columns import Output
from reach.cli.common import console
from reach.cli.listings import (
    AlertKindOption,
    CursorOption,
    IncludeMutedOption,
    LimitOption,
    OutputOption,
    SinceOption,
    UntilOption,
    alerts_list,
)
from reach.cli.options import ApiKeyOption, HubOption
from reach.cli.options import fail as _fail
from reach.errors import ReachError

alerts_app = typer.Typer(
    help="What is failing: list alerts (bare `reach alerts`), mute or unmute an alert kind.",
    invoke_without_command=True,
)
KindArgument = Annotated[str, typer.Argument(help="An alert kind, e.g. dead_letter")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON")]


@alerts_app.callback()
def alerts(
    ctx: typer.Context,
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
    """List what is failing: alerts, newest first, muted kinds left out (or run one of
    the commands below)."""
    if ctx.invoked_subcommand is not None:
        return
    alerts_list(
        kind, since, until, limit, cursor, output, hub, api_key, include_muted=include_muted
    )


def _call(method: str, path: str, hub: str | None, api_key: str | None) -> dict[str, Any]:
    from reach.sdk.hub_client import HubClient

    client = HubClient(hub, api_key=api_key)
    try:
        if method == "PUT":
            return client.put(path, {})
        if method == "DELETE":
            return client.delete(path)
        return client.get(path)
    except ReachError as exc:
        _fail(exc)
    finally:
        client.close()


@alerts_app.command("mute")
def alerts_mute(
    kind: KindArgument,
    as_json: JsonOption = False,
    hub: HubOption = None,
    api_key: ApiKeyOption = None,
) -> None:
    """Mute an alert kind: the alert webhook does not push it and the list hides it
    (admin key; audited)."""
    body = _call("PUT", f"/api/v1/alerts/mutes/{kind}", hub, api_key)
    if as_json:
        print(json.dumps(body, indent=2))
        return
    console.print(f"alert kind {body['kind']}: muted (by {body['muted_by']})")


@alerts_app.command("unmute")
def alerts_unmute(
    kind: KindArgument,
    as_json: JsonOption = False,
    hub: HubOption = None,
    api_key: ApiKeyOption = None,
) -> None:
    """Unmute an alert kind (admin key; audited)."""
    body = _call("DELETE", f"/api/v1/alerts/mutes/{kind}", hub, api_key)
    if as_json:
        print(json.dumps(body, indent=2))
        return
    console.print(f"alert kind {body['kind']}: unmuted")


@alerts_app.command("mutes")
def alerts_mutes(
    as_json: JsonOption = False, hub: HubOption = None, api_key: ApiKeyOption = None
) -> None:
    """The muted alert kinds."""
    body = _call("GET", "/api/v1/alerts/mutes", hub, api_key)
    if as_json:
        print(json.dumps(body, indent=2))
        return
    if not body["mutes"]:
        console.print("no alert kind is muted")
    for mute in body["mutes"]:
        console.print(f"{mute['kind']}  muted by {mute['muted_by']}")
