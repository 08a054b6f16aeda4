"""``reach keys``: API keys and the hub's signing keys, managed on the hub host.

These commands work on the store the settings name, like ``reach db upgrade``, not
through the API: whoever holds the hub's database already holds every key, and the first
admin key has to come from somewhere. A secret is printed once, by ``create``, on the
last line of stdout (``--json``: one object with ``secret``); nothing else ever shows it.

Exit codes: 0 done, 2 bad input (or a store that is not ready), 1 refused (an unknown key).
"""

from __future__ import annotations

import getpass
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.table import Table

from reach.core.security.auth import Scope, parse_secret
from reach.errors import ConfigError, ReachError

if TYPE_CHECKING:  # the store is opened by the commands that need it, not at start-up
    from sqlalchemy.orm import Session

keys_app = typer.Typer(
    help="API keys and the hub's signing keys (run on the hub host).", no_args_is_help=True
)
console = Console()
err_console = Console(stderr=True, soft_wrap=True)

BAD_INPUT = 2
REFUSED = 1
DAY_S = 86_400.0
_KEY_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789")


def _die(message: str, code: int) -> NoReturn:
    err_console.print(message, markup=False, highlight=False)
    raise typer.Exit(code)


def _actor() -> str:
    """Who the audit log names for a change made here: the operator's login on this host."""
    try:
        return f"cli:{getpass.getuser()}"
    except Exception:  # no login name (a container without a passwd entry)
        return "cli"


@contextmanager
def _store() -> Iterator[Session]:
    """One transaction on the hub's store; refuses (exit 2) a store that is not migrated."""
    from reach.hub.settings import load_settings
    from reach.hub.storage import create_engine_for, session_factory
    from reach.hub.storage.engine import database_revision_problem

    try:
        settings = load_settings()
    except ConfigError as exc:
        _die(f"configuration error: {exc}", BAD_INPUT)
    url = settings.storage.resolved_database_url
    problem = database_revision_problem(url)
    if problem:
        _die(f"database not ready: {problem}", BAD_INPUT)
    engine = create_engine_for(url)
    try:
        with session_factory(engine).begin() as session:
            yield session
    finally:
        engine.dispose()


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


