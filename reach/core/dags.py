"""DAG definitions as pure data: model, validation, conditions, node decisions and the plan.

Nothing here does I/O or imports Celery. The canvas layer reads a file, calls `load_dag`
(which validates), `validate` again with a ``target_exists`` callback against the
registry, then `compile_plan`, and turns the `Plan` into ``chain(group(...), ...)``. Each
node task calls `decide` and, when the node runs, `build_payload`; it always *returns* a
`NodeResult` (it never raises an agent's failure into a chord).

A DAG document (JSON or YAML)::

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
a static ``payload`` and ``inputs``, which maps payload keys to sources:

- ``"$input"`` / ``"$input.a.b"``: the run's input, or a dotted path into it;
- ``"$nodes.<id>.data[.path]"``, ``"$nodes.<id>.error[.path]"``, ``"$nodes.<id>.status"``,
  ``"$nodes.<id>.reason"``: an upstream (transitive ancestor) node's result;
- any other value is a literal; lists and objects are resolved item by item, so sources may
  be nested (``{"ctx": {"rows": "$nodes.fetch.data.rows"}}``); ``"$$x"`` is the literal
  string ``"$x"``, and any other string starting with ``$`` is an error.

Path segments are split on ``.``; a segment of digits indexes a list. An input key may not
also appear in the static ``payload``. A missing path is a `DagError` naming node and path.

Conditions are a small expression language, parsed (never ``eval``-ed) into an AST::

    condition  := or
    or         := and ("or" and)*
    and        := not ("and" not)*
    not        := "not" not | "(" or ")" | comparison
    comparison := NODE "." "status" ("==" | "!=") STATUS
                | NODE "." "data" ("." SEGMENT)* ("==" | "!=") LITERAL
    STATUS     := "success" | "failed" | "skipped" | "timeout"   (quoted)
    LITERAL    := "string" | 'string' | number | true | false | null

``not`` binds tighter than ``and``, which binds tighter than ``or``. A ``data`` comparison
uses JSON equality (``1`` equals ``1.0``; ``true`` never equals ``1``; ``"3"`` never equals
``3``); a path that does not exist equals nothing, so ``==`` is false and ``!=`` is true.
Every node a condition names must be upstream (a transitive ancestor) of its node.

Without a condition a node runs only when every dependency has status ``success``; a
failed, timed-out or skipped dependency makes it ``skipped``, so skips propagate down a
chain. With a condition, the condition alone decides (``review_b.status == "failed"``
is a failure branch). Note ``"timeout"`` is its own status: a failure branch that should
also catch timeouts says ``c.status == "failed" or c.status == "timeout"``.

The plan: an exact series-parallel decomposition of a DAG does not always exist (the "N"
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

import copy
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache
from typing import Any, Literal, TypeAlias

import yaml
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from reach.errors import DagError
from reach.schemas import AgentId, CapabilityType, MetadataValue, Method, Tag

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

DEFAULT_TIMEOUT_MS = 30_000
MAX_TIMEOUT_MS = 3_600_000
_MAX_CONDITION_CHARS = 2_000
_MAX_CONDITION_DEPTH = 32

_NODE_ID_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,127}")
_RESERVED_WORDS = frozenset({"and", "or", "not", "true", "false", "null"})


# --- model -----------------------------------------------------------------------------------


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


class NodeStatus(StrEnum):
    """Terminal state of one node in a run."""

    SUCCESS = "success"
    FAILED = "failed"
    SKIPPED = "skipped"
    TIMEOUT = "timeout"


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


# --- loading ---------------------------------------------------------------------------------


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


# --- validation ------------------------------------------------------------------------------

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
    if node.id in _RESERVED_WORDS:
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
    for ref in sorted(_referenced(cond)):
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
        for text in _sources_in(value):
            try:
                source = _parse_source(text)
            except ValueError as exc:
                raise DagError(f"node {node.id!r}: input {key!r}: {exc}", node=node.id) from None
            if isinstance(source, _NodeSource):
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


def _topological(spec: DagSpec) -> list[str]:
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
    for node_id in _topological(spec):
        found: set[str] = set()
        for dep in by_id[node_id].dependencies:
            found.add(dep)
            found |= result[dep]
        result[node_id] = frozenset(found)
    return result


# --- conditions ------------------------------------------------------------------------------

JsonScalar: TypeAlias = str | int | float | bool | None
_STATUSES = tuple(status.value for status in NodeStatus)


@dataclass(frozen=True, slots=True)
class StatusRef:
    """``<node>.status``."""

    node: str

    def __str__(self) -> str:
        return f"{self.node}.status"


@dataclass(frozen=True, slots=True)
class DataRef:
    """``<node>.data.<path>`` (an empty path is the whole data)."""

    node: str
    path: tuple[str, ...] = ()

    def __str__(self) -> str:
        return ".".join((self.node, "data", *self.path))


@dataclass(frozen=True, slots=True)
class Compare:
    """A reference compared with a JSON scalar."""

    ref: StatusRef | DataRef
    op: Literal["==", "!="]
    value: JsonScalar

    def __str__(self) -> str:
        return f"{self.ref} {self.op} {json.dumps(self.value)}"


@dataclass(frozen=True, slots=True)
class Not:
    operand: Condition

    def __str__(self) -> str:
        return f"not {self.operand}"


@dataclass(frozen=True, slots=True)
class And:
    operands: tuple[Condition, ...]

    def __str__(self) -> str:
        return "(" + " and ".join(str(op) for op in self.operands) + ")"


@dataclass(frozen=True, slots=True)
class Or:
    operands: tuple[Condition, ...]

    def __str__(self) -> str:
        return "(" + " or ".join(str(op) for op in self.operands) + ")"


Condition: TypeAlias = Compare | Not | And | Or


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str  # op, lparen, rparen, dot, string, number, name, segment, end
    text: str
    pos: int


_TOKEN_RE = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<op>==|!=)
  | (?P<lparen>\()
  | (?P<rparen>\))
  | (?P<dot>\.)
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
  | (?P<number>-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)
  | (?P<name>[A-Za-z_][A-Za-z0-9_-]*)
    """,
    re.VERBOSE,
)
# Right after a dot comes a path segment, which may be all digits (a list index).
_SEGMENT_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*")


