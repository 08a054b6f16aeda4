"""The ``reach`` command line: run the hub's processes and look at the fleet.

Commands fetch and print; the tables they print are built in `reach.cli.rendering`.
"""

from __future__ import annotations

import json
import os
import sys
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from reach.cli.approvals import approvals_app
from reach.cli.certs import certs_app
from reach.cli.columns import Output
from reach.cli.keys import keys_app
from reach.cli.listings import OutputOption, alerts_list, dag_list, print_agents, tasks_list
from reach.cli.options import ApiKeyOption, HubOption
from reach.cli.options import fail as _fail
from reach.cli.rendering import (
    allow_list_lines,
    approval_state_line,
    audit_tables,
    dag_table,
    dead_letters_table,
    events_table,
    task_lines,
)
from reach.cli.sessions import sessions_app
from reach.core.flow.priority import WORKER_QUEUES
from reach.core.security.trust import TrustLevel
from reach.errors import ConfigError, NoSuitableAgent, ReachError

if TYPE_CHECKING:
    from reach.hub.settings import Settings

FLEET_PAGE = 500  # agents per page `reach agents` asks for (it follows every page)

app = typer.Typer(help="Agent-Reach: the reach layer between AI agents.", no_args_is_help=True)
db_app = typer.Typer(help="Database schema.", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(keys_app, name="keys")
app.add_typer(certs_app, name="certs")
app.add_typer(approvals_app, name="approvals")
app.add_typer(sessions_app, name="sessions")
console = Console()
err_console = Console(stderr=True, soft_wrap=True)


ConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config",
        help="config.yaml to read (seed 000's keys work: probe.interval: 5s, storage.type: "
        "sqlite, storage.path ...); the same as REACH_CONFIG, also for the processes this "
        "command starts",
    ),
]


def _use_config(config: Path | None) -> None:
    """``--config PATH``: as ``REACH_CONFIG``, so the worker's app, beat's schedule and the
    processes ``reach up`` starts read the same file."""
    if config is not None:
        os.environ["REACH_CONFIG"] = str(config.expanduser().resolve())


def _settings() -> Settings:
    from reach.hub.settings import load_settings  # pydantic-settings: only where needed

    try:
        settings = load_settings()
    except ConfigError as exc:
        err_console.print(f"[red]configuration error:[/red] {exc}")
        raise typer.Exit(2) from None
    # Before prometheus_client is imported anywhere: every hub process writes its
    # counters into one directory, and /metrics merges them.
    metrics_dir = settings.storage.home_path / "metrics"
    metrics_dir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", str(metrics_dir))
    return settings


def _announce_semantic(ctx: Any) -> None:
    """Say at start-up whether semantic matching is on (``router.semantic: on`` without
    the extra stops here), and let its model-loading lines reach the API's log."""
    import logging

    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s:     %(message)s"))
    for name in ("reach.hub.fleet.matching", "reach.hub.fleet.embeddings"):
        logger = logging.getLogger(name)
        logger.setLevel(logging.INFO)
        logger.addHandler(handler)
    try:
        semantic = ctx.matcher.availability
    except ConfigError as exc:  # escaped: "[semantic]" is no markup
        err_console.print(f"[red]configuration error:[/red] {escape(str(exc))}")
        raise typer.Exit(2) from None
    log = logging.getLogger("reach.hub.fleet.matching")
    if semantic.on:
        log.info("semantic matching is on: %s", semantic.reason)
    else:
        log.info("semantic matching is off: %s", semantic.reason)


@app.command()
def up(
    port: Annotated[int | None, typer.Option(help="API port (default: server.port)")] = None,
    no_demo: Annotated[
        bool, typer.Option("--no-demo", help="Do not start the demo agents")
    ] = False,
    concurrency: Annotated[int, typer.Option(help="Worker concurrency")] = 2,
    demo_port: Annotated[int, typer.Option(help="First port of the demo agents")] = 7101,
    verbose: Annotated[
        bool,
        typer.Option(
            "--verbose", "-v", help="Stream every process's log here instead of <home>/logs/"
        ),
    ] = False,
    config: ConfigOption = None,
) -> None:
    """Run API, worker, beat (and demo agents) in one command: a short banner here, their
    logs in <home>/logs/ (.reach/logs/ unless REACH_HOME says otherwise)."""
    from reach.cli.supervisor import run_up

    _use_config(config)
    settings = _settings()
    raise typer.Exit(
        run_up(
            settings,
            port=port or settings.server.port,
            demo=not no_demo,
            concurrency=concurrency,
            demo_port=demo_port,
            verbose=verbose,
        )
    )


