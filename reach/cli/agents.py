"""``reach agents``: list the fleet, set trust levels, allow-lists and queue bounds;
register A2A agents and MCP servers."""

from __future__ import annotations

import json
import os
from typing import Annotated, Any

import typer

from reach.cli.columns import Output
from reach.cli.common import console, err_console
from reach.cli.listings import OutputOption, print_agents
from reach.cli.options import ApiKeyOption, HubOption
from reach.cli.options import fail as _fail
from reach.cli.rendering import allow_list_lines
from reach.core.security.trust import TrustLevel
from reach.errors import ReachError

FLEET_PAGE = 500  # agents per page `reach agents` asks for (it follows every page)

agents_app = typer.Typer(
    help="The fleet: list agents (bare `reach agents`), set trust levels, allow-lists, "
    "queue bounds.",
    invoke_without_command=True,
)


@agents_app.callback()
def agents(
    ctx: typer.Context,
    tag: Annotated[list[str] | None, typer.Option(help="Only agents with this tag")] = None,
    capability: Annotated[str | None, typer.Option(help="Only agents with this capability")] = None,
    status: Annotated[str | None, typer.Option(help="Only instances in this status")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON (as -o json)")] = False,
    output: OutputOption = Output.TABLE,
    hub: HubOption = None,
    api_key: ApiKeyOption = None,
) -> None:
    """List agents and their instances (or run one of the commands below on them): full
    agent IDs, 12-character instance IDs, the columns that fit the terminal; tab-separated
    rows into a pipe."""
    from reach.sdk.hub_client import HubClient

    if ctx.invoked_subcommand is not None:
        return
    params: dict[str, Any] = {"tag": tag or [], "capability": capability, "status": status}
    params = {k: v for k, v in params.items() if v}
    client = HubClient(hub, api_key=api_key)
    agents: list[dict[str, Any]] = []
    cursor = None
    try:
        while True:  # the listing is paged: every page, in agent-ID order
            page = client.get(
                "/api/v1/agents", params={**params, "limit": FLEET_PAGE, "cursor": cursor}
            )
            agents += page["agents"]
            cursor = page.get("next_cursor")
            if not cursor:
                break
    except ReachError as exc:
        _fail(exc)
    print_agents({"agents": agents}, Output.JSON if as_json else output)


@agents_app.command("trust")
def agents_trust(
    agent_id: Annotated[str, typer.Argument(help="Agent ID")],
    level: Annotated[TrustLevel, typer.Argument(help="L1 (mTLS), L2 (default) or L3 (plugin)")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
    hub: HubOption = None,
    api_key: ApiKeyOption = None,
) -> None:
    """Set an agent's trust level (admin key; audited)."""
    from reach.sdk.hub_client import HubClient

    try:
        body = HubClient(hub, api_key=api_key).put(
            f"/api/v1/agents/{agent_id}/trust", {"level": level.value}
        )
    except ReachError as exc:
        _fail(exc)
    if as_json:
        print(json.dumps(body, indent=2))
        return
    console.print(f"agent {body['agent_id']}: trust {body['previous']} -> {body['trust_level']}")


@agents_app.command("add-a2a")
def agents_add_a2a(
    url: Annotated[str, typer.Argument(help="The A2A agent's base URL (or its card's URL)")],
    agent_id: Annotated[
        str | None,
        typer.Option("--agent-id", help="Register as this ID (default: from its name)"),
    ] = None,
    credential_env: Annotated[
        str | None,
        typer.Option(
            "--credential-env",
            help="Environment variable holding the secret for the card's security scheme",
        ),
    ] = None,
    allow_loopback: Annotated[
        bool, typer.Option("--allow-loopback", help="Accept a loopback card (local development)")
    ] = False,
    max_concurrency: Annotated[int, typer.Option(min=1, help="Deliveries at once")] = 8,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
    hub: HubOption = None,
    api_key: ApiKeyOption = None,
) -> None:
    """Register an A2A agent by its card (/.well-known/agent-card.json): its skills become
    its capabilities and `reach send SKILL --agent ID` reaches it (admin key; audited)."""
    from reach.sdk.hub_client import HubClient

    body: dict[str, Any] = {
        "card_url": url,
        "allow_loopback": allow_loopback,
        "max_concurrency": max_concurrency,
    }
    if agent_id:
        body["agent_id"] = agent_id
    if credential_env:
        secret = os.environ.get(credential_env)
        if not secret:
            err_console.print(f"[red]{credential_env} is not set or empty[/red]")
            raise typer.Exit(2)
        body["credential"] = secret
    try:
        answer = HubClient(hub, api_key=api_key).post("/api/v1/agents/a2a", body)
    except ReachError as exc:
        _fail(exc)
    if as_json:
        print(json.dumps(answer, indent=2))
        return
    console.print(
        f"agent {answer['agent_id']} ({answer['status']}): A2A at {answer['endpoint']}, "
        f"skills {', '.join(answer['skills'])}"
    )


@agents_app.command("add-mcp")
def agents_add_mcp(
    url: Annotated[str, typer.Argument(help="The MCP server's Streamable HTTP URL (…/mcp)")],
    agent_id: Annotated[
        str | None,
        typer.Option("--agent-id", "--name", help="Register as this ID (default: its name)"),
    ] = None,
    tags: Annotated[
        list[str] | None, typer.Option("--tag", "--tags", help="A tag for the agent (repeat)")
    ] = None,
    allow_loopback: Annotated[
        bool, typer.Option("--allow-loopback", help="Accept a loopback server (local development)")
    ] = False,
    max_concurrency: Annotated[int, typer.Option(min=1, help="Tool calls at once")] = 8,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
    hub: HubOption = None,
    api_key: ApiKeyOption = None,
) -> None:
    """Register an MCP server as an agent: its tools become its capabilities and
    `reach send TOOL --agent ID` calls one (admin key; audited)."""
    from reach.sdk.hub_client import HubClient

    body: dict[str, Any] = {
        "url": url,
        "tags": tags or [],
        "allow_loopback": allow_loopback,
        "max_concurrency": max_concurrency,
    }
    if agent_id:
        body["agent_id"] = agent_id
    try:
        answer = HubClient(hub, api_key=api_key).post("/api/v1/agents/mcp", body)
    except ReachError as exc:
        _fail(exc)
    if as_json:
        print(json.dumps(answer, indent=2))
        return
    console.print(
        f"agent {answer['agent_id']} ({answer['status']}): MCP at {answer['url']}, "
        f"tools {', '.join(answer['tools'])}"
    )
    for name, why in (answer.get("skipped") or {}).items():
        err_console.print(f"[yellow]tool {name} left out: {why}[/yellow]")


@agents_app.command("queue")
def agents_queue(
    agent_id: Annotated[str, typer.Argument(help="Agent ID")],
    max_queue: Annotated[
        int | None,
        typer.Option("--max", min=1, help="Pending + in-flight tasks it may hold (429 past it)"),
    ] = None,
    clear: Annotated[
        bool, typer.Option("--clear", help="Drop the override: its declaration or the router's")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
    hub: HubOption = None,
    api_key: ApiKeyOption = None,
) -> None:
    """Override an agent's queue bound (admin key; audited); with neither option, show it."""
    from reach.sdk.hub_client import HubClient

    if max_queue is not None and clear:
        err_console.print("[red]give one of --max or --clear, not both[/red]")
        raise typer.Exit(2)
    client = HubClient(hub, api_key=api_key)
    try:
        if max_queue is None and not clear:
            body = client.get(f"/api/v1/agents/{agent_id}")["queue"]
            body = {"agent_id": agent_id, **body}
        else:
            body = client.put(f"/api/v1/agents/{agent_id}/max-queue", {"max_queue": max_queue})
    except ReachError as exc:
        _fail(exc)
    finally:
        client.close()
    if as_json:
        print(json.dumps(body, indent=2))
        return
    console.print(
        f"agent {body['agent_id']}: queue {body['depth']}/{body['limit']} ({body['source']})"
    )


@agents_app.command("allow")
def agents_allow(
    agent_id: Annotated[str, typer.Argument(help="Agent ID")],
    call: Annotated[
        str | None,
        typer.Option("--call", help="A capability (pattern, e.g. 'search.*') it may reach"),
    ] = None,
    callable_by: Annotated[
        str | None,
        typer.Option(
            "--callable-by", help="An agent ID or identity (agent:ID, key:KEY_ID) that may reach it"
        ),
    ] = None,
    remove: Annotated[bool, typer.Option("--remove", help="Remove the entry instead")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
    hub: HubOption = None,
    api_key: ApiKeyOption = None,
) -> None:
    """Add to (or --remove from) an L3 agent's allow-list; with neither option, show it."""
    from reach.sdk.hub_client import HubClient

    if call is not None and callable_by is not None:
        err_console.print("[red]give one of --call or --callable-by, not both[/red]")
        raise typer.Exit(2)
    path = f"/api/v1/agents/{agent_id}/allow"
    rule = {"call": call} if call is not None else {"callable_by": callable_by}
    client = HubClient(hub, api_key=api_key)
    try:
        if call is None and callable_by is None:
            if remove:
                err_console.print("[red]--remove needs --call or --callable-by[/red]")
                raise typer.Exit(2)
            body = client.get(path)
        elif remove:
            body = client.delete(path, rule)
        else:
            body = client.post(path, rule)
    except ReachError as exc:
        _fail(exc)
    finally:
        client.close()
    if as_json:
        print(json.dumps(body, indent=2))
        return
    for line in allow_list_lines(body):
        console.print(line)
