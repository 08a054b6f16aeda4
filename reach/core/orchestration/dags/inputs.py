"""A node's payload: its static ``payload`` plus its ``inputs`` resolved.

``inputs`` maps payload keys to sources:

- ``"$input"`` / ``"$input.a.b"``: the run's input, or a dotted path into it;
- ``"$nodes.<id>.data[.path]"``, ``"$nodes.<id>.error[.path]"``, ``"$nodes.<id>.status"``,
  ``"$nodes.<id>.reason"``: an upstream (transitive ancestor) node's result;
- any other value is a literal; lists and objects are resolved item by item, so sources may
  be nested (``{"ctx": {"rows": "$nodes.fetch.data.rows"}}``); ``"$$x"`` is the literal
  string ``"$x"``, and any other string starting with ``$`` is an error.

Path segments are split on ``.``; a segment of digits indexes a list. An input key may not
also appear in the static ``payload``. A missing path is a `DagError` naming node and path.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from reach.core.orchestration.dags.model import NodeResult, NodeSpec, lookup
from reach.errors import DagError

__all__ = ["InputSource", "NodeSource", "build_payload", "parse_source", "sources_in"]


@dataclass(frozen=True, slots=True)
class InputSource:
    """``$input[.path]``: the run's input."""

    path: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class NodeSource:
    """``$nodes.<id>.<field>[.path]``: an upstream node's result."""

    node: str
    field: Literal["data", "error", "status", "reason"]
    path: tuple[str, ...]


def sources_in(value: Any) -> list[str]:
    """Every source expression (a string starting with a single ``$``) inside a value."""
    if isinstance(value, str):
        return [value] if value.startswith("$") and not value.startswith("$$") else []
    if isinstance(value, Mapping):
        return [text for item in value.values() for text in sources_in(item)]
    if isinstance(value, list | tuple):
        return [text for item in value for text in sources_in(item)]
    return []


def parse_source(text: str) -> InputSource | NodeSource:
    parts = text[1:].split(".")
    if any(not part for part in parts):
        raise ValueError(f"source {text!r} has an empty path segment")
    head, rest = parts[0], tuple(parts[1:])
    if head == "input":
        return InputSource(rest)
    if head == "nodes":
        if len(rest) < 2:
            raise ValueError(f"source {text!r} must name a node and a field, e.g. $nodes.x.data")
        node, field, path = rest[0], rest[1], rest[2:]
        if field == "data":
            return NodeSource(node, "data", path)
        if field == "error":
            return NodeSource(node, "error", path)
        if field in ("status", "reason"):
            if path:
                raise ValueError(f"source {text!r}: {field!r} has no fields")
            return NodeSource(node, "status" if field == "status" else "reason", ())
        raise ValueError(
            f"source {text!r}: expected 'data', 'error', 'status' or 'reason' after the node"
        )
    raise ValueError(
        f"source {text!r} must start with $input or $nodes (write $$ for a literal '$')"
    )


def _resolve(
    value: Any,
    node: NodeSpec,
    key: str,
    run_input: Mapping[str, Any],
    results: Mapping[str, NodeResult],
) -> Any:
    if isinstance(value, str):
        if value.startswith("$$"):
            return value[1:]
        if not value.startswith("$"):
            return value
        try:
            source = parse_source(value)
        except ValueError as exc:
            raise DagError(f"node {node.id!r}: input {key!r}: {exc}", node=node.id) from None
        if isinstance(source, InputSource):
            found, resolved = lookup(run_input, source.path)
        else:
            upstream = results.get(source.node)
            if upstream is None:
                raise DagError(
                    f"node {node.id!r}: input {key!r} reads {value!r}, but node "
                    f"{source.node!r} has no result",
                    node=node.id,
                    path=value,
                )
            if source.field == "status":
                found, resolved = True, upstream.status.value
            elif source.field == "reason":
                found, resolved = True, upstream.reason
            else:
                base = upstream.data if source.field == "data" else upstream.error
                found, resolved = lookup(base, source.path)
        if not found:
            raise DagError(
                f"node {node.id!r}: input {key!r}: path {value!r} not found",
                node=node.id,
                path=value,
            )
        return copy.deepcopy(resolved)
    if isinstance(value, Mapping):
        return {k: _resolve(v, node, key, run_input, results) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_resolve(v, node, key, run_input, results) for v in value]
    return copy.deepcopy(value)


def build_payload(
    node: NodeSpec, run_input: Mapping[str, Any], results: Mapping[str, NodeResult]
) -> dict[str, Any]:
    """The node's payload: its static ``payload`` plus its ``inputs`` resolved.

    A source whose path does not exist (or whose node has no result) is a `DagError`
    naming the node and the path (``extra["path"]``).
    """
    payload = copy.deepcopy(node.payload)
    for key, source in node.inputs.items():
        payload[key] = _resolve(source, node, key, run_input, results)
    return payload