@app.command()
def api(
    port: Annotated[int | None, typer.Option(help="Port (default: server.port)")] = None,
    host: Annotated[str | None, typer.Option(help="Bind address (default: server.host)")] = None,
    reuse_port: Annotated[
        bool,
        typer.Option(
            "--reuse-port",
            help="Bind with SO_REUSEPORT: several `reach api` on one port share its "
            "connections (Linux; not with server.admin_port)",
        ),
    ] = False,
    config: ConfigOption = None,
) -> None:
    """Run the HTTP API."""
    _use_config(config)
    settings = _settings()  # first: it points prometheus_client at the shared directory
    import uvicorn

    from reach.hub.api import create_app
    from reach.hub.storage.engine import autovacuum_problem, database_revision_problem
    from reach.worker.context import HubContext

    url = settings.storage.resolved_database_url
    problem = database_revision_problem(url)
    if problem:
        err_console.print(f"[red]database not ready:[/red] {problem}")
        raise typer.Exit(2)
    _warn_upkeep(autovacuum_problem(url))
    ctx = HubContext.from_settings(settings)
    _announce_semantic(ctx)
    bind = host or settings.server.host
    from reach.core.security.auth import auth_required
    from reach.hub.api.edge import EdgeLimits
    from reach.hub.api.serve import serve_together, uvicorn_options

    limits = EdgeLimits.of(settings.server)  # header size, count and time; connections

    # resolved against the address actually bound: `--host 0.0.0.0` turns auth on
    require_auth = auth_required(settings.security.require_auth, bind)
    if not require_auth:
        err_console.print(f"auth is off: the API on {bind} takes requests without API keys")
    if reuse_port:
        if settings.server.admin_port is not None:
            err_console.print("[red]--reuse-port serves one port: server.admin_port is set[/red]")
            raise typer.Exit(2)
        from reach.hub.api.serve import reuse_port_socket, serve_on

        sock = reuse_port_socket(bind, port or settings.server.port)
        serve_on(create_app(ctx, require_auth=require_auth, bind_host=bind), sock, limits)
        return
    if settings.server.admin_port is None:
        uvicorn.run(
            create_app(ctx, require_auth=require_auth, bind_host=bind),
            host=bind,
            port=port or settings.server.port,
            **uvicorn_options(limits),
        )
        return
    from reach.hub.api.app import Surface

    serve_together(
        [
            (
                create_app(ctx, Surface.PUBLIC, require_auth=require_auth, bind_host=bind),
                bind,
                port or settings.server.port,
            ),
            (
                create_app(ctx, Surface.ADMIN, require_auth=require_auth, bind_host=bind),
                bind,
                settings.server.admin_port,
            ),
        ],
        limits,
    )


class WorkerPool(StrEnum):
    PREFORK = "prefork"
    THREADS = "threads"
    SOLO = "solo"


@app.command()
def worker(
    concurrency: Annotated[int, typer.Option(help="Worker processes (or threads)")] = 2,
    queues: Annotated[
        str, typer.Option(help="Queues to consume, preferred in this order (online first)")
    ] = ",".join(WORKER_QUEUES),
    loglevel: Annotated[str, typer.Option(help="Log level")] = "INFO",
    pool: Annotated[
        WorkerPool,
        typer.Option(
            help="prefork: a child process per slot; threads: many slots in one; solo: one"
        ),
    ] = WorkerPool.PREFORK,
    hostname: Annotated[
        str | None,
        typer.Option(
            "--hostname",
            "-n",
            help="Celery node name (e.g. w1@%h); each worker on one machine needs its own",
        ),
    ] = None,
    config: ConfigOption = None,
) -> None:
    """Run a Celery worker (delivery, probing, sweeps)."""
    _use_config(config)
    _settings()
    from reach.worker.app import app as celery_app

    argv = [
        "worker",
        f"--concurrency={concurrency}",
        f"--pool={pool.value}",
        "-Q",
        queues,
        f"--loglevel={loglevel}",
        # mingle (revoked-task sync between workers, a 1 s wait on every broker
        # (re)connection) and gossip (worker-to-worker events) serve nothing here: tasks
        # are never revoked, and Flower follows the workers through their events
        "--without-mingle",
        "--without-gossip",
    ]
    if hostname:
        argv.append(f"--hostname={hostname}")
    celery_app.worker_main(argv)


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,  # --help goes to the harness, which knows its options
)
def bench(ctx: typer.Context) -> None:
    """Run the benchmark table (same options as ``python -m bench``; try ``--quick``)."""
    # bench/ is a tool of the repository, never installed (the wheel holds only reach):
    # it runs from a checkout's top folder, as ``python -m bench`` would find it there
    here = str(Path.cwd())
    if (Path(here) / "bench" / "cli.py").is_file() and here not in sys.path:
        sys.path.insert(0, here)
    try:
        from bench.cli import main as bench_main
    except ImportError as exc:
        err_console.print(
            "[red]benchmarks run in a checkout of the repository, with the bench extra:"
            f"[/red] pip install -e '.[bench]', then reach bench in its top folder ({exc})"
        )
        raise typer.Exit(2) from None
    bench_main(list(ctx.args))


