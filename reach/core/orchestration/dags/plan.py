"""The plan: a DAG grouped into topological levels, Celery-free.

An exact series-parallel decomposition of a DAG does not always exist (the "N"
shape a->c, b->c, b->d has none), so `compile_plan` uses one well-defined scheme for every
shape: nodes are grouped by topological *level* (the longest path from a root, in nodes),
and the plan is ``Seq(level 0, level 1, ...)`` where a level of several nodes is a ``Par``.
The Celery layer compiles it to ``chain(group(...), group(...), ...)`` (a group followed by
a group becomes a chord). Nodes of one level run in parallel, so diamonds, several roots
and several sinks keep their parallelism. The cost: a node waits for its whole previous
level, not only its own dependencies (`Plan.extra_waits` lists the nodes it waits for
without needing them), and the run takes `Plan.critical_path_levels` sequential stages. A
chord body receives only the previous level's return values, so node tasks must read their
ancestors' results from the run state, not from the chord's arguments; they still check
their own dependencies' results through `decide`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeAlias

from reach.core.orchestration.dags.model import DagSpec
from reach.core.orchestration.dags.validation import ancestors, topological, validate
from reach.errors import DagError

__all__ = ["Node", "Par", "Plan", "Seq", "Step", "compile_plan"]


@dataclass(frozen=True, slots=True)
class Node:
    """Run one DAG node (a single Celery signature)."""

    id: str

    def __str__(self) -> str:
        return self.id


@dataclass(frozen=True, slots=True)
class Par:
    """Run the branches in parallel (a Celery group)."""

    branches: tuple[Step, ...]

    def __str__(self) -> str:
        return "(" + " | ".join(str(b) for b in self.branches) + ")"


@dataclass(frozen=True, slots=True)
class Seq:
    """Run the steps one after another (a Celery chain; group then group is a chord)."""

    steps: tuple[Step, ...]

    def __str__(self) -> str:
        return " -> ".join(str(s) for s in self.steps)


Step: TypeAlias = Node | Par | Seq


@dataclass(frozen=True)
class Plan:
    """The canvas of a DAG, Celery-free: ``root`` is ``Seq`` of one step per level.

    A level of one node is a `Node`, a level of several is a `Par` of `Node` steps, in
    declaration order.
    """

    spec: DagSpec
    root: Seq
    levels: tuple[tuple[str, ...], ...]
    upstream: Mapping[str, frozenset[str]]

    @property
    def critical_path_levels(self) -> int:
        """Sequential stages of the run: the longest dependency path, counted in nodes."""
        return len(self.levels)

    @property
    def order(self) -> tuple[str, ...]:
        """Every node id, level by level (a topological order)."""
        return tuple(node_id for level in self.levels for node_id in level)

    def level_of(self, node_id: str) -> int:
        for index, level in enumerate(self.levels):
            if node_id in level:
                return index
        raise DagError(f"DAG {self.spec.name!r} has no node {node_id!r}", node=node_id)

    def extra_waits(self, node_id: str) -> tuple[str, ...]:
        """Nodes this node waits for only because of the level scheme (not its ancestors)."""
        level = self.level_of(node_id)
        return tuple(
            other
            for earlier in self.levels[:level]
            for other in earlier
            if other not in self.upstream[node_id]
        )


def compile_plan(spec: DagSpec) -> Plan:
    """Validate ``spec`` (targets unchecked) and group its nodes into topological levels."""
    validate(spec)
    by_id = {node.id: node for node in spec.nodes}
    depth: dict[str, int] = {}
    for node_id in topological(spec):
        deps = by_id[node_id].dependencies
        depth[node_id] = 1 + max(depth[dep] for dep in deps) if deps else 0
    count = max(depth.values()) + 1
    levels = tuple(
        tuple(node.id for node in spec.nodes if depth[node.id] == level) for level in range(count)
    )
    steps = tuple(
        Node(ids[0]) if len(ids) == 1 else Par(tuple(Node(i) for i in ids)) for ids in levels
    )
    return Plan(spec=spec, root=Seq(steps), levels=levels, upstream=ancestors(spec))
