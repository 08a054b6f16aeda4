"""A DAG document (JSON or YAML) to a validated `DagSpec`.

A DAG document::

    {"name": "sales_analysis_flow", "description": "...",
     "nodes": [{"id": "fetch", "capability": "sales.fetch", "method": "sales.fetch",
                "timeout_ms": 10000, "inputs": {"region": "$input.region"}},
               {"id": "explain", "capability": "knowledge.explain",
                "method": "knowledge.explain", "dependencies": ["fetch"],
                "condition": "fetch.status == \\"success\\"",
                "inputs": {"rows": "$nodes.fetch.data.rows"}}]}

A node names its target by ``agent_id``, ``tags`` and/or ``capability`` (at least one;
``rules`` adds metadata that must match, as in ``POST /v1/tasks``), a ``method``,
``timeout_ms`` (default 30000, 1..3600000), ``dependencies``, an optional ``condition``,
a static ``payload`` and ``inputs`` (see `reach.core.orchestration.dags.inputs`).

YAML is imported only when a YAML document is loaded, so the package needs no PyYAML
to be imported.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import ValidationError

from reach.core.orchestration.dags.model import DagSpec
from reach.core.orchestration.dags.validation import validate
from reach.errors import DagError

__all__ = ["dag_format", "load_dag", "parse_dag"]


def dag_format(filename: str) -> Literal["json", "yaml"]:
    """The format of a DAG file by its extension (``.json``, ``.yaml``, ``.yml``)."""
    lower = filename.lower()
    if lower.endswith(".json"):
        return "json"
    if lower.endswith((".yaml", ".yml")):
        return "yaml"
    raise DagError(f"{filename!r} is not a DAG file: expected .json, .yaml or .yml")


def load_dag(text: str, fmt: Literal["json", "yaml"]) -> DagSpec:
    """Parse a DAG document and validate it (without checking targets against a registry)."""
    obj: Any
    if fmt == "json":
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DagError(
                f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
            ) from None
    elif fmt == "yaml":
        import yaml

        try:
            obj = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise DagError(f"invalid YAML: {exc}") from None
    else:
        raise DagError(f"unknown DAG format {fmt!r}: expected 'json' or 'yaml'")
    if not isinstance(obj, dict):
        raise DagError("a DAG document must be a mapping with 'name' and 'nodes'")
    return parse_dag(obj)


def parse_dag(obj: Mapping[str, Any]) -> DagSpec:
    """Build a `DagSpec` from a decoded document and validate it (targets unchecked)."""
    try:
        spec = DagSpec.model_validate(obj)
    except ValidationError as exc:
        raise _translate(exc, obj) from None
    validate(spec)
    return spec


def _translate(exc: ValidationError, obj: Mapping[str, Any]) -> DagError:
    raw_nodes = obj.get("nodes")
    messages: list[str] = []
    first_node: str | None = None
    for err in exc.errors():
        loc = err["loc"]
        label = "DAG"
        rest = loc
        if len(loc) >= 2 and loc[0] == "nodes" and isinstance(loc[1], int):
            index = loc[1]
            raw = raw_nodes[index] if isinstance(raw_nodes, list) else None
            raw_id = raw.get("id") if isinstance(raw, dict) else None
            if isinstance(raw_id, str) and raw_id:
                label = f"node {raw_id!r}"
                first_node = first_node or raw_id
            else:
                label = f"nodes[{index}]"
            rest = loc[2:]
        where = ".".join(str(part) for part in rest)
        messages.append(f"{label}: {where}: {err['msg']}" if where else f"{label}: {err['msg']}")
    shown = "; ".join(messages[:5])
    if len(messages) > 5:
        shown += f"; and {len(messages) - 5} more"
    extra: dict[str, Any] = {"node": first_node} if first_node else {}
    return DagError(f"invalid DAG: {shown}", **extra)
