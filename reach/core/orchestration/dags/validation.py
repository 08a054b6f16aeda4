"""Whether a DAG can run: ids, targets, dependencies, the cycle with its path, references.

Every error is a `DagError` naming its node (``extra["node"]``); a cycle is named in flow
order, upstream first (``extra["cycle"]``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

from pydantic import TypeAdapter, ValidationError

from reach.core.orchestration.dags.conditions import RESERVED_WORDS, parse_condition, referenced
from reach.core.orchestration.dags.inputs import NodeSource, parse_source, sources_in
from reach.core.orchestration.dags.model import DagSpec, NodeSpec
from reach.errors import DagError
from reach.wire.schemas import AgentId, CapabilityType, Method, Tag

__all__ = ["ancestors", "topological", "validate"]

_NODE_ID_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,127}")

_AGENT_ID: TypeAdapter[str] = TypeAdapter(AgentId)
_TAG: TypeAdapter[str] = TypeAdapter(Tag)
_CAPABILITY: TypeAdapter[str] = TypeAdapter(CapabilityType)
_METHOD: TypeAdapter[str] = TypeAdapter(Method)


def _fits(adapter: TypeAdapter[str], value: str) -> bool:
    try:
        adapter.validate_python(value)
    except ValidationError:
        return False
    return True


def validate(spec: DagSpec, target_exists: Callable[[NodeSpec], bool] | None = None) -> None:
    """Raise a `DagError` naming the node (``extra["node"]``) if the DAG cannot run.

    Checks: empty DAG, node ids (pattern, reserved words, duplicates), targets and method
    names, dependencies (unknown, self, twice), cycles (the path is named), conditions
    (syntax, unknown or non-upstream nodes), inputs (syntax, unknown or non-upstream nodes,
    clash with the static payload) and, given ``target_exists``, unknown targets.
    """
    if not spec.nodes:
        raise DagError(f"DAG {spec.name!r} has no nodes")
    by_id: dict[str, NodeSpec] = {}
    for node in spec.nodes:
        _check_id(node)
        if node.id in by_id:
            raise DagError(f"node {node.id!r} is declared twice", node=node.id)
        by_id[node.id] = node
    for node in spec.nodes:
        _check_target(node)
        _check_dependencies(node, by_id)
    cycle = _find_cycle(spec)
    if cycle is not None:
        raise DagError(f"dependency cycle: {' -> '.join(cycle)}", node=cycle[0], cycle=cycle)
    upstream = ancestors(spec)
    for node in spec.nodes:
        _check_condition(node, by_id, upstream[node.id])
        _check_inputs(node, by_id, upstream[node.id])
    if target_exists is not None:
        for node in spec.nodes:
            if not target_exists(node):
                raise DagError(
                    f"node {node.id!r}: unknown target ({node.describe_target()})", node=node.id
                )


def _check_id(node: NodeSpec) -> None:
    if not _NODE_ID_RE.fullmatch(node.id):
        raise DagError(
            f"node id {node.id!r} is invalid: use letters, digits, '_' and '-', "
            "starting with a letter or '_' (at most 128 characters)",
            node=node.id,
        )
    if node.id in RESERVED_WORDS:
        raise DagError(f"node id {node.id!r} is a reserved word", node=node.id)


def _check_target(node: NodeSpec) -> None:
    if node.agent_id is None and not node.tags and node.capability is None:
        raise DagError(
            f"node {node.id!r} has no target: name an agent_id, tags or a capability",
            node=node.id,
        )
    if node.agent_id is not None and not _fits(_AGENT_ID, node.agent_id):
        raise DagError(f"node {node.id!r}: agent_id {node.agent_id!r} is invalid", node=node.id)
    for tag in node.tags:
        if not _fits(_TAG, tag):
            raise DagError(f"node {node.id!r}: tag {tag!r} is invalid", node=node.id)
    if node.capability is not None and not _fits(_CAPABILITY, node.capability):
        raise DagError(f"node {node.id!r}: capability {node.capability!r} is invalid", node=node.id)
    if not _fits(_METHOD, node.method):
        raise DagError(
            f"node {node.id!r}: method {node.method!r} is not a valid method name", node=node.id
        )


def _check_dependencies(node: NodeSpec, by_id: Mapping[str, NodeSpec]) -> None:
    seen: set[str] = set()
    for dep in node.dependencies:
        if dep == node.id:
            raise DagError(f"node {node.id!r} depends on itself", node=node.id)
        if dep not in by_id:
            raise DagError(f"node {node.id!r} depends on unknown node {dep!r}", node=node.id)
        if dep in seen:
            raise DagError(f"node {node.id!r} lists dependency {dep!r} twice", node=node.id)
        seen.add(dep)


def _find_cycle(spec: DagSpec) -> list[str] | None:
    """A dependency cycle in flow order (upstream first), starting at its first-declared node."""
    by_id = {node.id: node for node in spec.nodes}
    order = {node.id: index for index, node in enumerate(spec.nodes)}
    white, grey, black = 0, 1, 2
    colour = dict.fromkeys(by_id, white)
    for start in by_id:
        if colour[start] != white:
            continue
        colour[start] = grey
        path = [start]
        stack = [iter(by_id[start].dependencies)]
        while stack:
            dep = next(stack[-1], None)
            if dep is None:
                colour[path.pop()] = black
                stack.pop()
            elif colour[dep] == grey:
                # `path` follows "depends on" edges; the flow runs the other way.
                members = list(reversed(path[path.index(dep) :]))
                first = min(range(len(members)), key=lambda i: order[members[i]])
                members = members[first:] + members[:first]
                return [*members, members[0]]
            elif colour[dep] == white:
                colour[dep] = grey
                path.append(dep)
                stack.append(iter(by_id[dep].dependencies))
    return None


def _check_condition(
    node: NodeSpec, by_id: Mapping[str, NodeSpec], upstream: frozenset[str]
) -> None:
    if node.condition is None:
        return
    try:
        cond = parse_condition(node.condition)
    except DagError as exc:
        raise DagError(f"node {node.id!r}: {exc.detail}", node=node.id) from None
    for ref in sorted(referenced(cond)):
        if ref not in by_id:
            raise DagError(
                f"node {node.id!r}: condition refers to unknown node {ref!r}", node=node.id
            )
        if ref not in upstream:
            raise DagError(
                f"node {node.id!r}: condition refers to {ref!r}, which is not upstream of "
                f"{node.id!r} (add it to dependencies, directly or transitively)",
                node=node.id,
            )


def _check_inputs(node: NodeSpec, by_id: Mapping[str, NodeSpec], upstream: frozenset[str]) -> None:
    for key, value in node.inputs.items():
        if not key:
            raise DagError(f"node {node.id!r}: an input key is empty", node=node.id)
        if key in node.payload:
            raise DagError(
                f"node {node.id!r}: input {key!r} is also a static payload key", node=node.id
            )
        for text in sources_in(value):
            try:
                source = parse_source(text)
            except ValueError as exc:
                raise DagError(f"node {node.id!r}: input {key!r}: {exc}", node=node.id) from None
            if isinstance(source, NodeSource):
                if source.node not in by_id:
                    raise DagError(
                        f"node {node.id!r}: input {key!r} refers to unknown node {source.node!r}",
                        node=node.id,
                    )
                if source.node not in upstream:
                    raise DagError(
                        f"node {node.id!r}: input {key!r} refers to {source.node!r}, which is "
                        f"not upstream of {node.id!r}",
                        node=node.id,
                    )


# --- graph -----------------------------------------------------------------------------------


def topological(spec: DagSpec) -> list[str]:
    """Kahn's order, ties broken by declaration order; the spec must be acyclic."""
    pending = {node.id: len(node.dependencies) for node in spec.nodes}
    dependents: dict[str, list[str]] = {node.id: [] for node in spec.nodes}
    for node in spec.nodes:
        for dep in node.dependencies:
            dependents[dep].append(node.id)
    ready = [node.id for node in spec.nodes if not node.dependencies]
    order: list[str] = []
    while ready:
        current = ready.pop(0)
        order.append(current)
        for child in dependents[current]:
            pending[child] -= 1
            if pending[child] == 0:
                ready.append(child)
    if len(order) != len(spec.nodes):
        raise DagError(f"DAG {spec.name!r} has a dependency cycle")
    return order


def ancestors(spec: DagSpec) -> dict[str, frozenset[str]]:
    """Every node's transitive upstream nodes (the spec must be acyclic)."""
    by_id = {node.id: node for node in spec.nodes}
    result: dict[str, frozenset[str]] = {}
    for node_id in topological(spec):
        found: set[str] = set()
        for dep in by_id[node_id].dependencies:
            found.add(dep)
            found |= result[dep]
        result[node_id] = frozenset(found)
    return result