@keys_app.command("create")
def create(
    scope: Annotated[
        Scope,
        typer.Option(
            "--scope",
            case_sensitive=False,
            help="admin, caller, agent, viewer (read-only) or approver (decides approvals)",
        ),
    ],
    agent_id: Annotated[
        str | None,
        typer.Option(
            "--agent-id", help="The agent ID (or glob, e.g. 'doc-*') an agent key speaks for"
        ),
    ] = None,
    name: Annotated[str, typer.Option("--name", help="A label, e.g. who holds the key")] = "",
    expires_in: Annotated[
        float | None, typer.Option("--expires-in", help="Days until the key expires")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object")] = False,
    capability: Annotated[
        list[str] | None,
        typer.Option(
            "--capability",
            help="An agent key's agents may declare only capabilities matching these "
            "patterns (repeat; none given: any)",
        ),
    ] = None,
    tag: Annotated[
        list[str] | None,
        typer.Option(
            "--tag", help="...and only tags matching these patterns (repeat; none given: any)"
        ),
    ] = None,
) -> None:
    """Create an API key; its secret is printed once, on the last line."""
    from reach.hub.security import apikeys, audit

    if scope is Scope.AGENT and not (agent_id or "").strip():
        _die("--scope agent needs --agent-id (an agent ID or a glob such as 'doc-*')", BAD_INPUT)
    if scope is not Scope.AGENT and agent_id is not None:
        _die(f"--agent-id is only for --scope agent, not {scope.value}", BAD_INPUT)
    if expires_in is not None and not expires_in > 0:
        _die("--expires-in must be a positive number of days", BAD_INPUT)
    if scope is not Scope.AGENT and (capability or tag):
        _die("--capability and --tag are only for --scope agent", BAD_INPUT)
    now = time.time()
    try:
        with _store() as session:
            key = apikeys.create_key(
                session,
                scope=scope,
                agent_pattern=agent_id,
                name=name,
                expires_in_s=expires_in * DAY_S if expires_in is not None else None,
                now=now,
                allowed_capabilities=sorted(set(capability)) if capability else None,
                allowed_tags=sorted(set(tag)) if tag else None,
            )
            audit.record(
                session,
                actor=_actor(),
                action="key.create",
                outcome=audit.ALLOWED,
                now=now,
                target=f"key:{key.key_id}",
                detail={
                    "scope": key.scope.value,
                    "agent_pattern": key.agent_pattern,
                    "allowed_capabilities": capability or None,
                    "allowed_tags": tag or None,
                },
            )
    except ValueError as exc:  # a combination create_key refuses (too long a name ...)
        _die(str(exc), BAD_INPUT)
    except ReachError as exc:
        _die(f"{type(exc).__name__}: {exc}", REFUSED)
    view = {
        "key_id": key.key_id,
        "name": key.name,
        "scope": key.scope.value,
        "agent_pattern": key.agent_pattern,
        "created_at": now,
        "expires_at": key.expires_at,
    }
    if as_json:
        print(json.dumps({**view, "secret": key.secret}))
        return
    agent = f", for agent {key.agent_pattern}" if key.agent_pattern else ""
    print(f"created {key.scope.value} key {key.key_id}{agent}, expires {_when(key.expires_at)}")
    print("its secret follows, shown this once (the hub keeps only a hash):")
    print(key.secret)


@keys_app.command("list")
def list_(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
) -> None:
    """List API keys (never their secrets)."""
    from reach.hub.security import apikeys

    with _store() as session:
        views = apikeys.list_keys(session, time.time())
    if as_json:
        print(json.dumps({"keys": views}, indent=2))
        return
    console.print(keys_table(views))


def keys_table(views: list[dict[str, Any]]) -> Table:
    table = Table(title="API keys")
    columns = ("key id", "name", "scope", "agent", "may declare", "created", "expires", "state")
    for column in columns:
        table.add_column(column)
    style = {"active": "green", "expired": "yellow", "revoked": "bright_black"}
    for v in views:
        table.add_row(
            v["key_id"],
            v["name"] or "-",
            v["scope"],
            v["agent_pattern"] or "-",
            _declarable(v),
            _when(v["created_at"]),
            _when(v["expires_at"]),
            f"[{style.get(v['state'], 'white')}]{v['state']}[/]",
        )
    return table


def _declarable(view: dict[str, Any]) -> str:
    """An agent key's allow-lists as the table shows them ("-": not an agent key)."""
    if view["scope"] != Scope.AGENT.value:
        return "-"
    caps, tags = view.get("allowed_capabilities"), view.get("allowed_tags")
    if caps is None and tags is None:
        return "anything"
    return f"caps {','.join(caps) if caps is not None else '*'}; " + (
        f"tags {','.join(tags) if tags is not None else '*'}"
    )


@keys_app.command("allow")
def allow(
    key_id: Annotated[str, typer.Argument(help="The agent key's id (see `reach keys list`)")],
    capability: Annotated[
        list[str] | None,
        typer.Option("--capability", help="Capability patterns its agents may declare"),
    ] = None,
    tag: Annotated[
        list[str] | None, typer.Option("--tag", help="Tag patterns its agents may declare")
    ] = None,
    clear: Annotated[
        bool, typer.Option("--any", help="Lift both lists: its agents may declare anything")
    ] = False,
) -> None:
    """Set what an agent key's agents may declare (the lists given replace the old ones;
    a registration beyond them is refused with 403 until an admin allows it here)."""
    from reach.hub.security import apikeys, audit

    if not (capability or tag or clear):
        _die("give --capability and/or --tag patterns, or --any", BAD_INPUT)
    caps = ["*"] if clear else (sorted(set(capability)) if capability else None)
    tags = ["*"] if clear else (sorted(set(tag)) if tag else None)
    now = time.time()
    try:
        with _store() as session:
            view = apikeys.set_allowed(
                session, key_id.strip(), capabilities=caps, tags=tags, now=now
            )
            audit.record(
                session,
                actor=_actor(),
                action="key.allow",
                outcome=audit.ALLOWED,
                now=now,
                target=f"key:{key_id.strip()}",
                detail={"allowed_capabilities": caps, "allowed_tags": tags},
            )
    except ValueError as exc:
        _die(str(exc), BAD_INPUT)
    except ReachError as exc:  # UnknownKey
        _die(f"{type(exc).__name__}: {exc}", REFUSED)
    print(
        f"key {view['key_id']} may declare capabilities "
        f"{view['allowed_capabilities'] or 'any'} and tags {view['allowed_tags'] or 'any'}"
    )


@keys_app.command("revoke")
def revoke(
    key_id: Annotated[str, typer.Argument(help="The key's id (see `reach keys list`)")],
) -> None:
    """Revoke an API key; the hub refuses it from the next request on."""
    from reach.hub.security import apikeys, audit

    key_id = key_id.strip()
    from_secret = parse_secret(key_id)
    if from_secret is not None:  # a pasted secret: never echo it, revoke the key it names
        err_console.print(f"that is a key's secret; revoking the key it names, {from_secret}")
        key_id = from_secret
    if not 12 <= len(key_id) <= 32 or not set(key_id) <= _KEY_ID_CHARS:
        _die("not a key id: expected 12 to 32 lowercase letters and digits", BAD_INPUT)
    now = time.time()
    try:
        with _store() as session:
            view = apikeys.revoke_key(session, key_id, now)
            audit.record(
                session,
                actor=_actor(),
                action="key.revoke",
                outcome=audit.ALLOWED,
                now=now,
                target=f"key:{key_id}",
            )
    except ReachError as exc:  # UnknownKey
        _die(f"{type(exc).__name__}: {exc}", REFUSED)
    if view["revoked_at"] is not None and view["revoked_at"] < now:
        print(f"key {key_id} was already revoked at {_when(view['revoked_at'])}")
    else:
        print(f"revoked key {key_id}")


@keys_app.command("rotate-signing")
def rotate_signing(
    immediate: Annotated[
        bool,
        typer.Option(
            "--now",
            help="Sign with the new key at once (default: after the rotation grace, so "
            "agents fetch it first)",
        ),
    ] = False,
) -> None:
    """Publish a new key for reach tokens; the old one stays published until its tokens end."""
    from reach.hub.security import audit, signing
    from reach.hub.security.sealing import SealKey
    from reach.hub.settings import load_settings

    try:
        settings = load_settings()
        configured = settings.security.seal_key
        seal = SealKey.load(
            configured.get_secret_value() if configured is not None else None,
            settings.storage.home_path,
        )
    except ConfigError as exc:
        _die(f"configuration error: {exc}", BAD_INPUT)
    grace = settings.security.signing_rotation_grace_s
    now = time.time()
    with _store() as session:
        view = signing.rotate(session, now, grace, immediate=immediate, seal=seal)
        audit.record(
            session,
            actor=_actor(),
            action="signing.rotate",
            outcome=audit.ALLOWED,
            now=now,
            target=f"kid:{view['kid']}",
            detail={"not_before": view["not_before"], "immediate": immediate},
        )
    starts = view["not_before"]
    when = "now" if starts <= now else f"{_when(starts)} (in {starts - now:.0f}s)"
    print(f"new signing key {view['kid']} published; it signs reach tokens from {when}")


__all__ = ["keys_app"]
