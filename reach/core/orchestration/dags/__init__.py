"""DAG definitions as pure data: model, validation, conditions, node decisions and the plan.

Nothing here does I/O or imports Celery. The canvas layer reads a file, calls `load_dag`
(which validates), `validate` again with a ``target_exists`` callback against the
registry, then `compile_plan`, and turns the `Plan` into ``chain(group(...), ...)``. Each
node task calls `decide` and, when the node runs, `build_payload`; it always *returns* a
`NodeResult` (it never raises an agent's failure into a chord).

The package, one concept per module:

- `model`: `DagSpec`, `NodeSpec`, `NodeStatus`, `NodeResult`, `Decision`;
- `load`: a JSON or YAML document to a validated `DagSpec` (`load_dag`, `parse_dag`);
- `validation`: `validate` (ids, targets, dependencies, the cycle with its path,
  conditions and inputs naming upstream nodes) and `ancestors`;
- `conditions`: the condition language (parsed, never ``eval``-ed) and `decide`;
- `inputs`: a node's payload from ``$input`` and ``$nodes.<id>.data...`` (`build_payload`);
- `plan`: the level plan (`compile_plan`, `Plan.extra_waits`).
- `drawing`: a run's graph laid out in layers and drawn as SVG for the dashboard
  (imported as ``reach.core.orchestration.dags.drawing``, not re-exported here).
"""

from reach.core.orchestration.dags.conditions import (
    And,
    Compare,
    Condition,
    DataRef,
    JsonScalar,
    Not,
    Or,
    StatusRef,
    decide,
    evaluate,
    parse_condition,
)
from reach.core.orchestration.dags.inputs import build_payload
from reach.core.orchestration.dags.load import dag_format, load_dag, parse_dag
from reach.core.orchestration.dags.model import (
    DEFAULT_TIMEOUT_MS,
    MAX_TIMEOUT_MS,
    DagSpec,
    Decision,
    NodeResult,
    NodeSpec,
    NodeStatus,
)
from reach.core.orchestration.dags.plan import Node, Par, Plan, Seq, Step, compile_plan
from reach.core.orchestration.dags.validation import ancestors, validate

__all__ = [
    "DEFAULT_TIMEOUT_MS",
    "MAX_TIMEOUT_MS",
    "And",
    "Compare",
    "Condition",
    "DagSpec",
    "DataRef",
    "Decision",
    "JsonScalar",
    "Node",
    "NodeResult",
    "NodeSpec",
    "NodeStatus",
    "Not",
    "Or",
    "Par",
    "Plan",
    "Seq",
    "StatusRef",
    "Step",
    "ancestors",
    "build_payload",
    "compile_plan",
    "dag_format",
    "decide",
    "evaluate",
    "load_dag",
    "parse_condition",
    "parse_dag",
    "validate",
]