def _syntax(text: str, message: str, pos: int) -> DagError:
    return DagError(
        f"invalid condition {text!r}: {message} at position {pos}", condition=text, position=pos
    )


def _tokenize(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    pos = 0
    while pos < len(text):
        if tokens and tokens[-1].kind == "dot":
            seg = _SEGMENT_RE.match(text, pos)
            if seg is None:
                raise _syntax(text, "expected a name after '.'", pos)
            tokens.append(_Token("segment", seg.group(), pos))
            pos = seg.end()
            continue
        match = _TOKEN_RE.match(text, pos)
        if match is None:
            raise _syntax(text, f"unexpected character {text[pos]!r}", pos)
        kind = match.lastgroup or ""
        if kind != "ws":
            tokens.append(_Token(kind, match.group(), pos))
        pos = match.end()
    tokens.append(_Token("end", "", len(text)))
    return tokens


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokenize(text)
        self.index = 0
        self.depth = 0

    def peek(self) -> _Token:
        return self.tokens[self.index]

    def advance(self) -> _Token:
        token = self.tokens[self.index]
        self.index += 1
        return token

    def error(self, message: str, token: _Token | None = None) -> DagError:
        token = token or self.peek()
        found = "end of input" if token.kind == "end" else repr(token.text)
        return _syntax(self.text, f"{message}, found {found}", token.pos)

    def is_word(self, word: str) -> bool:
        token = self.peek()
        return token.kind == "name" and token.text == word

    def parse(self) -> Condition:
        cond = self.parse_or()
        if self.peek().kind != "end":
            raise self.error("expected 'and', 'or' or the end")
        return cond

    def parse_or(self) -> Condition:
        terms = [self.parse_and()]
        while self.is_word("or"):
            self.advance()
            terms.append(self.parse_and())
        return terms[0] if len(terms) == 1 else Or(tuple(terms))

    def parse_and(self) -> Condition:
        terms = [self.parse_not()]
        while self.is_word("and"):
            self.advance()
            terms.append(self.parse_not())
        return terms[0] if len(terms) == 1 else And(tuple(terms))

    def parse_not(self) -> Condition:
        self.depth += 1
        if self.depth > _MAX_CONDITION_DEPTH:
            raise self.error("condition is nested too deeply")
        try:
            if self.is_word("not"):
                self.advance()
                return Not(self.parse_not())
            if self.peek().kind == "lparen":
                self.advance()
                inner = self.parse_or()
                if self.peek().kind != "rparen":
                    raise self.error("expected ')'")
                self.advance()
                return inner
            return self.parse_compare()
        finally:
            self.depth -= 1

    def parse_compare(self) -> Condition:
        token = self.advance()
        if token.kind != "name" or token.text in _RESERVED_WORDS:
            raise self.error("expected a node id", token)
        node = token.text
        if self.peek().kind != "dot":
            raise self.error(f"expected '.status' or '.data' after {node!r}")
        self.advance()
        field = self.advance()
        ref: StatusRef | DataRef
        if field.text == "status":
            ref = StatusRef(node)
        elif field.text == "data":
            path: list[str] = []
            while self.peek().kind == "dot":
                self.advance()
                path.append(self.advance().text)
            ref = DataRef(node, tuple(path))
        else:
            raise self.error("expected 'status' or 'data'", field)
        op_token = self.peek()
        if op_token.kind != "op":
            if isinstance(ref, StatusRef) and op_token.kind == "dot":
                raise self.error("'status' has no fields")
            raise self.error("expected '==' or '!='")
        self.advance()
        value_token = self.peek()
        value = self.parse_literal()
        if isinstance(ref, StatusRef) and value not in _STATUSES:
            raise _syntax(
                self.text,
                f"{ref} is compared with {json.dumps(value)}; expected one of "
                + ", ".join(json.dumps(s) for s in _STATUSES),
                value_token.pos,
            )
        return Compare(ref, "==" if op_token.text == "==" else "!=", value)

    def parse_literal(self) -> JsonScalar:
        token = self.advance()
        if token.kind == "string":
            return _decode_string(self.text, token)
        if token.kind == "number":
            number = json.loads(token.text)
            assert isinstance(number, int | float)
            return number
        if token.kind == "name" and token.text in ("true", "false", "null"):
            return {"true": True, "false": False, "null": None}[token.text]
        raise self.error("expected a literal (a quoted string, number, true, false or null)", token)


def _decode_string(text: str, token: _Token) -> str:
    if token.text.startswith('"'):
        try:
            decoded = json.loads(token.text)
        except json.JSONDecodeError:
            raise _syntax(text, "invalid escape in string", token.pos) from None
        assert isinstance(decoded, str)
        return decoded
    # Single-quoted: only \' and \\ (and any other \x as x) are escapes.
    return re.sub(r"\\(.)", r"\1", token.text[1:-1])


@lru_cache(maxsize=1024)
def _parse_cached(text: str) -> Condition:
    if len(text) > _MAX_CONDITION_CHARS:
        raise DagError(f"condition is longer than {_MAX_CONDITION_CHARS} characters")
    if not text.strip():
        raise _syntax(text, "empty condition", 0)
    return _Parser(text).parse()


def parse_condition(text: str) -> Condition:
    """Parse a condition into its AST; a `DagError` (with ``position``) if it is invalid.

    Node names are not checked here: `validate` checks them against the DAG.
    """
    return _parse_cached(text)


def _referenced(cond: Condition) -> set[str]:
    if isinstance(cond, Compare):
        return {cond.ref.node}
    if isinstance(cond, Not):
        return _referenced(cond.operand)
    found: set[str] = set()
    for operand in cond.operands:
        found |= _referenced(operand)
    return found


def _lookup(value: Any, path: tuple[str, ...]) -> tuple[bool, Any]:
    """Follow a dotted path; (False, None) when a step does not exist."""
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


def _json_equal(left: Any, right: JsonScalar) -> bool:
    if isinstance(left, bool) or isinstance(right, bool):
        return isinstance(left, bool) and isinstance(right, bool) and left == right
    if isinstance(left, int | float) and isinstance(right, int | float):
        return left == right
    if left is None or right is None:
        return left is None and right is None
    if isinstance(left, str) and isinstance(right, str):
        return left == right
    return False


def _result_of(results: Mapping[str, NodeResult], node_id: str) -> NodeResult:
    result = results.get(node_id)
    if result is None:
        raise DagError(f"node {node_id!r} has no result yet", node=node_id)
    return result


def evaluate(cond: Condition, results: Mapping[str, NodeResult]) -> bool:
    """Evaluate a condition against finished nodes' results.

    A node the condition names must have a result (a `DagError` otherwise: the plan runs
    every ancestor first, so a missing one is a bug in the caller).
    """
    if isinstance(cond, Compare):
        result = _result_of(results, cond.ref.node)
        if isinstance(cond.ref, StatusRef):
            equal = result.status.value == cond.value
        else:
            found, value = _lookup(result.data, cond.ref.path)
            if not found:
                return cond.op == "!="
            equal = _json_equal(value, cond.value)
        return equal if cond.op == "==" else not equal
    if isinstance(cond, Not):
        return not evaluate(cond.operand, results)
    if isinstance(cond, And):
        return all(evaluate(op, results) for op in cond.operands)
    return any(evaluate(op, results) for op in cond.operands)


# --- node decisions and payloads -------------------------------------------------------------

_SKIP_WORDS = {
    NodeStatus.FAILED: "failed",
    NodeStatus.SKIPPED: "was skipped",
    NodeStatus.TIMEOUT: "timed out",
}


def decide(node: NodeSpec, results: Mapping[str, NodeResult]) -> Decision:
    """Whether ``node`` runs, given the results of (at least) its dependencies.

    Every dependency must have a result (a `DagError` otherwise). Without a condition the
    node runs when all dependencies succeeded; with one, the condition decides.
    """
    deps = [(dep, _result_of(results, dep)) for dep in node.dependencies]
    if node.condition is None:
        not_ok = [
            f"dependency {dep!r} {_SKIP_WORDS[result.status]}"
            for dep, result in deps
            if result.status != NodeStatus.SUCCESS
        ]
        if not_ok:
            return Decision(False, "; ".join(not_ok))
        return Decision(True, "all dependencies succeeded" if deps else "no dependencies")
    if evaluate(parse_condition(node.condition), results):
        return Decision(True, f"condition met: {node.condition}")
    return Decision(False, f"condition not met: {node.condition}")


@dataclass(frozen=True, slots=True)
class _InputSource:
    path: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class _NodeSource:
    node: str
    field: Literal["data", "error", "status", "reason"]
    path: tuple[str, ...]


def _sources_in(value: Any) -> list[str]:
    """Every source expression (a string starting with a single ``$``) inside a value."""
    if isinstance(value, str):
        return [value] if value.startswith("$") and not value.startswith("$$") else []
    if isinstance(value, Mapping):
        return [text for item in value.values() for text in _sources_in(item)]
    if isinstance(value, list | tuple):
        return [text for item in value for text in _sources_in(item)]
    return []


def _parse_source(text: str) -> _InputSource | _NodeSource:
    parts = text[1:].split(".")
    if any(not part for part in parts):
        raise ValueError(f"source {text!r} has an empty path segment")
    head, rest = parts[0], tuple(parts[1:])
    if head == "input":
        return _InputSource(rest)
    if head == "nodes":
        if len(rest) < 2:
            raise ValueError(f"source {text!r} must name a node and a field, e.g. $nodes.x.data")
        node, field, path = rest[0], rest[1], rest[2:]
        if field == "data":
            return _NodeSource(node, "data", path)
        if field == "error":
            return _NodeSource(node, "error", path)
        if field in ("status", "reason"):
            if path:
                raise ValueError(f"source {text!r}: {field!r} has no fields")
            return _NodeSource(node, "status" if field == "status" else "reason", ())
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
            source = _parse_source(value)
        except ValueError as exc:
            raise DagError(f"node {node.id!r}: input {key!r}: {exc}", node=node.id) from None
        if isinstance(source, _InputSource):
            found, resolved = _lookup(run_input, source.path)
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
                found, resolved = _lookup(base, source.path)
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


# --- plan ------------------------------------------------------------------------------------


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
    for node_id in _topological(spec):
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
