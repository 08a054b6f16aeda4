"""Tables for the pure DAG module: validation, conditions, decisions, payloads and the plan."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from reach.core.orchestration.dags import (
    And,
    Compare,
    DagSpec,
    DataRef,
    Decision,
    Node,
    NodeResult,
    NodeSpec,
    NodeStatus,
    Not,
    Or,
    Par,
    Plan,
    Seq,
    StatusRef,
    ancestors,
    build_payload,
    compile_plan,
    dag_format,
    decide,
    evaluate,
    load_dag,
    parse_condition,
    parse_dag,
    validate,
)
from reach.errors import DagError

DAGS_DIR = Path(__file__).resolve().parents[2] / "dags"
DEMO_CAPABILITIES = {"sales.fetch", "knowledge.explain", "chat.compose"}

SUCCESS = NodeStatus.SUCCESS
FAILED = NodeStatus.FAILED
SKIPPED = NodeStatus.SKIPPED
TIMEOUT = NodeStatus.TIMEOUT


def n(node_id: str, *deps: str, **fields: Any) -> dict[str, Any]:
    """A node document with a valid target and method unless overridden."""
    doc: dict[str, Any] = {"id": node_id, "capability": "demo.cap", "method": "demo.run"}
    if deps:
        doc["dependencies"] = list(deps)
    doc.update(fields)
    return doc


def dag(*nodes: dict[str, Any]) -> DagSpec:
    """A typed but unvalidated spec."""
    return DagSpec.model_validate({"name": "t", "nodes": list(nodes)})


def ok(data: Any = None) -> NodeResult:
    return NodeResult(status=SUCCESS, data=data)


def failed(code: int = 7, message: str = "boom") -> NodeResult:
    return NodeResult(status=FAILED, error={"code": code, "message": message}, reason=message)


# --- loading ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("filename", "fmt"),
    [
        ("dags/x.json", "json"),
        ("X.JSON", "json"),
        ("flow.yaml", "yaml"),
        ("flow.yml", "yaml"),
    ],
)
def test_dag_format(filename: str, fmt: str) -> None:
    assert dag_format(filename) == fmt


def test_dag_format_refuses_other_extensions() -> None:
    with pytest.raises(DagError, match="not a DAG file"):
        dag_format("flow.toml")


@pytest.mark.parametrize(
    ("text", "fmt", "fragment"),
    [
        ('{"name": "x", "nodes": [', "json", "invalid JSON at line 1"),
        ("name: [unclosed", "yaml", "invalid YAML"),
        ("[1, 2]", "json", "must be a mapping"),
        ("- a\n- b\n", "yaml", "must be a mapping"),
        ("", "yaml", "must be a mapping"),
        ('{"name": "x", "nodes": []}', "toml", "unknown DAG format"),
        ('{"nodes": []}', "json", "invalid DAG: DAG: name: Field required"),
        ('{"name": "x", "nodes": [], "retries": 3}', "json", "DAG: retries: Extra inputs"),
    ],
)
def test_load_dag_errors(text: str, fmt: Any, fragment: str) -> None:
    with pytest.raises(DagError) as exc:
        load_dag(text, fmt)
    assert fragment in exc.value.detail


YAML_FLOW = """
name: tiny
description: two nodes
nodes:
  - id: fetch
    capability: sales.fetch
    method: sales.fetch
    inputs: {region: $input.region}
  - id: explain
    capability: knowledge.explain
    method: knowledge.explain
    timeout_ms: 5000
    dependencies: [fetch]
    condition: fetch.status == 'success'
    inputs: {rows: $nodes.fetch.data.rows}