@app.command()
def beat(
    loglevel: Annotated[str, typer.Option(help="Log level")] = "INFO",
    config: ConfigOption = None,
) -> None:
    """Run Celery beat with the schedule in beat_schedule.py.

    Start as many as you like: one holds the beat lock in the hub's database and sends,
    the others stand by and take over when it dies (reach.worker.beat_lock).
    """
    from reach.hub.storage.engine import database_revision_problem

    _use_config(config)
    settings = _settings()
    problem = database_revision_problem(settings.storage.resolved_database_url)
    if problem:  # the lock lives in the database
        err_console.print(f"[red]database not ready:[/red] {problem}")
        raise typer.Exit(2)
    from reach.worker.factory import BEAT_SCHEDULER, create_celery

    beat_app = create_celery(settings, task_modules=())  # it sends by name
    beat_app.start(["beat", f"--loglevel={loglevel}", f"--scheduler={BEAT_SCHEDULER}"])


@app.command()
def flower(port: Annotated[int, typer.Option(help="Flower port")] = 5555) -> None:
    """Run Flower against the configured broker (Redis or RabbitMQ; see reach.cli.flower)."""
    from reach.cli.flower import flower_refusal

    settings = _settings()
    refusal = flower_refusal(settings.storage.resolved_broker_url)
    if refusal:  # on the embedded broker Flower would start and show an empty page
        err_console.print(refusal, markup=False, highlight=False)
        raise typer.Exit(2)
    from reach.worker.app import app as celery_app

    celery_app.start(["flower", f"--port={port}", "--address=127.0.0.1"])


agents_app = typer.Typer(
    help="The fleet: list agents (bare `reach agents`), set trust levels, allow-lists, "
    "queue bounds.",
    invoke_without_command=True,
)
app.add_typer(agents_app, name="agents")


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


tasks_app = typer.Typer(help="Tasks.", no_args_is_help=True)
dlq_app = typer.Typer(help="The dead-letter queue.", no_args_is_help=True)
app.add_typer(tasks_app, name="tasks")
app.add_typer(dlq_app, name="dlq")
tasks_app.command("list")(tasks_list)
app.command("alerts")(alerts_list)


@app.command()
def send(
    method: Annotated[
        str | None,
        typer.Argument(help="Method (capability type) to call; with --intent, may be left out"),
    ] = None,
    payload: Annotated[str, typer.Option(help="JSON object")] = "{}",
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


@app.command()
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


dag_app = typer.Typer(help="DAG runs.", no_args_is_help=True)
app.add_typer(dag_app, name="dag")
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


@db_app.command("upgrade")
def db_upgrade(revision: Annotated[str, typer.Argument(help="Target revision")] = "head") -> None:
    """Apply schema migrations (SQLite or PostgreSQL)."""
    from reach.hub.storage import upgrade_database

    settings = _settings()
    url = settings.storage.resolved_database_url
    upgrade_database(url, revision)
    console.print(f"database at {_redact(url)} upgraded to {revision}")
    from reach.hub.storage.engine import autovacuum_problem

    _warn_upkeep(autovacuum_problem(url))


def _warn_upkeep(problem: str | None) -> None:
    """A database that will slow the hub down as it runs: said at start, not refused
    (an operator may vacuum on a schedule of their own)."""
    if problem:
        err_console.print(f"[yellow]warning:[/yellow] {problem}", soft_wrap=True)


def _redact(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def main() -> None:
    try:
        app()
    except ConfigError as exc:
        err_console.print(f"[red]configuration error:[/red] {exc}")
        sys.exit(2)


__all__ = ["app", "main"]
