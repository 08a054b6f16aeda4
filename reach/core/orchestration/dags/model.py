"""The DAG as data: node and DAG specs, a node's result and the run/skip decision.

Types are checked when a model is built; names, targets and references are checked by
`reach.core.orchestration.dags.validate`, so each such error names its node.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from reach.core.ledger.statuses import NodeStatus
from reach.errors import DagError
from reach.wire.schemas import MetadataValue

__all__ = [
    "DEFAULT_TIMEOUT_MS",
    "MAX_TIMEOUT_MS",
    "DagSpec",
    "Decision",
    "NodeResult",
    "NodeSpec",
    "NodeStatus",
    "lookup",
]

DEFAULT_TIMEOUT_MS = 30_000
MAX_TIMEOUT_MS = 3_600_000


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NodeSpec(_Model):
    """One node of a DAG: whom to reach, with what, after what, and under which condition.

    Types are checked when the model is built; names, targets and references are checked
    by `validate`, so every such error names its node.
    """

    id: str
    description: str = ""
    agent_id: str | None = None
    tags: tuple[str, ...] = ()
    capability: str | None = None
    rules: dict[str, MetadataValue] = Field(default_factory=dict)
    method: str
    timeout_ms: int = Field(DEFAULT_TIMEOUT_MS, ge=1, le=MAX_TIMEOUT_MS, strict=True)
    dependencies: tuple[str, ...] = ()
    condition: str | None = None
    inputs: dict[str, Any] = Field(default_factory=dict)
    payload: dict[str, Any] = Field(default_factory=dict)

    def describe_target(self) -> str:
        """The target in words, e.g. ``capability 'sales.fetch'``."""
        parts: list[str] = []
        if self.agent_id is not None:
            parts.append(f"agent {self.agent_id!r}")
        if self.tags:
            parts.append(f"tags {list(self.tags)!r}")
        if self.capability is not None:
            parts.append(f"capability {self.capability!r}")
        return ", ".join(parts) or "no target"


class DagSpec(_Model):
    """A whole DAG as declared; `validate` it before use (`load_dag` and `parse_dag` do)."""

    name: str = Field(min_length=1, max_length=128)
    description: str = ""
    nodes: tuple[NodeSpec, ...]

    def node(self, node_id: str) -> NodeSpec:
        """The node with this id (a `DagError` if there is none)."""
        for node in self.nodes:
            if node.id == node_id:
                return node
        raise DagError(f"DAG {self.name!r} has no node {node_id!r}", node=node_id)


class NodeResult(_Model):
    """What a node task returns (and the run state stores); never raised into a chord."""

    status: NodeStatus
    data: Any = None
    error: dict[str, Any] | None = None
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Decision:
    """Whether a node runs, and why (the reason is shown to the user when it is skipped)."""

    run: bool
    reason: str


def lookup(value: Any, path: tuple[str, ...]) -> tuple[bool, Any]:
    """Follow a dotted path; (False, None) when a step does not exist.

    The one path rule for conditions and inputs: a segment of digits indexes a list.
    """
    current = value
    for segment in path:
        if isinstance(current, Mapping):
            if segment not in current:
                return False, None
            current = current[segment]
        elif isinstance(current, list | tuple) and re.fullmatch(r"[0-9]+", segment):
            index = int(segment)
            if index >= len(current):
                return False, None
            current = current[index]
        else:
            return False, None
    return True, current
