"""``reach sessions``: open, close and show user sessions through the hub's API.

Closing a session cancels its queued and parked reaches (the command lists them) and
tells the in-flight ones; new reaches bound to it are refused with ``session-closed``.

Exit codes: 0 done, 1 refused by the hub (unknown session, closed is final, a key
without the scope).
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.console import Console

from reach.cli.options import ApiKeyOption, HubOption, fail
from reach.errors import ReachError

__all__ = ["sessions_app"]

sessions_app = typer.Typer(
    help="User sessions reaches are bound to: open (with a TTL), close, show.",
    no_args_is_help=True,
)
console = Console()

IdArgument = Annotated[str, typer.Argument(help="The session id (what sends pass as session_id)")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON")]


def _run(call: Any) -> dict[str, Any]:
    try:
        answer: dict[str, Any] = call()
    except ReachError as exc:
        fail(exc)
    return answer


def _show(view: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(view, indent=2))
        return
    ttl = view.get("ttl_remaining_s")
    console.print(
        f"session {view['session_id']}: {view['state']}"
        + (f", expires in {ttl:g}s" if ttl is not None else "")
        + (f" (closed by {view['closed_by']}" if view.get("closed_by") else "")
        + (f": {view['reason']})" if view.get("reason") else ")" if view.get("closed_by") else ""),
        markup=False,
    )
    reaches = view.get("reaches") or {}
    console.print(
        f"reaches: {reaches.get('live', 0)} live, {reaches.get('cancelled', 0)} cancelled",
        markup=False,
    )


@sessions_app.command("open")
def open_(
    session_id: IdArgument,
    ttl: Annotated[
        float | None, typer.Option("--ttl", min=0.001, help="Seconds until it expires")
    ] = None,
    as_json: JsonOption = False,
    hub: HubOption = None,
    api_key: ApiKeyOption = None,
) -> None:
    """Open a session (or renew an open one's TTL); a closed one stays closed."""
    from reach.sdk.sessions import open_session

    _show(_run(lambda: open_session(session_id, ttl, hub=hub, api_key=api_key)), as_json)


@sessions_app.command("close")
def close(
    session_id: IdArgument,
    reason: Annotated[str | None, typer.Option("--reason", help="Why, for the record")] = None,
    as_json: JsonOption = False,
    hub: HubOption = None,
    api_key: ApiKeyOption = None,
) -> None:
    """Close a session: its queued reaches are cancelled, in-flight ones told."""
    from reach.sdk.sessions import close_session

    view = _run(lambda: close_session(session_id, reason, hub=hub, api_key=api_key))
    if as_json:
        print(json.dumps(view, indent=2))
        return
    _show(view, False)
    cancelled = view.get("cancelled") or []
    console.print(
        f"cancelled {len(cancelled)} reach(es), told {view.get('in_flight', 0)} in flight",
        markup=False,
    )
    for task_id in cancelled:
        console.print(f"  {task_id}", markup=False)


@sessions_app.command("show")
def show(
    session_id: IdArgument,
    as_json: JsonOption = False,
    hub: HubOption = None,
    api_key: ApiKeyOption = None,
) -> None:
    """A session's state, TTL and reaches."""
    from reach.sdk.sessions import get_session

    _show(_run(lambda: get_session(session_id, hub=hub, api_key=api_key)), as_json)
