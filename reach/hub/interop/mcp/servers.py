"""MCP servers registered as agents, and the beat's re-reading of their tool lists.

``POST /api/v1/agents/mcp`` (``reach agents add-mcp URL``) checks the URL against the
network rule, asks the server for its tools (``reach.hub.interop.mcp.client``) and
registers an agent whose capabilities are those tools (``reach.core.interop.mcp.servers``),
with one instance reached over MCP (``instances.protocol = "mcp"``; what the hub read of
the server is kept in the instance's interop column, ``instances.a2a``). Nothing changes
in the MCP server.

An MCP server sends no heartbeats, so the hub reads its tool list again every
``mcp_agents.refresh_s`` (the instance's heartbeat interval): a good read stamps the
heartbeat with the hub's clock and applies the changed list under the squatting rule
(`reach.core.interop.mcp.servers.refresh_plan`: removed tools go, new ones another agent
owns at the same or a higher trust are held and raised as an alert); a failed read leaves
the instance to go offline after the usual missed intervals.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from pydantic import Field, ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from reach.core.fleet.endpoints import parse_endpoint, refusal
from reach.core.fleet.health import InstanceStatus
from reach.core.fleet.scoring import ProbeSample
from reach.core.interop.mcp import servers as rules
from reach.core.security.networks import NetworkRule
from reach.errors import (
    AddressRefused,
    InvalidMcpServer,
    LoopbackAddress,
    McpServerUnavailable,
    ReachError,
)
from reach.hub.fleet import registry
from reach.hub.fleet.probing import ProbeOutcome, ProbeTarget
from reach.hub.fleet.reachability import Policy
from reach.hub.interop.mcp.client import Listing, list_tools, ping
from reach.hub.security.networks import judge_host
from reach.hub.storage.models import AgentCapabilityRow, AgentRow, InstanceEventRow, InstanceRow
from reach.wire.schemas import AgentId, Capability, RegisterRequest, Tag, WireModel

log = logging.getLogger("reach.hub.interop.mcp")

PROTOCOL = rules.PROTOCOL
MCP_TAG = "mcp"  # every MCP agent carries it


class McpRegistration(WireModel):
    """``POST /api/v1/agents/mcp``: register the MCP server at ``url`` (its Streamable HTTP
    endpoint, e.g. ``https://tools.example.com/mcp``)."""

    url: str = Field(min_length=1, max_length=512)
    agent_id: AgentId | None = Field(None, description="default: from the server's name")
    tags: list[Tag] = Field(default_factory=list, max_length=63)
    allow_loopback: bool = False
    max_concurrency: int = Field(8, ge=1, le=100_000)


def instance_id_of(url: str) -> str:
    """One instance per server URL: registering the same URL again refreshes it."""
    return "mcp-" + hashlib.sha256(url.encode()).hexdigest()[:24]


def check_url(url: str, allow_loopback: bool, rule: NetworkRule) -> str:
    """The URL the hub will call (its path kept), if the network rule lets it: refused
    with `LoopbackAddress` / `AddressRefused` / `InvalidMcpServer` before anything is sent."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise InvalidMcpServer(f"MCP server URL {url!r} is not http(s)", field="url")
    if parts.query or parts.fragment or parts.username or parts.password:
        raise InvalidMcpServer(
            "an MCP server URL carries no query, fragment or credentials", field="url"
        )
    try:
        endpoint = parse_endpoint(url)
    except ValueError as exc:
        raise InvalidMcpServer(
            f"MCP server URL {url!r} is not usable: {exc}", field="url"
        ) from None
    refused = refusal(endpoint, None, allow_loopback)
    if refused is not None:
        raise refused.error()
    try:
        _addresses, why = judge_host(endpoint.host, endpoint.port, rule)
    except OSError as exc:
        raise McpServerUnavailable(
            f"the MCP server's host {endpoint.host!r} does not resolve ({type(exc).__name__})",
            url=url,
        ) from None
    if why == "a loopback address":
        raise LoopbackAddress(
            "the MCP server resolves to a loopback address: this hub calls loopback agents "
            "only as a local demo or with security.allow_loopback_agents",
            field="url",
        )
    if why is not None:
        raise AddressRefused(
            f"the MCP server resolves to {why} (security.agent_networks declares the private "
            "networks the hub calls)",
            field="url",
        )
    return endpoint.url


def read_tools(url: str, rule: NetworkRule, timeout: float) -> Listing:
    """`list_tools`, blocking (the API's threadpool, the beat's task)."""
    return asyncio.run(list_tools(url, rule, timeout))


def declarable(tools: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The capabilities of a tool list the hub accepts (``params_schema`` a JSON Schema it
    will validate with), and the tools left out, with why."""
    found, skipped = rules.capabilities_of(tools)
    kept: list[dict[str, Any]] = []
    for cap in found:
        try:
            kept.append(Capability.model_validate(cap).model_dump(exclude_none=True))
        except ValidationError as exc:
            skipped[cap["type"]] = str(exc.errors()[0]["msg"])
    return kept, skipped


@dataclass(frozen=True, slots=True)
class Registered:
    """What a registration (or a re-read) did: the agent's view and what it held back."""

    view: dict[str, Any]
    plan: rules.RefreshPlan | None = None


def register_server(
    session: Session,
    url: str,
    listing: Listing,
    *,
    agent_id: str | None,
    tags: Sequence[str],
    allow_loopback: bool,
    max_concurrency: int,
    now: float,
    policy: Policy,
    refresh_s: float,
    network: NetworkRule | None = None,
    refresh: bool = False,
) -> Registered:
    """Register (or refresh) the server's agent and its one MCP instance.

    An admin's registration declares every tool the hub accepts. A ``refresh`` (the beat,
    no admin involved) applies `rules.refresh_plan`: tools gone are removed, new ones
    another agent owns at the same or a higher trust are held (an ``mcp_tools_held`` alert
    once per change of what is held)."""
    caps, skipped = declarable(listing.tools)
    if not caps and not refresh:
        why = "; ".join(f"{name}: {reason}" for name, reason in skipped.items())
        raise InvalidMcpServer(
            f"the MCP server at {url} lists no tool the hub can declare"
            + (f" ({why})" if why else ""),
            url=url,
        )
    instance_id = instance_id_of(url)
    wanted = agent_id or rules.agent_id_of(listing.name)
    plan: rules.RefreshPlan | None = None
    if refresh:
        agent = session.get(AgentRow, wanted)
        registered = [c["type"] for c in agent.capabilities] if agent is not None else []
        trust = agent.trust_level if agent is not None else "L2"
        plan = rules.refresh_plan(
            registered, [c["type"] for c in caps], _owners(session, wanted, caps), trust
        )
        caps = [c for c in caps if c["type"] in set(plan.declared)]
    try:
        req = RegisterRequest(
            agent_id=wanted,
            instance_id=instance_id,
            addr=url,
            tags=sorted({*tags, MCP_TAG}),
            capabilities=caps,  # validated into Capability here
            metadata={"protocol": PROTOCOL},
            max_concurrency=max_concurrency,
            heartbeat_interval=refresh_s,
            allow_loopback=allow_loopback,
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise InvalidMcpServer(
            f"the MCP server does not make a valid registration ({where}: {first['msg']})",
            url=url,
        ) from None
    answer = registry.register(session, req, now, policy, network=network)
    row = session.get(InstanceRow, instance_id, with_for_update=True)
    assert row is not None
    held = dict(plan.held) if plan is not None else {}
    before = dict((row.a2a or {}).get("held") or {}) if row.protocol == PROTOCOL else {}
    row.protocol = PROTOCOL
    row.a2a = {
        "url": url,
        "name": listing.name,
        "tools": [c["type"] for c in caps],
        "skipped": skipped,
        "held": held,
        "read_at": now,
    }
    if held and held != before:
        session.add(
            InstanceEventRow(
                instance_id=instance_id,
                agent_id=wanted,
                kind="alert",
                detail={
                    "alert": "mcp_tools_held",
                    "reason": "the MCP server now lists tools other agents own: "
                    + ", ".join(f"{k} (owned by {v})" for k, v in sorted(held.items()))
                    + "; not declared until an admin registers the server again",
                    "held": held,
                },
                at=now,
            )
        )
    if not answer.created:
        row.heartbeat_count += 1  # a tool list read again: the heartbeat of an MCP instance
    session.flush()
    view = {
        **answer.model_dump(),
        "url": url,
        "tools": [c["type"] for c in caps],
        "skipped": skipped,
        "held": held,
    }
    return Registered(view, plan)


def _owners(
    session: Session, agent_id: str, caps: Sequence[dict[str, Any]]
) -> dict[str, list[tuple[str, str]]]:
    """For each listed capability type, the other agents declaring it and their trust: an
    agent counts while it has an instance not deregistered (one that is offline for now
    still owns what it declared: an outage is no opening)."""
    types = [c["type"] for c in caps]
    if not types:
        return {}
    present = (
        select(InstanceRow.instance_id)
        .where(
            InstanceRow.agent_id == AgentRow.agent_id,
            InstanceRow.status != InstanceStatus.DEREGISTERED.value,
        )
        .exists()
    )
    rows = session.execute(
        select(AgentCapabilityRow.capability, AgentRow.agent_id, AgentRow.trust_level)
        .join(AgentRow, AgentRow.agent_id == AgentCapabilityRow.agent_id)
        .where(AgentCapabilityRow.capability.in_(types), AgentRow.agent_id != agent_id, present)
    ).all()
    owners: dict[str, list[tuple[str, str]]] = {}
    for kind, owner, trust in rows:
        owners.setdefault(kind, []).append((owner, trust))
    return owners


@dataclass(frozen=True, slots=True)
class Due:
    """An MCP instance whose tool list the beat reads again."""

    instance_id: str
    agent_id: str
    url: str
    allow_loopback: bool
    max_concurrency: int


def due_refreshes(session: Session) -> list[Due]:
    """Every MCP instance not deregistered."""
    rows = session.scalars(
        select(InstanceRow).where(
            InstanceRow.protocol == PROTOCOL,
            InstanceRow.status != InstanceStatus.DEREGISTERED.value,
        )
    ).all()
    return [
        Due(r.instance_id, r.agent_id, r.endpoint, r.allow_loopback, r.max_concurrency)
        for r in rows
    ]


def refresh_one(
    db: sessionmaker[Session],
    item: Due,
    now: Callable[[], float],
    policy: Policy,
    refresh_s: float,
    timeout: float,
) -> bool:
    """Read one server's tools again: a good read re-registers (the heartbeat, and the
    changes the squatting rule lets through); a failed one is recorded once, until the
    list reads again."""
    try:
        listing = read_tools(item.url, policy.network, timeout)
        with db.begin() as session:
            agent = session.get(AgentRow, item.agent_id)
            tags = [t for t in (agent.tags if agent is not None else []) if t != MCP_TAG]
            register_server(
                session,
                item.url,
                listing,
                agent_id=item.agent_id,
                tags=tags,
                allow_loopback=item.allow_loopback,
                max_concurrency=item.max_concurrency,
                now=now(),
                policy=policy,
                refresh_s=refresh_s,
                refresh=True,
            )
        return True
    except ReachError as exc:
        with db.begin() as session:
            row = session.get(InstanceRow, item.instance_id, with_for_update=True)
            if row is not None and (row.a2a or {}).get("read_error") != exc.detail:
                row.a2a = {**(row.a2a or {}), "read_error": exc.detail}
                session.add(
                    InstanceEventRow(
                        instance_id=item.instance_id,
                        agent_id=item.agent_id,
                        kind="alert",
                        detail={"alert": "mcp_tools_unreadable", "reason": exc.detail},
                        at=now(),
                    )
                )
        log.warning(
            "MCP tools of %s/%s not refreshed: %s", item.agent_id, item.instance_id, exc.detail
        )
        return False


def probe(
    target: ProbeTarget,
    timeout: float,
    now: Callable[[], float],
    rule: NetworkRule | None,
    handshake: float,
) -> ProbeOutcome:
    """The probe of an MCP server: ``initialize`` (within ``handshake``, the
    ``mcp_agents.timeout_s``) and ``ping`` (within the probe's ``timeout``; its round trip
    is the RTT). It runs on a probe thread, as any probe: never on a delivery's loop."""
    at = now()
    rtt_ms, error = asyncio.run(ping(target.url, rule, timeout, handshake))
    return ProbeOutcome(
        target.instance_id, ProbeSample(ok=error is None, rtt_ms=rtt_ms, at=at), error
    )
