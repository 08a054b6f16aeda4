"""``reach dlq``: the dead-letter queue: list, show, replay."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from reach.cli.common import console
from reach.cli.options import ApiKeyOption, HubOption
from reach.cli.options import fail as _fail
from reach.cli.rendering import dead_letters_table
from reach.errors import ReachError

dlq_app = typer.Typer(help="The dead-letter queue.", no_args_is_help=True)


@dlq_app.command("list")
def dlq_list(
    all_: Annotated[bool, typer.Option("--all", help="Include replayed entries")] = False,
    hub: HubOption = None,
    api_key: ApiKeyOption = None,
) -> None:
    """List dead-lettered tasks."""
    from reach.sdk.hub_client import HubClient

    try:
        rows = HubClient(hub, api_key=api_key).get(
            "/api/v1/dead-letters", params={"include_replayed": str(all_).lower()}
        )["dead_letters"]
    except ReachError as exc:
        _fail(exc)
    console.print(dead_letters_table(rows))


@dlq_app.command("show")
def dlq_show(dead_id: int, hub: HubOption = None, api_key: ApiKeyOption = None) -> None:
    """Show one dead letter."""
    from reach.sdk.hub_client import HubClient

    try:
        row = HubClient(hub, api_key=api_key).get(f"/api/v1/dead-letters/{dead_id}")
        print(json.dumps(row, indent=2))
    except ReachError as exc:
        _fail(exc)


@dlq_app.command("replay")
def dlq_replay(dead_id: int, hub: HubOption = None, api_key: ApiKeyOption = None) -> None:
    """Replay a dead letter with a fresh retry budget."""
    from reach.sdk.hub_client import HubClient

    try:
        client = HubClient(hub, api_key=api_key)
        print(json.dumps(client.post(f"/api/v1/dead-letters/{dead_id}/replay", {})))
    except ReachError as exc:
        _fail(exc)