"""


def test_yaml_and_json_give_the_same_spec() -> None:
    from_yaml = load_dag(YAML_FLOW, "yaml")
    import yaml

    from_json = load_dag(json.dumps(yaml.safe_load(YAML_FLOW)), "json")
    assert from_yaml == from_json
    explain = from_yaml.node("explain")
    assert explain.dependencies == ("fetch",)
    assert explain.timeout_ms == 5000
    assert from_yaml.node("fetch").timeout_ms == 30_000


def test_node_lookup_names_the_missing_node() -> None:
    with pytest.raises(DagError) as exc:
        dag(n("a")).node("b")
    assert exc.value.extra["node"] == "b"


@pytest.mark.parametrize(
    ("node", "fragment"),
    [
        (n("a", timeout_ms=0), "node 'a': timeout_ms: Input should be greater than or equal to 1"),
        (n("a", timeout_ms=3_600_001), "node 'a': timeout_ms: Input should be less than"),
        (n("a", timeout_ms="1000"), "node 'a': timeout_ms: Input should be a valid integer"),
        (n("a", timeout_ms=True), "node 'a': timeout_ms: Input should be a valid integer"),
        (n("a", retries=3), "node 'a': retries: Extra inputs are not permitted"),
        (n("a", dependencies="b"), "node 'a': dependencies: Input should be a valid tuple"),
        (n("a", condition=1), "node 'a': condition: Input should be a valid string"),
        (n("a", payload=[1]), "node 'a': payload: Input should be a valid dictionary"),
        ({"id": "a", "capability": "c"}, "node 'a': method: Field required"),
    ],
)
def test_parse_dag_type_errors_name_the_node(node: dict[str, Any], fragment: str) -> None:
    with pytest.raises(DagError) as exc:
        parse_dag({"name": "t", "nodes": [n("ok"), node]})
    assert fragment in exc.value.detail
    assert exc.value.extra["node"] == "a"


def test_parse_dag_type_error_without_an_id_names_the_position() -> None:
    with pytest.raises(DagError) as exc:
        parse_dag({"name": "t", "nodes": [n("ok"), {"method": "m"}]})
    assert "nodes[1]: id: Field required" in exc.value.detail
    assert "node" not in exc.value.extra


# --- validation ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("nodes", "fragment", "node"),
    [
        pytest.param([], "DAG 't' has no nodes", None, id="empty"),
        pytest.param([n("a"), n("b"), n("a")], "node 'a' is declared twice", "a", id="duplicate"),
        pytest.param([n("a.b")], "node id 'a.b' is invalid", "a.b", id="id-dot"),
        pytest.param([n("1a")], "node id '1a' is invalid", "1a", id="id-digit"),
        pytest.param([n("")], "node id '' is invalid", "", id="id-empty"),
        pytest.param([n("and")], "node id 'and' is a reserved word", "and", id="id-reserved"),
        pytest.param([n("a", "x")], "node 'a' depends on unknown node 'x'", "a", id="unknown-dep"),
        pytest.param([n("a", "a")], "node 'a' depends on itself", "a", id="self-dep"),
        pytest.param(
            [n("a"), n("b", "a", "a")], "node 'b' lists dependency 'a' twice", "b", id="dep-twice"
        ),
        pytest.param(
            [n("a", "b"), n("b", "a")], "dependency cycle: a -> b -> a", "a", id="cycle-2"
        ),
        pytest.param(
            [n("a", "c"), n("b", "a"), n("c", "b")],
            "dependency cycle: a -> b -> c -> a",
            "a",
            id="cycle-3",
        ),
        pytest.param(
            [n("root"), n("x", "root", "z"), n("y", "x"), n("z", "y"), n("sink", "z")],
            "dependency cycle: x -> y -> z -> x",
            "x",
            id="cycle-below-a-root",
        ),
        pytest.param(
            [{"id": "a", "method": "m"}],
            "node 'a' has no target: name an agent_id, tags or a capability",
            "a",
            id="no-target",
        ),
        pytest.param(
            [n("a", method="bad method")],
            "node 'a': method 'bad method' is not a valid method name",
            "a",
            id="bad-method",
        ),
        pytest.param(
            [n("a", method="")], "node 'a': method '' is not a valid", "a", id="empty-method"
        ),
        pytest.param(
            [n("a", agent_id="no spaces")], "node 'a': agent_id 'no spaces'", "a", id="bad-agent"
        ),
        pytest.param([n("a", tags=["ok", "b@d"])], "node 'a': tag 'b@d'", "a", id="bad-tag"),
        pytest.param(
            [n("a", capability="-x")], "node 'a': capability '-x' is invalid", "a", id="bad-cap"
        ),
        pytest.param(
            [n("a"), n("b", "a", condition="a.status = 'success'")],
            "node 'b': invalid condition \"a.status = 'success'\": unexpected character '='",
            "b",
            id="condition-syntax",
        ),
        pytest.param(
            [n("a"), n("b", "a", condition="a.status == 'succes'")],
            "node 'b': invalid condition",
            "b",
            id="condition-bad-status",
        ),
        pytest.param(
            [n("a"), n("b", "a", condition="zz.status == 'success'")],
            "node 'b': condition refers to unknown node 'zz'",
            "b",
            id="condition-unknown-node",
        ),
        pytest.param(
            [n("a"), n("b"), n("c", "a", condition="b.status == 'success'")],
            "node 'c': condition refers to 'b', which is not upstream of 'c'",
            "c",
            id="condition-not-upstream",
        ),
        pytest.param(
            [n("a", condition="a.status == 'success'")],
            "node 'a': condition refers to 'a', which is not upstream of 'a'",
            "a",
            id="condition-self",
        ),
        pytest.param(
            [n("a", condition="b.status == 'success'"), n("b", "a")],
            "node 'a': condition refers to 'b', which is not upstream of 'a'",
            "a",
            id="condition-downstream",
        ),
        pytest.param(
            [n("a"), n("b"), n("c", "a", inputs={"x": "$nodes.b.data"})],
            "node 'c': input 'x' refers to 'b', which is not upstream of 'c'",
            "c",
            id="input-not-upstream",
        ),
        pytest.param(
            [n("a"), n("c", "a", inputs={"x": {"deep": ["$nodes.b.data.rows"]}})],
            "node 'c': input 'x' refers to unknown node 'b'",
            "c",
            id="input-unknown-node-nested",
        ),
        pytest.param(
            [n("a", inputs={"x": "$inputs.region"})],
            "node 'a': input 'x': source '$inputs.region' must start with $input or $nodes",
            "a",
            id="input-bad-root",
        ),
        pytest.param(
            [n("a"), n("b", "a", inputs={"x": "$nodes.a"})],
            "node 'b': input 'x': source '$nodes.a' must name a node and a field",
            "b",
            id="input-no-field",
        ),
        pytest.param(
            [n("a"), n("b", "a", inputs={"x": "$nodes.a.result"})],
            "expected 'data', 'error', 'status' or 'reason'",
            "b",
            id="input-bad-field",
        ),
        pytest.param(
            [n("a"), n("b", "a", inputs={"x": "$nodes.a.status.code"})],
            "node 'b': input 'x': source '$nodes.a.status.code': 'status' has no fields",
            "b",
            id="input-status-path",
        ),
        pytest.param(
            [n("a", inputs={"x": "$input..region"})],
            "node 'a': input 'x': source '$input..region' has an empty path segment",
            "a",
            id="input-empty-segment",
        ),
        pytest.param(
            [n("a", payload={"x": 1}, inputs={"x": "$input.x"})],
            "node 'a': input 'x' is also a static payload key",
            "a",
            id="input-clashes-payload",
        ),
        pytest.param(
            [n("a", inputs={"": "$input"})], "node 'a': an input key is empty", "a", id="input-key"
        ),
    ],
)
def test_validation_errors_name_the_node(
    nodes: list[dict[str, Any]], fragment: str, node: str | None
) -> None:
    spec = dag(*nodes)
    with pytest.raises(DagError) as exc:
        validate(spec)
    assert fragment in exc.value.detail
    assert exc.value.extra.get("node") == node
    # The loader runs the same validation.
    with pytest.raises(DagError) as loaded:
        parse_dag({"name": "t", "nodes": nodes})
    assert loaded.value.detail == exc.value.detail


def test_cycle_error_carries_the_path() -> None:
    with pytest.raises(DagError) as exc:
        validate(dag(n("a", "c"), n("b", "a"), n("c", "b")))
    assert exc.value.extra["cycle"] == ["a", "b", "c", "a"]


@pytest.mark.parametrize(
    "nodes",
    [
        pytest.param([n("a"), n("b", "a"), n("c", "b", condition="a.status == 'failed'")], id="c"),
        pytest.param(
            [n("a"), n("b", "a"), n("c", "b", inputs={"x": "$nodes.a.data.rows.0"})], id="input"
        ),
        pytest.param([n("a", inputs={"x": "$$nodes.zz", "y": ["$$", 1, None]})], id="literal-$"),
        pytest.param([n("a", agent_id="doc-1"), n("b", tags=["gpu", "eu"])], id="targets"),
    ],
)
def test_valid_specs(nodes: list[dict[str, Any]]) -> None:
    validate(dag(*nodes))


@pytest.mark.parametrize(
    ("known", "fragment", "node"),
    [
        ({"sales.fetch", "chat.compose"}, None, None),
        ({"sales.fetch"}, "node 'reply': unknown target (capability 'chat.compose')", "reply"),
        (set(), "node 'fetch': unknown target (capability 'sales.fetch')", "fetch"),
    ],
)
def test_unknown_target(known: set[str], fragment: str | None, node: str | None) -> None:
    spec = dag(n("fetch", capability="sales.fetch"), n("reply", "fetch", capability="chat.compose"))
    calls: list[str] = []

    def exists(spec_node: NodeSpec) -> bool:
        calls.append(spec_node.id)
        return spec_node.capability in known

    if fragment is None:
        validate(spec, target_exists=exists)
        assert calls == ["fetch", "reply"]
        return
    with pytest.raises(DagError) as exc:
        validate(spec, target_exists=exists)
    assert fragment in exc.value.detail
    assert exc.value.extra["node"] == node


def test_target_description_lists_every_part() -> None:
    node = NodeSpec(id="a", agent_id="doc", tags=("x", "y"), capability="c", method="m")
    assert node.describe_target() == "agent 'doc', tags ['x', 'y'], capability 'c'"


def test_ancestors_are_transitive() -> None:
    spec = dag(n("a"), n("b", "a"), n("c", "b"), n("d"), n("e", "c", "d"))
    assert ancestors(spec) == {
        "a": frozenset(),
        "b": frozenset({"a"}),
        "c": frozenset({"a", "b"}),
        "d": frozenset(),
        "e": frozenset({"a", "b", "c", "d"}),
    }


def test_long_chain_needs_no_deep_recursion() -> None:
    nodes = [n("n0"), *(n(f"n{i}", f"n{i - 1}") for i in range(1, 3000))]
    plan = compile_plan(dag(*nodes))
    assert plan.critical_path_levels == 3000
    cyclic = [n("n0", "n2999"), *nodes[1:]]
    with pytest.raises(DagError, match="dependency cycle: n0 -> n1 -> n2 -> "):
        validate(dag(*cyclic))


# --- condition parser ------------------------------------------------------------------------

A_OK = 'a.status == "success"'
B_OK = 'b.status == "success"'
C_OK = 'c.status == "success"'


@pytest.mark.parametrize(
    ("text", "rendered"),
    [
        (A_OK, A_OK),
        ("a.status != 'failed'", 'a.status != "failed"'),
        ('a.status == "skipped"', 'a.status == "skipped"'),
        ('a.status == "timeout"', 'a.status == "timeout"'),
        ('  a.status=="success"  ', A_OK),
        (f"not {A_OK}", f"not {A_OK}"),
        (f"not not {A_OK}", f"not not {A_OK}"),
        # and binds tighter than or; not tighter than and
        (f"{A_OK} or {B_OK} and {C_OK}", f"({A_OK} or ({B_OK} and {C_OK}))"),
        (f"{A_OK} and {B_OK} or {C_OK}", f"(({A_OK} and {B_OK}) or {C_OK})"),
        (f"not {A_OK} and {B_OK}", f"(not {A_OK} and {B_OK})"),
        (f"not {A_OK} or {B_OK}", f"(not {A_OK} or {B_OK})"),
        # parentheses override
        (f"({A_OK} or {B_OK}) and {C_OK}", f"(({A_OK} or {B_OK}) and {C_OK})"),
        (f"not ({A_OK} or {B_OK})", f"not ({A_OK} or {B_OK})"),
        (f"(({A_OK}))", A_OK),
        (f"{A_OK} and {B_OK} and {C_OK}", f"({A_OK} and {B_OK} and {C_OK})"),
        # data comparisons with JSON literals
        ("a.data.count == 3", "a.data.count == 3"),
        ('a.data.count == "3"', 'a.data.count == "3"'),
        ("a.data.ratio != -1.5e2", "a.data.ratio != -150.0"),
        ("a.data.flag == true", "a.data.flag == true"),
        ("a.data.flag == false", "a.data.flag == false"),
        ("a.data.x == null", "a.data.x == null"),
        ("a.data == null", "a.data == null"),
        ("a.data.rows.0.amount == 1.5", "a.data.rows.0.amount == 1.5"),
        ("a.data.name == 'it\\'s'", 'a.data.name == "it\'s"'),
        ('a.data.name == "say \\"hi\\""', 'a.data.name == "say \\"hi\\""'),
        ('fetch_sales-data.status == "success"', 'fetch_sales-data.status == "success"'),
        ("a.data.and == 1", "a.data.and == 1"),
    ],
)
def test_condition_parses(text: str, rendered: str) -> None:
    assert str(parse_condition(text)) == rendered


def test_condition_ast_shape() -> None:
    text = 'not a.status == "failed" and (b.data.rows.0 == 1 or c.data.x != "y")'
    assert parse_condition(text) == And(
        (
            Not(Compare(StatusRef("a"), "==", "failed")),
            Or(
                (
                    Compare(DataRef("b", ("rows", "0")), "==", 1),
                    Compare(DataRef("c", ("x",)), "!=", "y"),
                )
            ),
        )
    )


def test_number_literals_keep_their_type() -> None:
    int_cmp = parse_condition("a.data.n == 3")
    float_cmp = parse_condition("a.data.n == 3.0")
    assert isinstance(int_cmp, Compare) and isinstance(float_cmp, Compare)
    assert type(int_cmp.value) is int
    assert type(float_cmp.value) is float


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "empty condition"),
        ("   ", "empty condition"),
        ("a.status = 'success'", "unexpected character '='"),
        ("a.status == 'succes'", 'a.status is compared with "succes"; expected one of'),
        ("a.status == 1", 'a.status is compared with 1; expected one of "success"'),
        ("a.status == success", "expected a literal"),
        ("a.status", "expected '==' or '!=', found end of input"),
        ("a == 'success'", "expected '.status' or '.data' after 'a'"),
        ("a.foo == 1", "expected 'status' or 'data', found 'foo'"),
        ("a.status.x == 'success'", "'status' has no fields"),
        ("a. status == 'success'", "expected a name after '.'"),
        ("(a.status == 'success'", "expected ')', found end of input"),
        ("a.status == 'success')", "expected 'and', 'or' or the end, found ')'"),
        ("a.status == 'success' and", "expected a node id, found end of input"),
        ("and.status == 'success'", "expected a node id, found 'and'"),
        ("not", "expected a node id"),
        ("a.status == 'success' && b.status == 'success'", "unexpected character '&'"),
        ("a.status == 'success' AND b.status == 'success'", "expected 'and', 'or' or the end"),
        ("__import__('os').system('id')", "expected '.status' or '.data'"),
        ("a.data.x == [1]", "unexpected character '['"),
        ("a.data.x == 01", "expected 'and', 'or' or the end, found '1'"),
        ('a.data.x == "bad \\q escape"', "invalid escape in string"),
        ("a.data.x == 'unterminated", "unexpected character"),
        ("(" * 40 + "a.status == 'success'" + ")" * 40, "nested too deeply"),
        ("not " * 40 + "a.status == 'success'", "nested too deeply"),
        ("a.data.x == '" + "x" * 2100 + "'", "longer than 2000 characters"),
    ],
)
def test_condition_syntax_errors(text: str, fragment: str) -> None:
    with pytest.raises(DagError) as exc:
        parse_condition(text)
    assert fragment in exc.value.detail


def test_condition_error_reports_the_position() -> None:
    with pytest.raises(DagError) as exc:
        parse_condition("a.status == 'success' or b.status ~= 'x'")
    assert exc.value.extra["position"] == 34
    assert exc.value.extra["condition"] == "a.status == 'success' or b.status ~= 'x'"


# --- evaluation ------------------------------------------------------------------------------

RESULTS = {
    "a": ok(
        {
            "count": 3,
            "ratio": 0.5,
            "flag": True,
            "name": "east",
            "text3": "3",
            "none": None,
            "rows": [{"amount": 1.5}, {"amount": 2}],
        }
    ),
    "b": failed(),
    "c": NodeResult(status=SKIPPED, reason="dependency 'b' failed"),
    "t": NodeResult(status=TIMEOUT),
}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (A_OK, True),
        ('a.status != "success"', False),
        ('b.status == "failed"', True),
        ('b.status == "success"', False),
        ('c.status == "skipped"', True),
        ('t.status == "timeout"', True),
        ('t.status == "failed"', False),
        ('t.status == "failed" or t.status == "timeout"', True),
        # JSON equality
        ("a.data.count == 3", True),
        ("a.data.count == 3.0", True),
        ("a.data.count == 4", False),
        ('a.data.count == "3"', False),
        ("a.data.text3 == 3", False),
        ('a.data.text3 == "3"', True),
        ("a.data.ratio == 0.5", True),
        ("a.data.flag == true", True),
        ("a.data.flag == 1", False),
        ("a.data.count == true", False),
        ('a.data.name == "east"', True),
        ("a.data.name != 'west'", True),
        ("a.data.none == null", True),
        ("a.data.none != null", False),
        ("a.data.rows.0.amount == 1.5", True),
        ("a.data.rows.1.amount == 2", True),
        ("a.data.rows == null", False),
        ("a.data.rows != 1", True),
        # missing paths equal nothing
        ("a.data.missing == null", False),
        ("a.data.missing != null", True),
        ("a.data.rows.5.amount == 1.5", False),
        ("a.data.rows.x == 1", False),
        ("a.data.count.deeper == 1", False),
        ("b.data.x == 1", False),
        ("b.data == null", True),
        # precedence and parentheses
        (f'{A_OK} or {B_OK} and c.status == "success"', True),
        (f'({A_OK} or {B_OK}) and c.status == "success"', False),
        ('not a.status == "success" or b.status == "failed"', True),
        ('not (a.status == "success" or b.status == "failed")', False),
        ('not b.status == "success" and not c.status == "success"', True),
        (f"not not {A_OK}", True),
    ],
)
def test_evaluate(text: str, expected: bool) -> None:
    assert evaluate(parse_condition(text), RESULTS) is expected


def test_evaluate_needs_the_named_result() -> None:
    with pytest.raises(DagError) as exc:
        evaluate(parse_condition('zz.status == "success"'), RESULTS)
    assert exc.value.extra["node"] == "zz"


# --- decisions: default condition, skips, failure branches ------------------------------------


def simulate(spec: DagSpec, outcomes: dict[str, NodeResult]) -> dict[str, NodeResult]:
    """Run a plan level by level as the canvas would; nodes not in outcomes succeed."""
    plan = compile_plan(spec)
    results: dict[str, NodeResult] = {}
    for level in plan.levels:
        finished: dict[str, NodeResult] = {}
        for node_id in level:
            node = spec.node(node_id)
            decision = decide(node, results)
            if decision.run:
                finished[node_id] = outcomes.get(node_id, ok({"by": node_id}))
            else:
                finished[node_id] = NodeResult(status=SKIPPED, reason=decision.reason)
        results.update(finished)
    return results


CHAIN = dag(n("a"), n("b", "a"), n("c", "b"))


@pytest.mark.parametrize(
    ("outcomes", "expected"),
    [
        ({}, {"a": (SUCCESS, ""), "b": (SUCCESS, ""), "c": (SUCCESS, "")}),
        (
            {"a": failed()},
            {
                "a": (FAILED, "boom"),
                "b": (SKIPPED, "dependency 'a' failed"),
                "c": (SKIPPED, "dependency 'b' was skipped"),
            },
        ),
        (
            {"a": NodeResult(status=TIMEOUT)},
            {
                "a": (TIMEOUT, ""),
                "b": (SKIPPED, "dependency 'a' timed out"),
                "c": (SKIPPED, "dependency 'b' was skipped"),
            },
        ),
        (
            {"b": failed()},
            {"a": (SUCCESS, ""), "b": (FAILED, "boom"), "c": (SKIPPED, "dependency 'b' failed")},
        ),
        ({"c": failed()}, {"a": (SUCCESS, ""), "b": (SUCCESS, ""), "c": (FAILED, "boom")}),
    ],
)
def test_default_condition_and_skip_propagation(
    outcomes: dict[str, NodeResult], expected: dict[str, tuple[NodeStatus, str]]
) -> None:
    results = simulate(CHAIN, outcomes)
    assert {k: (r.status, r.reason) for k, r in results.items()} == expected


@pytest.mark.parametrize(
    ("node", "results", "decision"),
    [
        (n("a"), {}, Decision(True, "no dependencies")),
        (n("c", "a", "b"), {"a": ok(), "b": ok()}, Decision(True, "all dependencies succeeded")),
        (
            n("c", "a", "b"),
            {"a": failed(), "b": RESULTS["c"]},
            Decision(False, "dependency 'a' failed; dependency 'b' was skipped"),
        ),
        (
            n("d", "b", condition='b.status == "failed"'),
            {"b": failed()},
            Decision(True, 'condition met: b.status == "failed"'),
        ),
        (
            n("d", "b", condition='b.status == "failed"'),
            {"b": ok()},
            Decision(False, 'condition not met: b.status == "failed"'),
        ),
        (
            # an explicit condition replaces the default: a failed dependency may still run it
            n("d", "a", "b", condition='a.status == "success"'),
            {"a": ok(), "b": failed()},
            Decision(True, 'condition met: a.status == "success"'),
        ),
    ],
)
def test_decide(node: dict[str, Any], results: dict[str, NodeResult], decision: Decision) -> None:
    assert decide(NodeSpec.model_validate(node), results) == decision


def test_decide_needs_every_dependency_result() -> None:
    node = NodeSpec.model_validate(n("c", "a", "b", condition=A_OK))
    with pytest.raises(DagError) as exc:
        decide(node, {"a": ok()})
    assert exc.value.extra["node"] == "b"


def load_shipped(name: str) -> DagSpec:
    path = DAGS_DIR / name
    return load_dag(path.read_text(encoding="utf-8"), dag_format(path.name))


@pytest.mark.parametrize(
    ("outcomes", "expected"),
    [
        (
            {},
            {
                "split": SUCCESS,
                "review_a": SUCCESS,
                "review_b": SUCCESS,
                "merge": SUCCESS,
                "escalate": SKIPPED,
            },
        ),
        (
            {"review_b": failed()},
            {
                "split": SUCCESS,
                "review_a": SUCCESS,
                "review_b": FAILED,
                "merge": SKIPPED,
                "escalate": SUCCESS,
            },
        ),
        (
            {"review_a": failed()},
            {
                "split": SUCCESS,
                "review_a": FAILED,
                "review_b": SUCCESS,
                "merge": SKIPPED,
                "escalate": SKIPPED,
            },
        ),
        (
            {"split": failed()},
            {
                "split": FAILED,
                "review_a": SKIPPED,
                "review_b": SKIPPED,
                "merge": SKIPPED,
                "escalate": SKIPPED,
            },
        ),
    ],
)
def test_failure_branch_runs_only_on_failure(
    outcomes: dict[str, NodeResult], expected: dict[str, NodeStatus]
) -> None:
    results = simulate(load_shipped("diamond_review.json"), outcomes)
    assert {k: r.status for k, r in results.items()} == expected
    if expected["escalate"] is SKIPPED:
        assert results["escalate"].reason == 'condition not met: review_b.status == "failed"'


def test_sales_flow_skips_analysis_when_fetch_fails() -> None:
    results = simulate(load_shipped("sales_analysis_flow.json"), {"fetch_sales_data": failed()})
    assert results["analyze_cause"].status is SKIPPED
    assert (
        results["analyze_cause"].reason == 'condition not met: fetch_sales_data.status == "success"'
    )
    assert results["compose_reply"].status is SKIPPED
    assert "dependency 'fetch_sales_data' failed" in results["compose_reply"].reason


def test_node_result_round_trips_as_json() -> None:
    result = failed()
    wire = json.loads(json.dumps(result.model_dump(mode="json")))
    assert wire["status"] == "failed"
    assert NodeResult.model_validate(wire) == result
    with pytest.raises(ValueError, match="Extra inputs"):
        NodeResult.model_validate({"status": "success", "retries": 1})


# --- payloads --------------------------------------------------------------------------------

RUN_INPUT = {"region": "east", "filters": {"year": 2024}, "items": ["a", "b"]}
UPSTREAM = {
    "a": ok({"rows": [{"amount": 1.5}], "total": 10, "empty": None}),
    "b": failed(code=7, message="no data"),
}


@pytest.mark.parametrize(
    ("source", "value"),
    [
        ("$input", RUN_INPUT),
        ("$input.region", "east"),
        ("$input.filters.year", 2024),
        ("$input.items.1", "b"),
        ("$nodes.a.data", UPSTREAM["a"].data),
        ("$nodes.a.data.rows", [{"amount": 1.5}]),
        ("$nodes.a.data.rows.0.amount", 1.5),
        ("$nodes.a.data.empty", None),
        ("$nodes.a.status", "success"),
        ("$nodes.b.status", "failed"),
        ("$nodes.b.error", {"code": 7, "message": "no data"}),
        ("$nodes.b.error.code", 7),
        ("$nodes.b.reason", "no data"),
        ("$nodes.b.data", None),
        ("plain text", "plain text"),
        ("$$input.region", "$input.region"),
        ("$$", "$"),
        (5, 5),
        (2.5, 2.5),
        (True, True),
        (None, None),
        (
            {"ctx": {"rows": "$nodes.a.data.rows", "region": "$input.region"}, "n": 1},
            {"ctx": {"rows": [{"amount": 1.5}], "region": "east"}, "n": 1},
        ),
        (["$input.region", "$nodes.a.data.total", "x"], ["east", 10, "x"]),
    ],
)
def test_build_payload_resolves_sources(source: Any, value: Any) -> None:
    doc = n("c", "a", "b", payload={"tone": "concise"}, inputs={"x": source})
    validate(dag(n("a"), n("b"), doc))
    node = NodeSpec.model_validate(doc)
    assert build_payload(node, RUN_INPUT, UPSTREAM) == {"tone": "concise", "x": value}


@pytest.mark.parametrize(
    ("source", "fragment"),
    [
        ("$input.nope", "path '$input.nope' not found"),
        ("$input.region.deeper", "path '$input.region.deeper' not found"),
        ("$input.items.2", "path '$input.items.2' not found"),
        ("$nodes.a.data.nope", "path '$nodes.a.data.nope' not found"),
        ("$nodes.a.data.rows.5.amount", "path '$nodes.a.data.rows.5.amount' not found"),
        ("$nodes.b.data.rows", "path '$nodes.b.data.rows' not found"),
        ("$nodes.a.error.code", "path '$nodes.a.error.code' not found"),
        ("$nodes.zz.data", "reads '$nodes.zz.data', but node 'zz' has no result"),
        ({"nested": ["$input.nope"]}, "path '$input.nope' not found"),
    ],
)
def test_build_payload_missing_path(source: Any, fragment: str) -> None:
    node = NodeSpec.model_validate(n("c", "a", "b", inputs={"x": source}))
    with pytest.raises(DagError) as exc:
        build_payload(node, RUN_INPUT, UPSTREAM)
    assert "node 'c': input 'x'" in exc.value.detail
    assert fragment in exc.value.detail
    assert exc.value.extra["node"] == "c"
    assert exc.value.extra["path"].startswith("$")


def test_build_payload_copies_instead_of_aliasing() -> None:
    node = NodeSpec.model_validate(
        n("c", "a", payload={"opts": {"k": 1}}, inputs={"rows": "$nodes.a.data.rows"})
    )
    payload = build_payload(node, RUN_INPUT, UPSTREAM)
    payload["opts"]["k"] = 2
    payload["rows"].append("extra")
    assert node.payload == {"opts": {"k": 1}}
    assert UPSTREAM["a"].data["rows"] == [{"amount": 1.5}]


# --- plan ------------------------------------------------------------------------------------


def fan_out(width: int, *, with_sink: bool) -> list[dict[str, Any]]:
    workers = [n(f"w{i}", "root") for i in range(width)]
    sink = [n("sink", *(w["id"] for w in workers))] if with_sink else []
    return [n("root"), *workers, *sink]


@pytest.mark.parametrize(
    ("nodes", "levels", "rendered"),
    [
        pytest.param([n("a")], (("a",),), "a", id="single"),
        pytest.param(
            [n("a"), n("b", "a"), n("c", "b")], (("a",), ("b",), ("c",)), "a -> b -> c", id="chain"
        ),
        pytest.param(
            [n("s"), n("l", "s"), n("r", "s"), n("m", "l", "r")],
            (("s",), ("l", "r"), ("m",)),
            "s -> (l | r) -> m",
            id="diamond",
        ),
        pytest.param(
            [n("r1"), n("r2"), n("x", "r1", "r2"), n("s1", "x"), n("s2", "x"), n("s3", "r2")],
            (("r1", "r2"), ("x", "s3"), ("s1", "s2")),
            "(r1 | r2) -> (x | s3) -> (s1 | s2)",
            id="roots-and-sinks",
        ),
        pytest.param(
            [n("a"), n("b"), n("c", "a", "b"), n("d", "b")],
            (("a", "b"), ("c", "d")),
            "(a | b) -> (c | d)",
            id="n-shape",
        ),
        pytest.param(
            [n("a"), n("b", "a"), n("c", "a", "b")],
            (("a",), ("b",), ("c",)),
            "a -> b -> c",
            id="longest-path",
        ),
        pytest.param(
            [n("d", "c"), n("c", "b"), n("b", "a"), n("a")],
            (("a",), ("b",), ("c",), ("d",)),
            "a -> b -> c -> d",
            id="declared-backwards",
        ),
        pytest.param(
            fan_out(10, with_sink=True),
            (("root",), tuple(f"w{i}" for i in range(10)), ("sink",)),
            "root -> (" + " | ".join(f"w{i}" for i in range(10)) + ") -> sink",
            id="fan-out-10-in",
        ),
        pytest.param(
            fan_out(10, with_sink=False),
            (("root",), tuple(f"w{i}" for i in range(10))),
            "root -> (" + " | ".join(f"w{i}" for i in range(10)) + ")",
            id="fan-out-10",
        ),
    ],
)
def test_compile_plan(nodes: list[dict[str, Any]], levels: Any, rendered: str) -> None:
    spec = dag(*nodes)
    plan = compile_plan(spec)
    assert plan.levels == levels
    assert str(plan.root) == rendered
    assert plan.critical_path_levels == len(levels)
    assert sorted(plan.order) == sorted(node["id"] for node in nodes)
    # every dependency sits in an earlier level, so the canvas order is safe
    for node in spec.nodes:
        for dep in node.dependencies:
            assert plan.level_of(dep) < plan.level_of(node.id)
    # one step per level: a Node for a lone node, a Par of Nodes otherwise
    assert len(plan.root.steps) == len(levels)
    for step, level in zip(plan.root.steps, levels, strict=True):
        expected = Node(level[0]) if len(level) == 1 else Par(tuple(Node(i) for i in level))
        assert step == expected


def test_diamond_plan_structure() -> None:
    plan = compile_plan(dag(n("s"), n("l", "s"), n("r", "s"), n("m", "l", "r")))
    assert plan.root == Seq((Node("s"), Par((Node("l"), Node("r"))), Node("m")))
    assert plan.spec.node("m").dependencies == ("l", "r")


@pytest.mark.parametrize(
    ("nodes", "node", "waits"),
    [
        pytest.param([n("a"), n("b"), n("c", "a", "b"), n("d", "b")], "d", ("a",), id="n-d"),
        pytest.param([n("a"), n("b"), n("c", "a", "b"), n("d", "b")], "c", (), id="n-c"),
        pytest.param([n("a"), n("b", "a"), n("x"), n("y", "x"), n("z", "y")], "b", ("x",), id="b"),
        pytest.param(
            [n("a"), n("b", "a"), n("x"), n("y", "x"), n("z", "y")], "z", ("a", "b"), id="z"
        ),
    ],
)
def test_extra_waits_show_the_level_cost(
    nodes: list[dict[str, Any]], node: str, waits: tuple[str, ...]
) -> None:
    assert compile_plan(dag(*nodes)).extra_waits(node) == waits


def test_plan_rejects_invalid_specs_and_unknown_nodes() -> None:
    with pytest.raises(DagError, match="dependency cycle"):
        compile_plan(dag(n("a", "b"), n("b", "a")))
    plan = compile_plan(dag(n("a")))
    assert isinstance(plan, Plan)
    with pytest.raises(DagError) as exc:
        plan.level_of("zz")
    assert exc.value.extra["node"] == "zz"


# --- shipped DAGs ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("filename", "levels"),
    [
        (
            "sales_analysis_flow.json",
            (("fetch_sales_data",), ("analyze_cause",), ("compose_reply",)),
        ),
        ("diamond_review.json", (("split",), ("review_a", "review_b"), ("merge", "escalate"))),
    ],
)
def test_shipped_dags_load_validate_and_compile(
    filename: str, levels: tuple[tuple[str, ...], ...]
) -> None:
    spec = load_shipped(filename)
    validate(spec, target_exists=lambda node: node.capability in DEMO_CAPABILITIES)
    assert compile_plan(spec).levels == levels


def test_shipped_sales_flow_payloads() -> None:
    spec = load_shipped("sales_analysis_flow.json")
    fetch_data = {"region": "east", "rows": [{"month": "2024-05", "amount": 120}], "total": 120}
    results = {
        "fetch_sales_data": ok(fetch_data),
        "analyze_cause": ok({"explanation": "a promotion ended"}),
    }
    run_input = {"region": "east"}
    assert build_payload(spec.node("fetch_sales_data"), run_input, {}) == {"region": "east"}
    assert build_payload(spec.node("analyze_cause"), run_input, results) == {
        "region": "east",
        "rows": fetch_data["rows"],
        "total": 120,
    }
    assert build_payload(spec.node("compose_reply"), run_input, results) == {
        "tone": "concise",
        "region": "east",
        "total": 120,
        "explanations": ["a promotion ended"],
    }
    with pytest.raises(DagError) as exc:
        build_payload(spec.node("fetch_sales_data"), {}, {})
    assert exc.value.extra == {"node": "fetch_sales_data", "path": "$input.region"}


def test_every_file_under_dags_is_valid() -> None:
    files = sorted(p for p in DAGS_DIR.iterdir() if p.suffix in {".json", ".yaml", ".yml"})
    assert {p.name for p in files} >= {"sales_analysis_flow.json", "diamond_review.json"}
    for path in files:
        spec = load_dag(path.read_text(encoding="utf-8"), dag_format(path.name))
        compile_plan(spec)
