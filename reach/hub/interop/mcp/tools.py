"""The MCP tools of a scope, read from the registry (``reach.core.interop.mcp.serving.tools_of``
decides the names, schemas and descriptions)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from pydantic import TypeAdapter, ValidationError
from sqlalchemy import exists, select
from sqlalchemy.orm import Session

from reach.core.interop.mcp.serving import Scope, Tool, tools_of
from reach.core.ledger.statuses import InstanceStatus
from reach.errors import InvalidQuery, NoSuitableAgent, UnknownAgent
from reach.hub.gates import approvals
from reach.hub.storage.models import AgentCapabilityRow, AgentRow, AgentTagRow, InstanceRow
from reach.wire.schemas import AgentId, CapabilityType, Tag

SCOPE_STATE = "reach_mcp_scope"  # request.state: the endpoint's Scope
_AGENT = TypeAdapter(AgentId)
_TAG = TypeAdapter(Tag)
_CAPABILITY = TypeAdapter(CapabilityType)
_SCOPE_KEYS = frozenset({"agent", "tag", "capability"})


def scope_of(query: Mapping[str, list[str]]) -> Scope:
    """The endpoint's scope from its query (``?agent=ID``, ``?tag=T`` (repeatable: every
    tag), ``?capability=C``, combinable); `InvalidQuery` naming what is wrong."""
    unknown = sorted(set(query) - _SCOPE_KEYS)
    if unknown:
        raise InvalidQuery(
            f"unknown parameter {unknown[0]!r}: an MCP endpoint is scoped by agent, tag "
            "or capability",
            parameter=unknown[0],
        )
    for key in ("agent", "capability"):
        if len(query.get(key, ())) > 1:
            raise InvalidQuery(f"{key} given more than once", parameter=key)
    try:
        agents = [_AGENT.validate_python(v) for v in query.get("agent", ())]
        tags = tuple(sorted({_TAG.validate_python(v) for v in query.get("tag", ())}))
        capabilities = [_CAPABILITY.validate_python(v) for v in query.get("capability", ())]
    except ValidationError as exc:
        first = exc.errors()[0]
        raise InvalidQuery(f"bad scope: {first['msg']}", value=str(first["input"])) from None
    return Scope(next(iter(agents), None), tags, next(iter(capabilities), None))


def read_tools(session: Session, scope: Scope, policy: approvals.ApprovalPolicy) -> list[Tool]:
    """The tools of the agents in ``scope`` that have an instance not deregistered
    (an offline one included: routing decides at the call, as for any submit)."""
    live = exists().where(
        InstanceRow.agent_id == AgentRow.agent_id,
        InstanceRow.status != InstanceStatus.DEREGISTERED.value,
    )
    query = select(AgentRow.agent_id, AgentRow.tags, AgentRow.capabilities).where(live)
    if scope.agent_id:
        query = query.where(AgentRow.agent_id == scope.agent_id)
    if scope.capability:
        query = query.where(
            exists().where(
                AgentCapabilityRow.agent_id == AgentRow.agent_id,
                AgentCapabilityRow.capability == scope.capability,
            )
        )
    for tag in scope.tags:
        query = query.where(
            exists().where(AgentTagRow.agent_id == AgentRow.agent_id, AgentTagRow.tag == tag)
        )
    declarations: list[tuple[str, Mapping[str, Any]]] = []
    for agent_id, _tags, capabilities in session.execute(query.order_by(AgentRow.agent_id)):
        for decl in capabilities or ():
            if scope.capability and decl.get("type") != scope.capability:
                continue
            declarations.append((agent_id, decl))
    by_type: dict[str, list[Mapping[str, Any]]] = {}
    for _agent, decl in declarations:
        by_type.setdefault(str(decl.get("type")), []).append(decl)
    gated = [t for t, decls in by_type.items() if approvals.required(decls, t, t, policy)]
    return tools_of(declarations, gated)


def read_tool(
    session: Session, scope: Scope, name: str, policy: approvals.ApprovalPolicy
) -> Tool | None:
    """The tool ``name`` of ``scope``, or None. A call reads only the agents declaring the
    capability of that name (the index), not the whole scope; a mapped name (its type had
    ``:`` or ``/``) needs the scope's list."""
    if scope.capability in (None, name):
        narrowed = read_tools(session, replace(scope, capability=name), policy)
        found = next((t for t in narrowed if t.name == name), None)
        if found is not None:
            return found
    return next((t for t in read_tools(session, scope, policy) if t.name == name), None)


def check_scope(session: Session, scope: Scope) -> None:
    """404 for a scope that names what the registry does not hold: an unknown agent
    (``unknown-agent``), or a capability or tag no agent declares (``no-suitable-agent``);
    a typo is told, not served as an empty tool list."""
    if scope.agent_id and session.get(AgentRow, scope.agent_id) is None:
        raise UnknownAgent(f"agent {scope.agent_id!r} is not registered", agent_id=scope.agent_id)
    if scope.capability and not session.scalar(
        select(exists().where(AgentCapabilityRow.capability == scope.capability))
    ):
        raise NoSuitableAgent(f"no agent declares capability {scope.capability!r}")
    for tag in scope.tags:
        if not session.scalar(select(exists().where(AgentTagRow.tag == tag))):
            raise NoSuitableAgent(f"no agent carries tag {tag!r}")
